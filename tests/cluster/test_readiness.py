"""``/readyz`` of an adapter in front of the cluster follows the nodes: 503 once no node answers
(every node's RabbitMQ application stopped, so none accepts AMQP connections), 200 again once
one returns; meanwhile a CONNECT gets the ERROR of an unreachable broker, and afterwards a client
is served by the node that came back."""

from __future__ import annotations

import socket

import pytest

from tests.cluster.clients import http_get, wait_until
from tests.support import StompClient, read_frames, unique

pytestmark = pytest.mark.timeout(300)  # the first test also starts the cluster (about 20 s)

CONNECT = b"CONNECT\naccept-version:1.2\nhost:/\nlogin:guest\npasscode:guest\n\n\0"


def connect_answer(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(CONNECT)
        frames, _closed = read_frames(sock, timeout=15, count=1)
    assert frames, "no answer to CONNECT"
    return frames[0]


def test_readyz_is_503_while_no_node_answers_and_200_when_one_returns(cluster, cluster_adapter):
    adapter = cluster_adapter(cluster.urls, http_listen="127.0.0.1:0")
    http_port = adapter.server.http_addresses[0][1]
    assert http_get(http_port, "/readyz")[0] == 200

    # stopped one after the other: the last one stopped is the one that can start alone
    for node in cluster.nodes:
        node.ctl("stop_app")
    down_after = wait_until(lambda: http_get(http_port, "/readyz")[0] == 503, "/readyz to turn 503")
    status, body = http_get(http_port, "/readyz")
    assert body.startswith("no broker node answers: "), body
    for node in cluster.nodes:  # the answer names every node
        assert f"amqp://127.0.0.1:{node.amqp_port}" in body, body
    assert http_get(http_port, "/healthz") == (200, "ok\n")  # alive, only not ready
    refused = connect_answer(adapter.port)
    assert refused.startswith(b"ERROR") and b"The broker is unreachable" in refused, refused

    returning = cluster.nodes[-1]
    returning.ctl("start_app", timeout=120)
    up_after = wait_until(lambda: http_get(http_port, "/readyz")[0] == 200, "/readyz to turn 200")
    assert http_get(http_port, "/readyz")[1] == f"broker amqp://127.0.0.1:{returning.amqp_port} answers\n"
    client = StompClient(adapter.port)
    try:
        destination = f"/topic/{unique('ready')}"
        client.conn.subscribe(destination, id="s")
        client.conn.send(destination, "after the return")
        assert client.next("MESSAGE", timeout=15).body == "after the return"
    finally:
        client.close()
    # (readiness reuses a check's answer for 5 s, so each turn takes up to about that long)
    print(
        f"\nreadiness: 503 {down_after:.2f} s after the last node stopped, "
        f"200 {up_after:.2f} s after one node's start_app returned"
    )
