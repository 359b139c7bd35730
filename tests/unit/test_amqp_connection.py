"""adapter/amqp/connection.py without a socket or a broker: an in-memory transport records what
the AmqpConnection writes, the "broker" is frames built by pamqp (an independent AMQP
implementation), and what the connection writes is read back with pamqp too.  Covers the
handshake, publishing, deliveries fed whole and byte by byte, confirms, broker closes, server
cancels, flow control and undecodable input."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pamqp import body, commands, frame, header, heartbeat

from adapter.amqp.connection import AmqpConnection, AmqpError
from adapter.mapping.destinations import ProcessingError
from adapter.mapping.operations import BasicConsume, BasicQos, Delivery
from adapter.mapping.properties import MessageProperties
from tests import support


class MemoryTransport(support.MemoryTransport):
    """The shared in-memory socket, reading back what was written as AMQP frames."""

    def take_frames(self) -> list[tuple[int, Any]]:
        """Every frame written since the last call, decoded by pamqp (protocol header skipped)."""
        data = bytes(self.written)
        self.written.clear()
        if data.startswith(b"AMQP"):
            data = data[8:]
        frames = []
        while data:
            consumed, channel, value = frame.unmarshal(data)
            frames.append((channel, value))
            data = data[consumed:]
        return frames


class Events:
    """BrokerEvents that records what the connection reports."""

    def __init__(self) -> None:
        self.deliveries: list[Delivery] = []
        self.confirms: list[tuple[int, bool, bool]] = []
        self.cancels: list[str] = []
        self.returns: list[tuple[int, str, str, str]] = []
        self.closed: list[AmqpError] = []
        self.backpressure: list[bool] = []
        self.reads = 0

    def on_deliver(self, delivery: Delivery) -> None:
        self.deliveries.append(delivery)

    def on_confirm(self, delivery_tag: int, multiple: bool, ack: bool) -> None:
        self.confirms.append((delivery_tag, multiple, ack))

    def on_server_cancel(self, consumer_tag: str) -> None:
        self.cancels.append(consumer_tag)

    def on_return(self, code: int, text: str, exchange: str, routing_key: str) -> None:
        self.returns.append((code, text, exchange, routing_key))

    def on_amqp_closed(self, error: AmqpError) -> None:
        self.closed.append(error)

    def on_broker_backpressure(self, paused: bool) -> None:
        self.backpressure.append(paused)

    def on_read_done(self) -> None:
        self.reads += 1


def broker(*frames: tuple[Any, int]) -> bytes:
    return b"".join(frame.marshal(value, channel) for value, channel in frames)


async def open_connection(
    heartbeat_seconds: int = 0, *, open_channel: bool = True
) -> tuple[AmqpConnection, MemoryTransport, Events]:
    """An AmqpConnection through the whole handshake, fed by pamqp's broker frames; with
    ``open_channel``, its channel opened too (as the first frame on it would open it)."""
    events = Events()
    connection = AmqpConnection(events, heartbeat=heartbeat_seconds, connection_name="STOMP 127.0.0.1:1")
    connection.socket.core.login_as("guest", "secret", "/vh")
    transport = MemoryTransport()
    connection.socket.connection_made(transport)  # type: ignore[arg-type]
    assert bytes(transport.written) == b"AMQP\x00\x00\x09\x01"
    connection.socket.data_received(
        broker((commands.Connection.Start(server_properties={"product": "RabbitMQ", "version": "3.10.8"}), 0))
    )
    (_, start_ok), *_ = transport.take_frames()
    assert isinstance(start_ok, commands.Connection.StartOk)
    assert start_ok.mechanism == "PLAIN" and start_ok.response == "\0guest\0secret"
    assert start_ok.client_properties["connection_name"] == "STOMP 127.0.0.1:1"
    connection.socket.data_received(
        broker((commands.Connection.Tune(channel_max=0, frame_max=131072, heartbeat=60), 0))
    )
    # tune-ok and connection.open go together, without waiting for open-ok; no channel yet
    (_, tune_ok), (_, open_vhost) = transport.take_frames()
    assert isinstance(tune_ok, commands.Connection.TuneOk) and tune_ok.heartbeat == heartbeat_seconds
    assert isinstance(open_vhost, commands.Connection.Open) and open_vhost.virtual_host == "/vh"
    assert not connection.socket._handshake.done()
    connection.socket.data_received(broker((commands.Connection.OpenOk(), 0)))
    assert connection.socket._handshake.done() and connection.is_open
    connection.socket.opened = True  # as open() does when it hands the link to the session
    assert transport.take_frames() == []
    assert connection.server_properties["product"] == "RabbitMQ"
    if open_channel:
        connection._core.open()
        connection.flush()
        ((channel, channel_open),) = transport.take_frames()
        assert channel == 1 and isinstance(channel_open, commands.Channel.Open)
        connection.socket.data_received(broker((commands.Channel.OpenOk(), 1)))
    return connection, transport, events


async def test_handshake() -> None:
    connection, _transport, events = await open_connection()
    assert events.closed == []
    assert connection.socket.core.frame_max == 131072


async def test_refused_login_is_an_auth_error() -> None:
    events = Events()
    connection = AmqpConnection(events, heartbeat=0, connection_name="x")
    transport = MemoryTransport()
    connection.socket.connection_made(transport)  # type: ignore[arg-type]
    connection.socket.data_received(broker((commands.Connection.Start(), 0)))
    connection.socket.data_received(
        broker(
            (
                commands.Connection.Close(
                    reply_code=403, reply_text="ACCESS_REFUSED - Login was refused", class_id=0, method_id=0
                ),
                0,
            )
        )
    )
    with pytest.raises(AmqpError) as info:
        await connection.socket._handshake
    assert info.value.code == 403 and info.value.phase == "auth"
    assert any(isinstance(value, commands.Connection.CloseOk) for _, value in transport.take_frames())


def handshake_until(step: str) -> tuple[AmqpConnection, Events]:
    """A connection part-way through its handshake: after the protocol header ("connect"),
    start-ok ("auth") or tune-ok and open ("vhost")."""
    events = Events()
    connection = AmqpConnection(events, heartbeat=0, connection_name="x")
    connection.socket.connection_made(MemoryTransport())  # type: ignore[arg-type]
    if step in ("auth", "vhost"):
        connection.socket.data_received(broker((commands.Connection.Start(), 0)))
    if step == "vhost":
        connection.socket.data_received(
            broker((commands.Connection.Tune(channel_max=0, frame_max=131072), 0))
        )
    return connection, events


@pytest.mark.parametrize("step", ["connect", "vhost"])
async def test_a_node_that_drops_mid_handshake_is_a_node_failure(step: str) -> None:
    """A close before connection.start, or once connection.open is sent, is the node going
    away (RabbitMQ refuses a vhost with connection.close): an OSError, so the login tries the
    next node, not a refused login."""
    connection, events = handshake_until(step)
    connection.socket.connection_lost(None)
    with pytest.raises(ConnectionResetError, match="the node closed the connection"):
        await connection.socket._handshake
    assert events.closed == []


async def test_a_drop_right_after_start_ok_stays_a_refused_login() -> None:
    """Brokers without authentication_failure_close refuse a password by closing."""
    connection, _events = handshake_until("auth")
    connection.socket.connection_lost(None)
    with pytest.raises(AmqpError) as info:
        await connection.socket._handshake
    assert info.value.code == 0 and info.value.phase == "auth"


async def test_connection_forced_during_the_handshake_is_a_node_failure() -> None:
    connection, _events = handshake_until("vhost")
    connection.socket.data_received(
        broker(
            (
                commands.Connection.Close(
                    reply_code=320, reply_text="CONNECTION_FORCED - shutdown", class_id=0, method_id=0
                ),
                0,
            )
        )
    )
    with pytest.raises(ConnectionResetError, match="shutdown"):
        await connection.socket._handshake


async def test_a_link_never_handed_over_reports_nothing_later() -> None:
    """open() gave up on this link (say, its timeout fired in the iteration open-ok arrived):
    its late close must not reach a session that has logged in elsewhere since."""
    connection, events = handshake_until("vhost")
    connection.socket.data_received(broker((commands.Connection.OpenOk(), 0)))
    assert connection.socket._handshake.done()
    connection.socket.connection_lost(ConnectionResetError("gone"))
    assert events.closed == []


async def test_the_channel_is_opened_by_the_first_frame_on_it() -> None:
    """channel.open goes out in the same write as the first frame on the channel, once; its
    open-ok, which nobody waits for, is taken quietly, and a call after it gets its own reply."""
    connection, transport, events = await open_connection(open_channel=False)
    connection.flush()
    assert transport.take_frames() == []  # a login alone opens no channel
    connection.publish("", "q", MessageProperties(), b"one")
    connection.publish("", "q", MessageProperties(), b"two")
    connection.flush()
    frames = transport.take_frames()
    assert [type(value) for _, value in frames] == [
        commands.Channel.Open,
        commands.Basic.Publish,
        header.ContentHeader,
        body.ContentBody,
        commands.Basic.Publish,
        header.ContentHeader,
        body.ContentBody,
    ]
    assert {channel for channel, _ in frames} == {1}
    call = asyncio.ensure_future(connection.execute(BasicQos(prefetch_count=5)))
    await asyncio.sleep(0)
    connection.flush()
    ((_, qos),) = transport.take_frames()  # no second channel.open
    assert isinstance(qos, commands.Basic.Qos)
    connection.socket.data_received(broker((commands.Channel.OpenOk(), 1)))
    assert not call.done()  # the lazy open's reply does not end the call
    connection.socket.data_received(broker((commands.Basic.QosOk(), 1)))
    assert await call is None
    assert events.closed == []


async def test_a_first_call_goes_out_behind_channel_open() -> None:
    connection, transport, _events = await open_connection(open_channel=False)
    call = asyncio.ensure_future(connection.execute(BasicQos(prefetch_count=7)))
    await asyncio.sleep(0)
    connection.flush()
    (channel_open, (_, qos)) = transport.take_frames()
    assert channel_open[0] == 1 and isinstance(channel_open[1], commands.Channel.Open)
    assert isinstance(qos, commands.Basic.Qos) and qos.prefetch_count == 7
    connection.socket.data_received(broker((commands.Channel.OpenOk(), 1), (commands.Basic.QosOk(), 1)))
    assert await call is None


async def test_recycling_an_unused_channel_writes_nothing() -> None:
    connection, transport, _events = await open_connection(open_channel=False)
    await connection.recycle_channel()
    connection.flush()
    assert transport.take_frames() == [] and connection.channel == 1


async def test_recycling_a_used_channel_closes_it_and_the_next_opens_lazily() -> None:
    connection, transport, _events = await open_connection(open_channel=False)
    connection.socket.core.channel_max = 65535  # as a reusable connection negotiates it
    connection.publish("", "q", MessageProperties(), b"x")
    connection.flush()
    transport.take_frames()
    connection.socket.data_received(broker((commands.Channel.OpenOk(), 1)))
    recycle = asyncio.ensure_future(connection.recycle_channel())
    await asyncio.sleep(0)
    connection.flush()
    ((channel, close),) = transport.take_frames()
    assert channel == 1 and isinstance(close, commands.Channel.Close)
    connection.socket.data_received(broker((commands.Channel.CloseOk(), 1)))
    await recycle
    assert connection.channel == 2
    connection.publish("", "q", MessageProperties(), b"y")
    connection.flush()
    frames = transport.take_frames()
    assert isinstance(frames[0][1], commands.Channel.Open) and {channel for channel, _ in frames} == {2}


async def test_no_password_is_kept_once_the_connection_is_open() -> None:
    """A pooled connection outlives its login (adapter.amqp_connection_reuse): once open-ok has
    come, no attribute holds the password; pooled reuse checks a keyed digest instead, and a
    recycled channel opens without credentials."""
    connection, transport, _events = await open_connection(open_channel=False)
    held = [name for name, value in vars(connection).items() if "secret" in repr(value)]
    assert held == []
    connection.socket.core.channel_max = 65535
    connection.publish("", "q", MessageProperties(), b"x")
    connection.flush()
    transport.take_frames()
    connection.socket.data_received(broker((commands.Channel.OpenOk(), 1)))
    recycle = asyncio.ensure_future(connection.recycle_channel())
    await asyncio.sleep(0)
    connection.flush()
    transport.take_frames()
    connection.socket.data_received(broker((commands.Channel.CloseOk(), 1)))
    await recycle
    connection.publish("", "q", MessageProperties(), b"y")
    connection.flush()
    assert isinstance(transport.take_frames()[0][1], commands.Channel.Open)


async def test_publish_writes_method_header_and_body_frames_on_flush() -> None:
    connection, transport, _events = await open_connection()
    properties = MessageProperties(content_type="text/plain", delivery_mode=2, headers={"k": "v"})
    connection.publish("amq.topic", "a.b", properties, b"hello")
    assert transport.written == b""  # buffered until the flush at the end of the read
    connection.flush()
    (_, method), (_, content), (_, payload) = transport.take_frames()
    assert isinstance(method, commands.Basic.Publish)
    assert (method.exchange, method.routing_key) == ("amq.topic", "a.b")
    assert isinstance(content, header.ContentHeader) and content.body_size == 5
    assert content.properties.content_type == "text/plain" and content.properties.delivery_mode == 2
    assert content.properties.headers == {"k": "v"}
    assert isinstance(payload, body.ContentBody) and payload.value == b"hello"


async def test_large_body_is_split_at_frame_max() -> None:
    connection, transport, _events = await open_connection()
    data = bytes(range(256)) * 1200  # 307,200 bytes: three body frames at frame_max 131072
    connection.publish("", "q", MessageProperties(), data)
    connection.flush()
    frames = transport.take_frames()
    bodies = [value.value for _, value in frames if isinstance(value, body.ContentBody)]
    assert len(bodies) == 3 and b"".join(bodies) == data


def _delivery_frames(tag: int, data: bytes) -> bytes:
    properties = commands.Basic.Properties(content_type="application/json", priority=3, headers={"x": 1})
    return broker(
        (
            commands.Basic.Deliver(
                consumer_tag="T_1", delivery_tag=tag, redelivered=tag == 2, exchange="", routing_key="q"
            ),
            1,
        ),
        (header.ContentHeader(0, len(data), properties), 1),
        (body.ContentBody(data), 1),
    )


async def test_deliveries_whole_and_byte_by_byte() -> None:
    connection, _transport, events = await open_connection()
    connection.socket.data_received(_delivery_frames(1, b'{"a":1}'))
    for byte in _delivery_frames(2, b"second"):
        connection.socket.data_received(bytes((byte,)))
    first, second = events.deliveries
    assert first.consumer_tag == "T_1" and first.delivery_tag == 1 and not first.redelivered
    assert first.body == b'{"a":1}' and first.properties.content_type == "application/json"
    assert first.properties.priority == 3 and first.properties.headers == {"x": 1}
    assert second.delivery_tag == 2 and second.redelivered and second.body == b"second"


async def test_confirms_and_server_cancel() -> None:
    connection, transport, events = await open_connection()
    connection.socket.data_received(
        broker(
            (commands.Basic.Ack(delivery_tag=3, multiple=True), 1),
            (commands.Basic.Nack(delivery_tag=4, multiple=False), 1),
            (commands.Basic.Cancel(consumer_tag="T_2"), 1),
        )
    )
    assert events.confirms == [(3, True, True), (4, False, False)]
    assert events.cancels == ["T_2"]
    ((_, cancel_ok),) = transport.take_frames()
    assert isinstance(cancel_ok, commands.Basic.CancelOk) and cancel_ok.consumer_tag == "T_2"


async def test_a_return_goes_to_the_session_before_the_confirm_that_follows_it() -> None:
    connection, transport, events = await open_connection()
    connection.publish_mandatory("", "gone", MessageProperties(delivery_mode=2), b"copy")
    connection.flush()
    (_, publish), _header, _body = transport.take_frames()
    assert isinstance(publish, commands.Basic.Publish) and publish.mandatory
    connection.socket.data_received(
        broker(
            (commands.Basic.Return(312, "NO_ROUTE", "", "gone"), 1),
            (header.ContentHeader(0, 4, commands.Basic.Properties()), 1),
            (body.ContentBody(b"copy"), 1),
            (commands.Basic.Ack(delivery_tag=1), 1),
        )
    )
    assert events.returns == [(312, "NO_ROUTE", "", "gone")]
    assert events.confirms == [(1, False, True)] and events.deliveries == []


async def test_synchronous_call_waits_for_its_reply() -> None:
    connection, transport, _events = await open_connection()
    call = asyncio.ensure_future(connection.execute(BasicQos(prefetch_count=10)))
    await asyncio.sleep(0)
    connection.flush()
    ((_, qos),) = transport.take_frames()
    assert isinstance(qos, commands.Basic.Qos) and qos.prefetch_count == 10
    assert not call.done()
    connection.socket.data_received(broker((commands.Basic.QosOk(), 1)))
    assert await call is None


async def test_channel_close_fails_the_waiting_call_and_is_answered() -> None:
    connection, transport, events = await open_connection()
    call = asyncio.ensure_future(connection.execute(BasicQos(prefetch_count=1)))
    await asyncio.sleep(0)
    transport.take_frames()
    connection.socket.data_received(
        broker(
            (
                commands.Channel.Close(
                    reply_code=406, reply_text="PRECONDITION_FAILED - no", class_id=60, method_id=10
                ),
                1,
            )
        )
    )
    with pytest.raises(AmqpError) as info:
        await call
    assert info.value.code == 406 and info.value.channel_only
    assert events.closed and events.closed[0].name == "precondition_failed"
    assert any(isinstance(value, commands.Channel.CloseOk) for _, value in transport.take_frames())


async def test_connection_close_from_the_broker() -> None:
    connection, transport, events = await open_connection()
    connection.socket.data_received(
        broker(
            (
                commands.Connection.Close(
                    reply_code=320, reply_text="CONNECTION_FORCED - shutdown", class_id=0, method_id=0
                ),
                0,
            )
        )
    )
    (error,) = events.closed
    assert error.code == 320 and not error.channel_only and "shutdown" in error.text
    assert any(isinstance(value, commands.Connection.CloseOk) for _, value in transport.take_frames())


async def test_blocked_and_heartbeats() -> None:
    connection, _transport, events = await open_connection()
    connection.socket.data_received(
        broker((commands.Connection.Blocked(reason="low on memory"), 0))
        + heartbeat.Heartbeat.marshal()
        + broker((commands.Connection.Unblocked(), 0))
    )
    assert events.backpressure == [True, False]
    assert events.closed == []


async def test_missed_heartbeats_drop_the_link_at_once() -> None:
    """Two heart-beat periods of silence: the session is told, and the socket is aborted, not
    closed (a close would wait to hand the buffered writes to a peer that no longer reads)."""
    connection, transport, events = await open_connection(heartbeat_seconds=1)
    # the half-period ticks, called instead of waited for: the first sees the handshake's reads
    for _ in range(4):
        connection.socket._heartbeat_tick()
    assert events.closed == [] and not transport.aborted
    connection.socket._heartbeat_tick()
    (error,) = events.closed
    assert "missed heart-beats" in error.text
    assert transport.aborted and not transport.closed


async def test_a_bad_frame_end_closes_with_501() -> None:
    connection, transport, events = await open_connection()
    bad = bytearray(broker((commands.Basic.Ack(delivery_tag=1), 1)))
    bad[-1] = 0x00  # the frame-end octet must be 0xCE
    connection.socket.data_received(bytes(bad))
    (error,) = events.closed
    assert error.code == 501
    closes = [value for _, value in transport.take_frames() if isinstance(value, commands.Connection.Close)]
    assert closes and closes[0].reply_code == 501
    assert events.confirms == []


async def test_recycling_resumes_reading_the_next_session_needs() -> None:
    """A slow client paused the broker's socket and wrote nothing on its channel: the recycled
    connection must read again, or the next session's first call never gets its reply (a
    review found it pooled still paused)."""
    connection, transport, _events = await open_connection(open_channel=False)
    connection.socket.core.channel_max = 65535
    connection._reusable = True
    connection.pause_reading()
    assert not connection.reusable  # a paused connection is never handed out
    await connection.recycle_channel()
    assert transport.reading and connection.reusable
    call = asyncio.ensure_future(connection.execute(BasicQos(prefetch_count=1)))
    await asyncio.sleep(0)
    connection.flush()
    connection.socket.data_received(broker((commands.Channel.OpenOk(), 1), (commands.Basic.QosOk(), 1)))
    assert await call is None


async def test_open_ok_and_a_close_in_one_read_is_a_failed_node() -> None:
    """A node that opens the connection and closes it in the same breath (open-ok and
    CONNECTION_FORCED read together): open() must not hand over the dead link, so the login
    tries the next node.  The "broker" is a local server speaking pamqp's frames."""

    async def node(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readexactly(8)  # protocol header
        writer.write(broker((commands.Connection.Start(), 0)))
        await reader.read(4096)  # start-ok
        writer.write(broker((commands.Connection.Tune(channel_max=0, frame_max=131072), 0)))
        await reader.read(4096)  # tune-ok and open
        close = commands.Connection.Close(320, "CONNECTION_FORCED - shutdown", class_id=0, method_id=0)
        writer.write(broker((commands.Connection.OpenOk(), 0), (close, 0)))
        await reader.read(4096)
        writer.close()

    server = await asyncio.start_server(node, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    events = Events()
    try:
        with pytest.raises(ConnectionResetError, match="as it opened: CONNECTION_FORCED"):
            await AmqpConnection.open(
                events,
                host="127.0.0.1",
                port=port,
                user="guest",
                password="guest",
                vhost="/",
                heartbeat=0,
                timeout=5,
                connection_name="x",
            )
        assert events.closed == []
    finally:
        server.close()
        await server.wait_closed()


async def test_a_value_amqp_cannot_carry_is_a_processing_error_from_the_link() -> None:
    """The encoder's own EncodeError becomes the STOMP error in one place (errors.stomp_error):
    the shell answers it with ERROR "Processing error", and nothing is written."""
    connection, transport, events = await open_connection()
    with pytest.raises(ProcessingError, match="longer than 255 bytes"):
        connection.publish("", "k" * 256, MessageProperties(), b"x")
    with pytest.raises(ProcessingError, match="range of an AMQP long"):
        await connection.execute(BasicConsume("q", "T_0", False, {"x-priority": 2**63}))
    connection.flush()
    assert transport.take_frames() == [] and events.closed == []


async def test_a_connection_method_out_of_turn_is_refused_with_503() -> None:
    """The phase table: connection.tune after the handshake is the broker breaking the protocol;
    the link asks it to close with 503 (command_invalid) and the session is told once."""
    connection, transport, events = await open_connection()
    connection.socket.data_received(
        broker((commands.Connection.Tune(channel_max=0, frame_max=131072, heartbeat=0), 0))
    )
    (error,) = events.closed
    assert error.code == 503 and error.name == "command_invalid" and "connection.tune" in error.text
    closes = [value for _, value in transport.take_frames() if isinstance(value, commands.Connection.Close)]
    assert [close.reply_code for close in closes] == [503]
    assert not connection.is_open
