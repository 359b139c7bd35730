"""Flow control of one client connection: why its socket is not read, and for how long.

``FlowControl`` owns the pause reasons of the client's socket (reading stops while any reason
holds, and resumes when the last one ends) and the pause clocks the metrics read
(``paused_seconds``, ``paused_since``; adapter/server/metrics.py).  The reasons:

* ``broker``: a broker call of the frame being handled is under way (frames stay in order);
* ``input``: too much parsed but unhandled input waits behind that call;
* ``broker-flow``: the AMQP link is blocked by the broker's flow control;
* ``slow-client``: clocked only; the client reads slower than the broker delivers, so the
  deliveries are paused instead (``ClientConnection.pause_writing``).
"""

from __future__ import annotations

import time
from typing import Protocol

__all__ = ["FlowControl", "Pausable"]


class Pausable(Protocol):
    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


class FlowControl:
    """The pause reasons and clocks of one client socket (see the module docstring)."""

    __slots__ = ("paused_seconds", "paused_since", "reasons", "transport")

    def __init__(self) -> None:
        self.transport: Pausable | None = None  # the client's socket, while it is open
        self.reasons: set[str] = set()  # changed in place, never replaced
        self.paused_seconds: dict[str, float] = {}
        self.paused_since: dict[str, float] = {}  # pause reason -> when it started

    @property
    def paused(self) -> bool:
        """The client's socket is not being read."""
        return bool(self.reasons)

    def pause(self, reason: str) -> None:
        if not self.reasons and self.transport is not None:
            self.transport.pause_reading()
        if reason not in self.reasons:
            self.reasons.add(reason)
            self.paused_since[reason] = time.monotonic()

    def resume(self, reason: str, closed: bool = False) -> None:
        """``reason`` ends; reading resumes if it was the last one, unless ``closed``."""
        if reason not in self.reasons:
            return
        self.reasons.discard(reason)
        self.stop_clock(reason)
        if not self.reasons and self.transport is not None and not closed:
            self.transport.resume_reading()

    def start_clock(self, reason: str) -> None:
        """A pause that does not stop reading (slow-client) starts, unless it runs already."""
        self.paused_since.setdefault(reason, time.monotonic())

    def stop_clock(self, reason: str) -> None:
        started = self.paused_since.pop(reason, None)
        if started is not None:
            seconds = self.paused_seconds
            seconds[reason] = seconds.get(reason, 0.0) + time.monotonic() - started

    def stop_clocks(self) -> None:
        """The connection finished: every running pause ends now."""
        if self.paused_since:
            for reason in list(self.paused_since):
                self.stop_clock(reason)
