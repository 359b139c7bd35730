"""The tap's recorder: the bytes of one proxied connection in, recording records out.

Owns how a byte stream becomes the records of docs/recording-format.md (``open``, ``frame``,
``heartbeats`` and ``close``) and their JSON Lines text.  Pure: no sockets, no event loop, no
files; the proxy shell (adapter/tap/proxy.py) feeds it each read it forwards, and the reads are
recorded later, together (``Batches``: every 20 ms, or sooner past a bound on the bytes waiting):
one scan, one JSON pass over all their heads and one batch for the writer per flush, not per
read or per frame.  Each frame keeps the time of the read that completed it (to the microsecond).

Why the records are text already here, in the event loop, and not dicts for the writer thread:
both run under the one interpreter lock, so the work costs the proxy the same wherever it is done,
but a dict with its lists of headers, waiting tens of milliseconds in the queue, outlives the
young generation of the garbage collector and makes its full collections (milliseconds each, in
the event loop) frequent; a string is not tracked at all.  A ``frame`` line is built from a
template: the connection's constant part is made once, the time's text once per read, and the
heads the scanner calls plain (printable ASCII, no ``"`` or ``\\``), without a passcode, are turned
into JSON by string replacements over all of them at once (``heads_json``); anything else goes
through the C JSON encoder, with the same output.

Framing is the project's own STOMP framing (``FrameScanner``, adapter/stomp/scanner.py: the
codec's rules and limits, applied passively): the recorder sees a frame exactly where the adapter
would, gets each frame's header lines as they were on the wire (escapes and repeats included),
and never holds a body it does not record: without ``--record-bodies`` a body in flight is only
counted.  Nothing is unescaped, so no escape the upstream accepts can fail; the limits are the
tap's own, generous ones.

Bounds: a record is never made bigger than ``max_record_bytes`` (``--max-record-bytes``): its size
is bounded before it is made (``head_json_bound``: from a few C-level counts of the head, not
from its JSON), and a frame whose record could be bigger is recorded without its headers (and
body), with ``omitted``.  A control character is six characters of JSON, so a head's JSON can
be six times the head: it is not made to find that out.  The records of a flush are made one
after the other and go to the writer's bounded queue (``--queue-bytes``) before the next flush,
so what records cost the process is that queue, plus one flush's records.

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
from bisect import bisect_left
from collections.abc import Callable
from itertools import accumulate, repeat
from typing import Any

from ..stomp.codec import FrameError, FrameLimits
from ..stomp.scanner import OTHER, PLAIN, FrameScanner, ScannedFrame, header_pairs, split_head

FORMAT_VERSION = 1
REDACTED = "***"
# the word in a text that may quote a passcode line (an error text, an upstream's ERROR): what
# follows it is never recorded, whatever its bytes (a bare CR, quotes, escapes: a redaction that
# stopped at a quote let the rest of a passcode through)
_PASSCODE_WORD = re.compile("passcode", re.IGNORECASE)
_PASSCODE_WORD_BYTES = re.compile(b"passcode", re.IGNORECASE)
HEARTBEAT_WINDOW = 1.0  # seconds: at most one heartbeats record per connection and direction
MAX_RECORD_BYTES = 16 * 1024 * 1024  # the default of --max-record-bytes
# a frame record's text but its command, headers and body (its time, connection, client,
# direction, body length and ``omitted``), on top of the length of those names and values
_RECORD_FRAME = 160
# the bytes JSON writes as they are (printable ASCII but '"' and '\\'): any other byte of a head
# is at most six characters of JSON (\u0001, \udcff for a byte that is not UTF-8)
_JSON_AS_IS = bytes(c for c in range(0x20, 0x7F) if c not in b'"\\')
_COUNT_SLICE = 64 * 1024
# what a command line longer than its record can hold is cut to
_COMMAND_KEPT = 1024

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


def redact_text(text: str) -> str:
    """``text`` cut after its first "passcode" (in any case), then ``:***``; as it is without one."""
    found = _PASSCODE_WORD.search(text)
    return text if found is None else text[: found.end()] + ":" + REDACTED


def redact_body(body: bytes) -> bytes:
    """``redact_text`` for the bytes of an ERROR's body."""
    found = _PASSCODE_WORD_BYTES.search(body)
    return body if found is None else body[: found.end()] + b":" + REDACTED.encode()


