"""Bounds on what a client may leave unfinished: the incomplete-input budget and the frame timeout.

A client controls how many bytes of a frame it has sent without finishing it, and for how long.
One ``InputGuard`` per connection keeps that connection's share of a budget shared by every
connection (``IncompleteInput``: bytes of unfinished frames held by the whole process), and the
clock of the frame it is waiting for: a frame must be complete within ``frame_timeout`` of the
read that started it (docs/behaviour.md, Limits).  When a bound is crossed the guard calls its
``fail`` with the STOMP ERROR's message and body; the connection sends it and closes.

The shell calls ``account`` only after a read that left bytes in the parser (or when the guard
still holds some): a read made of whole frames costs one comparison.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Protocol

log = logging.getLogger("adapter.connection")


class FrameClock(Protocol):
    """How long one frame may take: the server's group "limits" (options.Limits), read where it is
    needed instead of copied into the server."""

    @property
    def frame_timeout(self) -> float: ...  # 0: no limit


class IncompleteInput(Protocol):
    """The process-wide side: bytes of unfinished frames held by all connections, its bound,
    and the limits saying how long one frame may take (a server's ``ServerContext`` has these three)."""

    incomplete_input: int
    incomplete_input_budget: int

    @property
    def limits(self) -> FrameClock: ...


class InputGuard:
    """One connection's unfinished input: its bytes and the clock of the frame they start."""

    __slots__ = ("_consumed_at_start", "_fail", "_loop", "_peer", "_shared", "_timer", "held", "started")

    def __init__(
        self,
        shared: IncompleteInput,
        loop: asyncio.AbstractEventLoop,
        fail: Callable[[str, str], None],
        peer: Callable[[], str],
    ) -> None:
        self._shared = shared
        self._loop = loop
        self._fail = fail  # (ERROR message, ERROR body): the connection answers and closes
        self._peer = peer  # for the log line (the peer may change with a PROXY header)
        self.held = 0  # this connection's share of shared.incomplete_input
        self.started: float | None = None  # when the frame being waited for began arriving
        self._consumed_at_start = 0
        self._timer: asyncio.TimerHandle | None = None

    def account(self, held: int, consumed: int, waiting_for_broker: bool) -> None:
        """After a read: ``held`` bytes are in the parser and not a whole frame; ``consumed``
        counts every byte taken from the client so far (it grows when a frame is taken, so the
        clock restarts: a client streaming frames whose reads end mid-frame makes progress);
        ``waiting_for_broker``: complete frames wait for a broker call, not the client's delay."""
        shared = self._shared
        if held != self.held:
            shared.incomplete_input += held - self.held
            grew = held > self.held
            self.held = held
            if grew and shared.incomplete_input > shared.incomplete_input_budget:
                log.warning(
                    "peer=%s: incomplete frames of all connections hold %d bytes, over the budget of %d;"
                    " closing this connection (it holds %d)",
                    self._peer(),
                    shared.incomplete_input,
                    shared.incomplete_input_budget,
                    held,
                )
                self._fail(
                    "Too much incomplete input",
                    "Incomplete frames of all connections exceed the adapter's budget of "
                    f"{shared.incomplete_input_budget} bytes\n",
                )
                return
        if held and not waiting_for_broker:
            if self.started is None or consumed != self._consumed_at_start:
                self.started = self._loop.time()
                self._consumed_at_start = consumed
                timeout = shared.limits.frame_timeout
                if self._timer is None and timeout:
                    self._timer = self._loop.call_later(timeout, self.check_time)
        else:
            self.started = None

    def check_time(self) -> None:
        """The frame timer: fail if the frame waited for is older than the timeout, else
        look again when it would be."""
        self._timer = None
        started = self.started
        if started is None:
            return
        timeout = self._shared.limits.frame_timeout
        waited = self._loop.time() - started
        if waited < timeout:
            self._timer = self._loop.call_later(timeout - waited, self.check_time)
            return
        log.info("peer=%s: frame not completed within %g s (%d bytes held)", self._peer(), timeout, self.held)
        self._fail("Frame timeout", f"A frame was not completed within {timeout:g} s\n")

    def release(self) -> None:
        """The connection is closed: give its share back, stop the clock, and let go of the
        connection's callbacks (they refer back to it: dropped, the closed connection is freed
        by reference counting; a late call finds no-ops)."""
        self._shared.incomplete_input -= self.held
        self.held = 0
        self.started = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._fail = _closed_fail
        self._peer = _closed_peer


def _closed_fail(message: str, detail: str) -> None:
    """A verdict after ``release``: the connection is closed already."""


def _closed_peer() -> str:
    return "?"
