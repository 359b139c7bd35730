"""Log output: the text format and the JSON-lines format (``--log-format``).

Owns how a log record becomes a line.  Text is the classic ``time level logger: message``.  JSON
is one object per line with ``time`` (ISO 8601, UTC), ``level``, ``logger`` and ``message``, plus
the record's structured ``fields`` when the code attached some (the connection opened, logged in
and closed lines carry peer, user, vhost, STOMP version, duration, counts and the close reason as
keys), and ``exception`` with the traceback.  Text escapes control characters and line
separators in the message (``escape_controls``: what a client sends can reach it), so one record
is one line; JSON escapes them as JSON does.  The processes of ``--workers N`` say which worker
wrote a line: ``[worker N pid P]`` in text, ``worker`` and ``pid`` keys in JSON.  Credentials
never reach a record: the code logs user names, never passcodes, and broker URLs only through
``config.redact_url``.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from datetime import UTC, datetime
from types import TracebackType
from typing import Literal, TypeAlias

_ExcInfo: TypeAlias = (
    tuple[type[BaseException], BaseException, TracebackType | None] | tuple[None, None, None]
)

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


WORKER_TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [worker {worker} pid %(process)d]: %(message)s"


# What a client sends can reach a message (a login, a vhost, a User-Agent ...): line breaks
# (those of str.splitlines too: VT, FF, the separators \x1c-\x1e, NEL, U+2028, U+2029), other
# control characters and terminal escapes, and lone surrogates (bytes that were not UTF-8, which
# stderr could not even encode).  The text format writes them escaped.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
# the control characters of ASCII text (what str.isprintable refuses there), deleted by a
# bytes.translate that is cheaper than isprintable's per-character lookup
_ASCII_CONTROLS = bytes(range(0x20)) + b"\x7f"


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    return _NAMED.get(char) or (f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}")


def escape_controls(text: str) -> str:
    """``text`` on one line: control characters and line separators as ``\\n``, ``\\x1b``,
    ``\\u2028`` ... (a client cannot forge a log line, nor drive a terminal that shows the log)."""
    if text.isascii():  # the usual line: no regular expression
        data = text.encode()
        if len(data.translate(None, _ASCII_CONTROLS)) == len(data):  # no control character
            return text
    return _CONTROL.sub(_escape, text) if _CONTROL.search(text) else text


class TextFormatter(logging.Formatter):
    """The text format: one line per record, whatever its arguments hold (escape_controls).
    A traceback keeps its lines, which are the adapter's own text, but not the messages of its
    exceptions, which may quote what a client sent: those are escaped like the message."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging's name
        record.message = escape_controls(record.message)
        return super().formatMessage(record)

    def formatException(self, ei: _ExcInfo) -> str:  # noqa: N802 - logging's name
        text = super().formatException(ei)
        seen: set[int] = set()
        error: BaseException | None = ei[1]
        while error is not None and id(error) not in seen:  # the chain: __cause__ / __context__
            seen.add(id(error))
            message = str(error)
            escaped = escape_controls(message)
            if escaped != message:
                text = text.replace(message, escaped)
            error = error.__cause__ or error.__context__
        return text


class JsonLinesFormatter(logging.Formatter):
    def __init__(self, worker: int | None = None) -> None:
        super().__init__()
        self._worker = worker

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if self._worker is not None:
            entry["worker"] = self._worker
            entry["pid"] = record.process
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            for key, value in fields.items():
                entry.setdefault(key, value)  # the four keys above are never replaced
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        # default=str: a field that is not JSON (an enum, a path) is written as its text
        return json.dumps(entry, ensure_ascii=False, default=str)


def configure_logging(level: str, log_format: Literal["text", "json"], worker: int | None = None) -> None:
    """``worker``: the slot of a ``--workers`` process, named on every line."""
    # Neither format shows where a record was made (file, line, function) nor the thread: skip
    # collecting them, as the logging HOWTO's "Optimization" section describes.  Finding the
    # caller walks the stack and normalises paths for every record, and every connection writes
    # three INFO lines: this was ~6% of the adapter's work in a connect/disconnect cycle.
    logging._srcfile = None  # the documented switch
    logging.logThreads = False
    logging.logMultiprocessing = False
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(JsonLinesFormatter(worker))
    else:
        text = TEXT_FORMAT if worker is None else WORKER_TEXT_FORMAT.format(worker=worker)
        handler.setFormatter(TextFormatter(text))
    logging.basicConfig(level=level, handlers=[handler])
