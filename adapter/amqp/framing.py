"""AMQP 0-9-1 framing, sans-IO: bytes from the broker in, whole frames out to a ``FrameHandler``.

Owns the frame layout (AMQP 0-9-1 §2.3.5: type octet, channel short, size long, payload, frame
end 0xCE), the checks on it (frame end, frame size against the negotiated ``frame_max``, known
frame types), and the partial frame a read left unfinished.  What a frame means is the
caller's business (the connection core, adapter/amqp/client.py).

Why a handler's methods rather than returned events: this runs for every frame of every
delivery, and a direct call per frame is the cheapest way out of the loop (no tuple or event
object per frame); the reader stays pure and is tested on its own (tests/unit/test_framing.py).
The handler is an object with named methods, not three callables, so that a frame can be
followed by name from the read to the channel: the connection core during the handshake
(``HandshakeFrames``), then a connection's one channel (``ChannelCore``) or the core's routing by
channel number (``ConnectionCore``), all in adapter/amqp/client.py and channel.py.

Pure: no I/O; imports neither asyncio nor pamqp.
"""

from __future__ import annotations

import struct
from typing import Protocol

from .wire import FRAME_BODY, FRAME_HEADER, FRAME_HEARTBEAT, FRAME_METHOD, DecodeError

_FRAME_HEAD = struct.Struct(">BHI")  # frame type, channel, payload size (AMQP 0-9-1 §2.3.5)

# Body frames at least this large are handed on as views of the read (a multi-frame body is then
# joined from them once, instead of copying each payload out first); when such a frame spans
# reads, its payload is handed on in pieces, views of each read, never joined here.
BODY_VIEW_MIN = 16 * 1024
_SPANNING_BODY_MIN = BODY_VIEW_MIN + 8  # the same frames, by their whole length
# frame_max before Connection.Tune: the broker's frames are small until then (AMQP 0-9-1 §4.2.3
# sets 4096 as the minimum every peer must accept; RabbitMQ's default is 131072)
DEFAULT_FRAME_MAX = 131072


class FrameHandler(Protocol):
    """Where a ``FrameReader`` hands each whole frame (heart-beats excepted)."""

    def on_method(self, channel: int, payload: bytes) -> None: ...

    def on_content_header(self, payload: bytes) -> None: ...  # its channel: ``FrameReader.channel``

    def on_body(self, payload: bytes | memoryview) -> None: ...  # likewise


