"""Heart-beat header parsing and negotiation (STOMP 1.1/1.2 "Heart-beating").  Pure.

Negotiation is in milliseconds as the spec defines it.  The plugin rounds both intervals down to
whole seconds (reference §5.7); we keep the client's milliseconds but never go below
``MIN_INTERVAL_MS`` so that a client cannot make the server spin on tiny timers.  The CONNECTED
frame always states the intervals actually used, so a spec-following client stays in step.
"""

from __future__ import annotations

MIN_INTERVAL_MS = 100


class HeartBeatError(ValueError):
    pass


def parse_heart_beat(value: str | None) -> tuple[int, int]:
    """Parse ``cx,cy``; absent means ``0,0``.  Anything but two integers is an error."""
    if value is None:
        return 0, 0
    parts = value.split(",")
    if len(parts) != 2 or not all(p.lstrip("-").isdigit() and p.isascii() for p in parts):
        raise HeartBeatError(f"heart-beat must be two comma-separated integers, got {value!r}")
    return int(parts[0]), int(parts[1])


def negotiate(client: tuple[int, int]) -> tuple[int, int]:
    """Return (server sends every S ms, server expects client bytes every R ms); 0 = never.

    ``client`` is (cx, cy): cx = what the client can send, cy = what it wants to receive.
    """
    cx, cy = client
    send_ms = max(cy, MIN_INTERVAL_MS) if cy > 0 else 0
    receive_ms = max(cx, MIN_INTERVAL_MS) if cx > 0 else 0
    return send_ms, receive_ms
