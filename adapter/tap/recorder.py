"""The tap's recorder: the bytes of one proxied connection in, recording records out.

Owns how a byte stream becomes the records of docs/recording-format.md: ``open``, ``frame``,
``heartbeats`` and ``close``.  Pure: no sockets, no event loop, no files; the proxy shell
(adapter/tap/proxy.py) feeds it what it forwards and hands the records it emits to the writer.

Framing is the project's own codec (``FrameParser``): the recorder sees a frame exactly where the
adapter would.  The codec hands out headers unescaped and first-occurrence-only, while a
recording keeps the wire's bytes, so the recorder keeps its own copy of what it fed and cuts each
frame out of it by the codec's ``buffered`` count (a public, exact figure of the bytes not yet
returned): the head of that slice is split into header lines as they were, escapes and repeats
included.  The parser never learns a version (``set_version``), so it unescapes nothing and
cannot fail on an escape the upstream accepts; its limits are the tap's own, generous ones.

Tolerance: when the codec refuses the stream (a frame too big, a broken header line), parsing of
that direction stops for good, one ``frame`` record says why (``command`` null, ``error``), and
the bytes keep flowing through the proxy untouched.  Heart-beats (EOLs between frames) are
counted, not recorded one by one: at most one ``heartbeats`` record per direction per second,
and the remainder when the connection closes.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Callable
from typing import Any

from ..stomp.codec import FrameError, FrameLimits, FrameParser

FORMAT_VERSION = 1
REDACTED = "***"
HEARTBEAT_WINDOW = 1.0  # seconds: at most one heartbeats record per connection and direction

Record = dict[str, Any]
# a record and about how many bytes it takes until written (the writer's queue bound counts them)
Emit = Callable[[Record, int], object]
SMALL_RECORD = 256

_BETWEEN_FRAMES = b"\r\n\0"
_BETWEEN_FRAMES_FIRST = frozenset(_BETWEEN_FRAMES)
_skip_between = re.compile(rb"[\r\n\0]*").match


class ParseBudget:
    """The process-wide bound on the bytes every recorder holds while it waits for the rest of a
    frame (each connection is bounded on its own by the frame size limit).  A direction that
    would go past it stops being parsed; the proxy is not affected."""

    __slots__ = ("limit", "held")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0


def split_head(head: bytes) -> tuple[str, list[list[str]]]:
    """The command and the header lines of a frame head, as on the wire: wire order, repeated
    names kept, values still escaped; a line's CR before its LF is line ending, not value."""
    lines = head.split(b"\n")
    command = lines[0].removesuffix(b"\r").decode("utf-8", "surrogateescape")
    headers: list[list[str]] = []
    for line in lines[1:]:
        name, _, value = line.removesuffix(b"\r").partition(b":")
        text = name.decode("utf-8", "surrogateescape")
        headers.append([text, REDACTED if text == "passcode" else value.decode("utf-8", "surrogateescape")])
    return command, headers


def _head_end(buffer: bytearray, start: int, end: int) -> int:
    """Where the head of the frame at ``start`` ends: its blank line (the codec found one)."""
    lf_lf = buffer.find(b"\n\n", start, end)
    lf_crlf = buffer.find(b"\n\r\n", start, lf_lf + 3 if lf_lf >= 0 else end)
    if lf_lf >= 0 and (lf_crlf < 0 or lf_lf < lf_crlf):
        return lf_lf
    return lf_crlf


