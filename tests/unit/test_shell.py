"""The asyncio shell (adapter/server/connection.py, websocket.py) with in-memory transports.

The first tests need no broker at all (bad frames, frames before CONNECT, a PROXY header,
incomplete frames, every broker node refusing, a WebSocket upgrade).  The rest log in on an
in-memory AMQP link (tests/unit/fake_amqp.py, handed out by BrokerLogin.opener) and run the
whole shell: the quick paths, receipts and confirms, broker calls in order, heart-beats,
timeouts, flow control, errors, the close and its linger, the interpreter table, the activemq
dispatcher.  Timers are never waited for: their callbacks are called directly.  Frames written
by the shell are read back with a plain split on NUL, not with the adapter's codec."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import logging
import typing
from typing import Any

import pytest

from adapter.amqp import wire
from adapter.amqp.connection import AmqpError
from adapter.cli import build_server
from adapter.config import load_settings
from adapter.mapping import operations as ops
from adapter.mapping.destinations import ProcessingError
from adapter.mapping.properties import MessageProperties
from adapter.server.connection import INTERPRETER, ClientConnection, Lifecycle
from adapter.server.context import ServerContext
from adapter.server.websocket import WebSocketConnection, WebStompSettings
from adapter.session import State
from adapter.stomp.output import MESSAGE_FRAMES
from tests.support import MemoryTransport
from tests.unit.fake_amqp import FakeAmqp, Opener

CONNECT = b"CONNECT\naccept-version:1.2\nhost:/\nlogin:guest\npasscode:guest\n\n\0"


def make_server(**settings: Any) -> ServerContext:
    """What a server hands its connections (its listeners are not started)."""
    # port 1 on loopback: nothing listens there, so every broker connection is refused at once
    overrides: dict[str, Any] = {"listeners": [], "amqp_url": "amqp://guest:guest@127.0.0.1:1/"}
    overrides.update(settings)
    return build_server(load_settings(None, overrides)).context


def connect_client(server: ServerContext, **kwargs: Any) -> tuple[ClientConnection, MemoryTransport]:
    client = ClientConnection(server, **kwargs)
    transport = MemoryTransport()
    client.connection_made(transport)  # type: ignore[arg-type]
    return client, transport


async def test_frame_before_connect_gets_error_and_half_close() -> None:
    server = make_server()
    client, transport = connect_client(server)
    client.data_received(b"SEND\ndestination:/queue/a\nreceipt:r1\n\nx\0")
    (error,) = transport.frames()
    assert error.startswith(b"ERROR\n") and b"receipt-id:r1\n" in error
    assert transport.eof_written  # half-close: the client reads the ERROR, then EOF
    assert client.closed
    client.connection_lost(None)
    await asyncio.wait_for(client.done, 1)
    assert client not in server.connections


async def test_bad_frame_gets_error() -> None:
    server = make_server()
    client, transport = connect_client(server)
    client.data_received(b"CONNECT\nno colon here\n\n\0")
    (error,) = transport.frames()
    assert error.startswith(b"ERROR\nmessage:") and client.closed


async def test_connect_with_every_node_refusing() -> None:
    server = make_server(amqp_url="amqp://guest:guest@127.0.0.1:1/,amqp://guest:guest@127.0.0.1:2/")
    client, transport = connect_client(server)
    client.data_received(CONNECT)
    for _ in range(200):
        if transport.frames():
            break
        await asyncio.sleep(0.01)
    (error,) = transport.frames()
    assert b"message:Bad CONNECT" in error or b"unreachable" in error, error
    assert b"The broker is unreachable" in error
    assert client.closed


async def test_proxy_header_gives_the_peer_and_loopback_rule() -> None:
    server = make_server(proxy_protocol=True)
    client, transport = connect_client(server)
    client.data_received(b"PROXY TCP4 203.0.113.7 127.0.0.1 5000 61613\r\n")
    assert client.peer == "203.0.113.7:5000"
    client.data_received(CONNECT)  # guest from a non-loopback address: refused before any broker call
    (error,) = transport.frames()
    assert b"non-loopback access denied" in error


async def test_invalid_proxy_header_aborts_without_a_frame() -> None:
    server = make_server(proxy_protocol=True)
    client, transport = connect_client(server)
    client.data_received(CONNECT)
    assert transport.aborted and transport.frames() == []


async def test_incomplete_frames_count_against_the_budget_until_complete() -> None:
    server = make_server(incomplete_frames_budget=1000)
    client, _transport = connect_client(server)
    client.data_received(b"CONNECT\naccept-version:1.2\n")
    assert server.incomplete_input == len(b"CONNECT\naccept-version:1.2\n")
    other, other_transport = connect_client(server)
    other.data_received(b"CONNECT\n" + b"x" * 2000)  # over the shared budget: that one is closed
    assert other.closed and b"Too much incomplete input" in other_transport.frames()[0]
    assert not client.closed
    client.connection_lost(None)
    assert server.incomplete_input == 0


class RawSocket(MemoryTransport):
    """The socket under a WebSocket: no half-close."""

    def can_write_eof(self) -> bool:
        return False


def client_message(payload: bytes) -> bytes:
    """A masked client text frame with a zero key (RFC 6455 5.2)."""
    length = (
        bytes((0x80 | len(payload),))
        if len(payload) < 126
        else bytes((0x80 | 126,)) + len(payload).to_bytes(2, "big")
    )
    return b"\x81" + length + b"\0\0\0\0" + payload


async def test_websocket_upgrade_carries_the_same_session() -> None:
    server = make_server()
    socket = WebSocketConnection(server, WebStompSettings(compress=False), tls=False)
    raw = RawSocket()
    socket.connection_made(raw)  # type: ignore[arg-type]
    key = base64.b64encode(b"0123456789abcdef").decode()
    socket.data_received(
        (
            "GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
            "Sec-WebSocket-Protocol: v10.stomp, v12.stomp\r\n\r\n"
        ).encode()
    )
    head, _, rest = bytes(raw.written).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 101") and b"sec-websocket-protocol: v12.stomp" in head.lower()
    assert rest == b""
    raw.written.clear()
    # a frame before CONNECT: the session's ERROR, as one text message, then Close 1000
    socket.data_received(client_message(b"SEND\ndestination:/queue/a\n\nx\0"))
    data = bytes(raw.written)
    assert data[0] == 0x81  # FIN + text
    length, start = data[1], 2
    if length == 126:
        length, start = int.from_bytes(data[2:4], "big"), 4
    message = data[start : start + length]
    assert message.startswith(b"ERROR\n") and message.endswith(b"\0\n")
    close = data[start + length :]
    assert close[0] == 0x88 and close[2:4] == (1000).to_bytes(2, "big") and close[4:] == b"STOMP died"


async def test_plain_get_on_the_websocket_path_gets_426() -> None:
    server = make_server()
    socket = WebSocketConnection(server, WebStompSettings(), tls=False)
    raw = RawSocket()
    socket.connection_made(raw)  # type: ignore[arg-type]
    socket.data_received(b"GET /ws HTTP/1.1\r\nHost: x\r\n\r\n")
    assert bytes(raw.written).startswith(b"HTTP/1.1 426 ") and raw.closed


# ---------------------------------------------------------------------- with an in-memory AMQP link
# BrokerLogin's opener (the LinkGlue's login) is replaced by one that hands out FakeAmqp
# links (tests/unit/fake_amqp.py), so these tests run the whole shell (pump, interpreter, login,
# heart-beats, close) with no broker.


async def settle(rounds: int = 20) -> None:
    """Let the tasks the shell spawned (broker calls) run to their next wait."""
    for _ in range(rounds):
        await asyncio.sleep(0)


async def logged_in(
    server: ServerContext | None = None, heart_beat: str = "0,0", **kwargs: Any
) -> tuple[ClientConnection, MemoryTransport, FakeAmqp]:
    server = server or make_server()
    client, transport = connect_client(server, **kwargs)
    opener = Opener()
    client.link.glue.login.opener = opener
    client.data_received(
        b"CONNECT\naccept-version:1.2\nhost:/\nlogin:guest\npasscode:guest\nheart-beat:%s\n\n\0"
        % heart_beat.encode()
    )
    await settle()
    (connected,) = transport.frames()
    assert connected.startswith(b"CONNECTED\n"), connected
    transport.written.clear()
    (link,) = opener.opened
    return client, transport, link


def send(destination: str = "/queue/a", body: bytes = b"hello", **headers: str) -> bytes:
    lines = "".join(f"{name}:{value}\n" for name, value in headers.items())
    return f"SEND\ndestination:{destination}\n{lines}\n".encode() + body + b"\0"


def delivery(consumer_tag: str, tag: int, body: bytes = b"m", routing_key: str = "a") -> ops.Delivery:
    return ops.Delivery(consumer_tag, tag, False, "", routing_key, MessageProperties(), body)


async def subscribe(
    client: ClientConnection, transport: MemoryTransport, sub_id: str = "0", ack: str = "auto"
) -> str:
    """SUBSCRIBE with a receipt; returns the consumer tag the session gave it."""
    client.data_received(
        f"SUBSCRIBE\ndestination:/queue/a\nid:{sub_id}\nack:{ack}\nreceipt:sub-{sub_id}\n\n\0".encode()
    )
    await settle()
    assert any(b"receipt-id:sub-" + sub_id.encode() in f for f in transport.frames()), transport.frames()
    transport.written.clear()
    return f"T_{sub_id}"


async def test_connect_logs_in_and_names_the_broker() -> None:
    server = make_server()
    client, transport = connect_client(server)
    opener = Opener(version="3.13.7")
    client.link.glue.login.opener = opener
    client.data_received(CONNECT)
    assert not transport.reading  # reading stops while the login waits for the broker
    await settle()
    (connected,) = transport.frames()
    assert connected.startswith(b"CONNECTED\n") and b"server:RabbitMQ/3.13.7" in connected
    assert transport.reading and client.session.state is State.CONNECTED
    assert client.stomp.parser.limits == client.session.settings.frame_limits  # the larger limits now
    assert opener.attempts[0]["connection_name"] == "STOMP 127.0.0.1:40000"


async def test_a_send_is_published_without_a_task() -> None:
    client, transport, link = await logged_in()
    client.data_received(send(body=b"one") + send(body=b"two"))
    assert [body for *_rest, body in link.published] == [b"one", b"two"]
    assert client.counters.messages_published == 2 and client.counters.frames_received["SEND"] == 2
    assert link.flushes >= 1 and transport.frames() == []


async def test_frames_split_across_reads_make_one_frame() -> None:
    client, _transport, link = await logged_in()
    data = send(body=b"split")
    for byte in range(len(data)):
        client.data_received(data[byte : byte + 1])
    assert [body for *_rest, body in link.published] == [b"split"]
    assert client._guard.held == 0  # noqa: SLF001


async def test_a_receipted_send_waits_for_the_confirm() -> None:
    server = make_server()
    client, transport, link = await logged_in(server)
    client.data_received(send(receipt="r1"))
    await settle()
    assert any(isinstance(call, ops.ConfirmSelect) for call in link.calls)
    assert transport.frames() == []  # no RECEIPT before the broker confirms
    client.stomp.on_confirm(1, False, True)
    client.stomp.on_read_done()
    (receipt,) = transport.frames()
    assert receipt.startswith(b"RECEIPT\n") and b"receipt-id:r1" in receipt
    assert server.stats.receipt_latency["SEND"].observations == 1
    client.data_received(send(receipt="r2"))  # confirms are on: this publish is timed
    client.stomp.on_confirm(2, False, True)
    assert server.stats.confirm_latency.observations == 1
    assert server.stats.receipt_latency["SEND"].observations == 2


async def test_a_negative_confirm_closes_the_client() -> None:
    client, transport, _link = await logged_in()
    client.data_received(send(receipt="r1"))
    await settle()
    client.stomp.on_confirm(1, False, False)
    client.stomp.on_read_done()
    assert client.closed and transport.eof_written
    assert any(f.startswith(b"ERROR\n") for f in transport.frames())


async def test_subscribe_runs_its_broker_calls_in_order_then_receipts() -> None:
    client, transport, link = await logged_in()
    link.gate = asyncio.get_running_loop().create_future()
    client.data_received(b"SUBSCRIBE\ndestination:/queue/a\nid:0\nreceipt:s\n\n\0" + send(body=b"after"))
    await settle()
    assert not transport.reading and link.published == []  # the SEND waits behind the SUBSCRIBE
    assert client.flow.paused_since.keys() == {"broker"}
    link.gate.set_result(None)
    await settle()
    assert [type(call) for call in link.calls][-1] is ops.BasicConsume
    assert any(b"receipt-id:s" in f for f in transport.frames())
    assert [body for *_rest, body in link.published] == [b"after"]
    assert transport.reading and "broker" in client.flow.paused_seconds


async def test_a_delivery_becomes_a_message() -> None:
    client, transport, _link = await logged_in()
    tag = await subscribe(client, transport)
    client.stomp.on_deliver(delivery(tag, 1, b"payload"))
    client.stomp.on_read_done()
    (message,) = transport.frames()
    assert message.startswith(b"MESSAGE\n") and message.endswith(b"payload")


async def test_deliveries_wait_for_the_receipt_of_the_frame_being_handled() -> None:
    client, transport, link = await logged_in()
    tag = await subscribe(client, transport)
    link.gate = asyncio.get_running_loop().create_future()
    client.data_received(b"SUBSCRIBE\ndestination:/queue/b\nid:1\nreceipt:s1\n\n\0")
    await settle()
    client.stomp.on_deliver(delivery(tag, 1, b"early"))
    client.stomp.on_read_done()
    assert transport.frames() == []  # held back
    link.gate.set_result(None)
    await settle()
    frames = transport.frames()
    assert frames[0].startswith(b"RECEIPT\n") and frames[1].startswith(b"MESSAGE\n")


async def test_a_large_message_is_written_without_joining() -> None:
    client, transport, _link = await logged_in()
    tag = await subscribe(client, transport)
    writes: list[list[bytes]] = []
    transport.writelines = writes.append  # type: ignore[method-assign]
    client.stomp.on_deliver(delivery(tag, 1, b"x" * wire.ZERO_COPY_MIN))
    client.stomp.on_read_done()
    assert len(writes) == 1


async def test_client_individual_acks_take_the_quick_path() -> None:
    client, transport, link = await logged_in()
    tag = await subscribe(client, transport, ack="client-individual")
    client.stomp.on_deliver(delivery(tag, 7))
    client.stomp.on_read_done()
    (message,) = transport.frames()
    ack_id = next(line for line in message.split(b"\n") if line.startswith(b"ack:"))[4:]
    client.data_received(b"ACK\nid:" + ack_id + b"\n\n\0")
    assert link.acks == [(7, False)] and client.counters.acks == 1


async def test_nack_reaches_the_broker_and_is_counted() -> None:
    client, transport, link = await logged_in()
    tag = await subscribe(client, transport, ack="client-individual")
    client.stomp.on_deliver(delivery(tag, 9))
    client.stomp.on_read_done()
    (message,) = transport.frames()
    ack_id = next(line for line in message.split(b"\n") if line.startswith(b"ack:"))[4:]
    client.data_received(b"NACK\nid:" + ack_id + b"\n\n\0")
    await settle()
    assert [tag for tag, *_rest in link.nacks] == [9] and client.counters.nacks == 1


async def test_disconnect_receipts_and_releases_the_link() -> None:
    server = make_server()
    client, transport, link = await logged_in(server)
    client.data_received(b"DISCONNECT\nreceipt:bye\n\n\0")
    await settle()
    (receipt,) = transport.frames()
    assert b"receipt-id:bye" in receipt and client.closed and link.closed
    client.connection_lost(None)
    await asyncio.wait_for(client.done, 1)
    assert server.stats.connections_closed["tcp"] == 1


async def test_disconnect_waits_for_outstanding_confirms() -> None:
    client, transport, link = await logged_in()
    client.data_received(send(receipt="r1") + b"DISCONNECT\nreceipt:bye\n\n\0")
    await settle()
    assert not client.closed and transport.frames() == []
    client.stomp.on_confirm(1, False, True)
    client.stomp.on_read_done()
    await settle()
    frames = transport.frames()
    assert b"receipt-id:r1" in frames[0] and b"receipt-id:bye" in frames[1]
    assert client.closed and link.closed


async def test_a_broker_error_on_a_call_answers_the_frame() -> None:
    server = make_server()
    client, transport, link = await logged_in(server)
    link.gate = asyncio.get_running_loop().create_future()
    client.data_received(b"SUBSCRIBE\ndestination:/amq/queue/missing\nid:0\nreceipt:s\n\n\0")
    await settle()
    link.broker_closes(404, "NOT_FOUND - no queue 'missing'", channel_only=True)
    link.fail_with = AmqpError(404, "NOT_FOUND - no queue 'missing'", channel_only=True)
    link.gate.set_result(None)
    await settle()
    (error,) = [f for f in transport.frames() if f.startswith(b"ERROR\n")]
    assert b"receipt-id:s" in error and b"no queue" in error
    assert client.closed


async def test_the_broker_closing_the_connection_is_counted_and_reported() -> None:
    server = make_server()
    client, transport, link = await logged_in(server)
    link.broker_closes(320, "CONNECTION_FORCED - broker forced connection closure")
    client.flush()
    (error,) = transport.frames()
    assert error.startswith(b"ERROR\n") and client.closed
    assert server.stats.amqp_connection_failures["closed_by_broker"] == 1


async def test_a_dead_link_is_reported_as_such() -> None:
    server = make_server()
    client, transport, link = await logged_in(server)
    link.broker_closes(0, "missed heart-beats")
    client.flush()
    (error,) = transport.frames()
    assert b"AMQP connection died" in error
    assert server.stats.amqp_connection_failures["connection_lost"] == 1


async def test_a_call_that_loses_the_socket_closes_with_the_reason() -> None:
    client, transport, link = await logged_in()
    link.fail_with = ConnectionResetError("reset by peer")
    client.data_received(b"SUBSCRIBE\ndestination:/queue/a\nid:0\n\n\0")
    await settle()
    (error,) = transport.frames()
    assert b"reset by peer" in error and client.closed


async def test_a_value_amqp_cannot_carry_is_a_clear_error() -> None:
    client, transport, link = await logged_in()
    link.publish_error = ProcessingError("header value out of range")
    client.data_received(send())
    frames = [f for f in transport.frames() if f.startswith(b"ERROR\n")]
    assert frames and b"out of range" in frames[0] and client.closed


async def test_a_bug_in_the_session_answers_internal_error_and_keeps_serving() -> None:
    server = make_server()
    client, transport, _link = await logged_in(server)

    def broken(frame: object) -> object:
        raise RuntimeError("a bug")

    client.session.handle_frame = broken  # type: ignore[method-assign,assignment]
    client.data_received(b"BEGIN\ntransaction:t\n\n\0")
    (error,) = transport.frames()
    assert b"message:Internal error" in error and client.closed
    other, other_transport = connect_client(server)  # the server still accepts and answers
    other.data_received(b"SEND\ndestination:/queue/a\n\nx\0")
    assert other_transport.frames()[0].startswith(b"ERROR\n")


async def test_login_timeout_closes_a_client_that_never_connects() -> None:
    server = make_server()
    client, transport = connect_client(server)
    client.timers._login_tick()  # noqa: SLF001 - the timer's callback, without waiting for it
    await settle()
    (error,) = transport.frames()
    assert b"message:Login timeout" in error and client.closed


async def test_login_timeout_after_connected_does_nothing() -> None:
    client, transport, _link = await logged_in()
    assert client.timers._login_timer is None  # noqa: SLF001 - cancelled by the login
    client.timers._login_tick()  # noqa: SLF001
    assert not client.closed and transport.frames() == []


async def test_a_slow_proxy_header_is_dropped_at_the_login_timeout() -> None:
    server = make_server(proxy_protocol=True)
    client, transport = connect_client(server)
    client.data_received(b"PROXY TCP4 203.0.113.7")
    client.timers._login_tick()  # noqa: SLF001
    assert transport.aborted and transport.frames() == []
    assert server.stats.connections_refused["proxy_timeout"] == 1


async def test_an_untrusted_proxy_is_refused_before_reading() -> None:
    server = make_server(proxy_protocol=True, proxy_protocol_trusted=["10.0.0.0/8"])
    client, transport = connect_client(server)
    assert transport.aborted and client.closed
    assert server.stats.connections_refused["proxy_untrusted"] == 1


async def test_a_proxy_header_in_pieces_then_stomp_in_the_same_read() -> None:
    server = make_server(proxy_protocol=True)
    client, transport = connect_client(server)
    client.data_received(b"PROXY TCP4 127.0.0.9 127.0.0.1 5")
    assert client.stomp.lifecycle.value == "proxy-header"
    client.data_received(b"000 61613\r\nSEND\ndestination:/queue/a\n\nx\0")
    assert client.peer == "127.0.0.9:5000"
    assert transport.frames()[0].startswith(b"ERROR\n")  # the SEND before CONNECT


async def test_a_proxy_header_without_an_address_keeps_the_peer() -> None:
    server = make_server(proxy_protocol=True)
    client, _transport = connect_client(server)
    client.data_received(b"PROXY UNKNOWN\r\n")
    assert client.peer == "127.0.0.1:40000" and client.stomp.lifecycle.value == "open"


async def test_a_client_address_from_the_tls_listener_is_the_peer() -> None:
    server = make_server()
    client, _transport = connect_client(server, client_address=("2001:db8::1", 7000), listener="tls")
    assert client.peer == "[2001:db8::1]:7000" and not client.session.peer_is_loopback


async def test_heart_beats_are_written_when_silent() -> None:
    client, transport, _link = await logged_in(heart_beat="0,1000")
    assert client.timers._heartbeats.running  # noqa: SLF001
    client.timers._heartbeats.send_tick(0.5)  # noqa: SLF001
    assert bytes(transport.written) == b""  # the CONNECTED frame was this interval's output
    client.timers._heartbeats.send_tick(0.5)  # noqa: SLF001
    assert bytes(transport.written) == b"\n" and client.counters.bytes_sent > 0
    transport.written.clear()
    client.data_received(send())  # no output: still silent
    client.timers._heartbeats.send_tick(0.5)  # noqa: SLF001
    assert bytes(transport.written) == b"\n"


async def test_a_flush_counts_as_a_heart_beat() -> None:
    client, transport, _link = await logged_in(heart_beat="0,1000")
    client.data_received(b"BEGIN\ntransaction:t\nreceipt:b\n\n\0")
    transport.written.clear()
    client.timers._heartbeats.send_tick(0.5)  # noqa: SLF001
    assert bytes(transport.written) == b""


async def test_a_silent_client_gets_a_heart_beat_timeout() -> None:
    server = make_server()
    client, transport, _link = await logged_in(server, heart_beat="1000,0")
    client.timers._heartbeats.receive_tick(1.5)  # noqa: SLF001
    await settle()
    (error,) = transport.frames()
    assert b"message:Heart-beat timeout" in error and b"1.5 s" in error and client.closed


async def test_any_input_keeps_the_client_alive() -> None:
    client, _transport, _link = await logged_in(heart_beat="1000,0")
    client.data_received(b"\n")  # a client heart-beat
    client.timers._heartbeats.receive_tick(1.5)  # noqa: SLF001
    client.mark_read()  # a WebSocket pong
    client.timers._heartbeats.receive_tick(1.5)  # noqa: SLF001
    assert not client.closed


async def test_a_client_we_stopped_reading_is_not_timed_out() -> None:
    client, _transport, _link = await logged_in(heart_beat="1000,0")
    client.stomp.on_broker_backpressure(True)
    client.timers._heartbeats.receive_tick(1.5)  # noqa: SLF001
    assert not client.closed
    client.stomp.on_broker_backpressure(False)
    assert "broker-flow" in client.flow.paused_seconds


async def test_broker_flow_control_pauses_the_client_socket() -> None:
    client, transport, _link = await logged_in()
    client.stomp.on_broker_backpressure(True)
    assert not transport.reading
    client.stomp.on_broker_backpressure(False)
    assert transport.reading


async def test_a_slow_client_pauses_the_broker_link() -> None:
    client, _transport, link = await logged_in()
    client.pause_writing()
    assert not link.reading and "slow-client" in client.flow.paused_since
    client.resume_writing()
    assert link.reading and "slow-client" in client.flow.paused_seconds


async def test_a_frame_left_unfinished_times_out() -> None:
    client, transport, _link = await logged_in()
    client.data_received(b"SEND\ndestination:/queue/a\n")
    guard = client._guard  # noqa: SLF001
    assert guard.held and guard.started is not None
    guard.started -= 3600
    guard.check_time()
    (error,) = transport.frames()
    assert b"message:Frame timeout" in error and client.closed
    assert guard.held == 0


async def test_a_closed_connection_gives_its_incomplete_input_back() -> None:
    server = make_server()
    client, _transport, _link = await logged_in(server)
    client.data_received(b"SEND\ndestination:/queue/a\n")
    assert server.incomplete_input > 0
    client.connection_lost(None)
    assert server.incomplete_input == 0


async def test_shutdown_tells_the_client_and_closes() -> None:
    client, transport, link = await logged_in()
    client.shutdown()
    (error,) = transport.frames()
    assert b"message:Server shutdown" in error and client.closed
    await settle()
    assert link.closed


async def test_after_the_half_close_input_is_dropped_and_output_stops() -> None:
    client, transport, link = await logged_in()
    client.shutdown()
    transport.written.clear()
    client.data_received(send())
    client.stomp.write(b"MESSAGE\n\n\0")  # noqa: SLF001
    client.flush()
    assert transport.written == b"" and link.published == []
    assert client.counters.bytes_received > 0


async def test_a_client_that_neither_reads_nor_closes_is_aborted_after_the_linger() -> None:
    client, transport, _link = await logged_in()
    client.shutdown()
    assert client._linger is not None  # noqa: SLF001
    client._linger._check(transport, None)  # type: ignore[arg-type]  # noqa: SLF001
    assert transport.aborted


async def test_a_client_still_reading_gets_more_time() -> None:
    client, transport, _link = await logged_in()
    client.shutdown()
    transport.get_write_buffer_size = lambda: 100  # type: ignore[method-assign]
    client._linger._check(transport, None)  # type: ignore[arg-type]  # noqa: SLF001
    assert not transport.aborted
    client._linger._check(transport, 100)  # type: ignore[arg-type]  # noqa: SLF001 - no progress
    assert transport.aborted


async def test_abort_ends_the_linger() -> None:
    client, transport, _link = await logged_in()
    client.shutdown()
    client.abort()
    assert transport.aborted and client._linger is None  # noqa: SLF001


async def test_a_transport_without_half_close_is_closed() -> None:
    server = make_server()
    client = ClientConnection(server)
    transport = RawSocket()
    client.connection_made(transport)  # type: ignore[arg-type]
    client.data_received(b"SEND\ndestination:/queue/a\n\nx\0")
    assert transport.closed and not transport.eof_written


async def test_connection_lost_finishes_counts_and_releases() -> None:
    server = make_server()
    client, _transport, link = await logged_in(server)
    client.data_received(send())
    client.connection_lost(ConnectionResetError("gone"))
    assert client.stomp.finished and client in server.connections  # until the link has closed
    await asyncio.wait_for(client.done, 1)
    assert link.closed and client not in server.connections and client not in server.open_sockets
    assert server.stats.closed.messages_published == 1
    assert "client closed the connection (gone)" in client.close_reason


async def test_server_cancel_tells_the_client() -> None:
    client, transport, _link = await logged_in()
    tag = await subscribe(client, transport)
    client.stomp.on_server_cancel(tag)
    client.flush()
    (error,) = transport.frames()
    assert error.startswith(b"ERROR\n")


async def test_events_after_close_are_ignored() -> None:
    client, transport, _link = await logged_in()
    tag = await subscribe(client, transport)
    client.connection_lost(None)
    client.stomp.on_deliver(delivery(tag, 1))
    client.stomp.on_confirm(1, False, True)
    client.stomp.on_server_cancel(tag)
    client.features.deliver_dispatched(delivery(tag, 2))
    client.features.settle_dispatched(1, True, False)
    assert transport.frames() == []


async def test_a_websocket_style_transport_gets_one_item_per_frame() -> None:
    client, transport, _link = await logged_in(frames=MESSAGE_FRAMES)
    writes: list[list[bytes]] = []
    transport.writelines = writes.append  # type: ignore[method-assign]
    client.data_received(b"BEGIN\ntransaction:a\nreceipt:1\n\n\0BEGIN\ntransaction:b\nreceipt:2\n\n\0")
    assert [len(items) for items in writes] == [2]


async def test_too_much_unhandled_input_stops_reading_while_the_broker_works() -> None:
    client, transport, link = await logged_in()
    link.gate = asyncio.get_running_loop().create_future()
    client.data_received(b"SUBSCRIBE\ndestination:/queue/a\nid:0\n\n\0")
    await settle()
    client.data_received(send(body=b"x" * 1024) * 1100)  # over 1 MiB waits behind the call
    assert "input" in client.flow.paused_since and not transport.reading
    link.gate.set_result(None)
    await settle()
    assert transport.reading and len(link.published) == 1100


async def test_the_lifecycle_allows_only_its_moves() -> None:
    client, _transport = connect_client(make_server())
    with pytest.raises(AssertionError, match="open -> new"):
        client.stomp.enter(Lifecycle.NEW)  # noqa: SLF001


# ---------------------------------------------------------------------- the interpreter table
def test_every_operation_has_an_interpreter_entry() -> None:
    assert set(typing.get_args(ops.Operation)) <= set(INTERPRETER)


async def test_an_operation_without_an_entry_is_a_bug() -> None:
    client, _transport = connect_client(make_server())
    with pytest.raises(AssertionError, match="no interpreter entry"):
        client.stomp.execute(object(), in_frame=False)  # type: ignore[arg-type]  # noqa: SLF001


async def test_a_broker_call_outside_a_frame_is_a_bug() -> None:
    client, _transport = connect_client(make_server())
    with pytest.raises(AssertionError, match="outside a frame"):
        client.stomp.execute(ops.BasicQos(1), in_frame=False)  # noqa: SLF001


async def test_a_nowait_declare_needs_no_task() -> None:
    client, _transport, link = await logged_in()
    client.stomp.execute(ops.QueueDeclare("q", nowait=True), in_frame=False)  # noqa: SLF001
    assert [op.queue for op in link.declared_nowait] == ["q"]


async def test_queues_to_delete_are_deleted_before_the_link_closes() -> None:
    client, _transport, link = await logged_in()
    client.stomp.execute(ops.DeleteQueueOnClose("sub-q"), in_frame=False)  # noqa: SLF001
    client.connection_lost(None)
    await asyncio.wait_for(client.done, 1)
    assert link.deleted == ["sub-q"] and link.closed


# ---------------------------------------------------------------------- activemq profile: dispatchers
async def activemq_client(server: ServerContext) -> tuple[ClientConnection, MemoryTransport, FakeAmqp]:
    activemq = dataclasses.replace(server.session_settings, profile="activemq")
    return await logged_in(server, session_settings=activemq)


async def test_a_selector_on_a_queue_goes_through_the_dispatcher() -> None:
    server = make_server()
    client, transport, link = await activemq_client(server)
    client.data_received(
        b"SUBSCRIBE\ndestination:/queue/sel\nid:0\nack:client-individual\nselector:colour = 'red'\n"
        b"receipt:s\n\n\0"
    )
    await settle()
    assert any(b"receipt-id:s" in f for f in transport.frames())
    transport.written.clear()
    assert client.features.dispatch is not None  # noqa: SLF001 - made on the first dispatched subscription
    red = ops.Delivery("T_0", 1, False, "", "sel", MessageProperties(headers={"colour": "red"}), b"r")
    client.stomp.on_deliver(red)
    client.stomp.on_read_done()
    (message,) = transport.frames()
    assert message.startswith(b"MESSAGE\n") and message.endswith(b"r")
    ack_id = next(line for line in message.split(b"\n") if line.startswith(b"ack:"))[4:]
    client.data_received(b"ACK\nid:" + ack_id + b"\n\n\0")
    await settle()
    assert link.acks == [(1, False)] and client.counters.acks == 1
    client.connection_lost(None)
    assert client.features.dispatch is None  # noqa: SLF001 - left on close


async def test_a_delivery_over_the_unacknowledged_budget_closes_and_is_not_sent() -> None:
    server = make_server(max_unacked_bytes=100)
    client, transport, _link = await activemq_client(server)
    client.data_received(b"SUBSCRIBE\ndestination:/queue/a\nid:0\nack:client\nreceipt:s\n\n\0")
    await settle()
    transport.written.clear()
    client.stomp.on_deliver(delivery("T_0", 1, b"x" * 1000))
    client.stomp.on_read_done()
    (error,) = transport.frames()
    assert error.startswith(b"ERROR\n") and b"100 bytes" in error and client.closed
    assert b"MESSAGE" not in transport.written  # not sent: the broker requeues it


async def test_the_three_log_lines_carry_their_fields(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="adapter.connection")
    client, _transport, _link = await logged_in()
    client.data_received(send())
    client.connection_lost(None)
    events = {record.fields["event"]: record.fields for record in caplog.records if hasattr(record, "fields")}
    assert events["connection_opened"]["peer"] == "127.0.0.1:40000"
    assert events["connection_logged_in"]["user"] == "guest"
    closed = events["connection_closed"]
    assert closed["messages_published"] == 1 and closed["logged_in"] is True
    assert closed["reason"] == "client closed the connection"
