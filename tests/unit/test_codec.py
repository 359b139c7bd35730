"""Unit tests for the incremental STOMP frame codec (adapter/stomp/codec.py).

Every parser case is checked three ways, as h11 does: the whole buffer in one feed, one byte per
feed (pulling after each), and the whole buffer followed by the bytes of another frame (which must
come out untouched after the frames under test).
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterable, Sequence

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from adapter.stomp.codec import FrameError, FrameLimits, FrameParser, encode_frame, escape
from adapter.stomp.frame import Frame
from tests.support import peak_allocated

# --------------------------------------------------------------------------------------------
# helpers

NEXT_BYTES = b"MESSAGE\nk:v\n\ntail\0"
NEXT_FRAME = Frame("MESSAGE", {"k": "v"}, b"tail")


def make_parser(version: str | None = None, limits: FrameLimits | None = None) -> FrameParser:
    parser = FrameParser(limits)
    if version is not None:
        parser.set_version(version)
    return parser


def pull_all(parser: FrameParser, out: list[Frame], negotiate: str | None = None) -> None:
    """Pull frames until None; after a CONNECT/STOMP frame apply ``negotiate`` like a session."""
    while (frame := parser.next_frame()) is not None:
        out.append(frame)
        assert len(out) < 10_000, "parser is looping"
        if negotiate is not None and frame.command in ("CONNECT", "STOMP"):
            parser.set_version(negotiate)


def _feed_chunks(
    chunks: Iterable[bytes],
    version: str | None,
    limits: FrameLimits | None,
    negotiate: str | None,
    out: list[Frame],
) -> None:
    parser = make_parser(version, limits)
    for chunk in chunks:
        parser.feed(chunk)
        pull_all(parser, out, negotiate)


def _ways(data: bytes) -> list[tuple[str, list[bytes]]]:
    return [
        ("whole", [data]),
        ("bytewise", [data[i : i + 1] for i in range(len(data))]),
        ("trailing", [data + NEXT_BYTES]),
    ]


def parse3(
    data: bytes,
    version: str | None = None,
    limits: FrameLimits | None = None,
    negotiate: str | None = None,
) -> list[Frame]:
    """Parse ``data`` three ways; all must agree.  Returns the frames."""
    results: dict[str, list[Frame]] = {}
    for name, chunks in _ways(data):
        out: list[Frame] = []
        _feed_chunks(chunks, version, limits, negotiate, out)
        results[name] = out
    whole = results["whole"]
    assert results["bytewise"] == whole
    assert results["trailing"] == [*whole, NEXT_FRAME]
    # header order is part of the contract (first occurrence, arrival order)
    for a, b in zip(results["bytewise"], whole, strict=True):
        assert list(a.headers) == list(b.headers)
    return whole


def parse1(data: bytes, version: str | None = None, limits: FrameLimits | None = None) -> Frame:
    frames = parse3(data, version, limits)
    assert len(frames) == 1
    return frames[0]


def error3(
    data: bytes,
    version: str | None = None,
    limits: FrameLimits | None = None,
    negotiate: str | None = None,
    frames_before: int = 0,
) -> FrameError:
    """``data`` must raise FrameError all three ways, after exactly ``frames_before`` frames."""
    error: FrameError | None = None
    for name, chunks in _ways(data):
        out: list[Frame] = []
        with pytest.raises(FrameError) as info:
            _feed_chunks(chunks, version, limits, negotiate, out)
        assert len(out) == frames_before, name
        assert info.value.message and info.value.detail
        error = info.value
    assert error is not None
    return error


def frame_size(data: bytes) -> int:
    """Bytes of one serialised frame from its command to its NUL, inclusive."""
    return len(data)


# --------------------------------------------------------------------------------------------
# framing: line endings, noise between frames, several frames per feed


def test_simple_frame_lf() -> None:
    frame = parse1(b"SEND\ndestination:/queue/a\nreceipt:1\n\nhello\0")
    assert frame == Frame("SEND", {"destination": "/queue/a", "receipt": "1"}, b"hello")
    assert list(frame.headers) == ["destination", "receipt"]


def test_simple_frame_crlf() -> None:
    frame = parse1(b"SEND\r\ndestination:/queue/a\r\nreceipt:1\r\n\r\nhello\0")
    assert frame == Frame("SEND", {"destination": "/queue/a", "receipt": "1"}, b"hello")


@pytest.mark.parametrize(
    "data",
    [
        b"SEND\r\ndestination:/q\nreceipt:1\r\n\nhi\0",
        b"SEND\ndestination:/q\r\nreceipt:1\n\r\nhi\0",
        b"SEND\r\ndestination:/q\r\nreceipt:1\n\nhi\0",
    ],
)
def test_mixed_line_endings(data: bytes) -> None:
    assert parse1(data) == Frame("SEND", {"destination": "/q", "receipt": "1"}, b"hi")


@pytest.mark.parametrize("eol", [b"\n", b"\r\n"])
def test_frame_without_headers_or_body(eol: bytes) -> None:
    assert parse1(b"DISCONNECT" + eol + eol + b"\0") == Frame("DISCONNECT", {}, b"")


def test_body_may_contain_eols_and_header_like_text() -> None:
    frame = parse1(b"SEND\na:1\n\nline1\n\nb:2\r\n\r\n\0")
    assert frame == Frame("SEND", {"a": "1"}, b"line1\n\nb:2\r\n\r\n")


@pytest.mark.parametrize(
    "noise",
    [b"\n", b"\r\n", b"\0", b"\n\n\n", b"\r\n\r\n", b"\0\0\n\r\n\0", b"\n" * 1000],
)
def test_leading_noise_is_skipped(noise: bytes) -> None:
    assert parse1(noise + b"SEND\n\nx\0") == Frame("SEND", {}, b"x")


@pytest.mark.parametrize("noise", [b"", b"\n", b"\r\n", b"\0", b"\n\r\n\0\n"])
def test_heartbeats_between_and_after_frames(noise: bytes) -> None:
    data = b"SEND\na:1\n\none\0" + noise + b"SEND\na:2\n\ntwo\0" + noise
    assert parse3(data) == [Frame("SEND", {"a": "1"}, b"one"), Frame("SEND", {"a": "2"}, b"two")]


def test_only_heartbeats_yields_nothing() -> None:
    assert parse3(b"\n\r\n\n\0\r\n") == []
    parser = FrameParser()
    parser.feed(b"\n\n\r\n\0")
    assert parser.next_frame() is None
    assert parser.buffered == 0


def test_empty_parser_returns_none() -> None:
    parser = FrameParser()
    assert parser.next_frame() is None
    parser.feed(b"")
    assert parser.next_frame() is None


def test_several_frames_in_one_feed_pulled_one_at_a_time() -> None:
    parser = FrameParser()
    parser.feed(b"SEND\na:1\n\none\0\nSUBSCRIBE\nid:0\n\n\0\r\nBEGIN\ntransaction:t\n\n\0\n")
    assert parser.next_frame() == Frame("SEND", {"a": "1"}, b"one")
    assert parser.buffered > 0
    assert parser.next_frame() == Frame("SUBSCRIBE", {"id": "0"}, b"")
    assert parser.next_frame() == Frame("BEGIN", {"transaction": "t"}, b"")
    assert parser.next_frame() is None
    assert parser.buffered == 0
    assert parser.next_frame() is None


def test_partial_frame_then_rest() -> None:
    parser = FrameParser()
    parser.feed(b"SEND\na:1\n\none\0SEN")
    assert parser.next_frame() == Frame("SEND", {"a": "1"}, b"one")
    assert parser.next_frame() is None
    assert parser.buffered == 3
    parser.feed(b"D\n\ntwo\0")
    assert parser.next_frame() == Frame("SEND", {}, b"two")
    assert parser.next_frame() is None


def test_cr_at_end_of_buffer_waits_for_lf() -> None:
    parser = FrameParser()
    parser.feed(b"SEND\n\nx\0\r")
    assert parser.next_frame() == Frame("SEND", {}, b"x")
    assert parser.next_frame() is None
    parser.feed(b"\nSEND\n\ny\0")
    assert parser.next_frame() == Frame("SEND", {}, b"y")


def test_command_is_kept_raw() -> None:
    frames = parse3(b"send\n\n\0SEND \n\n\0FOO\n\n\0")
    assert [f.command for f in frames] == ["send", "SEND ", "FOO"]


def test_non_utf8_bytes_survive_via_surrogateescape() -> None:
    frame = parse1(b"SEND\nh\xff:v\xfe\xc3\xa9\n\n\0", "1.2")
    assert frame.headers == {"h\udcff": "v\udcfe\u00e9"}
    assert "h\udcff".encode("utf-8", "surrogateescape") == b"h\xff"


def test_nul_inside_header_value_is_kept() -> None:
    assert parse1(b"SEND\na:x\0y\n\nbody\0").headers == {"a": "x\0y"}


@pytest.mark.parametrize(
    "data",
    [
        b"\rSEND\n\n\0",  # CR between frames not followed by LF
        b"\n\r\rSEND\n\n\0",
        b"SE\rND\n\n\0",  # CR inside the command
        b"SEND\r\r\n\n\0",
        b"SEND\na\r:b\n\n\0",  # CR in a header name
        b"SEND\na:b\rc\n\n\0",  # CR in a header value
        b"SEND\na:b\r\r\n\n\0",
        b"SEND\na:b\n\r\r\n\n\0",  # a CR-only line is no blank line
    ],
)
def test_stray_cr_is_an_error(data: bytes) -> None:
    error3(data, "1.2")


def test_stray_cr_after_a_good_frame() -> None:
    error3(b"SEND\n\nok\0\r\rSEND\n\n\0", frames_before=1)


# --------------------------------------------------------------------------------------------
# header parsing and escaping


@pytest.mark.parametrize("version", [None, "1.0"])
def test_no_unescaping_before_negotiation_and_in_10(version: str | None) -> None:
    frame = parse1(b"SEND\na\\cb:x\\ny\\\\z\\t\\\n\n\0", version)
    assert frame.headers == {"a\\cb": "x\\ny\\\\z\\t\\"}


def test_unescape_11() -> None:
    frame = parse1(b"SEND\nk\\c\\n\\\\:a\\cb\\nc\\\\d\n\n\0", "1.1")
    assert frame.headers == {"k:\n\\": "a:b\nc\\d"}


def test_unescape_12_adds_cr() -> None:
    frame = parse1(b"SEND\nk\\r:a\\rb\\n\\c\\\\\n\n\0", "1.2")
    assert frame.headers == {"k\r": "a\rb\n:\\"}


def test_escaped_backslash_before_letter_is_not_an_escape() -> None:
    # \\t is an escaped backslash followed by a plain 't'
    assert parse1(b"SEND\na:\\\\t\\\\\\\\n\n\n\0", "1.2").headers == {"a": "\\t\\\\n"}


@pytest.mark.parametrize(
    ("version", "value"),
    [
        ("1.1", b"\\r"),  # \r only exists from 1.2 on
        ("1.1", b"\\t"),
        ("1.2", b"\\t"),
        ("1.2", b"x\\"),  # trailing lone backslash
        ("1.2", b"\\C"),
        ("1.2", b"\\ "),
        ("1.2", b"\\\\\\"),
        ("1.2", b"\\\xc3\xa9"),
    ],
)
def test_undefined_escape_is_an_error(version: str, value: bytes) -> None:
    error3(b"SEND\na:" + value + b"\n\n\0", version)
    error3(b"SEND\n" + value + b":v\n\n\0", version)  # in the name as well


def test_undefined_escape_in_a_repeated_header_is_an_error() -> None:
    error3(b"SEND\na:ok\na:\\t\n\n\0", "1.2")


def test_undefined_escape_after_a_good_frame() -> None:
    error3(b"SEND\na:\\c\n\n\0SEND\na:\\x\n\n\0", "1.2", frames_before=1)


@pytest.mark.parametrize("command", [b"CONNECT", b"STOMP"])
@pytest.mark.parametrize("version", [None, "1.0", "1.1", "1.2"])
def test_connect_frames_are_never_unescaped(command: bytes, version: str | None) -> None:
    frame = parse1(command + b"\naccept-version:1.2\nlogin:a\\cb\npasscode:\\t\\\n\n\0", version)
    assert frame.headers == {"accept-version": "1.2", "login": "a\\cb", "passcode": "\\t\\"}


def test_pipelined_connect_then_escaped_frame() -> None:
    data = b"CONNECT\naccept-version:1.2\nx:a\\cb\n\n\0SUBSCRIBE\nid:a\\cb\\r\ndestination:/q\n\n\0"
    frames = parse3(data, negotiate="1.2")
    assert frames == [
        Frame("CONNECT", {"accept-version": "1.2", "x": "a\\cb"}, b""),
        Frame("SUBSCRIBE", {"id": "a:b\r", "destination": "/q"}, b""),
    ]
    # 1.1 negotiated: \r is undefined in the frame after CONNECT
    error3(data, negotiate="1.1", frames_before=1)


def test_set_version_can_switch_back() -> None:
    parser = make_parser("1.2")
    parser.set_version("1.0")
    parser.feed(b"SEND\na:\\t\n\n\0")
    assert parser.next_frame() == Frame("SEND", {"a": "\\t"}, b"")


@pytest.mark.parametrize("version", [None, "1.0", "1.1", "1.2"])
def test_repeated_headers_first_occurrence_wins(version: str | None) -> None:
    frame = parse1(b"MESSAGE\nfoo:World\nbar:1\nfoo:Hello\nbar:2\nfoo:\n\n\0", version)
    assert frame.headers == {"foo": "World", "bar": "1"}
    assert list(frame.headers) == ["foo", "bar"]


def test_repeated_headers_compared_after_unescaping() -> None:
    frame = parse1(b"SEND\na\\cb:first\na\\cb:second\nc\\\\:x\nc\\\\:y\n\n\0", "1.2")
    assert frame.headers == {"a:b": "first", "c\\": "x"}


def test_value_may_contain_raw_colons() -> None:
    assert parse1(b"SEND\nfoo:a:b\nurl:http://x:1/\n\n\0").headers == {"foo": "a:b", "url": "http://x:1/"}
    assert parse1(b"SEND\nfoo:a:b::\n\n\0", "1.2").headers == {"foo": "a:b::"}


def test_empty_header_name_and_value() -> None:
    assert parse1(b"SEND\n:v\nempty:\n\n\0", "1.2").headers == {"": "v", "empty": ""}


def test_no_whitespace_trimming_in_11_and_12() -> None:
    for version in (None, "1.1", "1.2"):
        frame = parse1(b"SEND\n a : b \n\n\0", version)
        assert frame.headers == {" a ": " b "}


def test_10_left_trims_values() -> None:
    frame = parse1(b"SEND\n a :  b \nc:\t\td\ne:   \n\n\0", "1.0")
    assert frame.headers == {" a ": "b ", "c": "d", "e": ""}
    parser = FrameParser()
    parser.trim_values = True
    parser.feed(b"SEND\na:  x\n\n\0")
    assert parser.next_frame() == Frame("SEND", {"a": "x"}, b"")


@pytest.mark.parametrize(
    "data",
    [
        b"SEND\nnocolon\n\n\0",
        b"SEND\na:1\nnocolon\r\n\r\n\0",
        b"SEND\na:1\n \n\n\0",
    ],
)
def test_header_line_without_colon_is_an_error(data: bytes) -> None:
    error3(data, "1.2")


def test_escaped_colon_does_not_separate_name_and_value() -> None:
    error3(b"SEND\na\\cb\n\n\0", "1.2")  # "\c" is not a separator: no raw ':' at all
    error3(b"SEND\na\\cb\n\n\0", "1.0")


# --------------------------------------------------------------------------------------------
# bodies and content-length


def test_content_length_body_may_contain_nuls() -> None:
    body = b"\0a\0\0b\n\n\0"
    frame = parse1(b"SEND\ncontent-length:%d\n\n" % len(body) + body + b"\0")
    assert frame == Frame("SEND", {"content-length": str(len(body))}, body)


def test_content_length_zero() -> None:
    assert parse1(b"SEND\ncontent-length:0\n\n\0").body == b""


def test_content_length_body_then_heartbeats() -> None:
    frames = parse3(b"SEND\ncontent-length:3\n\n\0\0\0\0\n\r\n\0SEND\n\nx\0")
    assert [f.body for f in frames] == [b"\0\0\0", b"x"]


def test_nul_terminated_body() -> None:
    assert parse1(b"SEND\ndestination:/q\n\nhello world\n\0").body == b"hello world\n"


def test_nul_terminated_body_empty() -> None:
    assert parse1(b"SEND\n\n\0").body == b""


@pytest.mark.parametrize("raw", [b" 5", b"5 ", b"  5  ", b"\t5\t", b"005"])
def test_content_length_with_surrounding_whitespace(raw: bytes) -> None:
    frame = parse1(b"SEND\ncontent-length:" + raw + b"\n\nab\0de\0", "1.2")
    assert frame.body == b"ab\0de"


def test_content_length_in_10_after_left_trim() -> None:
    assert parse1(b"SEND\ncontent-length:   2\n\n\0\0\0", "1.0").body == b"\0\0"


def test_content_length_first_occurrence_wins() -> None:
    assert parse1(b"SEND\ncontent-length:2\ncontent-length:9\n\n\0\0\0").body == b"\0\0"


@pytest.mark.parametrize(
    "raw",
    [
        b"-1",
        b"-0",
        b"abc",
        b"0x5",
        b"0X05",
        b"5a",
        b"",
        b" ",
        b"+5",
        b"5.0",
        b"1e3",
        b"1_0",
        b"\xef\xbc\x95",
        b"\xd9\xa5",
        b"5 5",
    ],
)
def test_bad_content_length_is_an_error(raw: bytes) -> None:
    error = error3(b"SEND\ncontent-length:" + raw + b"\n\nhello\0", "1.2")
    assert error.message == "Bad content-length"


def test_content_length_with_huge_number_of_digits_is_a_frame_error() -> None:
    # more digits than int() converts by default (sys.int_info.str_digits_check_threshold)
    parser = make_parser("1.2")
    parser.feed(b"SEND\ncontent-length:" + b"9" * 5000 + b"\n\n\0")
    with pytest.raises(FrameError):
        parser.next_frame()


def test_huge_content_length_is_a_frame_error() -> None:
    error3(b"SEND\ncontent-length:" + b"9" * 40 + b"\n\nx\0")


@pytest.mark.parametrize(
    "data",
    [
        b"SEND\ncontent-length:3\n\nhello\0",
        b"SEND\ncontent-length:0\n\nx\0",
        b"SEND\ncontent-length:2\n\n\0\0x\0",
    ],
)
def test_body_longer_than_content_length_is_an_error(data: bytes) -> None:
    assert error3(data).message == "Bad frame"


def test_content_length_counts_nuls_not_terminators() -> None:
    assert parse1(b"SEND\ncontent-length:1\n\n\0\0").body == b"\0"


def test_body_longer_than_content_length_after_a_good_frame() -> None:
    error3(b"SEND\ncontent-length:1\n\nx\0SEND\ncontent-length:1\n\nxy\0", frames_before=1)


def test_content_length_waits_for_the_whole_body() -> None:
    parser = FrameParser()
    parser.feed(b"SEND\ncontent-length:4\n\n\0\0")
    assert parser.next_frame() is None
    parser.feed(b"\0\0")
    assert parser.next_frame() is None  # body complete, terminating NUL still missing
    parser.feed(b"\0")
    assert parser.next_frame() == Frame("SEND", {"content-length": "4"}, b"\0\0\0\0")


# --------------------------------------------------------------------------------------------
# limits


def test_limits_property() -> None:
    parser = FrameParser()
    assert parser.limits == FrameLimits()
    assert FrameLimits() == FrameLimits(4 * 1024 * 1024, 100, 100 * 1024)
    parser.limits = FrameLimits(max_frame_size=10)
    parser.feed(b"SEND\n\n0123456789\0")
    with pytest.raises(FrameError):
        parser.next_frame()


def test_frame_exactly_at_max_frame_size_is_accepted() -> None:
    # (bigger than NEXT_BYTES, which parse3 appends and must fit the limit too)
    for data in (b"SEND\ncontent-length:13\n\nhe\0lo, world!\0", b"SEND\na:b\n\nhello, world!\0"):
        assert frame_size(data) >= len(NEXT_BYTES)
        limits = FrameLimits(max_frame_size=frame_size(data))
        parse1(data, limits=limits)
        # leading noise does not count towards the frame
        parse1(b"\n" * 50 + data, limits=limits)
        error3(data, limits=FrameLimits(max_frame_size=frame_size(data) - 1))


def test_oversize_content_length_fails_when_head_is_parsed() -> None:
    limits = FrameLimits(max_frame_size=100)
    head = b"SEND\ndestination:/q\ncontent-length:1000\n\n"
    parser = make_parser("1.2", limits)
    for i in range(len(head) - 1):
        parser.feed(head[i : i + 1])
        assert parser.next_frame() is None
    parser.feed(head[-1:])
    with pytest.raises(FrameError) as info:
        parser.next_frame()
    assert info.value.message == "Frame too big"
    # and the three ways with the body present too
    error3(head + b"x" * 1000 + b"\0", limits=limits)


def test_oversize_nul_terminated_frame_fails_once_over_the_limit() -> None:
    limit = 50
    parser = make_parser("1.2", FrameLimits(max_frame_size=limit))
    parser.feed(b"\n\n")  # noise is not counted
    data = b"SEND\na:b\n\n" + b"x" * 100
    for i in range(len(data)):
        parser.feed(data[i : i + 1])
        if i + 1 <= limit:
            assert parser.next_frame() is None
        else:
            with pytest.raises(FrameError) as info:
                parser.next_frame()
            assert info.value.message == "Frame too big"
            assert i + 1 == limit + 1
            break
    else:  # pragma: no cover
        pytest.fail("no FrameError")


def test_oversize_nul_terminated_frame_arriving_whole() -> None:
    data = b"SEND\na:b\n\n" + b"x" * 100 + b"\0"
    error3(data, limits=FrameLimits(max_frame_size=50))


def test_never_terminated_header_block_fails_once_over_the_limit() -> None:
    limit = 64
    parser = make_parser("1.2", FrameLimits(max_frame_size=limit))
    data = b"SEND\n" + b"a:b\n" * 100
    for i in range(len(data)):
        parser.feed(data[i : i + 1])
        if i + 1 <= limit:
            assert parser.next_frame() is None
        else:
            with pytest.raises(FrameError):
                parser.next_frame()
            assert i + 1 == limit + 1
            break
    else:  # pragma: no cover
        pytest.fail("no FrameError")


def test_header_block_longer_than_the_limit_arriving_whole() -> None:
    error3(b"SEND\n" + b"a:b\n" * 100 + b"\n\0", limits=FrameLimits(max_frame_size=64))


def test_too_many_distinct_headers() -> None:
    limits = FrameLimits(max_headers=3)
    assert len(parse1(b"SEND\na:1\nb:2\nc:3\n\n\0", limits=limits).headers) == 3
    assert error3(b"SEND\na:1\nb:2\nc:3\nd:4\n\n\0", limits=limits).message == "Too many headers"


def test_duplicates_do_not_count_towards_max_headers() -> None:
    limits = FrameLimits(max_headers=2)
    data = b"SEND\na:0\n" + b"".join(b"a:%d\nb:%d\n" % (i, i) for i in range(200)) + b"\n\0"
    assert parse1(data, limits=limits).headers == {"a": "0", "b": "0"}


def test_header_line_too_long() -> None:
    limits = FrameLimits(max_header_length=10)
    assert parse1(b"SEND\na:" + b"x" * 8 + b"\n\n\0", limits=limits).headers == {"a": "x" * 8}
    # the CR of a CRLF does not count
    assert parse1(b"SEND\r\na:" + b"x" * 8 + b"\r\n\r\n\0", limits=limits).headers == {"a": "x" * 8}
    assert error3(b"SEND\na:" + b"x" * 9 + b"\n\n\0", limits=limits).message == "Header too long"
    assert error3(b"SEND\n" + b"n" * 10 + b":\n\n\0", limits=limits).message == "Header too long"
    # a too long repeated header is still too long
    error3(b"SEND\na:1\na:" + b"x" * 20 + b"\n\n\0", limits=limits)


def test_command_line_too_long() -> None:
    limits = FrameLimits(max_header_length=10)
    assert parse1(b"X" * 10 + b"\n\n\0", limits=limits).command == "X" * 10
    # the same ERROR whichever path parses the head (no CR or backslash: the plain path)
    assert error3(b"X" * 11 + b"\n\n\0", limits=limits).message == "Bad frame"
    assert error3(b"X" * 11 + b"\r\n\r\n\0", limits=limits).message == "Bad frame"


# --------------------------------------------------------------------------------------------
# encode_frame


def test_encode_without_body_has_no_content_length() -> None:
    assert encode_frame("RECEIPT", [("receipt-id", "7")]) == b"RECEIPT\nreceipt-id:7\n\n\0\n"
    assert encode_frame("RECEIPT") == b"RECEIPT\n\n\0\n"


def test_encode_content_length_is_last() -> None:
    data = encode_frame("MESSAGE", [("destination", "/q"), ("message-id", "1")], b"h\0llo")
    assert data == b"MESSAGE\ndestination:/q\nmessage-id:1\ncontent-length:5\n\nh\0llo\0\n"


def test_encode_content_length_counts_bytes() -> None:
    body = "héllo".encode()
    assert b"\ncontent-length:6\n" in encode_frame("MESSAGE", [], body)


def test_encode_drops_given_content_length() -> None:
    headers = [("content-length", "99"), ("a", "1"), ("content-length", "3")]
    assert encode_frame("MESSAGE", headers, b"xy") == b"MESSAGE\na:1\ncontent-length:2\n\nxy\0\n"
    assert encode_frame("MESSAGE", headers) == b"MESSAGE\na:1\n\n\0\n"


def test_encode_escapes_names_and_values() -> None:
    data = encode_frame("MESSAGE", [("k:\n", "hé\nllo:x\\y\rz")])
    assert data == "MESSAGE\nk\\c\\n:hé\\nllo\\cx\\\\y\\rz\n\n\0\n".encode()


def test_encode_escapes_connected_too() -> None:
    assert encode_frame("CONNECTED", [("server", "a:b")]) == b"CONNECTED\nserver:a\\cb\n\n\0\n"


def test_encode_without_trailing_lf() -> None:
    assert encode_frame("ERROR", [("message", "x")], b"d", trailing_lf=False) == (
        b"ERROR\nmessage:x\ncontent-length:1\n\nd\0"
    )


def test_encode_without_escaping() -> None:
    assert encode_frame("CONNECTED", [("a", "b:c")], escape_headers=False) == b"CONNECTED\na:b:c\n\n\0\n"


def test_encode_surrogateescape_round_trip() -> None:
    data = encode_frame("MESSAGE", [("h\udcff", "v\udcfe")])
    assert data == b"MESSAGE\nh\xff:v\xfe\n\n\0\n"
    assert parse1(data, "1.2").headers == {"h\udcff": "v\udcfe"}


@pytest.mark.parametrize(
    ("raw", "escaped"),
    [
        ("", ""),
        ("plain", "plain"),
        ("\\", "\\\\"),
        ("\n", "\\n"),
        ("\r", "\\r"),
        (":", "\\c"),
        ("\\n", "\\\\n"),
        ("a:b\\c\r\n", "a\\cb\\\\c\\r\\n"),
        ("é\t", "é\t"),
    ],
)
def test_escape(raw: str, escaped: str) -> None:
    assert escape(raw) == escaped


def test_encoded_frames_parse_back() -> None:
    data = encode_frame("MESSAGE", [("a:b", "c\nd"), ("a:b", "dup")], b"\0body\0") + encode_frame("RECEIPT")
    assert parse3(data, "1.2") == [
        Frame("MESSAGE", {"a:b": "c\nd", "content-length": "6"}, b"\0body\0"),
        Frame("RECEIPT", {}, b""),
    ]


# --------------------------------------------------------------------------------------------
# property tests

COMMANDS = [
    "SEND",
    "MESSAGE",
    "SUBSCRIBE",
    "UNSUBSCRIBE",
    "ACK",
    "NACK",
    "BEGIN",
    "COMMIT",
    "ABORT",
    "DISCONNECT",
    "RECEIPT",
    "ERROR",
    "CONNECTED",
]
_special_chars = st.sampled_from(list(":\\\n\r \té€😀\0"))
header_text = st.text(alphabet=st.one_of(_special_chars, st.characters(codec="utf-8")), max_size=10)
header_name = header_text.filter(lambda s: s != "content-length")
header_lists = st.lists(st.tuples(header_name, header_text), max_size=6)


def _escape12(text: str) -> str:
    """Test-local STOMP 1.2 escaping, independent of codec.escape."""
    return text.replace("\\", "\\\\").replace("\r", "\\r").replace("\n", "\\n").replace(":", "\\c")


def encode_local(
    command: str,
    headers: Sequence[tuple[str, str]],
    body: bytes,
    *,
    with_length: bool,
    eol: str = "\n",
) -> bytes:
    """Serialise a frame per STOMP 1.2; without content-length the body must not contain NUL."""
    lines = [command] + [f"{_escape12(k)}:{_escape12(v)}" for k, v in headers]
    if with_length:
        lines.append(f"content-length:{len(body)}")
    else:
        assert b"\0" not in body
    return (eol.join(lines) + eol + eol).encode() + body + b"\0"


def expected_frame(command: str, headers: Sequence[tuple[str, str]], body: bytes, with_length: bool) -> Frame:
    expected: dict[str, str] = {}
    for k, v in headers:
        expected.setdefault(k, v)
    if with_length:
        expected.setdefault("content-length", str(len(body)))
    return Frame(command, expected, body)


@st.composite
def frames_and_bytes(draw: st.DrawFn) -> tuple[Frame, bytes]:
    command = draw(st.sampled_from(COMMANDS))
    headers = draw(header_lists)
    with_length = draw(st.booleans())
    body = draw(
        st.binary(max_size=40) if with_length else st.binary(max_size=40).map(lambda b: b.replace(b"\0", b""))
    )
    eol = draw(st.sampled_from(["\n", "\r\n"]))
    return expected_frame(command, headers, body, with_length), encode_local(
        command, headers, body, with_length=with_length, eol=eol
    )


noise = st.lists(st.sampled_from([b"\n", b"\r\n", b"\0"]), max_size=3).map(b"".join)

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def feed_split(data: bytes, cuts: Iterable[int], parser: FrameParser) -> list[Frame]:
    out: list[Frame] = []
    start = 0
    for cut in sorted(set(cuts)):
        parser.feed(data[start:cut])
        pull_all(parser, out)
        start = cut
    parser.feed(data[start:])
    pull_all(parser, out)
    return out


@FAST
@given(st.sampled_from(COMMANDS), header_lists, st.binary(max_size=64))
def test_property_round_trip_with_encode_frame(
    command: str, headers: list[tuple[str, str]], body: bytes
) -> None:
    data = encode_frame(command, headers, body)
    parser = make_parser("1.2")
    parser.feed(data)
    frame = parser.next_frame()
    expected = expected_frame(command, headers, body, with_length=bool(body))
    assert frame == expected
    assert list(frame.headers) == list(expected.headers)  # content-length last
    assert parser.next_frame() is None
    assert parser.buffered == 0


@FAST
@given(frames_and_bytes())
def test_property_round_trip_with_local_encoder(case: tuple[Frame, bytes]) -> None:
    expected, data = case
    assert parse3(data, "1.2") == [expected]


@FAST
@given(st.lists(st.tuples(noise, frames_and_bytes()), min_size=1, max_size=5), noise, st.data())
def test_property_any_split_parses_the_same(
    items: list[tuple[bytes, tuple[Frame, bytes]]], tail: bytes, data: st.DataObject
) -> None:
    stream = b"".join(n + encoded for n, (_, encoded) in items) + tail
    expected = [frame for _, (frame, _) in items]
    whole = feed_split(stream, [], make_parser("1.2"))
    assert whole == expected
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=20))
    assert feed_split(stream, cuts, make_parser("1.2")) == expected


_tokens = st.sampled_from(
    [
        b"SEND",
        b"CONNECT",
        b"MESSAGE",
        b"\n",
        b"\r\n",
        b"\r",
        b"\0",
        b":",
        b"\\",
        b"\\c",
        b"\\r",
        b"\\t",
        b"a",
        b"content-length:",
        b"content-length: 3",
        b"-1",
        b"0",
        b"5",
        b"9999",
        b" ",
        b"\xff",
        b"\n\n",
    ]
)
garbage = st.one_of(st.binary(max_size=200), st.lists(_tokens, max_size=60).map(b"".join))


@settings(max_examples=300, deadline=None)
@given(garbage, st.sampled_from([None, "1.0", "1.1", "1.2"]), st.integers(8, 64), st.data())
def test_property_garbage_only_raises_frame_error(
    data: bytes, version: str | None, max_size: int, draw: st.DataObject
) -> None:
    limits = FrameLimits(max_frame_size=max_size, max_headers=4, max_header_length=16)
    cuts = draw.draw(st.lists(st.integers(0, len(data)), max_size=10))
    parser = make_parser(version, limits)
    out: list[Frame] = []
    try:
        out = feed_split(data, cuts, parser)
    except FrameError as error:
        assert isinstance(error.message, str) and isinstance(error.detail, str)
        return
    # every frame consumed at least one byte; the parser is at rest
    assert len(out) <= len(data)
    assert parser.next_frame() is None
    for frame in out:
        assert frame_size(frame.body) <= max_size


@FAST
@given(frames_and_bytes(), st.integers(1, 200), st.data())
def test_property_max_frame_size_holds(case: tuple[Frame, bytes], max_size: int, data: st.DataObject) -> None:
    expected, encoded = case
    size = frame_size(encoded)
    cuts = data.draw(st.lists(st.integers(0, len(encoded)), max_size=10))
    parser = make_parser("1.2", FrameLimits(max_frame_size=max_size))
    out: list[Frame] = []
    if size > max_size:
        with pytest.raises(FrameError):
            out = feed_split(encoded, cuts, parser)
        assert out == []
    else:
        assert feed_split(encoded, cuts, parser) == [expected]


@FAST
@given(
    st.lists(st.text(alphabet="abcdefgh-", min_size=1, max_size=5), min_size=1, max_size=8, unique=True),
    st.lists(st.integers(0, 100), max_size=40),
    st.data(),
)
def test_property_duplicates_do_not_exhaust_max_headers(
    names: list[str], picks: list[int], data: st.DataObject
) -> None:
    order = list(names) + [names[i % len(names)] for i in picks]
    order = data.draw(st.permutations(order))
    headers = [(name, str(i)) for i, name in enumerate(order)]
    encoded = encode_local("SEND", headers, b"", with_length=False)
    expected = expected_frame("SEND", headers, b"", with_length=False)
    assert parse3(encoded, "1.2", limits=FrameLimits(max_headers=len(names))) == [expected]
    one_more = encode_local("SEND", [*headers, ("zzzzzz", "x")], b"", with_length=False)
    error3(one_more, "1.2", limits=FrameLimits(max_headers=len(names)))


def _valid_length(value: str) -> bool:
    stripped = value.strip()
    return stripped.isascii() and stripped.isdigit()


@FAST
@given(
    st.one_of(
        st.integers(max_value=-1).map(str),
        st.integers(min_value=0, max_value=10**6).map(lambda n: f"-{n}"),
        header_text.filter(lambda v: not _valid_length(v)),
        st.from_regex(r"\A\s*(0x[0-9a-f]+|[0-9]+[.e_a-z][0-9]*|\+[0-9]+)\s*\Z"),
    ),
    st.sampled_from(["1.0", "1.1", "1.2"]),
)
def test_property_bad_content_length_is_rejected(value: str, version: str) -> None:
    if version == "1.2":
        raw = _escape12(value)
    else:
        # 1.0/1.1 cannot carry CR (and 1.0 not LF) in values: keep the value representable
        assume("\r" not in value and "\n" not in value and "\\" not in value)
        raw = value
    data = f"SEND\ncontent-length:{raw}\n\nhello\0".encode()
    error = error3(data, version)
    assert error.message == "Bad content-length"


def test_test_helpers_agree_with_codec_escape() -> None:
    for text in ["a:b", "\\", "\r\n", "é:\\n"]:
        assert _escape12(text) == escape(text)


def _head_outcome(parse, head: bytes) -> object:
    try:
        return parse(head)
    except FrameError as error:
        return ("error", error.message, error.detail)


# heads without CR or backslash, broken in the ways the parser checks: long lines, lines
# without a colon, many headers
_plain_head_line = st.binary(max_size=14).map(
    lambda b: b.replace(b"\r", b"").replace(b"\\", b"").replace(b"\n", b"")
)


@FAST
@given(st.lists(_plain_head_line, min_size=1, max_size=8))
def test_plain_and_general_head_paths_agree(lines: list[bytes]) -> None:
    """The one-decode fast path and the general path give the same frame, or the same ERROR
    (message and detail), for every head the fast path may see."""
    head = b"\n".join(lines)
    plain = FrameParser(FrameLimits(max_header_length=10, max_headers=3))
    general = FrameParser(FrameLimits(max_header_length=10, max_headers=3))
    assert _head_outcome(plain._parse_plain_head, head) == _head_outcome(general._parse_general_head, head)


# --------------------------------------------------------------------------------------------
# heart-beat runs: skipped in one C-level step, whatever their length (issue #24: a WebSocket
# message that inflates to hundreds of MB of "\n" was walked one byte per Python iteration)


def _codec_lines_run(parser: FrameParser) -> tuple[list[Frame], int]:
    """Pull every frame from ``parser``; return them and the Python lines executed in codec.py,
    a count of interpreter steps that does not depend on the clock."""
    lines = 0
    codec_file = FrameParser.next_frame.__code__.co_filename

    def tracer(frame: types.FrameType, event: str, arg: object) -> object:
        nonlocal lines
        if frame.f_code.co_filename != codec_file:
            return None
        if event == "line":
            lines += 1
        return tracer

    out: list[Frame] = []
    sys.settrace(tracer)
    try:
        pull_all(parser, out)
    finally:
        sys.settrace(None)
    return out, lines


@pytest.mark.parametrize("eol", [b"\n", b"\r\n", b"\0", b"\n\0\r\n"])
def test_heart_beat_runs_cost_the_same_python_steps_whatever_their_length(eol: bytes) -> None:
    steps = []
    for run in (10, 1_000_000):  # a few bytes, then megabytes of heart-beats
        parser = FrameParser()
        parser.feed(b"SEND\na:1\n\none\0" + eol * run + b"SEND\na:2\n\ntwo\0" + eol * run)
        frames, lines = _codec_lines_run(parser)
        assert frames == [Frame("SEND", {"a": "1"}, b"one"), Frame("SEND", {"a": "2"}, b"two")]
        assert parser.buffered == 0
        steps.append(lines)
    assert steps[0] == steps[1], f"Python steps grow with the run of heart-beats: {steps}"


@pytest.mark.parametrize("eol", [b"\n", b"\r\n", b"\n\0\r\n"])
def test_skipping_heart_beats_allocates_nothing_in_proportion_to_them(eol: bytes) -> None:
    parser = FrameParser()
    parser.feed(eol * 1_000_000 + b"SEND\n\nx\0")
    peak, frame = peak_allocated(parser.next_frame)
    assert frame == Frame("SEND", {}, b"x")
    assert peak < 64 * 1024, f"{peak} bytes allocated to skip {len(eol) * 1_000_000} bytes of heart-beats"


@pytest.mark.parametrize("eol", [b"\n", b"\r\n"])
def test_long_heart_beat_runs_three_ways(eol: bytes) -> None:
    # whole, byte at a time (a CR alone at a feed's end waits for its LF) and with trailing data
    noise = eol * 3000
    data = noise + b"SEND\na:1\n\none\0" + noise + b"SEND\na:2\n\ntwo\0" + noise
    assert parse3(data) == [Frame("SEND", {"a": "1"}, b"one"), Frame("SEND", {"a": "2"}, b"two")]


def test_cr_without_lf_after_a_long_heart_beat_run_is_an_error() -> None:
    error = error3(b"\r\n" * 5000 + b"\rSEND\n\n\0")
    assert "CR not followed by LF" in error.detail


def test_heart_beats_do_not_count_against_the_frame_limits() -> None:
    limits = FrameLimits(max_frame_size=64, max_headers=2, max_header_length=32)
    data = b"\n" * 10_000 + b"SEND\na:1\n\none\0" + b"\r\n" * 10_000 + b"SEND\n\ntwo\0"
    assert parse3(data, limits=limits) == [Frame("SEND", {"a": "1"}, b"one"), Frame("SEND", {}, b"two")]


def test_a_buffer_of_only_heart_beats_is_released_once_read() -> None:
    # nothing is held for it: it counts against no input budget (buffered == 0), and the bytes
    # are dropped at once rather than kept until the client's next read (an idle client that
    # sent megabytes of EOLs must not pin them)
    parser = FrameParser(FrameLimits(max_frame_size=64))
    parser.feed(b"\r\n" * 1_000_000)
    assert parser.next_frame() is None
    assert parser.buffered == 0
    assert parser.retained == 0
    parser.feed(b"\n" * 100 + b"\r")  # a CR alone waits for its LF: one byte held
    assert parser.next_frame() is None
    assert parser.buffered == 1 and parser.retained == 1
    parser.feed(b"\nSEND\n\nx\0")
    assert parser.next_frame() == Frame("SEND", {}, b"x")
    assert parser.next_frame() is None
    assert parser.retained == 0


def test_a_large_frame_is_not_retained_after_it_was_read() -> None:
    parser = FrameParser()
    parser.feed(b"SEND\n\n" + b"x" * 1_000_000 + b"\0")
    frame = parser.next_frame()
    assert frame is not None and len(frame.body) == 1_000_000
    assert parser.next_frame() is None
    assert parser.retained == 0
