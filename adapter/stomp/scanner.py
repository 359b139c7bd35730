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
    quoted_line,
)

# one frame: its head as on the wire (command line and header lines, without the blank line that
# ends it; ``split_head`` makes it a command and header lines); its body's length; its body
# (only when asked); and where the frame ends in the bytes of the ``feed`` call that completed
# it (the offset just past its NUL), which tells an observer that feeds many reads at once which
# read completed it
ScannedFrame = tuple[bytes, int, bytes | None, int]

# What ``feed`` says of the heads of the frames it appended, for an observer that writes them out:
# PLAIN: every head is printable ASCII without '"' or '\\' (text JSON writes as it is), its
# command line has no ':' and each header line exactly one; SAFE: the same characters, a ':' in
# each header line and maybe more; OTHER: anything else (a CR LF line end, UTF-8, a tab ...).
PLAIN, SAFE, OTHER = 2, 1, 0
# the bytes of a PLAIN head but LF and ':': what is left of a head without them is its line ends
# and the ':' after each name, and anything not plain
_PLAIN_BUT_SEPARATORS = bytes(c for c in range(0x20, 0x7F) if c not in b':"\\')


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

    How the codec's checks of a head are kept cheap: while it scans, the scanner reads only what
    framing needs from a head (its end, its first ``content-length``); the other checks (a CR not
    followed by LF, a header line without ':', too many headers, a line too long) are made once
    per ``feed`` on all the heads it found, joined (a handful of C calls, whatever the number of
    frames), and only if that finds something is each head checked on its own, in order.  A head
    that fails ends the frames at that point with its error, as if the scan had stopped there, and
    an error the scan met further on is raised only if every head before it passes.
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
        "_unchecked",
        "_lengths",
        "heartbeats",
    )

    def __init__(self, limits: FrameLimits, *, bodies: bool = False) -> None:
        self._limits = limits
        self._bodies = bodies
        self._buf = bytearray()  # an incomplete head (or a CR waiting for its LF), from its start
        self._scan_from = 0  # where the search for the end of that head resumes
        self._after_frame = False
        # a frame whose body is still arriving: (head, head length)
        self._frame: tuple[bytes, int] | None = None
        self._left = 0  # its body bytes still to come, per content-length; -1: up to a NUL
        self._seen = 0  # its body bytes seen so far
        self._body: bytearray | None = None  # and those bytes, only when ``bodies``
        # the head being scanned, or of the frame whose body began in this feed: not checked yet
        self._unchecked: bytes | None = None
        # content-length values seen and their numbers (a stream repeats a few of them)
        self._lengths: dict[bytes, int] = {}
        self.heartbeats = 0

    @property
    def held(self) -> int:
        """Bytes held until the rest of a frame comes: its head, and its body when ``bodies``."""
        return len(self._buf) + (len(self._body) if self._body is not None else 0)

    @property
    def incomplete(self) -> int:
        """Bytes of a frame begun and not ended (0 when the stream is between frames)."""
        if self._frame is not None:
            return self._frame[1] + self._seen
        return len(self._buf.lstrip(b"\r\n\0")) if self._buf else 0

    def feed(self, data: bytes, frames: list[ScannedFrame]) -> int:
        """Append to ``frames`` every frame that ``data`` completes; return how plain their heads
        are (PLAIN, SAFE or OTHER).  Raises FrameError where the codec would (the frames before
        that point are appended first)."""
        start = len(frames)
        self._unchecked = None
        try:
            pos = 0
            if self._frame is not None:
                pos = self._body_rest(data, frames)
                if pos < 0:
                    return PLAIN
            buf = self._buf
            if buf:
                held = len(buf)
                buf += data
                self._scan(buf, pos, frames, held)
            else:
                self._scan(data, pos, frames, 0)
        except FrameError:
            self._check_heads(frames, start)
            raise
        return self._check_heads(frames, start)

    def _check_heads(self, frames: list[ScannedFrame], start: int) -> int:
        """The codec's checks of the heads found in this feed (``frames[start:]``, then the one
        not in a frame yet): raises the first one's error, the frames from it on removed;
        returns how plain they are."""
        heads = [frame[0] for frame in frames[start:]]
        if self._unchecked is not None:
            heads.append(self._unchecked)
        if not heads:
            return PLAIN
        limits = self._limits
        # a head no longer than the line limit has no line over it; none has too many header
        # lines if all of them together have no more than the limit, or none has more than half
        # as many as its bytes; joined with a ':' before each command line, what is left
        # without the plain characters is ':' then LF ':' for each line of a PLAIN head
        longest = max(map(len, heads))
        if longest <= limits.max_header_length:
            left = (b":" + b"\n:".join(heads)).translate(None, _PLAIN_BUT_SEPARATORS)
            if longest <= 2 * limits.max_headers or left.count(b"\n") - len(heads) + 1 <= limits.max_headers:
                rest = left.replace(b"\n:", b"")
                if rest == b":":
                    return PLAIN
                # only LFs and ':'s, and no LF without a ':' after it: a ':' in each header line
                if (
                    not rest.replace(b":", b"").replace(b"\n", b"")
                    and left.find(b"\n\n") < 0
                    and left[-1] != LF
                ):
                    return SAFE
        for index, head in enumerate(heads):
            try:
                self._checked_head(head)
            except FrameError:
                del frames[start + index :]
                raise
        return OTHER

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
            head_len = self._frame[1]
            if end < 0:
                self._seen += size
                if head_len + self._seen > self._limits.max_frame_size:
                    raise _too_big(self._limits)
                if self._body is not None:
                    self._body += data
                return -1
            if head_len + self._seen + end + 1 > self._limits.max_frame_size:
                raise _too_big(self._limits)
        body: bytes | None = None
        if self._body is not None:
            self._body += data[:end]
            body = bytes(self._body)
            self._body = None
        frames.append((self._frame[0], self._seen + end, body, end + 1))
        self._frame = None
        self._after_frame = True
        return end + 1

    def _scan(self, view: bytes | bytearray, pos: int, frames: list[ScannedFrame], shift: int) -> None:
        """Frames from ``pos`` of ``view``: the bytes fed, or the held buffer with them appended
        after its first ``shift`` bytes (the frames' end offsets are in the bytes fed)."""
        limits = self._limits
        end = len(view)
        append = frames.append
        lengths = self._lengths
        bodies = self._bodies
        # without a CR in these bytes, a head can only end with LF LF: one search per head
        crlf = view.find(b"\r", pos) >= 0
        while pos < end:
            first = view[pos]
            if first in _BETWEEN_FRAMES_FIRST:
                if first == LF and (pos + 1 == end or view[pos + 1] not in _BETWEEN_FRAMES_FIRST):
                    stop = pos + 1  # one heart-beat (the LF after a frame is taken below)
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
            scan = max(pos, self._scan_from - 2) if shift else pos
            lf_lf = view.find(b"\n\n", scan)
            lf_crlf = view.find(b"\n\r\n", scan, lf_lf + 3 if lf_lf >= 0 else end) if crlf else -1
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
            if shift:  # out of the held buffer: one copy (a bytearray slice would be one more)
                with memoryview(view) as held:
                    head = bytes(held[pos:head_end])
            else:
                head = view[pos:head_end]  # type: ignore[assignment]  # bytes unless shifted
            try:
                # the first content-length: every header line follows an LF
                length: int | None = None
                _, found, value = head.partition(b"\ncontent-length:")
                if found:
                    if not value.isdigit():  # not the last header line (or not plain digits)
                        value = value.partition(b"\n")[0]
                    # the common case in one step; anything else (spaces, a CR, signs, too
                    # many digits) gets the codec's own checks, in its order, and errors
                    length = lengths.get(value)
                    if length is None:
                        if value.isdigit() and len(value) < 16:
                            if len(lengths) >= _LENGTHS_KEPT:
                                lengths.clear()
                            length = lengths[value] = int(value)
                        else:
                            length = self._checked_head(head)
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
                        self._in_body(view, head, head_len, body_start, end, frame_end - end)
                        return
                    if view[frame_end] != NUL:
                        raise _too_long(length)
                else:
                    frame_end = view.find(b"\0", body_start)
                    if frame_end < 0:
                        if end - pos > limits.max_frame_size:
                            raise _too_big(limits)
                        self._in_body(view, head, head_len, body_start, end, -1)
                        return
                    if frame_end - pos + 1 > limits.max_frame_size:
                        raise _too_big(limits)
            except FrameError:
                self._unchecked = head  # checked (by ``feed``) before this error is raised
                raise
            pos = frame_end + 1
            append(
                (
                    head,
                    frame_end - body_start,
                    bytes(view[body_start:frame_end]) if bodies else None,
                    pos - shift,
                )
            )
            # the one LF after the NUL ends the frame (the adapter and the plugin send NUL LF)
            if (
                pos < end
                and view[pos] == LF
                and (pos + 1 == end or view[pos + 1] not in _BETWEEN_FRAMES_FIRST)
            ):
                pos += 1
                self._after_frame = False
            else:
                self._after_frame = True
        if shift:
            view.clear()  # type: ignore[union-attr]  # the held buffer
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
        head: bytes,
        head_len: int,
        body_start: int,
        end: int,
        left: int,
    ) -> None:
        """The head is complete, the body is not: count it from now on, keep it only if asked."""
        self._frame = (head, head_len)
        self._unchecked = head  # checked at the end of this feed
        self._left = left
        self._seen = end - body_start
        if self._bodies:
            self._body = bytearray(view[body_start:end])
        if view is self._buf:
            view.clear()
        self._scan_from = 0

    def _checked_head(self, raw: bytes) -> int | None:
        """A head (blank line excluded) checked as the codec checks it, one check after the
        other; its ``content-length`` (the first one's: STOMP 1.2, first occurrence wins).
        Checked on the bytes, not decoded: a long head costs its lines' bytes once more."""
        limits = self._limits
        command, lines = _split_head_bytes(raw)
        if len(raw) > limits.max_header_length:
            if len(command) > limits.max_header_length:
                raise FrameError("Bad frame", "Command line too long")
            if any(len(line) > limits.max_header_length for line in lines):
                raise FrameError(
                    "Header too long",
                    f"A header line is longer than the maximum of {limits.max_header_length} bytes",
                )
        if not lines:
            return None
        # bytes.find, not ``in``: with a bytes argument ``in`` first tries it as an integer
        if min(map(bytes.find, lines, _COLON_BYTES)) < 0:
            colonless = next(line for line in lines if line.find(b":") < 0)
            raise FrameError("Bad header", f"Header line without ':'{quoted_line(colonless, command)}")
        if (
            len(lines) > limits.max_headers
            and len({line.partition(b":")[0] for line in lines}) > limits.max_headers
        ):
            raise FrameError("Too many headers", f"A frame may carry at most {limits.max_headers} headers")
        for line in lines:  # the first header line named content-length
            if line.startswith(b"content-length:"):
                value = line[15:]
                if value.isdigit() and len(value) < 16:
                    return int(value)
                return content_length(value.decode("utf-8", "surrogateescape"))
        return None


