"""Behaviour profiles: which STOMP dialect the adapter speaks, as one object of rules.

Owns the decisions that differ between the ``rabbitmq`` profile (the default: RabbitMQ's STOMP
plugin 3.10.8, unchanged but for the declare flags of the broker's generation, ``broker``) and
the ``activemq`` profile (the STOMP idioms of Apache ActiveMQ 5.x applications,
docs/migration-activemq.md).  The session asks its profile's rules at each point
where the two differ instead of testing the profile name, so the differences are all here:

* the ``queue.declare`` of a SEND (ActiveMQ: ``/queue/NAME`` is always a shared durable queue);
* the publish properties of a SEND (ActiveMQ: ``expires`` becomes the AMQP TTL);
* which destinations SUBSCRIBE accepts (ActiveMQ: ``/temp-queue/NAME`` too) and which it parses
  (ActiveMQ: ``/temp-topic/NAME``, on SUBSCRIBE and in ``reply-to``);
* the prefetch of a SUBSCRIBE (ActiveMQ: ``activemq.prefetchSize`` as well, and 1000 for a
  client-ack subscription that gives none);
* the SUBSCRIBE plan (ActiveMQ: ``/topic/`` wildcards ``*`` and ``>``, durable subscriptions
  named by ``client-id`` + ``activemq.subscriptionName``);
* the selector of a subscription (ActiveMQ: the ``selector`` header, compiled once; on a queue
  it is applied by the queue's dispatcher, adapter/dispatch/rules.py);
* the queue an UNSUBSCRIBE removes;
* queue browsing (``browser:true``): which SUBSCRIBE is one, and its bounds;
* scheduled delivery: ``AMQ_SCHEDULED_DELAY`` read (its plan: adapter/mapping/scheduled.py);
* which SEND headers send a SEND the general way (``general_send_headers``);
* virtual topics: ``/queue/Consumer.<group>.VirtualTopic.<X>`` bound to ``VirtualTopic.<X>``;
* whether a ``client-id`` may log in (ActiveMQ: one connection per client id, ``ClientIds``).

These are rules: questions with answers, and no state of a connection beyond the broker's
generation.  What a profile adds to a connection's state and steps (NACK to a dead-letter queue,
selector subscriptions, dispatched subscriptions, temporary topics) is its session extension,
adapter/session/activemq.py, which the session calls at fixed hooks (adapter/session/extension.py).

Pure: standard library and the sibling mapping modules only; the clock is injected.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import time
from collections.abc import Callable, Container, Mapping
from enum import StrEnum
from typing import Final

from .destinations import (
    QUEUE_ARGUMENTS,
    TEMP_TOPIC_PREFIX,
    BrokerGeneration,
    Destination,
    DestinationError,
    DestinationKind,
    ProcessingError,
    QueueParams,
    SubscribeTarget,
    check_not_temp_queue,
    durable_unsubscribe_queue,
    is_durable,
    message_destination,
    parse_destination,
    parse_temp_topic,
    plugin_integer,
    queue_arguments,
    send_queue_declare,
    subscribe_target,
)
from .exchanges import DECLARE_HEADER
from .operations import Delivery
from .properties import MessageProperties, field_value_text, properties_from_send
from .scheduled import DELAY_HEADER, REFUSED_HEADERS, scheduled_delay
from .selector import Lookup, Selector, SelectorError, Value, compile_selector

__all__ = [
    "PROFILES",
    "ActiveMQRules",
    "ClientIds",
    "Profile",
    "RabbitMQRules",
    "activemq_binding_key",
    "BROWSE_BYTES",
    "BROWSE_LIMIT",
    "browses",
    "check_transformation",
    "client_id_in_use",
    "durable_subscription_queue",
    "expires_to_ttl",
    "rules_for",
    "selector_lookup",
]


class Profile(StrEnum):
    RABBITMQ = "rabbitmq"
    ACTIVEMQ = "activemq"


PROFILES: Final = tuple(p.value for p in Profile)


class RabbitMQRules:
    """The plugin's rules (docs/destinations.md): the default profile, what the adapter always did."""

    profile: Profile = Profile.RABBITMQ
    # NACK sends the message to a dead-letter queue (ActiveMQ) instead of basic.nack (the plugin)
    dead_letter_queue: str | None = None
    # SEND to "/queue/a,/topic/b" publishes to each (ActiveMQ's composite destinations); the
    # plugin reads the comma as part of the name
    composite_destinations: bool = False
    # whose plugin's queue.declare flags to use: the broker's generation, set by the session
    # once its AMQP connection is open (docs/compatibility.md#broker-generations)
    broker: BrokerGeneration = BrokerGeneration.V3_10
    # a SEND with any of these headers goes the general way (Session.quick_send declines it):
    # the x- queue arguments are checked on every SEND, and a declare-exchange may ask for a
    # declare (adapter/mapping/exchanges.py)
    general_send_headers: frozenset[str] = frozenset(QUEUE_ARGUMENTS) | {DECLARE_HEADER}

    def client_id(self, connect_headers: Mapping[str, str]) -> str | None:
        """The connection's client id (named durable subscriptions); the plugin has none."""
        return None

    def parse_destination(self, raw: str) -> Destination:
        """A SEND or SUBSCRIBE destination (docs/destinations.md#parsing)."""
        return parse_destination(raw)

    def temp_topic_reply_to(self, reply_to: str) -> Destination | None:
        """The temporary topic a ``reply-to`` names; the plugin has none (``/temp-topic/x`` is an
        unknown destination to it, and a reply-to it copies unchanged)."""
        return None

    def send_queue_params(
        self, dest: Destination, headers: Mapping[str, str], declared_queues: Container[str]
    ) -> QueueParams | None:
        return send_queue_declare(dest, headers, declared_queues, self.broker)

    def send_properties(self, headers: Mapping[str, str], reply_to: str | None) -> MessageProperties | None:
        """The publish properties of a SEND, or None when the message must not be published."""
        return properties_from_send(headers, reply_to)

    def check_subscribe_destination(self, dest: Destination) -> None:
        check_not_temp_queue(dest, "SUBSCRIBE")

    def prefetch(self, headers: Mapping[str, str]) -> int | None:
        """The ``basic.qos`` prefetch a SUBSCRIBE asks for (docs/destinations.md#common-steps)."""
        value = headers.get("prefetch-count")
        if value is None:
            return None
        count = plugin_integer(value, strip=True)
        if count is None:
            raise ProcessingError(f"prefetch-count must be an integer, got {value!r}")
        if not 0 <= count <= 65535:
            raise ProcessingError(f"prefetch-count must be between 0 and 65535, got {value!r}")
        return count

    def subscribe_target(
        self,
        dest: Destination,
        headers: Mapping[str, str],
        sub_id: str | None,
        default_topic_exchange: str,
        client_id: str | None,
    ) -> SubscribeTarget:
        return subscribe_target(dest, headers, sub_id, default_topic_exchange, generation=self.broker)

    def selector(self, dest: Destination, headers: Mapping[str, str]) -> Selector | None:
        """The plugin ignores ``selector``: every message is delivered."""
        return None

    def unsubscribe_queue(
        self,
        subscribed: Destination | None,
        headers: Mapping[str, str],
        sub_id: str | None,
        client_id: str | None,
    ) -> str | None:
        """The queue an UNSUBSCRIBE deletes after cancelling (docs/destinations.md#durable-subscriptions)."""
        if subscribed is None or sub_id is None or not is_durable(headers):
            return None
        return durable_unsubscribe_queue(subscribed, headers, sub_id)

    def names_durable_subscription(self, headers: Mapping[str, str]) -> bool:
        """Whether an UNSUBSCRIBE names a durable subscription that may have no consumer now."""
        return False

    def exclusive_consumer(self, headers: Mapping[str, str]) -> bool:
        """Whether the subscription's basic.consume is exclusive; the plugin never asks."""
        return False

    def virtual_topic_binding(self, dest: Destination, topic_exchange: str) -> tuple[str, str] | None:
        """The (exchange, key) a queue subscription binds its queue to; the plugin binds none."""
        return None

    def scheduled_delay(self, headers: Mapping[str, str]) -> int | None:
        """The delay (ms) a SEND asks for; the plugin passes scheduling headers on unread."""
        return None

    def plain_joins_dispatcher(self, headers: Mapping[str, str]) -> bool:
        """Whether a queue subscription without a selector joins the queue's dispatcher, when
        the process has one (adapter/dispatch/rules.py); the plugin has no dispatchers."""
        return False


