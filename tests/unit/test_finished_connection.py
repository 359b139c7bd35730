"""A finished connection is freed by reference counting, and what reaches it late does nothing.

Every part of a client connection that refers back to its owner (the timers, the input guard,
the feature runtimes' side, the shell's link, the STOMP connection's shell and broker side; on
the AMQP side the socket's owner, the connection core's hooks and channel, the frame reader's
handler, the channel core's owner and the link's callables) lets go of it when the connection
ends, so no reference cycle is left for the cyclic garbage collector (whose work per closed
connection cost about 5 % of a connect cycle's instructions, bench/instructions.py).  The
collector is disabled while these tests run: an object that outlives its connection here is
one the collector would have had to find.  Late events (a broker close, a delivery, a timer, a
frame on a socket that has ended) must then be harmless: no output, no exception.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest
from pamqp import commands

from adapter.amqp.connection import AmqpError
from adapter.mapping import operations as ops
from adapter.mapping.properties import MessageProperties
from tests.unit.test_amqp_connection import broker, open_connection
from tests.unit.test_shell import logged_in, make_server, settle


@pytest.fixture
def no_collector() -> Iterator[None]:
    """Only reference counting frees objects meanwhile."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


async def test_a_disconnected_client_is_freed_without_the_collector(no_collector: None) -> None:
    client, transport, link = await logged_in()
    parts = [client, client.stomp, client.session, client.session.parts.subscriptions]
    refs = [weakref.ref(part) for part in parts]
    client.data_received(b"DISCONNECT\nreceipt:bye\n\n\0")
    await settle()
    assert b"receipt-id:bye" in transport.frames()[-1]
    client.connection_lost(None)
    await settle()
    assert client.done.done()
    del client, transport, link, parts
    await settle()
    assert [ref() for ref in refs] == [None] * len(refs)


async def test_a_client_that_went_away_is_freed_without_the_collector(no_collector: None) -> None:
    client, transport, link = await logged_in(heart_beat="1000,1000")
    client.data_received(b"SUBSCRIBE\nid:0\ndestination:/queue/a\nreceipt:s\n\n\0")
    await settle()
    refs = [weakref.ref(client), weakref.ref(client.stomp), weakref.ref(client.session)]
    client.connection_lost(ConnectionResetError("gone"))
    await settle()
    del client, transport, link
    await settle()
    assert [ref() for ref in refs] == [None, None, None]


async def test_late_events_after_the_end_do_nothing() -> None:
    """The broker's events, the timers and the feature runtimes may still call a connection
    that has finished (they were under way, or the AMQP close is still going on)."""
    client, transport, _link = await logged_in(make_server(), heart_beat="1000,1000")
    client.data_received(b"SUBSCRIBE\nid:0\ndestination:/queue/a\nreceipt:s\n\n\0")
    await settle()
    client.connection_lost(ConnectionResetError("gone"))
    await settle()
    transport.written.clear()
    stomp = client.stomp
    stomp.on_deliver(ops.Delivery("T_0", 1, False, "", "a", MessageProperties(), b"late"))
    stomp.on_confirm(1, False, True)
    stomp.on_server_cancel("T_0")
    stomp.on_amqp_closed(AmqpError(320, "CONNECTION_FORCED"))
    stomp.on_broker_backpressure(True)
    stomp.on_read_done()
    stomp.write(b"late\0")
    stomp.shell.flush()
    stomp.run_all([ops.SendFrame(b"late\0"), ops.CloseClient("late")])
    client.link.amqp_closed(AmqpError(0, "lost"))
    client.link.broker_backpressure(False)
    client.link.confirms_settled()
    heartbeats = client.timers._heartbeats  # noqa: SLF001 - the timers' callbacks, fired late
    heartbeats.send_tick(0.5)
    heartbeats.receive_tick(1.5)
    heartbeats.receive_tick(1.5)
    client.timers._login_tick()  # noqa: SLF001
    client.timers._token_expired()  # noqa: SLF001
    client._guard.check_time()  # noqa: SLF001
    client.features.flush()
    client.flush()
    await settle()
    assert transport.frames() == [] and client.closed


async def test_an_ended_amqp_connection_is_freed_without_the_collector(no_collector: None) -> None:
    connection, transport, events = await open_connection()
    refs = [
        weakref.ref(connection),
        weakref.ref(connection.socket),
        weakref.ref(connection.socket.core),
        weakref.ref(connection._core),  # noqa: SLF001 - the channel core
    ]
    connection.socket.connection_lost(None)
    assert len(events.closed) == 1
    del connection, transport
    assert [ref() for ref in refs] == [None] * len(refs)


async def test_late_input_on_an_ended_amqp_connection_does_nothing() -> None:
    connection, transport, events = await open_connection()
    connection.socket.connection_lost(None)
    transport.written.clear()
    reads = events.reads
    # a read the transport had under way, the session's late publish and call
    connection.socket.data_received(broker((commands.Basic.CancelOk(consumer_tag="T_0"), 1)))
    connection.publish("", "q", MessageProperties(), b"late")
    connection.flush()
    with pytest.raises(AmqpError):
        await connection.execute(ops.QueueDeclare("q"))
    assert bytes(transport.written) == b"" and len(events.closed) == 1 and events.reads == reads
