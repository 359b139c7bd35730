"""A recording of the tap read without Spark, in time order, for ``replay``.

Owns the reading side of docs/recording-format.md for one process: every finished file of the
directory (``*.jsonl.gz``; names starting with a dot, the file being written, are skipped as
Spark skips them), the ``frame`` and ``close`` records in time order, and the check that a
recording to replay has the bodies of the frames the clients sent.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import json
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Event", "RecordingError", "load_conversations"]


class RecordingError(Exception):
    """The recording cannot be used (missing, unreadable, or without the bodies it needs)."""


@dataclass(frozen=True, slots=True)
class Event:
    """One frame (``kind`` ``frame``) or the end of a connection (``kind`` ``close``)."""

    ts: float
    conn: str
    kind: str
    client: str = ""
    direction: str = ""
    command: str | None = None
    headers: tuple[tuple[str, str], ...] = ()
    body: bytes | None = None
    body_len: int = 0
    closed_by: str = ""
    # what the tap left out of this record to keep it within --max-record-bytes ("body",
    # "headers", "command": docs/recording-format.md); () for a whole record
    omitted: tuple[str, ...] = ()

    def header(self, name: str) -> str | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None


def _event(record: dict[str, object]) -> Event | None:
    kind = record.get("kind")
    ts = float(record.get("ts") or 0.0)  # type: ignore[arg-type]
    conn = str(record.get("conn"))
    if kind == "close":
        return Event(ts, conn, "close", closed_by=str(record.get("by") or ""))
    if kind != "frame":
        return None
    raw_body = record.get("body")
    body = None
    if isinstance(raw_body, str):
        try:
            body = base64.b64decode(raw_body, validate=True)
        except binascii.Error as error:
            raise RecordingError(f"connection {conn}: a body is not base64 ({error})") from None
    headers = record.get("headers")
    pairs = tuple(
        (str(pair[0]), str(pair[1]))
        for pair in (headers if isinstance(headers, list) else ())
        if len(pair) >= 2
    )
    command = record.get("command")
    return Event(
        ts,
        conn,
        "frame",
        client=str(record.get("client") or ""),
        direction=str(record.get("dir") or ""),
        command=command if isinstance(command, str) else None,
        headers=pairs,
        body=body,
        body_len=int(record.get("body_len") or 0),  # type: ignore[call-overload]
        omitted=tuple(str(what) for what in omitted)
        if isinstance(omitted := record.get("omitted"), list)
        else (),
    )


def load_conversations(directory: Path, *, need_bodies: bool) -> list[Event]:
    """The frames and closes of the recording in ``directory``, in time order (the order of
    the files, then of the lines, for equal times).

    ``need_bodies``: raise RecordingError when a client frame with a body has none recorded (the
    tap records bodies only with ``--record-bodies``).
    """
    if not directory.is_dir():
        raise RecordingError(f"{directory} is not a directory")
    files = sorted(p for p in directory.glob("*.jsonl.gz") if not p.name.startswith("."))
    if not files:
        raise RecordingError(f"no recording files (*.jsonl.gz) in {directory}")
    events: list[Event] = []
    missing = 0
    for path in files:
        try:
            with gzip.open(path, "rt", encoding="utf-8") as lines:
                for line in lines:
                    if not line.strip():
                        continue
                    event = _event(json.loads(line))
                    if event is None:
                        continue
                    if (
                        event.direction == "in"
                        and event.body is None
                        and event.body_len > 0
                        and "body" not in event.omitted
                    ):
                        missing += 1  # (a body the tap left out for its size is replayed as filler)
                    events.append(event)
        except (OSError, EOFError, json.JSONDecodeError) as error:
            raise RecordingError(f"{path.name}: {error}") from None
    if need_bodies and missing:
        raise RecordingError(
            f"the recording has no bodies ({missing} client frames with a body recorded without it): "
            "replay needs a recording made with the tap's --record-bodies"
        )
    events.sort(key=lambda e: e.ts)  # stable: equal times keep the file and line order
    return events
