"""A client's AMQP login: the broker-node loop, the pool of reusable connections, TLS diagnosis.

``BrokerLogin.open`` tries the broker nodes in the order ``BrokerNodes`` gives, all within the
login timeout: a refusing, unreachable or timing-out node is skipped (and rested), a login the
broker refuses is final (docs/behaviour.md, "Broker nodes").  What it returns is either the
session's link (``SessionLink``: the open ``AmqpConnection``, or with multiplexing a channel on
it) or the ``LoginResult`` of a failure, whose text never names a node, address,
certificate problem or setting (the log has those; the client has not logged in).
``BrokerLogin.pooled`` takes a connection from adapter.amqp_connection_reuse's pool instead, or,
with adapter.amqp_sessions_per_connection above 1, a channel on a shared connection
(adapter/amqp/multiplex_runtime.py); ``release`` gives one back (or closes it).  The shell
(``ClientConnection``) decides what a
result means for the session; this module knows nothing of STOMP.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, cast

from ..mapping import operations as ops
from ..mapping.tokens import read_claims
from .admission import Gate, turn
from .connection import AmqpConnection, AmqpError, HandshakeTimeout, NotAmqp, SessionLink
from .probe_runtime import ProbeLogin, Unheard
from .shared import ChannelLink, SharedConnection

if TYPE_CHECKING:
    from collections import Counter

    from .brokers import BrokerNodes
    from .connection import BrokerEvents
    from .multiplex_runtime import AmqpMultiplex
    from .pool_runtime import AmqpReuse

log = logging.getLogger("adapter.connection")

# the errors of a process out of file descriptors (the server's accept loop reads the same set)
EXHAUSTED = frozenset({errno.EMFILE, errno.ENFILE})


class DescriptorWatch(Protocol):
    """Where a login reports that the process ran out of file descriptors (the server's
    ``fdlimit.DescriptorWatch``)."""

    def exhausted(self, what: str) -> None: ...


class LoginFailures(Protocol):
    """The counters a login raises when an AMQP connection fails (the server's ``ServerStats``)."""

    @property
    def amqp_connection_failures(self) -> Counter[str]: ...


@dataclass(frozen=True, slots=True)
class BrokerSettings:
    """How AMQP connections are opened (the nodes themselves are in server.nodes)."""

    heartbeat: int
    connect_timeout: float
    # for amqps:// nodes: the TLS context (CA, client certificate, verification, minimum
    # version) and the name to check the certificate against (None: the node's host name)
    tls: ssl.SSLContext | None = None
    tls_server_name: str | None = None


# opens one AMQP connection: AmqpConnection.open's signature (a test passes its own); with
# multiplexing SharedConnection.open, whose connection the registry shares
Opener = Callable[..., Awaitable[AmqpConnection | SharedConnection]]


class LoginServices(Protocol):
    """What a login uses of the server: where and how to connect, the pool, and the counters
    of failed attempts (a server's ``ServerContext`` has all of these)."""

    broker: BrokerSettings
    nodes: BrokerNodes
    login_timeout: float
    amqp_reuse: AmqpReuse | None
    amqp_mux: AmqpMultiplex | None
    logins: Gate  # adapter.max_logins_in_flight

    @property
    def descriptors(self) -> DescriptorWatch: ...

    @property
    def stats(self) -> LoginFailures: ...


class OwnLoginServices(Protocol):
    """What a login of the adapter's own uses of the server (``own_login``)."""

    broker: BrokerSettings
    nodes: BrokerNodes
    login_timeout: float
    logins: Gate  # it takes its turn like a client's (adapter.max_logins_in_flight)

    @property
    def descriptors(self) -> DescriptorWatch: ...

    @property
    def stats(self) -> LoginFailures: ...


@dataclass(slots=True)
class _OwnLoginView:
    """The server as such a login sees it: without the reuse pool or the shared connections."""

    broker: BrokerSettings
    nodes: BrokerNodes
    login_timeout: float
    descriptors: DescriptorWatch
    stats: LoginFailures
    logins: Gate
    amqp_reuse: AmqpReuse | None = None
    amqp_mux: AmqpMultiplex | None = None


def own_login(services: OwnLoginServices, loop: asyncio.AbstractEventLoop) -> BrokerLogin:
    """The login of a connection the adapter opens on a logged-in session's behalf, with its
    credentials (a shared subscription's: adapter/sharing/runtime.py; a probe:
    adapter/amqp/probe_runtime.py): a connection of its own, never pooled, taken from the pool
    nor multiplexed."""
    return BrokerLogin(
        _OwnLoginView(
            services.broker,
            services.nodes,
            services.login_timeout,
            services.descriptors,
            services.stats,
            services.logins,
        ),
        loop,
    )


def probe_login(services: OwnLoginServices) -> ProbeLogin:
    """The login of a probe connection (adapter/amqp/probe_runtime.py): ``own_login`` with the
    session's credentials, a refusal raised as the error the session's call meets."""

    async def open_probe(user: str, password: str, vhost: str, ended: Callable[[], bool]) -> AmqpConnection:
        result = await own_login(services, asyncio.get_running_loop()).open(
            ops.OpenConnection(user, password, vhost), Unheard(), "probe", ended
        )
        if isinstance(result, ops.LoginResult):
            raise login_refused(result)
        return cast(AmqpConnection, result)  # a login of its own: never a shared channel

    return open_probe


def login_refused(result: ops.LoginResult) -> AmqpError:
    """A refused ``own_login`` as the error the session's call meets: the session logged in
    with these credentials before, so they changed since (or the broker is unreachable)."""
    code = 403 if result.failure == "auth" else 530 if result.failure == "vhost" else 0
    return AmqpError(code, f"ACCESS_REFUSED - {result.detail}" if code == 403 else result.detail)


class BrokerLogin:
    """The AMQP side of one client's CONNECT (and of its connection's release at the end)."""

    __slots__ = ("_loop", "_services", "opener")

    def __init__(self, services: LoginServices, loop: asyncio.AbstractEventLoop) -> None:
        self._services = services
        self._loop = loop
        # with multiplexing, a fresh login opens a connection to share
        self.opener: Opener = AmqpConnection.open if services.amqp_mux is None else SharedConnection.open

    @property
    def reusing(self) -> bool:
        """adapter.amqp_connection_reuse or multiplexing is on (a link is released, not closed)."""
        return self._services.amqp_reuse is not None or self._services.amqp_mux is not None

    def pooled(self, op: ops.OpenConnection, events: BrokerEvents) -> SessionLink | None:
        """With adapter.amqp_connection_reuse: a pooled connection of this user, vhost and
        passcode, with a fresh channel number (adapter/amqp/pool_runtime.py); with
        adapter.amqp_sessions_per_connection above 1, a channel on a shared connection of theirs
        with room, no I/O (adapter/amqp/multiplex_runtime.py); None: log in afresh, and the broker
        decides, as without either."""
        mux = self._services.amqp_mux
        reuse = self._services.amqp_reuse
        if mux is None and reuse is None:
            return None  # neither: every login is afresh
        if read_claims(op.password) is not None:
            # an OAuth 2.0 token: a connection of its own (docs/configuration.md, "OAuth 2.0
            # tokens"): update-secret changes a whole connection's rights
            return None
        # the configured order: attempt_order() would advance the round robin of fresh logins
        labels = (node.label for node in self._services.nodes.nodes)
        if mux is not None:
            return mux.admit(labels, op.user, op.vhost, op.password, events)
        assert reuse is not None
        return reuse.acquire(labels, op.user, op.vhost, op.password, events)

    async def open(
        self, op: ops.OpenConnection, events: BrokerEvents, peer: str, closed: Callable[[], bool]
    ) -> SessionLink | ops.LoginResult:
        """Log in on the first node that answers, once the login's turn has come (at most
        adapter.max_logins_in_flight at once: adapter/amqp/admission.py).  ``closed``: the
        client went away meanwhile (the login timeout closed it), so stop trying."""
        async with turn(self._services.logins):
            return await self._open(op, events, peer, closed)

    async def _open(
        self, op: ops.OpenConnection, events: BrokerEvents, peer: str, closed: Callable[[], bool]
    ) -> SessionLink | ops.LoginResult:
        services = self._services
        broker = services.broker
        nodes = services.nodes
        failures = services.stats.amqp_connection_failures
        deadline = self._loop.time() + services.login_timeout
        reuse = services.amqp_reuse
        mux = services.amqp_mux
        opener = self.opener
        if read_claims(op.password) is not None:
            # an OAuth 2.0 token: never pooled nor shared (see ``pooled``)
            reuse = mux = None
            if opener == SharedConnection.open:
                opener = AmqpConnection.open
        for node in nodes.attempt_order():
            # closed meanwhile (by the login timeout; a client that leaves is not seen yet:
            # its socket is not read while a broker call is pending)
            if closed():
                return ops.LoginResult(False, "other", "closed")
            remaining = deadline - self._loop.time()
            if remaining <= 0:
                break
            target = node.resolver.target()
            try:
                amqp = await opener(
                    events,
                    host=target,
                    port=node.port,
                    user=op.user,
                    password=op.password,
                    vhost=op.vhost,
                    heartbeat=broker.heartbeat,
                    timeout=min(broker.connect_timeout, remaining),
                    connection_name=f"STOMP {peer}",
                    ssl_context=broker.tls if node.tls else None,
                    server_hostname=(broker.tls_server_name or node.host) if node.tls else None,
                    reusable=reuse is not None,
                )
            except AmqpError as error:
                log.info(
                    "login refused peer=%s user=%s vhost=%s node=%s: %s",
                    peer,
                    op.user,
                    op.vhost,
                    node.label,
                    error.text,
                )
                if error.code == 403 or (error.phase == "auth" and error.code == 0):
                    # RabbitMQ closes the socket on a failed login (authentication_failure_close)
                    failures["access_refused"] += 1
                    return ops.LoginResult(False, "auth", error.text)
                if error.code in (530, 402) or error.phase == "vhost":
                    failures["vhost"] += 1
                    return ops.LoginResult(False, "vhost", error.text)
                failures["refused"] += 1
                # the broker's text may name its node or the adapter's internals: logged above,
                # and the client gets the plugin's body for a login that failed otherwise
                return ops.LoginResult(False, "other")
            except ssl.SSLError as error:
                failures["tls"] += 1
                nodes.failed(node)
                if isinstance(error, ssl.SSLCertVerificationError):
                    problem = f"TLS certificate verification failed for {node.label}: {error.verify_message}"
                else:
                    problem = f"TLS handshake with {node.label} failed: {tls_failure(error)}"
                log.warning("peer=%s: %s (%s)", peer, problem, error)
            except (OSError, TimeoutError) as error:
                if isinstance(error, OSError) and error.errno in EXHAUSTED:
                    failures["file_descriptors"] += 1
                    services.descriptors.exhausted(f"cannot open an AMQP connection: {error.strerror}")
                    return ops.LoginResult(
                        False, "other", "The adapter is out of file descriptors, try again later"
                    )
                counted_as, what = node_failure(error)
                failures[counted_as] += 1
                nodes.failed(node)
                log.warning("peer=%s: broker node %s %s", peer, node.label, what)
            else:
                nodes.connected(node, target, amqp.peer_address)
                nodes.announced(node, amqp.broker_version)  # logged and exported once per node
                if mux is not None:
                    return mux.logged_in(amqp, node.label, op.user, op.vhost, op.password, events)
                assert not isinstance(amqp, SharedConnection), "a shared connection without multiplexing"
                if reuse is not None:
                    reuse.logged_in(amqp, node.label, op.user, op.vhost, op.password)
                return amqp
        # the client has not logged in: it learns no node, address, certificate problem or
        # setting (the log above has them all), only what an unreachable broker tells it
        return ops.LoginResult(False, "other", "The broker is unreachable, try again later")

    async def release(self, amqp: SessionLink, *, queues_to_delete: bool, session_failed: bool) -> None:
        """The session is done with its AMQP link: close it, or, with
        adapter.amqp_connection_reuse, give it back to the pool if nothing of the session can
        outlive its channel (adapter/amqp/pool_runtime.py decides), or, with multiplexing, close
        its channel on the shared connection (adapter/amqp/multiplex_runtime.py)."""
        mux = self._services.amqp_mux
        if mux is not None and isinstance(amqp, ChannelLink):
            await mux.release(amqp)
            return
        reuse = self._services.amqp_reuse
        if reuse is not None and isinstance(amqp, AmqpConnection):
            await reuse.release(amqp, queues_to_delete=queues_to_delete, session_failed=session_failed)
        else:
            await amqp.close()


def node_failure(error: OSError | TimeoutError) -> tuple[str, str]:
    """How a broker node failed a login, for the log and the counter
    (``stomp_adapter_amqp_connection_failures_total{reason}``): an operator must tell a broker
    that is down (nothing listens: refused) from one that is up but out of sockets or file
    descriptors (it resets or closes the connection during the handshake, or accepts and never
    answers) and from a network that drops the packets (no TCP connection in time), and a port
    where no AMQP broker listens at all (another protocol answered)."""
    text = str(error) or type(error).__name__
    if isinstance(error, HandshakeTimeout) and error.connected:
        return "timeout", (
            f"did not answer the AMQP handshake ({text}): a broker out of sockets or file"
            " descriptors, or overloaded, leaves new connections unanswered"
        )
    if isinstance(error, HandshakeTimeout):
        return "timeout", (
            f"timed out ({text}): the host is down, a firewall drops the packets, or the"
            " broker's accept queue is full"
        )
    if isinstance(error, TimeoutError):
        return "timeout", f"timed out: {text}"
    if isinstance(error, NotAmqp):
        return "unreachable", (
            f"is not an AMQP 0-9-1 broker: {text} (is the URL's port the broker's AMQP port?)"
        )
    if isinstance(error, ConnectionRefusedError):
        return "unreachable", (
            f"refused the connection (nothing listens on the port: is the broker down or starting?): {text}"
        )
    if isinstance(error, ConnectionResetError) and error.errno is None:
        # AmqpConnection's own: the node ended the connection during the handshake
        if text.startswith("the node reset"):
            return "reset", (
                f"reset the connection during the AMQP handshake ({text}): a broker out of"
                " sockets or file descriptors, or a proxy without a backend, does this"
            )
        return "reset", f"closed the connection during the AMQP handshake ({text})"
    if isinstance(error, ConnectionResetError):
        return "reset", f"reset the connection: {text}"
    return "unreachable", f"is unreachable: {text}"


def logged_in(amqp: SessionLink) -> ops.LoginResult:
    """The successful result: the broker's product/version (the CONNECTED frame's ``server``)
    and its generation (which queue arguments it takes)."""
    props = amqp.server_properties
    product = _text(props.get("product", "RabbitMQ"))
    version = _text(props.get("version", ""))
    server = f"{product}/{version}" if version else product
    return ops.LoginResult(True, server_version=server, broker=amqp.broker_generation)


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


# OpenSSL's reason codes for a failed handshake with a broker node, in an operator's words
_TLS_CLIENT_CERTIFICATE_REFUSED = frozenset(
    {
        "TLSV1_ALERT_UNKNOWN_CA",
        "SSLV3_ALERT_BAD_CERTIFICATE",
        "SSLV3_ALERT_CERTIFICATE_UNKNOWN",
        "SSLV3_ALERT_CERTIFICATE_EXPIRED",
        "SSLV3_ALERT_CERTIFICATE_REVOKED",
        "SSLV3_ALERT_UNSUPPORTED_CERTIFICATE",
        "TLSV1_ALERT_ACCESS_DENIED",
    }
)
_TLS_NO_COMMON_VERSION = frozenset(
    {"TLSV1_ALERT_PROTOCOL_VERSION", "UNSUPPORTED_PROTOCOL", "NO_PROTOCOLS_AVAILABLE", "WRONG_SSL_VERSION"}
)


def tls_failure(error: ssl.SSLError) -> str:
    """What went wrong in a TLS handshake with a broker node (the log keeps OpenSSL's text)."""
    reason = error.reason or ""
    if reason == "TLSV13_ALERT_CERTIFICATE_REQUIRED":
        return "the broker requires a client certificate (adapter.amqp_tls_certfile and _keyfile)"
    if reason in _TLS_CLIENT_CERTIFICATE_REFUSED:
        return f"the broker refused the adapter's client certificate ({reason.lower()})"
    if reason in _TLS_NO_COMMON_VERSION:
        return "no TLS version in common with the broker (adapter.amqp_tls_min_version)"
    if reason == "SSLV3_ALERT_HANDSHAKE_FAILURE":
        return "the broker ended the handshake: it may require a client certificate, or share no cipher"
    if reason == "WRONG_VERSION_NUMBER":
        return "the node does not answer in TLS (is it a plain amqp:// port?)"
    return reason.lower().replace("_", " ") or str(error)