class ClientIds:
    """The ``client-id`` values of the connections logged in now, and who holds each.

    ActiveMQ refuses a second connection with a client id already connected
    (``InvalidClientIDException``).  One registry is shared by every connection of one adapter
    process (it lives in the process's SessionSettings), so the check is per process: two
    adapter processes, or an adapter and a plain AMQP client, do not see each other's ids.
    """

    __slots__ = ("_owners",)

    def __init__(self) -> None:
        self._owners: dict[str, object] = {}

    def claim(self, client_id: str, owner: object) -> bool:
        """Take ``client_id`` for ``owner``; False when another owner holds it."""
        holder = self._owners.setdefault(client_id, owner)
        return holder is owner

    def release(self, client_id: str, owner: object) -> None:
        """Give ``client_id`` back, if ``owner`` holds it."""
        if self._owners.get(client_id) is owner:
            del self._owners[client_id]

    def __contains__(self, client_id: object) -> bool:
        return client_id in self._owners

    def __len__(self) -> int:
        return len(self._owners)


def client_id_in_use(client_id: str) -> tuple[str, str]:
    """The ERROR (message, body) for a CONNECT whose client id is connected already, in
    ActiveMQ's words: ``Client: <id> already connected`` (ActiveMQ adds its broker's name and the
    holder's address).  The header has no colon after ``Client``, because header values are
    escaped (``\\c``) for every STOMP version, as the plugin does; the body has ActiveMQ's form."""
    body = (
        f"javax.jms.InvalidClientIDException: Client: {client_id} already connected "
        "(client ids are unique per adapter process)\n"
    )
    return f"Client {client_id} already connected", body


