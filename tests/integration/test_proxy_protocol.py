"""stomp.proxy_protocol = true: HAProxy in front of the adapter sends PROXY v1 and v2 headers,
and the adapter takes the client's address from them (log, loopback_users); a connection
without a valid header is closed at once, a header that never completes by the login timeout."""

from __future__ import annotations

import contextlib
import logging
import shutil
import socket
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

from tests.support import free_port, read_frames, wait_for_port

CONNECT = b"CONNECT\naccept-version:1.2\nhost:/\nlogin:guest\npasscode:guest\n\n\0"


@contextlib.contextmanager
def haproxy(tmp_path: Path, frontends: str, ports: tuple[int, ...]) -> Iterator[None]:
    """Debian's HAProxy (mode tcp) with these frontends and backends, until the block ends."""
    binary = shutil.which("haproxy")
    assert binary, "haproxy is not installed: .ci/run installs Debian's haproxy"
    config = tmp_path / "haproxy.cfg"
    config.write_text(
        "defaults\n  mode tcp\n  timeout connect 5s\n  timeout client 30s\n  timeout server 30s\n" + frontends
    )
    log = (tmp_path / "haproxy.log").open("wb")
    process = subprocess.Popen([binary, "-db", "-f", str(config)], stdout=log, stderr=subprocess.STDOUT)
    try:
        for port in ports:
            wait_for_port(port, process, "haproxy", tmp_path / "haproxy.log")
        yield
    finally:
        process.terminate()
        process.wait(10)
        log.close()


@pytest.fixture
def proxied(start_adapter, tmp_path: Path) -> Iterator[tuple[object, int, int, int, Path]]:  # type: ignore[no-untyped-def]
    """The adapter with stomp.proxy_protocol, and HAProxy ports sending v1 and v2 to it."""
    adapter = start_adapter(proxy_protocol=True, login_timeout=2)
    v1, v2, tls = free_port(), free_port(), free_port()
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    ca.issue_cert("localhost", "127.0.0.1").private_key_and_cert_chain_pem.write_to_path(
        str(tmp_path / "tls.pem")
    )
    frontends = (
        f"frontend v1\n  bind 127.0.0.1:{v1}\n  default_backend adapter_v1\n"
        f"backend adapter_v1\n  server a 127.0.0.1:{adapter.port} send-proxy\n"
        f"frontend v2\n  bind 127.0.0.1:{v2}\n  default_backend adapter_v2\n"
        f"backend adapter_v2\n  server a 127.0.0.1:{adapter.port} send-proxy-v2\n"
        # HAProxy terminating TLS for STOMP clients, passing the client's address on
        f"frontend tls\n  bind 127.0.0.1:{tls} ssl crt {tmp_path / 'tls.pem'}\n  default_backend adapter_v2\n"
    )
    with haproxy(tmp_path, frontends, (v1, v2, tls)):
        yield adapter, v1, v2, tls, tmp_path / "ca.pem"


def connected_and_seen_as(sock: socket.socket, client_port: int, caplog: pytest.LogCaptureFixture) -> None:
    """CONNECT through the proxy succeeds, and the adapter logged the client's own address."""
    sock.sendall(CONNECT)
    frames, _ = read_frames(sock, timeout=5, count=1)
    assert frames and frames[0].startswith(b"CONNECTED"), frames
    lines = [r.getMessage() for r in caplog.records if "via proxy" in r.getMessage()]
    assert any(f"peer=127.0.0.1:{client_port} via proxy" in line for line in lines), lines


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_client_address_comes_from_haproxy(proxied, caplog, version):
    caplog.set_level(logging.INFO, logger="adapter.connection")
    _adapter, v1, v2, _tls, _ca = proxied
    with socket.create_connection(("127.0.0.1", v1 if version == "v1" else v2), timeout=5) as sock:
        client_port = sock.getsockname()[1]
        connected_and_seen_as(sock, client_port, caplog)


