"""Messages <-> Spark rows, with the adapter's own rules in both directions.

Owns two translations, neither of which needs Spark (tested in tests/unit/test_spark_messages.py):

* a delivery from a stream becomes a row (added to ``RowColumns``, the columns one Arrow record
  batch is built from) whose ``headers`` are exactly the headers a STOMP subscriber gets on
  MESSAGE: they come from ``adapter.mapping.properties.message_headers``, the function
  ``Session.on_delivery`` writes MESSAGE frames with, so the two cannot drift apart
  (tests/unit/test_message_headers.py renders frames and compares), or, for deliveries whose
  headers have the same names, from ``message_header_columns``, the same a column at a time
  (tests/unit/test_message_header_columns.py compares the two);
* a row to publish becomes the ``queue.declare`` and ``basic.publish`` a STOMP SEND with the
  same destination and headers would cause, through the mapping functions the session uses
  (``adapter.mapping.destinations`` and ``adapter.mapping.properties``), in the session's
  order of checks, so a row is refused with the very ERROR text a STOMP client would get.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, NamedTuple

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
from ..mapping.properties import (
    PROPERTY_HEADERS,
    DecimalTexts,
    MessageProperties,
    message_header_columns,
    message_headers,
    properties_from_send,
)
from ..stomp.codec import FrameLimits

# The headers of a MESSAGE that describe the Spark side's own subscription, not the message: a
# STOMP subscriber sees its own values there, so they are left out of the row.
SUBSCRIPTION_HEADERS: Final = frozenset({"subscription", "message-id", "ack"})

# The broker puts each message's stream offset in this header of every stream delivery.
STREAM_OFFSET_HEADER: Final = "x-stream-offset"

# The headers the session writes before the message's own, in the frame's order
_SESSION_NAMES: Final = ("destination", "redelivered")
# Names a headers table may hold that the MESSAGE frame also gets from elsewhere (the session,
# a property): a row with one of them is rendered through a dict, the first value winning
_NAMES_TAKEN: Final = frozenset({*_SESSION_NAMES, *SUBSCRIPTION_HEADERS, *PROPERTY_HEADERS})

# (exchange, routing key) -> MESSAGE destination, kept for this many pairs per reader
_DESTINATIONS_KEPT: Final = 1024
# destinations parsed, and plans of rows without headers, kept for this many per writer task
_PLANS_KEPT: Final = 1024


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


@dataclass(slots=True)
class RowColumns:
    """Rows of the read schema (adapter/spark/source.py READ_SCHEMA) column by column, as one
    Arrow record batch is built from them; every row is of ``stream``.

    ``header_ends[i + 1]`` is where row i's headers end in ``header_names`` / ``header_values``
    (the map column's offsets), unless the rows' headers are still ``header_blocks``
    (``flatten_headers`` makes them rows); ``timestamps`` are microseconds since the epoch (UTC), None
    where the message has no time."""

    stream: str
    destinations: list[str] = field(default_factory=list)
    header_ends: list[int] = field(default_factory=lambda: [0])
    header_names: list[str] = field(default_factory=list)
    header_values: list[str] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    timestamps: list[int | None] = field(default_factory=list)
    body_bytes: int = 0
    # the headers of rows that came a column at a time, kept so while every row's did (Arrow
    # interleaves them, adapter/spark/source.py): (names, each name's value in each row) of
    # each piece; these rows are not in header_ends, header_names and header_values
    header_blocks: list[tuple[tuple[str, ...], list[Sequence[str]]]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.offsets)

    def add_header_columns(self, columns: list[tuple[str, Sequence[str]]]) -> None:
        """The next rows' headers, ``columns`` ((name, its value in each row) pairs, in each
        row's order): kept as columns (``header_blocks``) while every row's headers came so,
        in text Spark's strings can hold; else added to the map's offsets, names and values."""
        if not columns:
            return
        names = tuple(name for name, _ in columns)
        values = [column for _, column in columns]
        if len(self.header_ends) == 1 and _valid_utf8("".join(names)) and all(map(_valid_column, values)):
            blocks = self.header_blocks
            if blocks and blocks[-1][0] == names:  # the same names as the rows before: one block
                blocks[-1] = (names, list(map(_extended, blocks[-1][1], values)))
            else:  # the block's own columns, which the next rows' extend
                blocks.append((names, [_extended([], column) for column in values]))
            return
        self.flatten_headers()
        first = len(self.header_ends) - 1
        self._interleave(names, values)
        self.replace_invalid_text(first)

    def flatten_headers(self) -> None:
        """The rows whose headers are kept as columns added to the map's offsets, names and
        values, as any row after them is."""
        blocks, self.header_blocks = self.header_blocks, []
        for names, values in blocks:
            self._interleave(names, values)

    def _interleave(self, names: tuple[str, ...], columns: list[Sequence[str]]) -> None:
        width, count = len(names), len(columns[0])
        all_names, values, start = self.header_names, self.header_values, len(self.header_names)
        all_names += names * count
        values += all_names[start:]  # the length they take, filled in a column at a time
        for place, column in enumerate(columns, start):
            values[place::width] = column
        self.header_ends += range(start + width, start + width * count + 1, width)

    def replace_invalid_text(self, first: int) -> None:
        """Header text Spark's strings cannot hold (bytes that were not UTF-8, as surrogate
        escapes) replaced in the rows from ``first`` on, each row's map rebuilt as ``_headers``
        builds it.  Checked for all those rows at once: a row at a time costs more."""
        start = self.header_ends[first]
        names, values = self.header_names, self.header_values
        if _valid_utf8("".join(names[start:])) and _valid_utf8("".join(values[start:])):
            return
        ends = self.header_ends
        pieces = zip(ends[first:], ends[first + 1 :])  # noqa: B905 (one shorter: row bounds)
        rows = [
            {_valid_text(n): _valid_text(v) for n, v in zip(names[a:b], values[a:b], strict=True)}
            for a, b in pieces
        ]
        del names[start:], values[start:], ends[first + 1 :]
        for headers in rows:
            names += headers
            values += headers.values()
            ends.append(len(names))


class MessageRenderer:
    """Deliveries as rows whose headers are those of the MESSAGE a STOMP 1.2 subscriber
    (``ack:auto``) gets, without rendering a frame.

    The headers come from the function ``Session.on_delivery`` writes MESSAGE frames with
    (``adapter.mapping.properties.message_headers``), around it the headers the session adds,
    in the frame's order; a name that occurs twice keeps its first value, as a STOMP parser
    reads a repeated header (STOMP 1.2).  tests/unit checks the rows against frames the
    session renders and the parser reads back.

    ``include_headers=False`` (option ``includeHeaders=false``): ``add_rows`` leaves every
    row's headers map empty and renders no header but the destination."""

    def __init__(self, *, include_headers: bool = True) -> None:
        self.include_headers = include_headers
        self._destinations: dict[tuple[str, str], str] = {}

    def _destination(self, exchange: str, routing_key: str) -> str:
        key = (exchange, routing_key)
        destination = self._destinations.get(key)
        if destination is None:
            destination = message_destination(exchange, routing_key)
            if not destination.isascii():
                destination = _valid_text(destination)
            if len(self._destinations) < _DESTINATIONS_KEPT:
                self._destinations[key] = destination
        return destination

    def message_headers(self, delivery: Delivery) -> tuple[str, dict[str, str]]:
        """(destination, headers) of the MESSAGE a STOMP subscriber would get for ``delivery``."""
        headers = _headers(delivery, message_destination(delivery.exchange, delivery.routing_key))
        return headers["destination"], headers

    def add_rows(self, columns: RowColumns, deliveries: list[Delivery], offsets: list[int]) -> None:
        """The rows of ``deliveries`` (the messages at ``offsets`` of ``columns.stream``) added
        to ``columns`` a column at a time, the headers too where every row's have the same
        names (``message_header_columns``), else a row's headers at a time."""
        bodies = [delivery.body for delivery in deliveries]
        columns.bodies += bodies
        columns.body_bytes += sum(map(len, bodies))
        columns.offsets += offsets
        properties = [delivery.properties for delivery in deliveries]
        columns.timestamps += _timestamps_micros([p.timestamp for p in properties])
        routes = [(delivery.exchange, delivery.routing_key) for delivery in deliveries]
        if routes and routes.count(routes[0]) == len(routes):  # one stream's own messages
            destinations = [self._destination(*routes[0])] * len(routes)
        else:
            destination_of = self._destinations.get
            destinations = [destination_of(route) or self._destination(*route) for route in routes]
        if not self.include_headers:
            columns.destinations += destinations
            columns.header_ends += [len(columns.header_names)] * len(deliveries)  # empty maps
            return
        shared = _shared_header_columns(deliveries, properties, destinations, bodies)
        if shared is None:
            columns.flatten_headers()
            first = len(columns.header_ends) - 1  # the first row added here
            _add_header_rows(columns, deliveries, destinations)
            columns.replace_invalid_text(first)
        else:  # every row's headers have the same names: added a column at a time
            columns.add_header_columns(shared)
        columns.destinations += destinations

    def row(self, delivery: Delivery, stream: str, offset: int) -> Row:
        """The row of ``delivery``, the message at ``offset`` of ``stream``."""
        destination, headers = self.message_headers(delivery)
        return (destination, headers, delivery.body, offset, _timestamp(delivery.properties), stream)

    def row_without_headers(self, delivery: Delivery, stream: str, offset: int) -> Row:
        """The row of ``delivery`` with an empty ``headers`` map (option ``includeHeaders=false``):
        the destination alone, as the MESSAGE ``destination`` header would carry it."""
        destination = self._destination(delivery.exchange, delivery.routing_key)
        return (destination, {}, delivery.body, offset, _timestamp(delivery.properties), stream)

    def render(self, delivery: Delivery, stream: str) -> StreamMessage:
        return StreamMessage(*self.row(delivery, stream, stream_offset(delivery)))


