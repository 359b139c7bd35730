"""The recording tap's TLS to its upstream (``--upstream-tls`` and its verification options),
against a real TLS server: Debian's stunnel in front of RabbitMQ's STOMP plugin, with
certificates made by trustme for this run (never committed).

Each verification option of the tap's CLI is exercised both ways: ``--upstream-tls-cafile``,
``--upstream-tls-server-name``, ``--upstream-tls-verify false``, ``--upstream-tls-certfile`` /
``--upstream-tls-keyfile`` (mutual TLS) and ``--upstream-tls-min-version``; and no CA file at
all, where the default trust store decides: the test's CA is made that store for one tap
process only, with OpenSSL's ``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` in its environment.  A handshake that
fails is a connection the upstream refuses: the client's connection is closed without a byte,
the tap's log says why, and the tap goes on serving later connections."""

from __future__ import annotations

import contextlib
import os
import socket
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

from tests.integration.test_tap import conversation
from tests.support import start_stunnel, unique
from tests.tap_support import TapProcess

PLUGIN = f"127.0.0.1:{int(os.environ.get('STOMP_PLUGIN_PORT', '61613'))}"
CONNECT = b"CONNECT\naccept-version:1.2\nhost:/\nlogin:guest\npasscode:guest\n\n\0"


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def files(ca: trustme.CA, tmp_path: Path) -> Path:
    """ca.pem (the right CA), other-ca.pem (a CA that signed nothing here)."""
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    trustme.CA().cert_pem.write_to_path(str(tmp_path / "other-ca.pem"))
    return tmp_path


@pytest.fixture
def tls_upstream(tmp_path: Path):
    """start(cert, options="", port=None) -> the port of a stunnel in front of the plugin;
    start.stop(port) ends the one on that port (to put another there)."""
    running: dict[int, subprocess.Popen[bytes]] = {}
    count = 0

    def start(cert: trustme.LeafCert, options: str = "", port: int | None = None) -> int:
        nonlocal count
        count += 1
        directory = tmp_path / f"stunnel-{count}"
        directory.mkdir()
        process, port = start_stunnel(
            PLUGIN, cert.private_key_and_cert_chain_pem.bytes(), directory, options, port
        )
        running[port] = process
        return port

    def stop(port: int) -> None:
        process = running.pop(port)
        process.terminate()
        process.wait(10)

    start.stop = stop  # type: ignore[attr-defined]
    yield start
    for port in list(running):
        stop(port)


@pytest.fixture
def taps(tmp_path: Path) -> Iterator:
    started: list[TapProcess] = []

    def start(upstream: str, *extra: str, env: dict[str, str | None] | None = None) -> TapProcess:
        tap = TapProcess(upstream, tmp_path / f"rec-{len(started)}", *extra, env=env)
        started.append(tap)
        return tap

    yield start
    for tap in started:
        with contextlib.suppress(AssertionError):
            tap.stop()


def served(port: int) -> None:
    """The full CONNECT / SUBSCRIBE / SEND / MESSAGE / ACK / DISCONNECT conversation of
    test_tap.py, with its expected answers."""
    got = conversation(port, unique("tls"))
    assert got[0] == ("CONNECTED", "1.2")
    assert [g for g in got if g[0] == "RECEIPT"] == [("RECEIPT", r) for r in ("sub", "r0", "r1", "r2")]
    assert [g[3] for g in got if g[0] == "MESSAGE"] == ["body 0", "body 1", "body 2"]
    assert got[-2:] == [("no ERROR", "True"), ("DISCONNECTED",)]


def refused(tap: TapProcess) -> None:
    """A client whose upstream handshake fails gets no byte, then its connection closed (reset,
    as for an upstream that is down, or an end of stream when the upstream drops it after a
    TLS 1.3 handshake the client side had already finished)."""
    with socket.create_connection(("127.0.0.1", tap.port), timeout=30) as client:
        client.settimeout(30)
        client.sendall(CONNECT)
        got = b""
        with contextlib.suppress(ConnectionResetError, BrokenPipeError):
            while data := client.recv(4096):
                got += data
    assert b"CONNECTED" not in got, got
    assert got == b"", got


def test_the_right_ca_verifies_and_the_conversation_is_served_and_recorded(ca, files, tls_upstream, taps):
    port = tls_upstream(ca.issue_cert("localhost", "127.0.0.1"))
    tap = taps(f"localhost:{port}", "--upstream-tls", "--upstream-tls-cafile", str(files / "ca.pem"))
    served(tap.port)
    served(tap.port)  # a later connection, over a new handshake
    assert tap.metric("upstream_failures_total") == 0
    assert tap.stop() == 0
    records = tap.records()
    opens = [r for r in records if r["kind"] == "open"]
    assert len(opens) == 2 and all(r["tls"] is True and r["upstream"] == f"localhost:{port}" for r in opens)
    first = [r for r in records if r["conn"] == opens[0]["conn"] and r["kind"] == "frame"]
    assert [r["command"] for r in first if r["dir"] == "in"] == ["STOMP", "SUBSCRIBE"] + ["SEND"] * 3 + [
        "ACK"
    ] * 3 + ["DISCONNECT"]
    assert (
        sorted(r["command"] for r in first if r["dir"] == "out")
        == ["CONNECTED"] + ["MESSAGE"] * 3 + ["RECEIPT"] * 5
    )
    assert f"(TLS, CAs trusted: --upstream-tls-cafile {files / 'ca.pem'})" in tap.log()


