"""Shared topic subscriptions (``adapter.shared_subscriptions``): which subscriptions may share,
the groups that share one AMQP consumer, the MESSAGE rendered once per delivery, and how far
behind each member is allowed to fall.

A non-durable ``/topic/`` or ``/exchange/`` subscription in ``ack:auto`` whose SUBSCRIBE carries
no header beyond ``destination``, ``id``, ``ack`` and ``receipt`` (``shareable``) means the same
thing for every subscriber: every message routed to the destination, in order, forgotten by the
broker as it is sent.  Subscriptions with the same (vhost, user, passcode digest, destination)
(``ShareKey``) therefore join one ``SharedGroup`` per adapter process: one AMQP queue and
consumer, opened with the first member's credentials, whose deliveries are copied to every
member.  Anything else (a selector, ``x-queue-name`` or another queue argument, ``durable``,
``prefetch-count``, ack modes other than auto, the activemq profile) stays a plain subscription
with its own queue.

Rendering: ``Renderer.render`` escapes and encodes a delivery once; a member's MESSAGE is its own
``head`` (command and ``subscription`` line), the delivery's ``middle`` (``destination`` and the
start of ``message-id``), its own ``id_prefix`` (consumer tag and session id, escaped once at
SUBSCRIBE) and the delivery's ``tail`` (the message number, every other header, the body): four
references per member, no bytes rendered per member.

Lag: a member's lag is the bytes written for it that its socket has not taken yet, as the shell
measures them after each batch (``Registry.measured``).  A member over ``max_lag``, or, when the
members of the whole process together are over ``lag_budget``, the member furthest behind, is
evicted: the shell sends it an ERROR naming the limit and closes it at once, and the close
makes it leave its group, so it is never written to again and never slows the others.

Pure: no I/O, no clock; imports neither asyncio nor pydantic.  The shell
(``adapter/sharing/runtime.py``) owns the AMQP connections and the client sockets.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from ..mapping.destinations import DestinationKind, message_destination
from ..mapping.operations import Delivery
from ..mapping.properties import PROPERTY_HEADERS, message_headers
from ..stomp.codec import escape

__all__ = [
    "SHAREABLE_HEADERS",
    "Eviction",
    "Member",
    "Registry",
    "Renderer",
    "ShareKey",
    "SharedGroup",
    "shareable",
]

# The SUBSCRIBE headers a shared subscription may carry: none of them shapes the queue or the
# consumer (``ack`` must be auto).  Any other header, known or not, keeps the subscription plain:
# sharing must never change what a subscriber receives.
SHAREABLE_HEADERS: Final = frozenset({"destination", "id", "ack", "receipt"})

# (vhost, user, passcode digest, destination header as sent)
ShareKey = tuple[str, str, bytes, str]

_PROPERTY_NAMES: Final = frozenset(PROPERTY_HEADERS)  # need no escaping
# Bounds on the AMQP connections shared subscriptions open: one client subscribing to thousands
# of distinct topics must not make the adapter open thousands of connections to the broker.
# Past either, a SUBSCRIBE that could share gets a plain subscription instead (as with the
# setting off): a client may be the first member of this many live groups ...
MAX_OPENED_PER_CONNECTION: Final = 32
# ... and a process holds at most this many groups
MAX_GROUPS: Final = 1000

# bodies this large are not copied into the shared tail, but written as their own piece
_SEPARATE_BODY: Final = 64 * 1024


def shareable(kind: DestinationKind, headers: Mapping[str, str]) -> bool:
    """Whether a SUBSCRIBE to a destination of ``kind`` with ``headers`` may share."""
    if kind is not DestinationKind.TOPIC and kind is not DestinationKind.EXCHANGE:
        return False
    if headers.get("ack", "auto") != "auto":
        return False
    return SHAREABLE_HEADERS.issuperset(headers)


@dataclass(slots=True, eq=False)
class Member:
    """One STOMP subscription in a group.  ``subscriber`` is the shell's (the connection it
    writes to); ``lag`` the bytes it has not read yet, as last measured."""

    subscriber: object
    consumer_tag: str
    head: bytes
    id_prefix: bytes
    lag: int = 0
    group: SharedGroup | None = None


@dataclass(slots=True, eq=False)
class SharedGroup:
    """The members of one shared subscription, in the order they joined.  ``link`` is the
    shell's (the AMQP connection that consumes for the group)."""

    key: ShareKey
    members: dict[Member, None] = field(default_factory=dict)
    link: object = None
    # every member written to since the shell last measured them (one batch of deliveries)
    touched: bool = False

    def add_member(self, member: Member) -> None:
        member.group = self
        self.members[member] = None

    def leave(self, member: Member) -> bool:
        """True when ``member`` was the last one: the group's consumer should end."""
        self.members.pop(member, None)
        member.group = None
        return not self.members


@dataclass(frozen=True, slots=True)
class Eviction:
    """A member cut off for lag: ``lag`` bytes waited against ``limit`` (``setting`` names it)."""

    member: Member
    lag: int
    limit: int
    setting: str


