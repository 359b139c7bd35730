"""``python -m bench.shutdown``: how long a graceful stop takes with many subscribed clients.

Starts the adapter (``python -m adapter``, with ``--workers`` if asked) in front of the broker at
``--amqp-url`` (a private node: the bench opens thousands of AMQP connections), opens
``--clients`` STOMP clients that each subscribe to one shared topic (each subscription is an
auto-delete queue and a consumer on the broker, the costly case to close), then sends SIGTERM and
reports, from the signal:

* ``clients told``: when every client had its ERROR ``Server shutdown`` (or its socket closed);
* ``adapter exited``: when the adapter's process ended;
* ``broker done``: when the broker had no socket from the adapter left (it cleans up the
  connections the adapter dropped at its deadline in its own time, requeueing what was
  unacknowledged);
* the adapter's own shutdown lines (how many AMQP connections closed cleanly, how many it
  dropped at ``adapter.shutdown_timeout``).

Timings are wall-clock on whatever else the machine is doing: say so with the figures.
"""

from __future__ import annotations

import argparse
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

from .services import ROOT, free_port, port_answers, raise_own_nofile

CONNECT = b"CONNECT\naccept-version:1.2\nhost:/\nlogin:guest\npasscode:guest\n\n\0"


def _broker_sockets(broker_port: int) -> int:
    """TCP sockets whose local port is the broker's (the broker's side of each AMQP connection,
    in any state but LISTEN and TIME_WAIT), read from /proc/net/tcp."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            state = fields[3]
            if local_port == broker_port and state not in ("0A", "06"):  # LISTEN, TIME_WAIT
                count += 1
    return count


def _open_clients(port: int, count: int) -> list[socket.socket]:
    clients: list[socket.socket] = []
    selector = selectors.DefaultSelector()
    pending: dict[socket.socket, bytes] = {}
    for number in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        sock.sendall(
            CONNECT + f"SUBSCRIBE\nid:0\ndestination:/topic/bench-shutdown\nreceipt:s{number}\n\n\0".encode()
        )
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ)
        pending[sock] = b""
        clients.append(sock)
        if len(pending) >= 200:  # a window of logins in flight
            _drain(selector, pending, until=100)
    _drain(selector, pending, until=0)
    selector.close()
    return clients


def _drain(selector: selectors.BaseSelector, pending: dict[socket.socket, bytes], until: int) -> None:
    deadline = time.monotonic() + 120
    while len(pending) > until:
        if time.monotonic() > deadline:
            raise SystemExit(f"{len(pending)} clients were not subscribed within 120 s")
        for key, _ in selector.select(1.0):
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            data = pending[sock] + sock.recv(65536)
            if not data or data.startswith(b"ERROR"):
                raise SystemExit(f"a client was refused: {data[:200]!r}")
            if b"RECEIPT" in data:
                selector.unregister(sock)
                del pending[sock]
            else:
                pending[sock] = data


def _wait_told(clients: list[socket.socket], timeout: float) -> int:
    """Until every client got its ERROR or EOF; returns how many did."""
    selector = selectors.DefaultSelector()
    for sock in clients:
        selector.register(sock, selectors.EVENT_READ)
    told = 0
    deadline = time.monotonic() + timeout
    while told < len(clients) and time.monotonic() < deadline:
        for key, _ in selector.select(0.2):
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            try:
                data = sock.recv(65536)
            except OSError:
                data = b""
            if not data or b"ERROR" in data:
                selector.unregister(sock)
                told += 1
    selector.close()
    return told


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.shutdown", description=__doc__.split("\n\n")[0])
    parser.add_argument("--amqp-url", required=True, help="the broker (a private node)")
    parser.add_argument("--clients", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--shutdown-timeout", type=float, default=10.0)
    args = parser.parse_args(argv)
    raise_own_nofile()
    broker_port = urlsplit(args.amqp_url).port or 5672
    port = free_port()
    log_path = ROOT / "bench" / "results" / f"shutdown-{port}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "STOMP_ADAPTER_SHUTDOWN_TIMEOUT": str(args.shutdown_timeout),
        "STOMP_ADAPTER_WORKERS": str(args.workers),
    }
    with log_path.open("wb") as log:
        adapter = subprocess.Popen(
            [sys.executable, "-m", "adapter", "--listen", f"127.0.0.1:{port}", "--amqp-url", args.amqp_url],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 30
        while not port_answers("127.0.0.1", port):
            if adapter.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the adapter did not start:\n{log_path.read_text()}")
            time.sleep(0.1)
        time.sleep(0.5 * args.workers)
        opened = time.monotonic()
        clients = _open_clients(port, args.clients)
        print(f"{len(clients)} subscribed clients in {time.monotonic() - opened:.1f} s;", end=" ")
        print(f"broker sockets: {_broker_sockets(broker_port)}")
        start = time.monotonic()
        adapter.send_signal(signal.SIGTERM)
        told = _wait_told(clients, timeout=args.shutdown_timeout + 60)
        told_at = time.monotonic() - start
        adapter.wait(args.shutdown_timeout + 60)
        exited_at = time.monotonic() - start
        left_at_exit = _broker_sockets(broker_port)
        while _broker_sockets(broker_port) and time.monotonic() - start < 300:
            time.sleep(0.05)
        broker_done = time.monotonic() - start
        for sock in clients:
            sock.close()
        print(f"clients told:   {told}/{len(clients)} after {told_at:.2f} s")
        print(f"adapter exited: {exited_at:.2f} s (status {adapter.returncode})")
        print(f"broker sockets left at exit: {left_at_exit}; broker done: {broker_done:.2f} s")
        for line in log_path.read_text(errors="replace").splitlines():
            if "shutting down" in line or "did not close" in line or "AMQP connection" in line:
                print("  log:", line.split(": ", 1)[-1])
    finally:
        if adapter.poll() is None:
            adapter.kill()
            adapter.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
