"""The queue dispatcher of selector subscriptions (adapter/dispatch/rules.py): routing, credit,
parking, the bound, the release back-off, members leaving, and settlements on the right
channel with the right tag.  Pure: fake owners record what the shell would execute.  Last, the
shell's coalescing of a channel's acks (adapter/dispatch/runtime.py), with a fake channel."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapter.dispatch import rules as dispatch
from adapter.dispatch import runtime as dispatching
from adapter.dispatch.rules import HOLD_MAX, HOLD_MIN, Deliver, Member, QueueDispatcher, Settle
from adapter.dispatch.runtime import DispatchMembership
from adapter.mapping import operations as ops
from adapter.mapping.operations import Delivery
from adapter.mapping.properties import MessageProperties


@dataclass
class Channel:
    """A fake client connection: what was rendered to it, what was settled on its channel."""

    name: str
    rendered: list[Delivery] = field(default_factory=list)
    settled: list[tuple[int, bool, bool]] = field(default_factory=list)

    def deliver_dispatched(self, delivery: Delivery) -> None:
        self.rendered.append(delivery)

    def settle_dispatched(self, delivery_tag: int, ack: bool, requeue: bool) -> None:
        self.settled.append((delivery_tag, ack, requeue))


def colour_is(colour: str) -> Callable[[MessageProperties], bool]:
    return lambda properties: (properties.headers or {}).get("colour") == colour


def message(tag: int, colour: str, consumer: str = "") -> Delivery:
    return Delivery(consumer, tag, False, "", "q", MessageProperties(headers={"colour": colour}), b"")


def execute(actions: list[dispatch.Action]) -> None:
    for action in actions:
        if isinstance(action, Deliver):
            action.target.owner.deliver_dispatched(action.delivery)
        else:
            action.origin.owner.settle_dispatched(action.delivery_tag, action.ack, action.requeue)


def join(
    dispatcher: QueueDispatcher, colour: str, *, auto_ack: bool = False, credit: int | None = None
) -> tuple[Member, Channel]:
    """Join and activate (the broker accepted the consume)."""
    channel = Channel(colour)
    member = dispatcher.add_member(
        channel, f"T_{colour}", colour_is(colour), auto_ack=auto_ack, credit=credit
    )
    execute(dispatcher.activate(member))
    return member, channel


def test_window_is_the_stomp_prefetch_plus_the_parking_room() -> None:
    assert dispatch.window(10, auto_ack=False) == 10 + dispatch.PARK_LIMIT
    assert dispatch.window(None, auto_ack=False) == dispatch.DEFAULT_WINDOW + dispatch.PARK_LIMIT
    assert dispatch.window(10, auto_ack=True) == dispatch.PARK_LIMIT
    assert dispatch.window(65535, auto_ack=False) == 65535  # basic.qos carries 16 bits


def test_a_matching_delivery_goes_to_its_own_member_first() -> None:
    dispatcher = QueueDispatcher()
    red, red_channel = join(dispatcher, "red")
    join(dispatcher, "red")
    execute(dispatcher.offer(red, message(5, "red"), now=0))
    assert [(d.consumer_tag, d.delivery_tag) for d in red_channel.rendered] == [("T_red", 1)]
    assert red_channel.settled == []  # client ack mode: unsettled until the client acks


def test_a_delivery_its_member_does_not_match_goes_to_the_member_that_does() -> None:
    dispatcher = QueueDispatcher()
    red, red_channel = join(dispatcher, "red")
    blue, blue_channel = join(dispatcher, "blue")
    execute(dispatcher.offer(red, message(5, "blue"), now=0))
    assert red_channel.rendered == []
    assert [(d.consumer_tag, d.delivery_tag) for d in blue_channel.rendered] == [("T_blue", 1)]
    # blue's ACK of its message 1 is a basic.ack of tag 5 on red's channel
    execute(dispatcher.settle(blue, 1, multiple=False, ack=True))
    assert red_channel.settled == [(5, True, True)]
    assert blue_channel.settled == []


def test_auto_ack_member_settles_on_the_origin_as_it_is_sent() -> None:
    dispatcher = QueueDispatcher()
    red, red_channel = join(dispatcher, "red")
    _blue, blue_channel = join(dispatcher, "blue", auto_ack=True)
    execute(dispatcher.offer(red, message(9, "blue"), now=0))
    assert len(blue_channel.rendered) == 1
    assert red_channel.settled == [(9, True, True)]


def test_no_match_parks_on_the_origin_channel_and_a_joining_member_gets_it() -> None:
    dispatcher = QueueDispatcher()
    red, red_channel = join(dispatcher, "red")
    execute(dispatcher.offer(red, message(3, "green"), now=0))
    assert red_channel.rendered == [] and red_channel.settled == []
    assert list(red.parked) == [3]
    green, green_channel = join(dispatcher, "green")
    assert [d.delivery_tag for d in green_channel.rendered] == [1]
    assert red.parked == {}
    execute(dispatcher.settle(green, 1, multiple=False, ack=True))
    assert red_channel.settled == [(3, True, True)]


def test_credit_is_the_stomp_prefetch_and_freed_credit_takes_parked_messages() -> None:
    dispatcher = QueueDispatcher()
    red, red_channel = join(dispatcher, "red", credit=1)
    execute(dispatcher.offer(red, message(1, "red"), now=0))
    execute(dispatcher.offer(red, message(2, "red"), now=0))  # no credit left: parked
    assert [d.delivery_tag for d in red_channel.rendered] == [1]
    assert list(red.parked) == [2]
    execute(dispatcher.settle(red, 1, multiple=False, ack=True))
    assert [d.delivery_tag for d in red_channel.rendered] == [1, 2]
    assert red_channel.settled == [(1, True, True)]
    assert red.credit == 0


def test_a_paused_member_gets_nothing_until_its_client_drains() -> None:
    dispatcher = QueueDispatcher()
    red, red_channel = join(dispatcher, "red", auto_ack=True)
    blue, _blue_channel = join(dispatcher, "blue")
    execute(dispatcher.set_paused(red, True))
    execute(dispatcher.offer(blue, message(1, "red"), now=0))
    assert red_channel.rendered == [] and list(blue.parked) == [1]
    execute(dispatcher.set_paused(red, False))
    assert [d.delivery_tag for d in red_channel.rendered] == [1]
    assert blue.parked == {}


def test_client_ack_is_cumulative_per_member_and_settles_each_origin_tag() -> None:
    dispatcher = QueueDispatcher()
    red, red_channel = join(dispatcher, "red")
    blue, blue_channel = join(dispatcher, "blue")
    execute(dispatcher.offer(red, message(10, "blue"), now=0))
    execute(dispatcher.offer(blue, message(20, "blue"), now=0))
    execute(dispatcher.offer(red, message(11, "blue"), now=0))
    assert [d.delivery_tag for d in blue_channel.rendered] == [1, 2, 3]
    execute(dispatcher.settle(blue, 2, multiple=True, ack=True))
    assert red_channel.settled == [(10, True, True)]
    assert blue_channel.settled == [(20, True, True)]
    execute(dispatcher.settle(blue, 3, multiple=False, ack=False, requeue=False))
    assert red_channel.settled[-1] == (11, False, False)
    assert execute(dispatcher.settle(blue, 3, multiple=False, ack=True)) is None  # twice: nothing
    assert len(red_channel.settled) == 2


def test_parked_messages_are_released_after_the_hold_time_with_back_off() -> None:
    dispatcher = QueueDispatcher()
    red, red_channel = join(dispatcher, "red")
    execute(dispatcher.offer(red, message(1, "green"), now=0))
    assert dispatcher.next_release() == HOLD_MIN
    assert dispatcher.release_due(now=HOLD_MIN / 2) == []
    execute(dispatcher.release_due(now=HOLD_MIN))
    assert red_channel.settled == [(1, False, True)]  # basic.nack requeue: back to the queue
    assert dispatcher.next_release() is None
    # it comes back (nobody here matches it): held twice as long now, and so on up to the ceiling
    execute(dispatcher.offer(red, message(2, "green"), now=10))
    assert dispatcher.next_release() == 10 + 2 * HOLD_MIN
    for _ in range(20):
        execute(dispatcher.release_due(now=1e9))
        execute(dispatcher.offer(red, message(3, "green"), now=0))
    assert red.hold == HOLD_MAX
    # a delivered message shows the channel is moving: back to the shortest hold
    execute(dispatcher.offer(red, message(4, "red"), now=0))
    assert red.hold == HOLD_MIN


def test_a_parked_message_a_member_matches_waits_for_its_credit_instead_of_being_released() -> None:
    dispatcher = QueueDispatcher()
    red, red_channel = join(dispatcher, "red", credit=1)
    execute(dispatcher.offer(red, message(1, "red"), now=0))
    execute(dispatcher.offer(red, message(2, "red"), now=0))  # waits for red's credit
    execute(dispatcher.offer(red, message(3, "green"), now=0))  # nobody's
    execute(dispatcher.release_due(now=HOLD_MIN))
    assert red_channel.settled == [(3, False, True)]
    assert list(red.parked) == [2]
    assert dispatcher.next_release() == HOLD_MIN + red.hold  # looked at again later, no busy timer
    execute(dispatcher.settle(red, 1, multiple=False, ack=True))
    assert [d.delivery_tag for d in red_channel.rendered] == [1, 2]


def test_unsubscribe_requeues_parked_and_unacknowledged_but_keeps_routed_ones_settleable() -> None:
    dispatcher = QueueDispatcher()
    red, red_channel = join(dispatcher, "red")
    blue, blue_channel = join(dispatcher, "blue")
    execute(dispatcher.offer(red, message(1, "green"), now=0))  # parked on red
    execute(dispatcher.offer(red, message(2, "blue"), now=0))  # routed to blue
    execute(dispatcher.offer(blue, message(7, "red"), now=0))  # routed to red, unacked
    execute(dispatcher.leave(red, channel_open=True))
    assert blue_channel.settled == [(7, False, True)]  # red's client never acked it
    assert red_channel.settled == [(1, False, True)]  # parked: back to the queue
    assert red in dispatcher.members  # still the origin of a message blue's client holds
    execute(dispatcher.settle(blue, 1, multiple=False, ack=True))
    assert red_channel.settled[-1] == (2, True, True)
    assert red not in dispatcher.members
    # a member that left gets nothing more, and a late delivery on its channel is requeued
    execute(dispatcher.offer(red, message(3, "red"), now=0))
    assert red_channel.settled[-1] == (3, False, True)


def test_closed_channel_settles_nothing_more() -> None:
    dispatcher = QueueDispatcher()
    red, red_channel = join(dispatcher, "red")
    blue, blue_channel = join(dispatcher, "blue")
    execute(dispatcher.offer(red, message(1, "blue"), now=0))
    execute(dispatcher.offer(red, message(2, "green"), now=0))
    execute(dispatcher.leave(red, channel_open=False))
    assert red_channel.settled == []  # the broker requeues what was unacked on a closed channel
    execute(dispatcher.settle(blue, 1, multiple=False, ack=True))
    assert red_channel.settled == []  # blue's client acked a message that is back on the queue
    assert dispatcher.members == (blue,)
    assert blue.credit is None and blue.in_flight == {}


def test_an_unconfirmed_member_takes_nothing_and_a_refused_one_leaves_having_settled_nothing() -> None:
    # issue #24: it joined before its consume; the broker refuses the consume (no read
    # permission, an exclusive consumer) and closes its channel
    dispatcher = QueueDispatcher()
    red, red_channel = join(dispatcher, "red")
    execute(dispatcher.offer(red, message(1, "blue"), now=0))
    blue_channel = Channel("blue")
    blue = dispatcher.add_member(blue_channel, "T_blue", colour_is("blue"), auto_ack=True, credit=None)
    execute(dispatcher.offer(red, message(2, "blue"), now=0))
    assert blue_channel.rendered == [] and red_channel.settled == []
    assert list(red.parked) == [1, 2]
    execute(dispatcher.release_due(now=HOLD_MIN))  # nobody confirmed wants them: released
    assert red_channel.settled == [(1, False, True), (2, False, True)]
    execute(dispatcher.leave(blue, channel_open=False))
    assert blue_channel.settled == [] and blue_channel.rendered == []
    assert dispatcher.members == (red,)


def test_an_unconfirmed_members_own_deliveries_wait_for_it_and_activation_gives_them() -> None:
    # the broker may deliver between consume-ok and the activation: an origin, not a target
    dispatcher = QueueDispatcher()
    red_channel = Channel("red")
    red = dispatcher.add_member(red_channel, "T_red", colour_is("red"), auto_ack=True, credit=None)
    execute(dispatcher.offer(red, message(1, "red"), now=0))
    assert red_channel.rendered == [] and list(red.parked) == [1]
    execute(dispatcher.activate(red))
    assert [d.delivery_tag for d in red_channel.rendered] == [1]
    assert red_channel.settled == [(1, True, True)]  # auto: settled as it is sent, once confirmed
    assert dispatcher.activate(red) == []  # twice: nothing


def test_a_plain_member_takes_what_selector_members_hold_as_soon_as_it_is_confirmed() -> None:
    dispatcher = QueueDispatcher()
    red, red_channel = join(dispatcher, "red")
    for tag, colour in enumerate(("green", "blue", "green"), start=1):
        execute(dispatcher.offer(red, message(tag, colour), now=0))
    plain_channel = Channel("plain")
    plain = dispatcher.add_member(plain_channel, "T_plain", lambda _p: True, auto_ack=False, credit=None)
    assert plain_channel.rendered == []
    execute(dispatcher.activate(plain))
    assert [d.consumer_tag for d in plain_channel.rendered] == ["T_plain"] * 3
    assert red.parked == {}  # nothing waits for the hold time
    execute(dispatcher.settle(plain, 3, multiple=True, ack=True))
    assert red_channel.settled == [(1, True, True), (2, True, True), (3, True, True)]
    # and new messages red does not match go to it at once
    execute(dispatcher.offer(red, message(4, "green"), now=0))
    assert len(plain_channel.rendered) == 4 and red.parked == {}


def test_a_selector_that_raises_during_a_release_leaves_the_message_parked() -> None:
    dispatcher = QueueDispatcher()
    red, red_channel = join(dispatcher, "red")
    calls = [0]

    def flaky(_properties: MessageProperties) -> bool:
        calls[0] += 1
        raise ValueError("a bug in the evaluation")

    dispatcher.add_member(Channel("x"), "T_x", flaky, auto_ack=False, credit=None)  # confirmed below
    execute(dispatcher.offer(red, message(1, "green"), now=0))
    dispatcher.members[-1].confirmed = True  # so that only the release asks it
    with pytest.raises(ValueError):
        dispatcher.release_due(now=HOLD_MIN)
    assert calls[0] == 1 and list(red.parked) == [1]  # not forgotten: settled later or on close
    assert red_channel.settled == []


class FakeLoop:
    """Just what the release timer uses of the event loop: a clock and call_at / call_later."""

    def __init__(self) -> None:
        self.now = 0.0
        self.handles: list[asyncio.TimerHandle] = []

    def time(self) -> float:
        return self.now

    def get_debug(self) -> bool:
        return False

    def call_at(self, when: float, callback: Callable[..., object], *args: object) -> asyncio.TimerHandle:
        handle = asyncio.TimerHandle(when, callback, args, self)  # type: ignore[arg-type]
        self.handles.append(handle)
        return handle

    def call_later(self, delay: float, callback: Callable[..., object], *args: object) -> asyncio.TimerHandle:
        return self.call_at(self.now + delay, callback, *args)

    @property
    def pending(self) -> list[float]:
        return [handle.when() for handle in self.handles if not handle.cancelled()]

    def fire(self) -> None:
        handle = next(handle for handle in self.handles if not handle.cancelled())
        self.handles.remove(handle)
        self.now = max(self.now, handle.when())
        handle._callback(*handle._args)  # type: ignore[attr-defined]  # an exception propagates


def test_the_release_timer_survives_an_exception_and_comes_back_a_hold_time_later() -> None:
    dispatcher = QueueDispatcher()
    red, red_channel = join(dispatcher, "red")
    failing = [False]

    def flaky(properties: MessageProperties) -> bool:
        if failing[0]:
            raise ValueError("a bug in the evaluation")
        return False

    execute(
        dispatcher.activate(dispatcher.add_member(Channel("x"), "T_x", flaky, auto_ack=False, credit=None))
    )
    execute(dispatcher.offer(red, message(1, "green"), now=0))
    failing[0] = True
    # it said no at the offer; a selector's "no" is remembered, so forget it to be asked again
    next(iter(red.parked.values())).refused_by.clear()
    loop = FakeLoop()
    dispatching.arm_release(dispatcher, loop)  # type: ignore[arg-type]
    assert loop.pending == [HOLD_MIN]
    loop.fire()  # raises inside: logged, and armed again one hold time later (no busy loop)
    assert loop.pending == [2 * HOLD_MIN]
    assert red_channel.settled == [] and list(red.parked) == [1]
    failing[0] = False
    loop.fire()
    assert red_channel.settled == [(1, False, True)]  # released after all
    assert loop.pending == [] and dispatcher.timer is None


def test_registry_keys_by_vhost_and_queue_and_forgets_empty_dispatchers() -> None:
    dispatchers = dispatch.Dispatchers()
    first = dispatchers.get("/", "q")
    assert dispatchers.get("/", "q") is first
    assert dispatchers.get("other", "q") is not first
    member = first.add_member(Channel("x"), "T_x", colour_is("x"), auto_ack=True, credit=None)
    dispatchers.forget_if_empty("/", "q")
    assert len(dispatchers) == 2
    first.leave(member, channel_open=False)
    dispatchers.forget_if_empty("/", "q")
    assert len(dispatchers) == 1


# --- the property: nothing lost, nothing misdelivered ------------------------------------------

COLOURS = ("red", "blue", "green")
PLAIN = "plain"  # a subscription without a selector: it matches everything
step = st.one_of(
    st.tuples(st.just("offer"), st.integers(0, 3), st.sampled_from(COLOURS)),
    st.tuples(st.just("ack"), st.integers(0, 3), st.booleans()),
    st.tuples(st.just("nack"), st.integers(0, 3), st.booleans()),
    st.tuples(st.just("release"), st.integers(0, 3), st.booleans()),
    st.tuples(st.just("leave"), st.integers(0, 3), st.booleans()),
    # a subscription joins later, then the broker accepts (activate) or refuses (its channel
    # closes) its consume
    st.tuples(st.just("join"), st.integers(0, 3), st.booleans()),
    st.tuples(st.just("consume"), st.integers(0, 3), st.booleans()),
)


@settings(max_examples=400, deadline=None)
@given(
    members=st.lists(
        st.tuples(
            st.sampled_from((*COLOURS, PLAIN)),
            st.booleans(),
            st.one_of(st.none(), st.integers(1, 3)),
            st.booleans(),  # confirmed at once (else a later "consume" step decides)
            st.booleans(),  # joins at once (else at a later "join" step)
        ),
        min_size=1,
        max_size=4,
    ),
    steps=st.lists(step, max_size=60),
)
def test_no_message_is_lost_or_misdelivered(
    members: list[tuple[str, bool, int | None, bool, bool]], steps: list[tuple[str, int, object]]
) -> None:
    """Every delivery on a member's channel ends settled exactly once on that channel (or with
    the channel closed), a message is only ever rendered to a confirmed member whose selector
    matches, and nothing is acknowledged on its origin that a client did not get (issue #24:
    a member whose consume the broker refused never took a message)."""
    dispatcher = QueueDispatcher()
    joined: list[tuple[Member, Channel]] = []
    waiting: dict[int, tuple[str, bool, int | None]] = {}  # index -> a member not joined yet
    accepted: set[int] = set()  # members whose consume the broker accepted (the test's books)

    def join_member(index: int, colour: str, auto_ack: bool, credit: int | None) -> None:
        matches = (lambda _p: True) if colour == PLAIN else colour_is(colour)
        member = dispatcher.add_member(
            joined[index][1], f"T_{index}", matches, auto_ack=auto_ack, credit=credit
        )
        joined[index] = (member, joined[index][1])

    for colour, auto_ack, credit, confirmed, at_once in members:
        index = len(joined)
        # a placeholder member until it joins: left, its channel closed, so every step skips it
        placeholder = Member(-index - 1, Channel(colour), "", colour_is(colour), auto_ack, credit)
        placeholder.active = placeholder.channel_open = False
        joined.append((placeholder, Channel(colour)))
        if not at_once:
            waiting[index] = (colour, auto_ack, credit)
            continue
        join_member(index, colour, auto_ack, credit)
        if confirmed:
            accepted.add(index)
            execute(dispatcher.activate(joined[index][0]))
    colour_of: dict[tuple[int, int], str] = {}  # (channel index, delivery tag) -> colour
    origin_of: dict[tuple[int, int], tuple[int, int]] = {}  # (member index, number) -> origin key
    got: set[tuple[int, int]] = set()  # origin keys rendered to a confirmed member's client
    next_tag = [0] * len(joined)
    closed: set[int] = set()  # members whose channel closed (the broker requeues what it held)
    now = 0.0

    def index_of(member: Member) -> int:
        return next(i for i, (m, _c) in enumerate(joined) if m is member)

    def apply(actions: list[dispatch.Action]) -> None:
        for action in actions:
            if isinstance(action, Deliver):
                index = index_of(action.target)
                assert action.target.active and action.target.confirmed, "rendered to an unconfirmed member"
                # the dispatcher's origin for this number, from its books or an auto ack below
                origin = _origin_key(joined, action, actions)
                wanted = joined[index][1].name
                assert wanted in (PLAIN, colour_of[origin]), "rendered to a member that does not match"
                origin_of[index, action.delivery.delivery_tag] = origin
                got.add(origin)
            elif action.ack:
                key = (index_of(action.origin), action.delivery_tag)
                assert key in got, "acknowledged on its origin but no client got it"
            execute([action])

    for kind, index, flag in steps:
        index %= len(joined)
        member, channel = joined[index]
        now += 0.7
        if kind == "offer" and member.channel_open:
            next_tag[index] += 1
            tag = next_tag[index]
            assert isinstance(flag, str)
            colour_of[index, tag] = flag
            apply(dispatcher.offer(member, message(tag, flag), now))
        elif kind in ("ack", "nack") and member.in_flight:
            number = next(iter(member.in_flight)) if flag else max(member.in_flight)
            apply(dispatcher.settle(member, number, multiple=not flag, ack=kind == "ack"))
        elif kind == "release":
            apply(dispatcher.release_due(now if flag else now + HOLD_MAX))
        elif kind == "leave" and member.active:
            apply(dispatcher.leave(member, channel_open=bool(flag)))
            if not flag:
                closed.add(index)
        elif kind == "join" and index in waiting:
            join_member(index, *waiting.pop(index))
            member = joined[index][0]
            if flag:
                accepted.add(index)
                apply(dispatcher.activate(member))
        elif kind == "consume" and member.active and index not in accepted:
            if flag:
                accepted.add(index)
                apply(dispatcher.activate(member))
            else:  # refused: the broker closes the channel; the member leaves with it
                assert channel.rendered == [], "a member the broker refused took messages"
                apply(dispatcher.leave(member, channel_open=False))
                closed.add(index)
    for member, _channel in joined:
        if member.active:
            apply(dispatcher.leave(member, channel_open=True))
    for member, _channel in joined:
        if member.channel_open:
            dispatcher.channel_closed(member)
    assert dispatcher.members == ()
    for index, (_member, channel) in enumerate(joined):
        tags = [tag for tag, _ack, _requeue in channel.settled]
        assert len(tags) == len(set(tags)), "a delivery tag settled twice"
        offered = {tag for (i, tag) in colour_of if i == index}
        # everything offered on an open-to-the-end channel was settled there; on a channel that
        # closed, the broker requeued the rest
        assert set(tags) <= offered
        if index in closed:
            continue
        assert set(tags) == offered, (index, sorted(offered - set(tags)))


def _origin_key(
    joined: list[tuple[Member, Channel]], action: Deliver, actions: list[dispatch.Action]
) -> tuple[int, int]:
    target = action.target
    if not target.auto_ack:
        flight = target.in_flight[action.delivery.delivery_tag]
        return next(i for i, (m, _c) in enumerate(joined) if m is flight.origin), flight.delivery_tag
    position = actions.index(action)
    settle = actions[position + 1]
    assert isinstance(settle, Settle) and settle.ack
    return next(i for i, (m, _c) in enumerate(joined) if m is settle.origin), settle.delivery_tag


# --- the shell's acks on one channel (adapter/dispatch/runtime.py) -----------------------------


@dataclass
class Wire:
    written: list[tuple[str, int, bool]] = field(default_factory=list)

    def ack(self, delivery_tag: int, multiple: bool) -> None:
        self.written.append(("ack", delivery_tag, multiple))

    def nack(self, delivery_tag: int, multiple: bool, requeue: bool) -> None:
        self.written.append(("nack", delivery_tag, multiple))


def _link() -> DispatchMembership:
    loop = asyncio.new_event_loop()
    loop.close()  # flush_acks and settle never use it
    return DispatchMembership(Channel("x"), dispatch.Dispatchers(), "/", loop)


def test_acks_below_every_outstanding_tag_become_one_multiple_ack() -> None:
    link, wire = _link(), Wire()
    link.outstanding.update({1, 2, 3, 4, 5})
    for tag in (2, 1, 3, 5):
        assert link.settle(wire, tag, ack=True, requeue=True)
    link.flush_acks(wire, coalesce=True)
    # 4 is still outstanding (parked, or with a client): 1-3 in one ack, 5 alone
    assert wire.written == [("ack", 3, True), ("ack", 5, False)]
    assert link.outstanding == {4}


def test_acks_are_not_coalesced_when_the_channel_has_other_unsettled_deliveries() -> None:
    link, wire = _link(), Wire()
    link.outstanding.update({1, 2})
    link.settle(wire, 1, ack=True, requeue=True)
    link.settle(wire, 2, ack=True, requeue=True)
    link.flush_acks(wire, coalesce=False)
    assert wire.written == [("ack", 1, False), ("ack", 2, False)]


def test_nacks_are_written_at_once_and_never_coalesced() -> None:
    link, wire = _link(), Wire()
    link.outstanding.update({1, 2})
    assert not link.settle(wire, 2, ack=False, requeue=True)
    assert wire.written == [("nack", 2, False)]
    link.settle(wire, 1, ack=True, requeue=True)
    link.flush_acks(wire, coalesce=True)
    assert wire.written[-1] == ("ack", 1, False)
    assert link.outstanding == set()


def test_a_resubscription_with_the_same_tag_numbers_its_messages_after_the_old_ones() -> None:
    # an old message-id (or an ACK held in a transaction until after the re-SUBSCRIBE) must not
    # name a message of the new subscription: numbers never repeat for a tag on a connection
    loop = asyncio.new_event_loop()
    try:
        client = Channel("red")
        link = DispatchMembership(client, dispatch.Dispatchers(), "/", loop)
        subscribe = ops.JoinDispatch("q", "T_1", colour_is("red"), auto_ack=False, credit=None)
        link.execute(subscribe)
        link.execute(ops.ActivateDispatch("T_1"))
        link.execute(ops.DispatchDelivery(message(7, "red", "T_1")))
        link.execute(ops.LeaveDispatch("T_1"))
        link.execute(subscribe)
        link.execute(ops.ActivateDispatch("T_1"))
        link.execute(ops.DispatchDelivery(message(8, "red", "T_1")))
        assert [delivery.delivery_tag for delivery in client.rendered] == [1, 2]
        link.execute(ops.DispatchSettle("T_1", 1, multiple=True, ack=True))  # the old message's id
        assert client.settled == [(7, False, True)]  # only the UNSUBSCRIBE's requeue of message 1
    finally:
        loop.close()
