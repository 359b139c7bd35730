"""Heart-beat monitoring, pure: two flags and the ticks of two clocks in, what to do out.

Both links of a client speak a protocol with heart-beats (STOMP 1.1+ "Heart-beating", AMQP 0-9-1
section 4.2.7): send something when we have been silent for an interval, and give the peer up when
it has been silent too long.  Whoever owns the socket sets ``read`` when bytes come in and
``wrote`` when bytes go out (one attribute store, no call), and calls ``send_tick`` and
``receive_tick`` from its timers; the monitor answers whether to write a heart-beat and whether
the peer is gone.  It owns no timer, socket or clock, so it is tested without an event loop, and
it imports nothing.

The two links differ only in their numbers:

* the STOMP shell (adapter/server/heartbeats.py) sends on its own clock and checks the client on
  another (``misses_allowed=1``: one silent interval, already stretched by the tolerance);
* the AMQP link ticks both at half the negotiated interval and allows four silent ticks (two
  heart-beat periods) before it fails the connection.
"""

from __future__ import annotations


class Liveness:
    """The read/wrote flags of one socket since the last tick, and the peer's silent ticks."""

    __slots__ = ("misses_allowed", "missed", "read", "wrote")

    def __init__(self, misses_allowed: int = 1) -> None:
        if misses_allowed < 1:
            raise ValueError("misses_allowed must be at least 1")
        self.misses_allowed = misses_allowed
        self.read = False  # bytes came in since the last receive_tick
        self.wrote = False  # bytes went out since the last send_tick
        self.missed = 0  # receive ticks in a row without input

    def send_tick(self, output_pending: bool = False) -> bool:
        """The send interval passed: True when a heart-beat must be written now (nothing was
        written since the last tick and nothing is about to be)."""
        beat = not self.wrote and not output_pending
        self.wrote = False
        return beat

    def receive_tick(self, excused: bool = False) -> bool:
        """The receive interval passed: True when the peer is to be given up.  ``excused``:
        we are not reading its socket (flow control, a pending call), so its heart-beats wait
        unread and its silence is not its fault."""
        if self.read or excused:
            self.missed = 0
            self.read = False
            return False
        self.missed += 1
        return self.missed >= self.misses_allowed

    def reset(self) -> None:
        """Start counting afresh (heart-beats were just negotiated)."""
        self.read = False
        self.wrote = False
        self.missed = 0