class DirectionRecorder:
    """One direction of one connection: ``feed`` the bytes as they pass, in order."""

    __slots__ = (
        "_conn",
        "_client",
        "_dir",
        "_emit",
        "_bodies",
        "_parser",
        "_copy",
        "_budget",
        "_held",
        "_heartbeats",
        "_heartbeats_since",
        "_after_frame",
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
        self._parser: FrameParser | None = FrameParser(limits)
        self._copy = bytearray()  # what the parser holds, as it came: the headers' exact bytes
        self._budget = budget
        self._held = 0
        self._heartbeats = 0
        self._heartbeats_since = float("-inf")
        self._after_frame = False
        self.frames = 0
        self.stopped = False

    def feed(self, data: bytes, now: float) -> None:
        parser = self._parser
        if parser is None:
            return
        parser.feed(data)
        copy = self._copy
        copy += data
        while True:
            before = parser.buffered
            try:
                frame = parser.next_frame()
            except FrameError as error:
                self._stop(now, str(error))
                return
            consumed = before - parser.buffered
            if frame is None:
                if consumed:  # heart-beats (and stray NULs) between frames
                    self._between(bytes(copy[:consumed]), now)
                    del copy[:consumed]
                break
            # the frame's head, cut from the copy without copying its body
            start = _skip_between(copy).end() if copy[0] in _BETWEEN_FRAMES_FIRST else 0  # type: ignore[union-attr]  # "*" always matches
            if start:
                self._between(bytes(copy[:start]), now)
            head = bytes(copy[start : _head_end(copy, start, consumed)])
            del copy[:consumed]
            command, headers = split_head(head)
            size = SMALL_RECORD + len(head) + 8 * len(headers)
            record: Record = {
                "v": FORMAT_VERSION,
                "ts": now,
                "conn": self._conn,
                "kind": "frame",
                "client": self._client,
                "dir": self._dir,
                "command": command,
                "headers": headers,
                "body_len": len(frame.body),
            }
            if self._bodies:
                record["body"] = base64.b64encode(frame.body).decode("ascii")
                size += len(record["body"])
            self.frames += 1
            self._after_frame = True
            self._emit(record, size)
        self._account(parser.buffered + len(copy), now)

    def _account(self, held: int, now: float) -> None:
        budget = self._budget
        budget.held += held - self._held
        self._held = held
        if held and budget.held > budget.limit:
            self._stop(
                now,
                f"the tap's parse buffers are full (--parse-buffer-bytes {budget.limit}): "
                f"this direction holds {held} bytes of an incomplete frame",
            )

    def _between(self, run: bytes, now: float) -> None:
        """EOLs (and stray NULs) between frames: heart-beats, except the one EOL that ends the
        frame before them (the adapter and the plugins end every frame with NUL LF)."""
        count = run.count(b"\n")
        if self._after_frame and (run[:1] == b"\n" or run[:2] == b"\r\n"):
            count -= 1
        self._after_frame = False
        if not count:
            return
        self._heartbeats += count
        if now - self._heartbeats_since >= HEARTBEAT_WINDOW:
            self._flush_heartbeats(now)

    def _flush_heartbeats(self, now: float) -> None:
        if self._heartbeats:
            self._emit(
                {
                    "v": FORMAT_VERSION,
                    "ts": now,
                    "conn": self._conn,
                    "kind": "heartbeats",
                    "dir": self._dir,
                    "count": self._heartbeats,
                },
                SMALL_RECORD,
            )
            self._heartbeats = 0
            self._heartbeats_since = now

    def _stop(self, now: float, error: str) -> None:
        """Parsing of this direction ends here; its buffers are let go."""
        self._parser = None
        self._copy = bytearray()
        self._account(0, now)
        self.stopped = True
        self._emit(
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
            },
            SMALL_RECORD + len(error),
        )

    def finish(self, now: float) -> None:
        """The connection is over: pending heart-beats are recorded, and a frame cut off by the
        close is recorded as one the codec could not parse."""
        self._flush_heartbeats(now)
        parser = self._parser
        if parser is None:
            return
        rest = self._copy.lstrip(_BETWEEN_FRAMES)
        if rest:
            self._stop(now, f"connection closed in the middle of a frame ({len(rest)} bytes of it)")
        else:
            self._account(0, now)
            self._parser = None


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
            {
                "v": FORMAT_VERSION,
                "ts": now,
                "conn": conn,
                "kind": "open",
                "client": client,
                "listen": listen,
                "upstream": upstream,
                "tls": tls,
            },
            SMALL_RECORD,
        )

    def close(self, now: float, *, by: str, reason: str, bytes_in: int, bytes_out: int) -> None:
        if self._closed:
            return
        self._closed = True
        self.inbound.finish(now)
        self.outbound.finish(now)
        self._emit(
            {
                "v": FORMAT_VERSION,
                "ts": now,
                "conn": self.conn,
                "kind": "close",
                "by": by,
                "reason": reason,
                "bytes_in": bytes_in,
                "bytes_out": bytes_out,
            },
            SMALL_RECORD + len(reason),
        )
