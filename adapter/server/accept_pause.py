"""Accept pausing: while too many logins wait their turn (adapter/amqp/admission.py), the
listeners stop accepting, and new connections wait in the kernel's accept queue instead of
being accepted by the thousand.

Owns the plain listeners' servers (STOMP, activemq-profile and ws:// listeners; the TLS
listeners accept by themselves and wait on ``accepting``) and their pausing.  Neither asyncio's
nor uvloop's server can pause, and an accept loop of the adapter's own costs about 120 µs more
per connection than uvloop's (measured while choosing), so a pause closes the listener's
*server* and a resume starts a new one on the same listening socket: the adapter keeps a
duplicate of each listening socket's descriptor, so closing the server's copy leaves the kernel
socket listening, with its accept queue intact (connections queued meanwhile are accepted on
resume, none is reset).  Nothing is done per connection.

Closing a server is not immediate everywhere: asyncio's selector loop accepts a batch of
connections at once and attaches each to its server one loop turn later, so a server closed in
between would drop the rest of the batch (accepted, never answered, their sockets left
unclosed).  There a pause stops the server reading its listening socket at once (an accept
due in the same loop turn is cancelled with it) and closes the server one loop turn later,
after the batch's connections have attached (their tasks' first steps come first).  uvloop
accepts and attaches the whole batch in one callback, so its servers are closed right after it.
The server is not kept open until the resume: asyncio's loop meets EMFILE in accept() by
registering the listening socket again a second later, which would make a paused server that
is still open accept through the pause (on a closed one that retry fails harmlessly, logged by
the loop).

A resume runs as a task and may meet a pause, another resume or the shutdown while it starts a
server (asyncio's create_server yields a loop turn once serving): it creates the server without
serving, makes it the listener's, and only then starts it, so whoever comes next sees it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("adapter.server")

__all__ = ["AcceptPause"]

# how soon a resume that found no free descriptor tries again
_RESUME_RETRY_SECONDS = 0.5


@dataclass(slots=True, eq=False)
class _Listener:
    factory: Callable[[], asyncio.Protocol]
    kept: socket.socket  # our duplicate of the listening socket: keeps it (and its queue) open
    backlog: int
    server: asyncio.Server | None


class AcceptPause:
    """The plain listeners' servers, paused and resumed together."""

    def __init__(self) -> None:
        self._listeners: list[_Listener] = []
        self.accepting = asyncio.Event()  # the TLS listeners' accept loops wait on it
        self.accepting.set()
        self.pauses = 0
        self._resuming: asyncio.Task[None] | None = None
        self._closed = False

    def add(self, server: asyncio.Server, factory: Callable[[], asyncio.Protocol], backlog: int) -> None:
        for sock in server.sockets:
            kept = socket.socket(fileno=os.dup(sock.fileno()))
            self._listeners.append(_Listener(factory, kept, backlog, server))

    @property
    def servers(self) -> list[asyncio.Server]:
        return [listener.server for listener in self._listeners if listener.server is not None]

    def crowded(self, crowded: bool) -> None:
        """The login queue is full (pause) or has drained (resume): ``Gate``'s watch."""
        if self._closed:
            return
        if crowded and self.accepting.is_set():
            self.accepting.clear()
            self.pauses += 1
            paused = {id(server): server for server in self.servers}
            for listener in self._listeners:
                listener.server = None
            for server in paused.values():
                self._stop(server)
            log.warning(
                "too many logins waiting for the broker: not accepting new connections until they"
                " drain (they wait in the accept queue) (adapter.max_logins_in_flight)"
            )
        elif not crowded and not self.accepting.is_set():
            self.accepting.set()
            self._resuming = asyncio.get_running_loop().create_task(self._resume())
            log.info("logins have drained: accepting new connections again")

    def _stop(self, server: asyncio.Server) -> None:
        """Stop ``server`` accepting now and close it one loop turn later, once the connections
        accepted with the last batch have attached to it (see the module's text).  Closing
        closes its own descriptors only: the kept ones keep the sockets listening."""
        loop = asyncio.get_running_loop()
        if isinstance(loop, asyncio.SelectorEventLoop):
            for sock in server.sockets:
                loop.remove_reader(sock.fileno())  # also cancels an accept due this loop turn
        # uvloop: closed after the callback that accepts (a pause from inside it, by a protocol
        # factory, would otherwise fail the rest of its batch the same way)
        loop.call_soon(server.close)

    async def _resume(self) -> None:
        loop = asyncio.get_running_loop()
        for listener in self._listeners:
            if listener.server is not None or self._closed or not self.accepting.is_set():
                continue
            try:
                copy = socket.socket(fileno=os.dup(listener.kept.fileno()))
            except OSError as error:
                # out of descriptors (EMFILE) at the height of a storm: try again shortly, or
                # this listener (and those after it) would never accept again
                log.warning("could not accept again on %s yet: %s; retrying", listener.kept, error)
                self._resuming = loop.create_task(self._resume_later())
                return
            try:
                # not serving yet: asyncio's create_server yields a loop turn once it serves,
                # and a pause, a second resume or the shutdown in that turn would not see a
                # server that is not the listener's yet (left accepting, never closed)
                server = await loop.create_server(
                    listener.factory, sock=copy, backlog=listener.backlog, start_serving=False
                )
            except OSError as error:  # pragma: no cover - the socket was closed by shutdown
                copy.close()
                log.warning("could not accept again on %s: %s", listener.kept, error)
                continue
            except BaseException:
                copy.close()
                raise
            if listener.server is not None or self._closed or not self.accepting.is_set():
                server.close()  # another resume served it, or a pause or the shutdown came
                continue
            listener.server = server  # the listener's before it serves: a pause now stops it
            await server.start_serving()

    async def _resume_later(self) -> None:
        await asyncio.sleep(_RESUME_RETRY_SECONDS)
        await self._resume()

    async def close(self) -> None:
        """Shutdown: stop accepting for good."""
        self._closed = True
        self.accepting.clear()
        if self._resuming is not None and not self._resuming.done():
            self._resuming.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._resuming
        for server in {id(server): server for server in self.servers}.values():
            server.close()
        for listener in self._listeners:
            listener.server = None
            listener.kept.close()
