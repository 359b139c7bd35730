"""TLS listeners for STOMP clients (stomp.listeners.ssl.<name> and rabbitmq.conf's ssl_options.*),
met by independent TLS clients: stomp.py over TLS and `openssl s_client`, with and without a
client certificate; certificates made by trustme for the test run."""

from __future__ import annotations

import datetime
import logging
import os
import shutil
import socket
import ssl
import subprocess
import time
from pathlib import Path

import pytest
import stomp
import trustme
from cryptography.hazmat.primitives import serialization

from tests.support import free_port, read_frames, run_adapter_with_config, unique, wait_for_port

CONNECT = b"CONNECT\naccept-version:1.2\nhost:/\nlogin:guest\npasscode:guest\n\n\0"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("pki")
    ca = trustme.CA()
    server = ca.issue_cert("localhost", "127.0.0.1")
    client = ca.issue_cert("stomp-client@example")
    files = {
        "ca": directory / "ca.pem",
        "ca_cert": directory / "ca.pem",
        "ca_key": directory / "ca.key",
        "server": directory / "server.pem",
        "server_cert": directory / "server-cert.pem",
        "server_key": directory / "server.key",
        "client": directory / "client.pem",
        "client_cert": directory / "client-cert.pem",
        "client_key": directory / "client.key",
    }
    ca.cert_pem.write_to_path(str(files["ca"]))
    ca.private_key_pem.write_to_path(str(files["ca_key"]))
    for name, cert in (("server", server), ("client", client)):
        cert.private_key_and_cert_chain_pem.write_to_path(str(files[name]))
        cert.cert_chain_pems[0].write_to_path(str(files[f"{name}_cert"]))
        cert.private_key_pem.write_to_path(str(files[f"{name}_key"]))
    return files


def tls_adapter(start_adapter, pki, **settings):  # type: ignore[no-untyped-def]
    adapter = start_adapter(
        ssl_listeners=["127.0.0.1:0"],
        ssl_certfile=str(pki["server"]),
        ssl_cacertfile=str(pki["ca"]),
        **settings,
    )
    return adapter, adapter.server.tls_addresses[0][1]


def test_stomp_py_over_tls(start_adapter, pki):
    adapter, port = tls_adapter(start_adapter, pki)
    conn = stomp.Connection12([("127.0.0.1", port)], vhost="/")
    conn.set_ssl(for_hosts=[("127.0.0.1", port)], ca_certs=str(pki["ca"]))
    listener = stomp.listener.TestListener()
    conn.set_listener("t", listener)
    conn.connect("guest", "guest", wait=True)
    try:
        destination = f"/topic/{unique('tls')}"
        conn.subscribe(destination, id="s")
        conn.send(destination, "over TLS")
        listener.wait_for_message()
        assert listener.get_latest_message()[1] == "over TLS"
    finally:
        conn.disconnect()
    # the plain listener beside it still works
    with socket.create_connection(("127.0.0.1", adapter.port), timeout=5) as sock:
        sock.sendall(CONNECT)
        assert read_frames(sock, timeout=5, count=1)[0][0].startswith(b"CONNECTED")


def s_client(port: int, pki: dict[str, Path], *extra: str) -> str:
    binary = shutil.which("openssl")
    assert binary, "openssl is not installed"
    result = subprocess.run(
        [binary, "s_client", "-connect", f"127.0.0.1:{port}", "-CAfile", str(pki["ca"]), "-quiet", *extra],
        # -quiet keeps reading after our input ends: DISCONNECT makes the adapter close
        input=CONNECT.decode() + "DISCONNECT\nreceipt:bye\n\n\0",
        capture_output=True,
        text=True,
        timeout=20,
    )
    return result.stdout + result.stderr


def test_client_certificate_required(start_adapter, pki):
    _, port = tls_adapter(start_adapter, pki, ssl_verify="verify_peer", ssl_fail_if_no_peer_cert=True)
    with_cert = s_client(port, pki, "-cert", str(pki["client"]))
    assert "CONNECTED" in with_cert, with_cert
    without = s_client(port, pki)
    # refused in the handshake (with TLS 1.3 the server checks the certificate after the
    # client's Finished, so the client sees an alert, a reset or a broken pipe): never CONNECTED
    assert "CONNECTED" not in without, without
    assert "CONNECTED" in s_client(port, pki, "-cert", str(pki["client"]))  # still serving


def test_client_certificate_optional_with_verify_peer(start_adapter, pki):
    _, port = tls_adapter(start_adapter, pki, ssl_verify="verify_peer")
    assert "CONNECTED" in s_client(port, pki)


