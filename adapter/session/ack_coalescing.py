"""Coalesced ACKs: the individual ACKs one read from the client brings, written as one
``basic.ack`` with ``multiple`` when that settles exactly the deliveries the acks one by one
would settle.

Pure.  ``AckCoalescing`` owns, for one session's AMQP channel:

* the record of its unsettled deliveries: the delivery tags it saw delivered to consumers that
  need acks and not yet settled, in ascending order (a channel numbers its deliveries in the
  order it sends them);
* the run of quick individual ACKs held since the last other frame (``held``).

The pump (adapter/session/connection.py) holds each individual ACK of the quick path here and
releases the run before it handles any other frame and at the end of every pump, so no other
command on the channel changes place and nothing stays held between reads.  When the run's tags
are distinct and each is in the record, RabbitMQ accepts every one of them in any order, and
those that are every recorded tag up to some N (at least two) become one
``basic.ack(N, multiple=true)``, the others following one by one: the broker settles the same
deliveries either way.  A gap or a message of another subscription still unacknowledged only
shortens that prefix; a tag named twice or one not in the record (never delivered, or settled
already) makes the whole run go one by one, in order, exactly as without coalescing, so the
broker's answer to a wrong tag is unchanged too.

The record only ever errs on the safe side: every other settlement of the channel (the general
path's ack and nack, multiple or not, a transaction's at COMMIT, a delivery no selector matches)
is reported with ``settled``; what it cannot follow stops coalescing for the rest of the
session (``lose_sight``): a delivery a queue dispatcher takes over (it settles it on this
channel itself), a delivery for a consumer the session does not know, tags out of order, a
settlement naming a delivery not read yet (a client may guess an id: the broker settles a
delivery it has sent, which this record would then take for unsettled), or a record over its
bounds.  The record is bounded per session (``MAX_RECORDED_TAGS``) and for the
process (``TagPool``, one in ``SessionRegistries``): a session that would pass either stops
coalescing and frees its record; its ACKs are written one by one, as they were before
coalescing existed.  No client sees any difference but fewer ``basic.ack`` frames on the wire.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, Protocol

from .subscription import Subscription

__all__ = ["MAX_RECORDED_TAGS", "POOL_TAGS", "AckChannel", "AckCoalescing", "TagPool"]

# Unsettled deliveries one session records: a prefetch of up to this many keeps coalescing on.
# About 100 bytes each (a dict entry and its int), so at most about 1.6 MiB per session.
MAX_RECORDED_TAGS: Final = 16384
# Tags all sessions of a process record together: about 100 MiB at most.
POOL_TAGS: Final = 1 << 20
# A session takes room in the pool this many tags at a time (one call per chunk, not per tag).
_CHUNK: Final = 256


class AckChannel(Protocol):
    """Where the acks are written (the session's AMQP link)."""

    def ack(self, delivery_tag: int, multiple: bool) -> None: ...


class TagPool:
    """The unsettled delivery tags all sessions of a process record, and their bound."""

    __slots__ = ("limit", "taken")

    def __init__(self, limit: int = POOL_TAGS) -> None:
        self.limit = limit
        self.taken = 0

    def take(self, count: int) -> bool:
        """Room for ``count`` more tags, or False (the pool is full)."""
        if self.taken + count > self.limit:
            return False
        self.taken += count
        return True

    def give_back(self, count: int) -> None:
        self.taken -= count


class AckCoalescing:
    """One session's record of unsettled deliveries and its run of held ACKs (see the module
    docstring).  ``by_tag`` is the session's subscriptions by consumer tag (read, not owned)."""

    __slots__ = ("_by_tag", "_last", "_limit", "_pool", "_reserved", "_unsettled", "held", "seeing")

    def __init__(
        self, by_tag: Mapping[str, Subscription], pool: TagPool, limit: int = MAX_RECORDED_TAGS
    ) -> None:
        self._by_tag = by_tag
        self._pool = pool
        self._limit = limit
        self._reserved = 0  # tags of the pool this session holds room for
        self._unsettled: dict[int, None] = {}  # ascending delivery tags (a dict keeps its order)
        self._last = 0  # the highest delivery tag seen
        self.held: list[int] = []  # the run of individual ACKs the pump holds
        self.seeing = True  # False once a settlement may have passed unseen: no more coalescing

    @property
    def recorded(self) -> int:
        """How many unsettled deliveries the record holds."""
        return len(self._unsettled)

    # ------------------------------------------------------------------ the channel's events
    def delivered(self, consumer_tag: str, delivery_tag: int) -> None:
        """A delivery the client is sent (the connection's own consumers, rendered)."""
        if not self.seeing:
            return
        subscription = self._by_tag.get(consumer_tag)
        if subscription is None or subscription.dispatched or delivery_tag <= self._last:
            self.lose_sight()  # whether and where it is settled is not this record's to know
            return
        self._last = delivery_tag
        if subscription.ack_mode == "auto":
            return  # consumed without acks (no_ack): nothing to settle
        unsettled = self._unsettled
        if len(unsettled) >= self._reserved and not self._reserve():
            return
        unsettled[delivery_tag] = None

    def settled(self, delivery_tag: int, multiple: bool) -> None:
        """An ack or nack written on the channel other than by ``release``."""
        if delivery_tag > self._last:
            self.lose_sight()  # names a delivery not read yet, which the broker may have sent
            return
        unsettled = self._unsettled
        if not multiple:
            unsettled.pop(delivery_tag, None)
        elif delivery_tag == 0:
            unsettled.clear()  # AMQP: multiple with tag 0 settles every outstanding delivery
        else:
            settled = []
            for tag in unsettled:
                if tag > delivery_tag:
                    break
                settled.append(tag)
            for tag in settled:
                del unsettled[tag]

    def lose_sight(self) -> None:
        """Settlements may pass unseen from now on: forget the record, coalesce nothing more."""
        self.seeing = False
        self._unsettled.clear()
        if self._reserved:
            self._pool.give_back(self._reserved)
            self._reserved = 0

    def close(self) -> None:
        """The session is over: its room in the pool goes back."""
        self.lose_sight()

    # ------------------------------------------------------------------ the pump's run of ACKs
    def hold(self, delivery_tag: int) -> None:
        """An individual ACK of the quick path, written by ``release``."""
        self.held.append(delivery_tag)

    def release(self, channel: AckChannel) -> None:
        """Write the held ACKs: those that are every unsettled tag up to the highest of them as
        one multiple ack, the rest one each in their order; all one each, in order, unless
        every held tag is distinct and unsettled (then the broker refuses none of them, and the
        order of acks that all succeed changes nothing)."""
        held = self.held
        self.held = []
        unsettled = self._unsettled
        top = self._prefix(held) if len(held) > 1 else 0
        if top:
            channel.ack(top, True)
            for tag in held:
                if tag > top:
                    channel.ack(tag, False)
                del unsettled[tag]
            return
        for tag in held:
            channel.ack(tag, False)
            if tag > self._last:
                # a delivery not read yet: the broker may have sent it and settle it now, and
                # this record would take it for unsettled when it is read
                self.lose_sight()
            self._unsettled.pop(tag, None)

    def _prefix(self, held: list[int]) -> int:
        """The highest tag of the longest run of the oldest unsettled tags that are all held, if
        that run has two tags or more and every held tag is distinct and unsettled; else 0."""
        unsettled = self._unsettled
        members = set(held)
        if len(members) != len(held):
            return 0  # a tag named twice: the broker refuses the second one
        for tag in held:
            if tag not in unsettled:
                return 0  # never delivered, or settled already: the broker refuses it
        top = 0
        count = 0
        for tag in unsettled:  # ascending
            if tag not in members:
                break
            top = tag
            count += 1
        return top if count > 1 else 0

    def _reserve(self) -> bool:
        """Room for one more chunk of tags, per session and in the pool; else stop."""
        if self._reserved + _CHUNK > self._limit or not self._pool.take(_CHUNK):
            self.lose_sight()
            return False
        self._reserved += _CHUNK
        return True
