"""--workers 2 as a real process tree: ``python -m adapter --workers 2`` started by the test.

Checks: connections land on both workers (each connection's log line carries the worker's pid),
the supervisor's /metrics adds the workers' counters up, a worker killed with SIGKILL is replaced
(and its counters stay in the totals), SIGTERM ends the supervisor and every worker after telling
a connected client, and a supervisor killed with SIGKILL leaves no worker behind.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trustme
from websockets.sync.client import connect

from adapter.server.stats import SHARED_DESTINATION_LABELS
from tests.integration.test_operations import http_get, scrape, value, wait_for
from tests.support import free_port

CONNECT = b"CONNECT\naccept-version:1.2\nhost:/\nlogin:guest\npasscode:guest\n\n\0"
DISCONNECT = b"DISCONNECT\nreceipt:bye\n\n\0"


@dataclass
class Tree:
    process: subprocess.Popen[bytes]
    log_path: Path
    stomp_port: int
    http_port: int

    def log_lines(self) -> list[dict[str, object]]:
        lines = []
        text = self.log_path.read_text(errors="replace")
        # a worker may be writing its next line right now: a read can catch its first half, so
        # only lines that end with their newline are parsed (the rest is read next time)
        complete = text[: text.rfind("\n") + 1]
        for line in complete.splitlines():
            if line.startswith("{"):
                lines.append(json.loads(line))
        return lines

    def workers(self) -> set[int]:
        """The supervisor's child processes now."""
        pid = self.process.pid
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        return {int(child) for child in children}

    def ready(self) -> bool:
        return http_get(self.http_port, "/readyz")[0] == 200


def start_tree(amqp_url: str, tmp_path: Path, env: dict[str, str] | None = None) -> Tree:
    log_path = tmp_path / "adapter.log"
    http_port = free_port()
    with log_path.open("ab") as log_file:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "adapter",
                "--listen",
                "127.0.0.1:0",
                "--workers",
                "2",
                "--http-listen",
                f"127.0.0.1:{http_port}",
                "--log-format",
                "json",
                "--amqp-url",
                amqp_url,
            ],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )
    tree = Tree(process, log_path, 0, http_port)
    deadline = time.monotonic() + 30
    while True:
        assert process.poll() is None, f"the adapter exited: {log_path.read_text()}"
        assert time.monotonic() < deadline, f"the adapter did not get ready: {log_path.read_text()}"
        ports = [
            re.search(r":(\d+) \(2 workers\)", str(line["message"]))
            for line in tree.log_lines()
            if "(2 workers)" in str(line["message"])
        ]
        if ports and ports[0] is not None:
            tree.stomp_port = int(ports[0].group(1))
            try:
                if tree.ready():
                    return tree
            except OSError:
                pass
        time.sleep(0.1)


@pytest.fixture
def tree(amqp_url: str, tmp_path: Path) -> Iterator[Tree]:
    # one per-destination series per worker, and one in the supervisor's sum
    tree = start_tree(amqp_url, tmp_path, env={"STOMP_ADAPTER_METRICS_DESTINATIONS": "1"})
    workers = tree.workers()
    yield tree
    if tree.process.poll() is None:
        tree.process.send_signal(signal.SIGTERM)
        try:
            tree.process.wait(30)
        except subprocess.TimeoutExpired:
            tree.process.kill()
    for pid in workers | _still_there(workers):
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _still_there(pids: set[int]) -> set[int]:
    return {pid for pid in pids if _alive(pid)}


def read_frame(sock: socket.socket, buffer: bytearray) -> bytes:
    while b"\0" not in buffer:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed; got {bytes(buffer)!r}"
        buffer += chunk
    frame, _, rest = bytes(buffer).partition(b"\0")
    buffer[:] = rest
    return frame.lstrip(b"\r\n")


