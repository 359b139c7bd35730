"""The sans-IO AMQP cores (adapter/amqp/client.py, adapter/amqp/channel.py) over byte sequences,
without a loop or a socket: the "broker" is frames marshalled by pamqp (an independent
implementation), what the client queues to send is read back with pamqp, and the events and
hooks come to a recorder that owns a connection core carrying one channel core (as the shells
own them).  Fed as h11's parsers are tested: the whole buffer, one byte at a time, and with
trailing data; the phase table is checked with hypothesis over every
(phase, input)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pamqp import body, commands, frame, header

from adapter.amqp import wire
from adapter.amqp.channel import ChannelCore
from adapter.amqp.client import (
    CHANNEL,
    TRANSITIONS,
    ConnectionCore,
    Input,
    Phase,
    UnexpectedMethod,
    method_input,
)
from adapter.amqp.errors import REPLY_CODE_NAMES, AmqpError, reply_code_name
from adapter.mapping.destinations import NEWEST_BROKER, ProcessingError, broker_generation
from adapter.mapping.operations import BasicGet, BasicQos, Delivery, QueueBind, QueueDeclare
from adapter.mapping.properties import MessageProperties


class Recorder:
    """The connection core carrying one channel core (as a connection of a session's own and
    the Spark client have them), with every event and hook of both recorded in order.  What a
    test reads or calls is the connection core's, else the channel core's."""

    def __init__(self, *, reusable: bool = False, heartbeat: int = 0) -> None:
        self.log: list[tuple[Any, ...]] = []
        self.connection = ConnectionCore(
            self,
            heartbeat=heartbeat,
            client_properties=wire.table({"product": "test"}),
            many_channels=reusable,
            credentials=("guest", "s3cret", "/vh"),
        )
        self.channel_core = ChannelCore(self.connection, CHANNEL, self.connection.out, self, self)
        self.connection.carry(self.channel_core)

    def __getattr__(self, name: str) -> Any:
        connection = self.__dict__["connection"]
        if hasattr(connection, name):
            return getattr(connection, name)
        return getattr(self.__dict__["channel_core"], name)

    # ChannelEvents
    def on_deliver(self, delivery: Delivery) -> None:
        self.log.append(("deliver", delivery))

    def on_confirm(self, delivery_tag: int, multiple: bool, ack: bool) -> None:
        self.log.append(("confirm", delivery_tag, multiple, ack))

    def on_server_cancel(self, consumer_tag: str) -> None:
        self.log.append(("cancel", consumer_tag))

    # hooks
    def handshake_done(self) -> None:
        self.log.append(("open",))

    def replied(self, method: tuple[int, int], payload: bytes) -> None:
        self.log.append(("reply", method))

    def got(self, delivery: Delivery) -> None:
        self.log.append(("got", delivery))

    def connection_failed(self, error: AmqpError) -> None:
        self.log.append(("failed", error.code, error.phase, error.channel_only, error.from_broker))

    channel_failed = connection_failed

    def close_ok_received(self) -> None:
        self.log.append(("close-ok",))

    def blocked_changed(self) -> None:
        self.log.append(("blocked", self.connection.blocked))

    def returned(self, code: int, text: str, exchange: str, routing_key: str) -> None:
        self.log.append(("returned", code, text, exchange, routing_key))

    def encode_failed(self, error: wire.EncodeError) -> Exception:
        return error

    # test helpers
    def feed(self, data: bytes) -> None:
        self.connection.reader.feed(data)

    def take(self) -> list[tuple[int, Any]]:
        """What the client queued to send since the last call, decoded by pamqp."""
        data = b"".join(bytes(part) for part in self.connection.out)
        self.connection.out.clear()
        if data.startswith(wire.PROTOCOL_HEADER):
            data = data[len(wire.PROTOCOL_HEADER) :]
        frames = []
        while data:
            consumed, channel, value = frame.unmarshal(data)
            frames.append((channel, value))
            data = data[consumed:]
        return frames


def marshal(*frames: tuple[Any, int]) -> bytes:
    return b"".join(frame.marshal(value, channel) for value, channel in frames)


START = marshal(
    (commands.Connection.Start(server_properties={"product": "RabbitMQ", "version": "3.12.4"}), 0)
)
TUNE = marshal((commands.Connection.Tune(channel_max=0, frame_max=65536, heartbeat=60), 0))
OPEN_OK = marshal((commands.Connection.OpenOk(), 0))
HANDSHAKE_BYTES = START + TUNE + OPEN_OK


def delivery_bytes(tag: int, data: bytes, channel: int = 1) -> bytes:
    properties = commands.Basic.Properties(content_type="text/plain", headers={"k": "v"})
    parts = [
        (commands.Basic.Deliver("ctag", tag, False, "amq.topic", "a.b"), channel),
        (header.ContentHeader(0, len(data), properties), channel),
    ]
    if data:
        half = len(data) // 2
        parts += [(body.ContentBody(data[:half]), channel), (body.ContentBody(data[half:]), channel)]
    return marshal(*parts)


def opened() -> Recorder:
    client = Recorder()
    client.feed(HANDSHAKE_BYTES)
    client.take()
    client.log.clear()
    return client


def feed_in(client: Recorder, data: bytes, how: str) -> None:
    if how == "whole":
        client.feed(data)
    else:
        for index in range(len(data)):
            client.feed(data[index : index + 1])


# ----------------------------------------------------------------------------- the handshake
@pytest.mark.parametrize("how", ["whole", "bytewise"])
def test_handshake(how: str) -> None:
    client = Recorder()
    assert client.phase is Phase.CONNECT
    assert client.connection.out == [wire.PROTOCOL_HEADER]  # bytes out before anything came in
    feed_in(client, HANDSHAKE_BYTES, how)
    assert client.phase is Phase.OPEN and client.log == [("open",)]
    (_, start_ok), (_, tune_ok), (_, open_vhost) = client.take()
    assert isinstance(start_ok, commands.Connection.StartOk)
    assert start_ok.response == "\0guest\0s3cret" and start_ok.client_properties == {"product": "test"}
    assert isinstance(tune_ok, commands.Connection.TuneOk)
    assert (tune_ok.channel_max, tune_ok.frame_max, tune_ok.heartbeat) == (1, 65536, 0)
    assert isinstance(open_vhost, commands.Connection.Open) and open_vhost.virtual_host == "/vh"
    assert client.frame_max == 65536 and client.connection.reader.frame_max == 65536
    assert client.broker_version == "3.12.4"
    assert client.broker_generation == broker_generation("3.12.4")


def test_the_handshake_with_trailing_data_keeps_it_for_the_open_phase() -> None:
    """open-ok and the start of a delivery in one read: the delivery is read by the open
    phase's handler (the switch takes effect within the read) and completes with the next."""
    client = Recorder()
    stream = HANDSHAKE_BYTES + delivery_bytes(1, b"hello")
    client.feed(stream[:-5])
    assert client.phase is Phase.OPEN and client.log == [("open",)]
    client.feed(stream[-5:])
    assert [entry[0] for entry in client.log] == ["open", "deliver"]
    assert client.log[1][1].body == b"hello"


