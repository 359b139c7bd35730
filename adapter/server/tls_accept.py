"""The TLS listeners' own accept loops (STOMP over TLS and wss://): ``TlsAcceptor``.

A TLS listener accepts by itself instead of ``create_server(ssl=...)``, for two things asyncio's
server cannot do: read a PROXY header that comes *before* the TLS handshake (the proxy_protocol
settings apply to every listener, as in the plugins), and log a failed handshake at INFO with its
reason (asyncio logs it at DEBUG only, before the adapter has a connection object).  It owns the
listening sockets, their accept tasks, the handshakes under way and the accepted sockets whose
handshake task has not started yet; ``close`` ends them all (the server's shutdown).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections.abc import Callable
from typing import Protocol

from ..amqp.login import EXHAUSTED
from .accept_pause import AcceptPause
from .fdlimit import DescriptorWatch
from .proxy_prelude import Guarded, address, before_tls, readable

__all__ = ["TlsAcceptor", "TlsFactory"]

log = logging.getLogger("adapter.server")

# Connections a TLS listener accepts in a row before it lets the event loop run other work.
_ACCEPTS_PER_TURN = 64

# the protocol of an accepted client, given its address from the PROXY header (or None)
TlsFactory = Callable[[tuple[str, int] | None], asyncio.Protocol]


class Accepting(Guarded, Protocol):
    """What the accept loops use of the server's shared state (a ``ServerContext``): the login
    timeout the handshake must finish in, the refusal counters, the descriptors watch."""

    @property
    def descriptors(self) -> DescriptorWatch: ...


class TlsAcceptor:
    """The accept loops of a server's TLS listeners (see the module docstring)."""

    def __init__(self, context: Accepting, accept_pause: AcceptPause) -> None:
        self._context = context
        self._accept_pause = accept_pause  # too many logins wait: leave clients in the queue
        self._listening: list[socket.socket] = []
        self._accept_tasks: list[asyncio.Task[None]] = []
        # PROXY header and TLS handshake tasks; and the accepted sockets of those that have not
        # started yet (a task cancelled before it starts never runs the code that would close
        # its socket)
        self._handshakes: set[asyncio.Task[None]] = set()
        self._unstarted: dict[asyncio.Task[None], socket.socket] = {}

    def listen(
        self,
        loop: asyncio.AbstractEventLoop,
        host: str,
        port: int,
        tls: ssl.SSLContext,
        proxy_protocol: bool,
        factory: TlsFactory,
        addresses: list[tuple[str, int]],
        backlog: int,
        kind: str,
        inherited: list[socket.socket] | None,
    ) -> None:
        """Listen on ``host:port`` (or on ``inherited``, the sockets a supervisor of
        --workers N bound, SO_REUSEPORT) and accept there; ``factory`` gets the client's address
        from the PROXY header (or None)."""
        if inherited is None:
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            sockets = [socket.create_server((host or "0.0.0.0", port), family=family, backlog=backlog)]
        else:
            sockets = inherited
        for listening in sockets:
            listening.setblocking(False)
            self._listening.append(listening)
            bound = listening.getsockname()
            addresses.append((bound[0], bound[1]))
            self._accept_tasks.append(
                loop.create_task(self._accept(loop, listening, tls, proxy_protocol, factory))
            )
            shared = ", shared" if inherited is not None else ""
            log.info("listening on %s:%s (%s, TLS%s)", bound[0], bound[1], kind, shared)

    async def _accept(
        self,
        loop: asyncio.AbstractEventLoop,
        listening: socket.socket,
        tls: ssl.SSLContext,
        proxy_protocol: bool,
        factory: TlsFactory,
    ) -> None:
        accepted = 0
        accepting = self._accept_pause.accepting
        while True:
            if not accepting.is_set():  # too many logins wait: leave them in the accept queue
                await accepting.wait()
                continue
            # accept() itself, not loop.sock_accept: a task cancelled (by shutdown) after
            # sock_accept had accepted would lose that socket, open; here cancellation can only
            # land in the wait, before anything is accepted
            try:
                sock, _address = listening.accept()
            except BlockingIOError:
                await readable(loop, listening)
                continue
            except OSError as error:
                if listening.fileno() == -1:
                    return  # closed by shutdown
                if error.errno in EXHAUSTED:
                    self._context.descriptors.exhausted(f"accept() failed: {error.strerror}")
                else:
                    log.warning("accept() failed on a TLS listener: %s", error)
                await asyncio.sleep(0.1)  # the kernel keeps the connection queued; try again soon
                continue
            sock.setblocking(False)
            handshake = loop.create_task(self._start(loop, sock, tls, proxy_protocol, factory))
            self._handshakes.add(handshake)
            self._unstarted[handshake] = sock
            handshake.add_done_callback(self._handshakes.discard)
            accepted += 1
            if accepted % _ACCEPTS_PER_TURN == 0:
                await asyncio.sleep(0)  # a burst: let the handshakes begin, as asyncio's servers do

    async def _start(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: socket.socket,
        tls: ssl.SSLContext,
        proxy_protocol: bool,
        factory: TlsFactory,
    ) -> None:
        """PROXY header (with stomp.proxy_protocol), then the TLS handshake, both within the
        login timeout; then the same ClientConnection as on every listener."""
        task = asyncio.current_task()
        if task is not None:
            self._unstarted.pop(task, None)  # the socket is this coroutine's to close from here
        try:
            host, port = sock.getpeername()[:2]
        except OSError:
            sock.close()
            return
        peer = address(host, port)
        context = self._context
        deadline = loop.time() + context.login_timeout
        source: tuple[str, int] | None = None
        handed_over = False  # once True, the transport owns the socket and closes it on failure
        try:
            if proxy_protocol:  # adapter/server/proxy_prelude.py: refused ones are closed there
                header = await before_tls(context, loop, sock, host, peer, log)
                if header is None:
                    return
                source = header.source
            handed_over = True
            await loop.connect_accepted_socket(
                lambda: factory(source),
                sock,
                ssl=tls,
                ssl_handshake_timeout=max(0.001, deadline - loop.time()),
            )
        except (OSError, TimeoutError, EOFError) as error:  # ssl.SSLError is an OSError
            client = f"{source[0]}:{source[1]} via proxy {peer}" if source else peer
            # asyncio and uvloop end a handshake that outlives its timeout with
            # ConnectionAbortedError("SSL handshake is taking longer than ...")
            timed_out = isinstance(error, TimeoutError) or (
                isinstance(error, ConnectionAbortedError) and loop.time() >= deadline - 0.05
            )
            problem = (
                "no complete handshake within the login timeout" if timed_out else _handshake_problem(error)
            )
            log.info("TLS handshake failed peer=%s: %s", client, problem)
            context.stats.connections_refused["tls_timeout" if timed_out else "tls_handshake"] += 1
            if not handed_over:
                sock.close()
        except BaseException:  # cancelled by shutdown
            if not handed_over:
                sock.close()
            raise

    async def close(self) -> None:
        """Stop accepting: the accept loops end before their listening sockets close, the
        handshakes under way are cancelled (they close their sockets, the transport's once
        handed over), and the sockets of handshakes that never started are closed."""
        for task in self._accept_tasks:
            task.cancel()
        if self._accept_tasks:
            await asyncio.wait(self._accept_tasks, timeout=1.0)
        for listening in self._listening:
            listening.close()
        handshakes = list(self._handshakes)
        for handshake in handshakes:
            handshake.cancel()
        if handshakes:
            await asyncio.wait(handshakes, timeout=1.0)
        for sock in self._unstarted.values():  # cancelled before their first step
            sock.close()
        self._unstarted.clear()


def _handshake_problem(error: BaseException) -> str:
    if isinstance(error, (ConnectionResetError, BrokenPipeError, EOFError)):
        # e.g. a load balancer's TCP health check: connect, then close
        return f"the client closed the connection during the handshake ({type(error).__name__})"
    if isinstance(error, ssl.SSLCertVerificationError) and error.verify_message:
        # the client's certificate: say which check failed (expired, unknown CA, self-signed)
        return f"{error.reason}: client certificate: {error.verify_message}"
    if isinstance(error, ssl.SSLError):
        return error.reason or str(error)
    return str(error) or type(error).__name__