def connect_cycle(port: int, send_to: str | None = None) -> None:
    """CONNECT, CONNECTED, a SEND to ``send_to`` if given, DISCONNECT with a receipt, RECEIPT."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        buffer = bytearray()
        sock.sendall(CONNECT)
        assert read_frame(sock, buffer).startswith(b"CONNECTED")
        if send_to is not None:
            sock.sendall(f"SEND\ndestination:{send_to}\n\nx\0".encode())
        sock.sendall(DISCONNECT)
        assert read_frame(sock, buffer).startswith(b"RECEIPT")


def opened_by_pid(tree: Tree) -> Counter[int]:
    return Counter(
        int(str(line["pid"]))
        for line in tree.log_lines()
        if line.get("event") == "connection_opened" and "pid" in line
    )


def test_connections_land_on_both_workers_and_metrics_add_up(tree: Tree) -> None:
    workers = tree.workers()
    assert len(workers) == 2
    cycles = 24
    for number in range(cycles):
        connect_cycle(tree.stomp_port, send_to=f"/topic/workers-{number % 3}")
    # a connection's "opened" line is written when it is accepted, before its CONNECTED
    by_pid = opened_by_pid(tree)
    assert set(by_pid) == workers, by_pid  # both workers served some (24 random hashes: 2^-23 odds)
    assert sum(by_pid.values()) == cycles
    samples = scrape(tree.http_port)
    assert value(samples, "stomp_adapter_connections_opened_total", listener="tcp") == cycles
    assert value(samples, "stomp_adapter_frames_received_total", command="CONNECT") == cycles
    assert value(samples, "stomp_adapter_frames_received_total", command="DISCONNECT") == cycles
    assert value(samples, "stomp_adapter_receipts_sent_total") == cycles
    assert value(samples, "stomp_adapter_receipt_seconds_count", command="DISCONNECT") == cycles
    # each worker gave a series to the first destination it saw (maybe two different ones): the
    # supervisor keeps one of them and adds the rest to other
    published = {
        dict(labels)["destination"]: count
        for (name, labels), count in samples.items()
        if name == "stomp_adapter_destination_messages_published_total"
    }
    own = set(published) - set(SHARED_DESTINATION_LABELS)
    assert len(own) == 1 and own <= {f"/topic/workers-{n}" for n in range(3)}, published
    assert sum(published.values()) == cycles
    # (a worker that admitted another destination counted this one's messages as other)
    assert 0 < published[own.pop()] <= cycles / 3
    assert value(samples, "stomp_adapter_workers", state="ready") == 2
    assert value(samples, "stomp_adapter_worker_restarts_total") == 0


def test_a_killed_worker_is_replaced_and_its_counts_stay(tree: Tree) -> None:
    for _ in range(10):
        connect_cycle(tree.stomp_port)
    before = scrape(tree.http_port)  # the supervisor now holds each worker's counts
    assert value(before, "stomp_adapter_connections_opened_total", listener="tcp") == 10
    workers = tree.workers()
    victim = min(workers)
    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: victim not in tree.workers() and len(tree.workers()) == 2, "a new worker")
    wait_for(tree.ready, "readiness after the restart", timeout=30)
    replacement = (tree.workers() - workers).pop()
    after = scrape(tree.http_port)
    assert value(after, "stomp_adapter_worker_restarts_total") == 1
    assert value(after, "stomp_adapter_connections_opened_total", listener="tcp") == 10
    for _ in range(24):
        connect_cycle(tree.stomp_port)
    assert opened_by_pid(tree)[replacement] > 0  # the new worker took over the slot's sockets
    final = scrape(tree.http_port)
    assert value(final, "stomp_adapter_connections_opened_total", listener="tcp") == 34
    messages = [str(line["message"]) for line in tree.log_lines()]
    assert any(f"(pid {victim}) exited with status -9" in message for message in messages), messages


def test_sigterm_stops_every_process_after_telling_the_clients(tree: Tree) -> None:
    workers = tree.workers()
    client = socket.create_connection(("127.0.0.1", tree.stomp_port), timeout=10)
    buffer = bytearray()
    client.sendall(CONNECT)
    assert read_frame(client, buffer).startswith(b"CONNECTED")
    tree.process.send_signal(signal.SIGTERM)
    error = read_frame(client, buffer)
    assert error.startswith(b"ERROR") and b"message:Server shutdown" in error
    client.close()
    assert tree.process.wait(30) == 0
    wait_for(lambda: not _still_there(workers), "the workers to exit")


def test_a_killed_supervisor_leaves_no_worker(tree: Tree) -> None:
    workers = tree.workers()
    tree.process.kill()
    tree.process.wait(10)
    # each worker sees its control socket close and shuts down
    wait_for(lambda: not _still_there(workers), "the orphaned workers to exit", timeout=30)


def test_tls_and_websocket_listeners_are_shared_by_the_workers(amqp_url: str, tmp_path: Path) -> None:
    """The TLS listener (which accepts by itself, for PROXY headers before the handshake) and the
    WebSocket listener take the supervisor's sockets too: both serve under --workers 2."""
    ca = trustme.CA()
    ca.issue_cert("localhost", "127.0.0.1").private_key_and_cert_chain_pem.write_to_path(
        str(tmp_path / "tls.pem")
    )
    tls_port, ws_port = free_port(), free_port()
    tree = start_tree(
        amqp_url,
        tmp_path,
        {
            "STOMP_ADAPTER_SSL_LISTENERS": f"127.0.0.1:{tls_port}",
            "STOMP_ADAPTER_SSL_CERTFILE": str(tmp_path / "tls.pem"),
            "STOMP_ADAPTER_WEB_STOMP_LISTENERS": f"127.0.0.1:{ws_port}",
        },
    )
    try:
        context = ssl.create_default_context()
        ca.configure_trust(context)
        for _ in range(6):
            with (
                socket.create_connection(("127.0.0.1", tls_port), timeout=10) as raw,
                context.wrap_socket(raw, server_hostname="localhost") as sock,
            ):
                sock.sendall(CONNECT)
                assert read_frame(sock, bytearray()).startswith(b"CONNECTED")
        with connect(f"ws://127.0.0.1:{ws_port}/ws", subprotocols=["v12.stomp"]) as ws:
            ws.send(CONNECT.decode())
            assert str(ws.recv(timeout=10)).startswith("CONNECTED")
    finally:
        tree.process.send_signal(signal.SIGTERM)
        assert tree.process.wait(30) == 0


