"""Fuzzing from the AMQP side: messages published by an independent AMQP client with arbitrary
header tables (every field type, nested tables and arrays, keys and strings that are not UTF-8,
very large tables) and property strings that are not UTF-8 reach STOMP consumers, which stay
connected; nothing is lost and nothing is logged at ERROR level.

The publisher speaks AMQP over a raw socket: method frames come from pamqp, and the content
header is built here byte by byte, because no client library will encode a table key that is not
UTF-8, while RabbitMQ accepts it (and so can any AMQP client in another language).  The STOMP
consumers are raw sockets too, since stomp.py itself cannot read such headers.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import struct
import time
from urllib.parse import urlsplit

import pytest
from pamqp import commands, frame

from tests.support import unique

SEED = int(os.environ.get("AMQP_FUZZ_SEED", str(int(time.time()) % 100_000)))
MESSAGES = int(os.environ.get("AMQP_FUZZ_MESSAGES", "1000"))
CONNECT = b"CONNECT\naccept-version:1.2\nhost:/\nlogin:guest\npasscode:guest\n\n\0"


# ------------------------------------------------------------------------------ field tables
def shortstr(raw: bytes) -> bytes:
    return bytes((len(raw),)) + raw


def longstr(raw: bytes) -> bytes:
    return struct.pack(">I", len(raw)) + raw


def text(rng: random.Random, max_len: int = 12) -> bytes:
    """Bytes for a key or string: often UTF-8, often not (lone bytes, CESU-8 surrogates, NUL)."""
    pieces = [b"k", b"\xff", b"\xed\xa0\x80", b"\xc3(", b"\x00", b"\n", b":", b"\\", "é".encode(), b"x"]
    raw = b"".join(rng.choice(pieces) for _ in range(rng.randrange(1, max_len)))
    return raw[:255]


def value(rng: random.Random, depth: int) -> bytes:
    kinds = "tbBsuIilfdDSTVx" + ("FA" if depth < 4 else "")
    kind = rng.choice(kinds)
    if kind == "t":
        return b"t" + bytes((rng.randrange(2),))
    if kind in "bB":
        return kind.encode() + bytes((rng.randrange(256),))
    if kind in "su":
        return kind.encode() + rng.randbytes(2)
    if kind in "Ii":
        return kind.encode() + rng.randbytes(4)
    if kind == "f":  # RabbitMQ refuses NaN and infinite floats (Erlang cannot hold them)
        return b"f" + struct.pack(">f", rng.uniform(-1e9, 1e9))
    if kind in "ld":
        raw = rng.randbytes(8)
        if kind == "d":
            raw = struct.pack(">d", rng.uniform(-1e9, 1e9))
        return kind.encode() + raw
    if kind == "T":
        return b"T" + struct.pack(">Q", rng.choice([0, 1_700_000_000, 2**63, 2**64 - 1]))
    if kind == "D":
        return b"D" + bytes((rng.randrange(10),)) + rng.randbytes(4)
    if kind == "S":
        return b"S" + longstr(text(rng, 40))
    if kind == "x":
        return b"x" + longstr(rng.randbytes(rng.randrange(20)))
    if kind == "V":
        return b"V"
    if kind == "F":
        return b"F" + table(rng, depth + 1)
    items = b"".join(value(rng, depth + 1) for _ in range(rng.randrange(4)))
    return b"A" + longstr(items)


def table(rng: random.Random, depth: int = 0, entries: int | None = None) -> bytes:
    count = rng.randrange(6) if entries is None else entries
    body = b"".join(shortstr(text(rng)) + value(rng, depth) for _ in range(count))
    return longstr(body)


def content_header(body_size: int, header_table: bytes, strings: dict[int, bytes]) -> bytes:
    """class 60, weight 0, body size, property flags, then the properties in AMQP order."""
    flags = 0x2000 | 0x1000  # headers, delivery-mode
    props = b""
    for flag in (0x8000, 0x4000):  # content-type, content-encoding
        if flag in strings:
            flags |= flag
            props += shortstr(strings[flag])
    props += header_table + b"\x02"  # headers table, persistent
    for flag in (0x0400, 0x0080, 0x0020, 0x0008):  # correlation-id, message-id, type, app-id
        if flag in strings:
            flags |= flag
            props += shortstr(strings[flag])
    return struct.pack(">HHQH", 60, 0, body_size, flags) + props


# ------------------------------------------------------------------------------ a raw AMQP publisher
class RawPublisher:
    def __init__(self, amqp_url: str) -> None:
        parts = urlsplit(amqp_url)
        self.sock = socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 5672), timeout=10)
        self.buffer = b""
        self.sock.sendall(b"AMQP\x00\x00\x09\x01")
        self.expect(commands.Connection.Start)
        user, password = parts.username or "guest", parts.password or "guest"
        self.send(0, commands.Connection.StartOk(response=f"\0{user}\0{password}", mechanism="PLAIN"))
        tune = self.expect(commands.Connection.Tune)
        self.send(0, commands.Connection.TuneOk(tune.channel_max, tune.frame_max, 0))
        self.send(0, commands.Connection.Open("/"))
        self.expect(commands.Connection.OpenOk)
        self.send(1, commands.Channel.Open())
        self.expect(commands.Channel.OpenOk)
        self.send(1, commands.Confirm.Select())
        self.expect(commands.Confirm.SelectOk)
        self.published = 0

    def send(self, channel: int, method: object) -> None:
        self.sock.sendall(frame.marshal(method, channel))  # type: ignore[arg-type]

    def expect(self, kind: type) -> object:
        while True:
            while True:
                if len(self.buffer) >= 7:
                    size = struct.unpack(">I", self.buffer[3:7])[0]
                    if len(self.buffer) >= size + 8:
                        break
                chunk = self.sock.recv(65536)
                assert chunk, "broker closed the connection"
                self.buffer += chunk
            consumed, _, value_ = frame.unmarshal(self.buffer)
            self.buffer = self.buffer[consumed:]
            if isinstance(value_, commands.Connection.Close | commands.Channel.Close):
                raise AssertionError(f"broker closed: {value_.reply_code} {value_.reply_text}")
            if isinstance(value_, kind):
                return value_

    def publish(self, queue: str, header: bytes, body: bytes) -> None:
        """Publish and wait for the broker's confirm (so the broker accepted it)."""
        out = frame.marshal(commands.Basic.Publish(exchange="", routing_key=queue), 1)
        out += struct.pack(">BHI", 2, 1, len(header)) + header + b"\xce"
        out += struct.pack(">BHI", 3, 1, len(body)) + body + b"\xce"
        self.sock.sendall(out)
        self.expect(commands.Basic.Ack)
        self.published += 1

    def close(self) -> None:
        self.sock.close()