def _add_header_rows(columns: RowColumns, deliveries: list[Delivery], destinations: list[str]) -> None:
    """The headers of ``deliveries`` added to ``columns`` a row at a time."""
    names, values, ends = columns.header_names, columns.header_values, columns.header_ends
    for delivery, destination in zip(deliveries, destinations, strict=True):
        table = delivery.properties.headers
        if table and not _NAMES_TAKEN.isdisjoint(table):
            # a headers table naming a header the session or a property writes: the first
            # value of a name wins, as _headers decides
            headers = _headers(delivery, destination)
            names += headers
            values += headers.values()
        else:  # every name once: the frame's order as it comes
            names += _SESSION_NAMES
            values += (destination, "true" if delivery.redelivered else "false")
            for name, value in message_headers(delivery.properties):
                names.append(name)
                values.append(value)
            if delivery.body:
                names.append("content-length")
                values.append(str(len(delivery.body)))
        ends.append(len(names))


def _shared_header_columns(
    deliveries: list[Delivery],
    properties: list[MessageProperties],
    destinations: list[str],
    bodies: list[bytes],
) -> list[tuple[str, Sequence[str]]] | None:
    """The headers of ``deliveries`` a column at a time, as ``_add_header_rows`` would add them
    row by row, where every row has the same header names in the same order, each once; else
    None.  The messages of one stream typically do: the same publisher, the same properties."""
    if not deliveries:
        return []
    table = properties[0].headers
    if table and not _NAMES_TAKEN.isdisjoint(table):
        return None  # a name written twice: the first value wins, row by row
    columns = message_header_columns(properties)
    if columns is None:
        return None
    count = len(deliveries)
    lengths = list(map(len, bodies))
    empty = lengths.count(0)
    if empty and empty != count:
        return None  # content-length on some rows only
    redelivered = [delivery.redelivered for delivery in deliveries]
    again = redelivered.count(True)
    if again in (0, count):
        flags = ["true" if again else "false"] * count
    else:
        flags = ["true" if flag else "false" for flag in redelivered]
    shared = [("destination", destinations), ("redelivered", flags), *columns]
    if not empty:
        length = lengths[0]
        same = lengths.count(length) == count
        shared.append(("content-length", [str(length)] * count if same else list(map(str, lengths))))
    return shared