def test_the_header_decides_loopback_users(proxied):
    """guest may only log in from a loopback address: the header's address counts, not the
    proxy's (which is on this machine)."""
    adapter, _v1, _v2, _tls, _ca = proxied
    with socket.create_connection(("127.0.0.1", adapter.port), timeout=5) as sock:
        sock.sendall(b"PROXY TCP4 203.0.113.9 127.0.0.1 50000 61613\r\n" + CONNECT)
        frames, closed = read_frames(sock, timeout=5, count=1)
    assert frames[0].startswith(b"ERROR") and b"non-loopback access denied" in frames[0], frames


@pytest.mark.parametrize(
    "data",
    [CONNECT, b"PROXY TCP4 not an address\r\n" + CONNECT, b"\r\n\r\n\x00\r\nQUIX\n" + bytes(8)],
    ids=["missing", "malformed v1", "bad v2 signature"],
)
def test_without_a_valid_header_the_connection_is_closed_at_once(proxied, caplog, data):
    adapter, _v1, v2, _tls, _ca = proxied
    with socket.create_connection(("127.0.0.1", adapter.port), timeout=5) as sock:
        sock.sendall(data)
        frames, closed = read_frames(sock, timeout=1.5)
    assert frames == [] and closed
    assert any("closing connection from proxy" in r.getMessage() for r in caplog.records)
    # others keep being served
    with socket.create_connection(("127.0.0.1", v2), timeout=5) as sock:
        sock.sendall(CONNECT)
        assert read_frames(sock, timeout=5, count=1)[0][0].startswith(b"CONNECTED")


def test_a_header_that_never_completes_ends_at_the_login_timeout(proxied, caplog):
    """Closed at the login timeout without a STOMP ERROR (the peer is a proxy that has not
    said whose connection it is), and the log says why."""
    adapter, _v1, _v2, _tls, _ca = proxied
    with socket.create_connection(("127.0.0.1", adapter.port), timeout=5) as sock:
        sock.sendall(b"PROXY TCP4 10.1.2.3")
        frames, closed = read_frames(sock, timeout=6)
    assert closed and frames == []
    assert any(
        "no complete PROXY header within the login timeout" in r.getMessage() for r in caplog.records
    ), [r.getMessage() for r in caplog.records]


def test_haproxy_terminating_tls(proxied, caplog):
    """A STOMP client speaks TLS to HAProxy, which passes the plain stream and a PROXY v2 header
    on: the adapter serves it and logs the client's own address."""
    caplog.set_level(logging.INFO, logger="adapter.connection")
    _adapter, _v1, _v2, tls, ca = proxied
    context = ssl.create_default_context(cafile=str(ca))
    with (
        socket.create_connection(("127.0.0.1", tls), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname="localhost") as sock,
    ):
        connected_and_seen_as(sock, sock.getsockname()[1], caplog)


def tls_listener_with_proxy_protocol(start_adapter, tmp_path: Path, login_timeout: float = 1):  # type: ignore[no-untyped-def]
    """An adapter whose TLS listener expects PROXY headers, with a certificate for localhost from
    a CA written to tmp_path/ca.pem; the adapter and the TLS port."""
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    ca.issue_cert("localhost", "127.0.0.1").private_key_and_cert_chain_pem.write_to_path(
        str(tmp_path / "tls.pem")
    )
    adapter = start_adapter(
        proxy_protocol=True,
        login_timeout=login_timeout,
        ssl_listeners=["127.0.0.1:0"],
        ssl_certfile=str(tmp_path / "tls.pem"),
    )
    return adapter, adapter.server.tls_addresses[0][1]


