"""Heart-beat header parsing and negotiation (STOMP 1.1/1.2 "Heart-beating").  Pure.

Negotiation is in milliseconds as the spec defines it.  The plugin rounds both intervals down to
whole seconds (docs/behaviour.md#timeouts); we keep the client's milliseconds but never go below
``MIN_INTERVAL_MS`` so that a client cannot make the server spin on tiny timers.  The CONNECTED
frame always states the intervals actually used, so a spec-following client stays in step.
"""

from __future__ import annotations

import re

MIN_INTERVAL_MS = 100
# the plugin accepts signed integers and treats negative values as 0 (docs/behaviour.md#timeouts)
_HEART_BEAT = re.compile(r"(-?[0-9]{1,18}),(-?[0-9]{1,18})", re.ASCII)


class HeartBeatError(ValueError):
    pass


def parse_heart_beat(value: str | None) -> tuple[int, int]:
    """Parse ``cx,cy``; absent means ``0,0``.  Anything but two integers is an error."""
    if value is None:
        return 0, 0
    match = _HEART_BEAT.fullmatch(value)
    if match is None:
        raise HeartBeatError(f"heart-beat must be two comma-separated integers, got {value!r}")
    return int(match.group(1)), int(match.group(2))


def negotiate(client: tuple[int, int], wanted_ms: int = 0) -> tuple[int, int]:
    """Return (server sends every S ms, server expects client bytes every R ms); 0 = never.

    ``client`` is (cx, cy): cx = what the client can send, cy = what it wants to receive.
    ``wanted_ms`` (adapter.min_client_heartbeat): what the server asks of a client that can send
    heart-beats at all (cx > 0); the interval is then the larger of the two, as STOMP 1.1
    negotiates it.  0: the client's own offer.
    """
    cx, cy = client
    send_ms = max(cy, MIN_INTERVAL_MS) if cy > 0 else 0
    receive_ms = max(cx, wanted_ms, MIN_INTERVAL_MS) if cx > 0 else 0
    return send_ms, receive_ms
