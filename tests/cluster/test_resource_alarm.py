"""A real resource alarm on a private RabbitMQ node (issue 38 item 5; rabbitmq-server #17439: Web
STOMP ignores resource alarms): while the broker blocks publishing, the adapter stops reading its
publishing clients on TCP and on WebSocket alike, goes on delivering to consumers, and resumes
when the alarm clears, with every receipted message in the queue.

The alarm is RabbitMQ's own: ``rabbitmqctl set_vm_memory_high_watermark 0`` blocks every
publisher (RabbitMQ sends ``connection.blocked`` to a connection when it next publishes), and a
watermark of 0.4 clears it.  One node of tests/cluster/rabbit.py (``private_node``) for this
module, with its own ports and data, never the machine's broker."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from websockets.sync.client import connect as ws_connect

from tests.cluster.rabbit import ClusterUnavailable, RabbitNode, private_node, remove_private_node
from tests.support import AdapterProcess, RawSession, unique, wait_until

CONSUMER = "alarm-consumer"  # another user, so that multiplexing never puts it with the publishers


@pytest.fixture(scope="module")
def alarm_node() -> Iterator[RabbitNode]:
    try:
        node, _ = private_node("stomp-alarm")
        node.write_files()
        node.start()
        node.wait_started()
        node.ctl("add_user", CONSUMER, "pw")
        node.ctl("set_permissions", CONSUMER, ".*", ".*", ".*")
    except ClusterUnavailable as error:
        pytest.fail(str(error), pytrace=False)
    try:
        yield node
    finally:
        remove_private_node(node)


def paused_for_the_broker(adapter: AdapterProcess) -> list[str]:
    """The peers of the client connections whose reading is paused because of the broker."""

    async def peers() -> list[str]:
        return sorted(c.peer for c in adapter.server.context.connections if "broker-flow" in c._pause_reasons)

    return list(adapter.run(peers()))


def peer_of(session: RawSession) -> str:
    host, port = session.sock.getsockname()[:2]
    return f"{host}:{port}"


@pytest.mark.parametrize("settings", [{}, {"amqp_sessions_per_connection": 4}], ids=["own", "multiplexed"])
def test_a_memory_alarm_stops_tcp_and_websocket_publishers_and_nothing_receipted_is_lost(
    alarm_node: RabbitNode, settings: dict[str, Any]
) -> None:
    adapter = AdapterProcess(alarm_node.url, web_stomp_listeners=["127.0.0.1:0"], **settings)
    adapter.start()
    try:
        queue = unique("alarm")
        consumer = RawSession(adapter.port, CONSUMER, "pw")
        got = consumer.send(f"SUBSCRIBE\nid:c\ndestination:/queue/{queue}\nreceipt:r\n\n")
        assert got[-1][0] == "RECEIPT", got
        tcp = RawSession(adapter.port)
        got = tcp.send(f"SEND\ndestination:/queue/{queue}\nreceipt:before\n\nbefore")
        assert got[-1][0] == "RECEIPT", got
        assert consumer.frames_until(("MESSAGE",))[-1][2] == b"before"
        backlog = unique("alarm-backlog")
        for n in range(20):
            got = tcp.send(f"SEND\ndestination:/queue/{backlog}\nreceipt:b{n}\n\nbacklog-{n}")
            assert got[-1][0] == "RECEIPT", got
        ws_port = adapter.server.web_addresses[0][1]
        with ws_connect(f"ws://127.0.0.1:{ws_port}/ws", subprotocols=["v12.stomp"], compression=None) as ws:  # type: ignore[list-item]
            ws.send("CONNECT\naccept-version:1.2\nhost:/\nlogin:guest\npasscode:guest\n\n\0")
            assert str(ws.recv(timeout=5)).startswith("CONNECTED")
            alarm_node.ctl("set_vm_memory_high_watermark", "0")
            try:
                # each publisher's next SEND meets the block: no RECEIPT, and the adapter stops
                # reading that client (what it sends next stays in its socket)
                tcp.sock.sendall(f"SEND\ndestination:/queue/{queue}\nreceipt:t1\n\ntcp-1\0".encode())
                ws.send(f"SEND\ndestination:/queue/{queue}\nreceipt:w1\n\nws-1\0")
                assert wait_until(lambda: len(paused_for_the_broker(adapter)) >= 2, 30), (
                    paused_for_the_broker(adapter)
                )
                tcp.sock.sendall(f"SEND\ndestination:/queue/{queue}\nreceipt:t2\n\ntcp-2\0".encode())
                ws.send(f"SEND\ndestination:/queue/{queue}\nreceipt:w2\n\nws-2\0")
                # the consumer is another user on its own connection: not paused, and still
                # served (a queue filled before the alarm is delivered during it)
                assert peer_of(consumer) not in paused_for_the_broker(adapter)
                got = consumer.send(f"SUBSCRIBE\nid:b\ndestination:/queue/{backlog}\nreceipt:rb\n\n")
                assert got[-1][0] == "RECEIPT", got
                drained = [f[2] for f in got if f[0] == "MESSAGE"]
                while len(drained) < 20:
                    drained += [f[2] for f in consumer.frames_until(("MESSAGE",)) if f[0] == "MESSAGE"]
                assert drained == [f"backlog-{n}".encode() for n in range(20)]
                assert not tcp._pending  # nothing was receipted meanwhile
            finally:
                alarm_node.ctl("set_vm_memory_high_watermark", "0.4")
            # unblocked: every SEND is receipted, in order, and reaches the consumer
            receipts = [frame[1]["receipt-id"] for frame in tcp.frames_until(("RECEIPT",), timeout=30)]
            receipts += [frame[1]["receipt-id"] for frame in tcp.frames_until(("RECEIPT",), timeout=30)]
            assert receipts[-2:] == ["t1", "t2"], receipts
            ws_receipts = [str(ws.recv(timeout=30)), str(ws.recv(timeout=30))]
            assert all(frame.startswith("RECEIPT") for frame in ws_receipts), ws_receipts
        bodies: list[bytes] = []
        while len(bodies) < 4:
            bodies += [
                frame[2] for frame in consumer.frames_until(("MESSAGE",), timeout=30) if frame[0] == "MESSAGE"
            ]
        assert sorted(bodies) == [b"tcp-1", b"tcp-2", b"ws-1", b"ws-2"]
        assert paused_for_the_broker(adapter) == []
    finally:
        adapter.stop()
