"""adapter/amqp/shared.py without a socket or a broker: one SharedConnection carrying several
sessions' ChannelLinks over an in-memory transport, the "broker" being frames built by pamqp (an
independent AMQP implementation), and what the links write read back with pamqp too.  Covers
lazy channels with their own numbers, routing of methods and content by channel (interleaved
too), a channel error that ends one session, a connection close, a block and a lost socket that
reach every session, per-channel flow control with its bounds, and closing a channel."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pamqp import body, commands, header

from adapter.amqp.connection import AmqpError
from adapter.amqp.shared import ChannelLink, PausedBytes, SharedConnection
from adapter.mapping.operations import BasicQos
from adapter.mapping.properties import MessageProperties
from tests.unit.test_amqp_connection import Events, MemoryTransport, broker


async def open_shared(channel_max: int = 0) -> tuple[SharedConnection, MemoryTransport]:
    """A SharedConnection through the whole handshake, handed over as open() does."""
    connection = SharedConnection(Events(), heartbeat=0, connection_name="STOMP shared")
    connection.socket.core.login_as("guest", "secret", "/")
    transport = MemoryTransport()
    connection.socket.connection_made(transport)  # type: ignore[arg-type]
    connection.socket.data_received(
        broker((commands.Connection.Start(server_properties={"version": "3.10.8"}), 0))
    )
    connection.socket.data_received(
        broker((commands.Connection.Tune(channel_max=channel_max, frame_max=131072), 0))
    )
    connection.socket.data_received(broker((commands.Connection.OpenOk(), 0)))
    connection.socket.opened = True
    transport.take_frames()
    return connection, transport


def deliver(channel: int, tag: int, data: bytes) -> list[tuple[Any, int]]:
    return [
        (commands.Basic.Deliver(consumer_tag="T_1", delivery_tag=tag, exchange="", routing_key="q"), channel),
        (header.ContentHeader(0, len(data), commands.Basic.Properties()), channel),
        (body.ContentBody(data), channel),
    ]


async def two_sessions() -> tuple[SharedConnection, MemoryTransport, list[ChannelLink], list[Events]]:
    connection, transport = await open_shared()
    events = [Events(), Events()]
    links = [connection.new_link(e) for e in events]  # type: ignore[arg-type]
    for link in links:
        link.publish("", "q", MessageProperties(), b"hi")  # opens the channel
        link.flush()
    transport.take_frames()
    connection.socket.data_received(broker(*((commands.Channel.OpenOk(), link.channel) for link in links)))
    return connection, transport, links, events


async def test_a_session_costs_no_frame_until_it_uses_its_channel() -> None:
    connection, transport = await open_shared()
    first, second = connection.new_link(Events()), connection.new_link(Events())  # type: ignore[arg-type]
    assert (first.channel, second.channel) == (1, 2)
    assert first.broker_version == "3.10.8"  # the handshake's, read once per connection
    first.flush()
    assert transport.take_frames() == []
    second.ack(7, False)
    second.flush()
    (channel, opened), (channel_ack, ack) = transport.take_frames()
    assert channel == channel_ack == 2
    assert isinstance(opened, commands.Channel.Open) and isinstance(ack, commands.Basic.Ack)


async def test_deliveries_and_confirms_reach_the_session_of_their_channel_even_interleaved() -> None:
    connection, _transport, (one, two), (events_one, events_two) = await two_sessions()
    a, b = deliver(one.channel, 1, b"for one"), deliver(two.channel, 1, b"for two")
    # content frames of two channels may interleave (AMQP 0-9-1 §4.2.6)
    connection.socket.data_received(broker(a[0], b[0], a[1], b[1], b[2], a[2]))
    connection.socket.data_received(broker((commands.Basic.Ack(delivery_tag=1), two.channel)))
    assert [d.body for d in events_one.deliveries] == [b"for one"]
    assert [d.body for d in events_two.deliveries] == [b"for two"]
    assert events_one.confirms == [] and events_two.confirms == [(1, False, True)]
    # once per read that had frames of theirs (the channels' open-ok came in one read before)
    assert events_one.reads == 2 and events_two.reads == 3


def returned(channel: int, routing_key: str, data: bytes) -> list[tuple[Any, int]]:
    return [
        (commands.Basic.Return(312, "NO_ROUTE", "", routing_key), channel),
        (header.ContentHeader(0, len(data), commands.Basic.Properties()), channel),
        (body.ContentBody(data), channel),
    ]


async def test_a_return_reaches_the_session_of_its_channel_only_and_is_no_delivery() -> None:
    """A mandatory copy that routed nowhere comes back (basic.return, then its content) on the
    channel it was published on: that session hears it, its neighbour does not, and neither
    takes the returned content for a delivery, even with a neighbour's delivery between."""
    connection, _transport, (one, two), (events_one, events_two) = await two_sessions()
    one.publish_mandatory("", "ActiveMQ.DLQ", MessageProperties(delivery_mode=2), b"copy")
    back, other = returned(one.channel, "ActiveMQ.DLQ", b"copy"), deliver(two.channel, 1, b"for two")
    connection.socket.data_received(broker(back[0], other[0], back[1], other[1], back[2], other[2]))
    connection.socket.data_received(broker((commands.Basic.Ack(delivery_tag=1), one.channel)))
    assert events_one.returns == [(312, "NO_ROUTE", "", "ActiveMQ.DLQ")]
    assert events_two.returns == []
    assert events_one.deliveries == [] and [d.body for d in events_two.deliveries] == [b"for two"]
    assert events_one.confirms == [(1, False, True)] and events_two.confirms == []