def test_the_password_is_forgotten_at_open_ok() -> None:
    client = Recorder()
    client.feed(START + TUNE)
    assert client.connection._credentials[1] == "s3cret"  # still needed until the vhost is open
    client.take()  # start-ok, sent
    client.feed(OPEN_OK)
    held = [
        name
        for part in (client.connection, client.channel_core)
        for name, value in vars(part).items()
        if "s3cret" in repr(value)
    ]
    assert held == []


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        (b"x\x00\x00\x00\x063.10.8", "3.10.8"),
        (wire.field_value("4.1.0"), "4.1.0"),
        (None, None),
        (b"b\x07", None),
    ],
)
def test_the_broker_version_comes_from_connection_start(version: bytes | None, expected: str | None) -> None:
    """connection.start's ``version`` as a long string or a byte array (RabbitMQ sends the
    former), anything else or nothing: no version, the newest generation's rules."""
    fields = wire.shortstr("product") + wire.field_value("RabbitMQ")
    if version is not None:
        fields += wire.shortstr("version") + version
    table = len(fields).to_bytes(4, "big") + fields
    start = wire.method_frame(
        0, wire.CONNECTION_START, b"\x00\x09" + table + wire.longstr("PLAIN") + wire.longstr("en_US")
    )
    client = Recorder()
    client.feed(start)
    assert client.phase is Phase.AUTH
    assert client.broker_version == expected
    assert client.broker_generation == (broker_generation(expected) or NEWEST_BROKER)


