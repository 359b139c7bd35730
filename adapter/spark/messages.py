"""Messages <-> Spark rows, with the adapter's own rules in both directions.

Owns two translations, neither of which needs Spark (tested in tests/unit/test_spark_messages.py):

* a delivery from a stream becomes a row whose ``headers`` are exactly the headers a STOMP
  subscriber gets on MESSAGE: they come from ``adapter.mapping.properties.message_headers``,
  the function ``Session.on_delivery`` writes MESSAGE frames with, so the two cannot drift
  apart (tests/unit/test_message_headers.py renders frames and compares);
* a row to publish becomes the ``queue.declare`` and ``basic.publish`` a STOMP SEND with the
  same destination and headers would cause, through the mapping functions the session uses
  (``adapter.mapping.destinations`` and ``adapter.mapping.properties``), in the session's
  order of checks, so a row is refused with the very ERROR text a STOMP client would get.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from ..errors import StompError
from ..mapping.destinations import (
    AMQ_TOPIC,
    Destination,
    DestinationError,
    DestinationKind,
    ProcessingError,
    QueueParams,
    message_destination,
    parse_destination,
    publish_target,
    reply_to_temp_queue,
    send_queue_declare,
)
from ..mapping.operations import Delivery
from ..mapping.properties import MessageProperties, message_headers, properties_from_send
from ..stomp.codec import FrameLimits

# The headers of a MESSAGE that describe the Spark side's own subscription, not the message: a
# STOMP subscriber sees its own values there, so they are left out of the row.
SUBSCRIPTION_HEADERS: Final = frozenset({"subscription", "message-id", "ack"})

# The broker puts each message's stream offset in this header of every stream delivery.
STREAM_OFFSET_HEADER: Final = "x-stream-offset"

# (exchange, routing key) -> MESSAGE destination, kept for this many pairs per reader
_DESTINATIONS_KEPT: Final = 1024


class RowError(ValueError):
    """A row that cannot be published; the text names the row's problem as STOMP would."""


# --------------------------------------------------------------------------------- reading
# A row of the read schema (adapter/spark/source.py READ_SCHEMA), in its column order:
# destination, headers, body, offset, timestamp, stream
Row = tuple[str, dict[str, str], bytes, int, datetime.datetime | None, str]


@dataclass(frozen=True, slots=True)
class StreamMessage:
    """One delivery as a row, with its columns named (the reader itself passes plain tuples)."""

    destination: str
    headers: dict[str, str]
    body: bytes
    offset: int
    timestamp: datetime.datetime | None
    stream: str

    def as_row(self) -> Row:
        return (self.destination, self.headers, self.body, self.offset, self.timestamp, self.stream)


class MessageRenderer:
    """Deliveries as rows whose headers are those of the MESSAGE a STOMP 1.2 subscriber
    (``ack:auto``) gets, without rendering a frame.

    The headers come from the function ``Session.on_delivery`` writes MESSAGE frames with
    (``adapter.mapping.properties.message_headers``), around it the headers the session adds,
    in the frame's order; a name that occurs twice keeps its first value, as a STOMP parser
    reads a repeated header (STOMP 1.2).  tests/unit checks the rows against frames the
    session renders and the parser reads back."""

    def __init__(self) -> None:
        self._destinations: dict[tuple[str, str], str] = {}

    def message_headers(self, delivery: Delivery) -> tuple[str, dict[str, str]]:
        """(destination, headers) of the MESSAGE a STOMP subscriber would get for ``delivery``."""
        key = (delivery.exchange, delivery.routing_key)
        destination = self._destinations.get(key)
        if destination is None:
            destination = message_destination(*key)
            if len(self._destinations) < _DESTINATIONS_KEPT:
                self._destinations[key] = destination
        # the session's own headers first (subscription, message-id and ack are the subscriber's)
        headers = {"destination": destination, "redelivered": "true" if delivery.redelivered else "false"}
        for name, value in message_headers(delivery.properties):
            if name not in headers and name not in SUBSCRIPTION_HEADERS:
                headers[name] = value
        if delivery.body:
            headers["content-length"] = str(len(delivery.body))
        if not ("".join(headers).isascii() and "".join(headers.values()).isascii()):
            headers = {_valid_text(name): _valid_text(value) for name, value in headers.items()}
        return headers["destination"], headers

    def row(self, delivery: Delivery, stream: str, offset: int) -> Row:
        """The row of ``delivery``, the message at ``offset`` of ``stream``."""
        destination, headers = self.message_headers(delivery)
        return (destination, headers, delivery.body, offset, _timestamp(delivery.properties), stream)

    def row_without_headers(self, delivery: Delivery, stream: str, offset: int) -> Row:
        """The row of ``delivery`` with an empty ``headers`` map (option ``includeHeaders=false``):
        the destination alone, as the MESSAGE ``destination`` header would carry it."""
        key = (delivery.exchange, delivery.routing_key)
        destination = self._destinations.get(key)
        if destination is None:
            destination = message_destination(*key)
            if len(self._destinations) < _DESTINATIONS_KEPT:
                self._destinations[key] = destination
        if not destination.isascii():
            destination = _valid_text(destination)
        return (destination, {}, delivery.body, offset, _timestamp(delivery.properties), stream)

    def render(self, delivery: Delivery, stream: str) -> StreamMessage:
        return StreamMessage(*self.row(delivery, stream, stream_offset(delivery)))