# ActiveMQ's SUBSCRIBE / UNSUBSCRIBE headers naming a durable topic subscription, in the order
# ActiveMQ reads them.
# The prefetch of a client-ack subscription that asks for none: ActiveMQ's default for queue
# consumers (its topic consumers default to 32766, durable ones to 100; one bound for all here).
DEFAULT_PREFETCH: Final = 1000
SUBSCRIPTION_NAME_HEADERS: Final = ("activemq.subscriptionName", "durable-subscription-name")
_DURABLE_QUEUE_PREFIX: Final = "activemq-durable:"
_MAX_QUEUE_NAME_BYTES: Final = 255


def durable_subscription_queue(client_id: str, subscription_name: str) -> str:
    """The queue of ActiveMQ durable subscription (client id, name).

    Readable when it fits (``activemq-durable:<len(client id)>:<client id>:<name>``: the length
    keeps ``a.b``+``c`` and ``a``+``b.c`` apart), otherwise the prefix and an MD5 of both, because
    AMQP queue names stop at 255 bytes.
    """
    name = f"{_DURABLE_QUEUE_PREFIX}{len(client_id)}:{client_id}:{subscription_name}"
    if len(name.encode("utf-8", "surrogateescape")) <= _MAX_QUEUE_NAME_BYTES:
        return name
    digest = hashlib.md5(name.encode("utf-8", "surrogateescape")).digest()
    return _DURABLE_QUEUE_PREFIX + base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def activemq_binding_key(topic: str) -> str:
    """The AMQP topic pattern for an ActiveMQ topic name: ``*`` is one word in both, ActiveMQ's
    ``>`` (any number of words) is AMQP's ``#``.  Only a whole word is a wildcard, in both.

    A word ``#`` is refused: in ActiveMQ it is a literal name, in AMQP it would match everything,
    and no AMQP pattern matches a literal ``#`` only.
    """
    words = topic.split(".")
    if "#" in words:
        raise DestinationError(
            "Invalid destination",
            f"'/topic/{topic}': '#' is a wildcard in RabbitMQ and cannot be subscribed to by name\n",
        )
    return ".".join("#" if word == ">" else word for word in words)


