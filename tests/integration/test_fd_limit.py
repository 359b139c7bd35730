"""At the file-descriptor limit the adapter says so in its log, keeps serving the clients it has,
and recovers once descriptors are free again.

The adapter runs as a real process (``python -m adapter``, uvloop as in production) with a low
RLIMIT_NOFILE, so the operating system's EMFILE is real.  uvloop drops the connections it cannot
accept without telling anyone; the warning comes from the adapter's own watch.
"""

from __future__ import annotations

import resource
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import free_port, read_frames, unique

LIMIT = 64
CONNECT = b"CONNECT\naccept-version:1.2\nhost:/\nlogin:guest\npasscode:guest\n\n\0"


def _low_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (LIMIT, LIMIT))


@pytest.fixture
def limited_adapter(amqp_url: str, tmp_path: Path) -> Iterator[tuple[int, Path]]:
    port = free_port()
    log_path = tmp_path / "adapter.log"
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            [sys.executable, "-m", "adapter", "--listen", f"127.0.0.1:{port}", "--amqp-url", amqp_url],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            preexec_fn=_low_limit,
        )
        try:
            deadline = time.monotonic() + 20
            while b"listening on" not in log_path.read_bytes():
                assert process.poll() is None, log_path.read_text()
                assert time.monotonic() < deadline, "adapter did not start"
                time.sleep(0.05)
            yield port, log_path
        finally:
            process.terminate()
            process.wait(15)


def round_trip(port: int, queue: str) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(CONNECT)
        frames, _ = read_frames(sock, timeout=5, count=1)
        assert frames and frames[0].startswith(b"CONNECTED"), frames
        sock.sendall(f"SEND\ndestination:/queue/{queue}\nreceipt:r\n\nx\0".encode())
        frames, _ = read_frames(sock, timeout=5, count=1)
        assert frames[0].startswith(b"RECEIPT"), frames


def test_descriptor_exhaustion_is_logged_and_the_adapter_recovers(limited_adapter, broker):
    port, log_path = limited_adapter
    queue = unique("fd")
    broker.track_queue(queue)
    # a logged-in client from before the limit is reached
    survivor = socket.create_connection(("127.0.0.1", port), timeout=5)
    survivor.sendall(CONNECT)
    assert read_frames(survivor, timeout=5, count=1)[0][0].startswith(b"CONNECTED")

    idle: list[socket.socket] = []
    try:
        for _ in range(LIMIT + 10):  # more than the adapter can hold open
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        time.sleep(0.5)
        log = log_path.read_text()
        assert "out of file descriptors" in log, log

        # the client it already had is still served
        survivor.sendall(f"SEND\ndestination:/queue/{queue}\nreceipt:s\n\nkept\0".encode())
        frames, closed = read_frames(survivor, timeout=5, count=1)
        assert frames[0].startswith(b"RECEIPT") and not closed
    finally:
        for sock in idle:
            sock.close()
        survivor.close()
    # descriptors free again: new clients are served
    deadline = time.monotonic() + 10
    while True:
        try:
            round_trip(port, queue)
            break
        except (AssertionError, OSError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    assert broker.wait_depth(queue, 2) == 2