class FrameReader:
    """Split the broker's byte stream into frames.  ``feed`` raises DecodeError on a broken
    frame; the stream cannot be trusted after that, and the reader drops what it holds."""

    __slots__ = (
        "_partial",
        "_more",
        "_held",
        "_needed",
        "channel",
        "frame_max",
        "handler",
        "_stopped",
    )

    def __init__(self, handler: FrameHandler, frame_max: int = DEFAULT_FRAME_MAX) -> None:
        # the start of a frame that the last read did not complete: a copy, or for a large body
        # frame a view of that read (immutable bytes, kept alive until the frame is whole)
        self._partial: bytes | memoryview = b""
        # the reads since, while the frame they continue is still incomplete: kept as they came
        # and joined once, when the frame is whole (a 64 KiB body arriving in 16 reads is copied
        # once, not 16 times over)
        self._more: list[bytes] = []
        self._held = 0  # bytes in _partial and _more
        self._needed = 0  # bytes the unfinished frame takes, once its head is known (else 0)
        self.frame_max = frame_max
        # where frames go; the connection core replaces it once, when the handshake ends (to its
        # one channel, or to its routing by ``channel``), which takes effect within the current
        # ``feed``
        self.handler = handler
        self._stopped = False
        # the channel of the content frame being handed out: a connection that carries several
        # channels (adapter/amqp/shared.py) routes headers and bodies by it
        self.channel = 0

    @property
    def buffered(self) -> int:
        """Bytes of an unfinished frame held until the next read."""
        return self._held

    def stop(self) -> None:
        """Hand out no more frames (the connection is gone), and let go of the handler (it
        refers back to the connection: dropped, a closed connection is freed by reference
        counting)."""
        self._stopped = True
        self._drop()
        self.handler = _STOPPED

    def _drop(self) -> None:
        self._partial = b""
        self._more.clear()
        self._held = self._needed = 0

    def feed(self, read: bytes | bytearray | memoryview) -> None:
        """Hand every complete frame in ``partial + data`` to its callback, in order; keep the rest.

        Payloads are slices of the bytes read (one copy each), large body payloads views of
        them (no copy), in pieces when the frame spans reads; heart-beat frames are consumed
        here (the caller counts reads).  Views of a ``bytes`` read are kept; any other buffer
        is copied first."""
        if self._stopped:
            return
        # a view of a buffer its owner may reuse: own a copy (a new name, so that a compiled
        # build keeps ``data`` a bytes variable)
        data = read if type(read) is bytes else bytes(read)
        offset = 0
        if self._partial:
            self._held += len(data)
            if self._held < self._needed:  # the frame is still incomplete: no copy yet
                self._more.append(data)
                return
            more = self._more
            partial = self._partial
            if self._needed >= _SPANNING_BODY_MIN and partial[0] == FRAME_BODY:
                try:
                    offset = self._spanning_body(partial, data)
                except BaseException:
                    self._drop()
                    raise
                if self._stopped:
                    return
            else:
                data = b"".join((partial, *more, data))
                more.clear()
        end = len(data)
        frame_max = self.frame_max
        head = _FRAME_HEAD.unpack_from  # type, channel, size in one C call (no slice per frame)
        try:
            while end - offset >= 8:
                frame_type, channel, size = head(data, offset)
                if size > frame_max:
                    # AMQP 0-9-1 §4.2.3: no frame may exceed the negotiated frame_max; refusing it also
                    # bounds what one connection can make us hold
                    raise DecodeError(f"frame of {size} bytes exceeds frame_max {frame_max}")
                frame_end = offset + 7 + size
                if frame_end >= end:
                    break
                if data[frame_end] != 0xCE:
                    raise DecodeError(f"frame-end octet is {data[frame_end]:#04x}, not 0xce")
                start = offset + 7
                offset = frame_end + 1
                if frame_type == FRAME_BODY:
                    self.channel = channel
                    if size >= BODY_VIEW_MIN:
                        self.handler.on_body(memoryview(data)[start:frame_end])
                    else:
                        self.handler.on_body(data[start:frame_end])
                elif frame_type == FRAME_METHOD:
                    self.handler.on_method(channel, data[start:frame_end])
                elif frame_type == FRAME_HEADER:
                    self.channel = channel
                    self.handler.on_content_header(data[start:frame_end])
                elif frame_type != FRAME_HEARTBEAT:
                    raise DecodeError(f"unknown frame type {frame_type}")
                if self._stopped:
                    return
        except BaseException:
            self._drop()
            raise
        if offset < end:
            held = end - offset
            # the whole frame's length when its head is there (its size was checked against
            # frame_max in the loop above)
            needed = 8 + head(data, offset)[2] if held >= 8 else 0
            if needed >= _SPANNING_BODY_MIN and data[offset] == FRAME_BODY:
                self._partial = memoryview(data)[offset:]  # its payload is handed on in pieces
            else:
                self._partial = data[offset:]
            self._held = held
            self._needed = needed
        else:
            self._partial = b""
            self._held = self._needed = 0

    def _spanning_body(self, partial: bytes | memoryview, data: bytes) -> int:
        """A large body frame that began in an earlier read ends in ``data``: its payload goes
        to ``on_body`` as pieces (views of each read: no copy, no join); returns where the next
        frame starts in ``data``."""
        more = self._more
        in_data = self._needed - len(partial) - sum(map(len, more))  # >= 1: the frame end is here
        if data[in_data - 1] != 0xCE:
            raise DecodeError(f"frame-end octet is {data[in_data - 1]:#04x}, not 0xce")
        self.channel = head_channel = _FRAME_HEAD.unpack_from(partial, 0)[1]
        pieces: list[bytes | memoryview] = [partial[7:], *more]
        if in_data > 1:
            pieces.append(memoryview(data)[: in_data - 1])
        more.clear()
        self._partial = b""
        self._held = self._needed = 0
        for piece in pieces:
            if piece:
                self.channel = head_channel
                self.handler.on_body(piece)
                if self._stopped:
                    break
        return in_data


class _Stopped:
    """The handler of a stopped reader: it hands out no frames."""

    def on_method(self, channel: int, payload: bytes) -> None:
        pass

    def on_content_header(self, payload: bytes) -> None:
        pass

    def on_body(self, payload: bytes | memoryview) -> None:
        pass


_STOPPED: FrameHandler = _Stopped()
