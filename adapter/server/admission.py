"""Login pacing: at most ``adapter.max_logins_in_flight`` AMQP logins of one process talk to the
broker at once; the others wait their turn, first come first served.

Why: in a connect storm (thousands of clients reconnecting after a network blip, a load
balancer's failover) every CONNECT would otherwise open its AMQP connection at once.  Each
login costs the broker an authentication and a connection process and costs this process
several reads and writes; thousands at once slow every established client of the process and
of the broker, whose frames wait behind them.  With the logins paced, the storm is served at
the rate the broker logs in, and an established client's frames are never behind more than
the bounded number of handshakes in flight.  A waiting login holds nothing of the broker's; it
still counts against the login timeout, which closes a client that waited too long.

Owns ``LoginGate`` (pure: a count and a queue of tickets) and ``login_turn``, the async shell a
login runs inside.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator

__all__ = ["LoginGate", "login_turn"]


class LoginGate:
    """At most ``limit`` holders inside; a holder that cannot enter waits in line."""

    __slots__ = ("_waiting", "in_flight", "limit")

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"at least one login must be let through, not {limit}")
        self.limit = limit
        self.in_flight = 0
        self._waiting: deque[object] = deque()

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def enter(self, ticket: object) -> bool:
        """True: in (counted in flight); False: ``ticket`` waits in line for ``leave``."""
        if self.in_flight < self.limit and not self._waiting:
            self.in_flight += 1
            return True
        self._waiting.append(ticket)
        return False

    def leave(self) -> object | None:
        """A holder is done: the next ticket in line, now in (its place in flight passes to
        it), or None."""
        if self._waiting:
            return self._waiting.popleft()
        self.in_flight -= 1
        return None

    def withdraw(self, ticket: object) -> None:
        """A waiting ticket gives up (its login was cancelled)."""
        with contextlib.suppress(ValueError):
            self._waiting.remove(ticket)


@contextlib.asynccontextmanager
async def login_turn(gate: LoginGate) -> AsyncIterator[None]:
    """Wait for a place in flight, hold it for the ``async with`` body, and pass it on."""
    turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    if not gate.enter(turn):
        try:
            await turn
        except BaseException:
            if turn.done() and not turn.cancelled():
                _pass_on(gate)  # the place came to us as we were cancelled: pass it on
            else:
                gate.withdraw(turn)
            raise
    try:
        yield
    finally:
        _pass_on(gate)


def _pass_on(gate: LoginGate) -> None:
    while True:
        following = gate.leave()
        if not isinstance(following, asyncio.Future):
            return
        if not following.done():
            following.set_result(None)
            return
        # cancelled while in line, before it withdrew: the place goes to the one after it
