"""Busy polling (adapter.busy_poll_microseconds, adapter/busy_poll.py) in a running adapter on
uvloop, the loop the adapter's command runs on: the setting reaches the loop, request/reply
round trips through the real broker come back whole and in order with it on and off, and a
client that keeps the adapter reading one byte at a time neither keeps a bystander from being
served nor leaves the loop spinning once it stops."""

from __future__ import annotations

import socket
import threading
import time

import pytest
import uvloop

from adapter.busy_poll import NO_POLL, BusyPoller, poller_of
from tests.support import RawSession, StompClient, unique, wait_until


def _poller(adapter):  # type: ignore[no-untyped-def]
    async def get():  # type: ignore[no-untyped-def]
        return poller_of(adapter.loop)

    return adapter.run(get())


def _request_reply(port: int, count: int) -> list[str]:
    """``count`` requests, one outstanding at a time, to a responder on another connection that
    answers each on the requester's temp queue; the correlation ids of the replies, in order."""
    service = unique("service")
    responder = StompClient(port)
    requester = StompClient(port)
    try:
        responder.conn.subscribe(f"/queue/{service}", id="svc", headers={"receipt": "sub"})
        responder.next("RECEIPT")
        replies = []
        for number in range(count):
            requester.conn.send(
                f"/queue/{service}",
                f"request {number}",
                headers={"reply-to": "/temp-queue/replies", "correlation-id": f"c{number}"},
            )
            request = responder.next("MESSAGE")
            assert request.body == f"request {number}"
            responder.conn.send(
                request.headers["reply-to"],
                f"reply {number}",
                headers={"correlation-id": request.headers["correlation-id"]},
            )
            reply = requester.next("MESSAGE")
            assert reply.body == f"reply {number}"
            replies.append(reply.headers["correlation-id"])
        return replies
    finally:
        requester.close()
        responder.close()


@pytest.mark.parametrize("microseconds", [None, 0, 500])
def test_round_trips_come_back_whole_and_in_order(start_adapter, microseconds) -> None:  # type: ignore[no-untyped-def]
    settings = {} if microseconds is None else {"busy_poll_microseconds": microseconds}
    adapter = start_adapter(event_loop=uvloop.new_event_loop, **settings)
    poller = _poller(adapter)
    if microseconds == 0:
        assert poller is NO_POLL
    else:  # the default is 50 µs
        assert isinstance(poller, BusyPoller)
        assert poller.core.window == pytest.approx((microseconds or 50) / 1e6)
    assert _request_reply(adapter.port, 50) == [f"c{number}" for number in range(50)]


def test_a_client_trickling_bytes_keeps_no_one_waiting_and_the_spin_ends_with_it(start_adapter) -> None:  # type: ignore[no-untyped-def]
    adapter = start_adapter(event_loop=uvloop.new_event_loop, busy_poll_microseconds=2000)
    poller = _poller(adapter)
    assert isinstance(poller, BusyPoller)
    stop = threading.Event()

    def trickle() -> None:
        # a frame that never ends, one byte at a time as fast as the socket takes them: every
        # byte is a read, and every read starts or stretches a spin
        sock = socket.create_connection(("127.0.0.1", adapter.port), timeout=5)
        try:
            sock.sendall(b"CONNECT\naccept-version:1.2\nhost:/\nlogin:guest\npasscode:guest\n\n\0")
            sock.sendall(b"SEND\ndestination:/queue/nowhere\nx-padding:")
            while not stop.is_set():
                try:
                    sock.send(b"x")
                except OSError:
                    return  # the adapter closed it (a frame too long, or its timeout): fine
                time.sleep(0.0001)
        finally:
            sock.close()

    trickler = threading.Thread(target=trickle, daemon=True)
    trickler.start()
    try:
        time.sleep(0.3)
        # the bystander is served meanwhile: request/reply and a plain round trip
        assert _request_reply(adapter.port, 20) == [f"c{number}" for number in range(20)]
        bystander = RawSession(adapter.port)
        assert bystander.command == "CONNECTED"
        bystander.round_trip(unique("bystander"))
        bystander.disconnect()
    finally:
        stop.set()
        trickler.join(5)
    # with no more reads, the loop goes back to sleep within its window
    assert wait_until(lambda: not poller._spinning, timeout=5)  # noqa: SLF001


def test_only_a_logged_in_session_and_an_open_amqp_connection_start_a_spin(start_adapter) -> None:  # type: ignore[no-untyped-def]
    """A login's steps wait for the broker's work, not for a wake-up: a client that has not
    logged in, and an AMQP connection in its handshake, never start a spin."""
    adapter = start_adapter(event_loop=uvloop.new_event_loop)
    poller = _poller(adapter)
    assert isinstance(poller, BusyPoller)

    async def pollers():  # type: ignore[no-untyped-def]
        return [connection.busy_poll for connection in adapter.server.context.connections]

    anonymous = socket.create_connection(("127.0.0.1", adapter.port), timeout=5)
    try:
        anonymous.sendall(b"CONN")  # the start of a CONNECT: read, but not logged in
        assert wait_until(lambda: adapter.run(pollers()) == [NO_POLL], timeout=5)
        session = RawSession(adapter.port)
        assert session.command == "CONNECTED"
        both = sorted([id(NO_POLL), id(poller)])
        assert wait_until(lambda: sorted(map(id, adapter.run(pollers()))) == both, 5)
        session.round_trip(unique("logged-in"))  # its AMQP connection is open: it spins too

        async def amqp_pollers():  # type: ignore[no-untyped-def]
            return [
                connection.stomp.amqp.socket.busy_poll
                for connection in adapter.server.context.connections
                if connection.stomp.amqp is not None
            ]

        assert adapter.run(amqp_pollers()) == [poller]
        session.disconnect()
    finally:
        anonymous.close()