def _headers(delivery: Delivery, destination: str) -> dict[str, str]:
    """The MESSAGE headers of ``delivery`` but the subscriber's own, in the frame's order;
    text Spark's strings cannot hold (not UTF-8) replaced."""
    # the session's own headers first (subscription, message-id and ack are the subscriber's)
    headers = {"destination": destination, "redelivered": "true" if delivery.redelivered else "false"}
    for name, value in message_headers(delivery.properties):
        if name not in headers and name not in SUBSCRIPTION_HEADERS:
            headers[name] = value
    if delivery.body:
        headers["content-length"] = str(len(delivery.body))
    if not (_valid_utf8("".join(headers)) and _valid_utf8("".join(headers.values()))):
        headers = {_valid_text(name): _valid_text(value) for name, value in headers.items()}
    return headers


def _extended(column: Sequence[str], more: Sequence[str]) -> Sequence[str]:
    """``column``, a block's own, with ``more`` after it: extended in place where it can be."""
    if isinstance(more, DecimalTexts) and not column:
        return DecimalTexts(list(more.integers))
    if isinstance(column, DecimalTexts) and isinstance(more, DecimalTexts):
        column.integers += more.integers
        return column
    texts: list[str] = column if isinstance(column, list) else list(column)
    texts.extend(more)
    return texts


