"""adapter/logs.py's text format: one record is one line, whatever a client put in it."""

from __future__ import annotations

import logging
import sys

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from adapter.logs import _CONTROL, TEXT_FORMAT, TextFormatter, _escape, escape_controls


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("plain user", "plain user"),
        ("a\nb", "a\\nb"),
        ("a\r\nb", "a\\r\\nb"),
        ("a\tb", "a\\tb"),
        ("\x1b[2J", "\\x1b[2J"),
        ("a\x00b\x7f", "a\\x00b\\x7f"),
        ("a\x0bb\x0cc\x1cd", "a\\x0bb\\x0cc\\x1cd"),
        ("a\u0085b\u2028c\u2029", "a\\x85b\\u2028c\\u2029"),
        ("bad \udc85 byte", "bad \\udc85 byte"),
        ("naïve ü €", "naïve ü €"),  # printable non-ASCII stays as it is
    ],
)
def test_escape_controls(raw, shown):
    assert escape_controls(raw) == shown
    assert len(escape_controls(raw).splitlines()) <= 1


def _escape_controls_as_it_was(text: str) -> str:
    """escape_controls before its ASCII check became a bytes.translate: ``isascii`` and
    ``isprintable`` as the fast path, else the regular expression."""
    if text.isascii() and text.isprintable():
        return text
    return _CONTROL.sub(_escape, text) if _CONTROL.search(text) else text


# ASCII text mostly (the fast path), with every code point allowed, surrogates included
_TEXT = st.one_of(
    st.text(st.characters(max_codepoint=0x7F)),
    st.text(st.characters(max_codepoint=0xFF)),
    st.text(st.characters(codec=None, exclude_categories=())),
)


@given(_TEXT)
@example("\x7f")
@example("\x1f")
@example("a\x00")
@example("\x80")
@example("\ud800")
@example("\u2028")
@example("")
def test_escape_controls_escapes_exactly_what_it_did_before(text: str) -> None:
    assert escape_controls(text) == _escape_controls_as_it_was(text)


def record(message: str, *args: object, exc_info: object = None) -> logging.LogRecord:
    return logging.LogRecord("adapter.connection", logging.INFO, "x.py", 1, message, args, exc_info)  # type: ignore[arg-type]


def test_the_text_formatter_escapes_what_the_arguments_hold():
    line = TextFormatter(TEXT_FORMAT).format(
        record("login refused peer=%s user=%s", "10.0.0.1:1", "a\nFORGED")
    )
    assert line.endswith("INFO adapter.connection: login refused peer=10.0.0.1:1 user=a\\nFORGED")
    assert "\n" not in line


def test_a_traceback_keeps_its_lines():
    try:
        raise ValueError("boom")
    except ValueError:
        exc_info = sys.exc_info()
    text = TextFormatter(TEXT_FORMAT).format(record("internal error peer=%s", "x\ny", exc_info=exc_info))
    first, *rest = text.split("\n")
    assert first.endswith("internal error peer=x\\ny")
    assert rest[0] == "Traceback (most recent call last):" and rest[-1] == "ValueError: boom"


def test_the_message_of_an_exception_in_a_traceback_is_escaped():
    """An exception's message may quote what a client sent (a header line, a login): in a
    traceback it stays on its line, as the record's own message does; so does the message of
    the exception it was raised from."""
    try:
        try:
            raise KeyError("login\r\n2030-01-01 00:00:00 INFO adapter: forged")
        except KeyError as cause:
            raise ValueError("bad header line 'passcode:x\nFORGED LINE'") from cause
    except ValueError:
        exc_info = sys.exc_info()
    text = TextFormatter(TEXT_FORMAT).format(record("internal error", exc_info=exc_info))
    lines = text.split("\n")
    assert not any(line.startswith(("FORGED", "2030-01-01")) for line in lines)
    assert lines[-1] == "ValueError: bad header line 'passcode:x\\nFORGED LINE'"
    assert any("login\\r\\n2030-01-01" in line for line in lines)
    assert lines[1] == "Traceback (most recent call last):"
