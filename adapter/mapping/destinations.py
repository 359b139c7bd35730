"""STOMP destinations and everything derived from them, as RabbitMQ's STOMP plugin 3.10.8 does it.

Owns, as docs/destinations.md describes them (the plugin's code: rabbitmq-server 3.10.8,
deps/rabbitmq_stomp/src/rabbit_stomp_processor.erl and rabbit_stomp_util.erl, and
deps/amqp_client/src/rabbit_routing_util.erl for destination parsing):

* parsing of ``destination`` / ``reply-to`` values and the exact ERROR texts for bad ones;
* the ``basic.publish`` exchange / routing key of a SEND;
* ``queue.declare`` flags and arguments built from frame headers, with the flag rules of the
  plugin that ships with the broker's generation (3.10, 3.11-3.13, 4.x: ``BrokerGeneration``,
  chosen from the version the broker announces; 3.10.8's rules unless told otherwise);
* durable-subscription detection and the ``Missing Header`` check;
* subscription queue names for ``/topic`` and ``/exchange`` and the SUBSCRIBE plan;
* consumer tags, stream offsets;
* the ``destination`` and ``reply-to`` headers of MESSAGE frames;
* the queue removed by a durable UNSUBSCRIBE.

It is pure: standard library only.  It must not import asyncio, aio-pika, aiormq, pamqp or
pydantic.  It never performs I/O; callers turn the returned plans into AMQP methods.

Header values are ``str`` decoded from the wire with ``errors="surrogateescape"``; wherever the
plugin works on bytes (hashing, %-escaping) the value is turned back into its original bytes with
``.encode("utf-8", "surrogateescape")``.  Header mappings hold the first occurrence of each header
and are iterated in frame order (this matters only where the plugin lets a later header win).
"""

import base64
import hashlib
import os
import re
import struct
from collections.abc import Container, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final

from ..errors import StompError
from ..numbers import TooManyDigits, decimal_integer

__all__ = [
    "ADAPTER_EXTRA_QUEUE_ARGUMENTS",
    "AMQ_TOPIC",
    "INTERNAL_TAG_PREFIX",
    "QUEUE_TAG_PREFIX",
    "TEMP_QUEUE_ID_PREFIX",
    "ALL_DEST_PREFIXES",
    "DEST_PREFIXES",
    "PLUGIN_QUEUE_ARGUMENTS",
    "QUEUE_ARGUMENTS",
    "NEWEST_BROKER",
    "AmqpFieldType",
    "BrokerGeneration",
    "Destination",
    "DestinationError",
    "DestinationKind",
    "ProcessingError",
    "QueueParams",
    "SUBSCRIBE_CONTROL_HEADERS",
    "SubscribeTarget",
    "X_MATCH_VALUES",
    "check_not_temp_queue",
    "broker_generation",
    "consumer_tag",
    "default_params",
    "durable_unsubscribe_queue",
    "headers_binding",
    "is_durable",
    "message_destination",
    "message_reply_to",
    "parse_destination",
    "parse_reply_to",
    "publish_target",
    "queue_arguments",
    "queue_params",
    "reply_consumer_tag",
    "reply_to_temp_queue",
    "require_destination",
    "require_id_for_durable",
    "send_queue_declare",
    "consume_arguments",
    "stream_offset_argument",
    "subscribe_target",
    "subscription_description",
    "subscription_queue",
    "subscription_queue_name",
    "unsubscribe_consumer_tag",
]


# ---------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------


class DestinationError(StompError):
    """An ERROR frame with a specific ``message`` header (docs/destinations.md#parsing;
    docs/behaviour.md#error-catalogue).

    The plugin leaves the connection open after these; the session closes it, as STOMP asks.

    ``message`` is the ERROR ``message`` header, ``detail`` the ERROR body exactly as the plugin
    sends it (including a trailing LF where the plugin has one).
    """

    def __str__(self) -> str:
        return f"{self.message}: {self.detail!r}"


class ProcessingError(StompError):
    """The plugin's generic ``Processing error`` (an Erlang crash while handling a frame,
    docs/behaviour.md#error-catalogue),
    also raised for a value AMQP cannot carry (a name over 255 bytes, an integer out of range).

    The ERROR ``message`` header is always ``Processing error``; ``detail`` says what was wrong.
    """

    MESSAGE: Final = "Processing error"

    def __init__(self, detail: str) -> None:
        super().__init__(self.MESSAGE, detail)

    def __str__(self) -> str:
        return self.detail


# ---------------------------------------------------------------------------------------------
# Destinations (docs/destinations.md#parsing)
# ---------------------------------------------------------------------------------------------


class DestinationKind(StrEnum):
    """Destination types.  The values are the plugin's internal atoms, which appear verbatim in
    ``'<x>' is not a valid <type> destination`` error bodies (docs/destinations.md#parsing)."""

    QUEUE = "queue"
    AMQ_QUEUE = "amqqueue"
    TOPIC = "topic"
    EXCHANGE = "exchange"
    TEMP_QUEUE = "temp_queue"
    REPLY_QUEUE = "reply_queue"
    # activemq profile only (adapter/mapping/profile.py); the plugin knows no /temp-topic/
    TEMP_TOPIC = "temp_topic"


# Prefixes (docs/destinations.md#parsing; prefixes are case-sensitive).  Note the trailing slash of
# /reply-queue/.
QUEUE_PREFIX: Final = "/queue"
TOPIC_PREFIX: Final = "/topic"
EXCHANGE_PREFIX: Final = "/exchange"
AMQQUEUE_PREFIX: Final = "/amq/queue"
TEMP_QUEUE_PREFIX: Final = "/temp-queue"
TEMP_TOPIC_PREFIX: Final = "/temp-topic/"
REPLY_QUEUE_PREFIX: Final = "/reply-queue/"

# Order matters: it is the order of the "Valid destination types are: ..." list
# (docs/destinations.md#parsing) and the
# set of prefixes that a MESSAGE reply-to may start with (docs/destinations.md#temporary-queues).
DEST_PREFIXES: Final = (EXCHANGE_PREFIX, TOPIC_PREFIX, QUEUE_PREFIX, AMQQUEUE_PREFIX, REPLY_QUEUE_PREFIX)
ALL_DEST_PREFIXES: Final = (TEMP_QUEUE_PREFIX, *DEST_PREFIXES)

