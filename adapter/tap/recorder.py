"""The tap's recorder: the bytes of one proxied connection in, recording records out.

Owns how a byte stream becomes the records of docs/recording-format.md (``open``, ``frame``,
``heartbeats`` and ``close``) and their JSON Lines text.  Pure: no sockets, no event loop, no
files; the proxy shell (adapter/tap/proxy.py) feeds it what it forwards and hands the text it
emits to the writer, one batch of lines per read, so the writer's queue sees one put per read,
not one per frame.

Why the records are text already here, in the event loop, and not dicts for the writer thread:
both run under the one interpreter lock, so the work costs the proxy the same wherever it is done,
but a dict with its lists of headers, waiting tens of milliseconds in the queue, outlives the
young generation of the garbage collector and makes its full collections (milliseconds each, in
the event loop) frequent; a string is not tracked at all.  A ``frame`` line is built from a
template: the connection's constant part is made once, the time's text once per read, and the
headers of a plain head (printable ASCII, no ``"`` or ``\\``, no passcode) are turned into JSON by
plain string replacements; anything else goes through the C JSON encoder, with the same output.

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
import json
import re
from collections.abc import Callable
from typing import Any

from ..stomp.codec import FrameError, FrameLimits
from ..stomp.scanner import FrameScanner, ScannedFrame, header_pairs

FORMAT_VERSION = 1
REDACTED = "***"
# a passcode header line quoted in an error text, up to the end of its quoted bytes
_PASSCODE_IN_ERROR = re.compile(r"passcode:[^'\"]*")
HEARTBEAT_WINDOW = 1.0  # seconds: at most one heartbeats record per connection and direction

Record = dict[str, Any]
# a batch of records of one connection: its id, their JSON Lines text (each line ends with LF),
# how many records it holds
Emit = Callable[[str, str, int], object]


def _json_encoder() -> Callable[[object], str]:
    """Compact, ASCII-only JSON (``ensure_ascii``: \\udcXX for the surrogate escapes of
    non-UTF-8 bytes), with CPython's C encoder made once: ``json.dumps`` makes one per call."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # no C accelerator: the pure-Python encoder, same output
        return json.JSONEncoder(separators=(",", ":")).encode
    encoder = make(None, None, json.encoder.encode_basestring_ascii, None, ":", ",", False, False, True)

    def encode(value: object) -> str:
        return "".join(encoder(value, 0))

    return encode


encode_json = _json_encoder()
_string = json.encoder.encode_basestring_ascii


def headers_json(lines: list[str]) -> str:
    """The ``headers`` field of a frame record: the scanned header lines as JSON pairs, passcode
    values redacted; the text ``encode_json`` gives for ``header_pairs``, made faster when it can:
    text that JSON writes as it is (printable ASCII but '"' and '\\') needs no encoder."""
    if not lines:
        return "[]"
    text = "".join(lines)
    if (
        text.isascii()
        and text.isprintable()
        and '"' not in text
        and "\\" not in text
        and "passcode" not in text
    ):
        return '[["' + '"],["'.join([line.replace(":", '","', 1) for line in lines]) + '"]]'
    pairs = header_pairs(lines)
    for pair in pairs:
        if pair[0] == "passcode":
            pair[1] = REDACTED
    return encode_json(pairs)


def line(record: Record) -> str:
    return encode_json(record) + "\n"


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
        "_prefix",
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
        self._scanner: FrameScanner | None = FrameScanner(limits, bodies=bodies)
        # a frame line's part after its time, up to its command: the same for all of them
        self._prefix = (
            f',"conn":{_string(conn)},"kind":"frame","client":{_string(client)},'
            f'"dir":{_string(direction)},"command":'
        )
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
        lines: list[str] = []
        if found:
            start = f'{{"v":{FORMAT_VERSION},"ts":{float.__repr__(now)}{self._prefix}'
            for command, headers, _, body_len, body in found:
                text = f'{start}{_string(command)},"headers":{headers_json(headers)},"body_len":{body_len}'
                if body is not None:
                    text += ',"body":"' + base64.b64encode(body).decode("ascii") + '"'
                lines.append(text + "}\n")
            self.frames += len(found)
        if scanner.heartbeats != self._heartbeats_seen and now - self._heartbeats_since >= HEARTBEAT_WINDOW:
            self._heartbeats_record(lines, now)
        if error is not None:
            self._stop(lines, now, error)
        elif scanner.held != self._held:
            self._account(scanner.held, now, lines)
        if lines:
            self._emit(self._conn, "".join(lines), len(lines))

    def _account(self, held: int, now: float, lines: list[str]) -> None:
        budget = self._budget
        budget.held += held - self._held
        self._held = held
        if held and budget.held > budget.limit:
            self._stop(
                lines,
                now,
                f"the tap's parse buffers are full (--parse-buffer-bytes {budget.limit}): "
                f"this direction holds {held} bytes of an incomplete frame",
            )

    def _heartbeats_record(self, lines: list[str], now: float) -> None:
        assert self._scanner is not None
        seen = self._scanner.heartbeats
        lines.append(
            line(
                {
                    "v": FORMAT_VERSION,
                    "ts": now,
                    "conn": self._conn,
                    "kind": "heartbeats",
                    "dir": self._dir,
                    "count": seen - self._heartbeats_seen,
                }
            )
        )
        self._heartbeats_seen = seen
        self._heartbeats_since = now

    def _stop(self, lines: list[str], now: float, error: str) -> None:
        """Parsing of this direction ends here; its buffers are let go.  The error may quote the
        header line it could not read: a passcode's value is redacted there as in the headers."""
        if "passcode:" in error:
            error = _PASSCODE_IN_ERROR.sub("passcode:" + REDACTED, error)
        self._scanner = None
        budget = self._budget
        budget.held -= self._held
        self._held = 0
        self.stopped = True
        lines.append(
            line(
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
        )

    def finish(self, now: float) -> None:
        """The connection is over: pending heart-beats are recorded, and a frame cut off by the
        close is recorded as one the scanner could not parse."""
        scanner = self._scanner
        if scanner is None:
            return
        lines: list[str] = []
        if scanner.heartbeats != self._heartbeats_seen:
            self._heartbeats_record(lines, now)
        rest = scanner.incomplete
        if rest:
            self._stop(lines, now, f"connection closed in the middle of a frame ({rest} bytes of it)")
        else:
            self._account(0, now, lines)
            self._scanner = None
        if lines:
            self._emit(self._conn, "".join(lines), len(lines))


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
            conn,
            line(
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
            ),
            1,
        )

    def close(self, now: float, *, by: str, reason: str, bytes_in: int, bytes_out: int) -> None:
        if self._closed:
            return
        self._closed = True
        self.inbound.finish(now)
        self.outbound.finish(now)
        self._emit(
            self.conn,
            line(
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
            ),
            1,
        )
