"""The server: TCP listeners, the set of live client connections, and graceful shutdown.

Also owns the operator's HTTP listener (metrics and health, when ``http_listen`` is set) and
the server-wide counters it reports (``stats``, with the totals of closed connections).

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
import ssl
import time
from collections.abc import Callable, Coroutine
from typing import Any

from ..amqp.admission import AMQP_CLOSES_AT_ONCE, LOGINS_WAITING_PER_PLACE, Gate
from ..amqp.login import EXHAUSTED, probe_login
from ..amqp.probe_runtime import Probes
from ..mapping.profile import Profile
from ..session import SessionSettings
from .accept_pause import AcceptPause
from .connection import ClientConnection
from .fdlimit import DescriptorWatch, report_accept_exhaustion
from .health import BrokerCheck
from .http import OperatorHttp, ServerEndpoints
from .metrics import add_connection, build_registry
from .options import AmqpOptions, Limits, Listening, Operations, WebListener
from .proxy_prelude import before_tls
from .stats import DestinationCounts, ServerStats
from .websocket import WebSocketConnection, warn_open_origins
from .wsdeflate import CompressionBudget

log = logging.getLogger("adapter.server")


class Server:
    """The listeners, the live connections and the lifecycle, built from the settings groups
    (adapter/server/options.py)."""

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
        self.limits = limits  # the input guards read how long a frame may take here
        # The flat copies below are the client shell's view of the server (``ServerState`` in
        # adapter/server/connection.py, which another change rewrites): it reads them by name.
        self.session_settings = session_settings
        self.broker = link.broker
        self.nodes = link.nodes
        # every connection starts with a PROXY protocol header (stomp.proxy_protocol)
        self.proxy_protocol = listening.proxy_protocol
        # the peers a PROXY header is believed from, on every listener that expects one
        self.proxy_trust = listening.proxy_trust
        self.login_timeout = limits.login_timeout
        self.heartbeat_tolerance = limits.heartbeat_tolerance
        self.idle_client_timeout = limits.idle_client_timeout
        self.activemq_addresses: list[tuple[str, int]] = []
        # bytes of incomplete frames held across all connections, and their bound
        self.incomplete_input = 0
        self.incomplete_input_budget = limits.incomplete_frames_budget
        # zlib state of every WebSocket's permessage-deflate together (adapter/server/wsdeflate.py)
        self.ws_compression = CompressionBudget(limits.web_stomp_compress_budget)
        self.descriptors = DescriptorWatch()
        # adapter.max_logins_in_flight: the AMQP logins of this process under way at once
        self.logins = Gate(limits.max_logins_in_flight)
        # the AMQP connections closing at once (a shutdown closes thousands)
        self.amqp_closes = Gate(AMQP_CLOSES_AT_ONCE)
        # the client listeners, which stop accepting while too many logins wait
        self.accept_pause = AcceptPause()
        self.logins.watch(limits.max_logins_in_flight * LOGINS_WAITING_PER_PLACE, self.accept_pause.crowded)
        self.connections: set[ClientConnection] = set()
        # adapter.amqp_connection_reuse: this process's pool of idle AMQP connections, or None
        self.amqp_reuse = link.reuse
        # adapter.amqp_sessions_per_connection above 1: this process's shared connections, or None
        self.amqp_mux = link.mux
        if self.amqp_mux is not None and (
            session_settings.declare_exchanges
            or session_settings.profile == Profile.ACTIVEMQ
            or listening.activemq
        ):
            # its sessions can make calls the broker answers with a connection error (an
            # exchange type it lacks, a browse of a stream): they run on probes of their own
            self.amqp_mux.probes = Probes(self, probe_login(self))
        # adapter.shared_subscriptions: the process's shared groups (the metrics read them)
        self.shared_subscriptions = session_settings.registries.shared
        # every accepted socket until its transport reports connection_lost (also while a closed
        # connection lingers for the client's last reads, or a WebSocket waits for the client's
        # Close): what is still open at the end of shutdown is aborted
        self.open_sockets: set[ClientConnection | WebSocketConnection] = set()
        # tasks that wait for the broker on a client's behalf; shutdown waits for them too
        self.tasks: set[asyncio.Task[None]] = set()
        self._servers: list[asyncio.Server] = []
        # STOMP TLS listeners accept by themselves (see _listen_tls)
        self._tls_sockets: list[socket.socket] = []
        self._accept_tasks: list[asyncio.Task[None]] = []
        # PROXY header and TLS handshake tasks of the TLS listeners; and the accepted sockets of
        # those that have not started yet (a task cancelled before it starts never runs the
        # code that would close its socket)
        self._handshakes: set[asyncio.Task[None]] = set()
        self._unstarted: dict[asyncio.Task[None], socket.socket] = {}
        self.addresses: list[tuple[str, int]] = []
        self.tls_addresses: list[tuple[str, int]] = []
        self.web_addresses: list[tuple[str, int]] = []  # web_stomp listeners, ws:// and wss://
        # metrics and health (adapter/server/http.py), where operations.http_listen says
        self.http_addresses: list[tuple[str, int]] = []
        self.http_connections: set[OperatorHttp] = set()
        # a worker of --workers N serves the listening sockets its supervisor bound, by the
        # listener's configured (host, port) (adapter/server/workers.py)
        self._inherited_sockets = dict(inherited_sockets or {})
        self.stats = ServerStats()
        if operations.metrics_destinations:
            self.stats.destinations = DestinationCounts(operations.metrics_destinations)
        self.registry = build_registry(self)
        self.broker_check = BrokerCheck(self)
        self.started = False
        self.shutting_down = False

    @staticmethod
    def clock() -> float:
        """The clock connections time their pauses with."""
        return time.monotonic()

    def add_finished(self, connection: ClientConnection) -> None:
        """Keep what a finished connection counted (it leaves ``connections`` later, once its
        AMQP connection has closed; the metrics skip it from now on)."""
        stats = self.stats
        add_connection(stats.closed, connection, self.clock())
        stats.connections_closed[connection.listener] += 1
        session = connection.session
        if session is not None and session.login.failure is not None:
            stats.login_failures[session.login.failure] += 1

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        report_accept_exhaustion(loop, self.descriptors)
        listening = self.listening
        for host, port in listening.stomp:
            await self._listen(loop, host, port, self.addresses, lambda: ClientConnection(self))
        if listening.activemq:
            activemq = dataclasses.replace(self.session_settings, profile="activemq")
            for host, port in listening.activemq:
                await self._listen(
                    loop,
                    host,
                    port,
                    self.activemq_addresses,
                    lambda: ClientConnection(self, session_settings=activemq),
                    kind="STOMP, activemq profile",
                )
        for host, port in listening.tls:
            assert listening.tls_context is not None
            self._listen_tls(
                loop,
                host,
                port,
                listening.tls_context,
                self.proxy_protocol,
                lambda source: ClientConnection(
                    self, proxy_protocol=False, listener="tls", client_address=source
                ),
                self.tls_addresses,
                listening.sockets.tcp_backlog,
                "STOMP",
            )
        for web in self.web:
            if web.tls is not None:

                def secure_factory(
                    source: tuple[str, int] | None, web: WebListener = web
                ) -> asyncio.Protocol:
                    return WebSocketConnection(
                        self, web.settings, tls=True, proxy_read=True, client_address=source, cap=web.cap
                    )

                # wss://: the PROXY header (web_stomp.proxy_protocol) comes before the handshake
                self._listen_tls(
                    loop,
                    web.host,
                    web.port,
                    web.tls,
                    web.settings.proxy_protocol,
                    secure_factory,
                    self.web_addresses,
                    web.backlog,
                    "WebSocket",
                )
                continue

            def factory(web: WebListener = web) -> asyncio.Protocol:
                return WebSocketConnection(self, web.settings, tls=False, cap=web.cap)

            await self._listen(
                loop, web.host, web.port, self.web_addresses, factory, web.backlog, "WebSocket"
            )
        warn_open_origins(
            [web.settings for web in self.web],
            self.web_addresses,
            self.session_settings.default_user,
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

    def _listen_tls(
        self,
        loop: asyncio.AbstractEventLoop,
        host: str,
        port: int,
        tls: ssl.SSLContext,
        proxy_protocol: bool,
        factory: Callable[[tuple[str, int] | None], asyncio.Protocol],
        addresses: list[tuple[str, int]],
        backlog: int,
        kind: str,
    ) -> None:
        """A TLS listener (STOMP or wss://) with its own accept loop instead of
        ``create_server(ssl=...)``, for two things asyncio's server cannot do: read a PROXY
        header that comes *before* the TLS handshake (the proxy_protocol settings apply to every
        listener, as in the plugins), and log a failed handshake at INFO with its reason
        (asyncio logs it at DEBUG only, before the adapter has a connection object).
        ``factory`` gets the client's address from the PROXY header (or None)."""
        # a worker of --workers N accepts on the sockets its supervisor bound (SO_REUSEPORT)
        inherited = self._inherited_sockets.pop((host, port), None)
        if inherited is None:
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            sockets = [socket.create_server((host or "0.0.0.0", port), family=family, backlog=backlog)]
        else:
            sockets = inherited
        for listening in sockets:
            listening.setblocking(False)
            self._tls_sockets.append(listening)
            address = listening.getsockname()
            addresses.append((address[0], address[1]))
            self._accept_tasks.append(
                loop.create_task(self._accept_tls(loop, listening, tls, proxy_protocol, factory))
            )
            shared = ", shared" if inherited is not None else ""
            log.info("listening on %s:%s (%s, TLS%s)", address[0], address[1], kind, shared)

    async def _accept_tls(
        self,
        loop: asyncio.AbstractEventLoop,
        listening: socket.socket,
        tls: ssl.SSLContext,
        proxy_protocol: bool,
        factory: Callable[[tuple[str, int] | None], asyncio.Protocol],
    ) -> None:
        accepted = 0
        accepting = self.accept_pause.accepting
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
                await _readable(loop, listening)
                continue
            except OSError as error:
                if listening.fileno() == -1:
                    return  # closed by shutdown
                if error.errno in EXHAUSTED:
                    self.descriptors.exhausted(f"accept() failed: {error.strerror}")
                else:
                    log.warning("accept() failed on a TLS listener: %s", error)
                await asyncio.sleep(0.1)  # the kernel keeps the connection queued; try again soon
                continue
            sock.setblocking(False)
            handshake = loop.create_task(self._start_tls(loop, sock, tls, proxy_protocol, factory))
            self._handshakes.add(handshake)
            self._unstarted[handshake] = sock
            handshake.add_done_callback(self._handshakes.discard)
            accepted += 1
            if accepted % _ACCEPTS_PER_TURN == 0:
                await asyncio.sleep(0)  # a burst: let the handshakes begin, as asyncio's servers do

    async def _start_tls(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: socket.socket,
        tls: ssl.SSLContext,
        proxy_protocol: bool,
        factory: Callable[[tuple[str, int] | None], asyncio.Protocol],
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
        peer = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        deadline = loop.time() + self.login_timeout
        source: tuple[str, int] | None = None
        handed_over = False  # once True, the transport owns the socket and closes it on failure
        try:
            if proxy_protocol:  # adapter/server/proxy_prelude.py: refused ones are closed there
                header = await before_tls(self, loop, sock, host, peer, log)
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
            self.stats.connections_refused["tls_timeout" if timed_out else "tls_handshake"] += 1
            if not handed_over:
                sock.close()
        except BaseException:  # cancelled by shutdown
            if not handed_over:
                sock.close()
            raise

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    def tune_socket(self, sock: socket.socket) -> None:
        """Apply ``stomp.tcp_listen_options`` to an accepted client socket."""
        self.listening.sockets.apply(sock)

    async def shutdown(self) -> None:
        self.shutting_down = True  # /healthz and /readyz answer 503 from now on
        loop = asyncio.get_running_loop()
        # one deadline for all of it, from the signal: what is still closing then is dropped
        deadline = loop.time() + self.operations.shutdown_timeout
        if self.amqp_reuse is not None:
            await self.amqp_reuse.close_all()  # idle ones close; the sessions' close from now on
        if self.amqp_mux is not None:
            await self.amqp_mux.close_all()  # idle ones close; busy ones with their last session
        for server in self._servers:
            server.close()
        await self.accept_pause.close()
        for task in self._accept_tasks:
            task.cancel()
        if self._accept_tasks:  # their waits end before their listening sockets close
            await asyncio.wait(self._accept_tasks, timeout=1.0)
        for listening in self._tls_sockets:
            listening.close()
        handshakes = list(self._handshakes)
        for handshake in handshakes:
            handshake.cancel()
        if handshakes:  # let them close their sockets (the transport's, once handed over)
            await asyncio.wait(handshakes, timeout=1.0)
        for sock in self._unstarted.values():  # cancelled before their first step
            sock.close()
        self._unstarted.clear()
        connections = list(self.connections)
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
        if self.tasks:
            _, stuck = await asyncio.wait(list(self.tasks), timeout=max(0.0, deadline - loop.time()))
            for task in stuck:
                task.cancel()  # an AMQP close in progress or waiting for its turn: dropped
            if stuck:
                await asyncio.wait(stuck, timeout=1.0)
        if self.amqp_mux is not None:
            # the shared connections the last of their sessions left: the broker's close-ok,
            # within what is left of the deadline
            await self.amqp_mux.wait_closed(max(0.0, deadline - loop.time()))
        if self.open_sockets:
            # lingering after a close, waiting for a WebSocket Close or an HTTP request: their
            # sessions are done and nothing is left to send
            for open_socket in list(self.open_sockets):
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


_HTTP = "HTTP metrics and health"

# Connections a TLS listener accepts in a row before it lets the event loop run other work.
_ACCEPTS_PER_TURN = 64


async def _readable(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
    ready: asyncio.Future[None] = loop.create_future()
    fd = sock.fileno()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(fd, wake)
    try:
        await ready
    finally:
        loop.remove_reader(fd)


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