async def test_a_return_passes_a_paused_session_s_account_by() -> None:
    connection, _transport, (slow, _), (slow_events, _) = await two_sessions()
    connection.paused_bytes = PausedBytes(limit=500, budget=10_000)
    slow.pause_reading()
    connection.socket.data_received(broker(*returned(slow.channel, "gone", b"x" * 2000)))
    assert slow_events.returns == [(312, "NO_ROUTE", "", "gone")] and slow_events.closed == []
    assert connection.paused_bytes.pool.used == 0  # not a delivery: nothing charged


class FlushingEvents(Events):
    """A session as ``ClientConnection`` is one: it writes the MESSAGEs of its deliveries to
    its client only at ``on_read_done``; ``written`` is what reached the client so far."""

    def __init__(self) -> None:
        super().__init__()
        self.written: list[bytes] = []

    def on_read_done(self) -> None:
        super().on_read_done()
        self.written = [d.body for d in self.deliveries]


async def test_a_delivery_completed_by_content_frames_alone_reaches_the_client_in_that_read() -> None:
    """A delivery's frames may arrive over several reads (a body larger than one read, or TCP
    segments split anywhere): the read that completes it may hold only its content frames, no
    method of its channel.  Its session must still be told the read is done (and write the
    MESSAGE then), not only when the next method of its channel comes, which may be never."""
    connection, _transport = await open_shared()
    events = FlushingEvents()
    link = connection.new_link(events)  # type: ignore[arg-type]
    link.publish("", "q", MessageProperties(), b"hi")  # opens the channel
    link.flush()
    connection.socket.data_received(broker((commands.Channel.OpenOk(), link.channel)))
    connection.socket.data_received(broker(deliver(link.channel, 1, b"")[0]))  # the method alone
    connection.socket.data_received(
        broker((header.ContentHeader(0, 6, commands.Basic.Properties()), link.channel))
    )
    connection.socket.data_received(broker((body.ContentBody(b"one "), link.channel)))
    assert events.written == []  # not complete yet
    connection.socket.data_received(broker((body.ContentBody(b"go"), link.channel)))
    assert events.written == [b"one go"]
    # a delivery with an empty body is completed by its content header
    method, content_header, _ = deliver(link.channel, 2, b"")
    connection.socket.data_received(broker(method))
    connection.socket.data_received(broker(content_header))
    assert events.written == [b"one go", b""]


