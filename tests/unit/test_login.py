"""adapter/amqp/login.py: the broker-node loop, its failure results and counters, and the TLS
diagnosis, with an in-memory opener instead of sockets."""

from __future__ import annotations

import asyncio
import errno
import ssl
from dataclasses import dataclass, field
from typing import Any

import pytest

from adapter.amqp.admission import Gate
from adapter.amqp.brokers import BrokerNodes, parse_nodes
from adapter.amqp.connection import AmqpError, HandshakeTimeout
from adapter.amqp.login import BrokerLogin, logged_in, node_failure, tls_failure
from adapter.mapping import operations as ops
from adapter.server.connection import BrokerSettings
from adapter.server.fdlimit import DescriptorWatch
from adapter.server.stats import ServerStats
from tests.unit.fake_amqp import FakeAmqp, Opener

LOGIN = ops.OpenConnection(user="guest", password="guest", vhost="/")


@dataclass
class Services:
    nodes: BrokerNodes
    broker: BrokerSettings = field(default_factory=lambda: BrokerSettings(60, 5.0))
    login_timeout: float = 10.0
    amqp_reuse: Any = None
    amqp_mux: Any = None
    descriptors: DescriptorWatch = field(default_factory=DescriptorWatch)
    stats: ServerStats = field(default_factory=ServerStats)
    logins: Gate = field(default_factory=lambda: Gate(64))


def make(urls: str, *errors: Exception | None) -> tuple[BrokerLogin, Services, Opener]:
    services = Services(BrokerNodes(parse_nodes(urls)))
    login = BrokerLogin(services, asyncio.get_running_loop())
    opener = Opener(*errors)
    login.opener = opener
    return login, services, opener


TWO = "amqp://guest:guest@node-a:5672/,amqp://guest:guest@node-b:5672/"


async def open_(login: BrokerLogin, closed: bool = False) -> FakeAmqp | ops.LoginResult:
    return await login.open(LOGIN, object(), "10.0.0.1:4000", lambda: closed)  # type: ignore[arg-type]


async def test_the_first_node_that_answers_is_used() -> None:
    login, services, opener = make(TWO)
    result = await open_(login)
    assert isinstance(result, FakeAmqp)
    (attempt,) = opener.attempts
    assert attempt["user"] == "guest" and attempt["connection_name"] == "STOMP 10.0.0.1:4000"
    assert attempt["heartbeat"] == 60 and attempt["ssl_context"] is None and not attempt["reusable"]
    assert services.nodes.nodes[0].announced is not None  # its version was noted


async def test_an_unreachable_node_is_skipped_and_rested() -> None:
    login, services, opener = make(TWO, ConnectionRefusedError(errno.ECONNREFUSED, "refused"))
    result = await open_(login)
    assert isinstance(result, FakeAmqp)
    assert len(opener.attempts) == 2
    assert services.stats.amqp_connection_failures["unreachable"] == 1
    assert sum(node.failed_at is not None for node in services.nodes.nodes) == 1


async def test_a_timeout_is_counted_as_such() -> None:
    login, services, _opener = make(TWO, TimeoutError())
    assert isinstance(await open_(login), FakeAmqp)
    assert services.stats.amqp_connection_failures["timeout"] == 1


async def test_every_node_unreachable_tells_the_client_nothing_more() -> None:
    login, services, _opener = make(TWO, OSError(errno.EHOSTUNREACH, "no route"), TimeoutError())
    result = await open_(login)
    assert result == ops.LoginResult(False, "other", "The broker is unreachable, try again later")
    assert "node-a" not in result.detail and "node-b" not in result.detail


async def test_refused_credentials_are_final() -> None:
    login, services, opener = make(TWO, AmqpError(403, "ACCESS_REFUSED - Login was refused", phase="auth"))
    result = await open_(login)
    assert isinstance(result, ops.LoginResult) and result.failure == "auth"
    assert len(opener.attempts) == 1  # the second node is not asked
    assert services.stats.amqp_connection_failures["access_refused"] == 1


async def test_a_closed_socket_during_auth_is_a_refused_login() -> None:
    login, _services, _opener = make(TWO, AmqpError(0, "socket closed", phase="auth"))
    result = await open_(login)
    assert isinstance(result, ops.LoginResult) and result.failure == "auth"


async def test_a_missing_vhost_is_final() -> None:
    login, services, _opener = make(TWO, AmqpError(530, "NOT_ALLOWED - vhost x not found"))
    result = await open_(login)
    assert isinstance(result, ops.LoginResult) and result.failure == "vhost"
    assert services.stats.amqp_connection_failures["vhost"] == 1


async def test_another_broker_refusal_hides_the_brokers_text() -> None:
    login, services, _opener = make(TWO, AmqpError(541, "INTERNAL_ERROR on node rabbit@secret-host"))
    result = await open_(login)
    assert result == ops.LoginResult(False, "other")
    assert services.stats.amqp_connection_failures["refused"] == 1


async def test_out_of_descriptors_is_said_and_not_retried() -> None:
    login, services, opener = make(TWO, OSError(errno.EMFILE, "Too many open files"))
    result = await open_(login)
    assert isinstance(result, ops.LoginResult) and "file descriptors" in result.detail
    assert len(opener.attempts) == 1
    assert services.stats.amqp_connection_failures["file_descriptors"] == 1


