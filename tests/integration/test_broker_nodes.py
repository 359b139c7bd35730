"""TLS to the broker and several broker nodes, with real components in between.

* TLS: Debian's stunnel terminates TLS in front of the broker's plain AMQP port, with
  certificates made by trustme for this test run (never committed), so the adapter's TLS client
  meets a real TLS server; ``amqps://`` URLs point at it.
* Nodes: TCP relays in front of the one broker stand for the nodes of a cluster; a test stops a
  relay to take its node away (a second RabbitMQ node would cost a minute of start-up and a
  cluster join for the same observable behaviour: a node that refuses or drops connections).
"""

from __future__ import annotations

import datetime
import socket
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import trustme

from tests.support import StompClient, TcpRelay, free_port, read_frames, start_stunnel, unique

CONNECT = b"CONNECT\naccept-version:1.2\nhost:/\nlogin:guest\npasscode:guest\n\n\0"


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


def broker_address(amqp_url: str) -> str:
    """The broker's host:port, for stunnel's ``connect``."""
    broker = urlsplit(amqp_url)
    return f"{broker.hostname or '127.0.0.1'}:{broker.port or 5672}"


@pytest.fixture(scope="module")
def stunnel(amqp_url: str, ca: trustme.CA, tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """A TLS front for the broker (certificate for "localhost" and 127.0.0.1); its port."""
    cert = ca.issue_cert("localhost", "127.0.0.1")
    process, port = start_stunnel(
        broker_address(amqp_url), cert.private_key_and_cert_chain_pem.bytes(), tmp_path_factory.mktemp("st")
    )
    yield port
    process.terminate()
    process.wait(10)


def amqps_url(amqp_url: str, port: int, host: str = "localhost") -> str:
    parts = urlsplit(amqp_url)
    return f"amqps://{parts.username or 'guest'}:{parts.password or 'guest'}@{host}:{port}/"


def round_trip(port: int) -> None:
    client = StompClient(port, "1.2")
    try:
        destination = f"/topic/{unique('node')}"
        client.conn.subscribe(destination, id="s")
        client.conn.send(destination, "over the node")
        assert client.next("MESSAGE").body == "over the node"
    finally:
        client.close()


def first_frame(port: int) -> bytes:
    """The adapter's answer to a raw CONNECT (stomp.py's own CONNECT waits only about 1 s,
    shorter than a login that first waits out a node's connect timeout)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(CONNECT)
        frames, _closed = read_frames(sock, timeout=15, count=1)
    assert frames, "no answer to CONNECT"
    return frames[0]


def connect_error(port: int) -> dict[str, str]:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(CONNECT)
        frames, closed = read_frames(sock, timeout=15, count=1)
    assert frames and frames[0].startswith(b"ERROR"), frames
    head, _, body = frames[0].partition(b"\n\n")
    headers = dict(line.split(":", 1) for line in head.decode().split("\n")[1:] if ":" in line)
    headers["body"] = body.decode()
    return headers


GENERIC = "The broker is unreachable, try again later"


def generic_error(port: int) -> None:
    """A failed login to a broker node tells the (unauthenticated) client nothing of the node:
    the ERROR of an unreachable broker, without URL, host, port, file or setting; the log has
    the detail (docs/behaviour.md, "TLS to the broker")."""
    headers = connect_error(port)
    assert headers["message"] == "Processing error"
    assert headers["body"] == GENERIC, headers
    # nothing else goes with it (the body is all of it, and no header is added)
    assert set(headers) == {"message", "content-type", "version", "content-length", "body"}, headers


def test_amqps_with_the_ca_file(start_adapter, amqp_url, stunnel, ca, tmp_path):
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    adapter = start_adapter(amqp_url=amqps_url(amqp_url, stunnel), amqp_tls_cafile=str(tmp_path / "ca.pem"))
    round_trip(adapter.port)


def test_amqps_verifies_against_the_default_trust_store(
    start_adapter, amqp_url, stunnel, ca, tmp_path, monkeypatch
):
    """No CA file: Python's default trust store, so SSL_CERT_FILE works (the contract)."""
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "ca.pem"))
    adapter = start_adapter(amqp_url=amqps_url(amqp_url, stunnel))
    round_trip(adapter.port)


def test_a_certificate_problem_fails_connect_with_a_generic_error_and_names_it_in_the_log(
    start_adapter, amqp_url, stunnel, tmp_path, caplog
):
    other = trustme.CA()  # not the CA that signed stunnel's certificate
    other.cert_pem.write_to_path(str(tmp_path / "other.pem"))
    adapter = start_adapter(
        amqp_url=amqps_url(amqp_url, stunnel), amqp_tls_cafile=str(tmp_path / "other.pem")
    )
    # as for an unreachable broker (docs/behaviour.md, ERROR catalogue); the log names the cause
    generic_error(adapter.port)
    assert f"TLS certificate verification failed for amqps://localhost:{stunnel}" in caplog.text


