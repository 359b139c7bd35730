"""Benchmark of the STOMP adapter against RabbitMQ's STOMP plugin: ``python -m bench --help``.

A tool, not a test: see docs/performance.md for what it measures and the latest results.
"""
