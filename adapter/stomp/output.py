"""The bytes for one client until they are written, and the transport they are written to.

Pure: no event loop.  ``ClientOutput`` is built by the asyncio shell (adapter/server/connection.py),
which binds it to the client's transport (``transport``: any object with ``write`` and
``writelines``) when the socket is made and unbinds it when the socket is lost or half-closed;
the STOMP connection (adapter/session/connection.py) adds what it has for the client with
``add``, ``add_message``, ``add_pieces`` and ``add_frames``, and the end of every read from
either socket writes it with ``flush``: one write per read (a batch), whatever the number of
frames.  Unit tests leave it unbound and read what was added (``take``).

How a transport takes frames (``FrameOutput``) is said by the transport's shell when it builds
the output: a byte stream (TCP, TLS) takes the buffer as one write, joined, or unjoined with
``writelines`` when it holds a large MESSAGE; a message transport (WebSocket) takes every item
of the buffer as one message, so a frame given in pieces is joined into one item.

Buffer ownership: every item of the list is ``bytes`` (immutable) and is never touched again
once handed over: a transport keeps a reference to what it could not send yet (uvloop keeps the
very objects), so a large body goes out as the delivery's own bytes, never as a view of a
buffer that is reused.
"""

from __future__ import annotations

from enum import Enum
from typing import Protocol

__all__ = ["MESSAGE_FRAMES", "STREAM_FRAMES", "ClientOutput", "FrameOutput", "Writable"]


class Writable(Protocol):
    """The two calls of an asyncio transport the output needs."""

    def write(self, data: bytes) -> None: ...

    def writelines(self, items: list[bytes]) -> None: ...


class FrameOutput(Enum):
    """How one kind of transport takes frames."""

    STREAM = "stream"  # a byte stream: the buffer is one write; a large body is never copied
    MESSAGE = "message"  # a message transport (WebSocket): one message per frame


STREAM_FRAMES = FrameOutput.STREAM
MESSAGE_FRAMES = FrameOutput.MESSAGE


class ClientOutput:
    """What is buffered for one client, and the transport it goes to (see the module
    docstring).  ``large_body``: a MESSAGE whose body has at least this many bytes is kept
    apart from its head and trailer on a byte stream (written unjoined)."""

    __slots__ = ("large", "large_body", "one_message_per_frame", "out", "transport")

    def __init__(self, frames: FrameOutput, large_body: int) -> None:
        self.one_message_per_frame = frames is FrameOutput.MESSAGE
        self.large_body = large_body
        self.transport: Writable | None = None  # bound by the shell while the client can be written to
        self.out: list[bytes] = []  # for the client, written by flush
        self.large = False  # out holds a large MESSAGE apart: written unjoined

    def add(self, data: bytes) -> None:
        """One frame (or several, joined) for the client."""
        self.out.append(data)

    def add_frames(self, frames: list[bytes]) -> None:
        """Frames for the client, one item each."""
        self.out += frames

    def add_message(self, head: bytes, body: bytes, trailer: bytes) -> None:
        """One MESSAGE given as its head, its body (the delivery's own bytes) and its trailer:
        joined into one frame, or, a large body on a byte stream, kept apart (never copied)."""
        if len(body) < self.large_body or self.one_message_per_frame:
            self.out.append(b"".join((head, body, trailer)))
            return
        out = self.out
        out.append(head)
        out.append(body)
        out.append(trailer)
        self.large = True

    def add_pieces(self, head: bytes, pieces: tuple[bytes, ...], id_prefix: bytes) -> None:
        """One MESSAGE rendered once for many subscribers (a shared subscription): this
        subscriber's ``head``, the message's first piece, this subscriber's ``id_prefix``, the
        message's other pieces (more than two of them: a large body, kept apart on a byte
        stream)."""
        if self.one_message_per_frame:
            self.out.append(b"".join((head, pieces[0], id_prefix, *pieces[1:])))
            return
        out = self.out
        out.append(head)
        out.append(pieces[0])
        out.append(id_prefix)
        out.extend(pieces[1:])
        if len(pieces) > 2:
            self.large = True

    def take(self) -> list[bytes]:
        """The bytes buffered since the last call, taken without being written (tests)."""
        out = self.out
        self.out = []
        self.large = False
        return out

    def flush(self) -> int:
        """Write what is buffered to the transport; the bytes written (0: nothing, or no
        transport bound: what was buffered is dropped, nothing more goes to this client)."""
        out = self.out
        if not out:
            return 0
        self.out = []
        large, self.large = self.large, False
        transport = self.transport
        if transport is None:
            return 0
        if large or self.one_message_per_frame:
            transport.writelines(out)
            return sum(map(len, out))
        data = b"".join(out) if len(out) > 1 else out[0]
        transport.write(data)
        return len(data)
