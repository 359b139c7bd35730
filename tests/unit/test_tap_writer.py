"""The tap's record writer (adapter/tap/writer.py): rotation, naming, and what happens when the
disk is slow or full.  The proxy's side (``offer``) must never block."""

from __future__ import annotations

import errno
import gzip
import json
import logging
import os
import re
import threading
import time
from pathlib import Path

from adapter.tap import writer as writer_module
from adapter.tap.writer import RecordWriter

NAME = re.compile(r"^tap-\d{8}T\d{6}Z-\d+-\d{6}\.jsonl\.gz$")


def record(conn: str, n: int) -> dict:
    # random padding: gzip cannot shrink it, so file sizes grow as the records come
    return {
        "v": 1,
        "ts": 1.0,
        "conn": conn,
        "kind": "frame",
        "command": "SEND",
        "n": n,
        "pad": os.urandom(100).hex(),
    }


def batch(conn: str, n: int, size: int | None = None) -> tuple[str, str, int]:
    """One record as the proxy offers it: its connection, its JSON line (``size`` characters
    long if given), a count of 1."""
    text = json.dumps(record(conn, n)) + "\n"
    if size is not None:
        text = json.dumps({**record(conn, n), "pad": "x" * (size - len(text) + 200)}) + "\n"
        assert len(text) == size
    return conn, text, 1


def read_back(directory: Path) -> list[dict]:
    rows = []
    for path in sorted(directory.iterdir()):
        if path.name.startswith("."):
            continue
        with gzip.open(path, "rt", encoding="ascii") as lines:
            rows.extend(json.loads(line) for line in lines)
    return rows


def wait_until(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def test_files_rotate_by_size_and_keep_every_record_in_order(tmp_path):
    writer = RecordWriter(tmp_path, rotate_bytes=50_000, rotate_seconds=3600)
    writer.start()
    for n in range(2000):
        assert writer.offer(*batch("a", n))
        if n % 100 == 99:  # give the writer a chance to write (and rotate) between batches
            wait_until(lambda: writer.pending == 0)
    assert writer.close()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert len(names) > 2 and all(NAME.match(name) for name in names)
    assert [row["n"] for row in read_back(tmp_path)] == list(range(2000))
    assert writer.files == len(names) and writer.written == 2000 and writer.dropped == 0


def test_a_file_is_hidden_until_finished_and_rotates_by_age(tmp_path):
    now = [1_000_000.0]
    writer = RecordWriter(tmp_path, rotate_seconds=60, clock=lambda: now[0])
    writer.start()
    writer.offer(*batch("a", 1))
    wait_until(lambda: writer.pending == 0)
    (part,) = tmp_path.iterdir()
    assert part.name.startswith(".tap-19700112T134640Z-") and part.name.endswith(".jsonl.gz.part")
    now[0] += 61  # no new record: the idle writer finishes the file on its own
    wait_until(lambda: writer.files == 1)
    (done,) = tmp_path.iterdir()
    assert done.name == part.name[1:].removesuffix(".part")
    writer.offer(*batch("a", 2))
    assert writer.close()
    assert [row["n"] for row in read_back(tmp_path)] == [1, 2]


class BlockingFile:
    """A file whose first write waits for ``release``: a disk that does not keep up."""

    def __init__(self, path: Path, release: threading.Event, entered: threading.Event) -> None:
        self._file = open(path, "xb")  # noqa: SIM115
        self._release = release
        self._entered = entered

    def write(self, data: bytes) -> int:
        self._entered.set()
        self._release.wait(30)
        return self._file.write(data)

    def tell(self) -> int:
        return self._file.tell()

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def test_a_disk_that_does_not_keep_up_drops_records_counts_them_and_never_blocks(tmp_path):
    release, entered = threading.Event(), threading.Event()
    writer = RecordWriter(
        tmp_path, max_records=100, open_file=lambda path: BlockingFile(path, release, entered)
    )
    writer.start()
    writer.offer(*batch("a", 0))
    assert entered.wait(10)  # the writer is stuck in its first write
    # the disk is released only after these: an offer that waited for it would hang here
    accepted = [writer.offer(*batch("a" if n % 2 else "b", n)) for n in range(1, 1001)]
    assert accepted.count(True) == 99  # the one being written counts against the bound
    assert writer.dropped == 901
    release.set()
    assert writer.close()
    rows = read_back(tmp_path)
    dropped = {row["conn"]: row["count"] for row in rows if row["kind"] == "dropped"}
    assert dropped == {"a": 450, "b": 451}
    assert len([row for row in rows if row["kind"] == "frame"]) == 100


def test_the_byte_bound_drops_too(tmp_path):
    release, entered = threading.Event(), threading.Event()
    writer = RecordWriter(
        tmp_path, max_bytes=10_000, open_file=lambda path: BlockingFile(path, release, entered)
    )
    writer.start()
    writer.offer(*batch("a", 0, 4000))
    assert entered.wait(10)
    assert writer.offer(*batch("a", 1, 4000))
    assert not writer.offer(*batch("a", 2, 4000))  # 12000 > 10000
    release.set()
    assert writer.close()
    assert writer.dropped == 1


class FullDisk:
    """Every write fails as a full disk does."""

    def __init__(self, path: Path) -> None:
        self._file = open(path, "xb")  # noqa: SIM115

    def write(self, data: bytes) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    def tell(self) -> int:
        return 0

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self._file.close()


def test_a_full_disk_drops_warns_once_and_recovers(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(writer_module, "RETRY_SECONDS", 0.2)
    disk_full = threading.Event()
    disk_full.set()

    def open_file(path: Path):
        return FullDisk(path) if disk_full.is_set() else open(path, "xb")  # noqa: SIM115

    writer = RecordWriter(tmp_path, open_file=open_file)
    caplog.set_level(logging.WARNING, logger="adapter.tap")
    writer.start()
    for n in range(50):
        writer.offer(*batch("a", n))
        wait_until(lambda: writer.pending == 0)
    assert writer.dropped == 50 and writer.written == 0
    warnings = [r for r in caplog.records if "cannot write the recording" in r.getMessage()]
    assert len(warnings) == 1 and "No space left on device" in warnings[0].getMessage()
    disk_full.clear()  # space again: the next write after the retry delay opens a new file
    time.sleep(0.3)
    writer.offer(*batch("a", 50))
    assert writer.close()
    rows = read_back(tmp_path)
    assert [row["n"] for row in rows if row["kind"] == "frame"] == [50]
    assert [(row["conn"], row["count"]) for row in rows if row["kind"] == "dropped"] == [("a", 50)]
    # the abandoned files stay hidden (Spark skips them)
    assert all(p.name.startswith(".") for p in tmp_path.iterdir() if not NAME.match(p.name))