def _login(port: int) -> tuple[socket.socket, bytes]:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    buffer = bytearray()
    sock.sendall(CONNECT)
    return sock, read_frame(sock, buffer)


def _fill(port: int, tries: int) -> tuple[list[socket.socket], int]:
    """Open ``tries`` connections; keep the logged-in ones, close the refused ones."""
    kept, refused = [], 0
    for _ in range(tries):
        sock, frame = _login(port)
        if frame.startswith(b"CONNECTED"):
            kept.append(sock)
        else:
            assert b"node connection limit reached" in frame, frame
            refused += 1
            sock.close()
    return kept, refused


def test_the_cap_holds_for_the_workers_together(amqp_url: str, tmp_path: Path) -> None:
    """stomp.max_connections = 4 with --workers 2: 4 sessions in all, whichever worker each
    lands on (not 4 per worker, nor 2 each); a worker killed with SIGKILL gives its slots back,
    so after its restart the set admits exactly as many as it held."""
    tree = start_tree(amqp_url, tmp_path, env={"STOMP_ADAPTER_MAX_CONNECTIONS": "4"})
    kept: list[socket.socket] = []
    try:
        kept, refused = _fill(tree.stomp_port, 12)
        assert (len(kept), refused) == (4, 8)
        serving = Counter(
            int(str(line["pid"])) for line in tree.log_lines() if line.get("event") == "connection_logged_in"
        )
        assert sum(serving.values()) == 4
        victim, held = serving.most_common(1)[0]
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: victim not in tree.workers() and len(tree.workers()) == 2, "a new worker")
        wait_for(tree.ready, "the new worker to listen")
        more, refused = _fill(tree.stomp_port, 12)
        kept += more
        # the victim's sessions are gone and their slots are free again, and no more than that
        assert (len(more), refused) == (held, 12 - held), serving
    finally:
        for sock in kept:
            sock.close()
        tree.process.send_signal(signal.SIGTERM)
        tree.process.wait(30)