class Registry:
    """The shared subscriptions of one adapter process, and their lag accounting.

    ``max_lag``: bytes one member may have waiting; ``lag_budget``: bytes all members together
    may have waiting (adapter.shared_subscription_max_lag, adapter.shared_subscription_lag_budget).
    """

    MAX_LAG_SETTING: Final = "adapter.shared_subscription_max_lag"
    LAG_BUDGET_SETTING: Final = "adapter.shared_subscription_lag_budget"

    def __init__(
        self, *, max_lag: int, lag_budget: int, trailing_lf: bool = True, reauthorise_seconds: float = 60.0
    ) -> None:
        self.max_lag = max_lag
        self.lag_budget = lag_budget
        # how long the broker's word that a group's user may read it stands: a later member's
        # join always asks again; a group with no join asks after this long
        # (adapter.amqp_connection_max_age_seconds, as for pooled and shared connections)
        self.reauthorise_seconds = reauthorise_seconds
        self.renderer = Renderer(trailing_lf)
        self.groups: dict[ShareKey, SharedGroup] = {}
        self.total_lag = 0
        # members with bytes waiting: the candidates when the process is over its budget
        self._lagging: dict[Member, None] = {}
        # counters for the metrics
        self.evicted = 0
        self.opened = 0

    def group(self, key: ShareKey, opened_here: int = 0) -> tuple[SharedGroup | None, bool]:
        """The group of ``key``, and whether it is new (its link must be opened); None when a
        new one would pass the bounds (``opened_here``: the live groups the asking connection
        opened), so the subscription is made plainly."""
        group = self.groups.get(key)
        if group is not None:
            return group, False
        if opened_here >= MAX_OPENED_PER_CONNECTION or len(self.groups) >= MAX_GROUPS:
            return None, False
        group = self.groups[key] = SharedGroup(key)
        self.opened += 1
        return group, True

    def forget(self, group: SharedGroup) -> None:
        """The group ended (last member gone, or the broker ended its consumer): a later
        subscription of its key starts a new one."""
        if self.groups.get(group.key) is group:
            del self.groups[group.key]

    def leave(self, member: Member) -> SharedGroup | None:
        """``member`` leaves its group; the group if that was its last member (forgotten here;
        the shell ends its link)."""
        self._set_lag(member, 0)
        group = member.group
        if group is None:
            return None
        if group.leave(member):
            self.forget(group)
            return group
        return None

    @property
    def members(self) -> int:
        return sum(len(group.members) for group in self.groups.values())

    def measured(self, member: Member, lag: int) -> list[Eviction]:
        """The shell measured ``member``'s waiting bytes after a batch: the members to evict
        (the shell closes each; its close makes it ``leave``)."""
        self._set_lag(member, lag)
        evictions: list[Eviction] = []
        if lag > self.max_lag:
            evictions.append(Eviction(member, lag, self.max_lag, self.MAX_LAG_SETTING))
            self._evict(member)
        while self.total_lag > self.lag_budget and self._lagging:
            worst = max(self._lagging, key=_lag_of)
            evictions.append(Eviction(worst, worst.lag, self.lag_budget, self.LAG_BUDGET_SETTING))
            self._evict(worst)
        return evictions

    def _evict(self, member: Member) -> None:
        # it stays in its group until the shell has closed its connection, whose close makes it
        # leave (``leave``); its lag no longer counts, so it is never chosen twice
        self.evicted += 1
        self._set_lag(member, 0)

    def _set_lag(self, member: Member, lag: int) -> None:
        self.total_lag += lag - member.lag
        member.lag = lag
        if lag:
            self._lagging[member] = None
        else:
            self._lagging.pop(member, None)


def _lag_of(member: Member) -> int:
    return member.lag


class Renderer:
    """The shared parts of a MESSAGE, made once per delivery: ``middle`` (``destination`` and
    ``message-id:``) and ``tail`` (the message number, ``redelivered``, the properties' headers,
    ``content-length``, the blank line, and for a small body the body and the trailer).
    The headers are those and in the order ``adapter/session/frames.py`` renders for a plain
    subscription."""

    __slots__ = ("_destinations", "trailer")

    def __init__(self, trailing_lf: bool) -> None:
        self.trailer = b"\0\n" if trailing_lf else b"\0"
        self._destinations: dict[tuple[str, str], bytes] = {}

    def render(self, delivery: Delivery) -> tuple[bytes, ...]:
        """The delivery's pieces after a member's ``id_prefix``: (middle, tail) or, for a large
        body, (middle, tail, body, trailer), so the body is never copied."""
        _tag, number, redelivered, exchange, routing_key, properties, body = delivery
        middle = self._destinations.get((exchange, routing_key))
        if middle is None:
            text = escape(message_destination(exchange, routing_key))
            middle = f"destination:{text}\nmessage-id:".encode("utf-8", "surrogateescape")
            if len(self._destinations) < 4096:  # bounded: wildcard bindings see many keys
                self._destinations[(exchange, routing_key)] = middle
        lines = [str(number), "\nredelivered:true\n" if redelivered else "\nredelivered:false\n"]
        pairs = message_headers(properties)
        if pairs:
            append = lines.append
            for name, value in pairs:
                escaped = name if name in _PROPERTY_NAMES else escape(name)
                append(f"{escaped}:{escape(value)}\n")
        if body:
            lines.append(f"content-length:{len(body)}\n")
        lines.append("\n")
        head = "".join(lines).encode("utf-8", "surrogateescape")
        if len(body) >= _SEPARATE_BODY:
            return middle, head, body, self.trailer
        return middle, b"".join((head, body, self.trailer))


def member_head(sub_id: str | None, consumer_tag: str, session_id: str) -> tuple[bytes, bytes]:
    """A member's own bytes of every MESSAGE: the command and ``subscription`` line, and the
    escaped ``message-id`` up to its number (as frames.py renders them for a plain one)."""
    head = "MESSAGE\n"
    if sub_id is not None:
        head += f"subscription:{escape(sub_id)}\n"
    prefix = escape(f"{consumer_tag}@@{session_id}@@")
    return head.encode("utf-8", "surrogateescape"), prefix.encode("utf-8", "surrogateescape")
