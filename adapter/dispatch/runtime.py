"""The shell of the queue dispatchers (activemq profile, selectors on a queue): runs their actions.

``adapter/dispatch/rules.py`` decides which member gets each delivery, what is parked and what
is released; this module executes those decisions across connections (a delivery that arrived
on one client's channel may be rendered to another client, and its ACK becomes a ``basic.ack``
on the first client's channel) and arms each dispatcher's release timer.  One ``DispatchMembership``
per client connection holds that connection's members; the connection is their ``Owner``, and
its ``DispatchGlue`` (made with the link) schedules the coalesced acks and leaves on close.
Nothing here runs for a connection without a selector subscription on a queue.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Protocol

from ..mapping import operations as ops
from . import rules as dispatch
from .rules import Deliver, Dispatchers, Member, Owner, QueueDispatcher

log = logging.getLogger("adapter.server.dispatching")  # its name before the move, kept for log filters


def run(actions: Iterable[dispatch.Action]) -> None:
    """Execute a dispatcher's actions, each on the connection it concerns."""
    for action in actions:
        if isinstance(action, Deliver):
            action.target.owner.deliver_dispatched(action.delivery)
        else:
            action.origin.owner.settle_dispatched(action.delivery_tag, action.ack, action.requeue)


def arm_release(dispatcher: QueueDispatcher, loop: asyncio.AbstractEventLoop) -> None:
    """Point the dispatcher's timer at its next due parked message (none: no timer)."""
    due = dispatcher.next_release()
    timer = dispatcher.timer
    if isinstance(timer, asyncio.TimerHandle):
        if due is not None and not timer.cancelled() and timer.when() <= due:
            return  # fires in time (early is fine: release_due checks each message)
        timer.cancel()
    dispatcher.timer = None
    if due is not None:
        dispatcher.timer = loop.call_at(due, _release, dispatcher, loop)


def _release(dispatcher: QueueDispatcher, loop: asyncio.AbstractEventLoop) -> None:
    dispatcher.timer = None
    try:
        run(dispatcher.release_due(loop.time()))
    except Exception:
        # a bug in one evaluation must not end the releases of this queue for good (its held
        # messages would wait for their channels to close); what failed stays parked and is
        # looked at again a hold time later, not in a busy loop
        log.exception("queue dispatcher: releasing held messages failed; retrying later")
        dispatcher.timer = loop.call_later(dispatch.HOLD_MIN, _release, dispatcher, loop)
        return
    arm_release(dispatcher, loop)


class Channel(Protocol):
    """The AMQP channel acks and nacks are written to (the session's ``SessionLink``)."""

    def ack(self, delivery_tag: int, multiple: bool) -> None: ...

    def nack(self, delivery_tag: int, multiple: bool, requeue: bool) -> None: ...


class FlushableChannel(Channel, Protocol):
    """A channel whose writes are buffered until ``flush`` (the session's ``SessionLink``)."""

    def flush(self) -> None: ...


