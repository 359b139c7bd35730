"""How often a large body is copied on its way through the adapter's pure cores (issue #36, item
4): at most once from the client's reads to the AMQP frames, and at most once from the broker's
reads to the MESSAGE handed to the client's transport.

Counted two ways, without a socket: by identity (the object that goes out is the very object
that came out of the one copy) and by tracemalloc's peak (the reads are allocated before it
starts, so a path that copies the body once allocates about one body; each copy more would be
one body more).  And the hostile side of keeping views instead of copies: input the caller may
overwrite later (a ``bytearray``, a ``memoryview``) is never kept as it is."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator

import pytest
from pamqp import body as amqp_body
from pamqp import commands, frame, header

from adapter.amqp import wire
from adapter.amqp.framing import FrameReader
from adapter.mapping.properties import MessageProperties
from adapter.stomp.codec import FrameParser
from adapter.stomp.frame import Frame
from adapter.stomp.output import MESSAGE_FRAMES, STREAM_FRAMES
from tests.support import FrameCallbacks, peak_allocated
from tests.unit.test_amqp_client import opened
from tests.unit.test_stomp_connection import CONNECT, LARGE, delivery, feed, make, subscribe

SIZES = [64 * 1024, 1 << 20]
SLACK = 48 * 1024  # heads, lists, frame objects: far less than one 64 KiB body


def body_of(size: int, seed: int = 0) -> bytes:
    """Random bytes, NULs included (a body with a content-length may hold them)."""
    return random.Random(seed).randbytes(size)


def in_reads(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


def send_frame(body: bytes, destination: str = "/queue/a") -> bytes:
    return f"SEND\ndestination:{destination}\ncontent-length:{len(body)}\n\n".encode() + body + b"\0"


# ---------------------------------------------------------------------------- client -> broker
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("read", [1 << 20, 65536, 4096], ids=lambda n: f"reads of {n}")
def test_the_parser_copies_a_large_body_once(size: int, read: int) -> None:
    body = body_of(size)
    reads = in_reads(send_frame(body) + send_frame(b"next"), read)
    parser = FrameParser()

    def parse() -> list[Frame]:
        frames = []
        for data in reads:
            parser.feed(data)
            while (got := parser.next_frame()) is not None:
                frames.append(got)
        return frames

    peak, frames = peak_allocated(parse)
    assert frames == [
        Frame("SEND", {"destination": "/queue/a", "content-length": str(size)}, body),
        Frame("SEND", {"destination": "/queue/a", "content-length": "4"}, b"next"),
    ]
    assert peak < size + SLACK, f"{peak} bytes allocated for a body of {size}: more than one copy"
    assert parser.buffered == 0 and parser.retained == 0


def test_a_body_trickled_byte_by_byte_costs_no_object_per_byte() -> None:
    # a hostile client: every byte of a large body in a read of its own; the parser's memory
    # stays within two bodies (small reads are appended to a tail piece, then joined once)
    size = 100_000
    body = body_of(size)
    reads = [bytes([byte]) for byte in send_frame(body)]
    parser = FrameParser()

    def parse() -> Frame | None:
        got = None
        for data in reads:
            parser.feed(data)
            got = parser.next_frame() or got
            if got is None:
                assert parser.buffered <= size + 100
        return got

    peak, got = peak_allocated(parse)
    assert got is not None and got.body == body  # type: ignore[attr-defined]
    assert peak < 2 * size + SLACK, f"{peak} bytes allocated for a body of {size} read byte by byte"


def test_a_body_still_coming_counts_the_reads_it_keeps_alive() -> None:
    body = body_of(100_000)
    first, second = b"SEND\ncontent-length:100000\n\n" + body[:30_000], body[30_000:] + b"\0"
    parser = FrameParser()
    parser.feed(b"SEND\n\nsmall\0" + first)
    assert parser.next_frame() == Frame("SEND", {}, b"small")
    assert parser.next_frame() is None
    # the read is kept whole (the body's first piece is a view of it): all of it counts
    assert parser.buffered == len(b"SEND\n\nsmall\0" + first)
    parser.feed(second)
    assert parser.next_frame() == Frame("SEND", {"content-length": "100000"}, body)
    assert parser.buffered == 0


def test_a_body_starting_late_in_a_read_does_not_keep_the_read_alive() -> None:
    """A read of many small frames (or heart-beats) that ends with the start of a large body:
    before, the body's first bytes were kept as a view of the read, keeping all of it alive
    (and counted) until the body was complete, over a WebSocket up to a turn's megabyte."""
    body = body_of(64 * 1024)
    small = send_frame(b"x" * 100) * 2000
    large = send_frame(body)
    head_end = large.index(b"\n\n") + 2
    first = small + large[: head_end + 1024]
    parser = FrameParser()
    parser.feed(first)
    for _ in range(2000):
        assert parser.next_frame() is not None
    assert parser.next_frame() is None
    assert parser.buffered <= 2 * 1024, f"{parser.buffered} bytes held for 1 KiB of a body"
    parser.feed(large[head_end + 1024 :])
    got = parser.next_frame()
    assert got is not None and got.body == body
    assert parser.buffered == 0