# The 1-segment types "/<type>/<name>" (docs/destinations.md#parsing).
_SIMPLE_TYPES: Final = {
    "queue": DestinationKind.QUEUE,
    "topic": DestinationKind.TOPIC,
    "exchange": DestinationKind.EXCHANGE,
    "temp-queue": DestinationKind.TEMP_QUEUE,
}

# docs/destinations.md#common-steps: subscription ids may not start with this.
TEMP_QUEUE_ID_PREFIX: Final = "/temp-queue/"

# docs/destinations.md#topicpattern: the literal exchange name replaced by the configured default topic
# exchange.
AMQ_TOPIC: Final = "amq.topic"


@dataclass(frozen=True, slots=True)
class Destination:
    """A parsed destination (docs/destinations.md#parsing).

    ``name``: queue name (QUEUE, AMQ_QUEUE, REPLY_QUEUE), temp-queue id (TEMP_QUEUE), routing key
    (TOPIC) or exchange name (EXCHANGE); ``%2F`` already decoded.  ``routing_key`` is only used for
    EXCHANGE: ``None`` for ``/exchange/x`` (treated as ``""``), the decoded key for ``/exchange/x/k``.
    ``raw`` is the destination string as given.
    """

    kind: DestinationKind
    name: str
    routing_key: str | None = None
    raw: str = ""

    @property
    def routing_name(self) -> str:
        """The routing-key part (`parse_routing`): what docs/destinations.md#durable-subscriptions hashes and
        what is bound/published."""
        if self.kind is DestinationKind.EXCHANGE:
            return self.routing_key or ""
        return self.name


def _unescape(segment: str) -> str:
    # docs/destinations.md#parsing: only the exact 3-character sequence "%2F" (upper-case F) is decoded.  A
    # left-to-right,
    # non-overlapping replacement, like the plugin's scan.
    return segment.replace("%2F", "/")


def _to_url(rest: list[str]) -> str:
    # docs/destinations.md#parsing: the offending segments, re-joined; "" when there were none.
    return "/" + "/".join(rest) if rest else ""


def _invalid(kind: DestinationKind, rest: list[str]) -> DestinationError:
    # docs/destinations.md#parsing rows 1-3
    return DestinationError("Invalid destination", f"'{_to_url(rest)}' is not a valid {kind} destination\n")


def _unknown(value: str) -> DestinationError:
    # docs/destinations.md#parsing row 4
    return DestinationError(
        "Unknown destination",
        f"'{value}' is not a valid destination.\n"
        f"Valid destination types are: {', '.join(ALL_DEST_PREFIXES)}.\n",
    )


def _parse_endpoint(value: str) -> Destination:
    """docs/destinations.md#parsing without the blank check (the plugin does that later, and not for
    reply-to)."""
    parts = value.split("/")
    if len(parts) == 1:
        # no "/" at all: a queue name
        return Destination(DestinationKind.QUEUE, _unescape(value), None, value)
    if parts[0] != "":
        raise _unknown(value)
    type_ = parts[1]
    if type_ in _SIMPLE_TYPES:
        kind = _SIMPLE_TYPES[type_]
        rest = parts[2:]
    elif type_ == "amq" and len(parts) >= 3 and parts[2] == "queue":
        kind = DestinationKind.AMQ_QUEUE
        rest = parts[3:]
    elif type_ == "reply-queue" and len(parts) >= 3:
        # Everything after the 13-character prefix, slashes included, as one segment.
        kind = DestinationKind.REPLY_QUEUE
        rest = [value[len(REPLY_QUEUE_PREFIX) :]]
    else:
        raise _unknown(value)

    if kind is DestinationKind.EXCHANGE:
        # /exchange/x, /exchange/x/k (k may be empty); an empty exchange segment is invalid.
        if rest and rest[0] != "" and len(rest) <= 2:
            key = _unescape(rest[1]) if len(rest) == 2 else None
            return Destination(kind, _unescape(rest[0]), key, value)
        raise _invalid(kind, rest)
    # Every other type: exactly one non-empty segment.
    # NB (following amqp_client's rabbit_routing_util.erl at v3.10.8): the /reply-queue/
    # remainder goes through the same %2F decoding as every other name.
    if len(rest) == 1 and rest[0] != "":
        return Destination(kind, _unescape(rest[0]), None, value)
    raise _invalid(kind, rest)


def parse_destination(value: str) -> Destination:
    """Parse a SEND/SUBSCRIBE ``destination`` header value (after the 1.0 left-trim) —
    docs/destinations.md#parsing.

    Raises :class:`DestinationError` (``Invalid destination`` / ``Unknown destination``).  A
    ``/temp-queue/<id>`` parses fine here; SEND and SUBSCRIBE reject it with
    :func:`check_not_temp_queue`.
    """
    dest = _parse_endpoint(value)
    if dest.kind is DestinationKind.QUEUE and dest.name == "":
        # docs/destinations.md#parsing: blank destination (body without LF)
        raise DestinationError("Invalid destination", "Destination cannot be blank")
    return dest


def require_destination(headers: Mapping[str, str], command: str) -> str:
    """The ``destination`` header, or the ``Missing destination`` error (docs/destinations.md#parsing last
    row)."""
    value = headers.get("destination")
    if value is None:
        raise DestinationError("Missing destination", f"\"{command}\" must include a 'destination' header\n")
    return value


def parse_temp_topic(value: str) -> Destination:
    """``/temp-topic/NAME`` (activemq profile): exactly one non-empty segment after the prefix, as
    for ``/temp-queue/NAME``; anything else is ``Invalid destination``."""
    rest = value[len(TEMP_TOPIC_PREFIX) :].split("/")
    if len(rest) == 1 and rest[0] != "":
        return Destination(DestinationKind.TEMP_TOPIC, _unescape(rest[0]), None, value)
    raise _invalid(DestinationKind.TEMP_TOPIC, rest)