# ------------------------------------------------------------------------------ a raw STOMP consumer
class RawConsumer:
    def __init__(self, port: int, queue: str, ack: str) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.ack = ack
        self.buffer = b""
        self.sock.sendall(CONNECT)
        assert self.next_frame().startswith(b"CONNECTED")
        self.sock.sendall(f"SUBSCRIBE\ndestination:/queue/{queue}\nid:s\nack:{ack}\nreceipt:r\n\n\0".encode())
        assert self.next_frame().startswith(b"RECEIPT")

    def next_frame(self) -> bytes:
        while True:
            self.buffer = self.buffer.lstrip(b"\r\n")
            head_end = self.buffer.find(b"\n\n")
            if head_end >= 0:
                head = self.buffer[:head_end]
                length = None
                for line in head.split(b"\n")[1:]:
                    if line.startswith(b"content-length:"):
                        length = int(line[15:])
                end = head_end + 2 + length if length is not None else self.buffer.find(b"\0", head_end)
                if end >= 0 and len(self.buffer) > end:
                    assert self.buffer[end : end + 1] == b"\0"
                    result, self.buffer = self.buffer[:end], self.buffer[end + 1 :]
                    return result
            chunk = self.sock.recv(65536)
            assert chunk, f"the adapter closed the consumer; last bytes {self.buffer[-300:]!r}"
            self.buffer += chunk

    def message(self) -> tuple[list[bytes], bytes]:
        frame_ = self.next_frame()
        assert frame_.startswith(b"MESSAGE"), frame_[:300]
        head, _, body = frame_.partition(b"\n\n")
        lines = head.split(b"\n")[1:]
        if self.ack != "auto":
            ack_id = next(line[4:] for line in lines if line.startswith(b"ack:"))
            self.sock.sendall(b"ACK\nid:" + ack_id + b"\n\n\0")
        return lines, body

    def close(self) -> None:
        self.sock.sendall(b"DISCONNECT\nreceipt:bye\n\n\0")
        assert self.next_frame().startswith(b"RECEIPT")
        self.sock.close()


@pytest.mark.parametrize("ack", ["auto", "client-individual"])
def test_arbitrary_header_tables_reach_stomp_consumers(adapter, amqp_url, broker, caplog, ack):
    caplog.set_level(logging.WARNING)
    rng = random.Random(f"{SEED}-{ack}")
    queue = unique("amqp-fuzz")
    broker.declare_queue(queue, durable=True)
    consumer = RawConsumer(adapter.port, queue, ack)
    publisher = RawPublisher(amqp_url)
    try:
        for n in range(MESSAGES):
            entries = rng.choice([0, 1, 3, 8, 200 if n % 50 == 0 else 5])  # sometimes a very large table
            header_table = table(rng, entries=entries)
            strings = {
                flag: text(rng)
                for flag in (0x8000, 0x4000, 0x0400, 0x0080, 0x0020, 0x0008)
                if rng.random() < 0.3
            }
            body = b"m%d" % n
            publisher.publish(queue, content_header(len(body), header_table, strings), body)
            lines, received = consumer.message()
            assert received == body, f"seed {SEED}: got {received!r} for {body!r}"
            names = {line.split(b":", 1)[0] for line in lines}
            assert entries == 0 or len(names) >= 4, f"seed {SEED}: headers dropped: {lines!r}"
        consumer.close()
    finally:
        publisher.close()
    bad = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert not bad, f"seed {SEED}: {[r.getMessage() for r in bad][:3]}"
    assert broker.idle_depth(queue) == 0  # each one delivered once, none left or requeued
