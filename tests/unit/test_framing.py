"""The sans-IO AMQP frame reader (adapter/amqp/framing.py), fed the way h11's parsers are tested:
whole, one byte at a time, at random splits and with a trailing partial frame; frames made by
pamqp (an independent implementation) so the reader is checked against it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import body, commands, frame, header, heartbeat

from adapter.amqp import wire
from adapter.amqp.framing import BODY_VIEW_MIN, FrameReader
from tests.support import FrameCallbacks


class Recorder:
    def __init__(self, frame_max: int = 131072) -> None:
        self.events: list[tuple[str, int | None, bytes]] = []
        self.reader = FrameReader(FrameCallbacks(self.method, self.header, self.body), frame_max)

    def method(self, channel: int, payload: bytes) -> None:
        self.events.append(("method", channel, bytes(payload)))

    def header(self, payload: bytes) -> None:
        self.events.append(("header", None, bytes(payload)))

    def body(self, payload: bytes | memoryview) -> None:
        self.events.append(("body", None, bytes(payload)))


def stream() -> tuple[bytes, list[tuple[str, int | None, bytes]]]:
    """A delivery (method, content header, two body frames), a heart-beat and a close, as pamqp
    marshals them, and the events they must produce."""
    parts = [
        frame.marshal(commands.Basic.Deliver("ctag", 7, False, "ex", "rk"), 1),
        frame.marshal(header.ContentHeader(0, 5, commands.Basic.Properties(content_type="t/p")), 1),
        frame.marshal(body.ContentBody(b"ab"), 1),
        frame.marshal(body.ContentBody(b"cde"), 1),
        frame.marshal(heartbeat.Heartbeat(), 0),
        frame.marshal(commands.Channel.Close(404, "NOT_FOUND", 50, 10), 3),
    ]
    expected = [
        ("method", 1, parts[0][7:-1]),
        ("header", None, parts[1][7:-1]),
        ("body", None, b"ab"),
        ("body", None, b"cde"),
        ("method", 3, parts[5][7:-1]),
    ]
    return b"".join(parts), expected


def test_whole_stream():
    data, expected = stream()
    recorder = Recorder()
    recorder.reader.feed(data)
    assert recorder.events == expected
    assert recorder.reader.buffered == 0


def test_one_byte_at_a_time():
    data, expected = stream()
    recorder = Recorder()
    for i in range(len(data)):
        recorder.reader.feed(data[i : i + 1])
    assert recorder.events == expected


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_any_split(draw):
    data, expected = stream()
    cuts = sorted(draw.draw(st.sets(st.integers(1, len(data) - 1), max_size=10)))
    recorder = Recorder()
    start = 0
    for cut in [*cuts, len(data)]:
        recorder.reader.feed(data[start:cut])
        start = cut
    assert recorder.events == expected


def test_trailing_partial_frame_is_kept_for_the_next_read():
    data, expected = stream()
    recorder = Recorder()
    recorder.reader.feed(data + data[:10])
    assert recorder.events == expected
    assert recorder.reader.buffered == 10
    recorder.reader.feed(data[10:])
    assert recorder.events == expected + expected


def test_large_bodies_are_views_and_decode_the_same():
    payload = bytes(range(256)) * (BODY_VIEW_MIN // 256 + 1)
    seen: list[object] = []
    reader = FrameReader(FrameCallbacks(lambda c, p: None, lambda p: None, seen.append))
    reader.feed(frame.marshal(body.ContentBody(payload), 1))
    assert isinstance(seen[0], memoryview) and bytes(seen[0]) == payload


def test_a_large_frame_in_many_reads_is_held_as_they_came_and_handed_on_in_pieces_of_them():
    payload = bytes(range(256)) * 256  # 64 KiB
    data = frame.marshal(body.ContentBody(payload), 1) + frame.marshal(heartbeat.Heartbeat(), 0)
    seen: list[bytes] = []
    reader = FrameReader(FrameCallbacks(lambda c, p: None, lambda p: None, lambda p: seen.append(bytes(p))))
    reads = [data[i : i + 1000] for i in range(0, len(data), 1000)]
    for n, chunk in enumerate(reads[:-1]):
        reader.feed(chunk)
        assert seen == [] and reader.buffered == sum(map(len, reads[: n + 1]))
        assert len(reader._partial) == len(reads[0])  # later reads are kept aside, not joined yet
    reader.feed(reads[-1])
    # once the frame is whole (its frame end checked), one piece per read, never joined here
    assert b"".join(seen) == payload and len(seen) == len(reads) and reader.buffered == 0


def test_an_oversized_frame_whose_head_comes_in_pieces_is_refused_before_it_is_held():
    recorder = Recorder(frame_max=4096)
    head = b"\x03\x00\x01\x7f\xff\xff\xff"  # a body frame of 2 GiB
    recorder.reader.feed(head)  # 7 bytes: the size is there, one byte short of the check
    with pytest.raises(wire.DecodeError, match="exceeds frame_max"):
        recorder.reader.feed(b"x" * 100)
    assert recorder.reader.buffered == 0


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\x01\x00\x01\x00\x00\x00\x01X\xcd", "frame-end octet"),
        (b"\x01\x00\x01\x00\x02\x00\x01\x00", "exceeds frame_max"),
        (b"\x05\x00\x01\x00\x00\x00\x00\xce", "unknown frame type"),
    ],
)
def test_broken_frames_raise_decode_error_and_drop_what_is_held(data, message):
    recorder = Recorder(frame_max=4096)
    with pytest.raises(wire.DecodeError, match=message):
        recorder.reader.feed(data)
    assert recorder.reader.buffered == 0
    assert recorder.events == []


def test_stop_ends_the_stream():
    data, expected = stream()
    recorder = Recorder()
    recorder.reader.feed(data[:20])
    recorder.reader.stop()
    recorder.reader.feed(data[20:])
    assert recorder.events == [] and recorder.reader.buffered == 0


def test_a_callback_that_stops_the_reader_ends_the_loop():
    data, _ = stream()
    events: list[int] = []
    holder: list[FrameReader] = []

    def on_method(channel: int, payload: bytes) -> None:
        events.append(channel)
        holder[0].stop()

    holder.append(FrameReader(FrameCallbacks(on_method, lambda p: None, lambda p: None)))
    holder[0].feed(data)
    assert events == [1]