def test_heartbeat_and_channel_max_are_negotiated() -> None:
    client = Recorder(reusable=True, heartbeat=30)
    client.feed(HANDSHAKE_BYTES)
    assert client.heartbeat == 30 and client.channel_max == 65535
    client = Recorder(heartbeat=120)
    client.feed(HANDSHAKE_BYTES)
    assert client.heartbeat == 60 and client.channel_max == 1


def test_a_refusal_during_the_handshake_carries_its_step() -> None:
    client = Recorder()
    client.feed(START)
    client.take()
    client.feed(marshal((commands.Connection.Close(403, "ACCESS_REFUSED - Login was refused", 0, 0), 0)))
    assert client.phase is Phase.CLOSED
    assert client.log == [("failed", 403, "auth", False, True)]
    ((_, close_ok),) = client.take()
    assert isinstance(close_ok, commands.Connection.CloseOk)
    client.feed(OPEN_OK)  # after the end nothing is read
    assert client.phase is Phase.CLOSED and len(client.log) == 1


# ----------------------------------------------------------------------------- phase table
def test_every_transition_names_phases_and_inputs_of_the_enums() -> None:
    assert all(
        isinstance(p, Phase) and isinstance(i, Input) and isinstance(n, Phase)
        for (p, i), n in TRANSITIONS.items()
    )
    # nothing leaves the end, and only the broker's or our close leads to it besides a lost socket
    assert {p for (p, _i) in TRANSITIONS} == set(Phase)
    assert all(n is Phase.CLOSED for (p, _i), n in TRANSITIONS.items() if p is Phase.CLOSED)
    assert method_input(wire.CONNECTION_START) is Input.START
    assert method_input((10, 20)) is Input.OTHER_CONNECTION_METHOD  # connection.secure
    assert method_input(wire.BASIC_QOS_OK) is Input.CHANNEL_METHOD


# what the broker sends for each input
BROKER_INPUTS: dict[Input, bytes] = {
    Input.START: START,
    Input.TUNE: TUNE,
    Input.OPEN_OK: OPEN_OK,
    Input.CLOSE: marshal((commands.Connection.Close(320, "CONNECTION_FORCED - shutdown", 0, 0), 0)),
    Input.CLOSE_OK: marshal((commands.Connection.CloseOk(), 0)),
    Input.BLOCKED: marshal((commands.Connection.Blocked("low on memory"), 0)),
    Input.UNBLOCKED: marshal((commands.Connection.Unblocked(), 0)),
    Input.UPDATE_SECRET_OK: marshal((commands.Connection.UpdateSecretOk(), 0)),
    Input.OTHER_CONNECTION_METHOD: marshal((commands.Connection.Secure(challenge=""), 0)),
    Input.CHANNEL_METHOD: marshal((commands.Basic.QosOk(), 1)),
}


def in_phase(phase: Phase) -> Recorder:
    """A client brought into ``phase`` the way a broker and a shell would."""
    client = Recorder()
    steps = {Phase.AUTH: START, Phase.VHOST: START + TUNE}
    if phase in steps:
        client.feed(steps[phase])
    elif phase is not Phase.CONNECT:
        client.feed(HANDSHAKE_BYTES)
        if phase is Phase.CLOSING:
            assert client.send_close()
        elif phase is Phase.CLOSED:
            client.lost()
    assert client.phase is phase
    client.log.clear()
    client.take()
    return client


@given(st.sampled_from(list(Phase)), st.sampled_from(list(Input)))
def test_the_phase_table_decides_every_step(phase: Phase, event: Input) -> None:
    """Every (phase, input): the table's next phase, or, for the broker's input with no entry,
    UnexpectedMethod and the phase unchanged (the shell then closes with 503).  After the end
    nothing is read; a shell's close is queued once."""
    client = in_phase(phase)
    expected = TRANSITIONS.get((phase, event))
    if event is Input.LOST:
        client.lost()
    elif event is Input.SEND_CLOSE:
        queued = client.send_close()
        assert queued == (phase not in (Phase.CLOSING, Phase.CLOSED))
        expected = expected or phase
    elif phase is Phase.CLOSED:
        client.feed(BROKER_INPUTS[event])  # the reader stopped at the end
        expected = Phase.CLOSED
        assert client.log == [] and client.take() == []
    elif expected is None:
        with pytest.raises(UnexpectedMethod, match="not expected"):
            client.feed(BROKER_INPUTS[event])
        expected = phase
    else:
        client.feed(BROKER_INPUTS[event])
    assert client.phase is expected


