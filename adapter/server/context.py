"""What every client connection of one server shares: ``ServerContext``, the ``ServerState``
(adapter/server/server_state.py) a ``Server`` hands each connection it accepts.

It owns the three views of that protocol: the read-only settings every connection reads, the
counters and budgets all connections add to (with the server's totals, ``stats``), and the
services a connection asks for (the AMQP reuse pool and shared connections, the set of live
connections and sockets, the tasks that wait for the broker).  The listeners, their accept
loops and the shutdown are the ``Server``'s (adapter/server/listener.py); it reads the live
connections, the open sockets and the tasks here when it shuts down.  Plain attributes: the
connections read several of them on every read from their socket.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from ..amqp.admission import AMQP_CLOSES_AT_ONCE, Gate
from ..session import SessionSettings
from .fdlimit import DescriptorWatch
from .metrics import add_connection
from .options import AmqpOptions, Limits, Listening, Operations
from .stats import DestinationCounts, ServerStats
from .wsdeflate import CompressionBudget

if TYPE_CHECKING:
    from .connection import ClientConnection
    from .websocket import WebSocketConnection

__all__ = ["ServerContext"]


class ServerContext:
    """The settings, counters and services the connections of one server share (see the module
    docstring); built from the server's settings groups (adapter/server/options.py)."""

    def __init__(
        self,
        session_settings: SessionSettings,
        listening: Listening,
        link: AmqpOptions,
        limits: Limits,
        operations: Operations,
    ) -> None:
        # ---- the settings every connection reads (``ConnectionSettings``)
        self.session_settings = session_settings
        self.broker = link.broker
        self.nodes = link.nodes
        # every connection starts with a PROXY protocol header (stomp.proxy_protocol)
        self.proxy_protocol = listening.proxy_protocol
        # the peers a PROXY header is believed from, on every listener that expects one
        self.proxy_trust = listening.proxy_trust
        self.limits = limits  # the input guards read how long a frame may take here
        self.login_timeout = limits.login_timeout
        self.heartbeat_tolerance = limits.heartbeat_tolerance
        self.idle_client_timeout = limits.idle_client_timeout
        self.incomplete_input_budget = limits.incomplete_frames_budget
        self._sockets = listening.sockets  # stomp.tcp_listen_options.*, for tune_socket
        # ---- the counters and budgets all connections add to (``SharedCounters``)
        self.stats = ServerStats()
        if operations.metrics_destinations:
            self.stats.destinations = DestinationCounts(operations.metrics_destinations)
        # bytes of incomplete frames held across all connections (bound: incomplete_input_budget)
        self.incomplete_input = 0
        # zlib state of every WebSocket's permessage-deflate together (adapter/server/wsdeflate.py)
        self.ws_compression = CompressionBudget(limits.web_stomp_compress_budget)
        self.descriptors = DescriptorWatch()
        # adapter.max_logins_in_flight: the AMQP logins of this process under way at once
        self.logins = Gate(limits.max_logins_in_flight)
        # the AMQP connections closing at once (a shutdown closes thousands)
        self.amqp_closes = Gate(AMQP_CLOSES_AT_ONCE)
        # ---- the services a connection asks for (``ConnectionServices``)
        # adapter.amqp_connection_reuse: this process's pool of idle AMQP connections, or None
        self.amqp_reuse = link.reuse
        # adapter.amqp_sessions_per_connection above 1: this process's shared connections, or None
        self.amqp_mux = link.mux
        # adapter.shared_subscriptions: the process's shared groups (the metrics read them)
        self.shared_subscriptions = session_settings.registries.shared
        # the connections logged in or logging in; shutdown closes them
        self.connections: set[ClientConnection] = set()
        # every accepted socket until its transport reports connection_lost (also while a closed
        # connection lingers for the client's last reads, or a WebSocket waits for the client's
        # Close): what is still open at the end of shutdown is aborted
        self.open_sockets: set[ClientConnection | WebSocketConnection] = set()
        # tasks that wait for the broker on a client's behalf; shutdown waits for them too
        self.tasks: set[asyncio.Task[None]] = set()

    @staticmethod
    def clock() -> float:
        """The clock connections time their pauses with."""
        return time.monotonic()

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    def tune_socket(self, sock: socket.socket) -> None:
        """Apply ``stomp.tcp_listen_options`` to an accepted client socket."""
        self._sockets.apply(sock)

    def add_finished(self, connection: ClientConnection) -> None:
        """Keep what a finished connection counted (it leaves ``connections`` later, once its
        AMQP connection has closed; the metrics skip it from now on)."""
        stats = self.stats
        add_connection(stats.closed, connection, self.clock())
        stats.connections_closed[connection.listener] += 1
        session = connection.session
        if session is not None and session.login.failure is not None:
            stats.login_failures[session.login.failure] += 1