@pytest.mark.parametrize("mode", ["plain text to the TLS port", "TLS to the plain port"])
def test_the_wrong_protocol_gets_a_close_and_others_are_served(start_adapter, pki, mode):
    adapter, port = tls_adapter(start_adapter, pki)
    if mode == "plain text to the TLS port":
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(CONNECT)
            frames, closed = read_frames(sock, timeout=5)
            assert not frames and closed
    else:
        context = ssl.create_default_context(cafile=str(pki["ca"]))
        with (
            socket.create_connection(("127.0.0.1", adapter.port), timeout=5) as raw,
            pytest.raises((ssl.SSLError, OSError)),
            context.wrap_socket(raw, server_hostname="localhost"),
        ):
            pass
    assert "CONNECTED" in s_client(port, pki)


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_failed_handshakes_leak_nothing(start_adapter, pki):
    """Clients that break off or fail the TLS handshake leave no descriptor or connection behind
    in the adapter (which runs in this process)."""
    adapter, port = tls_adapter(start_adapter, pki, ssl_verify="verify_peer", ssl_fail_if_no_peer_cert=True)
    assert "CONNECTED" in s_client(port, pki, "-cert", str(pki["client"]))  # warm up
    time.sleep(0.5)
    before = open_descriptors()
    for _ in range(10):
        s_client(port, pki)  # no client certificate: refused in the handshake
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(b"not TLS at all\r\n")
            read_frames(sock, timeout=2)
    deadline = time.monotonic() + 5
    while open_descriptors() > before + 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert open_descriptors() <= before + 2, (before, open_descriptors())
    assert adapter.connection_count == 0


def test_failed_handshake_is_logged_with_its_reason(start_adapter, pki, caplog):
    """A handshake that fails gets one INFO line naming the peer and the reason (asyncio itself
    logs it at DEBUG only)."""
    caplog.set_level(logging.INFO, logger="adapter.server")
    _adapter, port = tls_adapter(start_adapter, pki, ssl_verify="verify_peer", ssl_fail_if_no_peer_cert=True)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        client_port = sock.getsockname()[1]
        sock.sendall(CONNECT)  # plain text to the TLS port
        read_frames(sock, timeout=2)
    s_client(port, pki)  # no client certificate where one is required
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        lines = [r.getMessage() for r in caplog.records if "TLS handshake failed" in r.getMessage()]
        if len(lines) >= 2:
            break
        time.sleep(0.05)
    assert any(f"peer=127.0.0.1:{client_port}:" in line for line in lines), lines
    assert len(lines) >= 2 and all(
        r.levelno == logging.INFO for r in caplog.records if "TLS handshake" in r.getMessage()
    )
    assert any("CERTIFICATE" in line.upper() for line in lines), lines


@pytest.mark.parametrize("sends", [b"", b"\x16\x03\x01"])
def test_a_handshake_that_never_completes_ends_at_the_login_timeout(start_adapter, pki, caplog, sends):
    """Nothing, or the first bytes of a ClientHello: closed at the login timeout, logged as such."""
    caplog.set_level(logging.INFO, logger="adapter.server")
    _adapter, port = tls_adapter(start_adapter, pki, login_timeout=1)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(sends)
        assert sock.recv(64) == b""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not any(
        "TLS handshake failed" in r.getMessage() for r in caplog.records
    ):
        time.sleep(0.05)
    lines = [r.getMessage() for r in caplog.records if "TLS handshake failed" in r.getMessage()]
    assert lines and lines[0].endswith("no complete handshake within the login timeout"), lines


def test_no_tls13_session_tickets_as_with_the_plugin(start_adapter, pki):
    """Like the plugin's Erlang TLS server (session tickets off unless configured), a TLS 1.3
    listener sends no session tickets; the STOMP conversation is unchanged."""
    _, port = tls_adapter(start_adapter, pki)
    context = ssl.create_default_context(cafile=str(pki["ca"]))
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    with context.wrap_socket(
        socket.create_connection(("127.0.0.1", port), timeout=5), server_hostname="localhost"
    ) as sock:
        sock.sendall(CONNECT + b"DISCONNECT\nreceipt:bye\n\n\0")
        frames, _ = read_frames(sock, timeout=5, count=2)
        assert frames[0].startswith(b"CONNECTED") and b"receipt-id:bye" in frames[1]
        # tickets come after the handshake, before the first application data: read by now
        assert sock.version() == "TLSv1.3"
        assert sock.session is not None and not sock.session.has_ticket


