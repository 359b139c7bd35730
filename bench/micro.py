"""``python -m bench.micro``: the adapter's own CPU per message, without sockets or a second process.

The end-to-end scenarios (``python -m bench``) say how the adapter compares with the plugin, but
their figures move with the machine.  This measures only the adapter's Python per-message path, the
part a code change can make cheaper, with the real classes the server runs:

* a ``ClientConnection`` logs in and subscribes for real (RabbitMQ on ``AMQP_URL``, default
  ``amqp://guest:guest@127.0.0.1:5672/``), then both of its transports are swapped for sinks that
  only count bytes, so nothing more reaches the broker;
* ``send``: STOMP SEND frames in (``ClientConnection.data_received``), AMQP publish frames out;
* ``deliver``: AMQP basic.deliver + content header + body in (``AmqpSocket.data_received``),
  STOMP MESSAGE frames out;
* ``ack``: STOMP ACK frames in (client-individual), AMQP basic.ack out;
* ``reply``: a SEND with ``reply-to:/temp-queue/...`` and a ``correlation-id`` (the request/reply
  scenario), then its delivery with ``reply-to`` and ``correlation-id`` properties;
* ``receipt``: SENDs with a ``receipt`` header (confirms are on), then per read one broker
  basic.ack (multiple) confirming them all, and their RECEIPT frames out.

``--metrics-destinations N`` runs it all with the per-destination series on (docs/configuration.md).

Each case runs with 1 frame per read (how a request/reply at a low rate arrives) and with 64 frames
per read (a busy connection), and reports the best of ``--repeat`` timings in µs per message.
Socket system calls and event-loop turns are *not* included: they are the other half of the cost
(see docs/performance.md).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections.abc import Callable

from adapter.amqp import wire
from adapter.amqp.connection import AmqpConnection
from adapter.cli import build_server
from adapter.config import Settings
from adapter.mapping.properties import MessageProperties
from adapter.server.connection import ClientConnection

from .sinks import CountingSink

BODY = b"x" * 1024


class Recorder(CountingSink):
    """The client side during set-up: keeps the frames so the harness can wait for replies."""

    def __init__(self) -> None:
        super().__init__()
        self.data = bytearray()

    def write(self, data: bytes) -> None:
        super().write(data)
        self.data += data


def deliver_frames(consumer_tag: str, delivery_tag: int, routing_key: str, props: MessageProperties) -> bytes:
    method = wire.method_frame(
        1,
        wire.BASIC_DELIVER,
        wire.shortstr(consumer_tag)
        + delivery_tag.to_bytes(8, "big")
        + b"\x00"
        + wire.shortstr("")
        + wire.shortstr(routing_key),
    )
    # a publish's header and body frames have the same layout as a delivery's
    header_and_body = wire.basic_publish(1, "", routing_key, props, BODY, 131072)[1:]
    return method + b"".join(header_and_body)


async def wait_for(recorder: Recorder, needle: bytes, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while needle not in recorder.data:
        if b"ERROR" in recorder.data or time.monotonic() > deadline:
            raise RuntimeError(f"set-up failed waiting for {needle!r}: {bytes(recorder.data)[-400:]!r}")
        await asyncio.sleep(0.005)


def feeder(receive: Callable[[bytes], None], data: bytes, reads: int) -> Callable[[], None]:
    """An action that hands ``data`` to ``receive`` ``reads`` times, as that many socket reads."""

    def run() -> None:
        for _ in range(reads):
            receive(data)

    return run


def confirmed(conn: ClientConnection, amqp: AmqpConnection, data: bytes, reads: int) -> Callable[[], None]:
    """Like ``feeder``, each read of SENDs with receipts followed by the broker's confirm of them."""
    session = conn.session
    assert session is not None

    def run() -> None:
        for _ in range(reads):
            conn.data_received(data)
            confirm = session.publish_seq.to_bytes(8, "big") + wire.bits(True)
            amqp.socket.data_received(wire.method_frame(1, wire.BASIC_ACK, confirm))

    return run


def timed(action: Callable[[], None], messages: int, repeat: int) -> float:
    """Best of ``repeat`` runs of ``action`` (which handles ``messages`` messages), in µs/message."""
    action()  # warm-up: caches filled, set-up garbage collected
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        action()
        best = min(best, time.perf_counter() - start)
    return best / messages * 1e6


