"""Bounded parsing of client integers (adapter/numbers.py), and the parsers built on it: a header of
thousands of digits is refused before ``int()`` sees it (which would raise ``ValueError`` beyond
4,300 digits), as a clean ProcessingError / FrameError."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from adapter.mapping.destinations import (
    ProcessingError,
    plugin_integer,
    queue_arguments,
    stream_offset_argument,
)
from adapter.mapping.profile import ActiveMQRules, RabbitMQRules, expires_to_ttl
from adapter.mapping.properties import properties_from_send
from adapter.numbers import MAX_DIGITS, TooManyDigits, decimal_integer
from adapter.stomp.codec import FrameError, FrameParser

HUGE = "1" * 5000  # more digits than int() accepts (sys.get_int_max_str_digits() is 4300)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", 0),
        ("42", 42),
        ("+42", 42),
        ("-42", -42),
        ("-0", 0),
        ("0" * 5000 + "7", 7),  # leading zeros do not count, and int() never sees them
        ("18446744073709551615", 2**64 - 1),  # 20 digits: the widest AMQP integer
        ("", None),
        ("-", None),
        ("1.5", None),
        (" 1", None),
        ("1_000", None),  # int() takes underscores; a header does not
        ("٣", None),  # int() takes other scripts' digits; a header does not
        ("²", None),
    ],
)
def test_decimal_integer(text: str, expected: int | None) -> None:
    assert decimal_integer(text) == expected


def test_unsigned_refuses_a_sign() -> None:
    assert decimal_integer("-1", signed=False) is None
    assert decimal_integer("+1", signed=False) is None
    assert decimal_integer("1", signed=False) == 1


@pytest.mark.parametrize("text", [HUGE, "-" + HUGE, "9" * (MAX_DIGITS + 1), "1" * 100_000])
def test_too_many_digits_names_the_limit(text: str) -> None:
    with pytest.raises(TooManyDigits) as error:
        decimal_integer(text)
    assert f"at most {MAX_DIGITS}" in str(error.value)
    assert len(str(error.value)) < 200  # the value is quoted, not echoed in full


@given(st.integers(min_value=-(10**MAX_DIGITS) + 1, max_value=10**MAX_DIGITS - 1))
def test_round_trip_within_the_bound(number: int) -> None:
    assert decimal_integer(str(number)) == number


@given(st.text(alphabet="0123456789+- x", max_size=60))
def test_never_raises_anything_but_too_many_digits(text: str) -> None:
    try:
        result = decimal_integer(text)
    except TooManyDigits:
        return
    assert result is None or isinstance(result, int)


# --- the parsers that take integers from headers -----------------------------------------------


def test_plugin_integer_refuses_thousands_of_digits_as_a_processing_error() -> None:
    for text in (HUGE, "-" + HUGE, " " + HUGE + " "):
        with pytest.raises(ProcessingError, match=f"at most {MAX_DIGITS}"):
            plugin_integer(text, strip=True)


@pytest.mark.parametrize(
    "call",
    [
        lambda: queue_arguments({"x-max-length": HUGE}),
        lambda: queue_arguments({"x-message-ttl": "-" + HUGE}),
        lambda: stream_offset_argument("offset=" + HUGE),
        lambda: stream_offset_argument("timestamp=" + HUGE),
        lambda: properties_from_send({"priority": HUGE}, None),
        lambda: properties_from_send({"timestamp": HUGE}, None),
        lambda: RabbitMQRules().prefetch({"prefetch-count": HUGE}),
        lambda: ActiveMQRules().prefetch({"activemq.prefetchSize": HUGE}),
        lambda: expires_to_ttl(HUGE, 0),
    ],
    ids=[
        "x-max-length",
        "x-message-ttl",
        "stream-offset",
        "stream-timestamp",
        "priority",
        "timestamp",
        "prefetch-count",
        "activemq.prefetchSize",
        "expires",
    ],
)
def test_integer_headers_with_thousands_of_digits_are_processing_errors(call: object) -> None:
    with pytest.raises(ProcessingError, match="digits"):
        call()  # type: ignore[operator]


def test_content_length_with_thousands_of_digits_is_a_frame_error() -> None:
    parser = FrameParser()
    parser.feed(b"SEND\ndestination:/queue/q\ncontent-length:" + HUGE.encode() + b"\n\nx\0")
    with pytest.raises(FrameError) as error:
        parser.next_frame()
    assert error.value.message == "Bad content-length"
    assert "too many digits" in error.value.detail
