"""Coalesced ACKs (adapter/session/ack_coalescing.py): the record of a channel's unsettled
deliveries, the run of held ACKs, and what the pump writes with them.

The property test drives two real STOMP connections (adapter/session/connection.py) with the
same generated deliveries and reads of ACK, NACK, SEND and transaction frames: one coalesces,
the other was told to stop coalescing from the start (so it writes every ACK one by one, as
before coalescing existed).  A model of RabbitMQ's channel (its unacknowledged deliveries, and
the channel error on an unknown delivery tag) replays what each wrote; both must settle the
same deliveries at every point another command is written, fail alike, and send the client the
same bytes."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from adapter.mapping import operations as ops
from adapter.mapping.properties import MessageProperties
from adapter.session.ack_coalescing import AckCoalescing, TagPool
from adapter.session.connection import StompConnection
from adapter.session.subscription import AckMode, Subscription
from tests.unit.test_stomp_connection import Link, answer, connected, feed, frames


class Recorder:
    def __init__(self) -> None:
        self.acks: list[tuple[int, bool]] = []

    def ack(self, delivery_tag: int, multiple: bool) -> None:
        self.acks.append((delivery_tag, multiple))


def subscriptions(**modes: AckMode) -> dict[str, Subscription]:
    return {tag: Subscription(tag, tag, "/queue/q", None, mode) for tag, mode in modes.items()}


def coalescing(pool: TagPool | None = None, limit: int = 1024, **modes: AckMode) -> AckCoalescing:
    return AckCoalescing(subscriptions(**modes), pool or TagPool(), limit)


def release(acks: AckCoalescing, *tags: int) -> list[tuple[int, bool]]:
    for tag in tags:
        acks.hold(tag)
    channel = Recorder()
    acks.release(channel)
    return channel.acks


# ---------------------------------------------------------------------- the object alone
def test_a_run_that_is_every_unsettled_tag_up_to_its_highest_becomes_one_multiple_ack() -> None:
    acks = coalescing(T_i="client-individual")
    for tag in (1, 2, 3, 4):
        acks.delivered("T_i", tag)
    assert release(acks, 2, 1, 3) == [(3, True)]  # any order within the run
    assert acks.recorded == 1
    assert release(acks, 4) == [(4, False)]  # a run of one is itself
    assert acks.recorded == 0


def test_a_gap_a_repeat_or_an_unknown_tag_is_written_one_by_one_in_order() -> None:
    acks = coalescing(T_i="client-individual")
    for tag in (1, 2, 3):
        acks.delivered("T_i", tag)
    assert release(acks, 1, 3) == [(1, False), (3, False)]  # 2 is still unacknowledged
    acks.delivered("T_i", 4)
    assert release(acks, 2, 2) == [(2, False), (2, False)]  # the broker refuses the second
    assert release(acks, 9, 4) == [(9, False), (4, False)]  # 9 was never delivered


def test_the_oldest_unsettled_part_of_a_run_coalesces_and_the_rest_follows() -> None:
    acks = coalescing(T_i="client-individual")
    for tag in range(1, 8):
        acks.delivered("T_i", tag)
    assert release(acks, 7, 1, 5, 2, 3) == [(3, True), (7, False), (5, False)]
    assert acks.recorded == 2  # 4 and 6
    assert release(acks, 6, 6, 4) == [(6, False), (6, False), (4, False)]  # a repeat: all in order


def test_another_subscriptions_unacknowledged_message_keeps_the_acks_apart() -> None:
    acks = coalescing(T_i="client-individual", T_c="client")
    acks.delivered("T_c", 1)
    acks.delivered("T_i", 2)
    acks.delivered("T_i", 3)
    assert release(acks, 2, 3) == [(2, False), (3, False)]
    acks.settled(1, True)  # the client subscription's cumulative ACK
    acks.delivered("T_i", 4)
    acks.delivered("T_i", 5)
    assert release(acks, 4, 5) == [(5, True)]


def test_no_ack_deliveries_are_not_recorded_and_settlements_elsewhere_are_followed() -> None:
    acks = coalescing(T_i="client-individual", T_a="auto")
    acks.delivered("T_i", 1)
    acks.delivered("T_a", 2)  # no_ack: the broker holds nothing for it
    acks.delivered("T_i", 3)
    acks.delivered("T_i", 4)
    acks.settled(1, False)  # a NACK, a transaction's ACK at COMMIT ...
    assert release(acks, 3, 4) == [(4, True)]
    acks.delivered("T_i", 5)
    acks.delivered("T_i", 6)
    acks.settled(0, True)  # multiple with tag 0: everything
    assert acks.recorded == 0


def test_what_it_cannot_follow_ends_coalescing_for_the_session() -> None:
    for event in ("unknown consumer", "dispatched", "out of order"):
        by_tag = subscriptions(T_i="client-individual")
        by_tag["T_d"] = Subscription("T_d", "d", "/queue/q", None, "client-individual", dispatched=True)
        acks = AckCoalescing(by_tag, TagPool())
        acks.delivered("T_i", 5)
        if event == "unknown consumer":
            acks.delivered("T_gone", 6)
        elif event == "dispatched":
            acks.delivered("T_d", 6)
        else:
            acks.delivered("T_i", 5)
        assert not acks.seeing and acks.recorded == 0, event
        acks.delivered("T_i", 7)
        acks.delivered("T_i", 8)
        assert release(acks, 7, 8) == [(7, False), (8, False)], event


def test_the_record_is_bounded_per_session_and_per_process() -> None:
    pool = TagPool(limit=1024)
    first = coalescing(pool, limit=512, T_i="client-individual")
    for tag in range(1, 513):
        first.delivered("T_i", tag)
    assert first.seeing and first.recorded == 512 and pool.taken == 512
    first.delivered("T_i", 513)  # over its own bound: it stops and gives its room back
    assert not first.seeing and first.recorded == 0 and pool.taken == 0
    second, third = (coalescing(pool, limit=1024, T_i="client-individual") for _ in range(2))
    for tag in range(1, 769):
        second.delivered("T_i", tag)
    assert pool.taken == 768
    for tag in range(1, 512):
        third.delivered("T_i", tag)
    assert not third.seeing and pool.taken == 768  # the pool had room for one chunk, not two
    second.close()
    assert pool.taken == 0 and second.recorded == 0


# ---------------------------------------------------------------------- in the pump
def subscribed(*modes: AckMode) -> StompConnection[Link]:
    stomp, _shell, broker = connected()
    for index, mode in enumerate(modes):
        feed(stomp, f"SUBSCRIBE\ndestination:/queue/q{index}\nid:{index}\nack:{mode}\n\n\0".encode())
        answer(stomp, broker)
    stomp.output.take()
    assert stomp.amqp is not None
    stomp.amqp.commands.clear()  # the subscriptions' declares
    return stomp


def deliver(stomp: StompConnection[Link], index: int, tag: int) -> None:
    stomp.on_deliver(ops.Delivery(f"T_{index}", tag, False, "", f"q{index}", MessageProperties(), b"m"))


def ack(index: int, tag: int, extra: str = "", command: str = "ACK") -> bytes:
    return f"{command}\nid:T_{index}@@sess-1@@{tag}\n{extra}\n\0".encode()


def test_the_acks_of_one_read_go_as_one_multiple_ack() -> None:
    stomp = subscribed("client-individual")
    for tag in range(1, 6):
        deliver(stomp, 0, tag)
    feed(stomp, b"".join(ack(0, tag) for tag in range(1, 5)))
    assert stomp.amqp is not None and stomp.amqp.acks == [(4, True)]
    assert stomp.counters.acks == 4 and stomp.acks.held == []
    feed(stomp, ack(0, 5))
    assert stomp.amqp.acks == [(4, True), (5, False)]


def test_a_receipt_or_another_frame_ends_the_run_and_keeps_its_place() -> None:
    stomp = subscribed("client-individual")
    for tag in range(1, 7):
        deliver(stomp, 0, tag)
    frames(stomp)
    send = b"SEND\ndestination:/queue/z\n\nx\0"
    feed(stomp, ack(0, 1) + ack(0, 2) + send + ack(0, 3) + ack(0, 4, "receipt:r\n") + ack(0, 5) + ack(0, 6))
    assert stomp.amqp is not None
    assert [command[:3] if command[0] == "ack" else command[:1] for command in stomp.amqp.commands] == [
        ("ack", 2, True),
        ("declare",),
        ("publish",),
        ("ack", 3, False),  # a run of one: the ACK with a receipt takes the general path
        ("ack", 4, False),
        ("ack", 6, True),
    ]
    (receipt,) = frames(stomp)
    assert receipt.startswith(b"RECEIPT\nreceipt-id:r\n")


def test_a_bad_frame_after_acks_writes_the_acks_first() -> None:
    stomp = subscribed("client-individual")
    deliver(stomp, 0, 1)
    deliver(stomp, 0, 2)
    feed(stomp, ack(0, 1) + ack(0, 2) + b"NOT-A-COMMAND\n\n\0")
    assert stomp.amqp is not None and stomp.amqp.acks == [(2, True)] and stomp.closed


# ---------------------------------------------------------------------- equivalence
class ChannelModel:
    """RabbitMQ's view of one channel: the unacknowledged deliveries, in order, and the channel
    error (PRECONDITION_FAILED, unknown delivery tag) that ends it."""

    def __init__(self) -> None:
        self.unacked: list[int] = []
        self.failed = False
        self.seen: list[tuple[Any, ...]] = []  # the state each other command found

    def run(self, commands: list[tuple[Any, ...]]) -> tuple[Any, ...]:
        for command in commands:
            if self.failed:
                break
            kind = command[0]
            if kind == "deliver":
                if command[2]:
                    self.unacked.append(command[1])
            elif kind in ("ack", "nack"):
                self.settle(command[1], command[2])
            else:
                self.seen.append((kind, tuple(self.unacked)))
        return self.failed, tuple(self.unacked), self.seen

    def settle(self, tag: int, multiple: bool) -> None:
        if multiple and tag == 0:
            self.unacked = []
        elif tag not in self.unacked:
            self.failed = True
        elif multiple:
            self.unacked = [t for t in self.unacked if t > tag]
        else:
            self.unacked.remove(tag)


MODES: tuple[AckMode, ...] = ("client-individual", "client-individual", "client", "auto")
SUBSCRIPTION = st.integers(0, len(MODES) - 1)
TAG = st.integers(0, 14)
# a frame: (kind, subscription, tag); "OLDEST" ACKs that many of the oldest messages the test has
# not settled yet (by their own subscription, in order: the runs that coalesce), "PENDING" and
# "PENDING-NACK" one of them; the others name any subscription and tag, delivered or not
FRAME = st.one_of(
    st.tuples(st.just("OLDEST"), st.just(0), st.integers(1, 6)),
    st.tuples(st.just("PENDING"), st.just(0), st.integers(0, 20)),
    st.tuples(st.just("PENDING-NACK"), st.just(0), st.integers(0, 20)),
    st.tuples(st.just("ACK"), SUBSCRIPTION, TAG),
    st.tuples(st.just("NACK"), SUBSCRIPTION, TAG),
    st.tuples(st.just("ACK-receipt"), SUBSCRIPTION, TAG),
    st.tuples(st.just("SEND"), st.just(0), st.just(0)),
    st.tuples(st.just("TX-ACK"), SUBSCRIPTION, TAG),  # BEGIN, ACK in it, COMMIT
)
EVENT = st.one_of(
    st.tuples(st.just("deliver"), SUBSCRIPTION),
    st.tuples(st.just("deliver"), st.just(0)),  # the first subscription, more often
    st.tuples(st.just("read"), st.lists(FRAME, min_size=1, max_size=8)),
)


def encode(frame: tuple[str, int, int], pending: list[tuple[int, int]]) -> bytes:
    """One generated frame's bytes; ``pending`` (tag, subscription) of the messages the test has
    not settled yet, oldest first, is updated as the frame settles them."""
    kind, index, tag = frame
    if kind == "OLDEST":
        taken, pending[:] = pending[:tag], pending[tag:]
        return b"".join(ack(sub, delivered) for delivered, sub in taken)
    if kind in ("PENDING", "PENDING-NACK"):
        if not pending:
            return b""
        delivered, sub = pending.pop(tag % len(pending))
        return ack(sub, delivered, command="NACK" if kind == "PENDING-NACK" else "ACK")
    if kind == "SEND":
        return b"SEND\ndestination:/queue/z\n\nx\0"
    if kind == "ACK-receipt":
        return ack(index, tag, "receipt:r\n")
    if kind == "TX-ACK":
        return (
            b"BEGIN\ntransaction:t\n\n\0"
            + ack(index, tag, "transaction:t\n")
            + b"COMMIT\ntransaction:t\n\n\0"
        )
    return ack(index, tag, command=kind)


def replay(events: list[Any], coalesce: bool) -> StompConnection[Link]:
    """A connection fed ``events``; what it wrote, deliveries included, is in its link's
    ``commands``."""
    stomp = subscribed(*MODES)
    assert stomp.amqp is not None
    if not coalesce:
        stomp.acks.lose_sight()  # from the start: every ACK is written as it came
    tag = 0
    pending: list[tuple[int, int]] = []
    for event in events:
        if event[0] == "deliver":
            tag += 1
            needs_ack = MODES[event[1]] != "auto"
            stomp.amqp.commands.append(("deliver", tag, needs_ack))
            deliver(stomp, event[1], tag)
            if needs_ack:
                pending.append((tag, event[1]))
        elif not stomp.closed:
            feed(stomp, b"".join(encode(frame, pending) for frame in event[1]))
    assert stomp.acks.held == []
    return stomp


@settings(max_examples=500, deadline=None)
@given(st.lists(EVENT, max_size=30))
def test_coalesced_acks_settle_what_the_acks_one_by_one_settle(events: list[Any]) -> None:
    coalesced, one_by_one = replay(events, True), replay(events, False)
    assert coalesced.amqp is not None and one_by_one.amqp is not None
    assert ChannelModel().run(coalesced.amqp.commands) == ChannelModel().run(one_by_one.amqp.commands)
    assert b"".join(coalesced.output.take()) == b"".join(one_by_one.output.take())
    assert coalesced.counters.acks == one_by_one.counters.acks


def test_the_generated_reads_do_coalesce() -> None:
    """The property above is not vacuous: the generator makes reads whose ACKs coalesce, and
    channels that live to the end."""
    found = {"coalesced": 0, "unharmed": 0}

    @settings(max_examples=200, deadline=None, database=None, derandomize=True)
    @given(st.lists(EVENT, max_size=30))
    def count(events: list[Any]) -> None:
        coalesced, one_by_one = replay(events, True), replay(events, False)
        assert coalesced.amqp is not None and one_by_one.amqp is not None
        if len(coalesced.amqp.commands) < len(one_by_one.amqp.commands):
            found["coalesced"] += 1
        if not ChannelModel().run(coalesced.amqp.commands)[0]:
            found["unharmed"] += 1

    count()
    assert found["coalesced"] >= 5 and found["unharmed"] >= 20, found
