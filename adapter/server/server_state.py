"""What a client connection may use of the server that accepted it (``ServerState``).

Three views, joined in ``ServerState``: the read-only settings every connection shares, the
counters and budgets all connections add to, and the services a connection asks the server
for.  A server's ``ServerContext`` (adapter/server/context.py) implements them; every
transport (TCP, TLS, WebSocket, a test's in-memory socket) hands ``ClientConnection`` that same
object, so the shell never sees listeners or sockets.  The parts of a connection are each given
the narrowest view they need (``InputGuard`` an ``IncompleteInput``, ``BrokerLogin`` its
``LoginServices``, ``LatencyClocks`` the stats).
"""

from __future__ import annotations

import asyncio
import socket
from typing import TYPE_CHECKING, Any, Protocol

from ..amqp.admission import Gate
from ..amqp.login import BrokerSettings
from ..session import SessionSettings
from .input_guard import FrameClock
from .proxy_protocol import ProxyTrust

if TYPE_CHECKING:
    from collections.abc import Coroutine

    from ..amqp.brokers import BrokerNodes
    from ..amqp.multiplex_runtime import AmqpMultiplex
    from ..amqp.pool_runtime import AmqpReuse
    from .fdlimit import DescriptorWatch
    from .stats import ServerStats
    from .wsdeflate import CompressionBudget

__all__ = ["ConnectionServices", "ConnectionSettings", "ServerState", "SharedCounters"]


class ConnectionSettings(Protocol):
    """Read-only settings every connection of a server shares."""

    session_settings: SessionSettings
    broker: BrokerSettings
    proxy_protocol: bool  # the TCP listeners' setting (TLS and WebSocket read theirs first)
    proxy_trust: ProxyTrust  # adapter.proxy_protocol_trusted: whose PROXY header is believed
    login_timeout: float
    heartbeat_tolerance: float
    idle_client_timeout: float  # adapter.idle_client_timeout (0: off)
    incomplete_input_budget: int

    @property
    def limits(self) -> FrameClock: ...  # the group "limits", as input_guard.IncompleteInput reads it


class SharedCounters(Protocol):
    """Counters and budgets all connections of the process add to."""

    stats: ServerStats
    incomplete_input: int  # bytes of unfinished frames held by all connections (InputGuard)
    descriptors: DescriptorWatch
    ws_compression: CompressionBudget  # permessage-deflate state of all WebSockets
    logins: Gate  # the AMQP logins under way at once (adapter.max_logins_in_flight)
    amqp_closes: Gate  # the AMQP connections closing at once (AMQP_CLOSES_AT_ONCE)


class ConnectionServices(Protocol):
    """What a connection asks the server to do or keep for it."""

    nodes: BrokerNodes
    amqp_reuse: AmqpReuse | None  # adapter.amqp_connection_reuse: the pool, None when off
    amqp_mux: AmqpMultiplex | None  # adapter.amqp_sessions_per_connection > 1, None when off
    connections: set[Any]  # the ClientConnections logged in or logging in; shutdown closes them
    open_sockets: set[Any]  # every socket until connection_lost; shutdown aborts the rest

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]: ...

    def tune_socket(self, sock: socket.socket) -> None: ...

    def add_finished(self, connection: Any) -> None: ...  # a ClientConnection


class ServerState(ConnectionSettings, SharedCounters, ConnectionServices, Protocol):
    """What a connection may use of the server that accepted it, and nothing more (see the
    module docstring)."""