def check_not_temp_queue(dest: Destination, command: str) -> None:
    """docs/destinations.md#parsing: ``/temp-queue/x`` is only meaningful in ``reply-to``; as SEND/SUBSCRIBE
    destination
    it is ``Invalid destination`` (and so is the activemq profile's ``/temp-topic/x`` on SEND)."""
    if dest.kind is DestinationKind.TEMP_QUEUE or dest.kind is DestinationKind.TEMP_TOPIC:
        raise DestinationError(
            "Invalid destination", f"'{dest.raw}' is not a valid destination for '{command}'\n"
        )


# ---------------------------------------------------------------------------------------------
# SEND (docs/destinations.md#common-steps; docs/destinations.md#topicpattern)
# ---------------------------------------------------------------------------------------------


def _apply_default_topic_exchange(exchange: str, default_topic_exchange: str) -> str:
    # docs/destinations.md#topicpattern: whenever the parsed exchange is literally amq.topic (/topic/k and
    # /exchange/amq.topic/k).
    return default_topic_exchange if exchange == AMQ_TOPIC else exchange


def publish_target(dest: Destination, default_topic_exchange: str) -> tuple[str, str]:
    """``basic.publish`` (exchange, routing key) for a SEND to ``dest`` (docs/destinations.md#common-steps;
    docs/destinations.md#topicpattern)."""
    match dest.kind:
        case DestinationKind.QUEUE | DestinationKind.AMQ_QUEUE | DestinationKind.REPLY_QUEUE:
            return "", dest.name
        case DestinationKind.TOPIC:
            return _apply_default_topic_exchange(AMQ_TOPIC, default_topic_exchange), dest.name
        case DestinationKind.EXCHANGE:
            return _apply_default_topic_exchange(dest.name, default_topic_exchange), dest.routing_key or ""
    check_not_temp_queue(dest, "SEND")
    raise AssertionError(dest.kind)  # pragma: no cover


# ---------------------------------------------------------------------------------------------
# queue.declare parameters (docs/destinations.md#queue-flag-headers)
# ---------------------------------------------------------------------------------------------


class AmqpFieldType(StrEnum):
    """AMQP field-table value types used for queue and consume arguments."""

    LONGSTR = "longstr"
    LONG = "long"
    BOOL = "bool"
    TIMESTAMP = "timestamp"
    BYTE = "byte"


ArgumentValue = str | int | bool

# docs/destinations.md#queue-arguments-x--headers: the only x- headers the 3.10.8 plugin turns into
# queue.declare arguments.
PLUGIN_QUEUE_ARGUMENTS: Final[Mapping[str, AmqpFieldType]] = {
    "x-dead-letter-exchange": AmqpFieldType.LONGSTR,
    "x-dead-letter-routing-key": AmqpFieldType.LONGSTR,
    "x-expires": AmqpFieldType.LONG,
    "x-max-length": AmqpFieldType.LONG,
    "x-max-length-bytes": AmqpFieldType.LONG,
    "x-max-priority": AmqpFieldType.LONG,
    "x-message-ttl": AmqpFieldType.LONG,
    "x-queue-type": AmqpFieldType.LONGSTR,
}

# ADAPTER-ONLY (product request; a documented difference from 3.10.8, which ignores these
# headers, docs/destinations.md#queue-arguments-x--headers): also pass these x- headers as queue.declare
# arguments.
ADAPTER_EXTRA_QUEUE_ARGUMENTS: Final[Mapping[str, AmqpFieldType]] = {
    "x-overflow": AmqpFieldType.LONGSTR,  # drop-head | reject-publish | reject-publish-dlx
    "x-max-age": AmqpFieldType.LONGSTR,  # stream retention, e.g. "7D" (validated by the broker)
    "x-single-active-consumer": AmqpFieldType.BOOL,  # true | false
    # quorum queues (3.8+; 4.0 sets a default of 20, docs/behaviour.md): deliveries before a
    # message is dropped or dead-lettered
    "x-delivery-limit": AmqpFieldType.LONG,
    # the current plugin's (streams, 3.13+: bytes of a chunk's filter; 3.10-3.12 ignore it)
    "x-stream-filter-size-bytes": AmqpFieldType.LONG,
}

QUEUE_ARGUMENTS: Final[Mapping[str, AmqpFieldType]] = {
    **PLUGIN_QUEUE_ARGUMENTS,
    **ADAPTER_EXTRA_QUEUE_ARGUMENTS,
}

_X_OVERFLOW_VALUES: Final = frozenset({"drop-head", "reject-publish", "reject-publish-dlx"})


def plugin_integer(text: str, *, strip: bool = False) -> int | None:
    """The one integer parser for header values, with the plugin's rules: Erlang's
    ``binary_to_integer`` takes an optional sign and ASCII digits, nothing else (no whitespace,
    no underscores, unlike Python's ``int()``); ``strip`` first removes spaces on both sides, as
    the plugin does for priority, timestamp, prefetch-count and x- arguments
    (docs/destinations.md#queue-arguments-x--headers; docs/destinations.md#send--amqp;
    docs/destinations.md#common-steps).
    ``None`` when the text is not such an integer.  More than ``adapter.numbers.MAX_DIGITS``
    significant digits raise ProcessingError naming the limit (Erlang takes any length; every
    value here must fit 64 bits anyway, and Python's ``int()`` raises beyond 4,300 digits)."""
    if strip:
        text = _strip(text)
    try:
        return decimal_integer(text)
    except TooManyDigits as error:
        raise ProcessingError(str(error)) from None


def _strip(value: str) -> str:
    # Erlang string:strip/1 removes spaces only (not tabs), on both sides
    # (docs/destinations.md#queue-arguments-x--headers).
    return value.strip(" ")


def _string_to_boolean(value: str) -> bool | None:
    # docs/destinations.md#queue-flag-headers: true/True, false/False; anything else is "undefined" (None).
    if value in ("true", "True"):
        return True
    if value in ("false", "False"):
        return False
    return None