@pytest.mark.parametrize("kind", ["self-signed", "expired", "from another CA"])
def test_a_bad_client_certificate_is_refused_and_named(start_adapter, pki, tmp_path, caplog, kind):
    """verify_peer with fail_if_no_peer_cert: a client certificate the CA file does not vouch
    for ends the handshake (no CONNECTED), the log names why, and others are still served."""
    caplog.set_level(logging.INFO, logger="adapter.server")
    _adapter, port = tls_adapter(start_adapter, pki, ssl_verify="verify_peer", ssl_fail_if_no_peer_cert=True)
    other = trustme.CA()
    if kind == "self-signed":  # a CA's own certificate is signed by its own key
        pem = other.private_key_pem.bytes() + other.cert_pem.bytes()
    elif kind == "expired":
        ca_of_the_listener = trustme.CA.from_pem(pki["ca_cert"].read_bytes(), pki["ca_key"].read_bytes())
        pem = ca_of_the_listener.issue_cert(
            "stomp-client@example",
            not_before=datetime.datetime(2020, 1, 1, tzinfo=datetime.UTC),
            not_after=datetime.datetime(2021, 1, 1, tzinfo=datetime.UTC),
        ).private_key_and_cert_chain_pem.bytes()
    else:
        pem = other.issue_cert("stomp-client@example").private_key_and_cert_chain_pem.bytes()
    (tmp_path / "client.pem").write_bytes(pem)
    assert "CONNECTED" not in s_client(port, pki, "-cert", str(tmp_path / "client.pem"))
    assert "CONNECTED" in s_client(port, pki, "-cert", str(pki["client"]))
    deadline = time.monotonic() + 5
    lines: list[str] = []
    while not lines and time.monotonic() < deadline:
        lines = [r.getMessage() for r in caplog.records if "TLS handshake failed" in r.getMessage()]
        time.sleep(0.05)
    why = {"self-signed": "self-signed", "expired": "expired", "from another CA": "local issuer"}[kind]
    assert lines and why in lines[0], lines


def test_config_file_contract(tmp_path, amqp_url, pki):
    """The issue's contract in a real adapter process: `--config FILE` with
    stomp.listeners.ssl.<name> = HOST:PORT and the ssl_options.* keys (here a key encrypted with
    ssl_options.password, and TLS 1.3 only) starts a TLS listener beside the --listen one."""
    key = serialization.load_pem_private_key(pki["server_key"].read_bytes(), password=None)
    encrypted = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"s3cret"),
    )
    (tmp_path / "server.key").write_bytes(encrypted)
    tls_port, tcp_port = free_port(), free_port()
    process, log_path = run_adapter_with_config(
        tmp_path,
        amqp_url,
        f"stomp.listeners.ssl.default = 127.0.0.1:{tls_port}\n"
        f"ssl_options.cacertfile = {pki['ca']}\n"
        f"ssl_options.certfile = {pki['server_cert']}\n"
        f"ssl_options.keyfile = {tmp_path / 'server.key'}\n"
        "ssl_options.password = s3cret\n"
        "ssl_options.verify = verify_peer\n"
        "ssl_options.fail_if_no_peer_cert = true\n"
        "ssl_options.versions.1 = tlsv1.3\n",
        tcp_port,
    )
    try:
        wait_for_port(tls_port, process, "the TLS listener", log_path)
        wait_for_port(tcp_port, process, "the TCP listener", log_path)
        conn = stomp.Connection12([("127.0.0.1", tls_port)], vhost="/")
        conn.set_ssl(
            for_hosts=[("127.0.0.1", tls_port)],
            ca_certs=str(pki["ca"]),
            cert_file=str(pki["client_cert"]),
            key_file=str(pki["client_key"]),
        )
        conn.connect("guest", "guest", wait=True)
        assert conn.is_connected()
        conn.disconnect()
        # TLS 1.2 is not among ssl_options.versions
        context = ssl.create_default_context(cafile=str(pki["ca"]))
        context.maximum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(str(pki["client"]))
        with (
            socket.create_connection(("127.0.0.1", tls_port), timeout=5) as raw,
            pytest.raises(ssl.SSLError),
            context.wrap_socket(raw, server_hostname="localhost"),
        ):
            pass
        # the plain --listen listener beside it
        with socket.create_connection(("127.0.0.1", tcp_port), timeout=5) as sock:
            sock.sendall(CONNECT)
            assert read_frames(sock, timeout=5, count=1)[0][0].startswith(b"CONNECTED")
    finally:
        process.terminate()
        process.wait(15)
