"""The sans-IO STOMP connection (adapter/session/connection.py): bytes in, bytes and AMQP commands
out, with no event loop, no socket and no timer.

The shell and the broker side are recording fakes: the shell performs what only it can (login,
close) at once, and a broker call is answered by the test with ``call_returned``, as the shell's
task would.  Frames written are read back with a plain split on NUL, not with the adapter's
codec.  Input is fed three ways where the order matters: whole, one byte at a time, and with the
next frame's start behind it."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapter.mapping import operations as ops
from adapter.mapping.budget import BudgetExceeded
from adapter.mapping.properties import MessageProperties
from adapter.session import Session, SessionSettings
from adapter.session.connection import ConnectionCounters, Lifecycle, StompConnection
from adapter.sharing.rules import Member
from adapter.stomp.frame import Frame
from adapter.stomp.output import MESSAGE_FRAMES, STREAM_FRAMES, ClientOutput, FrameOutput
from tests.unit.test_session import SEND_HEADERS

CONNECT = b"CONNECT\naccept-version:1.2\nhost:/\nlogin:guest\npasscode:guest\n\n\0"
LARGE = 1 << 20


class Link:
    """The AMQP side as the connection commands it."""

    def __init__(self) -> None:
        self.published: list[tuple[str, str, bytes]] = []
        self.acks: list[tuple[int, bool]] = []
        self.nacks: list[tuple[int, bool, bool]] = []
        self.declared: list[str] = []
        self.commands: list[tuple[Any, ...]] = []  # all of them, in order, properties included

    def publish(self, exchange: str, routing_key: str, properties: Any, body: bytes) -> None:
        self.published.append((exchange, routing_key, body))
        self.commands.append(("publish", exchange, routing_key, properties, body))

    def publish_mandatory(self, exchange: str, routing_key: str, properties: Any, body: bytes) -> None:
        self.commands.append(("publish_mandatory", exchange, routing_key, properties, body))

    def ack(self, delivery_tag: int, multiple: bool) -> None:
        self.acks.append((delivery_tag, multiple))
        self.commands.append(("ack", delivery_tag, multiple))

    def nack(self, delivery_tag: int, multiple: bool, requeue: bool) -> None:
        self.nacks.append((delivery_tag, multiple, requeue))
        self.commands.append(("nack", delivery_tag, multiple, requeue))

    def declare_nowait(self, op: ops.QueueDeclare) -> None:
        self.declared.append(op.queue)
        self.commands.append(("declare", op))


class Shell:
    """The asyncio shell, recorded: logs in at once, closes when asked."""

    peer = "192.0.2.1:4000"

    def __init__(self) -> None:
        self.stomp: StompConnection[Link] | None = None
        # every operation handed to the shell goes to record (whatever its type)
        self.performed: dict[type, Any] = defaultdict(lambda: Shell.record)
        self.ops: list[Any] = []
        self.closed: list[str] = []
        self.flushes = 0
        self.soon = 0
        self.over: list[tuple[BudgetExceeded, bool]] = []

    def record(self, op: Any, in_frame: bool) -> object:
        self.ops.append(op)
        if isinstance(op, ops.OpenConnection):  # a pooled link: no broker call
            assert self.stomp is not None
            self.stomp.amqp = Link()
            return ops.LoginResult(True, server_version="RabbitMQ/3.10.8")
        if isinstance(op, ops.CloseClient):
            self.close(op.reason)
        return None

    def flush(self) -> None:
        self.flushes += 1

    def flush_soon(self) -> None:
        self.soon += 1

    def close(self, reason: str) -> None:
        assert self.stomp is not None
        if not self.stomp.closed:
            self.stomp.enter(Lifecycle.CLOSED)
            self.closed.append(reason)

    def over_budget(self, error: BudgetExceeded, later: bool) -> None:
        self.over.append((error, later))


class Broker:
    def __init__(self) -> None:
        self.calls: list[ops.Operation] = []
        self.settled = 0

    def start_call(self, op: ops.Operation) -> None:
        self.calls.append(op)

    def confirms_settled(self) -> None:
        self.settled += 1

    def amqp_closed(self, error: Any) -> None:
        raise AssertionError("not in these tests")

    def broker_backpressure(self, paused: bool) -> None:
        raise AssertionError("not in these tests")


class Clocks:
    read_clock = 0.0
    confirm_clock = 0.0
    timed_publish = 0

    def receipt_asked(self, frame: Frame) -> None:
        pass

    def time_publish(self, seq: int) -> None:
        pass

    def confirmed(self, delivery_tag: int, multiple: bool) -> None:
        pass


def make(output: FrameOutput = STREAM_FRAMES) -> tuple[StompConnection[Link], Shell, Broker]:
    shell, broker = Shell(), Broker()
    session = Session(SessionSettings(), session_id="sess-1", peer_is_loopback=True)
    stomp: StompConnection[Link] = StompConnection(
        session, shell, broker, ClientOutput(output, LARGE), Clocks(), None, ConnectionCounters(0.0)
    )
    shell.stomp = stomp
    stomp.enter(Lifecycle.OPEN)
    return stomp, shell, broker


def feed(stomp: StompConnection[Link], data: bytes) -> None:
    """What the shell does with one read: the bytes in, the pump."""
    stomp.in_read = True
    stomp.receive_data(data)
    stomp.pump()
    stomp.in_read = False


def answer(stomp: StompConnection[Link], broker: Broker) -> None:
    """Answer every broker call as the shell's task would, pumping after each."""
    while stomp.busy:
        op = broker.calls[-1]
        stomp.call_returned(op.queue or "amq.gen-1" if isinstance(op, ops.QueueDeclare) else None)
        feed(stomp, b"")


