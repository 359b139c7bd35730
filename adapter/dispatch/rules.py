"""Selector subscriptions on a shared queue (activemq profile): which consumer gets each delivery.

JMS selectors on a queue filter competing consumers: a message goes to a consumer whose selector
matches it, and a message no consumer matches stays on the queue.  RabbitMQ has no broker-side
filter, so the broker hands each message to any consumer of the queue.  One ``QueueDispatcher``
per (vhost, queue) per adapter process groups that process's selector subscriptions on the
queue, and the subscriptions without a selector made while it exists (they match everything;
each still consumes on its own client's AMQP channel, with that client's credentials) and
decides, for each message the broker delivers on one of their channels (its *origin*):

* **deliver** it to a member whose selector matches and that has credit (the STOMP prefetch,
  enforced here): the origin member first, then the others in the order they joined.  The
  message stays unacknowledged on the origin's channel; the target's ACK or NACK becomes a
  ``basic.ack``/``basic.nack`` on the origin's channel with the origin's delivery tag
  (``Settle``).  A member in ``auto`` ack mode settles at once, when the message is sent;
* otherwise **park** it, unacknowledged, on the origin's channel.  A parked message is offered
  again when a member joins or a member at zero credit gets credit back, and a selector never
  tried against it is tried then (a selector is fixed, so a "no" is remembered);
* **release** a parked message that no member matches (``basic.nack`` with requeue) once it
  has been parked for the origin's hold time, so that consumers elsewhere (another adapter
  process, a plain AMQP consumer) can have it.  One that a member matches but that waits for
  its credit stays parked, as it would wait in that consumer's prefetch in ActiveMQ.  The hold
  time doubles, from ``HOLD_MIN`` up to ``HOLD_MAX``, each time an origin releases messages
  with none of its messages delivered in between, so a backlog that no consumer matches comes
  back at most once per hold time per channel: never a tight loop.

Membership is two steps: a subscription joins (``join``) before its ``basic.consume`` (the
broker may deliver on its channel right after consume-ok, and those deliveries must find the
dispatcher) but is only *confirmed* by ``activate``, after the broker accepted the consume.
Until then it is an origin only: nothing is delivered to it, so nothing is settled on another
client's channel for it.  A consume the broker refuses (no read permission, a queue held by an
exclusive consumer) closes its channel, and the member leaves having taken nothing.

The bound: a member's AMQP prefetch (``basic.qos``, ``window``) is its STOMP credit plus
``PARK_LIMIT``, so at most that many of its channel's messages are parked or in flight; once the
window is full of parked messages the broker sends that channel nothing more until a release.

When a member leaves (UNSUBSCRIBE) its parked messages and the messages routed to it that its
client has not acknowledged are requeued on their origin's channel (``redelivered:true`` next
time).  Messages it originated that another member's client has not yet acknowledged stay in
flight while its channel is open; when its channel closes (DISCONNECT, connection lost) the
broker requeues them, and a later acknowledgement from the other client settles nothing: the
message is delivered again (at least once, never lost).  docs/migration-activemq.md states
these guarantees and where they stop.

Pure: no I/O, no clock (``now`` is passed in), imports neither asyncio nor pydantic.  The shell
(``adapter/server/connection.py``) owns the members' channels and executes the actions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Final, Protocol

from ..mapping.operations import Delivery
from ..mapping.properties import MessageProperties

__all__ = [
    "HOLD_MAX",
    "HOLD_MIN",
    "PARK_LIMIT",
    "Deliver",
    "Dispatchers",
    "Member",
    "QueueDispatcher",
    "Settle",
    "window",
]

# How many non-matching messages one channel may hold (its basic.qos headroom above the STOMP
# prefetch); ActiveMQ pages 200 messages of a queue into memory for its selectors, the same order.
PARK_LIMIT: Final = 200
# The prefetch of a client-ack member that joins without a credit (ActiveMQ's default queue
# prefetch).  The activemq profile gives a client-ack SUBSCRIBE without a prefetch header that
# same default as its credit (profile.DEFAULT_PREFETCH), so its STOMP credit is 1000 too.
DEFAULT_WINDOW: Final = 1000
# Hold time of a parked message before it is released to the queue, and its back-off ceiling (s)
HOLD_MIN: Final = 1.0
HOLD_MAX: Final = 30.0
_MAX_QOS: Final = 65535


def window(credit: int | None, auto_ack: bool) -> int:
    """The AMQP prefetch of a member's channel: room for what its client may hold unacknowledged
    (nothing in auto mode, which settles as it sends) and ``PARK_LIMIT`` parked messages."""
    held = 0 if auto_ack else (DEFAULT_WINDOW if credit is None else credit)
    return min(_MAX_QOS, held + PARK_LIMIT)


class Owner(Protocol):
    """What a member's channel is to the shell: it renders deliveries and settles tags."""

    def deliver_dispatched(self, delivery: Delivery) -> None: ...

    def settle_dispatched(self, delivery_tag: int, ack: bool, requeue: bool) -> None: ...


