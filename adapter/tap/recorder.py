"""The tap's recorder: the bytes of one proxied connection in, recording records out.

Owns how a byte stream becomes the records of docs/recording-format.md: ``open``, ``frame``,
``heartbeats`` and ``close``.  Pure: no sockets, no event loop, no files; the proxy shell
(adapter/tap/proxy.py) feeds it what it forwards and hands the records it emits to the writer,
one batch (a list) per read, so the writer's queue sees one put per read, not one per frame.

Framing is the project's own STOMP framing (``FrameScanner``, adapter/stomp/scanner.py: the
codec's rules and limits, applied passively): the recorder sees a frame exactly where the adapter
would, gets each frame's header lines as they were on the wire (escapes and repeats included),
and never holds a body it does not record: without ``--record-bodies`` a body in flight is only
counted.  Nothing is unescaped, so no escape the upstream accepts can fail; the limits are the
tap's own, generous ones.

Tolerance: when the scanner refuses the stream (a frame too big, a broken header line), parsing of
that direction stops for good, one ``frame`` record says why (``command`` null, ``error``), and
the bytes keep flowing through the proxy untouched.  Heart-beats (EOLs between frames) are
counted, not recorded one by one: at most one ``heartbeats`` record per direction per second,
and the remainder when the connection closes.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

from ..stomp.codec import FrameError, FrameLimits
from ..stomp.scanner import FrameScanner, ScannedFrame

FORMAT_VERSION = 1
REDACTED = "***"
HEARTBEAT_WINDOW = 1.0  # seconds: at most one heartbeats record per connection and direction

Record = dict[str, Any]
# a batch of records and about how many bytes they take until written (the writer's queue bound
# counts them)
Emit = Callable[[list[Record], int], object]
SMALL_RECORD = 256


class ParseBudget:
    """The process-wide bound on the bytes every recorder holds while it waits for the rest of a
    frame (each connection is bounded on its own by the frame size limit).  A direction that
    would go past it stops being parsed; the proxy is not affected."""

    __slots__ = ("limit", "held")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0


class DirectionRecorder:
    """One direction of one connection: ``feed`` the bytes as they pass, in order."""

    __slots__ = (
        "_conn",
        "_client",
        "_dir",
        "_emit",
        "_bodies",
        "_scanner",
        "_budget",
        "_held",
        "_heartbeats_seen",
        "_heartbeats_since",
        "frames",
        "stopped",
    )

    def __init__(
        self,
        conn: str,
        client: str,
        direction: str,
        emit: Emit,
        *,
        bodies: bool,
        limits: FrameLimits,
        budget: ParseBudget,
    ) -> None:
        self._conn = conn
        self._client = client
        self._dir = direction
        self._emit = emit
        self._bodies = bodies
        self._scanner: FrameScanner | None = FrameScanner(limits, bodies=bodies, redact="passcode")
        self._budget = budget
        self._held = 0
        self._heartbeats_seen = 0  # the scanner's count when the last heartbeats record was made
        self._heartbeats_since = float("-inf")
        self.frames = 0
        self.stopped = False

    def feed(self, data: bytes, now: float) -> None:
        scanner = self._scanner
        if scanner is None:
            return
        found: list[ScannedFrame] = []
        error = None
        try:
            scanner.feed(data, found)
        except FrameError as refused:
            error = str(refused)
        records: list[Record] = []
        size = 0
        if found:
            conn, client, direction = self._conn, self._client, self._dir
            for command, headers, head_len, body_len, body in found:
                record: Record = {
                    "v": FORMAT_VERSION,
                    "ts": now,
                    "conn": conn,
                    "kind": "frame",
                    "client": client,
                    "dir": direction,
                    "command": command,
                    "headers": headers,
                    "body_len": body_len,
                }
                size += SMALL_RECORD + head_len + 8 * len(headers)
                if body is not None:
                    record["body"] = encoded = base64.b64encode(body).decode("ascii")
                    size += len(encoded)
                records.append(record)
            self.frames += len(found)
        if scanner.heartbeats != self._heartbeats_seen and now - self._heartbeats_since >= HEARTBEAT_WINDOW:
            size += self._heartbeats_record(records, now)
        if error is not None:
            size += self._stop(records, now, error)
        elif scanner.held != self._held:
            size += self._account(scanner.held, now, records)
        if records:
            self._emit(records, size)

    def _account(self, held: int, now: float, records: list[Record]) -> int:
        budget = self._budget
        budget.held += held - self._held
        self._held = held
        if not held or budget.held <= budget.limit:
            return 0
        return self._stop(
            records,
            now,
            f"the tap's parse buffers are full (--parse-buffer-bytes {budget.limit}): "
            f"this direction holds {held} bytes of an incomplete frame",
        )

    def _heartbeats_record(self, records: list[Record], now: float) -> int:
        assert self._scanner is not None
        seen = self._scanner.heartbeats
        records.append(
            {
                "v": FORMAT_VERSION,
                "ts": now,
                "conn": self._conn,
                "kind": "heartbeats",
                "dir": self._dir,
                "count": seen - self._heartbeats_seen,
            }
        )
        self._heartbeats_seen = seen
        self._heartbeats_since = now
        return SMALL_RECORD

    def _stop(self, records: list[Record], now: float, error: str) -> int:
        """Parsing of this direction ends here; its buffers are let go."""
        self._scanner = None
        budget = self._budget
        budget.held -= self._held
        self._held = 0
        self.stopped = True
        records.append(
            {
                "v": FORMAT_VERSION,
                "ts": now,
                "conn": self._conn,
                "kind": "frame",
                "client": self._client,
                "dir": self._dir,
                "command": None,
                "error": error,
                "headers": [],
                "body_len": 0,
            }
        )
        return SMALL_RECORD + len(error)

    def finish(self, now: float) -> None:
        """The connection is over: pending heart-beats are recorded, and a frame cut off by the
        close is recorded as one the scanner could not parse."""
        scanner = self._scanner
        if scanner is None:
            return
        records: list[Record] = []
        size = 0
        if scanner.heartbeats != self._heartbeats_seen:
            size += self._heartbeats_record(records, now)
        rest = scanner.incomplete
        if rest:
            size += self._stop(
                records, now, f"connection closed in the middle of a frame ({rest} bytes of it)"
            )
        else:
            self._account(0, now, records)
            self._scanner = None
        if records:
            self._emit(records, size)


class ConnectionRecorder:
    """One proxied connection: its ``open`` record, both directions, and its ``close`` record."""

    __slots__ = ("conn", "client", "inbound", "outbound", "_emit", "_closed")

    def __init__(
        self,
        conn: str,
        *,
        client: str,
        listen: str,
        upstream: str,
        tls: bool,
        emit: Emit,
        bodies: bool,
        limits: FrameLimits,
        budget: ParseBudget,
        now: float,
    ) -> None:
        self.conn = conn
        self.client = client
        self._emit = emit
        self._closed = False
        self.inbound = DirectionRecorder(
            conn, client, "in", emit, bodies=bodies, limits=limits, budget=budget
        )
        self.outbound = DirectionRecorder(
            conn, client, "out", emit, bodies=bodies, limits=limits, budget=budget
        )
        emit(
            [
                {
                    "v": FORMAT_VERSION,
                    "ts": now,
                    "conn": conn,
                    "kind": "open",
                    "client": client,
                    "listen": listen,
                    "upstream": upstream,
                    "tls": tls,
                }
            ],
            SMALL_RECORD,
        )

    def close(self, now: float, *, by: str, reason: str, bytes_in: int, bytes_out: int) -> None:
        if self._closed:
            return
        self._closed = True
        self.inbound.finish(now)
        self.outbound.finish(now)
        self._emit(
            [
                {
                    "v": FORMAT_VERSION,
                    "ts": now,
                    "conn": self.conn,
                    "kind": "close",
                    "by": by,
                    "reason": reason,
                    "bytes_in": bytes_in,
                    "bytes_out": bytes_out,
                }
            ],
            SMALL_RECORD + len(reason),
        )