@pytest.fixture
def proxied_tls(start_adapter, tmp_path: Path) -> Iterator[tuple[object, int, int, Path]]:  # type: ignore[no-untyped-def]
    """The adapter's TLS listener with stomp.proxy_protocol, behind HAProxy passing TLS through
    (mode tcp, no termination) with a PROXY v1 or v2 header in front of the handshake."""
    adapter, tls_port = tls_listener_with_proxy_protocol(start_adapter, tmp_path, login_timeout=2)
    v1, v2 = free_port(), free_port()
    frontends = (
        f"frontend v1\n  bind 127.0.0.1:{v1}\n  default_backend tls_v1\n"
        f"backend tls_v1\n  server a 127.0.0.1:{tls_port} send-proxy\n"
        f"frontend v2\n  bind 127.0.0.1:{v2}\n  default_backend tls_v2\n"
        f"backend tls_v2\n  server a 127.0.0.1:{tls_port} send-proxy-v2\n"
    )
    with haproxy(tmp_path, frontends, (v1, v2)):
        yield adapter, v1, v2, tmp_path / "ca.pem"


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_proxy_header_before_the_tls_handshake(proxied_tls, caplog, version):
    """stomp.proxy_protocol applies to TLS listeners too: the header comes before the handshake
    (HAProxy passing TLS through), and the adapter logs the client's own address."""
    caplog.set_level(logging.INFO, logger="adapter.connection")
    _adapter, v1, v2, ca = proxied_tls
    context = ssl.create_default_context(cafile=str(ca))
    with (
        socket.create_connection(("127.0.0.1", v1 if version == "v1" else v2), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname="localhost") as sock,
    ):
        connected_and_seen_as(sock, sock.getsockname()[1], caplog)


def test_tls_listener_without_a_proxy_header_is_closed(proxied_tls, caplog):
    """A TLS handshake straight to the listener, with no PROXY header first, is refused and
    logged; clients through the proxy are still served."""
    adapter, _v1, v2, ca = proxied_tls
    context = ssl.create_default_context(cafile=str(ca))
    port = adapter.server.tls_addresses[0][1]
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        pytest.raises((ssl.SSLError, OSError)),
        context.wrap_socket(raw, server_hostname="localhost"),
    ):
        pass
    assert any("closing connection from proxy" in r.getMessage() for r in caplog.records)
    with (
        socket.create_connection(("127.0.0.1", v2), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname="localhost") as sock,
    ):
        sock.sendall(CONNECT)
        assert read_frames(sock, timeout=5, count=1)[0][0].startswith(b"CONNECTED")


def test_a_slow_proxy_header_on_a_tls_listener_is_named_at_the_login_timeout(start_adapter, tmp_path, caplog):
    _adapter, port = tls_listener_with_proxy_protocol(start_adapter, tmp_path)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"PROXY TCP4 10.1.2.3")  # and no more
        assert sock.recv(64) == b""  # closed by the adapter at the login timeout
    assert any(
        "no complete PROXY header within the login timeout" in r.getMessage() for r in caplog.records
    ), [r.getMessage() for r in caplog.records]


def test_shutdown_closes_a_tls_connection_still_waiting_for_its_proxy_header(start_adapter, tmp_path):
    adapter, port = tls_listener_with_proxy_protocol(start_adapter, tmp_path)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"PROXY TCP4 10.1.2.3")
        adapter.stop()  # well before the login timeout
        sock.settimeout(0.5)
        with contextlib.suppress(ConnectionResetError):  # a reset if the header was still unread
            assert sock.recv(64) == b""


# ------------------------------------------------------------------ adapter.proxy_protocol_trusted
# All test traffic is on loopback: HAProxy connects to the adapter from 127.0.0.2 (the trusted
# proxy), the attacker from 127.0.0.1, which the list leaves out.
TRUSTED = "127.0.0.2"
CLAIMS_LOOPBACK = b"PROXY TCP4 127.0.0.1 127.0.0.1 50000 61613\r\n"