def test_a_wrong_ca_refuses_the_client_says_why_and_later_connections_are_served(
    ca, files, tls_upstream, taps
):
    """The upstream first presents a certificate from a CA the tap does not trust, then (the same
    address, a new stunnel) one from the right CA: the failure is per connection, and the tap,
    unchanged, serves the later client."""
    impostor = trustme.CA().issue_cert("localhost", "127.0.0.1")
    port = tls_upstream(impostor)
    tap = taps(f"127.0.0.1:{port}", "--upstream-tls", "--upstream-tls-cafile", str(files / "ca.pem"))
    refused(tap)
    refused(tap)
    assert tap.metric("upstream_failures_total") == 2
    assert tap.log().count("certificate verify failed") == 2, tap.log()
    assert tap.get("/healthz").startswith("ok")
    # the upstream gets the right certificate: the bystander, a later connection, is served
    tls_upstream.stop(port)
    tls_upstream(ca.issue_cert("localhost", "127.0.0.1"), port=port)
    served(tap.port)
    assert tap.metric("upstream_failures_total") == 2
    assert tap.stop() == 0
    closes = [r for r in tap.records() if r["kind"] == "close"]
    assert len(closes) == 3 and [c["by"] for c in closes[:2]] == ["upstream", "upstream"]
    assert all("CERTIFICATE_VERIFY_FAILED" in c["reason"] for c in closes[:2]), closes


def test_a_host_name_mismatch_is_refused_and_server_name_names_the_expected_one(
    ca, files, tls_upstream, taps
):
    """The certificate names only upstream.example; the tap reaches it by address."""
    port = tls_upstream(ca.issue_cert("upstream.example"))
    cafile = str(files / "ca.pem")
    mismatch = taps(f"127.0.0.1:{port}", "--upstream-tls", "--upstream-tls-cafile", cafile)
    refused(mismatch)
    assert "IP address mismatch" in mismatch.log(), mismatch.log()
    named = taps(
        f"127.0.0.1:{port}",
        "--upstream-tls",
        "--upstream-tls-cafile",
        cafile,
        "--upstream-tls-server-name",
        "upstream.example",
    )
    served(named.port)
    wrong_name = taps(
        f"127.0.0.1:{port}",
        "--upstream-tls",
        "--upstream-tls-cafile",
        cafile,
        "--upstream-tls-server-name",
        "other.example",
    )
    refused(wrong_name)
    assert "Hostname mismatch" in wrong_name.log() and "other.example" in wrong_name.log(), wrong_name.log()
    served(named.port)  # the refusals elsewhere changed nothing for it


def test_verify_false_accepts_any_certificate_still_over_tls_and_warns(files, tls_upstream, taps):
    port = tls_upstream(trustme.CA().issue_cert("upstream.example"))  # wrong CA and wrong name
    tap = taps(f"127.0.0.1:{port}", "--upstream-tls", "--upstream-tls-verify", "false")
    served(tap.port)  # stunnel's port speaks TLS only: this went over TLS
    assert "the upstream's certificate is NOT checked" in tap.log()
    assert tap.stop() == 0
    assert tap.records()[0]["tls"] is True
    assert "eof_received" not in tap.log()  # asyncio's warning for a half-close over TLS


def test_mutual_tls_with_and_without_a_client_certificate(ca, files, tls_upstream, taps):
    port = tls_upstream(
        ca.issue_cert("localhost", "127.0.0.1"),
        f"CAfile = {files / 'ca.pem'}\nverifyChain = yes\n",  # a client certificate is required
    )
    client_cert = ca.issue_cert("stomp-tap")
    client_cert.cert_chain_pems[0].write_to_path(str(files / "client.pem"))
    client_cert.private_key_pem.write_to_path(str(files / "client.key"))
    cafile = str(files / "ca.pem")
    without = taps(f"127.0.0.1:{port}", "--upstream-tls", "--upstream-tls-cafile", cafile)
    refused(without)
    assert "certificate required" in without.log(), without.log()
    with_cert = taps(
        f"127.0.0.1:{port}",
        "--upstream-tls",
        "--upstream-tls-cafile",
        cafile,
        "--upstream-tls-certfile",
        str(files / "client.pem"),
        "--upstream-tls-keyfile",
        str(files / "client.key"),
    )
    served(with_cert.port)
    refused(without)  # still refused: nothing was remembered
    assert without.stop() == 0
    closes = [r for r in without.records() if r["kind"] == "close"]
    assert len(closes) == 2 and all(c["by"] == "upstream" for c in closes), closes


