"""The ActiveMQ STOMP idioms a recorded frame uses, and what the ``activemq`` profile does with each.

Owns the catalogue of idiom names (``IDIOMS``, the names of ``report.json``, exactly as issue #28
lists them), the support of each by the profile today (``same``, ``differs`` with the difference,
``unsupported`` with the workaround, each taken from a row of docs/migration-activemq.md that
``tests/unit/test_migrate_idioms.py`` checks is still there and still says so), and
``frame_idioms``: one recorded frame (its direction, command and headers, as in
docs/recording-format.md) in, the names of the idioms it uses out; and which headers it reads
(``IDIOM_HEADERS``, ``idiom_headers``), so that the report can run it once per distinct kind of
frame instead of once per frame.

Standard library only, on purpose: ``frame_idioms`` runs inside Spark's Python workers
(adapter/migrate/report.py), where the adapter's own dependencies may not be installed.
Header values are read as recorded (still escaped as STOMP escapes them): the values the rules
look at (``true``, ``client``, destination prefixes) contain nothing escaping changes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

__all__ = [
    "IDIOMS",
    "IDIOM_NAMES",
    "Idiom",
    "Support",
    "destination_kind",
    "IDIOM_HEADERS",
    "IDIOM_PRESENCE_HEADERS",
    "frame_idioms",
    "header",
    "idiom_headers",
    "idiom",
    "record_idioms",
]

Support = Literal["same", "differs", "unsupported"]


@dataclass(frozen=True, slots=True)
class Idiom:
    """One idiom: its report name, what it is, the profile's support and what to do about it.

    ``note`` is the documented difference (``differs``), the workaround (``unsupported``) or a
    remark (``same``).  ``doc`` is where the support comes from: text of the first and of the
    second cell of a row of docs/migration-activemq.md's table (``None`` for plain STOMP, which
    the profile serves as the plugin does).
    """

    name: str
    title: str
    support: Support
    note: str
    doc: tuple[str, str] | None = None


IDIOMS: Final[tuple[Idiom, ...]] = (
    Idiom("stomp-1.0", "STOMP 1.0 connections", "same", "Served as RabbitMQ's STOMP plugin does."),
    Idiom("stomp-1.1", "STOMP 1.1 connections", "same", "Served as RabbitMQ's STOMP plugin does."),
    Idiom("stomp-1.2", "STOMP 1.2 connections", "same", "Served as RabbitMQ's STOMP plugin does."),
    Idiom(
        "selector-topic",
        "JMS selector on a topic subscription",
        "same",
        "Compiled by the adapter; a message the selector does not match is dropped from the "
        "subscription's own queue. Check that every selector compiles (see below).",
        ("`selector` on a topic subscription", "**Same.**"),
    ),
    Idiom(
        "selector-queue",
        "JMS selector on a queue subscription (competing consumers)",
        "differs",
        "Exact while all consumers of the queue go through one adapter process. With several "
        "adapter processes (--workers, several hosts) or plain AMQP consumers on the queue, a "
        "message is delivered at least once, correctly but late (1-30 s) and out of order. Run the "
        "selector consumers of a queue against one adapter process.",
        (
            "`selector` on a **queue** subscription",
            "**Same within one adapter process; at least once, with a delay, across processes**",
        ),
    ),
    Idiom(
        "durable-subscription",
        "Durable topic subscription (client-id + subscription name)",
        "same",
        "A durable queue activemq-durable:<len>:<client-id>:<name> per subscription. Keep the "
        "client-id and name stable; the client-id check is per adapter process.",
        ("Durable topic subscription: `client-id` on CONNECT", "**Same:**"),
    ),
    Idiom(
        "prefetch-size",
        "activemq.prefetchSize on SUBSCRIBE",
        "same",
        "Becomes the basic.qos prefetch; 0 and negative values are refused (AMQP's 0 is unlimited).",
        ("`activemq.prefetchSize` on SUBSCRIBE", "**Same:**"),
    ),
    Idiom(
        "expires",
        "Message expiry (expires header)",
        "same",
        "Becomes the AMQP per-message TTL; RabbitMQ drops expired messages only at the head of a queue.",
        ("`expires` (absolute ms since the epoch", "**Same:**"),
    ),
    Idiom(
        "non-persistent-send",
        "SEND with persistent:false",
        "same",
        "The queue is still shared and durable; the message is published non-persistent.",
        ("`/queue/NAME` is one shared queue", "**Same.**"),
    ),
    Idiom(
        "priority",
        "Message priority",
        "differs",
        "The value is carried, but RabbitMQ orders by priority only on a queue declared with "
        "x-max-priority: send x-max-priority:9 on the first SEND or SUBSCRIBE that declares the "
        "queue (or pre-declare it) if order by priority matters.",
        ("`priority` 0-9", "RabbitMQ orders by priority only on queues declared with `x-max-priority`"),
    ),
    Idiom("transaction", "Transactions (BEGIN/COMMIT/ABORT)", "same", "As RabbitMQ's STOMP plugin."),
    Idiom(
        "nack",
        "NACK",
        "same",
        "A NACKed persistent message goes to ActiveMQ.DLQ (non-persistent ones are dropped), as in "
        "ActiveMQ; originalExpiration is not added.",
        ("NACK (1.1/1.2)", "**Same**"),
    ),
    Idiom("ack-client", "ack:client subscriptions", "same", "Cumulative acknowledgement, as ActiveMQ."),
    Idiom(
        "ack-client-individual",
        "ack:client-individual subscriptions",
        "same",
        "Acknowledgement of one message at a time, as ActiveMQ.",
    ),
    Idiom(
        "temp-queue",
        "Temporary queues (/temp-queue/)",
        "same",
        "A private server-named queue per connection; responders see reply-to:/reply-queue/amq.gen-… "
        "and must reply to that value (SEND to /temp-queue/NAME itself is refused).",
        (
            "`/temp-queue/NAME` as SUBSCRIBE destination and in `reply-to`",
            "**Same** for SUBSCRIBE and `reply-to`",
        ),
    ),
    Idiom(
        "temp-topic",
        "Temporary topics (/temp-topic/)",
        "differs",
        "Kept in a private queue: messages sent before the connection subscribes wait in it "
        "(ActiveMQ drops them), and two subscriptions of the connection share its messages "
        "instead of each getting a copy; selectors on it are refused.",
        (
            "`/temp-topic/NAME` as SUBSCRIBE destination and in `reply-to`",
            "**Differs** where a topic and a private queue differ",
        ),
    ),
    Idiom("reply-to", "reply-to header (request/reply)", "same", "Carried as the AMQP reply-to."),
    Idiom(
        "composite-destination",
        "Composite destinations (/queue/a,/topic/b)",
        "differs",
        "SEND: the same, one publish per element. SUBSCRIBE to a composite destination is not "
        "supported: subscribe to each element.",
        ("Composite destinations on SEND", "Not on SUBSCRIBE"),
    ),
    Idiom(
        "wildcard-topic",
        "Topic wildcards (* and >)",
        "same",
        "Translated to AMQP topic patterns. A literal '#' word in a topic name is refused: rename it.",
        ("`/topic/` wildcards `*` (one word) and `>`", "**Same**, translated"),
    ),
    Idiom(
        "exclusive-consumer",
        "activemq.exclusive:true",
        "differs",
        "An AMQP exclusive consume: other consumers of the queue are refused (ERROR) instead of "
        "waiting as standby. For standby consumers declare the queue with "
        "x-single-active-consumer:true on its first declare.",
        ("`activemq.exclusive:true`", "**Differs:**"),
    ),
    Idiom(
        "message-group",
        "Message groups (JMSXGroupID)",
        "unsupported",
        "Messages of a group are shared among consumers like any others. Split the groups over "
        "queues (one per group or per hash bucket, e.g. with the consistent-hash exchange) declared "
        "with x-single-active-consumer:true, or consume with one activemq.exclusive:true subscriber.",
        ("Message groups: messages with the same `JMSXGroupID`", "**Not supported, deliberately:**"),
    ),
    Idiom(
        "scheduled-delivery",
        "Scheduled delivery (AMQ_SCHEDULED_DELAY, _PERIOD, _REPEAT, _CRON)",
        "differs",
        "AMQ_SCHEDULED_DELAY: delivered after the delay rounded up to two significant digits "
        "(at most 10 % late), through a per-delay TTL queue that dead-letters into the target; "
        "the message carries RabbitMQ's x-death headers. AMQ_SCHEDULED_PERIOD, _REPEAT and _CRON "
        "are refused (ERROR): send each repetition from the producer.",
        ("Scheduled delivery: SEND with `AMQ_SCHEDULED_DELAY`", "**Differs** in precision"),
    ),
    Idiom(
        "browser",
        "Queue browsing (browser:true)",
        "differs",
        "The same frames (the queue's messages, then browser:end; at most 400, as ActiveMQ's page "
        "size, and 8 MiB), nothing consumed; but the messages are taken with basic.get and handed "
        "back, so the queue's other consumers do not get them during the browse and then see them "
        "redelivered:true. Only queues can be browsed.",
        ("Queue browsing: SUBSCRIBE with `browser:true`", "**Differs** in what the queue's other"),
    ),
    Idiom(
        "transformation",
        "transformation header (jms-map-json …)",
        "differs",
        "Refused with ERROR 'Transformation not supported' (jms-byte is accepted): send and read "
        "the JSON or XML text as the body.",
        ("`transformation` header", "**Differs:**"),
    ),
    Idiom(
        "virtual-topic",
        "Virtual topics (VirtualTopic.X, Consumer.G.VirtualTopic.X)",
        "differs",
        "Each consumer group's queue is a durable queue bound to amq.topic with the key "
        "VirtualTopic.X when a member subscribes, so each group gets every message and its "
        "members share them, as in ActiveMQ. MESSAGE's destination header names the topic "
        "(/topic/VirtualTopic.X) where ActiveMQ names the group's queue.",
        ("Virtual topics: SEND to `/topic/VirtualTopic.X`", "**Differs** only"),
    ),
    Idiom(
        "advisory-topic",
        "Advisory topics (ActiveMQ.Advisory.*)",
        "unsupported",
        "RabbitMQ publishes no advisory messages: the subscription receives nothing. Use the "
        "management API or the rabbitmq_event_exchange plugin for broker events.",
        ("Advisory topics: `/topic/ActiveMQ.Advisory.", "**Not supported:**"),
    ),
    Idiom(
        "retroactive",
        "activemq.retroactive:true",
        "unsupported",
        "Ignored: a new subscriber gets only new messages. Use a durable subscription, or a "
        "stream queue read from an offset (x-stream-offset).",
        ("`activemq.retroactive`, `activemq.dispatchAsync`", "**Not supported** (ignored)"),
    ),
    Idiom(
        "no-local",
        "activemq.noLocal:true",
        "unsupported",
        "Ignored: the connection receives the messages it sent itself. Filter them out with a "
        "selector on a header the producer sets (e.g. its application name).",
        ("`activemq.noLocal:true` on SUBSCRIBE", "**Not supported** (ignored)"),
    ),
    Idiom("receipt", "Receipts", "same", "A RECEIPT means the broker has confirmed the message."),
    Idiom("heart-beat", "Heart-beats", "same", "Negotiated as STOMP 1.1/1.2 say."),
)

IDIOM_NAMES: Final = tuple(idiom.name for idiom in IDIOMS)
_BY_NAME: Final = {idiom.name: idiom for idiom in IDIOMS}

_CONNECT: Final = frozenset({"CONNECT", "STOMP"})
_SCHEDULED: Final = (
    "AMQ_SCHEDULED_DELAY",
    "AMQ_SCHEDULED_PERIOD",
    "AMQ_SCHEDULED_REPEAT",
    "AMQ_SCHEDULED_CRON",
)
_TRANSACTION_COMMANDS: Final = frozenset({"BEGIN", "COMMIT", "ABORT"})
# the headers frame_idioms reads (keep in step with it: tests/unit/test_migrate_idioms.py checks
# that ``idiom_headers`` changes no frame's idioms); of these, the ones only present or absent
# matters for (their values, a receipt id or a selector, vary from frame to frame)
IDIOM_PRESENCE_HEADERS: Final = (
    "receipt",
    "transaction",
    "transformation",
    "priority",
    "JMSXGroupID",
    *_SCHEDULED,
    "selector",
    "activemq.prefetchSize",
)
IDIOM_HEADERS: Final = (
    *IDIOM_PRESENCE_HEADERS,
    "version",
    "heart-beat",
    "destination",
    "expires",
    "persistent",
    "reply-to",
    "activemq.subscriptionName",
    "durable-subscription-name",
    "ack",
    "activemq.exclusive",
    "browser",
    "activemq.retroactive",
    "activemq.noLocal",
)


def header(headers: Iterable[Sequence[str]] | None, name: str) -> str | None:
    """The value of the first ``name`` header (STOMP: the first of repeated headers wins)."""
    for pair in headers or ():
        if len(pair) >= 2 and pair[0] == name:
            return pair[1]
    return None


def destination_kind(destination: str) -> str:
    """The kind of a STOMP destination, by its prefix: ``queue``, ``topic``, ``temp-queue``,
    ``temp-topic``, ``exchange``, ``amq-queue``, ``reply-queue``, ``remote-temp-queue`` (ActiveMQ's
    name of another connection's temporary destination), ``composite`` or ``other``."""
    if "," in destination:
        return "composite"
    for prefix, kind in _KINDS:
        if destination.startswith(prefix):
            return kind
    return "other"


_KINDS: Final = (
    ("/queue/", "queue"),
    ("/topic/", "topic"),
    ("/temp-queue/", "temp-queue"),
    ("/temp-topic/", "temp-topic"),
    ("/exchange/", "exchange"),
    ("/amq/queue/", "amq-queue"),
    ("/reply-queue/", "reply-queue"),
    ("/remote-temp-queue/", "remote-temp-queue"),
    ("/remote-temp-topic/", "remote-temp-queue"),
)


def _is_true(value: str | None) -> bool:
    return value is not None and value.strip().lower() == "true"


def _destination_idioms(destination: str, command: str, found: set[str]) -> None:
    elements = destination.split(",")
    if len(elements) > 1:
        found.add("composite-destination")
    for element in elements:
        element = element.strip()
        if element.startswith(("/temp-queue/", "/remote-temp-queue/")):
            found.add("temp-queue")
        elif element.startswith(("/temp-topic/", "/remote-temp-topic/")):
            found.add("temp-topic")
        elif element.startswith("/topic/"):
            name = element[len("/topic/") :]
            if name.startswith("ActiveMQ.Advisory."):
                found.add("advisory-topic")
            elif name.startswith("VirtualTopic."):
                found.add("virtual-topic")
            if command == "SUBSCRIBE" and any(word in ("*", ">") for word in name.split(".")):
                found.add("wildcard-topic")
        elif element.startswith("/queue/"):
            words = element[len("/queue/") :].split(".")
            # ActiveMQ's default consumer queue of a virtual topic: Consumer.<group>.VirtualTopic.<name>
            if len(words) >= 4 and words[0] == "Consumer" and words[2] == "VirtualTopic":
                found.add("virtual-topic")


def frame_idioms(
    direction: str | None, command: str | None, headers: Iterable[Sequence[str]] | None
) -> list[str]:
    """The idioms one recorded frame uses, sorted by name (``[]`` for most frames).

    Client frames (``direction`` ``in``) say what the application does; of the upstream's frames
    only CONNECTED counts (its ``version``, absent in STOMP 1.0, is the negotiated version).
    """
    if command is None:
        return []
    pairs = [pair for pair in headers or () if len(pair) >= 2]
    if direction == "out":
        if command == "CONNECTED":
            version = header(pairs, "version") or "1.0"
            return [f"stomp-{version}"] if f"stomp-{version}" in _BY_NAME else []
        return []
    if direction != "in":
        return []
    values: dict[str, str] = {}
    for name, value, *_ in pairs:
        values.setdefault(name, value)
    found: set[str] = set()
    if "receipt" in values:
        found.add("receipt")
    if command in _CONNECT:
        beats = values.get("heart-beat")
        if beats is not None and any(part.strip() not in ("", "0") for part in beats.split(",")):
            found.add("heart-beat")
        return sorted(found)
    if command in _TRANSACTION_COMMANDS or "transaction" in values:
        found.add("transaction")
    if "transformation" in values:
        found.add("transformation")
    destination = values.get("destination")
    if destination is not None and command in ("SEND", "SUBSCRIBE", "UNSUBSCRIBE"):
        _destination_idioms(destination, command, found)
    if command == "SEND":
        _send_idioms(values, found)
    elif command == "SUBSCRIBE":
        _subscribe_idioms(values, destination or "", found)
    elif command == "UNSUBSCRIBE" and _durable_name(values):
        found.add("durable-subscription")  # ActiveMQ's removal of a durable subscription
    elif command == "NACK":
        found.add("nack")
    return sorted(found)


def _send_idioms(values: Mapping[str, str], found: set[str]) -> None:
    expires = values.get("expires")
    if expires is not None and expires.strip() not in ("", "0"):
        found.add("expires")
    if values.get("persistent", "").strip().lower() == "false":
        found.add("non-persistent-send")
    if "priority" in values:
        found.add("priority")
    reply_to = values.get("reply-to")
    if reply_to is not None:
        found.add("reply-to")
        if reply_to.startswith("/temp-queue/"):
            found.add("temp-queue")
        elif reply_to.startswith("/temp-topic/"):
            found.add("temp-topic")
    if "JMSXGroupID" in values:
        found.add("message-group")
    if any(name in values for name in _SCHEDULED):
        found.add("scheduled-delivery")


def _durable_name(values: Mapping[str, str]) -> bool:
    return bool(values.get("activemq.subscriptionName") or values.get("durable-subscription-name"))


def _subscribe_idioms(values: Mapping[str, str], destination: str, found: set[str]) -> None:
    if "selector" in values:
        topic = destination.startswith(("/topic/", "/temp-topic/"))
        found.add("selector-topic" if topic else "selector-queue")
    if _durable_name(values):
        found.add("durable-subscription")
    if "activemq.prefetchSize" in values:
        found.add("prefetch-size")
    ack = values.get("ack", "auto")
    if ack == "client":
        found.add("ack-client")
    elif ack == "client-individual":
        found.add("ack-client-individual")
    if _is_true(values.get("activemq.exclusive")):
        found.add("exclusive-consumer")
    if _is_true(values.get("browser")):
        found.add("browser")
    if _is_true(values.get("activemq.retroactive")):
        found.add("retroactive")
    if _is_true(values.get("activemq.noLocal")):
        found.add("no-local")


def idiom_headers(headers: Iterable[Sequence[str]] | None) -> list[list[str]]:
    """Of ``headers``, what ``frame_idioms`` reads, in order: the (name, value) pairs of
    ``IDIOM_HEADERS``, with an empty value for those of ``IDIOM_PRESENCE_HEADERS``.  Frames with
    the same direction, command and ``idiom_headers`` use the same idioms; the report computes
    the same reduction in Spark SQL (adapter/migrate/report.py, ``IDIOM_KEY_SQL``)."""
    presence = frozenset(IDIOM_PRESENCE_HEADERS)
    wanted = frozenset(IDIOM_HEADERS)
    return [
        [pair[0], "" if pair[0] in presence else pair[1]]
        for pair in headers or ()
        if len(pair) >= 2 and pair[0] in wanted
    ]


def record_idioms(record: Mapping[str, Any]) -> list[str]:
    """``frame_idioms`` of one record of a recording (a ``frame`` record; ``[]`` for the others)."""
    if record.get("kind") != "frame":
        return []
    return frame_idioms(record.get("dir"), record.get("command"), record.get("headers"))


def idiom(name: str) -> Idiom:
    """The catalogue entry of ``name`` (KeyError for a name that is not an idiom)."""
    return _BY_NAME[name]
