"""Passive framing of a STOMP byte stream: where each frame starts and ends, its command and header
lines exactly as on the wire, and its body's length; for an observer (the recording tap,
adapter/tap/recorder.py) that passes the bytes on and only needs to know what went by.

Owns nothing of the codec's rules, it applies them: a frame is found exactly where
``codec.FrameParser`` finds it (heart-beat EOLs and stray NULs between frames, a bare CR between
frames refused, the head ended by the first blank line, LF or CR LF, the body by its
``content-length`` or by the first NUL), with the same limits and the same ``FrameError`` for a
stream the codec refuses (a frame too big, a header line without ':', a CR not followed by LF, too
many headers, a bad ``content-length``, a body longer than its ``content-length``).  Like a parser
that has negotiated no version, it unescapes nothing, so no escape can fail.

What it does not do, and why: it builds no ``Frame``, unescapes nothing and keeps header lines as
they are (wire order, repeats, escapes) because an observer records the wire, not a meaning; and
it never holds or copies a body unless asked (``bodies``): a body in flight is only counted, so a
connection's memory is the incomplete head at most.  Pure: no sockets, no event loop.
"""

from __future__ import annotations

from itertools import repeat
from operator import contains

from .codec import (
    _BETWEEN_FRAMES_FIRST,
    CR,
    LF,
    NUL,
    FrameError,
    FrameLimits,
    _bare_cr,
    _skip_between_frames,
    content_length,
)

# one frame: its command; its header lines as on the wire, without their line ends
# (``header_pairs`` splits them); the bytes of its head (command line to the blank line
# included); its body's length; its body (only when asked)
ScannedFrame = tuple[str, list[str], int, int, bytes | None]


def _too_big(limits: FrameLimits, what: str = "Frame exceeds") -> FrameError:
    return FrameError("Frame too big", f"{what} the maximum frame size of {limits.max_frame_size} bytes")


def _too_long(length: int) -> FrameError:
    return FrameError(
        "Bad frame", f"Body is longer than its content-length {length}: expected NUL after the body"
    )