async def test_a_channel_error_ends_only_its_session() -> None:
    connection, transport, (victim, neighbour), (victim_events, neighbour_events) = await two_sessions()
    call = asyncio.ensure_future(victim.execute(BasicQos(prefetch_count=1)))
    await asyncio.sleep(0)
    victim.flush()
    transport.take_frames()
    close = commands.Channel.Close(
        reply_code=404, reply_text="NOT_FOUND - no queue", class_id=50, method_id=10
    )
    connection.socket.data_received(broker((close, victim.channel)))
    with pytest.raises(AmqpError) as info:
        await call
    assert info.value.code == 404 and info.value.channel_only
    assert [e.code for e in victim_events.closed] == [404] and neighbour_events.closed == []
    ((channel, close_ok),) = transport.take_frames()
    assert channel == victim.channel and isinstance(close_ok, commands.Channel.CloseOk)
    # a frame the session still writes on the closed channel would end the connection (504):
    # it is dropped
    victim.publish("", "q", MessageProperties(), b"late")
    victim.flush()
    assert transport.take_frames() == []
    neighbour.publish("", "q", MessageProperties(), b"on")
    neighbour.flush()
    assert [channel for channel, _ in transport.take_frames()] == [neighbour.channel] * 3
    connection.socket.data_received(broker(*deliver(neighbour.channel, 1, b"still served")))
    assert [d.body for d in neighbour_events.deliveries] == [b"still served"]


async def test_a_connection_close_reaches_every_session_with_the_same_error() -> None:
    connection, _transport, links, events = await two_sessions()
    close = commands.Connection.Close(
        reply_code=320, reply_text="CONNECTION_FORCED - closed via management plugin", class_id=0, method_id=0
    )
    connection.socket.data_received(broker((close, 0)))
    for link, seen in zip(links, events, strict=True):
        ((error,),) = (seen.closed,)
        assert error.code == 320 and not error.channel_only and error.name == "connection_forced"
        assert not link.is_open
    assert connection.links == {}


async def test_a_lost_socket_reaches_every_session() -> None:
    connection, _transport, _links, events = await two_sessions()
    connection.socket.connection_lost(ConnectionResetError("reset"))
    assert all(len(seen.closed) == 1 and seen.closed[0].code == 0 for seen in events)


async def test_connection_blocked_pauses_every_session() -> None:
    connection, _transport, _links, events = await two_sessions()
    connection.socket.data_received(broker((commands.Connection.Blocked(reason="low on memory"), 0)))
    assert all(seen.backpressure == [True] for seen in events)
    connection.socket.data_received(broker((commands.Connection.Unblocked(), 0)))
    assert all(seen.backpressure == [True, False] for seen in events)


async def test_a_slow_client_never_pauses_the_shared_socket_and_is_bounded() -> None:
    connection, transport, (slow, neighbour), (slow_events, neighbour_events) = await two_sessions()
    # a delivery is charged its body, its properties and a frame's overhead (~350 bytes here)
    connection.paused_bytes = PausedBytes(limit=500, budget=10_000)
    slow.paused_bytes = connection.paused_bytes
    slow.pause_reading()
    assert transport.reading  # the neighbours' deliveries go on being read
    connection.socket.data_received(broker(*deliver(slow.channel, 1, b"x" * 200)))
    assert len(slow_events.deliveries) == 1 and slow_events.closed == []
    connection.socket.data_received(
        broker(*deliver(slow.channel, 2, b"x" * 200), *deliver(neighbour.channel, 1, b"n"))
    )
    assert len(slow_events.deliveries) == 1  # not delivered: requeued when the channel closes
    ((error,),) = (slow_events.closed,)
    assert error.channel_only and "adapter.amqp_shared_max_paused_bytes" in error.text
    assert [type(value) for _, value in transport.take_frames()] == [commands.Channel.Close]
    assert [d.body for d in neighbour_events.deliveries] == [b"n"]
    assert connection.paused_bytes.pool.used == 0  # given back