async def test_a_tls_failure_is_counted_and_the_next_node_tried() -> None:
    error = ssl.SSLError(1, "[SSL: WRONG_VERSION_NUMBER] wrong version number")
    error.reason = "WRONG_VERSION_NUMBER"
    login, services, opener = make(TWO, error)
    assert isinstance(await open_(login), FakeAmqp)
    assert len(opener.attempts) == 2
    assert services.stats.amqp_connection_failures["tls"] == 1


async def test_a_login_the_client_left_stops_trying() -> None:
    login, _services, opener = make(TWO)
    result = await open_(login, closed=True)
    assert result == ops.LoginResult(False, "other", "closed") and opener.attempts == []


async def test_no_time_left_means_unreachable() -> None:
    login, services, opener = make(TWO)
    services.login_timeout = 0
    result = await open_(login)
    assert isinstance(result, ops.LoginResult) and "unreachable" in result.detail
    assert opener.attempts == []


async def test_without_reuse_nothing_is_pooled_and_release_closes() -> None:
    login, _services, _opener = make(TWO)
    assert not login.reusing
    assert login.pooled(LOGIN, object()) is None  # type: ignore[arg-type]
    link = FakeAmqp(None)
    await login.release(link, queues_to_delete=False, session_failed=False)  # type: ignore[arg-type]
    assert link.closed


def test_the_login_result_names_the_broker() -> None:
    result = logged_in(FakeAmqp(None, version="3.13.7"))  # type: ignore[arg-type]
    assert result.ok and result.server_version == "RabbitMQ/3.13.7"


def tls_error(reason: str) -> ssl.SSLError:
    error = ssl.SSLError(1, reason)
    error.reason = reason
    return error


def test_tls_failures_in_an_operators_words() -> None:
    assert "client certificate" in tls_failure(tls_error("TLSV13_ALERT_CERTIFICATE_REQUIRED"))
    assert "refused the adapter's client certificate" in tls_failure(tls_error("TLSV1_ALERT_UNKNOWN_CA"))
    assert "no TLS version in common" in tls_failure(tls_error("UNSUPPORTED_PROTOCOL"))
    assert "ended the handshake" in tls_failure(tls_error("SSLV3_ALERT_HANDSHAKE_FAILURE"))
    assert "plain amqp://" in tls_failure(tls_error("WRONG_VERSION_NUMBER"))
    assert tls_failure(tls_error("SOME_NEW_REASON")) == "some new reason"


# ---------------------------------------------------------------------- how a node failed, in the log
@pytest.mark.parametrize(
    ("error", "counted_as", "said"),
    [
        (
            ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"),
            "unreachable",
            "refused the connection",
        ),
        (
            ConnectionResetError("the node reset the connection before connection.start: [Errno 104] reset"),
            "reset",
            "reset the connection during the AMQP handshake",
        ),
        (
            ConnectionResetError("the node closed the connection before connection.start"),
            "reset",
            "closed the connection during the AMQP handshake (the node closed",
        ),
        (ConnectionResetError(errno.ECONNRESET, "Connection reset by peer"), "reset", "reset the connection"),
        (HandshakeTimeout(5, True, "connect"), "timeout", "did not answer the AMQP handshake (TCP connected"),
        (HandshakeTimeout(5, False, "connect"), "timeout", "timed out (no TCP connection within 5 s)"),
        (TimeoutError(), "timeout", "timed out"),
        (OSError(errno.EHOSTUNREACH, "No route to host"), "unreachable", "is unreachable"),
    ],
)
def test_the_log_says_how_a_node_failed(error: OSError, counted_as: str, said: str) -> None:
    reason, text = node_failure(error)
    assert reason == counted_as
    assert text.startswith(said), text


def test_a_refused_node_is_not_called_out_of_sockets_and_a_silent_one_is() -> None:
    assert "out of sockets" not in node_failure(ConnectionRefusedError(errno.ECONNREFUSED, "x"))[1]
    assert "out of sockets" in node_failure(HandshakeTimeout(5, True, "connect"))[1]


class _Sharing:
    """A reuse pool and a multiplexing registry that record what they are asked."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def acquire(self, *args: Any) -> None:
        self.asked.append("acquire")

    def admit(self, *args: Any) -> None:
        self.asked.append("admit")

    def logged_in(self, *args: Any) -> Any:
        self.asked.append("logged_in")
        return args[0]


async def test_a_token_login_is_never_shared_nor_pooled() -> None:
    """update-secret changes a whole connection's rights: an OAuth 2.0 token login gets a
    connection of its own, whatever reuse or multiplexing say (docs/configuration.md)."""
    token = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJhbGljZSJ9.c2ln"  # {"alg":"RS256"}.{"sub":"alice"}
    for setting in ("amqp_reuse", "amqp_mux"):
        login, services, opener = make(TWO)
        sharing = _Sharing()
        setattr(services, setting, sharing)
        op = ops.OpenConnection("", token, "/")
        assert login.pooled(op, object()) is None  # type: ignore[arg-type]
        result = await login.open(op, object(), "10.0.0.1:4000", lambda: False)  # type: ignore[arg-type]
        assert isinstance(result, FakeAmqp) and not opener.attempts[0]["reusable"]
        assert sharing.asked == []
        # a password login still shares as configured
        login.pooled(LOGIN, object())  # type: ignore[arg-type]
        assert sharing.asked == ["acquire" if setting == "amqp_reuse" else "admit"]