def _valid_column(values: Sequence[str]) -> bool:
    if isinstance(values, DecimalTexts):
        return True
    if values.count(values[0]) == len(values):  # one value (the same object) in every row
        return _valid_utf8(values[0])
    return _valid_utf8("".join(values))


def _valid_utf8(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def stream_offset(delivery: Delivery) -> int:
    headers = delivery.properties.headers or {}
    offset = headers.get(STREAM_OFFSET_HEADER)
    if not isinstance(offset, int) or isinstance(offset, bool):
        raise ValueError(
            f"a delivery without an integer {STREAM_OFFSET_HEADER} header (got {offset!r}): "
            "is the queue a stream (x-queue-type: stream)?"
        )
    return offset


# The last second a timestamp column holds (9999-12-31 23:59:59 UTC, Python's and Spark's end)
_LAST_SECOND: Final = 253_402_300_799


def _timestamp(properties: MessageProperties) -> datetime.datetime | None:
    # RabbitMQ 3.10 does not pass a stream chunk's time to AMQP 0-9-1 consumers; the AMQP
    # timestamp property (the STOMP 'timestamp' header of a SEND) is the time there is.
    micros = _timestamp_micros(properties.timestamp)
    if micros is None:
        return None
    return datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC) + datetime.timedelta(microseconds=micros)


def _timestamps_micros(seconds: list[int | None]) -> list[int | None]:
    """``_timestamp_micros`` of each, at no cost per message where none has a time."""
    if seconds.count(None) == len(seconds):
        return seconds
    return [_timestamp_micros(each) for each in seconds]


def _timestamp_micros(seconds: int | None) -> int | None:
    """An AMQP timestamp (whole seconds, unsigned) as microseconds; None beyond year 9999."""
    if seconds is None or seconds > _LAST_SECOND:
        return None
    return seconds * 1_000_000


def _valid_text(value: str) -> str:
    # Header bytes that are not UTF-8 reach the adapter as surrogate escapes, which Spark's
    # strings (UTF-8) cannot hold: they become U+FFFD, the rest of the value is kept.
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    return value


# --------------------------------------------------------------------------------- writing
class PublishPlan(NamedTuple):
    """What publishing one row takes besides its body: a declare first (a ``/queue/`` not yet
    declared on this connection), then one publish.

    ``mandatory``: the row names one existing queue (``/amq/queue/``, ``/reply-queue/``), so a
    message the broker cannot route means the queue is missing.  A STOMP SEND there is dropped
    silently by the broker; a Spark task fails instead (docs/spark.md, "Sink")."""

    declare: tuple[str, QueueParams] | None
    exchange: str
    routing_key: str
    properties: MessageProperties
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
        # destination -> the plan of a row without headers to it (body b""), the declare done
        self._headerless: dict[str, PublishPlan] = {}

    def plan(
        self, destination: str | None, headers: Mapping[str, str] | None, body: bytes | bytearray | str | None
    ) -> tuple[PublishPlan, bytes]:
        """The row's plan and its body as bytes.  Raises RowError, with the ERROR message and
        text the adapter would send a STOMP client for the same SEND (or the size limit it
        would apply to the frame)."""
        data = _body_bytes(body)
        if not headers and destination is not None and len(data) <= self.max_body_size:
            # rows without headers to one destination differ by their body alone: planned once
            known = self._headerless.get(destination)
            if known is not None:
                return known, data
        try:
            plan = self._plan(destination, dict(headers or {}), data)
        except StompError as error:
            raise RowError(f"{error.message}: {error.detail.strip()}") from None
        if not headers and destination is not None and len(self._headerless) < _PLANS_KEPT:
            self._headerless[destination] = plan._replace(declare=None)
        return plan, data

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
            if len(self._destinations) < _PLANS_KEPT:
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
        return PublishPlan(declare, exchange, routing_key, properties, mandatory)


def _body_bytes(body: bytes | bytearray | str | None) -> bytes:
    if type(body) is bytes:
        return body
    if body is None:
        return b""
    if isinstance(body, str):
        return body.encode("utf-8")
    return bytes(body)