def queue_arguments(headers: Mapping[str, str]) -> dict[str, ArgumentValue]:
    """``queue.declare`` arguments from the x- headers (docs/destinations.md#queue-arguments-x--headers plus
    the adapter extras), in frame order.

    Raises :class:`ProcessingError` for a non-integer long argument (and for invalid values of
    the adapter-only extras).  NB the plugin evaluates this for *every* SEND and SUBSCRIBE, whatever
    the destination type and whether or not a declare follows (src: processor.erl ensure_endpoint),
    so a bad ``x-max-length`` fails a SEND to ``/topic/x`` too.
    """
    arguments: dict[str, ArgumentValue] = {}
    for name, raw in headers.items():
        type_ = QUEUE_ARGUMENTS.get(name)
        if type_ is None:
            continue
        value = _strip(raw)
        if type_ is AmqpFieldType.LONG:
            number = plugin_integer(value)
            if number is None:
                raise ProcessingError(f"header '{name}' must be an integer, got {raw!r}")
            arguments[name] = number
        elif type_ is AmqpFieldType.BOOL:
            flag = _string_to_boolean(value)
            if flag is None:
                raise ProcessingError(f"header '{name}' must be true or false, got {raw!r}")
            arguments[name] = flag
        else:
            if name == "x-overflow" and value not in _X_OVERFLOW_VALUES:
                allowed = ", ".join(sorted(_X_OVERFLOW_VALUES))
                raise ProcessingError(f"header 'x-overflow' must be one of {allowed}, got {raw!r}")
            arguments[name] = value
    return arguments


@dataclass(frozen=True, slots=True)
class QueueParams:
    """The flags and arguments of a ``queue.declare`` (docs/destinations.md#queue-flag-headers;
    docs/destinations.md#queue-arguments-x--headers), as sent on the wire."""

    durable: bool
    auto_delete: bool
    exclusive: bool
    arguments: dict[str, ArgumentValue] = field(default_factory=dict, hash=False)


class BrokerGeneration(StrEnum):
    """Which plugin's ``queue.declare`` flags the adapter uses, by the broker's version
    (docs/destinations.md#queue-flag-headers; docs/compatibility.md#broker-generations).

    The plugin ships with the broker, so a broker of each generation expects its own plugin's
    declares; a 4.x broker refuses some of the older ones outright.  The value names the
    broker versions (the ``rules`` label of ``stomp_adapter_broker_info``).
    """

    # 3.10 and older: 3.10.8's plugin, the adapter's reference
    V3_10 = "3.10"
    # 3.11-3.13: /exchange/ subscription queues exclusive (3.11.8 and 3.12.0, rabbitmq-server
    # commit "Fix incorrect default value for exchange subscription")
    V3_11 = "3.11-3.13"
    # 4.x: 4.3.x's plugin (PR 13016): non-durable /topic/ subscriptions exclusive too, and a
    # quorum or stream queue always durable, never exclusive.  4.3 refuses transient
    # non-exclusive queues (transient_nonexcl_queues, denied by default) with a hard error.
    V4 = "4.x"


# the rules for a broker whose version is unknown: exclusive queues work on every version,
# transient non-exclusive ones are refused by the newest
NEWEST_BROKER: Final = BrokerGeneration.V4

_VERSION: Final = re.compile(r"([0-9]+)\.([0-9]+)")


def broker_generation(version: str | None) -> BrokerGeneration | None:
    """The generation of a broker from the ``version`` of its connection.start server-properties
    (``3.10.8``, ``4.3.0-rc.1``, ``3.13.7+1.g0a1b2c3`` ...), or None when it is missing or not a
    version (the caller then uses :data:`NEWEST_BROKER`, and says so).  A development build's
    ``0.0.0`` is not a version."""
    if not version:
        return None
    match = _VERSION.match(version.strip())
    if match is None:
        return None
    major, minor = int(match[1]), int(match[2])
    if major >= 4:
        return BrokerGeneration.V4
    if major == 3:
        return BrokerGeneration.V3_11 if minor >= 11 else BrokerGeneration.V3_10
    if major == 0:
        return None
    return BrokerGeneration.V3_10  # 1.x, 2.x: older than anything the adapter knows


# docs/destinations.md#queue-flag-headers defaults per generation and kind (src: util.erl
# default_params at v3.10.8, v3.13.7, v4.3.5).  Types that are never declared (amq/queue,
# reply-queue, temp-queue) get the plugin's catch-all default.
_DEFAULT_PARAMS: Final[Mapping[BrokerGeneration, Mapping[DestinationKind, Mapping[str, bool]]]] = {
    BrokerGeneration.V3_10: {
        DestinationKind.QUEUE: {"durable": True},
        DestinationKind.TOPIC: {"exclusive": False, "auto_delete": True},
        DestinationKind.EXCHANGE: {"exclusive": False, "auto_delete": True},
    },
    BrokerGeneration.V3_11: {
        DestinationKind.QUEUE: {"durable": True},
        DestinationKind.TOPIC: {"exclusive": False, "auto_delete": True},
        DestinationKind.EXCHANGE: {"exclusive": True, "auto_delete": True},
    },
    BrokerGeneration.V4: {
        DestinationKind.QUEUE: {"durable": True},
        # no exclusive default: the durable rule decides (non-durable: exclusive)
        DestinationKind.TOPIC: {"auto_delete": True},
        DestinationKind.EXCHANGE: {"exclusive": True, "auto_delete": True},
    },
}
_CATCH_ALL_DEFAULT_PARAMS: Final[Mapping[BrokerGeneration, Mapping[str, bool]]] = {
    BrokerGeneration.V3_10: {"durable": False},
    BrokerGeneration.V3_11: {"durable": False},
    BrokerGeneration.V4: {"exclusive": True, "durable": False},
}
# 4.x (src: rabbit_stomp_routing_util.erl queue_declare_method at v4.3.5): queues of these
# types are declared durable and non-exclusive, whatever the headers say.  The plugin also
# applies it to the vhost's default queue type, which AMQP 0-9-1 does not tell a client
# (docs/compatibility.md#broker-generations).
_REPLICATED_QUEUE_TYPES: Final = frozenset({"quorum", "stream"})