async def test_paused_bytes_are_given_back_when_the_client_reads_again() -> None:
    connection, _transport, (slow, _), (slow_events, _) = await two_sessions()
    connection.paused_bytes = PausedBytes(limit=500, budget=10_000)
    slow.pause_reading()
    connection.socket.data_received(broker(*deliver(slow.channel, 1, b"x" * 200)))
    assert 200 < connection.paused_bytes.pool.used < 500  # the body, the properties, the frame
    slow.resume_reading()
    assert connection.paused_bytes.pool.used == 0
    connection.socket.data_received(broker(*deliver(slow.channel, 2, b"x" * 200)))
    assert len(slow_events.deliveries) == 2 and slow_events.closed == []


async def test_closing_a_session_closes_its_channel_and_frees_the_number_at_close_ok() -> None:
    connection, transport, (leaving, staying), _events = await two_sessions()
    left: list[ChannelLink] = []
    leaving.on_left = left.append
    closing = asyncio.ensure_future(leaving.close())
    await asyncio.sleep(0)
    leaving.flush()
    ((channel, close),) = transport.take_frames()
    assert channel == leaving.channel and isinstance(close, commands.Channel.Close)
    connection.socket.data_received(broker((commands.Channel.CloseOk(), channel)))
    await closing
    assert left == [leaving] and not leaving.is_open and staying.is_open
    assert channel not in connection.links


async def test_an_unused_channel_closes_without_a_frame() -> None:
    connection, transport = await open_shared()
    link = connection.new_link(Events())  # type: ignore[arg-type]
    left: list[ChannelLink] = []
    link.on_left = left.append
    await link.close()
    assert transport.take_frames() == [] and left == [link] and connection.links == {}


async def test_frames_in_flight_for_a_closing_channel_are_dropped_until_its_close_ok() -> None:
    connection, transport, (leaving, _), (leaving_events, _) = await two_sessions()
    number = leaving.channel
    leaving.close_nowait()
    transport.take_frames()
    connection.socket.data_received(broker(*deliver(number, 5, b"late")))
    assert leaving_events.deliveries == []
    assert number in connection._closing_channels  # not handed out meanwhile
    connection.socket.data_received(broker((commands.Channel.CloseOk(), number)))
    assert number not in connection._closing_channels


async def test_no_more_sessions_than_channel_numbers() -> None:
    connection, _transport = await open_shared(channel_max=2)
    connection.new_link(Events())  # type: ignore[arg-type]
    connection.new_link(Events())  # type: ignore[arg-type]
    with pytest.raises(AmqpError):
        connection.new_link(Events())  # type: ignore[arg-type]


async def test_queues_left_to_delete_go_on_a_new_channel_number_after_a_channel_error() -> None:
    connection, transport, (victim, neighbour), _events = await two_sessions()
    old = victim.channel
    close = commands.Channel.Close(reply_code=404, reply_text="NOT_FOUND", class_id=50, method_id=20)
    connection.socket.data_received(broker((close, old)))
    transport.take_frames()
    deleting = asyncio.ensure_future(victim.delete_queue_on_fresh_channel("sub-q"))
    await asyncio.sleep(0)
    victim.flush()
    ((number, opened),) = transport.take_frames()
    assert number not in (old, neighbour.channel) and isinstance(opened, commands.Channel.Open)
    connection.socket.data_received(broker((commands.Channel.OpenOk(), number)))
    await asyncio.sleep(0)
    victim.flush()
    ((_, delete),) = transport.take_frames()
    assert isinstance(delete, commands.Queue.Delete) and delete.queue == "sub-q"
    connection.socket.data_received(broker((commands.Queue.DeleteOk(message_count=0), number)))
    await deleting
    assert neighbour.is_open and connection.links[neighbour.channel] is neighbour