@dataclass(frozen=True, slots=True)
class Deliver:
    """Send ``delivery`` to the target member's client.  Its consumer tag is the target's and
    its delivery tag is the target's message number (the tag part of the STOMP message-id)."""

    target: Member
    delivery: Delivery


@dataclass(frozen=True, slots=True)
class Settle:
    """``basic.ack`` (``ack``) or ``basic.nack`` (with ``requeue``) of one delivery tag on the
    origin member's channel."""

    origin: Member
    delivery_tag: int
    ack: bool
    requeue: bool = True


Action = Deliver | Settle


@dataclass(slots=True)
class _Parked:
    delivery: Delivery
    since: float
    # members whose selector does not match it (a selector never changes)
    refused_by: set[int] = field(default_factory=set)


@dataclass(slots=True)
class _InFlight:
    origin: Member
    delivery_tag: int


@dataclass(eq=False, slots=True)
class Member:
    """One selector subscription: its channel's owner, its selector, its credit, and what is
    parked on its channel or delivered to its client and not yet settled."""

    ident: int
    owner: Owner
    consumer_tag: str
    matches: Callable[[MessageProperties], bool]
    auto_ack: bool
    credit: int | None  # deliveries its client may still take unacknowledged (None: unlimited)
    active: bool = True  # False once it left: it gets nothing more
    confirmed: bool = False  # the broker accepted its consume (activate): it may be a target
    paused: bool = False  # its client reads slower than it is sent to: it gets nothing for now
    channel_open: bool = True  # False once its channel closed: its tags settle nothing
    last_number: int = 0
    hold: float = HOLD_MIN
    # on this member's channel, by delivery tag, oldest first
    parked: dict[int, _Parked] = field(default_factory=dict)
    # delivered to this member's client, not yet settled, by message number, oldest first
    in_flight: dict[int, _InFlight] = field(default_factory=dict)