@given(st.lists(st.sampled_from(list(Input)), max_size=12))
def test_any_sequence_of_inputs_follows_the_table(events: list[Input]) -> None:
    """From a fresh client, any sequence of broker inputs and shell actions, with the link's
    answer to an input the table refuses (close with 503): the phase is always the table's."""
    client = Recorder()
    phase = Phase.CONNECT
    for event in events:
        if event is Input.LOST:
            client.lost()
            phase = Phase.CLOSED
        elif event is Input.SEND_CLOSE:
            client.send_close()
            phase = phase if phase in (Phase.CLOSING, Phase.CLOSED) else Phase.CLOSING
        elif phase is Phase.CLOSED:
            client.feed(BROKER_INPUTS[event])
        elif (phase, event) in TRANSITIONS:
            client.feed(BROKER_INPUTS[event])
            phase = TRANSITIONS[(phase, event)]
        else:
            with pytest.raises(UnexpectedMethod):
                client.feed(BROKER_INPUTS[event])
            client.refuse_input(503, "unexpected")
            phase = phase if phase is Phase.CLOSING else Phase.CLOSING
        assert client.phase is phase, (event, client.log)
    closes = [value for _, value in client.take() if isinstance(value, commands.Connection.Close)]
    assert len(closes) <= 1  # one connection.close, whoever asked


def test_an_unexpected_method_is_refused_with_503_once() -> None:
    client = opened()
    with pytest.raises(UnexpectedMethod):
        client.feed(TUNE)
    assert client.refuse_input(503, "unexpected method from the broker: connection.tune")
    assert client.phase is Phase.CLOSING and client.log == [("failed", 503, "", False, False)]
    ((_, close),) = client.take()
    assert isinstance(close, commands.Connection.Close) and close.reply_code == 503
    assert not client.refuse_input(501, "again")  # one close is enough
    assert client.take() == []


def test_a_channel_method_in_the_handshake_is_refused() -> None:
    client = in_phase(Phase.AUTH)
    with pytest.raises(UnexpectedMethod, match="a channel method is not expected in phase auth"):
        client.feed(delivery_bytes(1, b"x"))


# ----------------------------------------------------------------------------- deliveries
STREAM = (
    delivery_bytes(1, b"hello world")
    + marshal((commands.Basic.Ack(delivery_tag=3, multiple=True), 1))
    + delivery_bytes(2, b"")
    + marshal((commands.Basic.Nack(delivery_tag=4, requeue=False), 1))
    + delivery_bytes(3, b"x" * 70000)
)


def expected_stream_log() -> list[tuple[Any, ...]]:
    client = opened()
    client.feed(STREAM)
    return client.log


def test_deliveries_and_confirms_whole() -> None:
    log = expected_stream_log()
    assert [entry[0] for entry in log] == ["deliver", "confirm", "deliver", "confirm", "deliver"]
    first = log[0][1]
    assert (first.consumer_tag, first.delivery_tag, first.exchange, first.routing_key) == (
        "ctag",
        1,
        "amq.topic",
        "a.b",
    )
    assert first.body == b"hello world" and first.properties.content_type == "text/plain"
    assert first.properties.headers == {"k": "v"}
    assert log[1] == ("confirm", 3, True, True) and log[3] == ("confirm", 4, False, False)
    assert log[2][1].body == b"" and log[4][1].body == b"x" * 70000


def test_deliveries_and_confirms_byte_at_a_time() -> None:
    client = opened()
    feed_in(client, STREAM, "bytewise")
    assert client.log == expected_stream_log()


@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=8))
def test_deliveries_and_confirms_at_any_split(cuts: list[int]) -> None:
    client = opened()
    bounds = [0, *sorted(cuts), len(STREAM)]
    for start, end in zip(bounds, bounds[1:], strict=False):
        client.feed(STREAM[start:end])
    assert client.log == expected_stream_log()