async def test_queues_left_to_delete_use_the_sessions_own_channel_while_it_is_open() -> None:
    connection, transport, (leaving, _), _events = await two_sessions()
    deleting = asyncio.ensure_future(leaving.delete_queue_on_fresh_channel("sub-q"))
    await asyncio.sleep(0)
    leaving.flush()
    ((number, delete),) = transport.take_frames()
    assert number == leaving.channel and isinstance(delete, commands.Queue.Delete)
    connection.socket.data_received(broker((commands.Queue.DeleteOk(message_count=0), number)))
    await deleting


async def test_a_close_ok_that_does_not_come_in_time_keeps_the_number_until_it_does() -> None:
    connection, transport, (leaving, _), _events = await two_sessions()
    left: list[ChannelLink] = []
    leaving.on_left = left.append
    number = leaving.channel
    await leaving.close(timeout=0.01)
    assert left == [leaving] and number in connection._closing_channels
    closes = [value for _, value in transport.take_frames() if isinstance(value, commands.Channel.Close)]
    assert len(closes) == 1  # sent once
    connection.socket.data_received(broker((commands.Channel.CloseOk(), number)))
    assert number not in connection._closing_channels


def _nested_headers(depth: int) -> dict[str, Any]:
    nested: dict[str, Any] = {"leaf": "x"}
    for _ in range(depth):
        nested = {"n": nested}
    return {"deep": nested}


async def test_an_undecodable_delivery_ends_only_its_channel() -> None:
    """A delivery the adapter cannot decode (a table nested deeper than it reads) closes the
    channel it came on, with the session's ERROR frame_error, as it would close a connection of
    the session's own; the connection and a neighbour's delivery in the same read go on."""
    connection, transport, (victim, neighbour), (victim_events, neighbour_events) = await two_sessions()
    poisoned = [
        (
            commands.Basic.Deliver(consumer_tag="T_1", delivery_tag=1, exchange="", routing_key="q"),
            victim.channel,
        ),
        (header.ContentHeader(0, 1, commands.Basic.Properties(headers=_nested_headers(120))), victim.channel),
        (body.ContentBody(b"p"), victim.channel),
    ]
    connection.socket.data_received(broker(*poisoned, *deliver(neighbour.channel, 1, b"n")))
    ((error,),) = (victim_events.closed,)
    assert error.channel_only and error.code == 501 and "nested" in error.text
    assert victim_events.deliveries == []
    assert [(channel, type(value)) for channel, value in transport.take_frames()] == [
        (victim.channel, commands.Channel.Close)
    ]
    assert [d.body for d in neighbour_events.deliveries] == [b"n"] and neighbour_events.closed == []
    assert neighbour.is_open and not connection.socket.core.close_sent


async def test_a_channel_closed_without_waiting_keeps_its_number_until_its_close_ok() -> None:
    """A channel the link closed on its own (refused input, a slow client past its bound) is
    given back when the session leaves, but its number waits for the close-ok: a new session on
    it before then would open a channel the broker still has (504, a connection error)."""
    connection, transport, (victim, _), _events = await two_sessions()
    number = victim.channel
    bad = [
        (commands.Basic.Deliver(consumer_tag="T_1", delivery_tag=1, exchange="", routing_key="q"), number),
        (header.ContentHeader(0, 1, commands.Basic.Properties(headers=_nested_headers(120))), number),
    ]
    connection.socket.data_received(broker(*bad))
    transport.take_frames()
    await victim.close()
    assert number not in connection.links and number in connection._closing_channels
    connection.socket.data_received(broker((commands.Channel.CloseOk(), number)))
    assert number not in connection._closing_channels


