"""The tap's record writer: records in from the event loop, gzip JSON Lines files out.

Owns the recording directory (docs/recording-format.md): the bounded queue between the proxy and
the disk, the one writer thread, the ``.part`` file being written, its rotation by size and age,
and what happens when the disk cannot keep up or fails.  The proxy never waits for it: ``offer``
takes the records of one read as one batch of text, and is a couple of integer comparisons and
one put on a ``queue.SimpleQueue``; a batch that does not fit the bound (``max_records`` records or
``max_bytes`` of them, counting those the writer holds while it writes) is dropped on the spot and
counted, per connection, and the writer records the counts in ``dropped`` records when it
catches up.

The records come as JSON Lines text already (adapter/tap/recorder.py says why): the writer
joins, compresses (zlib runs without the interpreter lock) and writes them.

A failed write (ENOSPC, EIO, a file system gone read-only) abandons the file being written: it
stays under its hidden ``.part`` name (Spark skips it; ``zcat`` can still read what reached the
disk), its records count as dropped, and the writer tries a new file ``RETRY_SECONDS`` later.
Warnings are logged at most once a minute.
"""

from __future__ import annotations

import contextlib
import gzip
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from .recorder import FORMAT_VERSION, line

log = logging.getLogger("adapter.tap")

RETRY_SECONDS = 5.0
WARN_EVERY = 60.0
TICK = 0.5  # how often an idle writer looks at the age of its file
# once woken by a record, the writer lets the records of the next reads gather this long before
# it takes them: a busy proxy wakes it ~20 times a second, not once per read (each wake-up is a
# futex call on the proxy's side and a handover of the interpreter lock)
GATHER = 0.05
BATCH = 512  # records per write call at most
COMPRESS_LEVEL = 3  # zlib's fast levels: a third of level 6's CPU per record, files ~30 % larger

_STOP = object()
# one put: a connection, the JSON Lines text of its records, how many records, and (for the
# writer's own ``dropped`` records only) how many lost records it reports
Batch = tuple[str, str, int, int]


class RateLimitedWarning:
    """A warning logged at most once per ``every`` seconds; the calls in between are counted."""

    def __init__(self, every: float = WARN_EVERY, clock: Callable[[], float] = time.monotonic) -> None:
        self._every = every
        self._clock = clock
        self._last = float("-inf")
        self.suppressed = 0

    def __call__(self, message: str, *args: object) -> None:
        now = self._clock()
        if now - self._last < self._every:
            self.suppressed += 1
            return
        self._last = now
        if self.suppressed:
            message += " (%d more such events since the last warning)"
            args = (*args, self.suppressed)
        self.suppressed = 0
        log.warning(message, *args)


def file_name(opened: float, pid: int, seq: int) -> str:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(opened))
    return f"tap-{stamp}-{pid}-{seq:06d}.jsonl.gz"


def _open_exclusive(path: Path) -> IO[bytes]:
    return open(path, "xb")  # noqa: SIM115 - closed by the writer when the file rotates


class _OpenFile:
    """The file being written (the writer thread's alone): its handles, its final name, when it
    opened, and per connection the records in it: the proxy's, and what its ``dropped`` records
    report (both count as dropped if the file is abandoned)."""

    __slots__ = ("final", "gzip", "in_file", "opened", "raw", "reported")

    def __init__(self, raw: IO[bytes], final: Path, opened: float) -> None:
        self.raw = raw
        try:
            self.gzip = gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=COMPRESS_LEVEL)
        except OSError:
            with contextlib.suppress(OSError, ValueError):
                raw.close()
            raise
        self.final = final
        self.opened = opened
        self.in_file: dict[str, int] = {}
        self.reported: dict[str, int] = {}

    def close(self) -> None:
        """Close both handles, whatever state they are in (the file is being abandoned)."""
        for closing in (self.gzip, self.raw):
            with contextlib.suppress(OSError, ValueError):
                closing.close()


