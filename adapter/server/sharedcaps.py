"""The connection caps of ``--workers N`` counted for the whole worker set: a table of counters
in memory the supervisor creates and every worker maps.

Owns ``CapTable`` (one row per cap: ``stomp.max_connections`` first, then each web_stomp
listener's ``web_stomp.max_connections``; one column per worker slot) and ``SlotCount``, one
worker's view of one row, which implements ``adapter.caps.SharedCount``.

Why a column per worker rather than one counter per cap: a worker that dies (SIGKILL, a crash)
cannot give its slots back, but the supervisor knows which column was its and zeroes it before
the restart, so a crash never leaks slots; and each worker writes only its own column, so a
give-back needs no lock.  A take must see every column and add to its own as one step, or two
workers could each see room for one and both take it: it holds a POSIX record lock on the
table's file (``lockf``), which the kernel releases if the holder dies, so a crash inside the
few loads and stores it covers cannot wedge the others.  The cost is two system calls per
admitted CONNECT (or WebSocket accept), never per message.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
from collections.abc import Iterator

__all__ = ["CapTable", "SlotCount"]

_COUNTER = 8  # bytes: one signed 64-bit counter ("q"), aligned, so a store is never torn


class CapTable:
    """``rows`` caps x ``workers`` slots of counters in shared memory."""

    __slots__ = ("_counts", "_map", "fd", "rows", "workers")

    def __init__(self, fd: int, rows: int, workers: int) -> None:
        if rows < 1 or workers < 1:
            raise ValueError(f"a cap table needs rows and workers, not {rows} x {workers}")
        self.fd = fd
        self.rows = rows
        self.workers = workers
        self._map = mmap.mmap(fd, rows * workers * _COUNTER)
        self._counts = memoryview(self._map).cast("q")

    @classmethod
    def create(cls, rows: int, workers: int) -> CapTable:
        """The supervisor's table, all zero; its ``fd`` goes to each worker (pass_fds)."""
        fd = os.memfd_create("stomp-adapter-caps")
        try:
            os.ftruncate(fd, rows * workers * _COUNTER)
            return cls(fd, rows, workers)
        except BaseException:
            os.close(fd)
            raise

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        fcntl.lockf(self.fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.lockf(self.fd, fcntl.LOCK_UN)

    def count(self, row: int, slot: int, limit: int) -> SlotCount:
        return SlotCount(self, row, slot, limit)

    def in_use(self, row: int) -> int:
        """Connections the workers hold together under cap ``row``."""
        start = row * self.workers
        return sum(self._counts[start : start + self.workers])

    def held(self, row: int, slot: int) -> int:
        return self._counts[row * self.workers + slot]

    def clear(self, slot: int) -> None:
        """Worker ``slot`` has exited (or is starting afresh): its connections are gone."""
        with self.locked():
            for row in range(self.rows):
                self._counts[row * self.workers + slot] = 0

    def close(self) -> None:
        self._counts.release()
        self._map.close()
        os.close(self.fd)


class SlotCount:
    """Worker ``slot``'s part of cap ``row`` (``adapter.caps.SharedCount``): at most ``limit``
    for the row's counters together."""

    __slots__ = ("_index", "_row", "_table", "limit")

    def __init__(self, table: CapTable, row: int, slot: int, limit: int) -> None:
        if not (0 <= row < table.rows and 0 <= slot < table.workers):
            raise ValueError(f"no counter ({row}, {slot}) in a {table.rows} x {table.workers} table")
        self._table = table
        self._row = row
        self._index = row * table.workers + slot
        self.limit = limit

    def take(self) -> bool:
        table = self._table
        with table.locked():
            if table.in_use(self._row) >= self.limit:
                return False
            table._counts[self._index] += 1  # noqa: SLF001 - the table's own counter view
            return True

    def give_back(self) -> None:
        # only this worker writes its counter (the supervisor zeroes it once the worker is
        # gone): no lock; a reader sees the old or the new value, never a torn one
        counts = self._table._counts  # noqa: SLF001
        if counts[self._index] > 0:
            counts[self._index] -= 1
