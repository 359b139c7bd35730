"""The passive frame scanner (adapter/stomp/scanner.py) finds frames exactly where the codec's
``FrameParser`` does, and refuses exactly what it refuses, however the stream is cut into reads."""

from __future__ import annotations

import random

import pytest

from adapter.stomp.codec import FrameError, FrameLimits, FrameParser
from adapter.stomp.scanner import OTHER, PLAIN, SAFE, FrameScanner, header_pairs, split_head

LIMITS = FrameLimits(max_frame_size=4096, max_headers=8, max_header_length=256)


def random_frame(rng: random.Random) -> bytes:
    eol = b"\r\n" if rng.random() < 0.3 else b"\n"
    command = rng.choice([b"SEND", b"MESSAGE", b"SUBSCRIBE", b"CONNECT", b"ACK"])
    lines = [command]
    for n in range(rng.randrange(0, 6)):
        name = rng.choice([b"destination", b"id", b"x-h", b"selector", b"passcode", b"x\xff"])
        values = [b"/queue/a", b"a\\cb", b"1", b"", b"caf\xc3\xa9", b"x = 'a\\nb'", str(n).encode()]
        value = rng.choice(values)
        lines.append(name + b":" + value)
    body = bytes(rng.choice(b"ab\n\r:") for _ in range(rng.randrange(0, 40)))
    if rng.random() < 0.5 or b"\0" in body:
        body += b"\0" * rng.randrange(0, 2)
        lines.insert(rng.randrange(1, len(lines) + 1), b"content-length:" + str(len(body)).encode())
        if rng.random() < 0.2:  # a repeat: the first one counts
            lines.append(b"content-length:999")
    head = eol.join(lines) + eol + eol
    between = rng.choice([b"", b"\n", b"\r\n", b"\n\n\n", b"\0", b"\r\n\n"])
    return head + body + b"\0" + between


def codec_frames(stream: bytes) -> list[tuple[str, int, bytes]]:
    parser = FrameParser(LIMITS)
    parser.feed(stream)
    found = []
    while (frame := parser.next_frame()) is not None:
        found.append((frame.command, len(frame.body), frame.body))
    return found


def scanned(stream: bytes, cuts: list[int], *, bodies: bool = True) -> tuple[list, FrameScanner]:
    scanner = FrameScanner(LIMITS, bodies=bodies)
    found: list = []
    start = 0
    for cut in [*cuts, len(stream)]:
        scanner.feed(stream[start:cut], found)
        start = cut
    return found, scanner


@pytest.mark.parametrize("seed", range(40))
def test_frames_are_found_where_the_codec_finds_them_whatever_the_reads(seed):
    rng = random.Random(seed)
    stream = b"".join(random_frame(rng) for _ in range(rng.randrange(1, 12)))
    expected = codec_frames(stream)
    cuts = sorted(rng.sample(range(1, len(stream)), min(len(stream) - 1, rng.randrange(0, 30))))
    for cutting in ([], cuts, list(range(1, len(stream)))):  # whole, random reads, byte by byte
        found, scanner = scanned(stream, cutting)
        assert [(split_head(head)[0], body_len, body) for head, body_len, body, _ in found] == expected
        assert scanner.held == 0
        without, _ = scanned(stream, cutting, bodies=False)
        assert [(split_head(head)[0], n) for head, n, _, _ in without] == [(c, n) for c, n, _ in expected]
        assert all(body is None for _, _, body, _ in without)


def test_header_lines_are_kept_as_on_the_wire():
    stream = b"SEND\r\nid:1\r\ndestination:/topic/a\\cb\r\nid:2\r\nx:\xff\r\n\r\nbody\0"
    found, _ = scanned(stream, [7])
    ((head, body_len, _, end),) = found
    command, headers = split_head(head)
    assert command == "SEND" and body_len == 4 and head == stream[: stream.index(b"\n\r\n")]
    assert end == len(stream) - 7  # just past the NUL, in the bytes of the feed that completed it
    assert headers == ["id:1", "destination:/topic/a\\cb", "id:2", "x:\udcff"]
    assert header_pairs(headers) == [
        ["id", "1"],
        ["destination", "/topic/a\\cb"],
        ["id", "2"],
        ["x", "\udcff"],
    ]
    assert header_pairs([]) == []


def test_heartbeats_are_the_eols_between_frames_but_the_one_ending_a_frame():
    scanner = FrameScanner(LIMITS)
    found: list = []
    for piece in (b"\n", b"\r\n", b"SEND\n\n\0", b"\r", b"\n", b"\n\0\n", b"ACK\n\n\0\n\n"):
        scanner.feed(piece, found)
    assert len(found) == 2 and scanner.heartbeats == 1 + 1 + 2 + 1