class QueueDispatcher:
    """The selector subscriptions of one (vhost, queue) in one adapter process."""

    __slots__ = ("_members", "_next_ident", "timer")

    def __init__(self) -> None:
        self._members: list[Member] = []
        self._next_ident = 0
        self.timer: object | None = None  # the shell's release timer, if armed

    @property
    def members(self) -> tuple[Member, ...]:
        return tuple(self._members)

    def __bool__(self) -> bool:
        """Whether it still has a member (active, or with messages on its channel)."""
        return bool(self._members)

    # ------------------------------------------------------------------ membership
    def add_member(
        self,
        owner: Owner,
        consumer_tag: str,
        matches: Callable[[MessageProperties], bool],
        *,
        auto_ack: bool,
        credit: int | None,
        last_number: int = 0,
    ) -> Member:
        """Add a subscription, not yet confirmed: deliveries on its channel are offered to the
        confirmed members (and parked), nothing is delivered to it until ``activate``.

        Its message numbers (the last part of a MESSAGE's ``message-id``) continue after
        ``last_number``: the owner passes the last number an earlier subscription with the same
        consumer tag used on its connection, so an old message-id (or an ACK held in a
        transaction) never names a message of the new subscription, as AMQP delivery tags never
        repeat on a channel."""
        self._next_ident += 1
        member = Member(self._next_ident, owner, consumer_tag, matches, auto_ack, credit)
        member.last_number = last_number
        self._members.append(member)
        return member

    def activate(self, member: Member) -> list[Action]:
        """The broker accepted the member's consume: from now on it is a target, and the parked
        messages it matches are delivered to it."""
        actions: list[Action] = []
        if member.active and not member.confirmed:
            member.confirmed = True
            self._reoffer(member, actions)
        return actions

    def leave(self, member: Member, *, channel_open: bool) -> list[Action]:
        """The subscription ends (``channel_open``: UNSUBSCRIBE; else its channel closed).

        Parked messages go back to the queue (a closing channel returns them by itself); what
        its client had not acknowledged goes back on its origin's channel."""
        actions: list[Action] = []
        member.active = False
        if not channel_open:
            member.channel_open = False
        for number in list(member.in_flight):
            flight = member.in_flight.pop(number)
            self._settle_origin(flight, False, True, actions)
        if member.channel_open:
            for tag in member.parked:
                actions.append(Settle(member, tag, ack=False, requeue=True))
        member.parked.clear()
        self._drop_if_done(member)
        return actions

    def channel_closed(self, member: Member) -> None:
        """A member that had left (UNSUBSCRIBE) lost its channel too: its tags settle nothing."""
        member.channel_open = False
        self._drop_if_done(member)

    def _drop_if_done(self, member: Member) -> None:
        # a member that left stays while other clients hold messages from its open channel
        if member.active or member not in self._members:
            return
        if member.channel_open and any(
            flight.origin is member for other in self._members for flight in other.in_flight.values()
        ):
            return
        self._members.remove(member)

    # ------------------------------------------------------------------ deliveries
    def offer(self, origin: Member, delivery: Delivery, now: float) -> list[Action]:
        """A delivery arrived on ``origin``'s channel: deliver it or park it."""
        actions: list[Action] = []
        if not origin.active:
            # a delivery after the member left (it raced basic.cancel): back to the queue
            if origin.channel_open:
                actions.append(Settle(origin, delivery.delivery_tag, ack=False, requeue=True))
            return actions
        properties = delivery.properties
        refused: set[int] = set()
        for member in self._candidates(origin):
            if member.ident in refused or member.paused or not member.confirmed:
                continue
            if member.credit is not None and member.credit <= 0:
                continue
            if not member.matches(properties):
                refused.add(member.ident)
                continue
            self._deliver(member, origin, delivery, actions)
            return actions
        origin.parked[delivery.delivery_tag] = _Parked(delivery, now, refused)
        return actions

    def _candidates(self, origin: Member) -> Iterator[Member]:
        yield origin
        for member in self._members:
            if member is not origin and member.active:
                yield member

    def _deliver(self, target: Member, origin: Member, delivery: Delivery, actions: list[Action]) -> None:
        origin.hold = HOLD_MIN  # its channel is moving: no back-off
        target.last_number += 1
        number = target.last_number
        actions.append(
            Deliver(target, delivery._replace(consumer_tag=target.consumer_tag, delivery_tag=number))
        )
        if target.auto_ack:
            actions.append(Settle(origin, delivery.delivery_tag, ack=True))
            return
        target.in_flight[number] = _InFlight(origin, delivery.delivery_tag)
        if target.credit is not None:
            target.credit -= 1

    def _reoffer(self, target: Member, actions: list[Action]) -> None:
        """Offer the parked messages of every channel, oldest channel first, to ``target``."""
        if not target.active or not target.confirmed or target.paused:
            return
        ident = target.ident
        for origin in list(self._members):
            if not origin.parked:
                continue
            for tag, parked in list(origin.parked.items()):
                if target.credit is not None and target.credit <= 0:
                    return
                if ident in parked.refused_by:
                    continue
                if not target.matches(parked.delivery.properties):
                    parked.refused_by.add(ident)
                    continue
                del origin.parked[tag]
                self._deliver(target, origin, parked.delivery, actions)

    def set_paused(self, member: Member, paused: bool) -> list[Action]:
        """The member's client socket is full (``paused``) or drained again: a paused member is
        skipped like one without credit, so messages routed from other channels cannot pile up
        in its write buffer; drained, it gets the parked messages it matches."""
        member.paused = paused
        actions: list[Action] = []
        if not paused:
            self._reoffer(member, actions)
        return actions

    # ------------------------------------------------------------------ the client's ACK / NACK
    def settle(
        self, target: Member, number: int, *, multiple: bool, ack: bool, requeue: bool = True
    ) -> list[Action]:
        """The target's client acknowledged (``ack``) or refused message ``number`` (with
        ``multiple``: every earlier one of this member too).  Unknown numbers settle nothing."""
        actions: list[Action] = []
        if multiple:
            numbers = [n for n in target.in_flight if n <= number]
        else:
            numbers = [number] if number in target.in_flight else []
        for n in numbers:
            self._settle_origin(target.in_flight.pop(n), ack, requeue, actions)
        if numbers and target.credit is not None:
            was_blocked = target.credit <= 0
            target.credit += len(numbers)
            if was_blocked:
                self._reoffer(target, actions)
        return actions

    def _settle_origin(self, flight: _InFlight, ack: bool, requeue: bool, actions: list[Action]) -> None:
        origin = flight.origin
        if origin.channel_open:
            actions.append(Settle(origin, flight.delivery_tag, ack=ack, requeue=requeue))
        if not origin.active:
            self._drop_if_done(origin)

    # ------------------------------------------------------------------ releasing parked messages
    def next_release(self) -> float | None:
        """When the oldest parked message is due to go back to the queue (None: none parked)."""
        due = [m.hold + next(iter(m.parked.values())).since for m in self._members if m.parked]
        return min(due) if due else None

    def release_due(self, now: float) -> list[Action]:
        """Requeue the parked messages whose hold time is over and that no member here matches
        (one that a member matches waits for that member's credit, as it would in ActiveMQ's
        prefetch, and is looked at again a hold time later); each origin that released doubles
        its hold time (up to ``HOLD_MAX``) until one of its messages is delivered."""
        actions: list[Action] = []
        for member in self._members:
            if not member.parked:
                continue
            due = [tag for tag, parked in member.parked.items() if parked.since + member.hold <= now]
            released = False
            for tag in due:
                parked = member.parked[tag]
                wanted = self._wanted_here(parked)  # before the pop: a selector that raises
                del member.parked[tag]  # leaves the message parked, not forgotten
                if wanted:
                    parked.since = now
                    member.parked[tag] = parked  # to the end: the oldest stays first
                    continue
                actions.append(Settle(member, tag, ack=False, requeue=True))
                released = True
            if released:
                member.hold = min(HOLD_MAX, member.hold * 2)
        return actions

    def _wanted_here(self, parked: _Parked) -> bool:
        """Whether a confirmed member matches the parked message (remembering who does not)."""
        for member in self._members:
            if not member.active or not member.confirmed or member.ident in parked.refused_by:
                continue
            if member.matches(parked.delivery.properties):
                return True
            parked.refused_by.add(member.ident)
        return False


class Dispatchers:
    """Every ``QueueDispatcher`` of one adapter process, by (vhost, queue); shared by all its
    connections (it lives in the process's SessionSettings, as ClientIds does)."""

    __slots__ = ("_by_queue",)

    def __init__(self) -> None:
        self._by_queue: dict[tuple[str, str], QueueDispatcher] = {}

    def has(self, vhost: str, queue: str) -> bool:
        """Whether ``queue`` has a dispatcher in this process (a plain subscription joins it)."""
        return (vhost, queue) in self._by_queue

    def get(self, vhost: str, queue: str) -> QueueDispatcher:
        dispatcher = self._by_queue.get((vhost, queue))
        if dispatcher is None:
            dispatcher = self._by_queue[vhost, queue] = QueueDispatcher()
        return dispatcher

    def forget_if_empty(self, vhost: str, queue: str) -> None:
        dispatcher = self._by_queue.get((vhost, queue))
        if dispatcher is not None and not dispatcher:
            del self._by_queue[vhost, queue]

    def __len__(self) -> int:
        return len(self._by_queue)