def test_an_upstream_below_the_minimum_tls_version_is_refused(ca, files, tls_upstream, taps):
    port = tls_upstream(ca.issue_cert("localhost", "127.0.0.1"), "sslVersionMax = TLSv1.2\n")
    cafile = str(files / "ca.pem")
    default = taps(f"127.0.0.1:{port}", "--upstream-tls", "--upstream-tls-cafile", cafile)
    served(default.port)  # the default minimum is TLS 1.2
    strict = taps(
        f"127.0.0.1:{port}",
        "--upstream-tls",
        "--upstream-tls-cafile",
        cafile,
        "--upstream-tls-min-version",
        "tlsv1.3",
    )
    refused(strict)
    assert "not reachable" in strict.log() and "VERSION" in strict.log().upper(), strict.log()
    served(default.port)


def direct_refusal(port: int, context: ssl.SSLContext) -> str:
    """The verification error a client connecting straight to the upstream gets."""
    with (
        socket.create_connection(("127.0.0.1", port), timeout=30) as sock,
        pytest.raises(ssl.SSLCertVerificationError) as refusal,
    ):
        context.wrap_socket(sock, server_hostname="localhost")
    return str(refusal.value.verify_message)


def system_store() -> ssl.SSLContext:
    """A client context with the machine's own default CAs, whatever this process's
    SSL_CERT_FILE / SSL_CERT_DIR say (the ones a tap gets when both are removed)."""
    paths = ssl.get_default_verify_paths()
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    cafile = paths.openssl_cafile if os.path.isfile(paths.openssl_cafile) else None
    capath = paths.openssl_capath if os.path.isdir(paths.openssl_capath) else None
    assert cafile or capath, f"no system trust store at {paths}"
    context.load_verify_locations(cafile=cafile, capath=capath)
    return context


def test_without_a_ca_file_a_ca_in_the_default_trust_store_verifies(ca, files, tls_upstream, taps, tmp_path):
    """No --upstream-tls-cafile: the upstream's certificate is checked against the default trust
    store.  Here it is the test's CA alone, for this tap's process (the machine's store is not
    changed): SSL_CERT_FILE names the CA, SSL_CERT_DIR an empty directory."""
    port = tls_upstream(ca.issue_cert("localhost", "127.0.0.1"))
    (tmp_path / "no-certs").mkdir()
    store = {"SSL_CERT_FILE": str(files / "ca.pem"), "SSL_CERT_DIR": str(tmp_path / "no-certs")}
    tap = taps(f"localhost:{port}", "--upstream-tls", env=store)
    served(tap.port)
    served(tap.port)
    assert tap.metric("upstream_failures_total") == 0
    trusted = f"the default trust store (file {files / 'ca.pem'}, directory {tmp_path / 'no-certs'})"
    assert f"(TLS, CAs trusted: {trusted})" in tap.log(), tap.log()
    assert tap.stop() == 0
    assert [r["tls"] for r in tap.records() if r["kind"] == "open"] == [True, True]


def test_without_a_ca_file_a_ca_not_in_the_default_trust_store_is_refused(ca, files, tls_upstream, taps):
    """The same upstream, its CA in no default store: the machine's own (both variables removed
    from the tap's environment), and a store of another CA (SSL_CERT_FILE).  The client is
    refused as a direct connection with that store is (the same verification error), and the
    log line says what failed and which CAs the tap trusted."""
    port = tls_upstream(ca.issue_cert("localhost", "127.0.0.1"))
    system = taps(f"localhost:{port}", "--upstream-tls", env={"SSL_CERT_FILE": None, "SSL_CERT_DIR": None})
    other = taps(f"localhost:{port}", "--upstream-tls", env={"SSL_CERT_FILE": str(files / "other-ca.pem")})
    other_store = ssl.create_default_context(cafile=str(files / "other-ca.pem"))
    for tap, direct in ((system, system_store()), (other, other_store)):
        refused(tap)
        assert tap.metric("upstream_failures_total") == 1
        reason = direct_refusal(port, direct)  # "unable to get local issuer certificate"
        lines = [line for line in tap.log().splitlines() if "not reachable" in line]
        assert len(lines) == 1, tap.log()
        assert "certificate verify failed" in lines[0] and reason in lines[0], lines[0]
        assert "CAs trusted: the default trust store (" in lines[0], lines[0]
    assert f"file {files / 'other-ca.pem'}" in other.log()
    assert f"file {files / 'other-ca.pem'}" not in system.log()
    # the tap trusting the CA through its own environment is served beside them
    served(taps(f"localhost:{port}", "--upstream-tls", env={"SSL_CERT_FILE": str(files / "ca.pem")}).port)
