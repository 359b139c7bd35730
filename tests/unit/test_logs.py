"""adapter/logs.py's text format: one record is one line, whatever a client put in it."""

from __future__ import annotations

import logging
import sys

import pytest

from adapter.logs import TEXT_FORMAT, TextFormatter, escape_controls


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
