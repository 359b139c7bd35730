"""Connection lifecycle: login timeout, heart-beats, broker-side failures, graceful shutdown."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
import urllib.parse
import urllib.request

import pytest

from tests.support import AdapterProcess, BrokerProbe, StompClient, frame_headers, read_frames, unique

CONNECT = "CONNECT\naccept-version:1.2\nhost:/\nlogin:guest\npasscode:guest\nheart-beat:{hb}\n\n\0"


def test_login_timeout_closes_silent_sockets(start_adapter):
    server = start_adapter(login_timeout=0.5)
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    frames, closed = read_frames(sock, timeout=5, count=1)
    sock.close()
    assert closed
    command, headers, _ = frame_headers(frames[0])
    assert (command, headers["message"]) == ("ERROR", "Login timeout")


def test_server_sends_heart_beats_when_idle(raw_socket):
    sock = raw_socket()
    sock.sendall(CONNECT.format(hb="0,200").encode())
    frames, _ = read_frames(sock, timeout=5, count=1)
    assert frame_headers(frames[0])[1]["heart-beat"] == "200,0"
    sock.settimeout(0.1)
    received = b""
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        with contextlib.suppress(TimeoutError):
            received += sock.recv(100)
    # an LF every ~100 ms (half the interval) while idle; at least 4 in a second with slack
    assert received.count(b"\n") >= 4 and received.strip(b"\n") == b""


def test_silent_client_is_dropped_after_heart_beat_timeout(raw_socket):
    sock = raw_socket()
    sock.sendall(CONNECT.format(hb="200,0").encode())
    frames, closed = read_frames(sock, timeout=5)
    assert frames[0].startswith(b"CONNECTED")
    assert closed, "silent client kept open"
    command, headers, _ = frame_headers(frames[-1])
    assert (command, headers["message"]) == ("ERROR", "Heart-beat timeout")


def test_client_heart_beats_keep_the_connection(raw_socket):
    sock = raw_socket()
    sock.sendall(CONNECT.format(hb="500,0").encode())
    read_frames(sock, timeout=5, count=1)
    for _ in range(15):
        time.sleep(0.1)
        sock.sendall(b"\n")
    sock.sendall(b"DISCONNECT\nreceipt:done\n\n\0")
    frames, _ = read_frames(sock, timeout=5, count=1)
    assert frame_headers(frames[0])[1]["receipt-id"] == "done"


def _amqp_connection_of(broker: BrokerProbe, client_port: int) -> str:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for connection in broker.management("/api/connections") or []:
            name = (connection.get("client_properties") or {}).get("connection_name", "")
            if name.endswith(f":{client_port}"):
                return connection["name"]
        time.sleep(0.5)  # the management API refreshes its connection list every few seconds
    raise AssertionError(f"no AMQP connection for STOMP client port {client_port}")


@pytest.mark.own_amqp_connection
def test_broker_forced_close_reaches_the_client_and_spares_others(stomp_client, broker):
    victim = stomp_client("1.2")
    other = stomp_client("1.2")
    queue = unique("survivor")
    broker.track_queue(queue)
    other.conn.subscribe(f"/queue/{queue}", id="s")
    victim_port = victim.conn.transport.socket.getsockname()[1]
    name = _amqp_connection_of(broker, victim_port)
    broker.management("/api/connections/" + urllib.parse.quote(name, safe=""), "DELETE")
    error = victim.next("ERROR", timeout=10)
    assert error.headers["message"] == "connection_forced"
    assert "CONNECTION_FORCED" in error.body
    assert victim.wait_disconnected(5)
    other.conn.send(f"/queue/{queue}", "unaffected")
    assert other.next("MESSAGE").body == "unaffected"


def test_shutdown_tells_clients_and_closes(start_adapter):
    server = start_adapter(shutdown_timeout=5)
    client = StompClient(server.port)
    server.stop()
    error = client.next("ERROR", timeout=10)
    assert error.headers["message"] == "Server shutdown"
    assert client.wait_disconnected(5)


def test_broker_host_name_is_resolved_once_then_its_address_reused(amqp_url):
    # adapter.amqp_url names the broker by host name (the default is localhost): the first login
    # resolves it, the next ones connect to the address that worked (adapter/amqp/resolver.py)
    parts = urllib.parse.urlsplit(amqp_url)
    if parts.hostname not in ("127.0.0.1", "localhost"):
        raise AssertionError(f"this test expects the broker on this machine, AMQP_URL is {amqp_url}")
    by_name = parts._replace(netloc=parts.netloc.replace(parts.hostname, "localhost", 1)).geturl()
    server = AdapterProcess(by_name)
    server.start()
    try:
        assert server.server.context.nodes.nodes[0].resolver.target() == "localhost"
        for _ in range(2):
            client = StompClient(server.port, "1.2")
            client.next("CONNECTED")
            client.close()
        assert server.server.context.nodes.nodes[0].resolver.target() in ("127.0.0.1", "::1")
    finally:
        server.stop()


def test_slow_reader_still_gets_its_disconnect_receipt(stomp_client, broker, adapter):
    # After DISCONNECT the adapter half-closes and lingers; a client that is still reading a
    # large final batch (it paused for 3 s, longer than one linger period) must still get
    # everything, RECEIPT last, instead of being cut off.
    queue = unique("slow")
    broker.track_queue(queue)
    producer = stomp_client("1.2")
    body = "x" * 8192
    for i in range(600):
        producer.conn.send(f"/queue/{queue}", body, headers={"receipt": f"p{i}"} if i == 599 else {})
    producer.next("RECEIPT", timeout=15)

    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", adapter.port))
    sock.sendall(b"CONNECT\naccept-version:1.2\nhost:/\nlogin:guest\npasscode:guest\n\n\0")
    sock.sendall(f"SUBSCRIBE\ndestination:/queue/{queue}\nid:s\nack:auto\n\n\0".encode())
    time.sleep(1)  # the adapter's buffer fills with MESSAGEs the client does not read yet
    sock.sendall(b"DISCONNECT\nreceipt:bye\n\n\0")
    time.sleep(3)
    data = b""
    sock.settimeout(15)
    while chunk := sock.recv(65536):
        data += chunk
    sock.close()
    # everything the adapter had written arrives, intact, RECEIPT last (with ack:auto, deliveries
    # the broker had sent but the adapter had not read yet end with the connection, as the
    # client asked by disconnecting; that part is not what this test is about)
    messages = data.count(b"MESSAGE\n")
    assert messages > 100, "the adapter's write buffer never filled up; the test proves nothing"
    assert data.count(b"\0") == messages + 2  # CONNECTED, the MESSAGEs, RECEIPT: none cut off
    assert data.endswith(b"RECEIPT\nreceipt-id:bye\n\n\0\n")


def _broker_channels_of(client_port: int) -> int:
    """The channels RabbitMQ counts now on the adapter's AMQP connection for one STOMP client
    (rabbitmqctl asks the connection process itself; the management API lags by seconds)."""
    listing = subprocess.run(
        ["rabbitmqctl", "list_connections", "client_properties", "channels", "-q"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    found = [line for line in listing.splitlines() if f'"STOMP 127.0.0.1:{client_port}"' in line]
    assert len(found) == 1, f"no single AMQP connection for STOMP client port {client_port}: {listing}"
    return int(found[0].rsplit("\t", 1)[1])


@pytest.mark.own_amqp_connection
def test_the_amqp_channel_opens_with_the_first_frame_that_needs_it(stomp_client, broker):
    """A login opens no channel on the broker (it costs RabbitMQ about a quarter of a login);
    the first SUBSCRIBE opens it, with its queue.declare in the same write."""
    client = stomp_client("1.2")
    client.next("CONNECTED")
    port = client.conn.transport.socket.getsockname()[1]
    assert _broker_channels_of(port) == 0
    queue = unique("lazy-channel")
    broker.track_queue(queue)
    client.conn.subscribe(f"/queue/{queue}", id="s", headers={"receipt": "sub"})
    assert client.next("RECEIPT").headers["receipt-id"] == "sub"
    assert _broker_channels_of(port) == 1
    client.conn.send(f"/queue/{queue}", "through the lazily opened channel")
    assert client.next("MESSAGE").body == "through the lazily opened channel"