def expires_to_ttl(value: str, now_ms: int) -> str | None | bool:
    """The AMQP ``expiration`` (remaining milliseconds, as text) for ActiveMQ's ``expires``
    (absolute milliseconds since the epoch; 0 = never).

    None: no TTL (0).  False: already expired, the message must not be published.  A value that
    is not an integer raises ProcessingError, as ActiveMQ refuses it.
    """
    expires = plugin_integer(value, strip=True)
    if expires is None:
        raise ProcessingError(
            f"Header 'expires' must be an integer (milliseconds since the epoch), got {value!r}"
        )
    if expires == 0:
        return None
    remaining = expires - now_ms
    if remaining <= 0:
        return False
    return str(remaining)


_DELIVERY_MODES: Final = {2: "PERSISTENT"}
_JMS_DEFAULT_PRIORITY: Final = 4


def _jms_field(properties: MessageProperties, name: str) -> Value:
    if name == "JMSType":
        return properties.type
    if name == "JMSPriority":
        return _JMS_DEFAULT_PRIORITY if properties.priority is None else properties.priority
    if name == "JMSCorrelationID":
        return properties.correlation_id
    if name == "JMSMessageID":
        return properties.message_id
    if name == "JMSTimestamp":
        return properties.timestamp
    if name == "JMSDeliveryMode":
        return _DELIVERY_MODES.get(properties.delivery_mode or 0, "NON_PERSISTENT")
    if name == "JMSExpiration":
        headers = properties.headers or {}
        value = headers.get("expires")
        return 0 if value is None else _scalar(value)
    return None


def _scalar(value: object) -> Value:
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return field_value_text(value)


def selector_lookup(properties: MessageProperties) -> Lookup:
    """What a selector sees of one delivered message: the JMS header fields from the AMQP
    properties, every other name from the AMQP headers table (the SEND's custom headers)."""
    headers = properties.headers or {}

    def lookup(name: str) -> Value:
        if name.startswith("JMS"):
            return _jms_field(properties, name)
        return _scalar(headers.get(name))

    return lookup