@pytest.mark.parametrize("body_bytes", [0, 1000])
@pytest.mark.parametrize("head_in_pieces", [False, True])
def test_a_large_frame_s_head_counts_while_its_body_is_collected(
    body_bytes: int, head_in_pieces: bool
) -> None:
    """The head of a frame whose large body is being collected is kept (parsed) until the body
    is complete: it must count in ``buffered``, or a client parks max_frame_size of headers
    per connection outside the incomplete-input budget, and with nothing counted (no body
    byte yet) the frame timeout never starts either."""
    head = b"SEND\ndestination:/queue/a\ncontent-length:20000\nx-pad:" + b"p" * 100_000 + b"\n\n"
    parser = FrameParser()
    if head_in_pieces:
        parser.feed(head[:50_000])
        assert parser.next_frame() is None
        parser.feed(head[50_000:] + b"b" * body_bytes)
    else:
        parser.feed(head + b"b" * body_bytes)
    assert parser.next_frame() is None
    assert parser.buffered >= len(head) + body_bytes
    parser.feed(b"b" * (20_000 - body_bytes) + b"\0")
    got = parser.next_frame()
    assert got is not None and got.body == b"b" * 20_000
    assert parser.buffered == 0


@pytest.mark.parametrize("kind", [bytearray, memoryview])
def test_input_the_caller_may_overwrite_is_copied_not_kept(kind: Callable[[bytes], object]) -> None:
    body = body_of(40_000)
    data = send_frame(body)
    parser = FrameParser()
    first, second = bytearray(data[:20_000]), bytearray(data[20_000:])
    parser.feed(kind(first))  # type: ignore[arg-type]
    assert parser.next_frame() is None
    first[:] = b"\xff" * len(first)  # the caller reuses its buffers
    parser.feed(kind(second))  # type: ignore[arg-type]
    second[:] = b"\xff" * len(second)
    got = parser.next_frame()
    assert got is not None and got.body == body


def test_a_body_longer_than_its_content_length_is_refused_after_collecting() -> None:
    parser = FrameParser()
    parser.feed(b"SEND\ncontent-length:20000\n\n" + b"x" * 10_000)
    assert parser.next_frame() is None
    parser.feed(b"x" * 10_001)
    with pytest.raises(Exception, match="longer than its content-length"):
        parser.next_frame()


@pytest.mark.parametrize("size", SIZES)
def test_a_send_reaches_the_amqp_frames_without_another_copy(size: int) -> None:
    """The SEND's body, once parsed, is what the channel hands to the socket: the very object
    (a frame_max larger than the body) or views of it, never a joined copy."""
    body = body_of(size)
    parser = FrameParser()
    for data in in_reads(send_frame(body), 65536):
        parser.feed(data)
    frame_ = parser.next_frame()
    assert frame_ is not None
    client = opened()  # frame_max 65536
    client.out.clear()
    client.channel_core.publish("", "a", MessageProperties(), frame_.body)
    views = [part for part in client.out if isinstance(part, memoryview)]
    assert all(view.obj is frame_.body for view in views)
    assert b"".join(bytes(view) for view in views) == body
    assert max(len(part) for part in client.out if isinstance(part, bytes)) < 1000  # heads only
    assert client.channel_core.out_large


# ---------------------------------------------------------------------------- broker -> client
def delivery_frames(body: bytes, frame_max: int = 65536) -> bytes:
    """basic.deliver, its content header and body frames of ``frame_max`` (as RabbitMQ sends)."""
    chunk = frame_max - 8
    parts = [
        frame.marshal(commands.Basic.Deliver("T_0", 1, False, "", "a"), 1),
        frame.marshal(header.ContentHeader(0, len(body), commands.Basic.Properties()), 1),
    ]
    for start in range(0, len(body), chunk):
        parts.append(frame.marshal(amqp_body.ContentBody(body[start : start + chunk]), 1))
    return b"".join(parts)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("read", [1 << 20, 65536, 5000], ids=lambda n: f"reads of {n}")
