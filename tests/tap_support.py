"""Helpers for the recording tap's tests: the tap as a real process, a scripted upstream that
keeps every byte it got, and the recording read back."""

from __future__ import annotations

import gzip
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tests.support import free_port


class TapProcess:
    """``python -m adapter tap`` on 127.0.0.1:<free port>, its operator port on another."""

    def __init__(
        self,
        upstream: str,
        record: Path,
        *extra: str,
        preexec_fn: Callable[[], None] | None = None,
        env: Mapping[str, str | None] | None = None,
    ):
        """``env``: variables set (a value) or removed (None) for the tap's process only."""
        self.port = free_port()
        self.http_port = free_port()
        self.record = record
        self.log_path = record.parent / f"tap-{self.port}.log"
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "adapter",
                    "tap",
                    "--listen",
                    f"127.0.0.1:{self.port}",
                    "--upstream",
                    upstream,
                    "--record",
                    str(record),
                    "--http-listen",
                    f"127.0.0.1:{self.http_port}",
                    "--connect-timeout",
                    "5",
                    *extra,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=preexec_fn,  # noqa: PLW1509 - a resource limit for the disk-full test
                env=_environment(env),
            )
        deadline = time.monotonic() + 30
        while True:  # ready when its operator port answers (a probe of the STOMP port is recorded)
            try:
                if self.get("/healthz").startswith("ok"):
                    break
            except OSError:
                pass
            assert self.process.poll() is None, f"the tap exited: {self.log()}"
            assert time.monotonic() < deadline, f"the tap did not start: {self.log()}"
            time.sleep(0.05)

    def get(self, path: str) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}{path}", timeout=5) as answer:
            return str(answer.read().decode())

    def metric(self, name: str, labels: str = "") -> float:
        wanted = f"stomp_adapter_tap_{name}{labels} "
        for line in self.get("/metrics").splitlines():
            if line.startswith(wanted):
                return float(line.split()[-1])
        raise AssertionError(f"no {wanted!r} in /metrics")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
            raise AssertionError(f"the tap did not stop on SIGTERM: {self.log()}") from None

    def records(self) -> list[dict[str, Any]]:
        return read_records(self.record)


def _environment(changes: Mapping[str, str | None] | None) -> dict[str, str] | None:
    """This process's environment with ``changes`` (None: inherited as it is)."""
    if changes is None:
        return None
    environment = dict(os.environ)
    for name, value in changes.items():
        if value is None:
            environment.pop(name, None)
        else:
            environment[name] = value
    return environment


def read_records(directory: Path) -> list[dict[str, Any]]:
    """Every record of the finished files, file by file in name order (hidden ones skipped)."""
    rows: list[dict[str, Any]] = []
    for path in sorted(directory.iterdir()):
        if not path.name.startswith("."):
            with gzip.open(path, "rt", encoding="ascii") as lines:
                rows.extend(json.loads(line) for line in lines)
    return rows


class ScriptedUpstream:
    """A one-connection STOMP "broker" on 127.0.0.1:<free port>: ``script(conn, got)`` drives the
    accepted socket; every byte received is kept in ``received`` (until the client's end of
    stream, which sets ``client_eof``)."""

    def __init__(self, script: Callable[[socket.socket, ScriptedUpstream], None]) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.address = f"127.0.0.1:{self.port}"
        self.received = bytearray()
        self.sent = bytearray()
        self.client_eof = threading.Event()
        self.done = threading.Event()
        self.error: BaseException | None = None
        self._script = script
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._listener.settimeout(30)
            conn, _ = self._listener.accept()
            conn.settimeout(30)
            with conn:
                self._script(conn, self)
        except BaseException as error:  # reported by join()
            self.error = error
        finally:
            self._listener.close()
            self.done.set()

    def send(self, conn: socket.socket, data: bytes) -> None:
        conn.sendall(data)
        self.sent += data

    def read_until(self, conn: socket.socket, marker: bytes) -> None:
        """Receive until ``marker`` has arrived (or the end of stream)."""
        while marker not in self.received:
            data = conn.recv(65536)
            if not data:
                self.client_eof.set()
                return
            self.received += data

    def read_to_end(self, conn: socket.socket) -> None:
        while data := conn.recv(65536):
            self.received += data
        self.client_eof.set()

    def join(self, timeout: float = 30) -> None:
        assert self.done.wait(timeout), "the scripted upstream did not finish"
        if self.error is not None:
            raise self.error


def recv_all(sock: socket.socket, timeout: float = 30) -> bytes:
    """Everything until the end of stream."""
    sock.settimeout(timeout)
    got = bytearray()
    while data := sock.recv(65536):
        got += data
    return bytes(got)


def can_mount_tmpfs(path: Path, size: str) -> bool:
    if os.geteuid() != 0:
        return False
    path.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True
    )
    return result.returncode == 0
