"""The server: the client listeners, the operator's HTTP listener, and graceful shutdown.

Owns the listeners (plain ones through asyncio's servers; the TLS ones through their own accept
loops, adapter/server/tls_accept.py), the addresses they listen on, the operator's HTTP listener
(metrics and health, when ``http_listen`` is set) and the server's phase.  What its connections
share (settings, counters and budgets, the server-wide ``stats``, the live connections) is its
``context`` (adapter/server/context.py), handed to every connection it accepts.

Owns the lifecycle, in uvicorn's order: stop accepting, tell every client the server is shutting
down (an ERROR frame) and close it, let the AMQP connections close cleanly in turns (so
unacknowledged messages are requeued by the broker), and at ``shutdown_timeout`` drop those still
closing (the broker cleans them up itself).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import socket
from collections.abc import Callable

from ..amqp.admission import LOGINS_WAITING_PER_PLACE
from ..amqp.login import probe_login
from ..amqp.probe_runtime import Probes
from ..busy_poll import install as install_busy_poll
from ..busy_poll import uninstall as uninstall_busy_poll
from ..mapping.profile import Profile
from ..session import SessionSettings
from .accept_pause import AcceptPause
from .connection import ClientConnection
from .context import ServerContext
from .fdlimit import report_accept_exhaustion
from .health import BrokerCheck
from .http import OperatorHttp, ServerEndpoints
from .metrics import build_registry
from .options import AmqpOptions, Limits, Listening, Operations, WebListener
from .tls_accept import TlsAcceptor
from .websocket import WebSocketConnection, warn_open_origins

log = logging.getLogger("adapter.server")


class Server:
    """The listeners and the lifecycle, built from the settings groups
    (adapter/server/options.py); what its connections share is its ``context``."""

    def __init__(
        self,
        session_settings: SessionSettings,
        *,
        listening: Listening,
        link: AmqpOptions,
        limits: Limits,
        operations: Operations,
        web: tuple[WebListener, ...] = (),
        inherited_sockets: dict[tuple[str, int], list[socket.socket]] | None = None,
    ) -> None:
        # the settings groups, kept whole (adapter/server/options.py): where to listen (the
        # STOMP, activemq-profile and TLS listeners, stomp.tcp_listen_options.*), the web_stomp
        # listeners, the graceful shutdown and the operator's HTTP port
        self.listening = listening
        self.web = web
        self.operations = operations
        # what every connection shares (the ServerState each is handed): settings, counters,
        # the reuse pool and shared connections, the live connections, sockets and tasks
        self.context = context = ServerContext(session_settings, listening, link, limits, operations)
        # the client listeners, which stop accepting while too many logins wait
        self.accept_pause = AcceptPause()
        context.logins.watch(
            limits.max_logins_in_flight * LOGINS_WAITING_PER_PLACE, self.accept_pause.crowded
        )
        mux = context.amqp_mux
        if mux is not None and (
            session_settings.declare_exchanges
            or session_settings.profile == Profile.ACTIVEMQ
            or listening.activemq
        ):
            # its sessions can make calls the broker answers with a connection error (an
            # exchange type it lacks, a browse of a stream): they run on probes of their own
            mux.probes = Probes(context, probe_login(context))
        self._servers: list[asyncio.Server] = []
        # STOMP TLS and wss:// listeners accept by themselves (adapter/server/tls_accept.py)
        self._tls = TlsAcceptor(context, self.accept_pause)
        self.addresses: list[tuple[str, int]] = []
        self.activemq_addresses: list[tuple[str, int]] = []
        self.tls_addresses: list[tuple[str, int]] = []
        self.web_addresses: list[tuple[str, int]] = []  # web_stomp listeners, ws:// and wss://
        # metrics and health (adapter/server/http.py), where operations.http_listen says
        self.http_addresses: list[tuple[str, int]] = []
        self.http_connections: set[OperatorHttp] = set()
        # a worker of --workers N serves the listening sockets its supervisor bound, by the
        # listener's configured (host, port) (adapter/server/workers.py)
        self._inherited_sockets = dict(inherited_sockets or {})
        self.registry = build_registry(context)
        self.broker_check = BrokerCheck(context)
        self.started = False
        self.shutting_down = False

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        # before any protocol is made: each takes the loop's poller when it is (adapter/busy_poll.py)
        install_busy_poll(loop, self.operations.busy_poll_microseconds)
        context = self.context
        report_accept_exhaustion(loop, context.descriptors)
        listening = self.listening
        for host, port in listening.stomp:
            await self._listen(loop, host, port, self.addresses, lambda: ClientConnection(context))
        if listening.activemq:
            activemq = dataclasses.replace(context.session_settings, profile="activemq")
            for host, port in listening.activemq:
                await self._listen(
                    loop,
                    host,
                    port,
                    self.activemq_addresses,
                    lambda: ClientConnection(context, session_settings=activemq),
                    kind="STOMP, activemq profile",
                )
        for host, port in listening.tls:
            assert listening.tls_context is not None
            self._tls.listen(
                loop,
                host,
                port,
                listening.tls_context,
                listening.proxy_protocol,
                lambda source: ClientConnection(
                    context, proxy_protocol=False, listener="tls", client_address=source
                ),
                self.tls_addresses,
                listening.sockets.tcp_backlog,
                "STOMP",
                self._inherited_sockets.pop((host, port), None),
            )
        for web in self.web:
            if web.tls is not None:

                def secure_factory(
                    source: tuple[str, int] | None, web: WebListener = web
                ) -> asyncio.Protocol:
                    return WebSocketConnection(
                        context, web.settings, tls=True, proxy_read=True, client_address=source, cap=web.cap
                    )

                # wss://: the PROXY header (web_stomp.proxy_protocol) comes before the handshake
                self._tls.listen(
                    loop,
                    web.host,
                    web.port,
                    web.tls,
                    web.settings.proxy_protocol,
                    secure_factory,
                    self.web_addresses,
                    web.backlog,
                    "WebSocket",
                    self._inherited_sockets.pop((web.host, web.port), None),
                )
                continue

            def factory(web: WebListener = web) -> asyncio.Protocol:
                return WebSocketConnection(context, web.settings, tls=False, cap=web.cap)

            await self._listen(
                loop, web.host, web.port, self.web_addresses, factory, web.backlog, "WebSocket"
            )
        warn_open_origins(
            [web.settings for web in self.web],
            self.web_addresses,
            context.session_settings.default_user,
        )
        if self.operations.http_listen is not None:
            host, port = self.operations.http_listen
            await self._listen(
                loop,
                host,
                port,
                self.http_addresses,
                lambda: OperatorHttp(ServerEndpoints(self)),
                None,
                _HTTP,
            )
        self.started = True

    async def _listen(
        self,
        loop: asyncio.AbstractEventLoop,
        host: str,
        port: int,
        addresses: list[tuple[str, int]],
        factory: Callable[[], asyncio.Protocol],
        backlog: int | None = None,
        kind: str = "STOMP",
    ) -> None:
        """A plain listener (TLS ones accept by themselves: _listen_tls); a worker of
        --workers N takes the sockets its supervisor bound instead of binding its own."""
        inherited = self._inherited_sockets.pop((host, port), None)
        backlog = backlog or self.listening.sockets.tcp_backlog
        for sock in inherited or []:
            server = await loop.create_server(factory, sock=sock, backlog=backlog)
            self._serve(server, factory, backlog, kind)
            address = sock.getsockname()
            addresses.append((address[0], address[1]))
            log.info("listening on %s:%s (%s, shared)", address[0], address[1], kind)
        if inherited is not None:
            return
        server = await loop.create_server(factory, host or None, port, backlog=backlog, reuse_address=True)
        self._serve(server, factory, backlog, kind)
        for sock in server.sockets:
            address = sock.getsockname()
            addresses.append((address[0], address[1]))
            log.info("listening on %s:%s (%s)", address[0], address[1], kind)

    def _serve(
        self, server: asyncio.Server, factory: Callable[[], asyncio.Protocol], backlog: int, kind: str
    ) -> None:
        """Client listeners pause while too many logins wait (accept_pause.py); the operator's
        HTTP port never does."""
        if kind == _HTTP:
            self._servers.append(server)
        else:
            self.accept_pause.add(server, factory, backlog)

    async def shutdown(self) -> None:
        self.shutting_down = True  # /healthz and /readyz answer 503 from now on
        loop = asyncio.get_running_loop()
        uninstall_busy_poll(loop)  # first, before anything can cut the shutdown short
        # one deadline for all of it, from the signal: what is still closing then is dropped
        deadline = loop.time() + self.operations.shutdown_timeout
        context = self.context
        if context.amqp_reuse is not None:
            await context.amqp_reuse.close_all()  # idle ones close; the sessions' close from now on
        if context.amqp_mux is not None:
            await context.amqp_mux.close_all()  # idle ones close; busy ones with their last session
        for server in self._servers:
            server.close()
        await self.accept_pause.close()
        await self._tls.close()
        # rounds until nothing is left: a client accepted just before the listeners closed
        # reaches ``connections`` two loop turns later (asyncio hands the socket over in a task),
        # and may log in then; a task may start another (a link its login got too late is given
        # back); each is closed and waited for as the first ones were, or the loop closed after
        # the shutdown would free their sockets unclosed
        told: set[ClientConnection] = set()
        quiet_turns = 0
        first = True
        while quiet_turns < _QUIET_TURNS and loop.time() < deadline:
            connections = [c for c in context.connections if c not in told]
            if not connections and not context.tasks and not first:
                quiet_turns += 1
                await asyncio.sleep(0)
                continue
            quiet_turns = 0
            first = False
            told.update(connections)
            await self._close_connections(connections, context.tasks, deadline)
        if context.amqp_mux is not None:
            # the shared connections the last of their sessions left: the broker's close-ok,
            # within what is left of the deadline
            await context.amqp_mux.wait_closed(max(0.0, deadline - loop.time()))
        if context.open_sockets:
            # lingering after a close, waiting for a WebSocket Close or an HTTP request: their
            # sessions are done and nothing is left to send
            for open_socket in list(context.open_sockets):
                open_socket.abort()
            await asyncio.sleep(0)  # let the transports report connection_lost
        if self.http_connections:
            for http in list(self.http_connections):
                http.abort()
            await asyncio.sleep(0)
        # a transport closed by the last step (an AMQP connection whose close-ok just came: a
        # shared one, a probe's) closes its socket one loop turn later; a loop stopped right
        # after the shutdown (tests stop their in-process adapter so) would leave it open
        await asyncio.sleep(0)
        self._servers.clear()

    async def _close_connections(
        self, connections: list[ClientConnection], tasks: set[asyncio.Task[None]], deadline: float
    ) -> None:
        """One round of the shutdown: close ``connections`` and wait, until ``deadline``, for
        them and for the server's tasks (logins, AMQP closes); what is stuck then is cancelled."""
        loop = asyncio.get_running_loop()
        log.info("shutting down: closing %d connection(s)", len(connections))
        # the client side first, all of it: each client gets its ERROR and its socket is closed
        # now; their AMQP connections then close in turns (AMQP_CLOSES_AT_ONCE at once), as
        # fast as the broker closes them
        for connection in connections:
            connection.shutdown()
        pending = [c.done for c in connections if not c.done.done()]
        if pending:
            _, not_done = await asyncio.wait(pending, timeout=max(0.0, deadline - loop.time()))
            if not_done:
                log.warning(
                    "%d connection(s) did not close within %.1f s (adapter.shutdown_timeout): their"
                    " AMQP connections are dropped, and the broker cleans them up itself (it requeues"
                    " what was unacknowledged and deletes their exclusive and auto-delete queues)",
                    len(not_done),
                    self.operations.shutdown_timeout,
                )
        if tasks:
            _, stuck = await asyncio.wait(list(tasks), timeout=max(0.0, deadline - loop.time()))
            for task in stuck:
                task.cancel()  # an AMQP close in progress or waiting for its turn: dropped
            if stuck:
                await asyncio.wait(stuck, timeout=1.0)


_HTTP = "HTTP metrics and health"
# loop turns without a connection or task left that end the shutdown's rounds: an accepted socket
# reaches ``connections`` within two (the accept's task, then connection_made)
_QUIET_TURNS = 3