def stream_offset(delivery: Delivery) -> int:
    headers = delivery.properties.headers or {}
    offset = headers.get(STREAM_OFFSET_HEADER)
    if not isinstance(offset, int) or isinstance(offset, bool):
        raise ValueError(
            f"a delivery without an integer {STREAM_OFFSET_HEADER} header (got {offset!r}): "
            "is the queue a stream (x-queue-type: stream)?"
        )
    return offset


def _timestamp(properties: MessageProperties) -> datetime.datetime | None:
    # RabbitMQ 3.10 does not pass a stream chunk's time to AMQP 0-9-1 consumers; the AMQP
    # timestamp property (the STOMP 'timestamp' header of a SEND) is the time there is.
    if properties.timestamp is None:
        return None
    try:
        return datetime.datetime.fromtimestamp(properties.timestamp, datetime.UTC)
    except (OverflowError, OSError, ValueError):
        return None


def _valid_text(value: str) -> str:
    # Header bytes that are not UTF-8 reach the adapter as surrogate escapes, which Spark's
    # strings (UTF-8) cannot hold: they become U+FFFD, the rest of the value is kept.
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    return value


# --------------------------------------------------------------------------------- writing
@dataclass(frozen=True, slots=True)
class PublishPlan:
    """What publishing one row takes: a declare first (a ``/queue/`` not yet declared on this
    connection), then one publish.

    ``mandatory``: the row names one existing queue (``/amq/queue/``, ``/reply-queue/``), so a
    message the broker cannot route means the queue is missing.  A STOMP SEND there is dropped
    silently by the broker; a Spark task fails instead (docs/spark.md, "Sink")."""

    declare: tuple[str, QueueParams] | None
    exchange: str
    routing_key: str
    properties: MessageProperties
    body: bytes
    mandatory: bool


class PublishPlanner:
    """Plans rows as one STOMP connection plans SENDs: destinations parsed and ``/queue/``
    names declared once per planner (the adapter declares once per connection)."""

    def __init__(
        self,
        *,
        max_body_size: int = FrameLimits().max_frame_size,
        default_topic_exchange: str = AMQ_TOPIC,
    ) -> None:
        self.max_body_size = max_body_size
        self.default_topic_exchange = default_topic_exchange
        self._destinations: dict[str, Destination] = {}
        self._declared: set[str] = set()

    def plan(
        self, destination: str | None, headers: Mapping[str, str] | None, body: bytes | bytearray | str | None
    ) -> PublishPlan:
        """Raises RowError, with the ERROR message and text the adapter would send a STOMP
        client for the same SEND (or the size limit it would apply to the frame)."""
        try:
            return self._plan(destination, dict(headers or {}), _body_bytes(body))
        except StompError as error:
            raise RowError(f"{error.message}: {error.detail.strip()}") from None

    def _plan(self, raw: str | None, headers: dict[str, str], body: bytes) -> PublishPlan:
        if raw is None:
            raise DestinationError(
                "Missing destination", "the row's 'destination' is null; every row needs a STOMP destination"
            )
        headers["destination"] = raw
        if "message-id" in headers:
            raise DestinationError("Invalid header", "'message-id' is not allowed on 'SEND'.")
        if len(body) > self.max_body_size:
            raise ProcessingError(
                f"body of {len(body)} bytes is over the frame limit of {self.max_body_size} bytes "
                "(stomp.max_frame_size); the adapter would refuse this SEND"
            )
        dest = self._destinations.get(raw)
        if dest is None:
            dest = parse_destination(raw)
            self._destinations[raw] = dest
        params = send_queue_declare(dest, headers, self._declared)
        declare = None
        if params is not None:
            declare = (dest.name, params)
            self._declared.add(dest.name)
        reply_to = headers.get("reply-to")
        if reply_to and reply_to_temp_queue(reply_to) is not None:
            # a temp queue belongs to one STOMP connection; a Spark task has none to answer on
            raise ProcessingError(f"reply-to {reply_to!r}: /temp-queue/ needs a STOMP connection")
        if reply_to:
            try:
                parse_destination(reply_to)
            except DestinationError:
                raise ProcessingError(f"reply-to {reply_to!r} is not a valid destination") from None
        exchange, routing_key = publish_target(dest, self.default_topic_exchange)
        properties = properties_from_send(headers, None)
        # every row is published persistent, as a SEND with persistent:true
        properties.delivery_mode = 2
        mandatory = dest.kind in (DestinationKind.AMQ_QUEUE, DestinationKind.REPLY_QUEUE)
        return PublishPlan(declare, exchange, routing_key, properties, body, mandatory)


def _body_bytes(body: bytes | bytearray | str | None) -> bytes:
    if body is None:
        return b""
    if isinstance(body, str):
        return body.encode("utf-8")
    return bytes(body)
