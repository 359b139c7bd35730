"""The operator's view against the real broker: /metrics after real STOMP traffic, /healthz and
/readyz with the broker reachable and taken away, and the JSON log lines of a real process.

Metrics are scraped over HTTP from the running adapter and parsed with prometheus_client's own
parser, so the exposition format is checked as Prometheus reads it, not as the adapter writes it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import trustme
from prometheus_client.parser import text_string_to_metric_families
from stomp.exception import ConnectFailedException
from websockets.sync.client import connect

from tests.support import BrokerProbe, StompClient, TcpRelay, free_port, unique, wait_for_port

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def http_get(port: int, path: str, method: str = "GET") -> tuple[int, str]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def scrape(port: int) -> Samples:
    status, text = http_get(port, "/metrics")
    assert status == 200
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


def wait_for(condition, what: str, timeout: float = 15.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture
def metered(start_adapter):  # type: ignore[no-untyped-def]
    adapter = start_adapter(http_listen="127.0.0.1:0")
    adapter.http_port = adapter.server.http_addresses[0][1]
    return adapter


def test_connections_refused_before_stomp_are_counted(start_adapter, tmp_path: Path) -> None:
    """stomp_adapter_connections_refused_total: each way a connection can end before its first
    STOMP byte, with PROXY protocol on a plain and a TLS listener."""
    trustme.CA().issue_cert("localhost").private_key_and_cert_chain_pem.write_to_path(
        str(tmp_path / "tls.pem")
    )
    adapter = start_adapter(
        http_listen="127.0.0.1:0",
        proxy_protocol=True,
        login_timeout=1,
        ssl_listeners=["127.0.0.1:0"],
        ssl_certfile=str(tmp_path / "tls.pem"),
    )
    http_port, tls_port = adapter.server.http_addresses[0][1], adapter.server.tls_addresses[0][1]
    header = b"PROXY TCP4 10.1.2.3 127.0.0.1 40000 61614\r\n"
    sends = [
        (adapter.port, b"GET / HTTP/1.0\r\n\r\n"),  # proxy_header
        (tls_port, b"PROXY TCP4 10.1.2.3"),  # proxy_timeout
        (tls_port, header + b"CONNECT\n\n\0"),  # tls_handshake: plain text after the header
        (tls_port, header),  # tls_timeout: no handshake follows
    ]
    sockets = [socket.create_connection(("127.0.0.1", port), timeout=5) for port, _ in sends]
    try:
        for sock, (_, data) in zip(sockets, sends, strict=True):
            sock.sendall(data)
        expected = {"proxy_header": 1, "proxy_timeout": 1, "tls_handshake": 1, "tls_timeout": 1}

        def counted() -> dict[str, float]:
            samples = scrape(http_port)
            return {r: value(samples, "stomp_adapter_connections_refused_total", reason=r) for r in expected}

        wait_for(lambda: counted() == expected, "the four refusals to be counted")
    finally:
        for sock in sockets:
            sock.close()


def test_metrics_count_real_traffic(metered, broker) -> None:
    queue = unique("metrics")
    broker.track_queue(queue)
    client = StompClient(metered.port)
    client.conn.subscribe(f"/queue/{queue}", id="s1", ack="client-individual", headers={"receipt": "sub"})
    client.next("RECEIPT")
    for number in range(3):
        client.conn.send(f"/queue/{queue}", f"body-{number}", headers={"receipt": f"r{number}"})
    messages = client.messages(3)
    assert {client.next("RECEIPT").headers["receipt-id"] for _ in range(3)} == {"r0", "r1", "r2"}

    during = scrape(metered.http_port)
    assert value(during, "stomp_adapter_connections", listener="tcp", state="connected") == 1
    assert value(during, "stomp_adapter_messages_published_total") == 3
    assert value(during, "stomp_adapter_messages_delivered_total") == 3

    client.conn.ack(messages[0].headers["ack"])
    client.conn.ack(messages[1].headers["ack"])
    client.conn.nack(messages[2].headers["ack"], requeue="false")
    client.conn.disconnect(receipt="bye")
    assert client.wait_disconnected()
    with pytest.raises(ConnectFailedException):
        StompClient(metered.port, passcode="wrong-" + unique())
    wait_for(lambda: metered.connection_count == 0, "both connections to finish")

    after = scrape(metered.http_port)
    assert value(after, "stomp_adapter_connections", listener="tcp", state="connected") == 0
    assert value(after, "stomp_adapter_connections_opened_total", listener="tcp") == 2
    assert value(after, "stomp_adapter_connections_closed_total", listener="tcp") == 2
    assert value(after, "stomp_adapter_frames_received_total", command="SEND") == 3
    assert value(after, "stomp_adapter_frames_received_total", command="SUBSCRIBE") == 1
    assert value(after, "stomp_adapter_frames_received_total", command="ACK") == 2
    assert value(after, "stomp_adapter_frames_received_total", command="NACK") == 1
    assert value(after, "stomp_adapter_frames_received_total", command="DISCONNECT") == 1
    assert value(after, "stomp_adapter_frames_sent_total", command="MESSAGE") == 3
    assert value(after, "stomp_adapter_frames_sent_total", command="CONNECTED") == 1
    # the SUBSCRIBE's, the three SENDs' and the DISCONNECT's
    assert value(after, "stomp_adapter_frames_sent_total", command="RECEIPT") == 5
    assert value(after, "stomp_adapter_receipts_sent_total") == 5
    assert value(after, "stomp_adapter_messages_published_total") == 3
    assert value(after, "stomp_adapter_messages_delivered_total") == 3
    assert value(after, "stomp_adapter_acks_total") == 2
    assert value(after, "stomp_adapter_nacks_total") == 1
    assert value(after, "stomp_adapter_error_frames_total", message="Bad CONNECT") == 1
    assert value(after, "stomp_adapter_frames_sent_total", command="ERROR") == 1
    assert value(after, "stomp_adapter_login_failures_total", reason="access_refused") == 1
    assert value(after, "stomp_adapter_amqp_connection_failures_total", reason="access_refused") == 1
    # every SEND was receipted, so confirm mode was on from the first: at least one was timed
    assert value(after, "stomp_adapter_publisher_confirm_seconds_count") >= 1
    assert value(after, "stomp_adapter_publisher_confirm_seconds_bucket", le="+Inf") == value(
        after, "stomp_adapter_publisher_confirm_seconds_count"
    )
    # every receipt asked for was timed, under the command that asked for it
    for command, receipts in (("SUBSCRIBE", 1), ("SEND", 3), ("DISCONNECT", 1)):
        assert value(after, "stomp_adapter_receipt_seconds_count", command=command) == receipts
        assert value(after, "stomp_adapter_receipt_seconds_bucket", command=command, le="+Inf") == receipts
        assert value(after, "stomp_adapter_receipt_seconds_sum", command=command) > 0
    bodies = sum(len(f"body-{n}") for n in range(3))
    assert value(after, "stomp_adapter_received_bytes_total") > bodies
    assert value(after, "stomp_adapter_sent_bytes_total") > bodies
    # SUBSCRIBE waited for its declare, consume and bind with the client's socket paused
    assert value(after, "stomp_adapter_reads_paused_seconds_total", reason="broker_call") > 0
    assert ("process_open_fds", frozenset()) in after


def test_per_destination_series_are_bounded(start_adapter, broker) -> None:
    """With adapter.metrics_destinations = 2 the first two destinations get a series each, the
    third counts as other, and temporary queues share one series outside the bound; a
    transaction's messages count under their SEND's destination at the COMMIT."""
    adapter = start_adapter(http_listen="127.0.0.1:0", metrics_destinations=2)
    http_port = adapter.server.http_addresses[0][1]
    first, second, third = (unique(f"perdest-{n}") for n in range(3))
    for queue in (first, second, third):
        broker.track_queue(queue)
    client = StompClient(adapter.port)
    responder = StompClient(adapter.port)
    client.conn.subscribe(f"/queue/{first}", id="s1", ack="auto", headers={"receipt": "sub"})
    client.next("RECEIPT")
    responder.conn.subscribe(f"/queue/{second}", id="s2", ack="auto", headers={"receipt": "sub"})
    responder.next("RECEIPT")
    for _ in range(3):
        client.conn.send(f"/queue/{first}", "x")
    client.conn.begin("tx")
    client.conn.send(f"/queue/{second}", "x", transaction="tx")
    client.conn.commit("tx")
    # the third destination: the two series are taken
    client.conn.send(f"/queue/{third}", "x")
    client.conn.send(f"/queue/{third}", "x")
    # a request with a temporary reply queue, answered through the /reply-queue/ name the
    # responder gets: both names are made per requester, so neither gets a series of its own
    client.conn.send(f"/queue/{second}", "request", headers={"reply-to": "/temp-queue/replies"})
    requests = responder.messages(2)
    reply_to = requests[1].headers["reply-to"]
    assert reply_to.startswith("/reply-queue/")
    responder.conn.send(reply_to, "reply", headers={"receipt": "replied"})
    responder.next("RECEIPT")
    assert [m.body for m in client.messages(4)] == ["x", "x", "x", "reply"]
    samples = scrape(http_port)
    published = "stomp_adapter_destination_messages_published_total"
    delivered = "stomp_adapter_destination_messages_delivered_total"
    assert value(samples, published, destination=f"/queue/{first}") == 3
    assert value(samples, published, destination=f"/queue/{second}") == 2
    assert value(samples, published, destination="other") == 2
    assert value(samples, published, destination="/reply-queue/*") == 1
    assert value(samples, published, destination="/temp-queue/*") == 0
    assert value(samples, delivered, destination=f"/queue/{first}") == 3
    assert value(samples, delivered, destination=f"/queue/{second}") == 2
    assert value(samples, delivered, destination="/temp-queue/*") == 1
    assert not any(dict(labels).get("destination") == f"/queue/{third}" for _name, labels in samples)
    assert sum(v for (name, _labels), v in samples.items() if name == published) == value(
        samples, "stomp_adapter_messages_published_total"
    )
    client.close()
    responder.close()


def test_no_per_destination_series_by_default(metered) -> None:
    client = StompClient(metered.port)
    client.conn.send("/topic/no-series", "x", headers={"receipt": "r"})
    client.next("RECEIPT")
    samples = scrape(metered.http_port)
    assert value(samples, "stomp_adapter_messages_published_total") == 1
    assert not any("destination" in name for name, _labels in samples)
    client.close()


def test_unknown_commands_share_one_series(metered) -> None:
    with socket.create_connection(("127.0.0.1", metered.port), timeout=5) as sock:
        sock.sendall(b"CONNECT\naccept-version:1.2\nhost:/\nlogin:guest\npasscode:guest\n\n\0")
        sock.sendall(b"INVENTED\n\n\0")
        while sock.recv(65536):
            pass
    wait_for(lambda: metered.connection_count == 0, "the connection to finish")
    samples = scrape(metered.http_port)
    assert value(samples, "stomp_adapter_frames_received_total", command="other") == 1
    assert not any(labels == frozenset({("command", "INVENTED")}) for _name, labels in samples)


def test_websocket_connections_have_their_own_series(start_adapter) -> None:
    adapter = start_adapter(http_listen="127.0.0.1:0", web_stomp_listeners=["127.0.0.1:0"])
    http_port = adapter.server.http_addresses[0][1]
    web_port = adapter.server.web_addresses[0][1]
    with connect(f"ws://127.0.0.1:{web_port}/ws", subprotocols=["v12.stomp"], open_timeout=5) as ws:
        ws.send("CONNECT\naccept-version:1.2\nhost:/\nlogin:guest\npasscode:guest\n\n\0")
        assert str(ws.recv(timeout=5)).startswith("CONNECTED")
        samples = scrape(http_port)
        assert value(samples, "stomp_adapter_connections", listener="websocket", state="connected") == 1
        assert value(samples, "stomp_adapter_connections", listener="tcp", state="connected") == 0
    wait_for(lambda: adapter.connection_count == 0, "the WebSocket session to finish")
    samples = scrape(http_port)
    assert value(samples, "stomp_adapter_connections_closed_total", listener="websocket") == 1
    assert value(samples, "stomp_adapter_frames_received_total", command="CONNECT") == 1


def test_http_answers(metered) -> None:
    assert http_get(metered.http_port, "/healthz") == (200, "ok\n")
    assert http_get(metered.http_port, "/nothing")[0] == 404
    assert http_get(metered.http_port, "/metrics", method="POST")[0] == 405
    assert http_get(metered.http_port, "/healthz", method="HEAD") == (200, "")


def test_no_http_port_without_the_setting(adapter) -> None:
    assert adapter.server.http_addresses == []
    assert adapter.server.operations.http_listen is None


def test_readiness_follows_the_broker(start_adapter, broker_host_port) -> None:
    relay = TcpRelay(*broker_host_port)
    relay.start()
    try:
        adapter = start_adapter(
            amqp_url=f"amqp://guest:guest@127.0.0.1:{relay.port}/", http_listen="127.0.0.1:0"
        )
        http_port = adapter.server.http_addresses[0][1]
        status, body = http_get(http_port, "/readyz")
        assert (status, body) == (200, f"broker amqp://127.0.0.1:{relay.port} answers\n")
        assert relay.connections >= 1  # the check spoke to the broker through the relay
        checks = relay.connections
        for _ in range(20):  # a scrape storm is answered from the cached verdict
            assert http_get(http_port, "/readyz")[0] == 200
        assert relay.connections == checks

        relay.stop()
        wait_for(lambda: http_get(http_port, "/readyz")[0] == 503, "/readyz to turn 503")
        status, body = http_get(http_port, "/readyz")
        assert body.startswith("no broker node answers: ")
        assert http_get(http_port, "/healthz") == (200, "ok\n")  # alive, just not ready

        with pytest.raises(ConnectFailedException):
            StompClient(adapter.port)
        wait_for(lambda: adapter.connection_count == 0, "the refused connection to finish")
        samples = scrape(http_port)
        assert value(samples, "stomp_adapter_login_failures_total", reason="broker_unavailable") == 1
        assert value(samples, "stomp_adapter_amqp_connection_failures_total", reason="unreachable") >= 1
    finally:
        relay.stop()


@pytest.fixture
def secret_user(broker: BrokerProbe) -> tuple[str, str]:
    """A broker user whose passcode appears nowhere else, so any trace of it in a log is a leak."""
    passcode = unique("passcode-never-logged")
    return broker.create_user(passcode, prefix="stomp-ops"), passcode


def test_json_logs_of_a_real_process(amqp_url, secret_user, tmp_path: Path) -> None:
    """``python -m adapter --log-format json`` with the HTTP port from the environment: every
    line is a JSON object; each connection has an opened and a closed line with its fields;
    passcodes appear nowhere, not even at DEBUG."""
    user, passcode = secret_user
    wrong = unique("wrong-passcode-never-logged")
    port, http_port = free_port(), free_port()
    log_path = tmp_path / "adapter.log"
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "adapter",
                "--listen",
                f"127.0.0.1:{port}",
                "--amqp-url",
                amqp_url,
                "--log-format",
                "json",
                "--log-level",
                "DEBUG",
            ],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env={**os.environ, "STOMP_ADAPTER_HTTP_LISTEN": f"127.0.0.1:{http_port}"},
        )
    try:
        wait_for_port(port, process, "adapter", log_path)
        wait_for_port(http_port, process, "adapter's HTTP port", log_path)
        assert http_get(http_port, "/healthz") == (200, "ok\n")
        assert http_get(http_port, "/readyz")[0] == 200

        client = StompClient(port, login=user, passcode=passcode)
        client.conn.send("/topic/ops-log", "hello")
        client.conn.disconnect(receipt="bye")
        assert client.wait_disconnected()
        with pytest.raises(ConnectFailedException):
            StompClient(port, login=user, passcode=wrong)
        # three: wait_for_port's connection, the logged-in one and the refused one
        wait_for(
            lambda: value(scrape(http_port), "stomp_adapter_connections_closed_total", listener="tcp") == 3,
            "every connection to close",
        )
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(20)
    assert process.returncode == 0

    text = log_path.read_text()
    assert passcode not in text and wrong not in text
    entries = [json.loads(line) for line in text.splitlines()]  # every line is one JSON object
    assert all({"time", "level", "logger", "message"} <= entry.keys() for entry in entries)
    opened = [e for e in entries if e.get("event") == "connection_opened"]
    logged_in = [e for e in entries if e.get("event") == "connection_logged_in"]
    closed = [e for e in entries if e.get("event") == "connection_closed"]
    assert len(opened) == 3 and len(closed) == 3 and len(logged_in) == 1
    probe = closed[0]  # wait_for_port's connection: no CONNECT
    assert probe["user"] is None and probe["logged_in"] is False
    assert probe["reason"] == "client closed the connection" and probe["frames_received"] == 0
    assert logged_in[0]["user"] == user and logged_in[0]["vhost"] == "/" and logged_in[0]["version"] == "1.2"

    good, refused = closed[1:]
    assert [e["peer"] for e in closed] == [e["peer"] for e in opened]
    assert good["user"] == user and good["vhost"] == "/" and good["version"] == "1.2"
    assert good["logged_in"] is True and good["listener"] == "tcp"
    assert good["reason"] == "client sent DISCONNECT"
    assert good["frames_received"] == 3  # CONNECT (stomp.py sends STOMP), SEND, DISCONNECT
    assert good["frames_sent"] == 2  # CONNECTED, the DISCONNECT's RECEIPT
    assert good["messages_published"] == 1 and good["messages_delivered"] == 0
    assert good["duration_seconds"] >= 0 and good["bytes_received"] > 0 and good["bytes_sent"] > 0
    assert refused["user"] == user and refused["logged_in"] is False and refused["version"] is None
    assert refused["reason"] == "Bad CONNECT"
