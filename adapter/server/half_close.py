"""The half-close of a client socket the adapter closes, and the linger after it.

Half-close: the client gets our last bytes (an ERROR, a RECEIPT) and then EOF.  Closing outright
while its input is unread would send a TCP reset, and a client still writing (an oversized
frame, a burst after an error) would see "connection reset" instead of the ERROR.  Input is read
and dropped until the client closes too (the connection's ``eof_received``), or until it stops
making progress: a client that neither closes nor reads is given up after ``LINGER_SECONDS``;
one still reading what we wrote last (a slow consumer's final batch and its RECEIPT) gets more
time as long as the unsent amount shrinks.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

__all__ = ["LINGER_SECONDS", "HalfClose", "Closable"]

# After the adapter closes a connection, how long it keeps reading (and dropping) what the
# client still sends, so that the client reads the final ERROR instead of a TCP reset.
LINGER_SECONDS = 2.0


class Closable(Protocol):
    def write_eof(self) -> None: ...

    def resume_reading(self) -> None: ...

    def abort(self) -> None: ...

    def get_write_buffer_size(self) -> int: ...


class HalfClose:
    """The linger timer of one half-closed socket (see the module docstring)."""

    __slots__ = ("_handle", "_loop")

    def __init__(self, loop: asyncio.AbstractEventLoop, transport: Closable) -> None:
        """Half-close ``transport`` now (a transport that can write EOF)."""
        self._loop = loop
        self._handle: asyncio.TimerHandle | None = None
        try:
            transport.write_eof()
        except OSError:  # the peer reset the connection before we saw it go
            transport.abort()
            return
        transport.resume_reading()
        self._handle = loop.call_later(LINGER_SECONDS, self._check, transport, None)

    def _check(self, transport: Closable, unsent_before: int | None) -> None:
        unsent = transport.get_write_buffer_size()
        if unsent and (unsent_before is None or unsent < unsent_before):
            self._handle = self._loop.call_later(LINGER_SECONDS, self._check, transport, unsent)
            return
        self._handle = None
        transport.abort()

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