def test_an_expired_broker_certificate_is_named_in_the_log(start_adapter, amqp_url, ca, tmp_path, caplog):
    expired = ca.issue_cert(
        "localhost",
        not_before=datetime.datetime(2020, 1, 1, tzinfo=datetime.UTC),
        not_after=datetime.datetime(2021, 1, 1, tzinfo=datetime.UTC),
    )
    process, port = start_stunnel(
        broker_address(amqp_url), expired.private_key_and_cert_chain_pem.bytes(), tmp_path
    )
    try:
        ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
        adapter = start_adapter(amqp_url=amqps_url(amqp_url, port), amqp_tls_cafile=str(tmp_path / "ca.pem"))
        generic_error(adapter.port)
        assert "TLS certificate verification failed" in caplog.text and "expired" in caplog.text
    finally:
        process.terminate()
        process.wait(10)


def test_host_name_mismatch_is_a_certificate_problem(start_adapter, amqp_url, stunnel, ca, tmp_path, caplog):
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    adapter = start_adapter(
        amqp_url=amqps_url(amqp_url, stunnel),
        amqp_tls_cafile=str(tmp_path / "ca.pem"),
        amqp_tls_server_name="rabbit.example",  # the certificate names localhost only
    )
    generic_error(adapter.port)
    assert "TLS certificate verification failed" in caplog.text and "rabbit.example" in caplog.text


def test_verification_off_still_encrypts(start_adapter, amqp_url, stunnel, caplog):
    adapter = start_adapter(amqp_url=amqps_url(amqp_url, stunnel), amqp_tls_verify=False)
    round_trip(adapter.port)  # stunnel's port speaks TLS only
    assert "the broker's certificate is NOT checked" in caplog.text


def test_server_name_names_the_certificate_to_expect(start_adapter, amqp_url, ca, tmp_path):
    """A node reached by address whose certificate names only its DNS name."""
    cert = ca.issue_cert("rabbit.example")
    process, port = start_stunnel(
        broker_address(amqp_url), cert.private_key_and_cert_chain_pem.bytes(), tmp_path
    )
    try:
        ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
        adapter = start_adapter(
            amqp_url=amqps_url(amqp_url, port, host="127.0.0.1"),
            amqp_tls_cafile=str(tmp_path / "ca.pem"),
            amqp_tls_server_name="rabbit.example",
        )
        round_trip(adapter.port)
    finally:
        process.terminate()
        process.wait(10)


@pytest.fixture
def mutual_tls_stunnel(amqp_url: str, ca: trustme.CA, tmp_path: Path) -> Iterator[int]:
    """A TLS front that requires a client certificate signed by ``ca``; its port."""
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    cert = ca.issue_cert("localhost")
    process, port = start_stunnel(
        broker_address(amqp_url),
        cert.private_key_and_cert_chain_pem.bytes(),
        tmp_path,
        f"CAfile = {tmp_path / 'ca.pem'}\nverifyChain = yes\n",
    )
    yield port
    process.terminate()
    process.wait(10)


def test_mutual_tls_with_a_client_certificate(start_adapter, amqp_url, mutual_tls_stunnel, ca, tmp_path):
    client_cert = ca.issue_cert("stomp-adapter")
    client_cert.cert_chain_pems[0].write_to_path(str(tmp_path / "client.pem"))
    client_cert.private_key_pem.write_to_path(str(tmp_path / "client.key"))
    adapter = start_adapter(
        amqp_url=amqps_url(amqp_url, mutual_tls_stunnel),
        amqp_tls_cafile=str(tmp_path / "ca.pem"),
        amqp_tls_certfile=str(tmp_path / "client.pem"),
        amqp_tls_keyfile=str(tmp_path / "client.key"),
    )
    round_trip(adapter.port)


def test_mutual_tls_without_a_client_certificate_is_a_clear_error_in_the_log(
    start_adapter, amqp_url, mutual_tls_stunnel, tmp_path, caplog
):
    adapter = start_adapter(
        amqp_url=amqps_url(amqp_url, mutual_tls_stunnel), amqp_tls_cafile=str(tmp_path / "ca.pem")
    )
    generic_error(adapter.port)
    assert "the broker requires a client certificate (adapter.amqp_tls_certfile" in caplog.text