def headers_json(lines: list[str], *, error: bool = False) -> str:
    """The ``headers`` field of a frame record: the scanned header lines as JSON pairs, passcode
    values redacted; the text ``encode_json`` gives for ``header_pairs``, made faster when it can:
    text that JSON writes as it is (printable ASCII but '"' and '\\') needs no encoder.

    ``error``: the lines of an ERROR, whose texts may quote a client's passcode line: each line
    is cut after the word passcode (``redact_text``) before it is split into name and value."""
    if not lines:
        return "[]"
    text = "".join(lines)
    if (
        text.isascii()
        and text.isprintable()
        and '"' not in text
        and "\\" not in text
        and "passcode" not in text
        and not (error and _PASSCODE_WORD.search(text))
    ):
        return '[["' + '"],["'.join([line.replace(":", '","', 1) for line in lines]) + '"]]'
    pairs = header_pairs([redact_text(line) for line in lines] if error else lines)
    for pair in pairs:
        if pair[0] == "passcode":
            pair[1] = REDACTED
    return encode_json(pairs)


def heads_json(heads: list[bytes], plain: int) -> list[str]:
    """For each scanned head, the part of its ``frame`` record from its command to its headers
    (``"CMD","headers":[...]``): the text ``headers_json`` gives for it.

    ``plain`` is what the scanner said of these heads (adapter/stomp/scanner.py): PLAIN or SAFE
    heads (printable ASCII, no '"' or '\\') without a passcode are made all at once: joined into
    one text, a ':' before each command line and an empty line between heads (a head has none:
    it ends at its first blank line), a ':' becomes '","' (for SAFE heads, only the first of
    each line) and an LF '"],["', and the text is split again where the empty lines were.  A
    handful of C calls however many frames; any other head is made on its own.
    """
    if plain != OTHER:
        joined = b":" + b"\n\n:".join(heads)
        # an ERROR's texts are redacted whatever the case of the word (``headers_json``)
        if joined.find(b"passcode") < 0 and joined.find(b":ERROR") < 0:
            if plain == PLAIN:
                text = joined.replace(b":", b'","').replace(b"\n", b'"],["').decode("ascii")
            else:  # a ':' in a value: only the first of each line separates
                text = '"],["'.join(
                    map(str.replace, joined.decode("ascii").split("\n"), _COLON, _NAME_VALUE, _ONCE)
                )
            made = []
            for part in text[3:].split('"],[""],["","'):
                command, separator, pairs = part.partition('"],["')
                made.append(
                    f'"{command}","headers":[["{pairs}"]]' if separator else f'"{command}","headers":[]'
                )
            return made
    return [_head_json(head) for head in heads]


_COLON = repeat(":")
_NAME_VALUE = repeat('","')
_ONCE = repeat(1)


def _head_json(head: bytes) -> str:
    command, header_lines = split_head(head)
    return f'{_string(command)},"headers":{headers_json(header_lines, error=command == "ERROR")}'


def head_json_bound(head: bytes) -> int:
    """An upper bound of the length of a head's JSON (what ``heads_json`` makes of it) without
    making it: each byte JSON writes as more than itself is at most six characters, and a line
    at most ten more (its separators, a passcode value's ``***``, a redaction's text).  The
    head is counted in slices, so the count allocates ``_COUNT_SLICE`` bytes at most."""
    escaped = sum(
        [
            len(head[start : start + _COUNT_SLICE].translate(None, _JSON_AS_IS))
            for start in range(0, len(head), _COUNT_SLICE)
        ]
    )
    return len(head) + 5 * escaped + 10 * (head.count(b"\n") + 1) + 16


def _is_error(head: bytes) -> bool:
    return head.startswith(b"ERROR") and head[5:6] in (b"", b"\n", b"\r")


_REDACTED_BYTES = REDACTED.encode()
_TOKEN_DESTINATION = b"/auth/token"
# a destination header line and its value (without the line's end)
_DESTINATION_LINE = re.compile(rb"\ndestination:([^\n]*)")


def _is_token_refresh(head: bytes) -> bool:
    """A SEND to the reserved /auth/token: its body is a token, recorded as ``***``.  Any
    destination line counts whose value, stripped of white space (STOMP 1.0 trims a value's
    leading white space, as ``str.lstrip`` after decoding: adapter/stomp/codec.py), is that:
    a body recorded as ``***`` too many is harmless, a token recorded once is not."""
    if not head.startswith(b"SEND") or _TOKEN_DESTINATION not in head:
        return False
    return any(
        value.decode("utf-8", "surrogateescape").strip() == "/auth/token"
        for value in _DESTINATION_LINE.findall(head)
    )


