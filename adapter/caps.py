"""Connection caps: how many connections of a kind the adapter serves at once.

Owns ``ConnectionCap``, the counter behind ``stomp.max_connections`` (STOMP sessions of every
listener: the session takes a slot at CONNECT and gives it back when its connection closes)
and ``web_stomp.max_connections`` (the sockets of one web_stomp listener, from accept to close),
and ``SharedCount``, the port through which a cap of ``--workers N`` counts the connections of
every worker together (adapter/server/sharedcaps.py implements it in memory the supervisor
shares with its workers).

Pure: no I/O, no event loop.  A slot belongs to a holder (the session or the socket's protocol
object), so taking it twice counts once and giving it back twice frees nothing of another's: a
close reported twice cannot push the count below the truth and let more in than the cap.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["ConnectionCap", "SharedCount"]


class SharedCount(Protocol):
    """One cap's count over every process of the worker set."""

    def take(self) -> bool:
        """One more connection, if the processes together hold fewer than the limit."""
        ...

    def give_back(self) -> None:
        """One connection fewer (only ever after a ``take`` that returned True)."""
        ...


class ConnectionCap:
    """At most ``limit`` holders at once; None: no limit (``infinity`` in rabbitmq.conf).
    With ``shared`` the limit holds for the holders of every worker process together, and
    ``shared`` decides; without it, for this process."""

    __slots__ = ("_holders", "_shared", "limit")

    def __init__(self, limit: int | None, shared: SharedCount | None = None) -> None:
        if limit is not None and limit < 0:
            raise ValueError(f"a connection cap must be >= 0, not {limit}")
        self.limit = limit
        self._shared = shared if limit is not None else None
        self._holders: set[object] = set()

    @property
    def in_use(self) -> int:
        """This process's holders."""
        return len(self._holders)

    def acquire(self, holder: object) -> bool:
        """Take a slot for ``holder`` (True), or False when every slot is taken."""
        holders = self._holders
        if holder in holders:
            return True
        if self._shared is not None:
            if not self._shared.take():
                return False
        elif self.limit is not None and len(holders) >= self.limit:
            return False
        holders.add(holder)
        return True

    def holds(self, holder: object) -> bool:
        return holder in self._holders

    def release(self, holder: object) -> None:
        """Give ``holder``'s slot back; nothing happens if it has none."""
        holders = self._holders
        if holder in holders:
            holders.remove(holder)
            if self._shared is not None:
                self._shared.give_back()