def refused_as_untrusted(adapter, caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    assert any(
        "adapter.proxy_protocol_trusted" in r.getMessage() and "127.0.0.1" in r.getMessage()
        for r in caplog.records
    ), [r.getMessage() for r in caplog.records]

    async def refused() -> int:
        return adapter.server.context.stats.connections_refused["proxy_untrusted"]

    assert adapter.run(refused()) == 1


@pytest.fixture
def trusted_haproxy(start_adapter, tmp_path: Path) -> Iterator[tuple[object, int]]:  # type: ignore[no-untyped-def]
    """The adapter with stomp.proxy_protocol trusting only 127.0.0.2, and HAProxy in front of it
    connecting from that address; the adapter and HAProxy's port."""
    adapter = start_adapter(proxy_protocol=True, proxy_protocol_trusted=[TRUSTED], login_timeout=2)
    front = free_port()
    frontends = (
        f"frontend f\n  bind 127.0.0.1:{front}\n  default_backend b\n"
        f"backend b\n  server a 127.0.0.1:{adapter.port} send-proxy-v2 source {TRUSTED}\n"
    )
    with haproxy(tmp_path, frontends, (front,)):
        yield adapter, front


def test_a_proxy_header_from_an_untrusted_peer_is_refused(trusted_haproxy, caplog):
    """A client that reaches the port itself and claims 127.0.0.1 in a PROXY header (to log in
    as guest past loopback_users) is closed before any STOMP byte, and logged and counted; a
    client through the trusted HAProxy is served throughout."""
    caplog.set_level(logging.INFO, logger="adapter.connection")
    adapter, front = trusted_haproxy
    with socket.create_connection(("127.0.0.1", front), timeout=5) as bystander:
        connected_and_seen_as(bystander, bystander.getsockname()[1], caplog)
        with socket.create_connection(
            ("127.0.0.1", adapter.port), timeout=5, source_address=("127.0.0.1", 0)
        ) as sock:
            sock.sendall(CLAIMS_LOOPBACK + CONNECT)
            frames, closed = read_frames(sock, timeout=5)
        assert frames == [] and closed
        bystander.sendall(b"SUBSCRIBE\nid:0\ndestination:/topic/t\nreceipt:still-served\n\n\0")
        receipt, _ = read_frames(bystander, timeout=5, count=1)
        assert receipt and receipt[0].startswith(b"RECEIPT"), receipt
    refused_as_untrusted(adapter, caplog)


def test_an_untrusted_peer_on_a_tls_listener_is_refused_before_the_handshake(start_adapter, tmp_path, caplog):
    trustme.CA().issue_cert("localhost").private_key_and_cert_chain_pem.write_to_path(
        str(tmp_path / "tls.pem")
    )
    adapter = start_adapter(
        proxy_protocol=True,
        proxy_protocol_trusted=[TRUSTED],
        ssl_listeners=["127.0.0.1:0"],
        ssl_certfile=str(tmp_path / "tls.pem"),
    )
    port = adapter.server.tls_addresses[0][1]
    with socket.create_connection(("127.0.0.1", port), timeout=5, source_address=("127.0.0.1", 0)) as sock:
        sock.sendall(CLAIMS_LOOPBACK)
        with contextlib.suppress(ConnectionResetError):
            assert sock.recv(64) == b""
    refused_as_untrusted(adapter, caplog)


def test_an_untrusted_peer_on_a_websocket_listener_is_refused(start_adapter, caplog):
    adapter = start_adapter(
        web_stomp_listeners=["127.0.0.1:0"], web_stomp_proxy_protocol=True, proxy_protocol_trusted=[TRUSTED]
    )
    port = adapter.server.web_addresses[0][1]
    with socket.create_connection(("127.0.0.1", port), timeout=5, source_address=("127.0.0.1", 0)) as sock:
        sock.sendall(CLAIMS_LOOPBACK + b"GET /ws HTTP/1.1\r\nHost: x\r\n\r\n")
        with contextlib.suppress(ConnectionResetError):
            assert sock.recv(64) == b""
    refused_as_untrusted(adapter, caplog)
    # a trusted peer is still served: its header decides the client's address
    with socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(TRUSTED, 0)) as sock:
        sock.sendall(CLAIMS_LOOPBACK + b"GET /nothing HTTP/1.1\r\nHost: x\r\n\r\n")
        assert sock.recv(100).startswith(b"HTTP/1.1 404")