def _base64_length(size: int) -> int:
    return 4 * ((size + 2) // 3)


def _command_only_json(head: bytes, room: int) -> tuple[str, bool]:
    """A head's ``"CMD","headers":[]`` for a record without its headers; the command is cut to
    ``_COMMAND_KEPT`` bytes when even it could pass ``room`` (True: it was cut)."""
    end = head.find(b"\n")
    command = head if end < 0 else head[:end]  # not partition: that would copy the rest too
    cut = 6 * len(command) + 32 > room
    command = command[:_COMMAND_KEPT] if cut else command.removesuffix(b"\r")
    return f'{_string(command.decode("utf-8", "surrogateescape"))},"headers":[]', cut


def _seconds(ns: int) -> str:
    """A time in nanoseconds as JSON seconds, to the microsecond: cheaper than a float's text."""
    text = str(ns)
    if len(text) < 10:  # before 1970-01-01T00:00:01Z: only in tests
        return f"{ns / 1e9:.6f}"
    return f"{text[:-9]}.{text[-9:-3]}"


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


class Batches:
    """The directions holding reads not yet recorded, all connections together, and their bytes.

    The proxy hands a recorder each read as it forwards it (``DirectionRecorder.feed``: two list
    appends); the reads are scanned and their records made later, together, by ``flush``: once
    per ``FLUSH_SECONDS`` (the shell's timer, armed by ``wake`` when the first read waits), at
    once for a direction holding ``direction_limit`` bytes, and for every direction when all of
    them hold more than ``limit``.  So the per-read work of the scan and of the records (a call
    into the scanner, the time's text, one batch for the writer) is paid per flush, and the
    bytes held for it are bounded per connection and process-wide.
    """

    __slots__ = ("limit", "direction_limit", "held", "waiting", "_wake")

    def __init__(self, wake: Callable[[], object], *, limit: int, direction_limit: int) -> None:
        self._wake = wake
        self.limit = limit
        self.direction_limit = direction_limit
        self.held = 0  # bytes of the reads waiting, all directions
        self.waiting: list[DirectionRecorder] = []

    def add(self, direction: DirectionRecorder) -> None:
        """``direction`` holds reads now (it had none since its last flush)."""
        self.waiting.append(direction)
        if len(self.waiting) == 1:
            self._wake()

    def flush(self) -> None:
        """Record every read waiting."""
        waiting, self.waiting = self.waiting, []
        for direction in waiting:
            direction.flush()


class DirectionRecorder:
    """One direction of one connection: ``feed`` the bytes as they pass, in order; ``flush``
    (or the ``Batches``) turns them into records."""

    __slots__ = (
        "_conn",
        "_client",
        "_dir",
        "_emit",
        "_bodies",
        "_scanner",
        "_prefix",
        "_budget",
        "_batches",
        "_room",
        "_reads",
        "_times",
        "_waiting",
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
        batches: Batches,
        max_record_bytes: int = MAX_RECORD_BYTES,
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
        self._batches = batches
        # what a frame's command, headers and body may take of its record
        self._room = max_record_bytes - len(self._prefix) - _RECORD_FRAME
        self._reads: list[bytes] = []  # the reads not recorded yet, and when each came
        self._times: list[int] = []
        self._waiting = 0  # their bytes
        self._held = 0
        self._heartbeats_seen = 0  # the scanner's count when the last heartbeats record was made
        self._heartbeats_since = float("-inf")
        self.frames = 0
        self.stopped = False

    def feed(self, data: bytes, now_ns: int) -> None:
        """A read, as it passed at ``now_ns`` (``time.time_ns()``): kept for the next flush.  This
        is the proxy's per-read cost of the recording."""
        if self._scanner is None:
            return
        reads = self._reads
        if not reads:
            self._batches.add(self)
        reads.append(data)
        self._times.append(now_ns)
        size = len(data)
        self._waiting += size
        batches = self._batches
        batches.held += size
        if self._waiting >= batches.direction_limit:
            self.flush()
        elif batches.held > batches.limit:
            batches.flush()

    def flush(self) -> None:
        """Scan the reads kept and emit their records (one batch for the writer)."""
        reads = self._reads
        if not reads:
            return
        times = self._times
        self._reads, self._times = [], []
        self._batches.held -= self._waiting
        self._waiting = 0
        scanner = self._scanner
        if scanner is None:
            return
        data = reads[0] if len(reads) == 1 else b"".join(reads)
        now = times[-1] / 1e9
        found: list[ScannedFrame] = []
        error = None
        plain = OTHER
        try:
            plain = scanner.feed(data, found)
        except FrameError as refused:
            error = str(refused)
        lines: list[str] = []
        if found:
            self._frame_lines(found, plain, reads, times, lines)
        if scanner.heartbeats != self._heartbeats_seen and now - self._heartbeats_since >= HEARTBEAT_WINDOW:
            self._heartbeats_record(lines, now)
        if error is not None:
            self._stop(lines, now, error)
        elif scanner.held != self._held:
            self._account(scanner.held, now, lines)
        if lines:
            self._emit(self._conn, "".join(lines), len(lines))

    def _frame_lines(
        self, found: list[ScannedFrame], plain: int, reads: list[bytes], times: list[int], lines: list[str]
    ) -> None:
        """The ``frame`` records of ``found``, each with the time of the read that completed it."""
        prefix = self._prefix
        heads = [frame[0] for frame in found]
        # a head is at most six times its size in JSON, a body 4/3 in base64: most flushes
        # cannot come near the bound, and only the others look at each frame
        worst = 6 * max(map(len, heads)) + 16
        if self._bodies:
            worst += _base64_length(max([frame[1] for frame in found]))
        omitted: list[str] | None = None
        if worst <= self._room:
            made = heads_json(heads, plain)
        else:
            made, omitted = self._bounded_heads(found, plain)
        if len(reads) == 1:
            ends: list[int] = []
            start = f'{{"v":{FORMAT_VERSION},"ts":{_seconds(times[0])}{prefix}'
        else:
            ends = list(accumulate(map(len, reads)))
        read = -1
        append = lines.append
        if omitted is not None:  # some records leave something out
            made = [
                f'{head_json},"omitted":{what}' if what else head_json
                for head_json, what in zip(made, omitted, strict=True)
            ]
            found = [
                (head, body_len, None, end) if what else (head, body_len, body, end)
                for (head, body_len, body, end), what in zip(found, omitted, strict=True)
            ]
        for (head, body_len, body, end), head_json in zip(found, made, strict=True):
            if ends and (read < 0 or end > ends[read]):
                read = bisect_left(ends, end, read + 1)
                start = f'{{"v":{FORMAT_VERSION},"ts":{_seconds(times[read])}{prefix}'
            if body is None:
                append(f'{start}{head_json},"body_len":{body_len}}}\n')
            else:
                if _is_error(head):  # the upstream's own text: it may quote a passcode line
                    body = redact_body(body)
                elif _is_token_refresh(head):  # an OAuth 2.0 token (SEND to /auth/token)
                    body = _REDACTED_BYTES
                append(
                    f'{start}{head_json},"body_len":{body_len},"body":"'
                    + base64.b64encode(body).decode("ascii")
                    + '"}\n'
                )
        self.frames += len(found)

    def _bounded_heads(self, found: list[ScannedFrame], plain: int) -> tuple[list[str], list[str]]:
        """``heads_json`` of the frames whose headers fit ``max_record_bytes``, their command only
        for the others; and per frame the JSON list of what its record leaves out ("" for
        nothing): its body when only the headers fit, else its headers and body (and the
        command's end when even the command could not fit)."""
        room = self._room
        sizes = [
            size if size <= room else head_json_bound(head)
            for head, size in ((frame[0], 6 * len(frame[0]) + 16) for frame in found)
        ]
        kept = [frame[0] for frame, size in zip(found, sizes, strict=True) if size <= room]
        made_kept = iter(heads_json(kept, plain) if kept else [])
        made: list[str] = []
        omitted: list[str] = []
        for (head, _, body, _), size in zip(found, sizes, strict=True):
            if size <= room:
                made.append(next(made_kept))
                fits = body is None or size + _base64_length(len(body)) <= room
                omitted.append("" if fits else '["body"]')
                continue
            command_json, cut = _command_only_json(head, room)
            made.append(command_json)
            what = ["command", "headers"] if cut else ["headers"]
            omitted.append(encode_json(what if body is None else [*what, "body"]))
        return made, omitted

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
        header line it could not read, whatever its bytes: nothing after the word passcode is
        kept (``redact_text``)."""
        error = redact_text(error)
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
        self.flush()
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
        batches: Batches,
        now: float,
        max_record_bytes: int = MAX_RECORD_BYTES,
    ) -> None:
        self.conn = conn
        self.client = client
        self._emit = emit
        self._closed = False
        self.inbound, self.outbound = (
            DirectionRecorder(
                conn,
                client,
                direction,
                emit,
                bodies=bodies,
                limits=limits,
                budget=budget,
                batches=batches,
                max_record_bytes=max_record_bytes,
            )
            for direction in ("in", "out")
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
