"""asyncio shell: listeners, per-client connections, shutdown."""
