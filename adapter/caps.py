"""Connection caps: how many connections of a kind one adapter process serves at once.

Owns ``ConnectionCap``, the counter behind ``stomp.max_connections`` (STOMP sessions of every
listener: the session takes a slot at CONNECT and gives it back when its connection closes)
and ``web_stomp.max_connections`` (the sockets of one web_stomp listener, from accept to close),
and ``worker_share``, the part of a cap each process of ``--workers N`` applies.

Pure: no I/O, no event loop.  A slot belongs to a holder (the session or the socket's protocol
object), so taking it twice counts once and giving it back twice frees nothing of another's: a
close reported twice cannot push the count below the truth and let more in than the cap.
"""

from __future__ import annotations

__all__ = ["ConnectionCap", "worker_share"]


class ConnectionCap:
    """At most ``limit`` holders at once; None: no limit (``infinity`` in rabbitmq.conf)."""

    __slots__ = ("limit", "_holders")

    def __init__(self, limit: int | None) -> None:
        if limit is not None and limit < 0:
            raise ValueError(f"a connection cap must be >= 0, not {limit}")
        self.limit = limit
        self._holders: set[object] = set()

    @property
    def in_use(self) -> int:
        return len(self._holders)

    def acquire(self, holder: object) -> bool:
        """Take a slot for ``holder`` (True), or False when every slot is taken."""
        holders = self._holders
        if holder in holders:
            return True
        if self.limit is not None and len(holders) >= self.limit:
            return False
        holders.add(holder)
        return True

    def holds(self, holder: object) -> bool:
        return holder in self._holders

    def release(self, holder: object) -> None:
        """Give ``holder``'s slot back; nothing happens if it has none."""
        self._holders.discard(holder)


def worker_share(limit: int | None, workers: int) -> int | None:
    """The cap one of ``workers`` processes applies: the ceiling of limit / workers, so that the
    processes together admit at most limit + workers - 1 (docs/configuration.md, "Connection
    caps"); 0 stays 0 and no limit stays no limit."""
    if limit is None or workers <= 1:
        return limit
    return -(-limit // workers)
