"""Pacing work that costs the broker: at most so many of a kind under way at once in this
process, the others waiting their turn, first come first served.

Two kinds are paced.  **Logins** (``adapter.max_logins_in_flight``): in a connect storm
(thousands of clients reconnecting after a network blip, a load balancer's failover) every
CONNECT would otherwise open its AMQP connection at once.  Each login costs the broker an
authentication and a connection process and costs this process several reads and writes;
thousands at once slow every established client of the process and of the broker, whose frames
wait behind them.  Paced, the storm is served at the rate the broker logs in, and an
established client's frames are never behind more than the bounded number of handshakes in
flight.  A waiting login holds nothing of the broker's; it still counts against the login
timeout, which closes a client that waited too long.  **AMQP closes** (``AMQP_CLOSES_AT_ONCE``):
a graceful shutdown, or thousands of clients leaving at once, would otherwise send thousands of
``connection.close`` at the same moment; the broker closes them at its own rate (a connection
with a consumer and an auto-delete queue takes it milliseconds), and a flood of them delays
every other client of the broker, those of other adapters included.

Owns ``Gate`` (pure: a count and a queue of tickets) and ``turn``, the async shell a paced piece
of work runs inside (``enter`` and ``leave`` when the place outlives one block).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Callable

__all__ = ["AMQP_CLOSES_AT_ONCE", "LOGINS_WAITING_PER_PLACE", "Gate", "enter", "leave", "turn"]

# AMQP connections closing at once (connection.close sent, close-ok awaited) in one process
AMQP_CLOSES_AT_ONCE = 256
# logins waiting per place in flight at which the listeners stop accepting (accept_pause.py);
# they accept again once half as many wait
LOGINS_WAITING_PER_PLACE = 4


class Gate:
    """At most ``limit`` holders inside; a holder that cannot enter waits in line."""

    __slots__ = ("_crowded", "_high_water", "_on_crowded", "_waiting", "in_flight", "limit")

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"at least one login must be let through, not {limit}")
        self.limit = limit
        self.in_flight = 0
        self._waiting: deque[object] = deque()
        self._high_water = 0
        self._on_crowded: Callable[[bool], None] | None = None
        self._crowded = False

    def watch(self, high_water: int, on_crowded: Callable[[bool], None]) -> None:
        """Call ``on_crowded(True)`` when ``high_water`` tickets wait, and ``on_crowded(False)``
        once no more than half of that wait again (the listeners' accept pause)."""
        self._high_water = max(1, high_water)
        self._on_crowded = on_crowded

    def _check(self) -> None:
        if self._on_crowded is None:
            return
        waiting = len(self._waiting)
        if not self._crowded and waiting >= self._high_water:
            self._crowded = True
            self._on_crowded(True)
        elif self._crowded and waiting <= self._high_water // 2:
            self._crowded = False
            self._on_crowded(False)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def enter(self, ticket: object) -> bool:
        """True: in (counted in flight); False: ``ticket`` waits in line for ``leave``."""
        if self.try_enter():
            return True
        self._waiting.append(ticket)
        self._check()
        return False

    def try_enter(self) -> bool:
        """In if there is room and nobody waits (True); else nothing changes (False)."""
        if self.in_flight < self.limit and not self._waiting:
            self.in_flight += 1
            return True
        return False

    def leave(self) -> object | None:
        """A holder is done: the next ticket in line, now in (its place in flight passes to
        it), or None."""
        if self._waiting:
            following = self._waiting.popleft()
            self._check()
            return following
        self.in_flight -= 1
        return None

    def withdraw(self, ticket: object) -> None:
        """A waiting ticket gives up (its login was cancelled)."""
        with contextlib.suppress(ValueError):
            self._waiting.remove(ticket)
            self._check()


async def enter(gate: Gate) -> None:
    """Wait for a place in flight (first come, first served); ``leave`` passes it on.  For a
    place held across several calls (a probe connection's life: adapter/amqp/probe_runtime.py);
    a place held for one block is ``turn``."""
    # the usual case, room at once, costs no future
    if gate.try_enter():
        return
    ticket: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    gate.enter(ticket)
    try:
        await ticket
    except BaseException:
        if ticket.done() and not ticket.cancelled():
            leave(gate)  # the place came to us as we were cancelled: pass it on
        else:
            gate.withdraw(ticket)
        raise


def leave(gate: Gate) -> None:
    """Give back the place ``enter`` took: to the next in line, if one waits."""
    while True:
        following = gate.leave()
        if not isinstance(following, asyncio.Future):
            return
        if not following.done():
            following.set_result(None)
            return
        # cancelled while in line, before it withdrew: the place goes to the one after it


@contextlib.asynccontextmanager
async def turn(gate: Gate) -> AsyncIterator[None]:
    """Wait for a place in flight, hold it for the ``async with`` body, and pass it on."""
    await enter(gate)
    try:
        yield
    finally:
        leave(gate)
