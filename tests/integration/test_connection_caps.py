"""stomp.max_connections and web_stomp.max_connections against the real RabbitMQ, with stomp.py,
raw sockets and the `websockets` library as the independent clients.

stomp.max_connections (as rabbitmq_stomp on RabbitMQ's main branch): one count of STOMP
sessions for every listener (TCP, TLS, WebSocket); the CONNECT over it gets ERROR "Bad CONNECT"
/ "Connection refused: node connection limit reached" and the connection closes.
web_stomp.max_connections (ranch's max_connections in the plugin): the sockets of one web_stomp
listener; over it the adapter answers the HTTP request with 503 (docs/compatibility.md says how
the plugin differs).  Every test has a bystander that must stay served, and checks that the
slot of a connection that went away (cleanly, by a reset, by a failed handshake or upgrade)
comes back.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import struct
import time
from pathlib import Path
from typing import Any

import pytest
import trustme
from websockets.exceptions import InvalidStatus
from websockets.sync.client import ClientConnection, connect

from tests.support import AdapterProcess, StompClient, frame_headers, read_frames, unique

CONNECT = b"CONNECT\naccept-version:1.2\nhost:/\nlogin:guest\npasscode:guest\n\n\0"
NODE_LIMIT = "Connection refused: node connection limit reached"


def stomp_in_use(adapter: AdapterProcess) -> int:
    async def read() -> int:
        cap = adapter.server.context.session_settings.registries.connection_cap
        assert cap is not None
        return cap.in_use

    return int(adapter.run(read()))


def web_in_use(adapter: AdapterProcess, index: int = 0) -> int:
    async def read() -> int:
        cap = adapter.server.web[index].cap
        assert cap is not None
        return cap.in_use

    return int(adapter.run(read()))


def settle(read: Any, expected: int, timeout: float = 10.0) -> None:
    """Wait until the adapter has seen the closes the test made (wall clock: a safety bound only)."""
    deadline = time.monotonic() + timeout
    while (value := read()) != expected:
        assert time.monotonic() < deadline, f"in use: {value}, expected {expected}"
        time.sleep(0.02)


def refused_connect(sock: socket.socket) -> None:
    """Send CONNECT on a fresh socket (or TLS socket) and check the refusal the plugin sends."""
    sock.sendall(CONNECT)
    frames, closed = read_frames(sock, timeout=5, count=1)
    assert len(frames) == 1 and closed
    command, headers, body = frame_headers(frames[0])
    assert command == "ERROR"
    assert headers["message"] == "Bad CONNECT"
    assert body.decode() == NODE_LIMIT


def reset(sock: socket.socket) -> None:
    """Close with a TCP reset, as a crashed client or a middlebox does."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def bystander_round_trip(sender: StompClient, receiver: StompClient, destination: str) -> None:
    sender.conn.send(destination, "still served", receipt=unique("r"))
    sender.next("RECEIPT")
    assert receiver.next("MESSAGE").body == "still served"