def frames(stomp: StompConnection[Link]) -> list[bytes]:
    data = b"".join(stomp.output.take())
    return [frame.lstrip(b"\n") for frame in data.split(b"\0")[:-1]]


def connected() -> tuple[StompConnection[Link], Shell, Broker]:
    stomp, shell, broker = make()
    feed(stomp, CONNECT)
    (frame,) = frames(stomp)
    assert frame.startswith(b"CONNECTED\n") and b"server:RabbitMQ/3.10.8" in frame
    return stomp, shell, broker


def subscribe(stomp: StompConnection[Link], broker: Broker, receipt: bytes = b"") -> str:
    feed(stomp, b"SUBSCRIBE\ndestination:/queue/a\nid:0\n" + receipt + b"\n\0")
    answer(stomp, broker)
    return "T_0"


def delivery(tag: int, body: bytes = b"m") -> ops.Delivery:
    return ops.Delivery("T_0", tag, False, "", "a", MessageProperties(), body)


@pytest.mark.parametrize("split", ["whole", "bytewise", "with-trailing"])
def test_connect_logs_in_without_a_broker_call(split: str) -> None:
    stomp, shell, broker = make()
    if split == "whole":
        feed(stomp, CONNECT)
    elif split == "bytewise":
        for byte in CONNECT:
            feed(stomp, bytes([byte]))
    else:
        feed(stomp, CONNECT + b"SEND\ndestination:/que")
    (frame,) = frames(stomp)
    assert frame.startswith(b"CONNECTED\nserver:RabbitMQ/3.10.8\nsession:sess-1\n")
    assert [type(op) for op in shell.ops] == [ops.OpenConnection, ops.Established]
    assert broker.calls == [] and not stomp.busy
    assert stomp.parser.limits == stomp.session.settings.frame_limits  # the larger limits now


def test_a_send_declares_once_then_takes_the_quick_path() -> None:
    stomp, _shell, broker = connected()
    send = b"SEND\ndestination:/queue/a\n\nhello\0"
    feed(stomp, send)  # the first SEND to a queue declares it (nowait: no broker call)
    assert stomp.amqp is not None and stomp.amqp.declared == ["a"]
    feed(stomp, send + send)  # known now: one publish each, no declare, no generator
    assert stomp.amqp.declared == ["a"] and stomp.amqp.published == [("", "a", b"hello")] * 3
    assert broker.calls == [] and stomp.steps is None and stomp.counters.messages_published == 3
    assert stomp.counters.frames_received == {"CONNECT": 1, "SEND": 3}
    assert frames(stomp) == []


def test_a_frame_waiting_for_the_broker_holds_the_frames_behind_it() -> None:
    stomp, _shell, broker = connected()
    feed(stomp, b"SUBSCRIBE\ndestination:/queue/a\nid:0\nreceipt:sub\n\n\0SEND\ndestination:/queue/b\n\nx\0")
    assert stomp.busy and broker.calls  # the SUBSCRIBE's calls come first
    assert stomp.amqp is not None and stomp.amqp.published == []
    answer(stomp, broker)
    assert stomp.amqp.published == [("", "b", b"x")]
    (receipt,) = frames(stomp)
    assert receipt.startswith(b"RECEIPT\nreceipt-id:sub\n")


