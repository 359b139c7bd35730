"""What `Server` is built from: the settings groups of adapter/config/settings.py, turned into the objects
the server uses (parsed addresses, TLS contexts, the broker nodes, the pool of idle AMQP
connections).  ``cli.build_server`` builds them; a test builds them by hand.

Plain frozen data: no sockets are opened and no file is read here.  A field whose name is that of
a setting (``login_timeout``, ``tcp_backlog``, ...) is filled from it by name (``cli.group``), so a
new setting of one of these groups is its declaration in adapter/config/settings.py, a field here and the
code that uses it.
"""

from __future__ import annotations

import logging
import socket
import ssl
from dataclasses import dataclass

from ..amqp.brokers import BrokerNodes
from ..amqp.multiplex_runtime import AmqpMultiplex
from ..amqp.pool_runtime import AmqpReuse
from ..caps import ConnectionCap
from .connection import BrokerSettings
from .proxy_protocol import ProxyTrust
from .websocket import WebStompSettings

Address = tuple[str, int]

log = logging.getLogger("adapter.server")


@dataclass(frozen=True, slots=True)
class SocketOptions:
    """stomp.tcp_listen_options.*: the STOMP listeners' backlog, and what every accepted STOMP
    socket is set to (None: the OS default)."""

    tcp_backlog: int
    tcp_nodelay: bool
    tcp_keepalive: bool
    tcp_sndbuf: int | None
    tcp_recbuf: int | None
    # adapter.client_receive_buffer: SO_RCVBUF when tcp_recbuf is not set (0: the OS's)
    client_receive_buffer: int

    def apply(self, sock: socket.socket) -> None:
        """Set an accepted client socket as these options say."""
        recbuf = self.tcp_recbuf or self.client_receive_buffer
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1 if self.tcp_nodelay else 0)
            if self.tcp_keepalive:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            if self.tcp_sndbuf:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.tcp_sndbuf)
            if recbuf:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, recbuf)
        except OSError as error:  # pragma: no cover - depends on the platform
            log.debug("could not tune socket: %s", error)


@dataclass(frozen=True, slots=True)
class Listening:
    """Group "listeners and TLS": the STOMP listeners (plain, activemq-profile and TLS with its
    context), the PROXY protocol on the plain ones and whose header is believed anywhere."""

    stomp: tuple[Address, ...]
    sockets: SocketOptions
    activemq: tuple[Address, ...] = ()
    tls: tuple[Address, ...] = ()
    tls_context: ssl.SSLContext | None = None
    proxy_protocol: bool = False
    proxy_trust: ProxyTrust = ProxyTrust()


@dataclass(frozen=True, slots=True)
class WebListener:
    """Group "WebSocket", one per web_stomp listener: where, how its WebSockets behave, TLS for
    wss:// (or None), and its own web_stomp.max_connections count (or None: no cap)."""

    host: str
    port: int
    settings: WebStompSettings
    tls: ssl.SSLContext | None = None
    backlog: int = 1024
    cap: ConnectionCap | None = None


@dataclass(frozen=True, slots=True)
class AmqpOptions:
    """Group "AMQP link": how AMQP connections are opened, to which nodes, and the pool of idle
    ones (adapter.amqp_connection_reuse; None when off), and the shared connections
    (adapter.amqp_sessions_per_connection above 1; None when off)."""

    broker: BrokerSettings
    nodes: BrokerNodes
    reuse: AmqpReuse | None = None
    mux: AmqpMultiplex | None = None


@dataclass(frozen=True, slots=True)
class Limits:
    """Group "limits", the part the server applies (the frame and byte limits of a session are in
    its SessionSettings): seconds to log in, the logins let through to the broker at once, seconds
    to finish a frame (0: no limit), the heart-beat
    tolerance, and the process-wide bytes of unfinished frames and of compression state."""

    login_timeout: float
    max_logins_in_flight: int
    frame_timeout: float
    heartbeat_tolerance: float
    idle_client_timeout: float
    incomplete_frames_budget: int
    web_stomp_compress_budget: int


@dataclass(frozen=True, slots=True)
class Operations:
    """Group "operations": the graceful shutdown's wait, the HTTP listener of /metrics, /healthz
    and /readyz (None: none), the per-destination metric series, and the event loop's busy
    polling after a read (adapter/busy_poll.py; 0: none)."""

    shutdown_timeout: float
    http_listen: Address | None
    metrics_destinations: int
    busy_poll_microseconds: int