def default_params(kind: DestinationKind, generation: BrokerGeneration) -> Mapping[str, bool]:
    """The plugin's ``default_params`` of a ``kind`` destination for a broker of
    ``generation``: the flags that apply when no header sets them."""
    defaults = _DEFAULT_PARAMS[generation].get(kind)
    return defaults if defaults is not None else _CATCH_ALL_DEFAULT_PARAMS[generation]


# docs/destinations.md#queue-flag-headers flag headers; durable and persistent both set "durable".
_FLAG_HEADERS: Final = {
    "durable": "durable",
    "persistent": "durable",
    "auto-delete": "auto_delete",
    "exclusive": "exclusive",
}


def queue_params(
    kind: DestinationKind,
    headers: Mapping[str, str],
    generation: BrokerGeneration = BrokerGeneration.V3_10,
) -> QueueParams:
    """``queue.declare`` flags and arguments for a declare of a ``kind`` destination
    (docs/destinations.md#queue-flag-headers; docs/destinations.md#queue-arguments-x--headers),
    as the plugin of a ``generation`` broker declares it (3.10.8's unless told).

    Raises :class:`ProcessingError` for a bad long argument (checked first, as in the plugin) or a
    ``durable``/``persistent`` value other than true/True/false/False.

    The flags are those the plugin *sends*: e.g. ``/queue/q`` + ``exclusive:true`` is declared
    ``durable=true, exclusive=true`` and the broker itself makes it non-durable
    (docs/destinations.md#queue-flag-headers table).
    """
    arguments = queue_arguments(headers)

    # Defaults overlaid with the header values.  When both durable and persistent are present the
    # later header in the frame wins (src: util.erl build_params + rabbit_misc:plmerge).
    params: dict[str, bool | None] = dict(default_params(kind, generation))
    for name, value in headers.items():
        key = _FLAG_HEADERS.get(name)
        if key is not None:
            params[key] = _string_to_boolean(value)

    # docs/destinations.md#queue-flag-headers algorithm (src: routing_util.erl queue_declare_method).
    durable = params.get("durable", False)
    if durable is None:
        raise ProcessingError("header 'durable'/'persistent' must be true or false")
    if durable:
        auto_delete, exclusive = False, False
    else:
        auto_delete, exclusive = True, True
    # An explicit exclusive / auto-delete (header or default) wins; an invalid header value is
    # "undefined", which replaces the kind's default and so leaves the durable-rule value.
    if (flag := params.get("exclusive")) is not None:
        exclusive = flag
    if (flag := params.get("auto_delete")) is not None:
        auto_delete = flag
    if generation is BrokerGeneration.V4 and arguments.get("x-queue-type") in _REPLICATED_QUEUE_TYPES:
        durable, exclusive = True, False
    return QueueParams(durable=durable, auto_delete=auto_delete, exclusive=exclusive, arguments=arguments)


def send_queue_declare(
    dest: Destination,
    headers: Mapping[str, str],
    declared_queues: Container[str] = (),
    generation: BrokerGeneration = BrokerGeneration.V3_10,
) -> QueueParams | None:
    """What a SEND to ``dest`` declares before publishing (docs/destinations.md#common-steps), in the
    plugin's order of checks.

    1. x- arguments are validated for every destination type (``ProcessingError``);
    2. ``/temp-queue/…`` → ``Invalid destination … for 'SEND'``;
    3. ``/queue/q`` whose name is not in ``declared_queues`` (the per-connection cache of names
       already declared) → the ``queue.declare(q, nowait=true)`` parameters (may raise
       ``ProcessingError`` for a bad durable/persistent); otherwise ``None`` (nothing declared).
    """
    queue_arguments(headers)
    check_not_temp_queue(dest, "SEND")
    if dest.kind is DestinationKind.QUEUE and dest.name not in declared_queues:
        return queue_params(DestinationKind.QUEUE, headers, generation)
    return None


# ---------------------------------------------------------------------------------------------
# Durable subscriptions (docs/destinations.md#durable-subscriptions) and subscription queue names
# (docs/destinations.md#durable-subscriptions)
# ---------------------------------------------------------------------------------------------


def is_durable(headers: Mapping[str, str]) -> bool:
    """Whether a SUBSCRIBE/UNSUBSCRIBE is durable: ``durable`` or ``persistent`` is true.

    This is the plugin's ``has_durable_header`` (boolean header: ``true`` or ``True``), which picks
    the docs/destinations.md#durable-subscriptions naming scheme and triggers
    docs/destinations.md#durable-subscriptions deletion.  The ``Missing Header`` check of
    docs/destinations.md#durable-subscriptions is
    stricter (literal ``true`` only): see :func:`require_id_for_durable`.
    """
    return _string_to_boolean(headers.get("durable", "")) is True or (
        _string_to_boolean(headers.get("persistent", "")) is True
    )


def require_id_for_durable(headers: Mapping[str, str]) -> None:
    """docs/destinations.md#durable-subscriptions: SUBSCRIBE/UNSUBSCRIBE with ``durable:true`` or
    ``persistent:true`` (the literal value
    ``true`` only) and no ``id`` → ``Missing Header`` (no LF).  Validated before anything else."""
    if "id" not in headers and (headers.get("durable") == "true" or headers.get("persistent") == "true"):
        raise DestinationError("Missing Header", "Header 'id' is required for durable subscriptions")


_SUBSCRIPTION_QUEUE_PREFIX: Final = "stomp-subscription-"


def _base64url(data: bytes) -> str:
    # rabbit_misc:base64url: + → -, / → _, no padding.
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _etf_string(data: bytes) -> bytes:
    """Erlang external term format of an Erlang string (list of bytes), as term_to_binary does it.

    [] → NIL_EXT (6A); 1..65535 elements, all 0..255 → STRING_EXT (6B, u16 length, bytes);
    longer → LIST_EXT (6C, u32 count, each byte as SMALL_INTEGER_EXT 61 xx, tail NIL_EXT).
    """
    if not data:
        return b"\x6a"
    if len(data) <= 0xFFFF:
        return b"\x6b" + struct.pack(">H", len(data)) + data
    return b"\x6c" + struct.pack(">I", len(data)) + b"".join(b"\x61" + bytes((b,)) for b in data) + b"\x6a"