def test_a_delivery_is_assembled_with_one_copy(size: int, read: int) -> None:
    body = body_of(size, seed=1)
    reads = in_reads(delivery_frames(body), read)
    client = opened()

    def deliver() -> object:
        for data in reads:
            client.feed(data)
        return client.log[-1][1]

    peak, got = peak_allocated(deliver)
    assert got.body == body  # type: ignore[attr-defined]
    assert type(got.body) is bytes  # type: ignore[attr-defined]
    assert peak < size + SLACK, f"{peak} bytes allocated for a body of {size}: more than one copy"
    assert client.connection.reader.buffered == 0


def test_the_reader_hands_a_frame_spanning_reads_on_in_pieces_of_them() -> None:
    payload = body_of(40_000)
    data = frame.marshal(amqp_body.ContentBody(payload), 3)
    reads = in_reads(data + frame.marshal(commands.Basic.Ack(1), 3), 10_000)
    seen: list[bytes | memoryview] = []
    reader = FrameReader(
        FrameCallbacks(lambda channel, payload: seen.append(b"method"), lambda p: None, seen.append)
    )
    for chunk in reads:
        reader.feed(chunk)
    assert reader.channel == 3
    assert all(isinstance(piece, memoryview | bytes) for piece in seen[:-1]) and seen[-1] == b"method"
    assert b"".join(bytes(piece) for piece in seen[:-1]) == payload
    assert len(seen) - 1 == 5  # one piece per read the frame spans: nothing joined


def test_a_broken_frame_end_after_a_spanning_body_is_refused() -> None:
    data = bytearray(frame.marshal(amqp_body.ContentBody(b"x" * 30_000), 1))
    data[-1] = 0
    reader = FrameReader(FrameCallbacks(lambda c, p: None, lambda p: None, lambda p: None))
    reader.feed(bytes(data[:10_000]))
    with pytest.raises(wire.DecodeError, match="frame-end"):
        reader.feed(bytes(data[10_000:]))
    assert reader.buffered == 0


def test_the_reader_copies_reads_the_caller_may_overwrite() -> None:
    payload = body_of(40_000)
    data = bytearray(frame.marshal(amqp_body.ContentBody(payload), 1))
    seen: list[bytes] = []
    reader = FrameReader(FrameCallbacks(lambda c, p: None, lambda p: None, lambda p: seen.append(bytes(p))))
    first = data[:20_000]
    reader.feed(first)  # type: ignore[arg-type]
    first[:] = b"\xff" * len(first)
    reader.feed(data[20_000:])  # type: ignore[arg-type]
    assert b"".join(seen) == payload


def messages_of(out: list[bytes]) -> Iterator[bytes]:
    return iter(b"".join(out).split(b"\0")[:-1])


def test_a_large_message_goes_to_the_transport_as_the_delivery_s_own_body() -> None:
    stomp, _shell, broker = make(STREAM_FRAMES)  # a large body: LARGE bytes and more
    feed(stomp, CONNECT)
    subscribe(stomp, broker)
    stomp.output.take()
    body = body_of(LARGE).replace(b"\0", b"0")
    stomp.on_deliver(delivery(1, body))
    assert stomp.output.large and any(item is body for item in stomp.output.out)  # not copied into a frame
    (message,) = messages_of(stomp.output.out)
    assert message.startswith(b"MESSAGE\n") and message.endswith(b"\n\n" + body)


def test_a_large_message_over_websocket_is_one_item() -> None:
    stomp, _shell, broker = make(MESSAGE_FRAMES)
    feed(stomp, CONNECT)
    subscribe(stomp, broker)
    stomp.output.take()
    body = b"y" * LARGE
    stomp.on_deliver(delivery(1, body))
    (item,) = stomp.output.out
    assert item.startswith(b"MESSAGE\n") and item.endswith(b"\n\n" + body + b"\0\n")


def test_a_large_message_behind_a_receipt_is_held_whole() -> None:
    stomp, _shell, broker = make(STREAM_FRAMES)
    feed(stomp, CONNECT)
    subscribe(stomp, broker)
    feed(stomp, b"SUBSCRIBE\ndestination:/queue/b\nid:1\nreceipt:r\n\n\0")  # waits for the broker
    assert stomp.busy
    stomp.output.take()
    body = b"z" * LARGE
    stomp.on_deliver(delivery(1, body))
    assert stomp.output.out == [] and len(stomp.held) == 1 and stomp.held[0].endswith(body + b"\0\n")