class ActiveMQRules(RabbitMQRules):
    """Apache ActiveMQ 5.x's STOMP idioms (docs/migration-activemq.md)."""

    profile: Profile = Profile.ACTIVEMQ
    dead_letter_queue: str | None = "ActiveMQ.DLQ"  # ActiveMQ's default dead-letter strategy
    composite_destinations: bool = True
    # and a scheduled SEND, planned by the general path (Publishing.send, the extension)
    general_send_headers: frozenset[str] = frozenset(QUEUE_ARGUMENTS) | {
        DECLARE_HEADER,
        DELAY_HEADER,
        *REFUSED_HEADERS,
    }

    def __init__(self, clock_ms: Callable[[], int] | None = None) -> None:
        self._clock_ms = clock_ms or (lambda: time.time_ns() // 1_000_000)

    def client_id(self, connect_headers: Mapping[str, str]) -> str | None:
        return connect_headers.get("client-id")

    def parse_destination(self, raw: str) -> Destination:
        """The plugin's destinations and ``/temp-topic/NAME``: a temporary topic private to the
        connection, kept in a private queue as ``/temp-queue/NAME`` is (docs/migration-activemq.md)."""
        if raw.startswith(TEMP_TOPIC_PREFIX):
            return parse_temp_topic(raw)
        return parse_destination(raw)

    def temp_topic_reply_to(self, reply_to: str) -> Destination | None:
        if not reply_to.startswith(TEMP_TOPIC_PREFIX):
            return None
        try:
            return parse_temp_topic(reply_to)
        except DestinationError as error:  # as for an unparsable reply-to:/temp-queue/...
            raise ProcessingError(f"unparsable reply-to {reply_to!r}: {error.message}") from None

    def send_queue_params(
        self, dest: Destination, headers: Mapping[str, str], declared_queues: Container[str]
    ) -> QueueParams | None:
        # An ActiveMQ queue is shared and kept whatever the message's persistence: never the
        # plugin's exclusive auto-delete queue of a persistent:false SEND.
        queue_arguments(headers)  # x- arguments checked for every destination, as in the plugin
        check_not_temp_queue(dest, "SEND")
        if dest.kind is DestinationKind.QUEUE and dest.name not in declared_queues:
            return _shared_queue(headers)
        return None

    def send_properties(self, headers: Mapping[str, str], reply_to: str | None) -> MessageProperties | None:
        check_transformation(headers, "SEND")
        properties = properties_from_send(headers, reply_to)
        expires = headers.get("expires")
        if expires is not None:
            ttl = expires_to_ttl(expires, self._clock_ms())
            if ttl is False:
                return None
            if isinstance(ttl, str) and properties.expiration is None:
                properties.expiration = ttl
        return properties

    def check_subscribe_destination(self, dest: Destination) -> None:
        return None  # /temp-queue/NAME is a queue of this connection (the activemq extension subscribes it)

    def prefetch(self, headers: Mapping[str, str]) -> int | None:
        if "prefetch-count" in headers:
            return super().prefetch(headers)
        value = headers.get("activemq.prefetchSize")
        if value is None:
            # ActiveMQ's default queue prefetch for a subscription that acknowledges: without
            # it the broker would push the whole queue, and the adapter keep every body of it
            # for a NACK.  Auto-ack consumes without acks, where a prefetch means nothing.
            return None if headers.get("ack", "auto") == "auto" else DEFAULT_PREFETCH
        size = plugin_integer(value, strip=True)
        if size is None or size < 1:
            # AMQP's prefetch 0 means unlimited, the opposite of ActiveMQ's 0 (a pulling consumer)
            raise ProcessingError(f"activemq.prefetchSize must be a positive integer, got {value!r}")
        return min(size, 65535)  # basic.qos carries 16 bits; beyond that the difference is moot

    def subscribe_target(
        self,
        dest: Destination,
        headers: Mapping[str, str],
        sub_id: str | None,
        default_topic_exchange: str,
        client_id: str | None,
    ) -> SubscribeTarget:
        check_transformation(headers, "SUBSCRIBE")
        browses(headers, dest)  # refused on a topic
        if dest.kind is DestinationKind.QUEUE:
            queue_arguments(headers)
            binding = self.virtual_topic_binding(dest, default_topic_exchange)
            exchange, key = binding if binding is not None else (None, "")
            return SubscribeTarget(dest.name, _shared_queue(headers), exchange, key)
        if dest.kind is not DestinationKind.TOPIC:
            return subscribe_target(dest, headers, sub_id, default_topic_exchange, generation=self.broker)
        key = activemq_binding_key(dest.name)
        exchange = default_topic_exchange
        name = _subscription_name(headers)
        if name is None:
            plan = subscribe_target(dest, headers, sub_id, default_topic_exchange, generation=self.broker)
            return SubscribeTarget(plan.queue, plan.declare, plan.bind_exchange, key)
        if client_id is None:
            raise DestinationError(
                "Missing client-id",
                f"A durable subscription ('{name}') needs a 'client-id' header on CONNECT\n",
            )
        params = QueueParams(
            durable=True, auto_delete=False, exclusive=False, arguments=queue_arguments(headers)
        )
        return SubscribeTarget(durable_subscription_queue(client_id, name), params, exchange, key)

    def selector(self, dest: Destination, headers: Mapping[str, str]) -> Selector | None:
        """The compiled ``selector``.  On a topic (each subscription has its own queue) the
        session drops what it does not match; on a queue (competing consumers) the process's
        dispatcher of the queue routes each message to a matching consumer
        (adapter/dispatch/rules.py)."""
        text = headers.get("selector")
        if text is None:
            return None
        if dest.kind not in _SELECTOR_KINDS:
            # a /temp-queue/ or /reply-queue/ has one consumer: a selector there would only hide
            # messages (ActiveMQ's temporary destinations are private to their connection too)
            raise DestinationError(
                "Selector not supported",
                f"Selectors are supported on /queue/, /amq/queue/, /topic/ and /exchange/ "
                f"subscriptions, not on '{dest.raw}' (selector {text!r})\n",
            )
        try:
            return compile_selector(text)
        except SelectorError as error:
            raise DestinationError("Invalid selector", f"{error}\n") from None

    def unsubscribe_queue(
        self,
        subscribed: Destination | None,
        headers: Mapping[str, str],
        sub_id: str | None,
        client_id: str | None,
    ) -> str | None:
        name = _subscription_name(headers)
        if name is None:
            return super().unsubscribe_queue(subscribed, headers, sub_id, client_id)
        if client_id is None:
            raise DestinationError(
                "Missing client-id",
                f"Removing a durable subscription ('{name}') needs a 'client-id' header on CONNECT\n",
            )
        return durable_subscription_queue(client_id, name)

    def names_durable_subscription(self, headers: Mapping[str, str]) -> bool:
        return _subscription_name(headers) is not None

    def scheduled_delay(self, headers: Mapping[str, str]) -> int | None:
        """``AMQ_SCHEDULED_DELAY`` (adapter/mapping/scheduled.py): the SEND is delivered after it;
        ``AMQ_SCHEDULED_PERIOD``, ``_REPEAT`` and ``_CRON`` are refused."""
        return scheduled_delay(headers)

    def virtual_topic_binding(self, dest: Destination, topic_exchange: str) -> tuple[str, str] | None:
        """The binding of a virtual topic's consumer queue, or None for any other destination.

        ActiveMQ's virtual topics (on by default): ``/queue/Consumer.<group>.VirtualTopic.<X>``
        is consumer group ``<group>``'s queue of topic ``/topic/VirtualTopic.<X>``: each group
        gets every message sent to the topic, its members share them.  In RabbitMQ that is the
        durable queue of that name bound to the topic exchange with key ``VirtualTopic.<X>``
        (bound when a member subscribes, as ActiveMQ creates the queue with its first consumer).
        ``<group>`` is one word, as in ActiveMQ's default ``Consumer.*.`` prefix; ``*`` and
        ``>`` in ``<X>`` are wildcards, as in ActiveMQ."""
        if dest.kind is not DestinationKind.QUEUE or not dest.name.startswith(_VIRTUAL_CONSUMER_PREFIX):
            return None
        _, group, topic = (dest.name.split(".", 2) + ["", ""])[:3]
        if not group or not topic.startswith(_VIRTUAL_TOPIC_PREFIX) or topic == _VIRTUAL_TOPIC_PREFIX:
            return None
        return topic_exchange, activemq_binding_key(topic)

    def exclusive_consumer(self, headers: Mapping[str, str]) -> bool:
        """``activemq.exclusive:true``: an AMQP exclusive consume, so the broker refuses it while
        the queue has another consumer, and refuses other consumers while it lasts
        (docs/migration-activemq.md: ActiveMQ keeps them waiting instead)."""
        return headers.get("activemq.exclusive", "").strip().lower() == "true"

    def plain_joins_dispatcher(self, headers: Mapping[str, str]) -> bool:
        """A subscription without a selector matches every message: on a queue whose selector
        consumers hold messages it must get them at once, as from ActiveMQ, not after the hold
        time.  Not a stream read from an offset (its deliveries cannot be held or requeued)."""
        return "x-stream-offset" not in headers


# ActiveMQ's ``transformation`` values that need no conversion here: every RabbitMQ message is a
# byte array already.  The others convert between a JMS map or object message and XML or JSON
# text; the adapter has no JMS message types to convert to or from.
_PASS_THROUGH_TRANSFORMATIONS: Final = frozenset({"jms-byte"})


def check_transformation(headers: Mapping[str, str], command: str) -> None:
    """Refuse a ``transformation`` the adapter cannot honour, rather than deliver or publish the
    message unconverted (an application that asked for ``jms-map-json`` would read the wrong body)."""
    value = headers.get("transformation")
    if value is None or value in _PASS_THROUGH_TRANSFORMATIONS:
        return
    raise DestinationError(
        "Transformation not supported",
        f"{command} with 'transformation:{value}': the adapter converts no message bodies "
        "(only 'jms-byte', which needs no conversion, is accepted); send and read the body as it is\n",
    )


# ActiveMQ's default virtual topic names: topics "VirtualTopic.>", consumer queues "Consumer.*.<topic>"
_VIRTUAL_TOPIC_PREFIX: Final = "VirtualTopic."
_VIRTUAL_CONSUMER_PREFIX: Final = "Consumer."


# ActiveMQ's queue browser: at most this many messages per browse (ActiveMQ's default
# maxBrowsePageSize), and at most this many bytes of their bodies (the adapter's own bound: the
# browse writes them to the client while it still holds them unacknowledged)
BROWSE_LIMIT: Final = 400
BROWSE_BYTES: Final = 8 * 1024 * 1024


def browses(headers: Mapping[str, str], dest: Destination) -> bool:
    """Whether a SUBSCRIBE is ActiveMQ's queue browser (``browser:true``); refused on anything
    but a queue (ActiveMQ browses queues only), rather than consume what it meant to look at."""
    value = headers.get("browser")
    if value is None or value.strip().lower() != "true":
        return False
    if dest.kind not in (DestinationKind.QUEUE, DestinationKind.AMQ_QUEUE):
        raise DestinationError(
            "Browsing not supported",
            f"SUBSCRIBE with 'browser:true' on '{dest.raw}': only queues (/queue/, /amq/queue/) "
            "can be browsed\n",
        )
    return True


# the destinations whose subscriptions may have a selector (see ActiveMQRules.selector)
_SELECTOR_KINDS: Final = frozenset(
    {DestinationKind.QUEUE, DestinationKind.AMQ_QUEUE, DestinationKind.TOPIC, DestinationKind.EXCHANGE}
)


def _shared_queue(headers: Mapping[str, str]) -> QueueParams:
    return QueueParams(durable=True, auto_delete=False, exclusive=False, arguments=queue_arguments(headers))


def _subscription_name(headers: Mapping[str, str]) -> str | None:
    for header in SUBSCRIPTION_NAME_HEADERS:
        value = headers.get(header)
        if value:
            return value
    return None


def rules_for(profile: str) -> RabbitMQRules:
    """The rules of a profile by name (``rabbitmq`` or ``activemq``)."""
    if profile == Profile.ACTIVEMQ:
        return ActiveMQRules()
    if profile == Profile.RABBITMQ:
        return RabbitMQRules()
    raise ValueError(f"unknown profile {profile!r}; known: {', '.join(PROFILES)}")


def dead_letter_copy(delivery: Delivery) -> MessageProperties:
    """The properties of a NACKed message's copy on the dead-letter queue: the original's, with
    ``original-destination`` (the STOMP destination it was delivered from), as ActiveMQ adds it."""
    original = delivery.properties
    headers = dict(original.headers or {})
    headers["original-destination"] = message_destination(delivery.exchange, delivery.routing_key)
    return dataclasses.replace(original, headers=headers)