class DispatchMembership:
    """One connection's dispatched subscriptions: their dispatcher and member, by consumer tag.

    It also writes the acks the dispatchers ask for on this connection's channel, coalesced:
    every delivery of a dispatched subscription passes through here (``outstanding``), so when
    the channel carries no other unsettled deliveries (``coalesce``: the session never had a
    client-ack subscription without a selector on a queue), the acks gathered in one loop turn
    below the lowest still outstanding tag become one ``basic.ack`` with ``multiple``.  One ack
    per message cost RabbitMQ about as much CPU as the delivery itself (docs/performance.md)."""

    __slots__ = (
        "_departed",
        "_dispatchers",
        "_last_numbers",
        "_loop",
        "_members",
        "_owner",
        "_vhost",
        "outstanding",
        "pending_acks",
    )

    def __init__(
        self, owner: Owner, dispatchers: Dispatchers, vhost: str, loop: asyncio.AbstractEventLoop
    ) -> None:
        self._owner = owner
        self._dispatchers = dispatchers
        self._vhost = vhost
        self._loop = loop
        self._members: dict[str, tuple[QueueDispatcher, Member, str]] = {}
        # members that left (UNSUBSCRIBE) while this channel is open: told when it closes
        self._departed: list[tuple[QueueDispatcher, Member, str]] = []
        # delivery tags of this channel handed to a dispatcher and not yet settled on the wire
        self.outstanding: set[int] = set()
        self.pending_acks: list[int] = []
        # the last message number of each consumer tag that left: a later subscription with the
        # same tag numbers its messages after it (QueueDispatcher.add_member)
        self._last_numbers: dict[str, int] = {}

    def execute(self, op: ops.DispatchOp) -> None:
        now = self._loop.time()
        if isinstance(op, ops.DispatchDelivery):
            entry = self._members.get(op.delivery.consumer_tag)
            if entry is None:  # raced its UNSUBSCRIBE: back to the queue
                self._owner.settle_dispatched(op.delivery.delivery_tag, False, True)
                return
            dispatcher, member, _queue = entry
            self.outstanding.add(op.delivery.delivery_tag)
            run(dispatcher.offer(member, op.delivery, now))
            if member.parked:
                arm_release(dispatcher, self._loop)
        elif isinstance(op, ops.DispatchSettle):
            entry = self._members.get(op.consumer_tag)
            if entry is not None:
                dispatcher, member, _queue = entry
                run(
                    dispatcher.settle(member, op.number, multiple=op.multiple, ack=op.ack, requeue=op.requeue)
                )
        elif isinstance(op, ops.JoinDispatch):
            # not a target yet: the broker may still refuse the consume (ActivateDispatch)
            dispatcher = self._dispatchers.get(self._vhost, op.queue)
            member = dispatcher.add_member(
                self._owner,
                op.consumer_tag,
                op.matches,
                auto_ack=op.auto_ack,
                credit=op.credit,
                last_number=self._last_numbers.get(op.consumer_tag, 0),
            )
            self._members[op.consumer_tag] = (dispatcher, member, op.queue)
        elif isinstance(op, ops.ActivateDispatch):
            entry = self._members.get(op.consumer_tag)
            if entry is not None:
                dispatcher, member, _queue = entry
                run(dispatcher.activate(member))
                arm_release(dispatcher, self._loop)
        else:
            entry = self._members.pop(op.consumer_tag, None)
            if entry is not None:
                dispatcher, member, queue = entry
                self._last_numbers[op.consumer_tag] = member.last_number
                run(dispatcher.leave(member, channel_open=True))
                if dispatcher.members and member in dispatcher.members:
                    self._departed.append(entry)
                self._forget(dispatcher, queue)

    def settle(self, channel: Channel, delivery_tag: int, ack: bool, requeue: bool) -> bool:
        """Settle a tag of this channel: a nack at once, an ack gathered for ``flush_acks``.
        True when an ack waits for the flush."""
        if ack:
            self.pending_acks.append(delivery_tag)
            return True
        self.outstanding.discard(delivery_tag)
        channel.nack(delivery_tag, False, requeue)
        return False

    def flush_acks(self, channel: Channel, coalesce: bool) -> None:
        """Write the gathered acks: one multiple ack for those below every outstanding tag
        (when ``coalesce``), one each for the rest."""
        pending, self.pending_acks = self.pending_acks, []
        if not pending:
            return
        outstanding = self.outstanding
        outstanding.difference_update(pending)
        if coalesce and len(pending) > 1:
            lowest = min(outstanding, default=None)
            below = [tag for tag in pending if lowest is None or tag < lowest]
            if len(below) > 1:
                channel.ack(max(below), True)
                pending = [tag for tag in pending if lowest is not None and tag > lowest]
        for tag in pending:
            channel.ack(tag, False)

    def set_paused(self, paused: bool) -> None:
        """The connection's client socket is full (or drained again): see QueueDispatcher.set_paused."""
        for dispatcher, member, _queue in self._members.values():
            run(dispatcher.set_paused(member, paused))

    def channel_closed(self) -> None:
        """The connection's AMQP channel is closing or gone: every member leaves; the broker
        requeues what was unacknowledged on the channel."""
        members, self._members = list(self._members.values()), {}
        departed, self._departed = self._departed, []
        for dispatcher, member, queue in members:
            run(dispatcher.leave(member, channel_open=False))
            self._forget(dispatcher, queue)
        for dispatcher, member, queue in departed:
            dispatcher.channel_closed(member)
            self._forget(dispatcher, queue)

    def _forget(self, dispatcher: QueueDispatcher, queue: str) -> None:
        arm_release(dispatcher, self._loop)
        self._dispatchers.forget_if_empty(self._vhost, queue)


class DispatchGlue:
    """A connection's side of the queue dispatchers, made on its first dispatched subscription:
    its ``DispatchMembership``, and the acks the dispatchers settle on its channel, written coalesced
    one loop turn later (``settle``, then ``flush``).  ``channel`` gives the connection's AMQP
    channel now (None once it is gone); ``coalesce`` says whether acks may be merged (the
    session never had a client-ack subscription that is not dispatched)."""

    __slots__ = ("_channel", "_coalesce", "_flush_handle", "_loop", "link")

    def __init__(
        self,
        link: DispatchMembership,
        loop: asyncio.AbstractEventLoop,
        channel: Callable[[], FlushableChannel | None],
        coalesce: Callable[[], bool],
    ) -> None:
        self.link = link
        self._loop = loop
        self._channel = channel
        self._coalesce = coalesce
        self._flush_handle: asyncio.Handle | None = None

    def execute(self, op: ops.DispatchOp) -> None:
        self.link.execute(op)

    def settle(self, channel: FlushableChannel, delivery_tag: int, ack: bool, requeue: bool) -> None:
        """A dispatcher settles a delivery of this channel: a nack is written now, acks are
        gathered and the flush is scheduled for the end of this loop turn."""
        self.link.settle(channel, delivery_tag, ack, requeue)
        if self._flush_handle is None:
            self._flush_handle = self._loop.call_soon(self.flush)

    def flush(self) -> None:
        """Write the gathered acks and push the channel's buffer out."""
        self._flush_handle = None
        channel = self._channel()
        if channel is None:
            return
        self.link.flush_acks(channel, coalesce=self._coalesce())
        channel.flush()

    def set_paused(self, paused: bool) -> None:
        self.link.set_paused(paused)

    def leave(self) -> None:
        """The channel is closing or gone: the acks gathered so far first (they are the
        client's, or auto mode's, answer), then every member leaves."""
        channel = self._channel()
        if channel is not None:
            self.link.flush_acks(channel, coalesce=self._coalesce())
        self.link.channel_closed()