def test_trailing_partial_frame_is_held_not_reported() -> None:
    client = opened()
    data = delivery_bytes(1, b"abc") + delivery_bytes(2, b"def")
    client.feed(data[:-3])
    assert [entry[1].delivery_tag for entry in client.log] == [1]
    assert client.connection.reader.buffered > 0
    client.feed(data[-3:])
    assert [entry[1].delivery_tag for entry in client.log] == [1, 2]


def test_a_returned_message_is_reported_and_its_content_is_not_a_delivery() -> None:
    client = opened()
    returned = marshal(
        (commands.Basic.Return(312, "NO_ROUTE", "", "nowhere"), 1),
        (header.ContentHeader(0, 3, commands.Basic.Properties()), 1),
        (body.ContentBody(b"abc"), 1),
    )
    client.feed(returned)
    assert client.log == [("returned", 312, "NO_ROUTE", "", "nowhere")]


# ----------------------------------------------------------------------------- calls in, bytes out
def test_the_channel_opens_with_its_first_frame_and_its_open_ok_is_swallowed() -> None:
    client = opened()
    assert client.take() == []
    client.publish("amq.topic", "a.b", MessageProperties(delivery_mode=2), b"body")
    client.ack(5, True)
    client.nack(6, False, True)
    frames = client.take()
    kinds = [type(value).__name__ for _, value in frames]
    assert kinds == ["Open", "Publish", "ContentHeader", "ContentBody", "Ack", "Nack"]
    assert {channel for channel, _ in frames} == {1}
    client.feed(marshal((commands.Channel.OpenOk(), 1)))
    assert client.log == []  # nobody waits for the lazy open's reply


def test_a_mandatory_publish_carries_the_flag_and_a_plain_one_does_not() -> None:
    """The adapter's own copies go out mandatory; a client's publish to the same destination,
    before and after, keeps its cached plain method frame."""
    client = opened()
    properties = MessageProperties(delivery_mode=2)
    client.publish("", "ActiveMQ.DLQ", properties, b"plain")
    client.publish_mandatory("", "ActiveMQ.DLQ", properties, b"copy")
    client.publish("", "ActiveMQ.DLQ", properties, b"plain again")
    publishes = [value for _, value in client.take() if isinstance(value, commands.Basic.Publish)]
    assert [(p.exchange, p.routing_key, p.mandatory, p.immediate) for p in publishes] == [
        ("", "ActiveMQ.DLQ", False, False),
        ("", "ActiveMQ.DLQ", True, False),
        ("", "ActiveMQ.DLQ", False, False),
    ]
    with pytest.raises(wire.EncodeError, match="longer than 255"):  # as the owner's error makes it
        client.publish_mandatory("", "k" * 256, properties, b"copy")
    assert client.take() == []  # nothing of it was written


def test_a_call_ends_with_its_reply_only() -> None:
    client = opened()
    frame_bytes, reply = client.operation_call(BasicQos(prefetch_count=10))
    client.start_call(frame_bytes, (reply,))
    frames = client.take()
    assert isinstance(frames[0][1], commands.Channel.Open) and isinstance(frames[1][1], commands.Basic.Qos)
    client.feed(marshal((commands.Channel.OpenOk(), 1), (commands.Queue.BindOk(), 1)))
    assert client.log == []  # neither the lazy open's reply nor another method ends the call
    client.feed(marshal((commands.Basic.QosOk(), 1)))
    assert client.log == [("reply", wire.BASIC_QOS_OK)] and client.call_replies is None
    with pytest.raises(AssertionError, match="overlap"):
        client.start_call(frame_bytes, (reply,))
        client.start_call(frame_bytes, (reply,))


