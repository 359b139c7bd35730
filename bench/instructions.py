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
  an auto-ack subscriber on another connection;
* ``large``: the same with 64 KiB bodies (``--size`` another size, e.g. 1048576), one SEND per
  write, at most 8 in flight;
* ``client-individual``: the same, to a ``client-individual`` subscriber with a prefetch of 100
  that ACKs every MESSAGE, the ACKs of what one read brought in one write;
* ``reqrep``, ``persistent``, ``connect``: see their functions.

    python -m bench.instructions connect --count 300
    python -m bench.instructions queue --count 5000 --checkout /path/to/other/worktree

The adapter inherits the environment, so a setting is given as its variable, e.g.
``STOMP_ADAPTER_AMQP_SESSIONS_PER_CONNECTION=8 python -m bench.instructions connect``.

Needs valgrind (Debian's package) and the broker on ``--amqp-url``.  One run takes 1-3 minutes.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pstats
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


def acked_messages(port: int, count: int) -> None:
    queue = os.environ.get("BENCH_INSTRUCTIONS_QUEUE", "/queue/bench-instructions") + "-ci"
    consumer = _login(port)
    consumer.sendall(
        f"SUBSCRIBE\nid:1\ndestination:{queue}\nack:client-individual\nprefetch-count:100\n"
        "receipt:s\n\n\0".encode()
    )
    frame, buffered = _read_frame(consumer, b"")
    if not frame.startswith(b"RECEIPT"):
        raise SystemExit(f"SUBSCRIBE refused: {frame[:200]!r}")
    producer = _login(port)
    body = b"x" * 1024
    burst = (f"SEND\ndestination:{queue}\ncontent-length:{len(body)}\n\n".encode() + body + b"\0") * 10
    sent = received = 0
    while received < count:
        while sent < count and sent - received < 100:
            producer.sendall(burst)
            sent += 10
        data = consumer.recv(1 << 20)
        if not data:
            raise SystemExit("the adapter closed the consumer's connection")
        *frames, buffered = (buffered + data).split(b"\0")
        ids = [re.search(rb"\nack:([^\n]*)", frame) for frame in frames if b"MESSAGE" in frame[:10]]
        consumer.sendall(b"".join(b"ACK\nid:" + found.group(1) + b"\n\n\0" for found in ids if found))
        received += len(ids)
    producer.close()
    consumer.close()


class _Reader:
    """Whole frames from a blocking socket (the NUL after a frame, then its heart-beat EOLs)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffered = b""

    def frame(self) -> bytes:
        frame, self.buffered = _read_frame(self.sock, self.buffered)
        return frame


def _subscribe(port: int, destination: str, receipt: str = "s") -> socket.socket:
    sock = _login(port)
    sock.sendall(f"SUBSCRIBE\nid:1\ndestination:{destination}\nack:auto\nreceipt:{receipt}\n\n\0".encode())
    frame, _ = _read_frame(sock, b"")
    if not frame.startswith(b"RECEIPT"):
        raise SystemExit(f"SUBSCRIBE refused: {frame[:200]!r}")
    return sock


def request_reply(port: int, count: int) -> None:
    """One request outstanding: SEND with reply-to:/temp-queue/..., a responder (another
    connection) answers to the reply-to it is given, the requester reads the reply; each item
    crosses the adapter four times (two SENDs in, two MESSAGEs out)."""
    responder = _subscribe(port, "/queue/bench-instructions-rpc")
    requester = _login(port)
    answers, replies = _Reader(responder), _Reader(requester)
    body = b"x" * 1024
    for n in range(count):
        requester.sendall(
            f"SEND\ndestination:/queue/bench-instructions-rpc\nreply-to:/temp-queue/r\n"
            f"correlation-id:{n}\ncontent-length:{len(body)}\n\n".encode()
            + body
            + b"\0"
        )
        request = answers.frame()
        head = request.split(b"\n\n", 1)[0]
        reply_to = next(line[9:] for line in head.split(b"\n") if line.startswith(b"reply-to:"))
        responder.sendall(b"SEND\ndestination:" + reply_to + b"\n\n" + body + b"\0")
        if not replies.frame().startswith(b"MESSAGE"):
            raise SystemExit("request/reply: the reply is not a MESSAGE")
    responder.close()
    requester.close()


LARGE_SIZE = 65536  # the large workload's body size (``--size``)


def _set_large_size(size: int) -> None:
    global LARGE_SIZE
    LARGE_SIZE = size


def large_messages(port: int, count: int) -> None:
    """Bodies of ``LARGE_SIZE`` bytes (64 KiB unless ``--size``) to a queue and back to an
    auto-ack subscriber, at most 8 in flight (at most 8 MiB: fewer for larger bodies)."""
    queue = os.environ.get("BENCH_INSTRUCTIONS_QUEUE", "/queue/bench-instructions") + "-large"
    consumer = _subscribe(port, queue)
    producer = _login(port)
    body = b"x" * LARGE_SIZE
    in_flight = max(1, min(8, (8 << 20) // LARGE_SIZE))
    send = f"SEND\ndestination:{queue}\ncontent-length:{len(body)}\n\n".encode() + body + b"\0"
    reader = _Reader(consumer)
    sent = received = 0
    while received < count:
        while sent < count and sent - received < in_flight:
            producer.sendall(send)
            sent += 1
        reader.frame()
        received += 1
    producer.close()
    consumer.close()


_PERSISTENT_QUEUE = "/queue/bench-instructions-persistent"


def persistent_receipts(port: int, count: int) -> None:
    """persistent:true SENDs of 1 KiB to a durable queue, each with a receipt (so a broker
    confirm), at most 100 outstanding; nobody consumes meanwhile (``drain_persistent`` empties
    the queue afterwards, outside the count)."""
    producer = _login(port)
    reader = _Reader(producer)
    body = b"x" * 1024
    sent = receipted = 0
    while receipted < count:
        while sent < count and sent - receipted < 100:
            producer.sendall(
                f"SEND\ndestination:{_PERSISTENT_QUEUE}\npersistent:true\nreceipt:{sent}\n"
                f"content-length:{len(body)}\n\n".encode()
                + body
                + b"\0"
            )
            sent += 1
        if not reader.frame().startswith(b"RECEIPT"):
            raise SystemExit("persistent: a SEND was refused")
        receipted += 1
    producer.close()


def drain_persistent(port: int) -> None:
    """Empty the persistent workload's queue, so that repeated runs do not make it grow."""
    sock = _subscribe(port, _PERSISTENT_QUEUE, receipt="drain")
    sock.settimeout(2)
    with contextlib.suppress(OSError):  # a timeout: nothing more to read
        while sock.recv(1 << 20):
            pass
    sock.close()


WORKLOADS = {
    "connect": connect_cycles,
    "queue": queued_messages,
    "client-individual": acked_messages,
    "reqrep": request_reply,
    "large": large_messages,
    "persistent": persistent_receipts,
}
AFTERWARDS = {"persistent": drain_persistent}  # run uninstrumented after the measured items
DEFAULT_COUNTS = {  # items measured, items of warm-up before
    "connect": (300, 20),
    "queue": (5000, 300),
    "client-individual": (5000, 300),
    "reqrep": (1000, 50),
    "large": (500, 20),
    "persistent": (3000, 200),
}


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


def _adapter_command(port: int, amqp_url: str) -> list[str]:
    return [sys.executable, "-m", "adapter", "--listen", f"127.0.0.1:{port}", "--amqp-url", amqp_url]


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGINT)  # a graceful stop writes the counts (or the profile)
    try:
        process.wait(120)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def measure(
    workload: str, count: int, warmup: int, checkout: Path, port: int, amqp_url: str, top: int = 0
) -> int:
    """Instructions (callgrind's Ir) the adapter executed during ``count`` items of ``workload``;
    with ``top``, also print the ``top`` C functions of the interpreter by their own instructions
    (where a copy, an allocation or a system call shows as itself)."""
    with tempfile.TemporaryDirectory(prefix="bench-instructions-") as scratch:
        out = Path(scratch) / "callgrind.out"
        command = [
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            f"--callgrind-out-file={out}",
            *_adapter_command(port, amqp_url),
        ]
        with open(Path(scratch) / "adapter.log", "wb") as log:
            process = subprocess.Popen(command, cwd=checkout, stdout=log, stderr=subprocess.STDOUT)
        try:
            _wait_for_port(port, process, 300)
            WORKLOADS[workload](port, warmup)
            _callgrind_control("--instr=on", process.pid)
            WORKLOADS[workload](port, count)
            _callgrind_control("--instr=off", process.pid)
            if workload in AFTERWARDS:
                AFTERWARDS[workload](port)
        finally:
            _stop(process)
        totals = re.search(r"^totals: (\d+)", out.read_text(), re.MULTILINE)
        if totals is None:
            raise SystemExit(f"no totals in callgrind's output {out}")
        if top:
            annotated = subprocess.run(
                ["callgrind_annotate", "--auto=no", "--threshold=100", str(out)],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            rows = [line for line in annotated.splitlines() if re.match(r"^\s*[\d,]+ \(", line)]
            print(f"top {top} C functions by own instructions, per item:")
            for line in rows[1 : top + 1]:  # rows[0] is the total
                own, rest = line.split(" (", 1)
                name = rest.split(")", 1)[1].strip()
                print(f"  {int(own.replace(',', '')) / count:>10,.0f}  {name[:110]}")
        return int(totals.group(1))


_PROFILE_DRIVER = """
import cProfile, signal, sys
from adapter.cli import main
profiler = cProfile.Profile()
signal.signal(signal.SIGUSR1, lambda *_: profiler.enable())
signal.signal(signal.SIGUSR2, lambda *_: profiler.disable())
sys.argv = ["adapter", *sys.argv[2:]]
try:
    main()
finally:
    profiler.disable()
    profiler.dump_stats(sys.argv_out)
"""


def profile(
    workload: str, count: int, warmup: int, checkout: Path, port: int, amqp_url: str, top: int
) -> None:
    """The adapter under cProfile during the measured items only (SIGUSR1 and SIGUSR2 switch it
    on and off): the ``top`` functions by own time per item, of the adapter's own Python code and
    what it calls; the event loop's wait and C-level I/O show as ``run``.  The profiler's
    overhead inflates small functions: read the shares and the calls per item, not the µs.
    (adapter.cli.main, not ``-m adapter``: its run() ends with os._exit, which would skip the
    profile's file.)"""
    with tempfile.TemporaryDirectory(prefix="bench-profile-") as scratch:
        out = Path(scratch) / "profile.out"
        driver = _PROFILE_DRIVER.replace("sys.argv_out", repr(str(out)))
        command = [sys.executable, "-c", driver, "--", *_adapter_command(port, amqp_url)[3:]]
        with open(Path(scratch) / "adapter.log", "wb") as log:
            process = subprocess.Popen(command, cwd=checkout, stdout=log, stderr=subprocess.STDOUT)
        try:
            _wait_for_port(port, process, 120)
            WORKLOADS[workload](port, warmup)
            process.send_signal(signal.SIGUSR1)
            time.sleep(0.2)
            started = time.monotonic()
            WORKLOADS[workload](port, count)
            elapsed = time.monotonic() - started
            process.send_signal(signal.SIGUSR2)
            if workload in AFTERWARDS:
                AFTERWARDS[workload](port)
        finally:
            _stop(process)
        stats = pstats.Stats(str(out))
        entries = sorted(
            stats.stats.items(),  # type: ignore[attr-defined]
            key=lambda item: item[1][2],
            reverse=True,
        )
        busy = sum(own for (_f, _l, name), (_c, _n, own, _cu, _ca) in entries if name != "run")
        print(
            f"{workload}: {elapsed / count * 1e6:,.0f} µs per item (wall, profiled), "
            f"{busy / count * 1e6:,.0f} µs of it in profiled Python functions"
        )
        print(f"top {top} functions by own time:")
        for (filename, line, name), (_cc, calls, own, _cum, _callers) in entries[:top]:
            where = (
                filename.rsplit("/adapter/", 1)[-1]
                if "/adapter/" in filename
                else filename.rsplit("/", 1)[-1]
            )
            print(f"  {own / count * 1e6:8.1f} µs  {calls / count:6.2f} calls/item  {where}:{line} {name}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.instructions", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("workload", choices=sorted(WORKLOADS))
    parser.add_argument("--count", type=int, default=None, help="items measured (DEFAULT_COUNTS)")
    parser.add_argument("--warmup", type=int, default=None, help="items before measuring (DEFAULT_COUNTS)")
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
    parser.add_argument("--top", type=int, default=0, help="also list the N costliest functions")
    parser.add_argument(
        "--size", type=int, default=LARGE_SIZE, help="the large workload's body size (default 65536)"
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="run the adapter under cProfile instead of callgrind: Python functions by own time",
    )
    args = parser.parse_args(argv)
    _set_large_size(args.size)
    count = args.count or DEFAULT_COUNTS[args.workload][0]
    warmup = args.warmup or DEFAULT_COUNTS[args.workload][1]
    if args.profile:
        profile(args.workload, count, warmup, args.checkout, args.port, args.amqp_url, args.top or 25)
        return 0
    total = measure(args.workload, count, warmup, args.checkout, args.port, args.amqp_url, args.top)
    print(
        f"{args.workload}: {total:,} instructions over {count} items, {total / count:,.0f} per item "
        f"(adapter from {args.checkout})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