class RecordWriter:
    """The writer thread and its queue.  ``start``, then ``offer`` from the event loop, then
    ``close`` (which drains the queue and finishes the file)."""

    def __init__(
        self,
        directory: Path,
        *,
        rotate_bytes: int = 64 * 1024 * 1024,
        rotate_seconds: float = 300.0,
        max_records: int = 50_000,
        max_bytes: int = 64 * 1024 * 1024,
        clock: Callable[[], float] = time.time,
        open_file: Callable[[Path], IO[bytes]] = _open_exclusive,
    ) -> None:
        self.directory = directory
        self._rotate_bytes = rotate_bytes
        self._rotate_seconds = rotate_seconds
        self._max_records = max_records
        self._max_bytes = max_bytes
        self._clock = clock
        self._open_file = open_file
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        # each counter has one writing thread: offered by the loop, taken by the writer
        self._offered = self._offered_bytes = 0
        self._taken = self._taken_bytes = 0
        self._lock = threading.Lock()  # guards _dropped_by_conn (the drop path only)
        self._dropped_by_conn: dict[str, int] = {}
        self.written = 0
        self.dropped = 0
        self.files = 0
        self._seq = 0
        self._pid = os.getpid()
        self._file: _OpenFile | None = None
        self._part: Path | None = None  # the hidden name of the file opened last
        self._retry_at = float("-inf")
        self._warn = RateLimitedWarning()
        self._thread = threading.Thread(target=self._run, name="tap-writer", daemon=True)

    # ------------------------------------------------------------------ the event loop's side
    @property
    def pending(self) -> int:
        """Records offered and not yet written (or dropped) by the writer."""
        return self._offered - self._taken

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self._thread.start()

    def offer(self, conn: str, lines: str, count: int) -> bool:
        """Queue ``count`` records of connection ``conn`` (``lines``: their JSON Lines text), or
        drop and count them: never blocks.  A batch is kept or dropped whole."""
        size = len(lines)
        if (
            self._offered - self._taken + count > self._max_records
            or self._offered_bytes - self._taken_bytes + size > self._max_bytes
        ):
            self._drop({conn: count})
            self._warn("tap: the recording cannot keep up (writer queue full): dropping records")
            return False
        self._offered += count
        self._offered_bytes += size
        self._queue.put((conn, lines, count, 0))
        return True

    def close(self, timeout: float = 30.0) -> bool:
        """Write what is queued, finish the file; False if the writer did not end in time."""
        if not self._thread.is_alive():
            return True
        self._queue.put(_STOP)
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("tap: the recording writer did not finish within %.0f s", timeout)
            return False
        return True

    # ------------------------------------------------------------------ the writer's side
    def _drop(self, counts: dict[str, int], *, new: bool = True) -> None:
        """Add ``counts`` to what the next ``dropped`` records report; ``new``: records not
        counted as dropped before (not the counts of a lost ``dropped`` record)."""
        with self._lock:
            table = self._dropped_by_conn
            for conn, count in counts.items():
                table[conn] = table.get(conn, 0) + count
                if new:
                    self.dropped += count

    def _run(self) -> None:
        get = self._queue.get
        stopping = False
        while not stopping:
            batch: list[Batch] = []
            records = batch_bytes = 0
            try:
                item = get(timeout=TICK)
            except queue.Empty:
                item = None
            if item is not None and item is not _STOP:
                time.sleep(GATHER)
            while item is not None:
                if item is _STOP:
                    stopping = True
                    break
                batch.append(item)
                records += item[2]
                batch_bytes += len(item[1])
                if records >= BATCH:
                    break
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    item = None
            now = self._clock()
            if batch:
                self._write(batch, now)
                self._taken_bytes += batch_bytes
                self._taken += records
            if self._offered == self._taken:  # caught up: say what was lost
                self._write_dropped(now)
            file = self._file
            if file is not None and (
                stopping or file.opened + self._rotate_seconds <= now or file.raw.tell() >= self._rotate_bytes
            ):
                self._finish(file, now)

    def _write(self, batch: list[Batch], now: float) -> None:
        if now < self._retry_at:
            self._lose(batch)
            return
        data = "".join([lines for _, lines, _, _ in batch]).encode("ascii")
        try:
            file = self._file or self._open(now)
            file.gzip.write(data)
        except OSError as error:
            self._lose(batch)
            self._fail(error, now)
            return
        self._tally(batch, file.in_file, file.reported)
        self.written += sum([count for _, _, count, reports in batch if not reports])

    @staticmethod
    def _tally(batch: list[Batch], proxied: dict[str, int], reported: dict[str, int]) -> None:
        """Count the records of ``batch`` per connection: the proxy's ones, and what ``dropped``
        ones report."""
        for conn, _, count, reports in batch:
            if reports:
                reported[conn] = reported.get(conn, 0) + reports
            else:
                proxied[conn] = proxied.get(conn, 0) + count

    def _lose(self, batch: list[Batch]) -> None:
        proxied: dict[str, int] = {}
        reported: dict[str, int] = {}
        self._tally(batch, proxied, reported)
        self._drop(proxied)
        self._drop(reported, new=False)

    def _write_dropped(self, now: float) -> None:
        if not self._dropped_by_conn or now < self._retry_at:
            return
        with self._lock:
            table, self._dropped_by_conn = self._dropped_by_conn, {}
        self._write(
            [
                (
                    conn,
                    line({"v": FORMAT_VERSION, "ts": now, "conn": conn, "kind": "dropped", "count": count}),
                    1,
                    count,
                )
                for conn, count in table.items()
            ],
            now,
        )

    def _open(self, now: float) -> _OpenFile:
        self._seq += 1
        name = file_name(now, self._pid, self._seq)
        part = self._part = self.directory / f".{name}.part"
        file = self._file = _OpenFile(self._open_file(part), self.directory / name, now)
        return file

    def _finish(self, file: _OpenFile, now: float) -> None:
        """Close the file and give it its final name, which makes it visible to Spark."""
        assert self._part is not None
        try:
            file.gzip.close()
            file.raw.close()
            os.rename(self._part, file.final)
        except OSError as error:
            self._fail(error, now)
            return
        self._file = None
        self.files += 1

    def _fail(self, error: OSError, now: float) -> None:
        """Abandon the file being written (its records are lost to Spark), retry later."""
        file, self._file = self._file, None
        if file is not None:
            self._drop(file.in_file)
            self._drop(file.reported, new=False)
            file.close()
        part = self._part
        self._retry_at = now + RETRY_SECONDS
        self._warn(
            "tap: cannot write the recording (%s): %s left unfinished, its records and those of the "
            "next %.0f s are dropped (%d dropped so far); the proxy goes on",
            error,
            part,
            RETRY_SECONDS,
            self.dropped,
        )
