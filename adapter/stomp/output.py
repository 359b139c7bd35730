"""How a transport takes the STOMP frames buffered for one client.

Pure: no socket, no event loop.  A byte stream (TCP, TLS) and a message transport (WebSocket,
one message per STOMP frame) buffer a MESSAGE given in pieces differently and write the buffer
differently; each is one small stateless object here, chosen by the transport that owns the
client (``ClientConnection``'s ``frames`` argument), never a flag set on the connection.

``buffer_pieces`` and ``buffer_message`` are pure (they only fill the list); ``write_frames``
hands the list to the transport's ``write``/``writelines``.

Buffer ownership: every item of the list is ``bytes`` (immutable) and is never touched again
once handed over: a transport keeps a reference to what it could not send yet (uvloop keeps the
very objects), so a large body goes out as the delivery's own bytes, never as a view of a
buffer that is reused.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["MESSAGE_FRAMES", "STREAM_FRAMES", "FrameOutput", "MessageFrames", "StreamFrames", "Writable"]


class Writable(Protocol):
    """The two calls of an asyncio transport the output needs."""

    def write(self, data: bytes) -> None: ...

    def writelines(self, items: list[bytes]) -> None: ...


class FrameOutput(Protocol):
    """How one kind of transport buffers and writes frames."""

    def buffer_pieces(
        self, out: list[bytes], head: bytes, pieces: tuple[bytes, ...], id_prefix: bytes
    ) -> bool:
        """Add one MESSAGE rendered once for many subscribers to ``out``: this subscriber's
        ``head``, the message's first piece, this subscriber's ``id_prefix``, the message's other
        pieces.  True when ``out`` now holds a large frame that must not be copied again."""
        ...

    def buffer_message(self, out: list[bytes], head: bytes, body: bytes, trailer: bytes) -> bool:
        """Add one MESSAGE with a large body to ``out``: its head, its body (the delivery's own
        bytes) and its trailer.  True when ``out`` now holds them apart (write it unjoined)."""
        ...

    def write_frames(self, transport: Writable, out: list[bytes], large: bool) -> int:
        """Write ``out`` (not empty); the bytes written."""
        ...


class StreamFrames:
    """A byte stream: the buffer goes out as one write (joined), or unjoined with ``writelines``
    when it holds a large frame; pieces are kept apart (a large body is never copied)."""

    __slots__ = ()

    def buffer_pieces(
        self, out: list[bytes], head: bytes, pieces: tuple[bytes, ...], id_prefix: bytes
    ) -> bool:
        out.append(head)
        out.append(pieces[0])
        out.append(id_prefix)
        out.extend(pieces[1:])
        return len(pieces) > 2  # a large body comes in more than two pieces

    def buffer_message(self, out: list[bytes], head: bytes, body: bytes, trailer: bytes) -> bool:
        out.append(head)
        out.append(body)
        out.append(trailer)
        return True

    def write_frames(self, transport: Writable, out: list[bytes], large: bool) -> int:
        if large:
            transport.writelines(out)
            return sum(map(len, out))
        data = b"".join(out) if len(out) > 1 else out[0]
        transport.write(data)
        return len(data)


class MessageFrames:
    """A message transport (WebSocket): every item of the buffer is one message, so a frame in
    pieces is joined into one item."""

    __slots__ = ()

    def buffer_pieces(
        self, out: list[bytes], head: bytes, pieces: tuple[bytes, ...], id_prefix: bytes
    ) -> bool:
        out.append(b"".join((head, pieces[0], id_prefix, *pieces[1:])))
        return False

    def buffer_message(self, out: list[bytes], head: bytes, body: bytes, trailer: bytes) -> bool:
        out.append(b"".join((head, body, trailer)))
        return False

    def write_frames(self, transport: Writable, out: list[bytes], large: bool) -> int:
        transport.writelines(out)
        return sum(map(len, out))


STREAM_FRAMES = StreamFrames()
MESSAGE_FRAMES = MessageFrames()
