"""Attacks on coalesced ACKs (adapter/session/ack_coalescing.py) from the review of #36 item 6.

Each test drives two real STOMP connections with the same events, one coalescing and one
writing every ACK one by one (``lose_sight`` from the start, as before coalescing existed), and
replays what each wrote on a model of RabbitMQ's channel (tests/unit/test_ack_coalescing.py's
``ChannelModel``: collect_acks of rabbit_channel.erl, whose ``multiple`` fails when its tag is not
outstanding).  The commands a test appends itself (``broker_sends``) are in the broker's order,
which is not always the order the adapter reads them in: a delivery the broker has sent may
still be on its way when the client's next read is pumped."""

from __future__ import annotations

from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from adapter.session.connection import StompConnection
from adapter.session.subscription import AckMode
from tests.unit.test_ack_coalescing import ChannelModel, ack, deliver, subscribed
from tests.unit.test_stomp_connection import Link, feed


def broker_sends(stomp: StompConnection[Link], tag: int, needs_ack: bool = True) -> None:
    """The broker sends delivery ``tag`` (it is unacknowledged from now on)."""
    assert stomp.amqp is not None
    stomp.amqp.commands.append(("deliver", tag, needs_ack))


def pair(*modes: AckMode) -> tuple[StompConnection[Link], StompConnection[Link]]:
    coalesced, one_by_one = subscribed(*modes), subscribed(*modes)
    one_by_one.acks.lose_sight()
    return coalesced, one_by_one


def outcome(stomp: StompConnection[Link]) -> tuple[Any, ...]:
    assert stomp.amqp is not None
    return ChannelModel().run(stomp.amqp.commands)


def test_an_ack_that_overtakes_its_delivery_does_not_leave_a_settled_tag_in_the_record() -> None:
    """The client ACKs message 2 before the adapter has read its delivery (ids are predictable:
    consumer tag, session, a counter).  RabbitMQ has sent it, so it accepts that ack.  The
    adapter then reads delivery 2: it must not record it as unsettled, or the next read's
    ACKs of 1, 2 and 3 become ``ack(3, multiple)``, which RabbitMQ accepts (it acks 1 and 3),
    while the same ACKs one by one end the session on the second ack of 2 (unknown delivery
    tag) and leave 3 unacknowledged, to be requeued."""
    results = []
    for stomp in pair("client-individual"):
        broker_sends(stomp, 1)
        deliver(stomp, 0, 1)
        broker_sends(stomp, 2)  # on its way to the adapter ...
        feed(stomp, ack(0, 2))  # ... when the client's ACK of it is pumped
        deliver(stomp, 0, 2)
        broker_sends(stomp, 3)
        deliver(stomp, 0, 3)
        feed(stomp, ack(0, 1) + ack(0, 2) + ack(0, 3))
        results.append(outcome(stomp))
    coalesced, one_by_one = results
    assert one_by_one[0] is True  # the channel error the plugin's client would see too
    assert coalesced == one_by_one


def test_a_client_ack_that_overtakes_its_deliveries_is_followed_too() -> None:
    """The same with a cumulative ``client`` ACK naming a delivery still on its way: RabbitMQ
    settles every delivery up to it, and the adapter must not record them afterwards."""
    results = []
    for stomp in pair("client-individual", "client"):
        for tag in (1, 2, 3):
            broker_sends(stomp, tag)
        deliver(stomp, 1, 1)
        feed(stomp, ack(1, 3))  # 'client': multiple up to 3, with 2 and 3 not read yet
        deliver(stomp, 0, 2)
        deliver(stomp, 0, 3)
        broker_sends(stomp, 4)
        deliver(stomp, 0, 4)
        feed(stomp, ack(0, 2) + ack(0, 3) + ack(0, 4))
        results.append(outcome(stomp))
    coalesced, one_by_one = results
    assert coalesced == one_by_one


def test_unsubscribe_in_the_same_read_keeps_the_runs_apart() -> None:
    """ACKs, an UNSUBSCRIBE of another subscription, more ACKs naming the remaining one with the
    unsubscribed one's tags (the plugin checks only the subscription part of an id)."""
    results = []
    for stomp in pair("client-individual", "client-individual"):
        for tag, index in ((1, 0), (2, 1), (3, 0), (4, 1)):
            broker_sends(stomp, tag)
            deliver(stomp, index, tag)
        read = ack(0, 1) + b"UNSUBSCRIBE\nid:1\n\n\0" + ack(0, 2) + ack(0, 3) + ack(0, 4)
        feed(stomp, read)
        assert stomp.amqp is not None
        results.append(outcome(stomp))
    assert results[0] == results[1]


def test_tags_over_two_to_the_63_coalesce_and_the_64_bit_edge_is_refused_alike() -> None:
    results = []
    base = 2**63 - 2
    for stomp in pair("client-individual"):
        for tag in (base, base + 1):
            broker_sends(stomp, tag)
            deliver(stomp, 0, tag)
        feed(stomp, ack(0, base) + ack(0, base + 1) + ack(0, 2**64 - 1) + ack(0, 2**64))
        results.append(outcome(stomp))
    assert results[0] == results[1]


# a hostile client's reads racing the broker: deliveries the broker has sent (``send``) are
# read by the adapter later (``read``), and the client names any tag, read or not ("UNREAD":
# the oldest one sent and not read yet, if any; "OLDEST": that many of the oldest read ones the
# test has not named yet, the runs that coalesce)
EVENT = st.one_of(
    st.tuples(st.just("send"), st.integers(0, 1)),
    st.tuples(st.just("read"), st.integers(1, 3)),
    st.tuples(
        st.just("acks"),
        st.lists(
            st.tuples(st.sampled_from(["ACK", "NACK", "CLIENT", "UNREAD", "OLDEST"]), st.integers(1, 12)),
            max_size=6,
        ),
    ),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(EVENT, max_size=30))
@example(  # the first test's race, as these events
    [
        ("send", 0),
        ("read", 1),
        ("send", 0),
        ("acks", [("UNREAD", 1)]),
        ("read", 1),
        ("send", 0),
        ("read", 1),
        ("acks", [("OLDEST", 3)]),
    ]
)
def test_coalescing_is_equivalent_when_acks_race_their_deliveries(events: list[Any]) -> None:
    results = []
    for stomp in pair("client-individual", "client"):
        assert stomp.amqp is not None
        sent: list[tuple[int, int]] = []  # (tag, subscription) sent, not read yet
        unnamed: list[int] = []  # read, not named by an OLDEST yet
        tag = 0
        for event in events:
            if event[0] == "send":
                tag += 1
                broker_sends(stomp, tag)
                sent.append((tag, event[1]))
            elif event[0] == "read":
                for delivered, index in sent[: event[1]]:
                    deliver(stomp, index, delivered)
                    unnamed.append(delivered)
                del sent[: event[1]]
            elif not stomp.closed:
                parts = []
                for kind, number in event[1]:
                    if kind == "OLDEST":
                        taken, unnamed[:] = unnamed[:number], unnamed[number:]
                        parts += [ack(0, delivered) for delivered in taken]
                    elif kind != "UNREAD" or sent:
                        named = sent[0][0] if kind == "UNREAD" else number
                        command = "NACK" if kind == "NACK" else "ACK"
                        parts.append(ack(1 if kind == "CLIENT" else 0, named, command=command))
                read = b"".join(parts)
                if read:
                    feed(stomp, read)
        results.append(outcome(stomp))
    assert results[0] == results[1]