def test_a_broker_below_the_minimum_tls_version_is_refused(start_adapter, amqp_url, ca, tmp_path, caplog):
    cert = ca.issue_cert("localhost")
    process, port = start_stunnel(
        broker_address(amqp_url),
        cert.private_key_and_cert_chain_pem.bytes(),
        tmp_path,
        "sslVersionMax = TLSv1.2\n",
    )
    try:
        ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
        adapter = start_adapter(
            amqp_url=amqps_url(amqp_url, port),
            amqp_tls_cafile=str(tmp_path / "ca.pem"),
            amqp_tls_min_version="tlsv1.3",
        )
        generic_error(adapter.port)
        assert "no TLS version in common with the broker" in caplog.text
    finally:
        process.terminate()
        process.wait(10)


def test_amqps_to_a_plain_port_is_named_in_the_log(start_adapter, amqp_url, broker_host_port, caplog):
    host, port = broker_host_port
    adapter = start_adapter(amqp_url=amqps_url(amqp_url, port, host=host))  # the broker's plain port
    generic_error(adapter.port)
    assert "the node does not answer in TLS" in caplog.text


def test_a_node_that_refuses_is_skipped(start_adapter, amqp_url, broker_host_port):
    dead = free_port()  # nothing listens there
    parts = urlsplit(amqp_url)
    live = f"amqp://{parts.netloc}/"
    adapter = start_adapter(amqp_url=f"amqp://guest:guest@127.0.0.1:{dead}/,{live}")
    for _ in range(3):  # round robin: some logins start with the dead node
        round_trip(adapter.port)


def test_a_node_behind_a_proxy_whose_upstream_is_down_is_skipped(start_adapter, amqp_url):
    """A load balancer or relay that accepts and then closes (its node is down) is a failed
    node, not a refused login: the next node is tried."""
    proxy = TcpRelay("127.0.0.1", free_port())  # nothing listens behind it
    proxy.start()
    try:
        parts = urlsplit(amqp_url)
        adapter = start_adapter(amqp_url=f"amqp://guest:guest@127.0.0.1:{proxy.port}/,amqp://{parts.netloc}/")
        for _ in range(2):  # round robin: the first login starts with the proxy
            answer = first_frame(adapter.port)
            assert answer.startswith(b"CONNECTED"), answer
        assert proxy.connections == 1
    finally:
        proxy.stop()


def test_a_node_that_never_answers_is_skipped_within_the_login_timeout(start_adapter, amqp_url):
    silent = socket.create_server(("127.0.0.1", 0))  # the kernel accepts; nothing speaks AMQP
    try:
        parts = urlsplit(amqp_url)
        adapter = start_adapter(
            amqp_url=f"amqp://guest:guest@127.0.0.1:{silent.getsockname()[1]}/,amqp://{parts.netloc}/",
            amqp_connect_timeout=1,
        )
        # round robin: the first login tries the silent node first, gives up after 1 s, and
        # logs in on the live one
        answer = first_frame(adapter.port)
        assert answer.startswith(b"CONNECTED"), answer
        # with only the silent node left, the login timeout (counted from the accept, so before
        # the node's connect timeout) ends the CONNECT: an ERROR, never a hang
        lone = start_adapter(
            amqp_url=f"amqp://guest:guest@127.0.0.1:{silent.getsockname()[1]}/", login_timeout=1.5
        )
        assert connect_error(lone.port)["message"] == "Login timeout"
    finally:
        silent.close()


def test_a_session_whose_node_goes_away_gets_an_error_and_reconnects_elsewhere(
    start_adapter, broker_host_port
):
    host, port = broker_host_port
    first, second = TcpRelay(host, port), TcpRelay(host, port)
    first.start()
    second.start()
    try:
        adapter = start_adapter(
            amqp_url=f"amqp://guest:guest@127.0.0.1:{first.port}/,amqp://guest:guest@127.0.0.1:{second.port}/"
        )
        client = StompClient(adapter.port, "1.2")  # round robin: the first login uses the first node
        assert first.connections, "the first login did not go through the first node"
        first.stop()  # the node goes away under the session
        error = client.next("ERROR", timeout=15)
        assert error.headers["message"] == "AMQP connection died"
        assert client.wait_disconnected()
        client.close()
        # the next CONNECTs land on the live node, whatever their turn in the rotation
        for _ in range(2):
            round_trip(adapter.port)
        assert second.connections
    finally:
        first.stop()
        second.stop()


def test_all_nodes_down_is_a_clear_error(start_adapter, caplog):
    first, second = free_port(), free_port()
    adapter = start_adapter(
        amqp_url=f"amqp://guest:guest@127.0.0.1:{first}/,amqp://guest:guest@127.0.0.1:{second}/"
    )
    generic_error(adapter.port)
    # nothing listens on either port: the log says the nodes refused, not that they are out of sockets
    assert f"broker node amqp://127.0.0.1:{first} refused the connection" in caplog.text