def metric(adapter: AdapterProcess, line_start: str) -> float:
    http_port = adapter.server.http_addresses[0][1]
    conn = http.client.HTTPConnection("127.0.0.1", http_port, timeout=5)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    for line in text.splitlines():
        if line.startswith(line_start + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{line_start} not in /metrics")


# ------------------------------------------------------------------------------- stomp.max_connections


def test_the_connect_over_stomp_max_connections_is_refused_and_the_others_are_served(start_adapter, broker):
    adapter = start_adapter(max_connections=2, http_listen="127.0.0.1:0")
    queue = unique("cap")
    broker.track_queue(queue)
    receiver = StompClient(adapter.port)
    sender = StompClient(adapter.port)
    receiver.conn.subscribe(f"/queue/{queue}", id="1")
    try:
        with socket.create_connection(("127.0.0.1", adapter.port), timeout=5) as third:
            refused_connect(third)
        bystander_round_trip(sender, receiver, f"/queue/{queue}")
        assert metric(adapter, 'stomp_adapter_login_failures_total{reason="max_connections"}') == 1
        assert stomp_in_use(adapter) == 2
        sender.close()
        settle(lambda: stomp_in_use(adapter), 1)
        again = StompClient(adapter.port)  # the freed slot
        bystander_round_trip(again, receiver, f"/queue/{queue}")
        again.close()
    finally:
        receiver.close()
        sender.close()


def test_slots_come_back_after_resets_failed_logins_and_bad_connects(start_adapter):
    adapter = start_adapter(max_connections=2)
    bystander = StompClient(adapter.port)
    try:
        for _ in range(5):
            sock = socket.create_connection(("127.0.0.1", adapter.port), timeout=5)
            sock.sendall(CONNECT)
            frames, _closed = read_frames(sock, timeout=5, count=1)
            assert frame_headers(frames[0])[0] == "CONNECTED"
            reset(sock)  # a logged-in client that vanishes
        for bad in (
            b"CONNECT\naccept-version:1.2\nlogin:guest\npasscode:wrong\n\n\0",  # refused by the broker
            b"CONNECT\naccept-version:9.9\n\n\0",  # no common version
        ):
            for _ in range(3):
                with socket.create_connection(("127.0.0.1", adapter.port), timeout=5) as sock:
                    sock.sendall(bad)
                    frames, _closed = read_frames(sock, timeout=5, count=1)
                    assert frame_headers(frames[0])[0] == "ERROR" and NODE_LIMIT.encode() not in frames[0]
        settle(lambda: stomp_in_use(adapter), 1)
        second = StompClient(adapter.port)
        with socket.create_connection(("127.0.0.1", adapter.port), timeout=5) as third:
            refused_connect(third)
        second.close()
        bystander.conn.send(f"/topic/{unique('t')}", "x", receipt="done")
        bystander.next("RECEIPT")
    finally:
        bystander.close()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("pki")
    ca = trustme.CA()
    server = ca.issue_cert("localhost", "127.0.0.1")
    files = {"ca": directory / "ca.pem", "server": directory / "server.pem"}
    ca.cert_pem.write_to_path(str(files["ca"]))
    server.private_key_and_cert_chain_pem.write_to_path(str(files["server"]))
    return files


def tls_socket(port: int, pki: dict[str, Path]) -> ssl.SSLSocket:
    context = ssl.create_default_context(cafile=str(pki["ca"]))
    return context.wrap_socket(
        socket.create_connection(("127.0.0.1", port), timeout=5), server_hostname="127.0.0.1"
    )


def test_tcp_and_tls_listeners_share_stomp_max_connections(start_adapter, pki):
    adapter = start_adapter(max_connections=2, ssl_listeners=["127.0.0.1:0"], ssl_certfile=str(pki["server"]))
    tls_port = adapter.server.tls_addresses[0][1]
    tcp_client = StompClient(adapter.port)
    try:
        with tls_socket(tls_port, pki) as tls_client:
            tls_client.sendall(CONNECT)
            frames, _closed = read_frames(tls_client, timeout=5, count=1)
            assert frame_headers(frames[0])[0] == "CONNECTED"
            with tls_socket(tls_port, pki) as third:
                refused_connect(third)
            with socket.create_connection(("127.0.0.1", adapter.port), timeout=5) as third:
                refused_connect(third)
            for _ in range(5):  # failed TLS handshakes take no slot
                with socket.create_connection(("127.0.0.1", tls_port), timeout=5) as sock:
                    sock.sendall(b"not TLS at all\r\n\r\n")
                    read_frames(sock, timeout=5)
            assert stomp_in_use(adapter) == 2
        settle(lambda: stomp_in_use(adapter), 1)
        with tls_socket(tls_port, pki) as again:
            again.sendall(CONNECT)
            frames, _closed = read_frames(again, timeout=5, count=1)
            assert frame_headers(frames[0])[0] == "CONNECTED"
        tcp_client.conn.send(f"/topic/{unique('t')}", "x", receipt="done")
        tcp_client.next("RECEIPT")
    finally:
        tcp_client.close()


def test_stomp_max_connections_counts_websocket_sessions_too(start_adapter):
    adapter = start_adapter(max_connections=1, web_stomp_listeners=["127.0.0.1:0"])
    web_port = adapter.server.web_addresses[0][1]
    tcp_client = StompClient(adapter.port)
    try:
        with open_ws(web_port) as ws:
            ws.send(CONNECT.decode())
            error = ws.recv(timeout=5)
            assert isinstance(error, str) and error.startswith("ERROR\n")
            assert "message:Bad CONNECT" in error and NODE_LIMIT in error
        tcp_client.close()
        settle(lambda: stomp_in_use(adapter), 0)
        with open_ws(web_port) as ws:
            ws.send(CONNECT.decode())
            assert str(ws.recv(timeout=5)).startswith("CONNECTED\n")
    finally:
        tcp_client.close()


# --------------------------------------------------------------------------- web_stomp.max_connections


def open_ws(port: int, scheme: str = "ws", **kwargs: Any) -> ClientConnection:
    return connect(
        f"{scheme}://127.0.0.1:{port}/ws",
        subprotocols=["v12.stomp"],
        open_timeout=5,
        compression=None,
        **kwargs,
    )


def stomp_connected(ws: ClientConnection) -> None:
    ws.send(CONNECT.decode())
    assert str(ws.recv(timeout=5)).startswith("CONNECTED\n")


def test_the_websocket_over_web_stomp_max_connections_gets_503_and_the_others_are_served(start_adapter):
    adapter = start_adapter(
        web_stomp_listeners=["127.0.0.1:0"], web_stomp_max_connections=2, http_listen="127.0.0.1:0"
    )
    port = adapter.server.web_addresses[0][1]
    with open_ws(port) as first, open_ws(port) as second:
        stomp_connected(first)
        stomp_connected(second)
        with pytest.raises(InvalidStatus) as refused:
            open_ws(port)
        assert refused.value.response.status_code == 503
        assert b"web_stomp.max_connections" in refused.value.response.body
        # a plain HTTP client sees the same answer
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("GET", "/ws")
        response = conn.getresponse()
        assert response.status == 503 and b"web_stomp.max_connections (2)" in response.read()
        conn.close()
        # the bystander is served
        destination = f"/topic/{unique('ws')}"
        first.send(f"SUBSCRIBE\nid:1\ndestination:{destination}\nreceipt:sub\n\n\0")
        assert str(first.recv(timeout=5)).startswith("RECEIPT\n")
        second.send(f"SEND\ndestination:{destination}\n\nhello\0")
        assert str(first.recv(timeout=5)).startswith("MESSAGE\n")
        assert (
            metric(adapter, 'stomp_adapter_connections_refused_total{reason="web_stomp_max_connections"}')
            == 2
        )
        assert web_in_use(adapter) == 2
    settle(lambda: web_in_use(adapter), 0)
    with open_ws(port) as again:
        stomp_connected(again)


def test_websocket_slots_come_back_after_failed_upgrades_and_resets(start_adapter):
    adapter = start_adapter(web_stomp_listeners=["127.0.0.1:0"], web_stomp_max_connections=2)
    port = adapter.server.web_addresses[0][1]
    with open_ws(port) as bystander:
        stomp_connected(bystander)
        for _ in range(5):
            # not an upgrade: 426, and the slot it held while its request was read comes back
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/ws")
            assert conn.getresponse().status == 426
            conn.close()
            # garbage: 400
            with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                sock.sendall(b"CONNECT\n\n\0")
                assert sock.recv(100).startswith(b"HTTP/1.1 400")
            # an upgraded WebSocket whose client vanishes
            with open_ws(port) as ws:
                stomp_connected(ws)
                ws.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                ws.close_socket()  # a reset, no WebSocket Close
            settle(lambda: web_in_use(adapter), 1)
        with open_ws(port) as second:
            stomp_connected(second)
            with pytest.raises(InvalidStatus):
                open_ws(port)
        bystander.send(f"SUBSCRIBE\nid:1\ndestination:/topic/{unique('ws')}\nreceipt:ok\n\n\0")
        assert str(bystander.recv(timeout=5)).startswith("RECEIPT\n")


def test_wss_failed_handshakes_take_no_websocket_slot(start_adapter, pki):
    adapter = start_adapter(
        web_stomp_ssl_listeners=["127.0.0.1:0"],
        web_stomp_ssl_certfile=str(pki["server"]),
        web_stomp_max_connections=1,
    )
    port = adapter.server.web_addresses[0][1]
    context = ssl.create_default_context(cafile=str(pki["ca"]))
    for _ in range(5):
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(b"GET /ws HTTP/1.1\r\n\r\n")  # plain HTTP to the TLS port
            read_frames(sock, timeout=5)
    with open_ws(port, "wss", ssl=context) as only:
        stomp_connected(only)
        with pytest.raises(InvalidStatus) as refused:
            open_ws(port, "wss", ssl=context)
        assert refused.value.response.status_code == 503
        only.send(f"SUBSCRIBE\nid:1\ndestination:/topic/{unique('ws')}\nreceipt:ok\n\n\0")
        assert str(only.recv(timeout=5)).startswith("RECEIPT\n")
    settle(lambda: web_in_use(adapter), 0)
    with open_ws(port, "wss", ssl=context) as again:
        stomp_connected(again)
