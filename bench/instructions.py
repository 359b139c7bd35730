"""``python -m bench.instructions``: machine instructions the adapter executes per connect cycle or
per queued message, counted by valgrind's callgrind, so that two commits can be compared on a
loaded machine.

Wall-clock and CPU-time figures of this 2-core machine move by 2x when other work runs beside
them; an instruction count does not depend on what else the machine does (valgrind counts what the
process executes, not how long it takes).  It is not a time: cache misses and system calls cost
what they cost, and a process slowed 50x by valgrind reads bigger batches than at full speed.  It
answers one question well: does this commit make the adapter do more work per item than that one?

How: the adapter runs under ``valgrind --tool=callgrind --instr-atstart=no`` (from ``--checkout``,
default this one), listening on ``--port``.  A warm-up of the workload runs uninstrumented; then
``callgrind_control -i on``, the measured workload, ``-i off``, and the adapter is stopped.  The
client is this process, with plain blocking sockets (its own cost is not counted).

Workloads:

* ``connect``: CONNECT (STOMP 1.2, guest) + DISCONNECT with a receipt, sequential;
* ``queue``: SENDs of 1 KiB to a queue (10 per write, at most 100 in flight) and their MESSAGEs to
  an auto-ack subscriber on another connection.

    python -m bench.instructions connect --count 300
    python -m bench.instructions queue --count 5000 --checkout /path/to/other/worktree

The adapter inherits the environment, so a setting is given as its variable, e.g.
``STOMP_ADAPTER_AMQP_SESSIONS_PER_CONNECTION=8 python -m bench.instructions connect``.

Needs valgrind (Debian's package) and the broker on ``--amqp-url``.  One run takes 1-3 minutes.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_CONNECT = b"CONNECT\naccept-version:1.2\nhost:/\nlogin:guest\npasscode:guest\n\n\0"


def _read_frame(sock: socket.socket, buffered: bytes) -> tuple[bytes, bytes]:
    while b"\0" not in buffered:
        chunk = sock.recv(65536)
        if not chunk:
            raise SystemExit("the adapter closed the connection early")
        buffered += chunk
    end = buffered.index(b"\0")
    return buffered[:end], buffered[end + 1 :].lstrip(b"\r\n")


def _login(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(_CONNECT)
    frame, _ = _read_frame(sock, b"")
    if not frame.startswith(b"CONNECTED"):
        raise SystemExit(f"CONNECT refused: {frame[:200]!r}")
    return sock


def connect_cycles(port: int, count: int) -> None:
    for _ in range(count):
        sock = _login(port)
        sock.sendall(b"DISCONNECT\nreceipt:bye\n\n\0")
        frame, _ = _read_frame(sock, b"")
        if not frame.startswith(b"RECEIPT"):
            raise SystemExit(f"no RECEIPT for DISCONNECT: {frame[:200]!r}")
        sock.close()


def queued_messages(port: int, count: int) -> None:
    # durable, as SEND declares it; left empty.  BENCH_INSTRUCTIONS_QUEUE names another one for
    # runs beside each other on one broker (two consumers of one queue share its messages, and
    # each waits for all of them)
    queue = os.environ.get("BENCH_INSTRUCTIONS_QUEUE", "/queue/bench-instructions")
    consumer = _login(port)
    consumer.sendall(f"SUBSCRIBE\nid:1\ndestination:{queue}\nack:auto\nreceipt:s\n\n\0".encode())
    frame, _ = _read_frame(consumer, b"")
    if not frame.startswith(b"RECEIPT"):
        raise SystemExit(f"SUBSCRIBE refused: {frame[:200]!r}")
    producer = _login(port)
    body = b"x" * 1024
    burst = (
        f"SEND\ndestination:{queue}\ncontent-type:text/plain\ncontent-length:{len(body)}\n\n".encode()
        + body
        + b"\0"
    ) * 10
    sent = received = 0
    while received < count:
        while sent < count and sent - received < 100:
            producer.sendall(burst)
            sent += 10
        data = consumer.recv(1 << 20)
        if not data:
            raise SystemExit("the adapter closed the consumer's connection")
        received += data.count(b"\0")  # one per MESSAGE (the bodies hold no NUL)
    producer.close()
    consumer.close()


WORKLOADS = {"connect": connect_cycles, "queue": queued_messages}


def _wait_for_port(port: int, process: subprocess.Popen[bytes], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the adapter exited with {process.returncode} before listening")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.5)
    raise SystemExit(f"the adapter did not listen on {port} within {seconds:.0f} s")


def _callgrind_control(option: str, pid: int) -> None:
    subprocess.run(["callgrind_control", option, str(pid)], check=True, stdout=subprocess.DEVNULL)


def measure(workload: str, count: int, warmup: int, checkout: Path, port: int, amqp_url: str) -> int:
    """Instructions (callgrind's Ir) the adapter executed during ``count`` items of ``workload``."""
    with tempfile.TemporaryDirectory(prefix="bench-instructions-") as scratch:
        out = Path(scratch) / "callgrind.out"
        command = [
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            f"--callgrind-out-file={out}",
            sys.executable,
            "-m",
            "adapter",
            "--listen",
            f"127.0.0.1:{port}",
            "--amqp-url",
            amqp_url,
        ]
        with open(Path(scratch) / "adapter.log", "wb") as log:
            process = subprocess.Popen(command, cwd=checkout, stdout=log, stderr=subprocess.STDOUT)
        try:
            _wait_for_port(port, process, 300)
            WORKLOADS[workload](port, warmup)
            _callgrind_control("--instr=on", process.pid)
            WORKLOADS[workload](port, count)
            _callgrind_control("--instr=off", process.pid)
        finally:
            process.send_signal(signal.SIGINT)  # a graceful stop writes the counts
            try:
                process.wait(120)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        totals = re.search(r"^totals: (\d+)", out.read_text(), re.MULTILINE)
        if totals is None:
            raise SystemExit(f"no totals in callgrind's output {out}")
        return int(totals.group(1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.instructions", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("workload", choices=sorted(WORKLOADS))
    parser.add_argument("--count", type=int, default=None, help="items measured (connect 300, queue 5000)")
    parser.add_argument(
        "--warmup", type=int, default=None, help="items before measuring (connect 20, queue 300)"
    )
    parser.add_argument(
        "--checkout",
        type=Path,
        default=Path(__file__).resolve().parent.parent,
        help="the source tree whose adapter runs (default: this one)",
    )
    parser.add_argument("--port", type=int, default=23911, help="the adapter's port (default 23911)")
    parser.add_argument(
        "--amqp-url", default=os.environ.get("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
    )
    args = parser.parse_args(argv)
    count = args.count or (300 if args.workload == "connect" else 5000)
    warmup = args.warmup or (20 if args.workload == "connect" else 300)
    total = measure(args.workload, count, warmup, args.checkout, args.port, args.amqp_url)
    print(
        f"{args.workload}: {total:,} instructions over {count} items, {total / count:,.0f} per item "
        f"(adapter from {args.checkout})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
