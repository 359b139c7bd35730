"""Incremental STOMP 1.0-1.2 frame codec: bytes in, frames out; frames in, bytes out.

Owns framing, header escaping per protocol version and the parser limits.  Pure: no sockets,
no event loop; must not import asyncio, aio-pika, pamqp or pydantic.

Parsing is pull-based: ``feed()`` appends bytes, ``next_frame()`` returns one complete frame or
``None``.  The caller handles each frame before pulling the next one, which matters because the
header escaping rules change once CONNECT has negotiated a version: a 1.2 client may pipeline
``CONNECT`` and ``SUBSCRIBE`` in one TCP segment, and the SUBSCRIBE must be unescaped with 1.2 rules.

Hot-path notes: the scanner only uses ``find`` (C speed), and the common case of a header block
without a backslash skips the unescape step entirely.

Copies: a read that starts between frames is parsed where it is (the ``bytes`` the transport
gave, never appended to a buffer), and each body it holds whole is sliced out of it once.  Only
an incomplete rest is held on its own (a ``bytearray`` the next reads are appended to), except
the body of a large frame with a ``content-length``: its pieces are kept as views of the reads
(``bytes``, immutable, so a view is never overwritten) and joined once when the body is whole.
So a body is copied once by the parser, however many reads it spans.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from ..errors import StompError
from ..numbers import TooManyDigits, decimal_integer
from .frame import Frame

NUL = 0
LF = 10
CR = 13
# What may stand between frames: heart-beat EOLs (LF or CR LF) and stray NULs.  Both patterns
# run in constant memory (a repeated character class and a plain search; a repeated group such
# as (?:\n|\r\n)* keeps a backtracking entry per repetition: ~120 bytes per byte skipped).
_skip_between_frames = re.compile(rb"[\n\r\0]*").match
_bare_cr = re.compile(rb"\r(?!\n)").search
_BETWEEN_FRAMES_FIRST = frozenset((LF, NUL, CR))


@dataclass(frozen=True, slots=True)
class FrameLimits:
    """Per-frame limits.  Defaults follow the newer plugin (docs/behaviour.md#limits)."""

    max_frame_size: int = 4 * 1024 * 1024
    max_headers: int = 100
    max_header_length: int = 100 * 1024


class FrameError(StompError):
    """The byte stream is not valid STOMP or breaks a limit; the connection must close.

    ``message`` becomes the ERROR frame's ``message`` header and ``detail`` its body.  The
    plugin closes silently here (docs/behaviour.md#limits); we send the ERROR first, as STOMP asks.
    """


# STOMP 1.1 "Value Encoding" and STOMP 1.2 "Value Encoding" (1.2 adds \r).  STOMP 1.0 has no
# escaping at all, and CONNECT/CONNECTED frames are never escaped (1.2 spec) so that a 1.0-only
# server can read them.
_UNESCAPE_11 = {b"n": b"\n", b"c": b":", b"\\": b"\\"}
_UNESCAPE_12 = {**_UNESCAPE_11, b"r": b"\r"}
_ESCAPE_SEQUENCE = re.compile(rb"\\(.?)", re.DOTALL)

_OUT_ESCAPES = str.maketrans({"\\": "\\\\", "\n": "\\n", "\r": "\\r", ":": "\\c"})
_needs_escape = re.compile(r"[\\\n\r:]").search


def _unescape(raw: bytes, table: dict[bytes, bytes] | None) -> bytes:
    """``raw`` with its escape sequences undone, in C ``bytes`` operations only: a Python step
    per escape let one 4 MiB frame of escapes cost seconds.  Escaped backslashes pair up from
    the left, so once they are set aside every remaining backslash starts one escape; when each
    is one the table knows, the pairs become ``\\e`` (undefined, so unambiguous) while the
    others are replaced, and backslashes at the end."""
    if table is None or b"\\" not in raw:
        return raw
    singles = raw.replace(b"\\\\", b"")
    twelve = b"r" in table
    known = singles.count(b"\\n") + singles.count(b"\\c") + (singles.count(b"\\r") if twelve else 0)
    if known != singles.count(b"\\"):
        return _unescape_slowly(raw, table)  # it raises, naming the undefined escape
    out = raw.replace(b"\\\\", b"\\e").replace(b"\\n", b"\n").replace(b"\\c", b":")
    if twelve:
        out = out.replace(b"\\r", b"\r")
    return out.replace(b"\\e", b"\\")


def _unescape_slowly(raw: bytes, table: dict[bytes, bytes]) -> bytes:
    def replace(match: re.Match[bytes]) -> bytes:
        try:
            return table[match.group(1)]
        except KeyError:
            raise FrameError(
                "Bad header",
                f"Undefined escape sequence {match.group(0)!r} in header {raw!r}",
            ) from None

    return _ESCAPE_SEQUENCE.sub(replace, raw)


def _decode(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


_SECRET_COMMANDS = (b"connect", b"stomp")
_NOT_COMMAND = b"\r\n\t \xef\xbb\xbf"  # line ends, blanks and a UTF-8 BOM a client may put first


def quoted_line(line: bytes, command_line: bytes) -> str:
    """How an ERROR's text shows a broken line: its first 64 bytes quoted, except where it may
    hold a passcode, which an ERROR must never carry (a tap, a proxy or the client's own log may
    keep it): in a frame whose command looks like CONNECT or STOMP (any case, after blanks or a
    BOM: a bare CR can make the whole frame one line), and in any line that names a passcode."""
    if command_line.lstrip(_NOT_COMMAND).lower().startswith(_SECRET_COMMANDS) or b"passcode" in line.lower():
        return " (not shown: the lines of a CONNECT may hold its passcode)"
    return f" {line[:64]!r}"


# bodies at least this large are copied out of a held buffer through a memoryview (one copy
# instead of two); below it, the plain slice is cheaper than setting up the view.  A body of a
# frame with a content-length at least this large that a read leaves incomplete is collected as
# views of the reads, not appended to the held buffer (FrameParser._collect).
_VIEW_COPY_MIN = 16 * 1024
# a read smaller than this, of a body being collected, is appended to a tail piece of the
# parser's own rather than kept as a piece: a client trickling a body byte by byte must not cost
# an object per byte (its bytes are then copied twice, which only a trickle pays)
_PIECE_MIN = 4096
_EMPTY = b""


class FrameParser:
    """Incremental parser for the client-to-server byte stream of one connection."""

    __slots__ = (
        "_buf",
        "_pos",
        "_limits",
        "_unescape_table",
        "trim_values",
        "_scan_from",
        "_head",
        "_pieces",
        "_missing",
        "_pinned",
    )

    def __init__(self, limits: FrameLimits | None = None) -> None:
        # the bytes being parsed from ``_pos``: the read itself (``bytes``) or, once a read left
        # an incomplete frame, that rest held on its own (a ``bytearray`` that grows)
        self._buf: bytes | bytearray = _EMPTY
        self._pos = 0
        self._limits = limits or FrameLimits()
        self._unescape_table: dict[bytes, bytes] | None = None
        # STOMP 1.0 connections get leading whitespace trimmed from header values, as the
        # plugin does (docs/behaviour.md#limits, util.erl trim_headers).
        self.trim_values = False
        # where the search for the end of the current header block / body resumes, so a frame
        # trickling in byte by byte is not rescanned from its start on every feed
        self._scan_from = 0
        # (command, headers, content-length, body offset) of a frame whose body is incomplete
        self._head: tuple[str, dict[str, str], int | None, int] | None = None
        # a large body being collected (see _collect): its pieces, views of the reads (or a
        # copy, for the rare piece of a held bytearray, and a tail for small reads), the bytes
        # of it still to come, and the bytes of the reads the pieces keep alive (what
        # ``buffered`` counts for them)
        self._pieces: list[bytes | bytearray | memoryview] | None = None
        self._missing = 0
        self._pinned = 0

    @property
    def limits(self) -> FrameLimits:
        return self._limits

    @limits.setter
    def limits(self, limits: FrameLimits) -> None:
        self._limits = limits

    def set_version(self, version: str) -> None:
        """Apply the negotiated version's escaping rules to all following frames."""
        self._unescape_table = {"1.0": None, "1.1": _UNESCAPE_11}.get(version, _UNESCAPE_12)
        self.trim_values = version == "1.0"

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as frames (for a large body being collected:
        the whole reads its pieces keep alive)."""
        return len(self._buf) - self._pos + self._pinned

    @property
    def retained(self) -> int:
        """Bytes the parser holds, those already returned as frames included (a read is
        dropped as soon as everything in it has been read, or its incomplete rest is copied
        out at the end of ``next_frame``)."""
        return len(self._buf) + self._pinned

    def feed(self, read: bytes | bytearray | memoryview) -> None:
        # a view of a buffer its owner may reuse: own a copy (a new name, so that a compiled
        # build keeps ``data`` a bytes variable)
        data = read if type(read) is bytes else bytes(read)
        if not data:
            return
        pieces = self._pieces
        if pieces is not None and self._missing:
            # more of a large body (_collect): kept as a view of the read, no copy
            missing = self._missing
            size = len(data)
            self._pinned += size
            if size <= missing:
                if size >= _PIECE_MIN:
                    pieces.append(data)
                else:  # a small read joins a tail of the parser's own: no object per trickled byte
                    tail = pieces[-1] if pieces else None
                    if type(tail) is bytearray:
                        tail += data
                    else:
                        pieces.append(bytearray(data))
                self._missing = missing - size
                return
            pieces.append(memoryview(data)[:missing])
            self._missing = 0
            self._buf = data  # what follows the body is parsed where it is
            self._pos = self._scan_from = missing
            return
        buf = self._buf
        pos = self._pos
        if pos >= len(buf):  # nothing held: parse the read where it is
            self._buf = data
            self._pos = self._scan_from = 0
            return
        if isinstance(buf, bytearray):  # a rest held since an earlier read: it grows
            if pos:
                del buf[:pos]
                self._scan_from = max(0, self._scan_from - pos)
                self._pos = 0
            buf += data
            return
        with memoryview(buf) as view:  # the incomplete rest of the last read: held on its own now
            held = bytearray(view[pos:])
        held += data
        self._buf = held
        self._scan_from = max(0, self._scan_from - pos)
        self._pos = 0

    def next_frame(self) -> Frame | None:
        """Return the next complete frame, or None if more bytes are needed.

        Raises FrameError on malformed input or a broken limit.
        """
        if self._pieces is not None:
            return self._collected_frame()
        buf = self._buf
        pos = self._pos
        end = len(buf)
        # Skip heart-beat EOLs and stray NULs between frames (STOMP 1.2 "Heart-beating",
        # docs/behaviour.md#limits) in one C-level match, however long the run: a client (or a
        # WebSocket message that inflates to megabytes of "\n") must not cost a Python step per
        # byte.  A CR must be followed by LF; a CR at the very end waits for the next feed.
        if pos < end and buf[pos] in _BETWEEN_FRAMES_FIRST:
            if buf[pos] != CR and (pos + 1 == end or buf[pos + 1] not in _BETWEEN_FRAMES_FIRST):
                stop = pos + 1  # the common case: one LF after a frame, no need for the regex
            else:
                stop = _skip_between_frames(buf, pos).end()  # type: ignore[union-attr]  # "*" always matches
                if buf.find(b"\r", pos, stop) >= 0:  # CR LF heart-beats, or a CR alone
                    bare = _bare_cr(buf, pos, stop)
                    if bare is not None:
                        stop = bare.start()
                        if stop + 1 < end:
                            self._pos = stop
                            raise FrameError("Bad frame", "CR not followed by LF between frames")
            pos = stop
            if pos != self._pos:
                self._pos = pos
                self._scan_from = pos
        if pos >= end:
            if end:  # all of it read: drop it now, not at the next feed (nothing is pinned)
                self._buf = _EMPTY
                self._pos = self._scan_from = 0
            return None
        if buf[pos] == CR:
            self._wait()
            return None

        limits = self._limits
        head = self._head
        if head is None:
            head = self._scan_head(pos, end)
            if head is None:
                self._wait()
                return None
            self._head = head
        command, headers, content_length, body_offset = head
        body_start = pos + body_offset

        if content_length is not None:
            frame_end = body_start + content_length
            if frame_end >= end:
                if content_length >= _VIEW_COPY_MIN:
                    self._collect(body_offset, body_start, end, content_length)
                else:
                    self._wait()
                return None
            if buf[frame_end] != NUL:
                self._head = None
                raise FrameError(
                    "Bad frame",
                    f"Body is longer than its content-length {content_length}: expected NUL after the body",
                )
        else:
            frame_end = buf.find(b"\0", max(body_start, self._scan_from))
            if frame_end < 0:
                if end - pos > limits.max_frame_size:
                    raise FrameError(
                        "Frame too big",
                        f"Frame exceeds the maximum frame size of {limits.max_frame_size} bytes",
                    )
                self._scan_from = end
                self._wait()
                return None
            if frame_end - pos + 1 > limits.max_frame_size:
                raise FrameError(
                    "Frame too big",
                    f"Frame exceeds the maximum frame size of {limits.max_frame_size} bytes",
                )
        if type(buf) is bytes or frame_end - body_start < _VIEW_COPY_MIN:
            body = bytes(buf[body_start:frame_end])  # of bytes: the slice is the one copy
        else:  # one copy, where slicing the bytearray first would make two
            with memoryview(buf) as view:
                body = bytes(view[body_start:frame_end])
        self._pos = frame_end + 1
        self._scan_from = self._pos
        self._head = None
        return Frame(command, headers, body)

    def _wait(self) -> None:
        """More bytes are needed: drop what was read before the incomplete rest now, so that a
        read's frames and heart-beats are not pinned in memory until the client's next read
        (the rest of a read is copied out of it, a held buffer shifted)."""
        pos = self._pos
        if pos:
            buf = self._buf
            if isinstance(buf, bytearray):
                del buf[:pos]
            else:
                with memoryview(buf) as view:
                    self._buf = bytearray(view[pos:])
            self._scan_from = max(0, self._scan_from - pos)
            self._pos = 0

    def _collect(self, head_size: int, body_start: int, end: int, content_length: int) -> None:
        """A large body with a content-length that this read does not complete: from now on
        its bytes are kept as pieces (views of the reads, which are immutable ``bytes``, so no
        later read can overwrite them), never appended to a buffer; ``_collected_frame`` joins
        them once, when the body and its NUL are there.  The reads stay alive while the frame
        is incomplete, so ``buffered`` counts them whole, and the frame's head (``head_size``
        bytes, kept parsed) counts as long as the frame is incomplete."""
        buf = self._buf
        pieces: list[bytes | bytearray | memoryview] = []
        self._pinned = head_size  # no body byte yet: the head is all that is held
        if end > body_start:
            if type(buf) is bytes and body_start <= end - body_start:
                # the body is most of the read: a view of it (the read, head included, is
                # kept alive whole)
                pieces.append(memoryview(buf)[body_start:end])
                self._pinned = len(buf)
            else:  # a held rest (the head came in pieces), or a read that is mostly what came
                # before the body (frames, heart-beats): its body bytes copied out, so a few
                # body bytes do not keep a large read alive
                with memoryview(buf) as view:
                    piece = bytes(view[body_start:end])
                pieces.append(piece)
                self._pinned = head_size + len(piece)
        self._pieces = pieces
        self._missing = content_length - (end - body_start)
        self._buf = _EMPTY
        self._pos = self._scan_from = 0

    def _collected_frame(self) -> Frame | None:
        """The frame of the body being collected, once its last byte and its NUL are there."""
        pos = self._pos
        if self._missing or pos >= len(self._buf):
            return None
        pieces = self._pieces
        head = self._head
        assert pieces is not None and head is not None
        self._pieces = None
        self._head = None
        self._pinned = 0
        if self._buf[pos] != NUL:
            raise FrameError(
                "Bad frame",
                f"Body is longer than its content-length {head[2]}: expected NUL after the body",
            )
        self._pos = self._scan_from = pos + 1
        return Frame(head[0], head[1], b"".join(pieces))  # the one copy of the body

    def _scan_head(self, pos: int, end: int) -> tuple[str, dict[str, str], int | None, int] | None:
        """Find and parse the command and header lines of the frame starting at ``pos``."""
        buf = self._buf
        limits = self._limits
        scan = max(pos, self._scan_from - 2)
        lf_lf = buf.find(b"\n\n", scan)
        # look for a CRLF blank line only before the first LF one, so that a buffer full of
        # LF-only frames is not rescanned to its end for every frame
        lf_crlf = buf.find(b"\n\r\n", scan, lf_lf + 3 if lf_lf >= 0 else end)
        if lf_lf < 0 and lf_crlf < 0:
            if end - pos > limits.max_frame_size:
                raise FrameError(
                    "Frame too big",
                    f"Frame headers exceed the maximum frame size of {limits.max_frame_size} bytes",
                )
            self._scan_from = end
            return None
        if lf_lf >= 0 and (lf_crlf < 0 or lf_lf < lf_crlf):
            headers_end, body_start = lf_lf, lf_lf + 2
        else:
            headers_end, body_start = lf_crlf, lf_crlf + 3
        if headers_end - pos > limits.max_frame_size:
            raise FrameError(
                "Frame too big",
                f"Frame headers exceed the maximum frame size of {limits.max_frame_size} bytes",
            )
        command, headers, content_length = self._parse_head(bytes(buf[pos:headers_end]))
        if content_length is not None and body_start - pos + content_length + 1 > limits.max_frame_size:
            raise FrameError(
                "Frame too big",
                f"content-length {content_length} exceeds the maximum frame size of "
                f"{limits.max_frame_size} bytes",
            )
        self._scan_from = body_start
        return command, headers, content_length, body_start - pos

    def _parse_head(self, head: bytes) -> tuple[str, dict[str, str], int | None]:
        if b"\r" not in head and b"\\" not in head:
            return self._parse_plain_head(head)
        return self._parse_general_head(head)

    def _parse_general_head(self, head: bytes) -> tuple[str, dict[str, str], int | None]:
        """Any head: CR LF line ends, escapes, and the one place that decides which ERROR a
        broken head gets (the plain path hands every broken head over to it)."""
        limits = self._limits
        lines = head.split(b"\n")
        command_raw = lines[0]
        if command_raw.endswith(b"\r"):
            command_raw = command_raw[:-1]
        if len(command_raw) > limits.max_header_length:
            raise FrameError("Bad frame", "Command line too long")
        if b"\r" in command_raw:
            raise FrameError(
                "Bad frame", f"CR not followed by LF in command line{quoted_line(command_raw, command_raw)}"
            )
        command = _decode(command_raw)
        # CONNECT and STOMP frames are never escaped (STOMP 1.2 "Value Encoding").
        table = None if command in ("CONNECT", "STOMP") else self._unescape_table
        trim = self.trim_values
        headers: dict[str, str] = {}
        max_len = limits.max_header_length
        for line in lines[1:]:
            if line.endswith(b"\r"):
                line = line[:-1]
            if len(line) > max_len:
                raise FrameError(
                    "Header too long",
                    f"A header line is longer than the maximum of {max_len} bytes",
                )
            if b"\r" in line:
                raise FrameError(
                    "Bad header", f"CR not followed by LF in header line{quoted_line(line, command_raw)}"
                )
            colon = line.find(b":")
            if colon < 0:
                raise FrameError("Bad header", f"Header line without ':'{quoted_line(line, command_raw)}")
            name = _decode(_unescape(line[:colon], table))
            if name in headers:
                # STOMP 1.2: the first occurrence wins; repeats do not count to limits, but an
                # undefined escape in a repeat is still a fatal error (as in the plugin)
                _unescape(line[colon + 1 :], table)
                continue
            value = _decode(_unescape(line[colon + 1 :], table))
            if trim:
                value = value.lstrip()
            headers[name] = value
            if len(headers) > limits.max_headers:
                raise FrameError(
                    "Too many headers",
                    f"A frame may carry at most {limits.max_headers} headers",
                )
        return command, headers, self._content_length(headers)

    def _parse_plain_head(self, head: bytes) -> tuple[str, dict[str, str], int | None]:
        """The common case: LF line ends and no escapes, so the head decodes in one go."""
        limits = self._limits
        lines = head.decode("utf-8", "surrogateescape").split("\n")
        command = lines[0]
        if len(head) > limits.max_header_length and any(
            len(line.encode("utf-8", "surrogateescape")) > limits.max_header_length for line in lines
        ):
            return self._parse_general_head(head)  # it raises the ERROR, in its order of checks
        trim = self.trim_values
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, colon, value = line.partition(":")
            if not colon:
                return self._parse_general_head(head)
            if name in headers:
                continue  # STOMP 1.2: the first occurrence wins; repeats do not count to limits
            headers[name] = value.lstrip() if trim else value
        if len(headers) > limits.max_headers:
            return self._parse_general_head(head)
        return command, headers, self._content_length(headers)

    @staticmethod
    def _content_length(headers: dict[str, str]) -> int | None:
        raw_length = headers.get("content-length")
        return None if raw_length is None else content_length(raw_length)


def content_length(raw_length: str) -> int:
    """The value of a ``content-length`` header (surrounding whitespace allowed), or FrameError."""
    # nearly every frame: plain ASCII digits, short enough that int() is bounded (three C calls)
    if len(raw_length) <= 18 and raw_length.isdigit() and raw_length.isascii():
        return int(raw_length)
    try:
        value = decimal_integer(raw_length.strip(), signed=False)
    except TooManyDigits as error:  # far beyond any frame size limit: refused unparsed
        raise FrameError(
            "Bad content-length",
            f"content-length has too many digits ({error.digits}, at most {error.limit})",
        ) from None
    if value is None:
        raise FrameError(
            "Bad content-length",
            f"content-length must be a non-negative integer, got {raw_length!r}",
        )
    return value


def escape(value: str) -> str:
    """Escape a header name or value for the wire (STOMP 1.2 "Value Encoding").

    Applied for every version, 1.0 included, exactly as the plugin does (docs/compatibility.md): a raw
    LF in a 1.0 header would otherwise break the frame.
    """
    if _needs_escape(value) is None:
        return value
    return value.translate(_OUT_ESCAPES)


def encode_frame(
    command: str,
    headers: Iterable[tuple[str, str]] = (),
    body: bytes = b"",
    *,
    trailing_lf: bool = True,
    escape_headers: bool = True,
) -> bytes:
    """Serialise one server frame.

    ``content-length`` is added, as the last header, iff the body is non-empty (docs/compatibility.md);
    a ``content-length`` in ``headers`` is dropped so it can never disagree with the body.
    """
    if escape_headers:
        lines = [f"{escape(k)}:{escape(v)}\n" for k, v in headers if k != "content-length"]
    else:
        lines = [f"{k}:{v}\n" for k, v in headers if k != "content-length"]
    if body:
        lines.append(f"content-length:{len(body)}\n")
    head = f"{command}\n{''.join(lines)}\n".encode("utf-8", "surrogateescape")
    return b"".join((head, body, b"\0\n" if trailing_lf else b"\0"))