def test_a_basic_get_is_answered_by_its_message_or_by_get_empty() -> None:
    """basic.get (a queue browser): the call's reply is the whole message, named by the
    browser's consumer tag, never a delivery; get-empty is a plain reply."""
    client = opened()
    frame_bytes, reply = client.operation_call(BasicGet("q", "T_b"))
    client.start_call(frame_bytes, (reply, wire.BASIC_GET_EMPTY))
    sent = [value for _, value in client.take()]
    assert isinstance(sent[1], commands.Basic.Get) and (sent[1].queue, sent[1].no_ack) == ("q", False)
    client.feed(
        marshal(
            (commands.Basic.GetOk(9, True, "", "q", 41), 1),
            (header.ContentHeader(0, 4, commands.Basic.Properties(headers={"k": "v"})), 1),
        )
    )
    assert client.log == []  # the call ends with the content, not with get-ok
    client.feed(marshal((body.ContentBody(b"bo"), 1), (body.ContentBody(b"dy"), 1)))
    [(kind, got)] = client.log
    assert kind == "got" and got[:5] == ("T_b", 9, True, "", "q") and got.body == b"body"
    assert got.properties.headers == {"k": "v"}
    client.log.clear()
    client.start_call(frame_bytes, (reply, wire.BASIC_GET_EMPTY))
    client.feed(marshal((commands.Basic.GetEmpty(), 1)))
    assert client.log == [("reply", wire.BASIC_GET_EMPTY)]
    client.log.clear()
    client.feed(delivery_bytes(3, b"after"))  # a delivery after it is a delivery again
    assert client.log[0][0] == "deliver"


def test_a_binding_carries_its_arguments() -> None:
    client = opened()
    frame_bytes, _ = client.operation_call(
        QueueBind("q", "amq.headers", "", (("x-match", "all"), ("h", "v")))
    )
    _, bind = frame.unmarshal(frame_bytes)[1:]
    assert (bind.queue, bind.exchange, bind.arguments) == ("q", "amq.headers", {"x-match": "all", "h": "v"})


def test_an_exclusive_declare_binds_the_connection() -> None:
    client = opened()
    client.operation_call(QueueDeclare("q"))
    assert not client.declared_connection_queue
    client.declare_nowait(QueueDeclare("q", auto_delete=True, nowait=True))
    assert client.declared_connection_queue


def test_the_encoder_error_is_raised_as_the_shell_maps_it() -> None:
    """The core raises the encoder's own error; a shell decides what it becomes (the link:
    ProcessingError through errors.stomp_error, tests/unit/test_amqp_connection.py)."""
    client = opened()
    with pytest.raises(wire.EncodeError, match="longer than 255"):
        client.publish("", "k" * 256, MessageProperties(), b"")
    with pytest.raises(wire.EncodeError, match="range"):
        client.declare_nowait(QueueDeclare("q", arguments={"x-max-length": 2**64}, nowait=True))
    with pytest.raises(wire.EncodeError):
        client.operation_call(QueueDeclare("q" * 300))
    assert not isinstance(wire.EncodeError("x"), ProcessingError)


def test_recycled_channels_get_new_numbers_and_open_lazily() -> None:
    client = Recorder(reusable=True)
    client.feed(HANDSHAKE_BYTES)
    client.take()
    client.publish("", "q", MessageProperties(), b"x")
    client.next_channel()
    client.publish("", "q", MessageProperties(), b"y")
    frames = client.take()
    assert [
        (channel, type(value).__name__)
        for channel, value in frames
        if type(value).__name__ in ("Open", "Publish")
    ] == [
        (1, "Open"),
        (1, "Publish"),
        (2, "Open"),
        (2, "Publish"),
    ]
    assert client.spare_channel() == 3


# ----------------------------------------------------------------------------- closes and cancels
def test_a_channel_close_is_answered_and_fails_the_channel() -> None:
    client = opened()
    client.feed(marshal((commands.Channel.Close(404, "NOT_FOUND - no queue 'q'", 50, 10), 1)))
    assert client.log == [("failed", 404, "", True, True)] and client.phase is Phase.OPEN
    ((channel, close_ok),) = client.take()
    assert channel == 1 and isinstance(close_ok, commands.Channel.CloseOk)


def test_a_server_cancel_is_answered_and_reported() -> None:
    client = opened()
    client.feed(
        marshal(
            (commands.Basic.Cancel("T_0", nowait=False), 1), (commands.Basic.Cancel("T_1", nowait=True), 1)
        )
    )
    assert client.log == [("cancel", "T_0"), ("cancel", "T_1")]
    ((_, cancel_ok),) = client.take()
    assert isinstance(cancel_ok, commands.Basic.CancelOk) and cancel_ok.consumer_tag == "T_0"


def test_our_close_ends_with_close_ok() -> None:
    client = opened()
    client.publish("", "q", MessageProperties(), b"x")
    assert client.send_close()
    *_, (_, close) = client.take()
    assert isinstance(close, commands.Connection.Close) and close.reply_code == 200
    client.feed(delivery_bytes(1, b"in flight") + BROKER_INPUTS[Input.CLOSE_OK])
    assert [entry[0] for entry in client.log] == ["deliver", "close-ok"]
    assert client.phase is Phase.CLOSED


