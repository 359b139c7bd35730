"""Coalesced ACKs against the real broker (adapter/session/ack_coalescing.py): the
client-individual ACKs of one read leave the adapter as one ``basic.ack`` with ``multiple`` only
when that settles exactly the same messages, and the broker agrees on what was settled.

The methods the adapter sends are read by a frame-aware proxy between it and RabbitMQ
(tests/amqp_proxy.py, pamqp's decoding); the messages are published, and what is left
afterwards is read, by an independent AMQP client (aio-pika).  An ACK of a message already
acknowledged would make RabbitMQ close the channel (PRECONDITION_FAILED), which the client would
see as an ERROR: each test ends with a RECEIPT instead, then checks which messages came back."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from pamqp import commands

from tests.amqp_proxy import MethodLog, ProxyThread
from tests.support import AdapterProcess, BrokerProbe, Frame, RawSession, unique, wait_until


@pytest.fixture
def logged(amqp_url: str, start_adapter: Callable[..., AdapterProcess]) -> Iterator[tuple[int, MethodLog]]:
    log = MethodLog()
    with ProxyThread(amqp_url, [log]) as proxy:
        yield start_adapter(amqp_url=proxy.url).port, log


def filled(broker: BrokerProbe, count: int) -> str:
    queue = unique("coalesce")
    broker.declare_queue(queue, durable=True)
    for number in range(count):
        broker.publish("", queue, f"m{number}".encode())
    return queue


def messages(session: RawSession, count: int) -> list[Frame]:
    got: list[Frame] = []
    while len(got) < count:
        frames = session.frames_until(("MESSAGE",))
        assert frames and frames[-1][0] == "MESSAGE", frames
        got += [frame for frame in frames if frame[0] == "MESSAGE"]
    return got


def subscribe(session: RawSession, queue: str, sub_id: str) -> None:
    got = session.send(
        f"SUBSCRIBE\nid:{sub_id}\ndestination:/queue/{queue}\nack:client-individual\n"
        "prefetch-count:100\nreceipt:s\n\n"
    )
    assert got[-1][0] == "RECEIPT", got


def acks(frames: list[Frame], receipt: str = "") -> bytes:
    return b"".join(f"ACK\nid:{frame[1]['ack']}\n{receipt}\n\0".encode() for frame in frames)


def acks_sent(log: MethodLog, count: int) -> list[tuple[int, bool]]:
    """The basic.acks the adapter sent, once ``count`` have passed the proxy (a RECEIPT of an
    ACK follows its write, not its arrival), and nothing more after a moment."""
    assert wait_until(lambda: len(log.sent(commands.Basic.Ack)) >= count, 5)
    return [(ack.delivery_tag, ack.multiple) for ack in log.sent(commands.Basic.Ack)]


def remaining(broker: BrokerProbe, queue: str) -> list[bytes]:
    left = []
    while (got := broker.get(queue)) is not None:
        left.append(got.body)
    return sorted(left)


def test_the_acks_of_one_read_settle_as_one_multiple_ack(logged, broker):
    port, log = logged
    queue = filled(broker, 30)
    session = RawSession(port)
    subscribe(session, queue, "s")
    got = messages(session, 30)
    # the first 20 in one write (every unacknowledged one up to the 20th: one multiple ack),
    # then two with a gap before them (one by one), then one with a receipt (the general path)
    session.sock.sendall(acks(got[:20]) + acks([got[22], got[24]]) + acks([got[26]], "receipt:done\n"))
    answer = session.frames_until(("RECEIPT", "ERROR"))
    assert answer[-1][0] == "RECEIPT", answer
    sent = acks_sent(log, 4)
    tags = [int(frame[1]["ack"].rsplit("@@", 1)[1]) for frame in got]
    session.disconnect()  # the unacknowledged ones go back to the queue
    print("SENT", sent, "TAGS", tags)
    assert sent == [(tags[19], True), (tags[22], False), (tags[24], False), (tags[26], False)]
    assert len(log.sent(commands.Basic.Ack)) == 4
    assert broker.wait_depth(queue, 7) == 7
    expected = sorted(
        frame[2] for index, frame in enumerate(got) if index >= 20 and index not in (22, 24, 26)
    )
    assert remaining(broker, queue) == expected


def test_another_subscriptions_unacknowledged_messages_keep_the_acks_one_by_one(logged, broker):
    port, log = logged
    first, second = filled(broker, 5), filled(broker, 10)
    session = RawSession(port)
    subscribe(session, first, "a")
    held = messages(session, 5)  # delivered first, never acknowledged
    subscribe(session, second, "b")
    got = messages(session, 10)
    session.sock.sendall(acks(got[:9]) + acks(got[9:], "receipt:done\n"))
    answer = session.frames_until(("RECEIPT", "ERROR"))
    assert answer[-1][0] == "RECEIPT", answer
    session.disconnect()  # after the DISCONNECT's RECEIPT, every ack has passed the proxy
    sent = acks_sent(log, 10)
    assert len(sent) == 10 and not any(multiple for _tag, multiple in sent)
    assert broker.wait_depth(first, 5) == 5 and broker.depth(second) == 0
    assert remaining(broker, first) == sorted(frame[2] for frame in held)
