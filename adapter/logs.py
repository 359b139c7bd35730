"""Log output: the text format and the JSON-lines format (``--log-format``).

Owns how a log record becomes a line.  Text is the classic ``time level logger: message``.  JSON
is one object per line with ``time`` (ISO 8601, UTC), ``level``, ``logger`` and ``message``, plus
the record's structured ``fields`` when the code attached some (the connection opened, logged in
and closed lines carry peer, user, vhost, STOMP version, duration, counts and the close reason as
keys), and ``exception`` with the traceback.  The processes of ``--workers N`` say which worker
wrote a line: ``[worker N pid P]`` in text, ``worker`` and ``pid`` keys in JSON.  Credentials
never reach a record: the code logs user names, never passcodes, and broker URLs only through
``config.redact_url``.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Literal

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


WORKER_TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [worker {worker} pid %(process)d]: %(message)s"


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
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(JsonLinesFormatter(worker))
    else:
        text = TEXT_FORMAT if worker is None else WORKER_TEXT_FORMAT.format(worker=worker)
        handler.setFormatter(logging.Formatter(text))
    logging.basicConfig(level=level, handlers=[handler])