async def test_a_slow_client_is_bounded_by_what_it_is_delivered_not_only_by_bodies() -> None:
    """Deliveries with empty bodies (the headers being the message) still cost the client's
    buffer a frame each: a client that does not read is cut off for them as for large bodies,
    never buffering without end."""
    connection, transport, (slow, neighbour), (slow_events, neighbour_events) = await two_sessions()
    connection.paused_bytes = PausedBytes(limit=10_000, budget=1_000_000)
    slow.pause_reading()
    headers = {"h": "v" * 200}
    for tag in range(1, 1001):
        frames = [
            (
                commands.Basic.Deliver(consumer_tag="T_1", delivery_tag=tag, exchange="", routing_key="q"),
                slow.channel,
            ),
            (header.ContentHeader(0, 0, commands.Basic.Properties(headers=headers)), slow.channel),
        ]
        connection.socket.data_received(broker(*frames))
        if slow_events.closed:
            break
    ((error,),) = (slow_events.closed,)
    assert error.channel_only and "adapter.amqp_shared_max_paused_bytes" in error.text
    assert len(slow_events.deliveries) < 100
    assert neighbour.is_open and neighbour_events.closed == []


async def test_queue_arguments_over_frame_max_are_refused_before_anything_is_written() -> None:
    """queue.declare's (and basic.consume's, queue.bind's) arguments come from SUBSCRIBE
    headers; a method frame over frame_max would be a connection error (501) ending every
    session on the shared connection, so it is the session's own Processing error instead."""
    from adapter.mapping.destinations import ProcessingError
    from adapter.mapping.operations import BasicConsume, QueueDeclare

    connection, transport, (hostile, neighbour), (_, neighbour_events) = await two_sessions()
    big = {"x-dead-letter-exchange": "e" * 70_000, "x-dead-letter-routing-key": "k" * 70_000}
    with pytest.raises(ProcessingError, match="frame_max"):
        hostile.declare_nowait(QueueDeclare("q", arguments=big))
    with pytest.raises(ProcessingError, match="frame_max"):
        await hostile.execute(QueueDeclare("q", arguments=big))
    with pytest.raises(ProcessingError, match="frame_max"):
        await hostile.execute(BasicConsume("q", "T_1", no_ack=True, arguments=big))
    hostile.flush()
    sent = [type(value) for _, value in transport.take_frames()]
    assert commands.Queue.Declare not in sent and commands.Basic.Consume not in sent, sent
    assert neighbour.is_open and neighbour_events.closed == []


async def test_a_full_paused_budget_ends_the_heaviest_user_s_session_not_the_one_delivered_to() -> None:
    """Issue 33 item 3: one user's idle sessions, each just under its own bound, filled the
    process's pool, and another user's briefly slow session was the one ended when its next
    delivery crossed it.  Now the user holding the most gives up its largest session."""
    bounds = PausedBytes(limit=1000, budget=2000)
    idle_connection, _, idle_links, idle_events = await two_sessions()
    slow_connection, slow_transport, (slow, _), (slow_events, _) = await two_sessions()
    slow_connection.socket.core.login_as("bob", "", "/")
    for connection in (idle_connection, slow_connection):
        connection.paused_bytes = bounds
    for link in (*idle_links, slow):
        link.pause_reading()
    for link in idle_links:  # alice's two idle sessions: ~900 bytes each
        idle_connection.socket.data_received(broker(*deliver(link.channel, 1, b"i" * 700)))
    assert all(len(e.deliveries) == 1 and e.closed == [] for e in idle_events)
    slow_connection.socket.data_received(broker(*deliver(slow.channel, 1, b"s" * 200)))
    assert len(slow_events.deliveries) == 1 and slow_events.closed == []  # bob's is delivered
    closed = [e.closed for e in idle_events if e.closed]
    assert len(closed) == 1  # one of alice's ends, with the process bound named
    ((error,),) = closed
    assert error.channel_only and "adapter.amqp_shared_paused_bytes_budget" in error.text
    assert bounds.pool.used <= bounds.pool.limit