async def measure(
    amqp_url: str, messages: int, repeat: int, metrics_destinations: int = 0
) -> dict[str, float]:
    server = build_server(
        Settings(amqp_url=amqp_url, listeners=(), metrics_destinations=metrics_destinations)
    )
    client = Recorder()
    conn = ClientConnection(server.context)
    conn.connection_made(client)  # type: ignore[arg-type]
    queue = f"bench-micro-{os.getpid()}"
    conn.data_received(b"CONNECT\naccept-version:1.2\nhost:/\nlogin:guest\npasscode:guest\n\n\0")
    await wait_for(client, b"CONNECTED")
    conn.data_received(
        f"SUBSCRIBE\ndestination:/queue/{queue}\nid:0\nack:auto\nx-queue-name:{queue}\n"
        f"auto-delete:true\nreceipt:s0\n\n\0".encode()
    )
    conn.data_received(
        f"SUBSCRIBE\ndestination:/queue/{queue}-ack\nid:1\nack:client-individual\nauto-delete:true\n"
        f"receipt:s1\n\n\0".encode()
    )
    # one real request: declares the temp queue and consumes from it
    conn.data_received(
        f"SEND\ndestination:/queue/{queue}\nreply-to:/temp-queue/micro\nreceipt:r0\n\n\0".encode()
    )
    await wait_for(client, b"receipt-id:r0")
    await asyncio.sleep(0.2)  # that request's delivery arrives on the real socket, then we swap
    amqp = conn._amqp  # noqa: SLF001 - a harness, on purpose
    assert isinstance(amqp, AmqpConnection)
    real_amqp_transport = amqp.socket.transport
    temp_queue = conn.session.parts.targets.temp_queues["micro"]  # type: ignore[union-attr]  # noqa: SLF001
    amqp_sink = CountingSink()
    amqp.socket.transport = amqp_sink  # type: ignore[assignment]
    client_sink = CountingSink()
    conn.transport = client_sink  # type: ignore[assignment]

    send = f"SEND\ndestination:/queue/{queue}\ncontent-length:1024\n\n".encode() + BODY + b"\0"
    request = (
        f"SEND\ndestination:/queue/{queue}\nreply-to:/temp-queue/micro\ncorrelation-id:12345\n"
        f"content-length:1024\n\n".encode()
        + BODY
        + b"\0"
    )
    plain = deliver_frames("T_0", 1, queue, MessageProperties())
    with_reply = deliver_frames(
        "T_/temp-queue/micro",
        1,
        temp_queue,
        MessageProperties(correlation_id="12345", reply_to=temp_queue),
    )
    receipted = [
        f"SEND\ndestination:/queue/{queue}\nreceipt:m{n}\ncontent-length:1024\n\n".encode() + BODY + b"\0"
        for n in range(64)
    ]
    ack = b"ACK\nid:T_1@@%s@@1\n\n\0" % conn.session.session_id.encode()  # type: ignore[union-attr]
    ack_delivery = deliver_frames("T_1", 1, queue + "-ack", MessageProperties())

    results: dict[str, float] = {}
    for batch in (1, 64):
        reads = max(1, messages // batch)
        total = reads * batch
        cases = (
            ("send", conn.data_received, send),
            ("deliver", amqp.socket.data_received, plain),
            ("ack", conn.data_received, ack),
            ("request", conn.data_received, request),
            ("reply", amqp.socket.data_received, with_reply),
        )
        for name, receive, chunk in cases:
            results[f"{name} x{batch}"] = timed(feeder(receive, chunk * batch, reads), total, repeat)
        receipts = confirmed(conn, amqp, b"".join(receipted[:batch]), reads)
        results[f"receipt x{batch}"] = timed(receipts, total, repeat)
        # the client-individual consumer's deliveries, so the ACKs above stay valid
        amqp.socket.data_received(ack_delivery)

    # put the real sockets back and say goodbye properly, so the queues go away
    amqp.socket.transport = real_amqp_transport
    conn.transport = client
    conn.data_received(b"DISCONNECT\nreceipt:bye\n\n\0")
    await wait_for(client, b"receipt-id:bye")
    conn.connection_lost(None)
    await asyncio.wait_for(conn.done, 10)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.micro", description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20000, help="messages per timing (default 20000)")
    parser.add_argument("--repeat", type=int, default=5, help="timings per case; the best is kept (5)")
    parser.add_argument(
        "--metrics-destinations",
        type=int,
        default=0,
        help="per-destination series for up to N destinations (default 0: off)",
    )
    parser.add_argument(
        "--amqp-url", default=os.environ.get("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
    )
    args = parser.parse_args(argv)
    try:
        import uvloop

        runner: Callable[..., dict[str, float]] = uvloop.run
    except ImportError:  # pragma: no cover
        runner = asyncio.run
    results = runner(measure(args.amqp_url, args.messages, args.repeat, args.metrics_destinations))
    print(f"{'case':<14} {'µs/message':>10}")
    for name, value in results.items():
        print(f"{name:<14} {value:>10.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