def test_blocked_and_unblocked() -> None:
    client = opened()
    client.feed(BROKER_INPUTS[Input.BLOCKED] + BROKER_INPUTS[Input.UNBLOCKED])
    assert client.log == [("blocked", True), ("blocked", False)]


def test_one_reply_code_table() -> None:
    assert reply_code_name(404) == "not_found" == REPLY_CODE_NAMES[404]
    assert reply_code_name(0) == "AMQP connection died" == AmqpError(0, "lost").name
    assert reply_code_name(999, "999") == "999"


@pytest.mark.parametrize("phase", [Phase.CONNECT, Phase.OPEN])
def test_a_method_frame_too_short_for_its_method_id_is_undecodable(phase: Phase) -> None:
    """Bad input from the broker, answered with 501 like any undecodable frame (not a bug's 541)."""
    client = in_phase(phase)
    with pytest.raises(wire.DecodeError, match="shorter than its method id") as caught:
        client.feed(b"\x01\x00\x01\x00\x00\x00\x02\x00\x3c\xce")
    assert not isinstance(caught.value, UnexpectedMethod)


def test_which_brokers_check_utf8_strictly() -> None:
    from adapter.amqp.client import checks_utf8_strictly

    assert not checks_utf8_strictly("3.10.8") and not checks_utf8_strictly("4.2.9")
    assert (
        checks_utf8_strictly("4.3.0") and checks_utf8_strictly("4.3.0-rc.1") and checks_utf8_strictly("5.0.1")
    )
    assert checks_utf8_strictly(None) and checks_utf8_strictly("0.0.0") and checks_utf8_strictly("dev")


def test_encoded_surrogates_are_refused_for_a_strict_broker_only() -> None:
    from adapter.amqp import wire
    from adapter.amqp.client import refuse_surrogates
    from adapter.mapping.operations import BasicConsume, QueueBind

    cesu = b"s\xed\xa0\x80".decode("utf-8", "surrogateescape")
    wire.basic_consume(1, "q", cesu, False, {}, False)  # what brokers up to 4.2 take
    for op in (BasicConsume("q", cesu, False), QueueBind("q", "amq.topic", cesu)):
        with pytest.raises(wire.EncodeError, match="not valid UTF-8"):
            refuse_surrogates(op)
    refuse_surrogates(QueueBind("q", "amq.topic", "ключ"))  # UTF-8 beyond ASCII is fine


# --------------------------------------------------------------------------- connection.update-secret
def test_update_secret_is_answered_in_order_and_a_close_fails_the_rest() -> None:
    client = Recorder()
    client.feed(HANDSHAKE_BYTES)
    client.take()
    answers: list[object] = []
    client.update_secret(b"token-1", "refresh", answers.append)
    client.update_secret(b"token-2", "refresh", answers.append)
    sent = client.take()
    assert [value.new_secret for _, value in sent] == ["token-1", "token-2"]  # pamqp decodes it
    assert {(channel, type(value)) for channel, value in sent} == {(0, commands.Connection.UpdateSecret)}
    client.feed(marshal((commands.Connection.UpdateSecretOk(), 0)))
    assert answers == [None]
    # RabbitMQ refuses a secret with 530, closing the connection: the waiting refresh hears it
    client.feed(marshal((commands.Connection.Close(530, "NOT_ALLOWED - New secret was refused", 10, 70), 0)))
    assert len(answers) == 2 and isinstance(answers[1], AmqpError) and answers[1].code == 530
    assert not client.secret_waiters


def test_update_secret_needs_an_open_connection_and_an_unasked_ok_changes_nothing() -> None:
    client = Recorder()
    with pytest.raises(AmqpError):
        client.update_secret(b"t", "refresh", lambda error: None)
    client.feed(HANDSHAKE_BYTES)
    client.feed(marshal((commands.Connection.UpdateSecretOk(), 0)))
    assert client.phase is Phase.OPEN
    answers: list[object] = []
    client.update_secret(b"t", "refresh", answers.append)
    client.lost()
    assert len(answers) == 1 and isinstance(answers[0], AmqpError)