class FrameScanner:
    """One direction's byte stream: ``feed`` the bytes in order, get the frames they complete.

    ``heartbeats`` counts the EOLs seen between frames, except the one EOL that directly follows a
    frame's NUL (the adapter and RabbitMQ's plugin end every frame with NUL LF: that one ends the
    frame).  After a ``FrameError`` the scanner must not be fed again.
    """

    __slots__ = (
        "_limits",
        "_bodies",
        "_buf",
        "_scan_from",
        "_after_frame",
        "_frame",
        "_left",
        "_seen",
        "_body",
        "heartbeats",
    )

    def __init__(self, limits: FrameLimits, *, bodies: bool = False) -> None:
        self._limits = limits
        self._bodies = bodies
        self._buf = bytearray()  # an incomplete head (or a CR waiting for its LF), from its start
        self._scan_from = 0  # where the search for the end of that head resumes
        self._after_frame = False
        # a frame whose body is still arriving: (command, headers, head length)
        self._frame: tuple[str, list[str], int] | None = None
        self._left = 0  # its body bytes still to come, per content-length; -1: up to a NUL
        self._seen = 0  # its body bytes seen so far
        self._body: bytearray | None = None  # and those bytes, only when ``bodies``
        self.heartbeats = 0

    @property
    def held(self) -> int:
        """Bytes held until the rest of a frame comes: its head, and its body when ``bodies``."""
        return len(self._buf) + (len(self._body) if self._body is not None else 0)

    @property
    def incomplete(self) -> int:
        """Bytes of a frame begun and not ended (0 when the stream is between frames)."""
        if self._frame is not None:
            return self._frame[2] + self._seen
        return len(self._buf.lstrip(b"\r\n\0")) if self._buf else 0

    def feed(self, data: bytes, frames: list[ScannedFrame]) -> None:
        """Append to ``frames`` every frame that ``data`` completes.  Raises FrameError where the
        codec would (the frames before that point are appended first)."""
        pos = 0
        if self._frame is not None:
            pos = self._body_rest(data, frames)
            if pos < 0:
                return
        buf = self._buf
        if buf:
            buf += data
            self._scan(buf, pos, frames)
        else:
            self._scan(data, pos, frames)

    def _body_rest(self, data: bytes, frames: list[ScannedFrame]) -> int:
        """More of the body in flight: where the bytes after its NUL start, or -1 (all body)."""
        assert self._frame is not None
        left = self._left
        size = len(data)
        if left >= 0:
            if size <= left:
                self._left = left - size
                self._seen += size
                if self._body is not None:
                    self._body += data
                return -1
            if data[left] != NUL:
                raise _too_long(self._seen + left)
            end = left
        else:
            end = data.find(b"\0")
            head = self._frame[2]
            if end < 0:
                self._seen += size
                if head + self._seen > self._limits.max_frame_size:
                    raise _too_big(self._limits)
                if self._body is not None:
                    self._body += data
                return -1
            if head + self._seen + end + 1 > self._limits.max_frame_size:
                raise _too_big(self._limits)
        command, headers, head_len = self._frame
        body: bytes | None = None
        if self._body is not None:
            self._body += data[:end]
            body = bytes(self._body)
            self._body = None
        frames.append((command, headers, head_len, self._seen + end, body))
        self._frame = None
        self._after_frame = True
        return end + 1

    def _scan(self, view: bytes | bytearray, pos: int, frames: list[ScannedFrame]) -> None:
        limits = self._limits
        end = len(view)
        while pos < end:
            first = view[pos]
            if first in _BETWEEN_FRAMES_FIRST:
                if first == LF and (pos + 1 == end or view[pos + 1] not in _BETWEEN_FRAMES_FIRST):
                    stop = pos + 1  # the common case: the one LF after a frame, or one heart-beat
                    if self._after_frame:
                        self._after_frame = False
                    else:
                        self.heartbeats += 1
                else:
                    stop = _skip_between_frames(view, pos).end()  # type: ignore[union-attr]  # "*" always matches
                    if view.find(b"\r", pos, stop) >= 0:
                        bare = _bare_cr(view, pos, stop)
                        if bare is not None:
                            stop = bare.start()
                            if stop + 1 < end:
                                raise FrameError("Bad frame", "CR not followed by LF between frames")
                    if stop > pos:
                        count = view.count(b"\n", pos, stop)
                        if count and self._after_frame and first != NUL:  # LF or CR LF: the frame's own
                            count -= 1
                        self._after_frame = False
                        self.heartbeats += count
                    if stop + 1 == end and view[stop] == CR:  # a CR waits for its LF
                        self._wait(view, stop, end)
                        return
                pos = stop
                continue
            # a frame starts at pos: its head ends at the first blank line (LF LF or LF CR LF)
            scan = max(pos, self._scan_from - 2) if view is self._buf else pos
            lf_lf = view.find(b"\n\n", scan)
            lf_crlf = view.find(b"\n\r\n", scan, lf_lf + 3 if lf_lf >= 0 else end)
            if lf_lf >= 0 and (lf_crlf < 0 or lf_lf < lf_crlf):
                head_end, body_start = lf_lf, lf_lf + 2
            elif lf_crlf >= 0:
                head_end, body_start = lf_crlf, lf_crlf + 3
            else:
                if end - pos > limits.max_frame_size:
                    raise _too_big(limits, "Frame headers exceed")
                self._wait(view, pos, end)
                return
            if head_end - pos > limits.max_frame_size:
                raise _too_big(limits, "Frame headers exceed")
            command, headers, length = self._head(view[pos:head_end])
            head_len = body_start - pos
            if length is not None:
                if head_len + length + 1 > limits.max_frame_size:
                    raise FrameError(
                        "Frame too big",
                        f"content-length {length} exceeds the maximum frame size of "
                        f"{limits.max_frame_size} bytes",
                    )
                frame_end = body_start + length
                if frame_end >= end:
                    self._in_body(view, command, headers, head_len, body_start, end, frame_end - end)
                    return
                if view[frame_end] != NUL:
                    raise _too_long(length)
            else:
                frame_end = view.find(b"\0", body_start)
                if frame_end < 0:
                    if end - pos > limits.max_frame_size:
                        raise _too_big(limits)
                    self._in_body(view, command, headers, head_len, body_start, end, -1)
                    return
                if frame_end - pos + 1 > limits.max_frame_size:
                    raise _too_big(limits)
            frames.append(
                (
                    command,
                    headers,
                    head_len,
                    frame_end - body_start,
                    bytes(view[body_start:frame_end]) if self._bodies else None,
                )
            )
            self._after_frame = True
            pos = frame_end + 1
        if view is self._buf:
            view.clear()
        self._scan_from = 0

    def _wait(self, view: bytes | bytearray, pos: int, end: int) -> None:
        """Keep the incomplete rest (from ``pos``) for the next feed."""
        buf = self._buf
        if view is buf:
            if pos:
                del buf[:pos]
        else:
            with memoryview(view) as rest:
                buf += rest[pos:]
        self._scan_from = end - pos

    def _in_body(
        self,
        view: bytes | bytearray,
        command: str,
        headers: list[str],
        head_len: int,
        body_start: int,
        end: int,
        left: int,
    ) -> None:
        """The head is complete, the body is not: count it from now on, keep it only if asked."""
        self._frame = (command, headers, head_len)
        self._left = left
        self._seen = end - body_start
        if self._bodies:
            self._body = bytearray(view[body_start:end])
        if view is self._buf:
            view.clear()
        self._scan_from = 0

    def _head(self, raw: bytes | bytearray) -> tuple[str, list[str], int | None]:
        """The command and header lines of a head (blank line excluded), checked as the codec
        checks them; the ``content-length`` is the first one's (STOMP 1.2: first occurrence wins)."""
        limits = self._limits
        text = raw.decode("utf-8", "surrogateescape")
        if "\r" in text:  # CR LF line ends: the CR is line ending, not value; any other CR is refused
            lines = [line.removesuffix("\r") for line in text.split("\n")]
            if "\r" in lines[0]:
                raise FrameError("Bad frame", f"CR not followed by LF in command line {_wire(lines[0])!r}")
            for line in lines:
                if "\r" in line:
                    raise FrameError("Bad header", f"CR not followed by LF in header line {_wire(line)!r}")
            text = "\n".join(lines)
        command, _, headers = text.partition("\n")
        if len(raw) > limits.max_header_length:
            if len(command.encode("utf-8", "surrogateescape")) > limits.max_header_length:
                raise FrameError("Bad frame", "Command line too long")
            if any(
                len(line.encode("utf-8", "surrogateescape")) > limits.max_header_length
                for line in headers.split("\n")
            ):
                raise FrameError(
                    "Header too long",
                    f"A header line is longer than the maximum of {limits.max_header_length} bytes",
                )
        if not headers:
            return command, [], None
        lines = headers.split("\n")
        if not all(map(contains, lines, _COLONS)):
            colonless = next(line for line in lines if ":" not in line)
            raise FrameError("Bad header", f"Header line without ':' {_wire(colonless)!r}")
        if len(lines) > limits.max_headers and len(set(_names(lines))) > limits.max_headers:
            raise FrameError("Too many headers", f"A frame may carry at most {limits.max_headers} headers")
        length = None
        # the first header line named content-length: every header line follows an LF
        start = text.find("\ncontent-length:")
        if start >= 0:
            start += 16
            stop = text.find("\n", start)
            value = text[start:] if stop < 0 else text[start:stop]
            # the common case in one step; anything else (spaces, signs, digits beyond ASCII,
            # too many of them) gets the codec's own rule and errors
            length = (
                int(value)
                if value.isdigit() and value.isascii() and len(value) < 16
                else content_length(value)
            )
        return command, lines, length


def header_pairs(lines: list[str]) -> list[list[str]]:
    """The header lines of a scanned frame as ``[name, value]`` pairs, in wire order, repeats
    kept, values as on the wire (split at each line's first ':')."""
    return [line.split(":", 1) for line in lines]


_COLONS = repeat(":")  # endless: one for every map over header lines


def _names(lines: list[str]) -> list[str]:
    return [line.partition(":")[0] for line in lines]


def _wire(line: str) -> bytes:
    return line.encode("utf-8", "surrogateescape")[:64]
