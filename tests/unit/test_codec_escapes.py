"""Header escapes are undone at C speed (issue #24 review): a 4 MiB SEND whose 100 header values are
escape sequences (``\\n`` x 20,000 each) made the parser call a Python function per escape, two
million calls, about 3 s with the event loop held, from one authenticated client (over a
compressed WebSocket, from a few kilobytes on the wire).  Counted in Python calls, not time."""

from __future__ import annotations

import sys
from types import FrameType

import pytest
from hypothesis import given
from hypothesis import strategies as st

from adapter.stomp.codec import (
    _UNESCAPE_11,
    _UNESCAPE_12,
    FrameError,
    FrameLimits,
    FrameParser,
    _unescape,
    _unescape_slowly,
)


def _python_calls_while(parser: FrameParser) -> tuple[object, int]:
    calls = 0

    def profile(frame: FrameType, event: str, arg: object) -> None:
        nonlocal calls
        if event == "call":
            calls += 1

    sys.setprofile(profile)
    try:
        result: object = parser.next_frame()
    except FrameError as error:
        result = error
    finally:
        sys.setprofile(None)
    return result, calls


def _parser(version: str) -> FrameParser:
    parser = FrameParser(FrameLimits())
    parser.set_version(version)
    return parser


@pytest.mark.parametrize("version", ["1.1", "1.2"])
def test_escape_heavy_headers_cost_no_python_call_per_escape(version: str) -> None:
    escapes = 20_000
    value = b"\\n\\c\\\\" * (escapes // 3)
    head = b"".join(b"h%d:%s\n" % (i, value) for i in range(90))
    parser = _parser(version)
    parser.feed(b"SEND\ndestination:/queue/a\n" + head + b"\n\0")
    frame, calls = _python_calls_while(parser)
    assert not isinstance(frame, FrameError), frame
    assert frame is not None and frame.headers["h7"] == "\n:\\" * (escapes // 3)  # type: ignore[attr-defined]
    assert calls < 2_000, f"{calls} Python calls for {90 * escapes} escapes"


def test_repeated_headers_with_escapes_cost_no_python_call_per_escape() -> None:
    line = b"name:" + b"\\c" * 1000 + b"\n"
    parser = _parser("1.2")
    parser.feed(b"SEND\ndestination:/queue/a\n" + line * 1000 + b"\n\0")
    frame, calls = _python_calls_while(parser)
    assert not isinstance(frame, FrameError), frame
    assert calls < 10_000, f"{calls} Python calls for 1,000,000 escapes"


@pytest.mark.parametrize(
    ("raw", "version", "expected"),
    [
        (b"a\\nb", "1.1", "a\nb"),
        (b"a\\cb", "1.1", "a:b"),
        (b"a\\\\b", "1.1", "a\\b"),
        (b"a\\\\nb", "1.1", "a\\nb"),  # an escaped backslash, then n
        (b"a\\\\\\nb", "1.2", "a\\\nb"),
        (b"\\r\\n", "1.2", "\r\n"),
        (b"x\0\\n", "1.2", "x\0\n"),  # a NUL in the value
        (b"\\\\\\\\", "1.2", "\\\\"),
    ],
)
def test_unescaping_is_unchanged(raw: bytes, version: str, expected: str) -> None:
    parser = _parser(version)
    parser.feed(b"SEND\ndestination:/queue/a\nh:" + raw + b"\n\n\0")
    frame = parser.next_frame()
    assert frame is not None and frame.headers["h"] == expected


@pytest.mark.parametrize(
    ("raw", "version", "bad"),
    [
        (b"a\\tb", "1.2", "\\\\t"),
        (b"a\\rb", "1.1", "\\\\r"),  # \r is 1.2's only
        (b"ab\\", "1.2", "\\\\'"),  # a backslash at the end
        (b"\\\\\\x", "1.2", "\\\\x"),
        (b"\\n" * 5000 + b"\\q", "1.2", "\\\\q"),
    ],
)
def test_undefined_escapes_are_still_refused_naming_the_escape(raw: bytes, version: str, bad: str) -> None:
    parser = _parser(version)
    parser.feed(b"SEND\ndestination:/queue/a\nh:" + raw + b"\n\n\0")
    with pytest.raises(FrameError, match="Undefined escape sequence") as caught:
        parser.next_frame()
    assert bad in caught.value.detail, caught.value.detail


@given(st.binary(max_size=16).map(lambda b: bytes(b"\\ncre:x"[byte % 7] for byte in b)))
def test_unescape_agrees_with_the_escape_by_escape_reference(raw: bytes) -> None:
    for table in (_UNESCAPE_11, _UNESCAPE_12):
        try:
            fast: object = _unescape(raw, table)
        except FrameError as error:
            fast = error.detail
        try:
            reference: object = _unescape_slowly(raw, table)
        except FrameError as error:
            reference = error.detail
        assert fast == reference
