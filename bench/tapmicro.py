"""``python -m bench.tapmicro``: the recording tap's CPU per message, in one process, no sockets.

The real ``Tap`` and ``TappedConnection`` (adapter/tap/proxy.py) with sink transports: each message is one
1 KiB SEND read from the client and one MESSAGE read from the upstream, ``--per-read`` frames per
read, recorded without bodies; ``--mode`` ``none`` (no recorder), ``noop`` (records made, then
thrown away) or ``write`` (the real writer thread, gzip files in a temporary directory).  It
prints the main thread's and the process's CPU per message.  Wall and CPU times move with the
machine's load; for a figure that does not, count instructions:

    valgrind --tool=callgrind python -m bench.tapmicro --messages N ...

twice (two values of N) and divide the difference by the difference of N (docs/performance.md).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from adapter.tap.proxy import Tap, TappedConnection, TapSettings
from adapter.tap.writer import RecordWriter

from .sinks import Sink

BODY = b"x" * 1024
DESTINATION = b"/queue/bench-7c5f8e-queue-adapter-r1-q"
SEND = b"SEND\ndestination:" + DESTINATION + b"\ncontent-length:1024\n\n" + BODY + b"\0"


def message(n: int) -> bytes:
    """A MESSAGE frame as RabbitMQ's STOMP plugin sends it."""
    return (
        b"MESSAGE\nsubscription:0\ndestination:"
        + DESTINATION
        + b"\nmessage-id:T_0@@session-Hgh4_5aBg0x3PsISaUvXgA@@%d\nredelivered:false\ncontent-length:1024\n\n"
        % n
        + BODY
        + b"\0\n"
    )


async def run(per_read: int, messages: int, mode: str) -> str:
    with tempfile.TemporaryDirectory() as directory:
        writer = RecordWriter(Path(directory))
        writer.start()
        emit = {"write": writer.offer, "noop": lambda conn, lines, count: None, "none": None}[mode]
        tap = Tap(TapSettings(listeners=[], upstream=("127.0.0.1", 1)), emit)
        link = TappedConnection(tap, Sink(), "127.0.0.1:1")  # type: ignore[arg-type]
        assert link._connecting is not None
        link._connecting.cancel()  # connected at once, to a sink
        link._connecting, link.upstream, link._early = None, Sink(), None  # type: ignore[assignment]
        reads = messages // per_read
        ins = [SEND * per_read] * reads
        outs = [b"".join(message(i * per_read + j) for j in range(per_read)) for i in range(reads)]
        cpu, thread = time.process_time(), time.thread_time()
        for data_in, data_out in zip(ins, outs, strict=True):
            link.from_client(data_in)
            link.from_upstream(data_out)
        tap.batches.flush()
        thread = time.thread_time() - thread
        while writer.pending:
            await asyncio.sleep(0.01)
        cpu = time.process_time() - cpu
        writer.close()
        n = reads * per_read
        return (
            f"{mode} x{per_read}: main thread {1e6 * thread / n:.2f} µs/message, process "
            f"{1e6 * cpu / n:.2f} µs/message (records written {writer.written}, dropped {writer.dropped})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.tapmicro", description=__doc__.splitlines()[0])
    parser.add_argument("--per-read", type=int, default=1, help="frames per read (default 1)")
    parser.add_argument("--messages", type=int, default=40_000)
    parser.add_argument("--mode", choices=["none", "noop", "write"], default="write")
    args = parser.parse_args()
    print(asyncio.run(run(args.per_read, args.messages, args.mode)))


if __name__ == "__main__":
    main()
