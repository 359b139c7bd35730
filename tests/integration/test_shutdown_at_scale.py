"""A graceful stop that the broker cannot keep up with: the client side is told and closed
first, the AMQP connections close in turns (adapter/amqp/admission.py), and at
``adapter.shutdown_timeout`` the ones still closing are dropped, not waited for; the broker
cleans them up as it would any client that went away (unacknowledged messages requeued,
auto-delete queues deleted).  Nothing acknowledged is lost.

The broker that does not answer ``connection.close`` (or answers slowly) is played by the AMQP
proxy (tests/amqp_proxy.py) in front of the real RabbitMQ.
"""

from __future__ import annotations

import asyncio
import logging

import pytest
from pamqp import commands

from adapter.amqp.admission import Gate
from tests.amqp_proxy import CONNECTION_CLOSE_OK, Frame, Hook, Link, ProxyThread
from tests.support import StompClient, unique

CONNECTION_CLOSE = commands.Connection.Close.index


class SwallowClose(Hook):
    """The broker never sees the client's connection.close, so it never answers it."""

    def __init__(self) -> None:
        self.swallowed = 0

    async def client_frame(self, link: Link, frame: Frame) -> list[Frame]:
        if frame.method_index == CONNECTION_CLOSE:
            self.swallowed += 1
            return []
        return [frame]


class SlowClose(Hook):
    """Each connection.close reaches the broker after a pause; records how many were under way
    at once (sent by the adapter, close-ok not yet back)."""

    def __init__(self) -> None:
        self.under_way = 0
        self.most = 0
        self.closed = 0

    async def client_frame(self, link: Link, frame: Frame) -> list[Frame]:
        if frame.method_index == CONNECTION_CLOSE:
            self.under_way += 1
            self.most = max(self.most, self.under_way)
            await asyncio.sleep(0.05)
        return [frame]

    async def server_frame(self, link: Link, frame: Frame) -> list[Frame]:
        if frame.method_index == CONNECTION_CLOSE_OK:
            self.under_way -= 1
            self.closed += 1
        return [frame]


# counts an AMQP connection per session (with multiplexing: tests/integration/test_multiplexing.py,
# test_at_the_shutdown_deadline_unanswered_shared_connection_closes_are_dropped)
@pytest.mark.own_amqp_connection
def test_at_the_deadline_unanswered_closes_are_dropped_and_the_broker_cleans_up(
    amqp_url, start_adapter, broker, caplog
):
    hook = SwallowClose()
    with ProxyThread(amqp_url, [hook]) as proxy:
        adapter = start_adapter(amqp_url=proxy.url, shutdown_timeout=1)
        queue = unique("requeued")
        broker.declare_queue(queue, durable=True)
        broker.publish("", queue, b"held")
        holder = StompClient(adapter.port)
        holder.conn.subscribe(f"/queue/{queue}", id="s", ack="client")
        assert holder.next("MESSAGE").body == "held"  # delivered, never acknowledged
        subscribers = [StompClient(adapter.port) for _ in range(5)]
        for number, client in enumerate(subscribers):
            client.conn.subscribe(f"/topic/{unique('news')}", id=f"t{number}", headers={"receipt": "r"})
            assert client.next("RECEIPT").headers["receipt-id"] == "r"
        with caplog.at_level(logging.INFO, "adapter.server"):
            adapter.stop()
        for client in [holder, *subscribers]:
            assert client.next("ERROR", timeout=10).headers["message"] == "Server shutdown"
        assert hook.swallowed == 6  # every AMQP connection was asked to close, none answered
        assert "6 connection(s) did not close within 1.0 s (adapter.shutdown_timeout)" in caplog.text
        # dropped: the broker requeues what the dropped connection held unacknowledged
        assert broker.wait_depth(queue, 1, timeout=15) == 1
        for client in [holder, *subscribers]:
            client.close()


# counts an AMQP connection per session (with multiplexing: tests/integration/test_multiplexing.py,
# test_at_shutdown_every_shared_connection_closes_cleanly)
@pytest.mark.own_amqp_connection
def test_closes_go_in_turns_and_all_finish_cleanly(amqp_url, start_adapter):
    hook = SlowClose()
    with ProxyThread(amqp_url, [hook]) as proxy:
        adapter = start_adapter(amqp_url=proxy.url, shutdown_timeout=30)
        adapter.server.context.amqp_closes = Gate(4)  # small, so that 20 clients fill it
        clients = [StompClient(adapter.port) for _ in range(20)]
        for number, client in enumerate(clients):
            client.conn.subscribe(f"/topic/{unique('turns')}", id=f"t{number}", headers={"receipt": "r"})
            assert client.next("RECEIPT").headers["receipt-id"] == "r"
        adapter.stop()
        for client in clients:
            assert client.next("ERROR", timeout=10).headers["message"] == "Server shutdown"
            client.close()
        assert hook.closed == 20  # each AMQP connection closed cleanly (close-ok) in time
        assert hook.most <= 4