def test_an_ack_takes_the_quick_path() -> None:
    stomp, _shell, broker = connected()
    feed(stomp, b"SUBSCRIBE\ndestination:/queue/a\nid:0\nack:client-individual\n\n\0")
    answer(stomp, broker)
    stomp.on_deliver(delivery(7))
    (message,) = frames(stomp)
    ack_id = next(line for line in message.split(b"\n") if line.startswith(b"ack:"))[4:]
    feed(stomp, b"ACK\nid:" + ack_id + b"\n\n\0")
    assert stomp.amqp is not None and stomp.amqp.acks == [(7, False)] and stomp.counters.acks == 1


def test_a_message_waits_behind_the_receipt_of_the_frame_that_let_it_through() -> None:
    stomp, _shell, broker = connected()
    feed(stomp, b"SUBSCRIBE\ndestination:/queue/a\nid:0\nreceipt:sub\n\n\0")
    while not any(isinstance(op, ops.BasicConsume) for op in broker.calls):
        stomp.call_returned("a")
        feed(stomp, b"")
    stomp.on_deliver(delivery(1, b"early"))  # the consume let it through: the frame is not done
    assert stomp.output.out == [] and stomp.held
    answer(stomp, broker)
    receipt, message = frames(stomp)
    assert receipt.startswith(b"RECEIPT\nreceipt-id:sub\n")
    assert message.startswith(b"MESSAGE\n") and message.endswith(b"early")


def test_a_dispatched_message_does_not_wait_behind_a_receipt() -> None:
    stomp, shell, broker = connected()
    subscribe(stomp, broker)
    feed(stomp, b"SUBSCRIBE\ndestination:/queue/b\nid:1\nreceipt:r\n\n\0")  # a frame under way
    assert stomp.busy
    stomp.in_read = False  # from the dispatcher's turn of the loop, not a read
    stomp.deliver_dispatched(delivery(2, b"routed"))
    assert stomp.held == [] and b"routed" in b"".join(stomp.output.out) and shell.soon == 1


@pytest.mark.parametrize(
    ("output", "items"),
    [(STREAM_FRAMES, 5), (MESSAGE_FRAMES, 1)],
    ids=["stream: pieces kept apart", "messages: one item per frame"],
)
def test_a_shared_message_is_buffered_as_the_transport_takes_frames(output: FrameOutput, items: int) -> None:
    stomp, _shell, broker = make(output)
    feed(stomp, CONNECT)
    stomp.output.take()
    member = Member(None, "T_0", b"MESSAGE\nsubscription:sub-0\n", b"message-id:")
    stomp.deliver_shared(member, (b"destination:/topic/t\n", b"T_0@@1\n\nbo", b"dy\0"))
    assert len(stomp.output.out) == items and stomp.output.large is (items == 5)
    assert b"".join(stomp.output.out) == (
        b"MESSAGE\nsubscription:sub-0\ndestination:/topic/t\nmessage-id:T_0@@1\n\nbody\0"
    )
    assert stomp.counters.shared_messages == 1
    assert broker.calls == []


def test_a_large_body_is_marked_for_an_unjoined_write() -> None:
    stomp, _shell, broker = connected()
    subscribe(stomp, broker)
    stomp.on_deliver(delivery(1, b"x" * LARGE))
    assert stomp.output.large


def test_a_bad_frame_answers_error_and_closes() -> None:
    stomp, shell, _broker = make()
    feed(stomp, b"CONNECT\nno colon here\n\n\0")
    (error,) = frames(stomp)
    assert error.startswith(b"ERROR\nmessage:") and shell.closed and stomp.closed


def test_nothing_is_handled_or_written_once_closed() -> None:
    stomp, shell, broker = connected()
    subscribe(stomp, broker)
    shell.close("test")
    feed(stomp, b"SEND\ndestination:/queue/a\n\nx\0")
    stomp.on_deliver(delivery(1))
    stomp.on_confirm(1, False, True)
    stomp.on_server_cancel("T_0")
    assert stomp.output.out == [] and stomp.amqp is not None and stomp.amqp.published == []


def test_a_confirm_releases_the_receipt_and_ends_disconnects_wait() -> None:
    stomp, _shell, broker = connected()
    feed(stomp, b"SEND\ndestination:/queue/a\nreceipt:r1\n\nx\0")
    answer(stomp, broker)
    assert frames(stomp) == []  # the RECEIPT waits for the broker's confirm
    stomp.awaiting_confirms = True  # DISCONNECT waits (the shell's AwaitConfirms)
    stomp.on_confirm(1, False, True)
    (receipt,) = frames(stomp)
    assert receipt.startswith(b"RECEIPT\nreceipt-id:r1\n") and broker.settled == 1


