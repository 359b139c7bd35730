"""Large bodies end to end while the other side reads slowly (issue #36, item 4).

The adapter hands large bodies to its transports without copying them (adapter/stomp/output.py,
adapter/amqp/channel.py), and a transport keeps a reference to whatever it could not send yet
(uvloop keeps the very objects, asyncio copies the rest).  Were any of those objects a view of a
buffer the adapter reuses, a peer that reads slowly would get bytes overwritten by later reads.
So: a client that reads late and slowly through a tiny receive buffer gets many large MESSAGEs
(64 KiB and 1 MiB, random bytes, NULs included) while the broker side reads the SENDs slowly
(a relay in front of RabbitMQ that drains the adapter's AMQP socket in small sips); every byte
is compared end to end, on asyncio's loop and on uvloop's, and a bystander client is served
meanwhile.  No timing assertion: only "everything arrives, unchanged, and the bystander is
served" (the waits are generous bounds, not measurements).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import threading
import time
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit

import pytest
import uvloop

from tests.support import AdapterProcess, RawSession, TcpRelay, unique

pytestmark = pytest.mark.integration

SIZES = [64 * 1024] * 12 + [1 << 20] * 4
random.Random(7).shuffle(SIZES)


def body_of(number: int, size: int) -> bytes:
    return random.Random(number).randbytes(size)


@pytest.fixture
def slow_broker(amqp_url: str) -> Iterator[str]:
    """The broker's URL through a relay that reads what the adapter sends it in small sips through
    a small receive buffer (the adapter's AMQP transport keeps what it could not send)."""
    parts = urlsplit(amqp_url)
    relay = TcpRelay(
        parts.hostname or "127.0.0.1", parts.port or 5672, sip=8192, pause=0.002, receive_buffer=4096
    )
    relay.start()
    credentials = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
    yield f"{parts.scheme}://{credentials}127.0.0.1:{relay.port}{parts.path}"
    relay.stop()


class FrameReader:
    """Frames from a blocking socket, bodies by their content-length (they hold NULs)."""

    def __init__(self, sock: socket.socket, sip: int = 65536, pause: float = 0.0) -> None:
        self.sock = sock
        self.sip = sip
        self.pause = pause
        self.data = bytearray()

    def _more(self) -> None:
        chunk = self.sock.recv(self.sip)
        if not chunk:
            raise AssertionError("the adapter closed the connection")
        self.data += chunk
        if self.pause:
            time.sleep(self.pause)

    def frame(self) -> tuple[str, dict[str, str], bytes]:
        while True:
            start = len(self.data) - len(self.data.lstrip(b"\r\n"))
            head_end = self.data.find(b"\n\n", start)
            if head_end >= 0:
                break
            self._more()
        del self.data[:start]
        head_end -= start
        lines = bytes(self.data[:head_end]).decode().split("\n")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers.setdefault(name, value)
        if "content-length" in headers:
            end = head_end + 2 + int(headers["content-length"])
            while len(self.data) <= end:
                self._more()
        else:
            while (end := self.data.find(b"\0", head_end + 2)) < 0:
                self._more()
        assert self.data[end] == 0, "no NUL after the body"
        body = bytes(self.data[head_end + 2 : end])
        del self.data[: end + 1]
        return lines[0], headers, body


def connect(port: int, receive_buffer: int | None = None) -> tuple[socket.socket, FrameReader]:
    sock = socket.socket()
    if receive_buffer is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.settimeout(60)
    sock.connect(("127.0.0.1", port))
    sock.sendall(b"CONNECT\naccept-version:1.2\nhost:/\nlogin:guest\npasscode:guest\n\n\0")
    reader = FrameReader(sock)
    command, _, body = reader.frame()
    assert command == "CONNECTED", body
    return sock, reader


LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.new_event_loop,
    "uvloop": uvloop.new_event_loop,
}


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_large_bodies_reach_a_slow_reader_unchanged_past_a_slow_broker(
    loop: str, slow_broker: str, start_adapter: Callable[..., AdapterProcess]
) -> None:
    adapter = start_adapter(amqp_url=slow_broker, event_loop=LOOPS[loop])
    queue = unique("large")
    # the slow reader: a tiny receive buffer, and it reads late (the producer is done first)
    consumer, inbox = connect(adapter.port, receive_buffer=4096)
    consumer.sendall(f"SUBSCRIBE\nid:0\ndestination:/queue/{queue}\nreceipt:sub\n\n\0".encode())
    assert inbox.frame()[0] == "RECEIPT"
    producer, answers = connect(adapter.port)
    receipt: list[tuple[str, dict[str, str], bytes]] = []

    def produce() -> None:
        for number, size in enumerate(SIZES):
            last = number == len(SIZES) - 1
            head = (
                f"SEND\ndestination:/queue/{queue}\nn:{number}\n"
                + ("receipt:done\n" if last else "")
                + f"content-length:{size}\n\n"
            )
            producer.sendall(head.encode() + body_of(number, size) + b"\0")
        receipt.append(answers.frame())

    sending = threading.Thread(target=produce, name="producer")
    sending.start()
    try:
        # the bystander is served while the bodies crawl through the relay
        bystander = RawSession(adapter.port)
        bystander.round_trip(unique("bystander"))
        sending.join(45)
        assert not sending.is_alive(), "the SENDs were not all taken"
        assert receipt and receipt[0][0] == "RECEIPT", receipt
        # now the slow reader reads, in small sips; the bystander is served meanwhile
        inbox.sip, inbox.pause = 4096, 0.0005
        got: list[tuple[str, dict[str, str], bytes]] = []
        reading = threading.Thread(target=lambda: got.extend(inbox.frame() for _ in SIZES), name="consumer")
        reading.start()
        bystander.round_trip(unique("bystander"))
        reading.join(45)
        assert not reading.is_alive(), f"{len(got)} of {len(SIZES)} MESSAGEs came"
    finally:
        sending.join(5)
        with contextlib.suppress(OSError):
            producer.close()
    for number, (command, headers, body) in enumerate(got):
        assert command == "MESSAGE" and headers["n"] == str(number), (command, headers)
        assert body == body_of(number, SIZES[number]), f"MESSAGE {number} ({SIZES[number]} bytes) changed"
    consumer.close()