BROKEN = [
    b"SEND\ncontent-length:2\n\nabc\0",  # body longer than its content-length
    b"SEND\ncontent-length:x\n\n\0",
    b"SEND\ncontent-length:" + b"9" * 40 + b"\n\n\0",
    b"SEND\nno colon here\n\n\0",
    b"SEND\nid:a\rb\n\n\0",  # a CR not followed by LF
    b"SE\rND\n\n\0",
    b"\rSEND\n\n\0",  # a bare CR between frames
    b"SEND\n" + b"".join(b"h%d:x\n" % n for n in range(9)) + b"\n\0",  # too many headers
    b"SEND\nx:" + b"y" * 300 + b"\n\n\0",  # a header line too long
    b"SEND\n\n" + b"z" * 5000 + b"\0",  # too big, no content-length
    b"SEND\ncontent-length:5000\n\n",  # too big, by its content-length
    b"SEND\nx:" + b"y" * 250 + (b"\nx:" + b"y" * 250) * 20,  # headers too big, never ending
]


@pytest.mark.parametrize("stream", BROKEN, ids=range(len(BROKEN)))
def test_what_the_codec_refuses_is_refused_with_the_same_error(stream):
    with pytest.raises(FrameError) as codec_error:
        codec_frames(stream)
    for cuts in ([], list(range(1, len(stream)))):
        with pytest.raises(FrameError) as scanner_error:
            scanned(b"ACK\n\n\0" + stream, [6 + cut for cut in cuts])
        assert (scanner_error.value.message, scanner_error.value.detail) == (
            codec_error.value.message,
            codec_error.value.detail,
        )


@pytest.mark.parametrize(
    ("stream", "plain"),
    [
        (b"SEND\ndestination:/queue/a\ncontent-length:2\n\nab\0\nACK\n\n\0", PLAIN),
        (b"MESSAGE\nmessage-id:ID:host-1:2:3\n\n\0", SAFE),  # ':' in a value
        (b"SEND\r\nid:1\r\n\r\n\0", OTHER),  # CR LF line ends
        (b'SEND\nx:"q"\n\n\0', OTHER),  # JSON would escape it
        (b"SEND\nx:caf\xc3\xa9\n\n\0", OTHER),
        (b"SEND\nx:a\tb\n\n\0", OTHER),
        (b"\n\n", PLAIN),  # no frame
    ],
)
def test_feed_says_how_plain_the_heads_it_found_are(stream, plain):
    assert FrameScanner(LIMITS).feed(stream, []) == plain


HEAD_ERRORS = [
    b"SEND\nno colon here\nid:1\n\n\0",
    b"SEND\nid:a\rb\n\n\0",
    b"SEND\n" + b"".join(b"h%d:x\n" % n for n in range(9)) + b"\n\0",
    b"SEND\nx:" + b"y" * 300 + b"\n\n\0",
    b"SEND\ncontent-length: x\n\n\0",
]


@pytest.mark.parametrize("broken", HEAD_ERRORS, ids=range(len(HEAD_ERRORS)))
def test_a_bad_head_ends_the_frames_there_even_with_good_ones_after_it_in_the_same_read(broken):
    """Heads are checked once per feed, all together: a bad one still ends the frames where the
    codec stops, with the codec's error."""
    good = b"ACK\nid:1\n\n\0\n"
    with pytest.raises(FrameError) as codec_error:
        codec_frames(good + broken + good * 3)
    found: list = []
    with pytest.raises(FrameError) as scanner_error:
        FrameScanner(LIMITS).feed(good + broken + good * 3, found)
    assert len(found) == 1
    assert (scanner_error.value.message, scanner_error.value.detail) == (
        codec_error.value.message,
        codec_error.value.detail,
    )


SECRET_LINES = [
    b"CONNECT\nlogin:u\npasscode:sec\rret\n\n\0",  # a bare CR in the passcode line
    b"STOMP\npasscode:sec\rret\nlogin:u\n\n\0",
    b"CONNECT\nlogin:u\npasscode secret\n\n\0",  # no colon
    b"CONNECT\rlogin:u\rpasscode:secret\r\n\n\0",  # CRs as line ends: one long command line
    b"STOMP\r\npasscode:s\re\rcret\r\n\r\n\0",
    b"connect\nlogin:u\npasscode:sec\rret\n\n\0",  # not a command the codec knows, all the same
    b"\xef\xbb\xbfCONNECT\nlogin:u\npasscode secret\n\n\0",  # a BOM first
    b"\tCONNECT\nlogin:u\npasscode secret\n\n\0",
    b"SEND\npasscode secret\n\n\0",  # a line that names a passcode, in any frame
]


@pytest.mark.parametrize("stream", SECRET_LINES)
def test_the_error_for_a_broken_connect_quotes_none_of_its_lines(stream: bytes) -> None:
    """A CONNECT's lines may hold its passcode: the ERROR that answers a broken one names what
    is wrong but quotes no line (the client may be a tap recording it, or a log), on the
    codec's path and on the scanner's."""
    with pytest.raises(FrameError) as codec_error:
        codec_frames(stream)
    for cuts in ([], list(range(1, len(stream)))):
        with pytest.raises(FrameError) as scanner_error:
            scanned(b"ACK\n\n\0" + stream, [6 + cut for cut in cuts])
        for error in (codec_error.value, scanner_error.value):
            assert "sec" not in error.detail and "ret" not in error.detail, error.detail
            assert "login" not in error.detail, error.detail


def test_the_error_for_a_broken_send_still_quotes_the_line() -> None:
    with pytest.raises(FrameError) as error:
        codec_frames(b"SEND\nno colon here\n\n\0")
    assert "no colon here" in error.value.detail