def _split_head_bytes(raw: bytes) -> tuple[bytes, list[bytes]]:
    """``split_head`` without decoding: the command line and header lines as bytes."""
    lines = raw.split(b"\n")
    if raw.find(b"\r") >= 0:  # CR LF line ends: the CR is line ending, not value; any other CR is refused
        lines = [line.removesuffix(b"\r") for line in lines]
        if lines[0].find(b"\r") >= 0:
            where = quoted_line(lines[0], lines[0])
            raise FrameError("Bad frame", f"CR not followed by LF in command line{where}")
        if max(map(bytes.find, lines, _CR_BYTES)) >= 0:
            bare = next(line for line in lines if line.find(b"\r") >= 0)
            raise FrameError(
                "Bad header", f"CR not followed by LF in header line{quoted_line(bare, lines[0])}"
            )
    return lines[0], lines[1:]


def split_head(raw: bytes) -> tuple[str, list[str]]:
    """A scanned head's command and header lines as on the wire (decoded as UTF-8 with
    surrogate escapes; a CR before an LF is line ending, not value).  Raises the codec's
    FrameError for any other CR."""
    text = raw.decode("utf-8", "surrogateescape")
    if "\r" in text:  # CR LF line ends: the CR is line ending, not value; any other CR is refused
        lines = [line.removesuffix("\r") for line in text.split("\n")]
        command_line = _wire(lines[0])
        if "\r" in lines[0]:
            where = quoted_line(command_line, command_line)
            raise FrameError("Bad frame", f"CR not followed by LF in command line{where}")
        for line in lines:
            if "\r" in line:
                where = quoted_line(_wire(line), command_line)
                raise FrameError("Bad header", f"CR not followed by LF in header line{where}")
        return lines[0], lines[1:]
    command, _, headers = text.partition("\n")
    return command, headers.split("\n") if headers else []


def header_pairs(lines: list[str]) -> list[list[str]]:
    """The header lines of a scanned frame as ``[name, value]`` pairs, in wire order, repeats
    kept, values as on the wire (split at each line's first ':')."""
    return [line.split(":", 1) for line in lines]


_LENGTHS_KEPT = 64
_COLON_BYTES = repeat(b":")  # endless: one for every map over header lines
_CR_BYTES = repeat(b"\r")


def _wire(line: str) -> bytes:
    return line.encode("utf-8", "surrogateescape")[:64]
