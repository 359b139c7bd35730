"""permessage-deflate for the web_stomp listeners, bounded (RFC 7692; issue #24).

Owns the two bounds on what compression lets a WebSocket client make the adapter hold:

- ``BoundedDeflate``: the negotiated extension whose inflater stops at a bound per message.
  wsproto's own inflates each read in one unbounded call, so a ~265 KB message of deflated
  newlines became ~272 MB before any limit was looked at.  Here every call asks zlib for at most
  the bytes the message may still grow by, and a message that would grow past its bound fails
  the connection with 1009 (message too big), the close code cowboy uses for its
  ``max_frame_size``.  The bound is read once per message, from the connection (see
  ``WebSocketConnection._inflate_limit``).
- ``CompressionBudget``: bytes of zlib state (deflater and inflater) all connections of this
  process may hold together.  A connection that cannot reserve its share at the handshake is
  accepted without permessage-deflate, which RFC 7692 lets a server do: the client is served,
  uncompressed, and nothing is closed.

The extension's negotiation and outbound side are wsproto's (the adapter frames its own
output, adapter/server/websocket.py); the inbound side is replaced whole, so that no private
state of wsproto's class is relied on.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any

from wsproto.extensions import PerMessageDeflate
from wsproto.frame_protocol import CloseReason, FrameDecoder, FrameProtocol, Opcode, RsvBits

# zlib state one compressing connection holds, measured with tracemalloc (zlib 1.2/1.3, 15
# window bits, memLevel 8): the deflater 262 KiB, the inflater's window and state about 40 KiB
CONTEXT_BYTES = 304 * 1024

_RSV1 = RsvBits(True, False, False)


class CompressionBudget:
    """Bytes of compression state shared by every WebSocket of one process."""

    __slots__ = ("limit", "used")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def reserve(self, amount: int) -> bool:
        """Take ``amount`` bytes if they fit; False (nothing taken) when they do not."""
        if self.used + amount > self.limit:
            return False
        self.used += amount
        return True

    def release(self, amount: int) -> None:
        self.used -= amount


class BoundedDeflate(PerMessageDeflate):
    """permessage-deflate whose inflater produces at most ``max_size()`` bytes per message."""

    def __init__(self, max_size: Callable[[], int]) -> None:
        super().__init__()
        self._max_size = max_size
        self._inflater: Any = None  # zlib's decompress object, made at the first compressed message
        self._message_compressed = False  # the message in progress came with RSV1
        self._frame_inflated = False  # the frame being read is part of a compressed message
        self._frame_is_data = False
        self._left = 0  # bytes the compressed message in progress may still inflate to

    def frame_inbound_header(
        self,
        proto: FrameDecoder | FrameProtocol,
        opcode: Opcode,
        rsv: RsvBits,
        payload_length: int,
    ) -> CloseReason | RsvBits:
        if opcode.iscontrol():
            # never compressed (RFC 7692 6.1), and a ping between the fragments of a compressed
            # message leaves that message's state alone
            if rsv.rsv1:
                return CloseReason.PROTOCOL_ERROR
            self._frame_is_data = self._frame_inflated = False
            return _RSV1
        self._frame_is_data = True
        if opcode is Opcode.CONTINUATION:
            if rsv.rsv1:  # only a message's first frame carries RSV1
                return CloseReason.PROTOCOL_ERROR
        else:  # the first frame of a message
            self._message_compressed = rsv.rsv1
            if rsv.rsv1:
                self._left = self._max_size()
                if self._inflater is None:
                    self._inflater = zlib.decompressobj(-self.client_max_window_bits)
        self._frame_inflated = self._message_compressed
        return _RSV1

    def frame_inbound_payload_data(
        self, proto: FrameDecoder | FrameProtocol, data: bytes
    ) -> bytes | CloseReason:
        if not self._frame_inflated:
            return data
        return self._inflate(data)

    def _inflate(self, data: bytes) -> bytes | CloseReason:
        inflater = self._inflater
        left = self._left
        try:
            # at most one byte over what the message may still grow by: enough to know it is over
            out: bytes = inflater.decompress(data, left + 1)
        except zlib.error:
            return CloseReason.INVALID_FRAME_PAYLOAD_DATA
        if len(out) > left or inflater.unconsumed_tail:
            self._inflater = None  # what it holds is of no further use
            return CloseReason.MESSAGE_TOO_BIG
        if inflater.unused_data:  # bytes after a deflate stream's final block
            return CloseReason.INVALID_FRAME_PAYLOAD_DATA
        self._left = left - len(out)
        return out

    def frame_inbound_complete(
        self, proto: FrameDecoder | FrameProtocol, fin: bool
    ) -> bytes | CloseReason | None:
        if not fin or not self._frame_is_data:
            return None
        if not self._frame_inflated:
            self._message_compressed = False
            return None
        # the end of a compressed message: the 00 00 ff ff its sender left out (RFC 7692 7.2.2)
        tail = self._inflate(b"\x00\x00\xff\xff")
        self._message_compressed = self._frame_inflated = False
        if self.client_no_context_takeover or (self._inflater is not None and self._inflater.eof):
            self._inflater = None  # a new window for the next message
        return tail