def subscription_queue_name(routing_name: str, durable_id: str | None) -> str:
    """docs/destinations.md#durable-subscriptions hashed subscription queue name.

    ``routing_name`` is the routing-key part of the destination (``k`` of ``/topic/k`` or
    ``/exchange/x/k``, ``""`` for ``/exchange/x``), ``durable_id`` the ``id`` header of a durable
    subscription, or ``None`` for a non-durable one (then the name is random on every call).

    The hashed term is the 2-tuple ``{Name, SubId}`` in that order — verified against a queue the
    plugin created (tests/compat, test_durable_topic_subscription): Name ``durable`` (i.e.
    ``/topic/durable``), SubId ``test.subscription`` →
    ``stomp-subscription-tMbeqL30tjlgaXMmaFM6Ew`` (the other order gives a different name).
    """
    if durable_id is None:
        digest = hashlib.md5(os.urandom(16)).digest()
    else:
        term = (
            b"\x83\x68\x02"  # version 131, SMALL_TUPLE_EXT arity 2
            + _etf_string(routing_name.encode("utf-8", "surrogateescape"))
            + _etf_string(durable_id.encode("utf-8", "surrogateescape"))
        )
        digest = hashlib.md5(term).digest()
    return _SUBSCRIPTION_QUEUE_PREFIX + _base64url(digest)


def subscription_queue(
    dest: Destination, headers: Mapping[str, str], sub_id: str | None, durable: bool
) -> str:
    """Queue name of a ``/topic`` or ``/exchange`` subscription (docs/destinations.md#durable-subscriptions).

    ``x-queue-name`` (verbatim; an empty value lets the broker name the queue) overrides the hash.
    A durable subscription without ``id`` is a ``ProcessingError`` (only reachable with
    ``durable:True``, which passes the literal-``true`` Missing Header check), and that check
    comes before ``x-queue-name`` is looked at, as in the plugin.
    """
    if dest.kind not in (DestinationKind.TOPIC, DestinationKind.EXCHANGE):
        raise ValueError(f"{dest.kind} destinations have no subscription queue")
    if durable and sub_id is None:
        raise ProcessingError("durable subscription without an 'id' header")
    explicit = headers.get("x-queue-name")
    if explicit is not None:
        return explicit
    return subscription_queue_name(dest.routing_name, sub_id if durable else None)


# ---------------------------------------------------------------------------------------------
# SUBSCRIBE (docs/destinations.md#common-steps)
# ---------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------
# Headers-exchange bindings (an adapter extension: docs/destinations.md#headers-exchange-bindings)
# ---------------------------------------------------------------------------------------------

X_MATCH_VALUES: Final = ("all", "any", "all-with-x", "any-with-x")
# What a SUBSCRIBE carries for the protocol, the plugin or the adapter: never a binding argument.
# Every other header of a SUBSCRIBE with ``x-match`` is one (x- headers the adapter does not know
# included: ``all-with-x`` matches them).
SUBSCRIBE_CONTROL_HEADERS: Final = frozenset(
    {
        "destination", "id", "ack", "receipt", "selector", "prefetch-count", "content-length",
        "content-type", "transaction", "durable", "persistent", "auto-delete", "exclusive",
        "x-queue-name", "declare-exchange", "exchange-type", "exchange-durable",
        "exchange-auto-delete", "browser", "client-id", "transformation", "x-match",
        "x-priority", "x-stream-offset", "x-stream-filter", "x-stream-match-unfiltered",
        *QUEUE_ARGUMENTS,
    }
)  # fmt: skip
_CONTROL_PREFIXES: Final = ("activemq.", "x-retry-")


