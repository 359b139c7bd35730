"""``python -m bench.relay``: a plain byte relay, the yardstick of the recording tap's proxying.

What one would write first to put a Python process between STOMP clients and a broker: asyncio
streams, one task per direction that reads what is there (up to 64 KiB) and writes it on, waiting
for the other side to drain.  It parses nothing and records nothing.  What arrives while a
direction's task waits (to run, or for a drain) is read and written in one go.  With
``--nagle`` the kernel coalesces small writes too: asyncio sets TCP_NODELAY on every TCP
socket, this takes it off, so a small write waits while an earlier one is not acknowledged
(docs/performance.md, "The recording tap").

    python -m bench.relay --listen 127.0.0.1:PORT --upstream 127.0.0.1:61613 [--nagle]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import socket

READ_BYTES = 64 * 1024


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """One direction until its end of stream, which is passed on as an end of stream."""
    try:
        while data := await reader.read(READ_BYTES):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except OSError:
        writer.close()


async def _connection(
    upstream: tuple[str, int], nagle: bool, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    try:
        up_reader, up_writer = await asyncio.open_connection(*upstream)
    except OSError:
        writer.close()
        return
    if nagle:  # asyncio sets TCP_NODELAY on every TCP transport: take it off again
        for side in (writer, up_writer):
            side.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 0)
    await asyncio.gather(_pump(reader, up_writer), _pump(up_reader, writer))
    for closing in (writer, up_writer):
        closing.close()
        with contextlib.suppress(OSError):
            await closing.wait_closed()


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


async def serve(listen: tuple[str, int], upstream: tuple[str, int], nagle: bool) -> None:
    server = await asyncio.start_server(
        lambda reader, writer: _connection(upstream, nagle, reader, writer), *listen, reuse_address=True
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.relay", description=__doc__.splitlines()[0])
    parser.add_argument("--listen", required=True, metavar="HOST:PORT")
    parser.add_argument("--upstream", required=True, metavar="HOST:PORT")
    parser.add_argument(
        "--nagle",
        action="store_true",
        help="leave Nagle's algorithm on (no TCP_NODELAY): the kernel also coalesces small writes "
        "while an earlier one is not acknowledged",
    )
    parser.add_argument(
        "--no-uvloop", action="store_true", help="asyncio's default loop (the tap uses uvloop)"
    )
    args = parser.parse_args()
    run = asyncio.run
    if not args.no_uvloop:
        with contextlib.suppress(ImportError):
            import uvloop

            run = uvloop.run
    run(serve(_address(args.listen), _address(args.upstream), args.nagle))


if __name__ == "__main__":
    main()