def test_an_operation_without_an_entry_is_a_bug() -> None:
    stomp, _shell, _broker = make()
    with pytest.raises(AssertionError, match="no interpreter entry"):
        stomp.execute(object(), in_frame=False)  # type: ignore[arg-type]
    with pytest.raises(AssertionError, match="outside a frame"):
        stomp.execute(ops.BasicQos(1), in_frame=False)


# --- the quick paths against the general path, through the real pump (#35 item 4) ----------------
def encoded(command: str, headers: dict[str, str], body: bytes = b"body") -> bytes:
    lines = "".join(f"{name}:{value}\n" for name, value in headers.items())
    return f"{command}\n{lines}\n".encode() + body + b"\0"


def run_frames(stomp: StompConnection[Link], broker: Broker, data: list[bytes]) -> tuple[Any, ...]:
    """Feed each frame, answer the broker calls; what went to the broker and to the client."""
    for frame in data:
        if stomp.closed:
            break
        feed(stomp, frame)
        answer(stomp, broker)
    assert stomp.amqp is not None
    sent = b"".join(stomp.output.take())
    confirmed = [stomp.session.on_confirm(tag, False, True) for tag in range(1, 12)]
    return stomp.amqp.commands, [type(op) for op in broker.calls], sent, confirmed, stomp.lifecycle


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("SEND"), SEND_HEADERS),
            st.tuples(st.sampled_from(["BEGIN", "COMMIT"]), st.just({"transaction": "t1"})),
            st.tuples(st.just("SUBSCRIBE"), st.just({"destination": "/queue/a", "id": "0", "ack": "client"})),
            st.tuples(
                st.just("ACK"), st.fixed_dictionaries({"id": st.sampled_from(["T_0@@sess-1@@1", "bad"])})
            ),
        ),
        max_size=10,
    )
)
def test_the_pump_with_its_quick_paths_does_what_the_general_path_does(
    frames: list[tuple[str, dict[str, str]]],
):
    """The real pump (quick SEND and ACK first) against the same pump whose session declines
    every quick path: the same AMQP commands, broker calls, client bytes, receipts and end."""
    data = [encoded(command, headers) for command, headers in frames]
    quick, _shell, quick_broker = connected()
    general, _shell, general_broker = connected()
    general.session.quick_send = lambda frame: None  # type: ignore[method-assign]
    general.session.quick_ack = lambda frame: None  # type: ignore[method-assign]
    for stomp in (quick, general):
        assert stomp.amqp is not None
        stomp.on_deliver(delivery(1))  # nothing subscribed yet: dropped alike; a tag to ACK later
        stomp.output.take()
    assert run_frames(quick, quick_broker, data) == run_frames(general, general_broker, data)


@pytest.mark.parametrize("returned", [False, True])
def test_a_retry_copy_is_mandatory_and_a_return_keeps_the_original(returned: bool) -> None:
    """A NACK's own copy goes out through the link's mandatory publish; the broker's
    basic.return of it (ahead of its confirm) turns the NACK into an ERROR, without the ack."""
    stomp, shell, broker = connected()
    feed(stomp, b"SUBSCRIBE\ndestination:/queue/a\nid:0\nack:client-individual\nx-retry-delays:100\n\n\0")
    answer(stomp, broker)
    stomp.on_deliver(delivery(7))
    frames(stomp)
    feed(stomp, b"NACK\nid:T_0@@sess-1@@7\nreceipt:n\n\n\0")
    assert isinstance(broker.calls[-1], ops.ConfirmSelect)
    stomp.call_returned(None)
    feed(stomp, b"")
    assert isinstance(broker.calls[-1], ops.AwaitConfirms)
    link = stomp.amqp
    assert link is not None
    (copy,) = [command for command in link.commands if command[0].startswith("publish")]
    assert copy[:3] == ("publish_mandatory", "", "stomp-retry.100ms.a") and copy[4] == b"m"
    assert stomp.session.confirms_outstanding  # the shell's AwaitConfirms waits for its confirm
    if returned:
        stomp.on_return(312, "NO_ROUTE", "", "stomp-retry.100ms.a")
    stomp.on_confirm(1, False, True)
    assert not stomp.session.confirms_outstanding and broker.settled == 0  # nobody was waiting here
    stomp.call_returned(True)
    feed(stomp, b"")
    (answered,) = frames(stomp)
    if returned:
        assert answered.startswith(b"ERROR\n") and b"could not route" in answered
        assert link.acks == [] and shell.closed
    else:
        assert answered.startswith(b"RECEIPT\nreceipt-id:n\n") and link.acks == [(7, False)]