def headers_binding(headers: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The binding arguments of a SUBSCRIBE that carries ``x-match``: ``x-match`` first, then
    every header that is not a control header (``SUBSCRIBE_CONTROL_HEADERS``, ``activemq.*``,
    ``x-retry-*``), in frame order, each value a string as sent (a STOMP header is text; a SEND's
    headers reach AMQP as strings too, so they match).  Without ``x-match``: no arguments, the
    plugin's binding.  An ``x-match`` other than ``all``, ``any``, ``all-with-x`` or
    ``any-with-x`` is a ProcessingError (RabbitMQ would refuse the bind with a channel error)."""
    match = headers.get("x-match")
    if match is None:
        return ()
    if match not in X_MATCH_VALUES:
        raise ProcessingError(f"header 'x-match' must be one of {', '.join(X_MATCH_VALUES)}, got {match!r}")
    return (("x-match", match),) + tuple(
        (name, value)
        for name, value in headers.items()
        if name not in SUBSCRIBE_CONTROL_HEADERS and not name.startswith(_CONTROL_PREFIXES)
    )


@dataclass(frozen=True, slots=True)
class SubscribeTarget:
    """What a SUBSCRIBE declares, consumes and binds (docs/destinations.md#common-steps).

    ``queue``: the queue to consume from (and to declare if ``declare`` is set).  ``""`` only
    with an empty ``x-queue-name`` on ``/topic``/``/exchange``: the broker names the queue, use the
    name from ``declare-ok``.  ``declare``: parameters for the declare (``/queue``: ``nowait``;
    ``/topic``, ``/exchange``: synchronous), or ``None`` for no declare.  ``bind_exchange``:
    exchange to bind the queue to with ``bind_key``, or ``None`` for no binding.  When
    ``bind_exchange`` is set the queue is a subscription queue, which the plugin deletes if the
    consume or bind fails.
    """

    queue: str
    declare: QueueParams | None
    bind_exchange: str | None
    bind_key: str
    # a headers exchange's match (``headers_binding``), () for the plugin's plain binding
    bind_arguments: tuple[tuple[str, str], ...] = ()


def subscribe_target(
    dest: Destination,
    headers: Mapping[str, str],
    sub_id: str | None,
    default_topic_exchange: str,
    declared_queues: Container[str] = (),
    generation: BrokerGeneration = BrokerGeneration.V3_10,
) -> SubscribeTarget:
    """The SUBSCRIBE plan for ``dest`` (docs/destinations.md#common-steps), with the plugin's order of checks.

    ``sub_id`` is the SUBSCRIBE ``id`` header (``None`` if absent); ``declared_queues`` the
    per-connection cache of ``/queue`` names already declared (docs/destinations.md#common-steps: never
    redeclared); ``generation`` the broker's (:func:`queue_params`).

    Raises ``ProcessingError`` (bad x- argument — for every destination type —, bad
    durable/persistent on an actual declare, durable without id) or ``DestinationError``
    (``/temp-queue/…``, after the argument check).
    """
    queue_arguments(headers)
    match dest.kind:
        case DestinationKind.QUEUE:
            declare = (
                None
                if dest.name in declared_queues
                else queue_params(DestinationKind.QUEUE, headers, generation)
            )
            return SubscribeTarget(queue=dest.name, declare=declare, bind_exchange=None, bind_key="")
        case DestinationKind.AMQ_QUEUE | DestinationKind.REPLY_QUEUE:
            return SubscribeTarget(queue=dest.name, declare=None, bind_exchange=None, bind_key="")
        case DestinationKind.TOPIC | DestinationKind.EXCHANGE:
            params = queue_params(dest.kind, headers, generation)
            queue = subscription_queue(dest, headers, sub_id, is_durable(headers))
            exchange = AMQ_TOPIC if dest.kind is DestinationKind.TOPIC else dest.name
            return SubscribeTarget(
                queue=queue,
                declare=params,
                bind_exchange=_apply_default_topic_exchange(exchange, default_topic_exchange),
                bind_key=dest.routing_name,
                bind_arguments=headers_binding(headers),
            )
    check_not_temp_queue(dest, "SUBSCRIBE")
    raise AssertionError(dest.kind)  # pragma: no cover


# ---------------------------------------------------------------------------------------------
# Consumer tags (docs/destinations.md#common-steps; docs/destinations.md#temporary-queues;
# docs/destinations.md#durable-subscriptions)
# ---------------------------------------------------------------------------------------------

INTERNAL_TAG_PREFIX: Final = "T_"
QUEUE_TAG_PREFIX: Final = "Q_"


def consumer_tag(headers: Mapping[str, str], destination_header_value: str) -> str:
    """SUBSCRIBE consumer tag (docs/destinations.md#common-steps): ``T_<id>`` or, without ``id``,
    ``Q_<destination header>``.

    An ``id`` starting with ``/temp-queue/`` → ``ProcessingError`` (in the plugin this happens
    after the declare).
    """
    sub_id = headers.get("id")
    if sub_id is None:
        return QUEUE_TAG_PREFIX + destination_header_value
    if sub_id.startswith(TEMP_QUEUE_ID_PREFIX):
        raise ProcessingError(f"subscription id may not start with {TEMP_QUEUE_ID_PREFIX}")
    return INTERNAL_TAG_PREFIX + sub_id


def unsubscribe_consumer_tag(headers: Mapping[str, str]) -> str:
    """UNSUBSCRIBE consumer tag (docs/destinations.md#durable-subscriptions;
    docs/destinations.md#common-steps), or the ``Invalid id`` /
    ``Missing destination or id`` errors."""
    sub_id = headers.get("id")
    if sub_id is not None:
        if sub_id.startswith(TEMP_QUEUE_ID_PREFIX):
            raise DestinationError(
                "Invalid id", f"UNSUBSCRIBE 'id' may not start with {TEMP_QUEUE_ID_PREFIX}\n"
            )
        return INTERNAL_TAG_PREFIX + sub_id
    destination = headers.get("destination")
    if destination is None:
        raise DestinationError(
            "Missing destination or id", "UNSUBSCRIBE must include a 'destination' or 'id' header"
        )
    return QUEUE_TAG_PREFIX + destination


def subscription_description(headers: Mapping[str, str]) -> str:
    """``id='<id>'`` or ``destination='<dest>'`` — the subscription description used in the
    UNSUBSCRIBE and server-cancel error bodies (docs/behaviour.md#error-handling;
    docs/destinations.md#durable-subscriptions).  The caller quotes it (Erlang ``~p``)."""
    sub_id = headers.get("id")
    if sub_id is not None:
        return f"id='{sub_id}'"
    return f"destination='{headers.get('destination', '')}'"


def reply_consumer_tag(temp_queue_id: str) -> str:
    """Consumer tag of the implicit temp-queue reply subscription (docs/destinations.md#temporary-queues):
    ``T_/temp-queue/<id>``."""
    return INTERNAL_TAG_PREFIX + TEMP_QUEUE_ID_PREFIX + temp_queue_id


# ---------------------------------------------------------------------------------------------
# MESSAGE destination (docs/destinations.md#amqp--message) and reply-to
# (docs/destinations.md#temporary-queues)
# ---------------------------------------------------------------------------------------------

_HEX: Final = "0123456789ABCDEF"


def _as_bytes(value: str | bytes) -> bytes:
    return value if isinstance(value, bytes) else value.encode("utf-8", "surrogateescape")


def _escape_component(data: bytes) -> str:
    # docs/destinations.md#amqp--message, byte-wise: "/" → %2F, "%" → %25, bytes < 0x20 or > 0x7F → %XX
    # (upper-case hex);
    # everything else (including space, "~", 0x7F) unchanged.
    out: list[str] = []
    for byte in data:
        if byte == 0x2F or byte == 0x25 or byte < 0x20 or byte > 0x7F:
            out.append("%" + _HEX[byte >> 4] + _HEX[byte & 0xF])
        else:
            out.append(chr(byte))
    return "".join(out)


def message_destination(exchange: str | bytes, routing_key: str | bytes) -> str:
    """MESSAGE ``destination`` from the delivery's exchange and routing key
    (docs/destinations.md#amqp--message).

    ``""`` → ``/queue/<rk>``; exactly ``amq.topic`` → ``/topic/<rk>`` (not the configured default
    topic exchange, docs/destinations.md#topicpattern); other exchange with empty key → ``/exchange/<x>``;
    else
    ``/exchange/<x>/<rk>``.  ``str`` inputs are turned back into bytes with surrogateescape.  The
    result is pure ASCII.
    """
    x, rk = _as_bytes(exchange), _as_bytes(routing_key)
    if x == b"":
        return f"{QUEUE_PREFIX}/{_escape_component(rk)}"
    if x == AMQ_TOPIC.encode("ascii"):
        return f"{TOPIC_PREFIX}/{_escape_component(rk)}"
    if rk == b"":
        return f"{EXCHANGE_PREFIX}/{_escape_component(x)}"
    return f"{EXCHANGE_PREFIX}/{_escape_component(x)}/{_escape_component(rk)}"


def message_reply_to(amqp_reply_to: str | None) -> str | None:
    """MESSAGE ``reply-to`` header from the AMQP ``reply_to`` property
    (docs/destinations.md#temporary-queues); ``None`` = no header.

    Values starting with ``/exchange``, ``/topic``, ``/queue``, ``/amq/queue`` or ``/reply-queue/``
    (plain prefix test) pass unchanged; anything else gets ``/reply-queue/`` prepended.  An absent
    reply_to produces no header; a present but empty one becomes ``/reply-queue/``, as the plugin
    shows a SEND's empty ``reply-to`` (tests/compat, test_empty_reply_to).
    """
    if amqp_reply_to is None:
        return None
    if amqp_reply_to.startswith(DEST_PREFIXES):
        return amqp_reply_to
    return REPLY_QUEUE_PREFIX + amqp_reply_to


def parse_reply_to(value: str) -> Destination:
    """Parse a SEND ``reply-to`` value (docs/destinations.md#temporary-queues).  Unparsable →
    ``ProcessingError``; an empty value is
    accepted (it is simply copied to the AMQP property)."""
    try:
        return _parse_endpoint(value)
    except DestinationError as exc:
        raise ProcessingError(f"unparsable reply-to {value!r}: {exc.message}") from exc


def reply_to_temp_queue(value: str) -> str | None:
    """The temp-queue id of a ``reply-to:/temp-queue/<id>`` (docs/destinations.md#temporary-queues), ``None``
    for any other
    (copied unchanged) value; ``ProcessingError`` if it does not parse."""
    dest = parse_reply_to(value)
    return dest.name if dest.kind is DestinationKind.TEMP_QUEUE else None


# ---------------------------------------------------------------------------------------------
# Streams (docs/destinations.md#stream-offsets)
# ---------------------------------------------------------------------------------------------


# x-priority is an AMQP byte, as the current plugin sends it (docs/destinations.md#consumer-arguments)
_BYTE_RANGE: Final = range(-128, 128)


def consume_arguments(headers: Mapping[str, str]) -> dict[str, object]:
    """``basic.consume`` arguments from a SUBSCRIBE's headers, as the current plugin builds them
    (docs/destinations.md#consumer-arguments): ``x-stream-offset``; ``x-stream-filter`` (an
    array of longstr, the header split at every comma); ``x-stream-match-unfiltered`` (bool,
    true/True/false/False, anything else ignored); ``x-priority`` (byte; not an integer:
    ignored, as the plugin does; outside -128..127: ``ProcessingError`` naming the range)."""
    arguments: dict[str, object] = {}
    offset = stream_offset_argument(headers.get("x-stream-offset"))
    if offset is not None:
        arguments["x-stream-offset"] = offset
    stream_filter = headers.get("x-stream-filter")
    if stream_filter is not None:
        arguments["x-stream-filter"] = [(AmqpFieldType.LONGSTR, value) for value in stream_filter.split(",")]
    unfiltered = headers.get("x-stream-match-unfiltered")
    if unfiltered is not None:
        flag = _string_to_boolean(unfiltered)
        if flag is not None:
            arguments["x-stream-match-unfiltered"] = flag
    priority = headers.get("x-priority")
    if priority is not None:
        number = plugin_integer(priority.strip())
        if number is not None:
            if number not in _BYTE_RANGE:
                raise ProcessingError(
                    f"header 'x-priority' must be an integer from -128 to 127, got {priority!r}"
                )
            arguments["x-priority"] = (AmqpFieldType.BYTE, number)
    return arguments


def stream_offset_argument(value: str | None) -> tuple[AmqpFieldType, str | int] | None:
    """The ``x-stream-offset`` consume argument (type, value) for an ``x-stream-offset`` header
    (docs/destinations.md#stream-offsets).

    ``first``/``last``/``next`` → (longstr, value); ``offset=<int>`` → (long, n);
    ``timestamp=<int>`` → (timestamp, seconds); absent or anything else → ``None`` (no argument).
    A non-integer after ``offset=``/``timestamp=`` → ``ProcessingError``.  No whitespace stripping.
    """
    if value is None:
        return None
    if value in ("first", "last", "next"):
        return AmqpFieldType.LONGSTR, value
    for prefix, type_ in (("offset=", AmqpFieldType.LONG), ("timestamp=", AmqpFieldType.TIMESTAMP)):
        if value.startswith(prefix):
            number = plugin_integer(value[len(prefix) :])
            if number is None:
                raise ProcessingError(f"invalid x-stream-offset {value!r}")
            return type_, number
    return None


# ---------------------------------------------------------------------------------------------
# UNSUBSCRIBE (docs/destinations.md#durable-subscriptions)
# ---------------------------------------------------------------------------------------------


def durable_unsubscribe_queue(
    subscribe_destination: Destination, unsubscribe_headers: Mapping[str, str], sub_id: str | None
) -> str | None:
    """Queue to ``queue.delete`` after a successful UNSUBSCRIBE (docs/destinations.md#durable-subscriptions),
    or ``None``.

    Only when the UNSUBSCRIBE is durable (``durable``/``persistent`` true) and the stored
    SUBSCRIBE destination is ``/topic/…``.  The name comes from that destination, the
    UNSUBSCRIBE's ``id`` (``sub_id``) and the UNSUBSCRIBE's own ``x-queue-name``.
    """
    if subscribe_destination.kind is not DestinationKind.TOPIC or not is_durable(unsubscribe_headers):
        return None
    return subscription_queue(subscribe_destination, unsubscribe_headers, sub_id, durable=True)
