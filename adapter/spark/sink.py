"""The ``stomp`` sink: each row published as the adapter publishes a STOMP SEND.

Owns the writer classes (batch and streaming), the rows of what Spark hands them (Arrow record
batches, taken a column at a time; PySpark 4.0's streaming writer gets ``Row``\\ s), and the
per-task publishing loop: one AMQP connection per task with publisher confirms, rows planned
by ``messages.PublishPlanner`` (the adapter's destination and header rules), every message
persistent, and the task ends only once the broker has confirmed every message it published.
A refused row, a nack, an unroutable message to a named queue or a missing confirm fails the
task (at-least-once: a retried task publishes its rows again).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from itertools import repeat
from typing import Any, Final

import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import BinaryType, MapType, StringType, StructType

from ..stomp.codec import FrameLimits
from .broker import BlockingBroker, BrokerUrl
from .messages import PublishPlanner, RowError
from .options import DEFAULT_TIMEOUT, broker_url, positive_option, seconds_option

# Publishes in flight before the task waits for confirms: bounds memory and the work a failed
# task has to redo, while keeping the socket busy.
CONFIRM_WINDOW: Final = 2000


try:  # PySpark 4.1+: a streaming writer may take Spark's record batches as they are
    from pyspark.sql.datasource import DataSourceStreamArrowWriter as _StreamWriter

    STREAM_WRITER_TAKES_ARROW = True
except ImportError:  # pragma: no cover - PySpark 4.0: rows
    from pyspark.sql.datasource import DataSourceStreamWriter as _StreamWriter  # type: ignore[assignment]

    STREAM_WRITER_TAKES_ARROW = False


class SinkSchemaError(ValueError):
    """The DataFrame's columns do not fit the sink; the text names the column."""


@dataclass(frozen=True, slots=True)
class SinkColumns:
    """Positions of the sink's columns in each row (``headers`` is optional)."""

    destination: int
    body: int
    headers: int | None


def sink_columns(schema: StructType) -> SinkColumns:
    names = schema.fieldNames()
    types = {field.name: field.dataType for field in schema.fields}
    if "destination" not in types:
        raise SinkSchemaError(f"the sink needs a 'destination' column (string); the columns are {names}")
    if not isinstance(types["destination"], StringType):
        raise SinkSchemaError(
            f"column 'destination' must be a string, not {types['destination'].simpleString()}"
        )
    if "body" not in types:
        raise SinkSchemaError(f"the sink needs a 'body' column (binary or string); the columns are {names}")
    if not isinstance(types["body"], BinaryType | StringType):
        raise SinkSchemaError(f"column 'body' must be binary or string, not {types['body'].simpleString()}")
    headers = None
    if "headers" in types:
        kind = types["headers"]
        if not (
            isinstance(kind, MapType)
            and isinstance(kind.keyType, StringType)
            and isinstance(kind.valueType, StringType)
        ):
            raise SinkSchemaError(f"column 'headers' must be map<string,string>, not {kind.simpleString()}")
        headers = names.index("headers")
    return SinkColumns(names.index("destination"), names.index("body"), headers)


@dataclass(frozen=True, slots=True)
class SinkSettings:
    url: BrokerUrl
    columns: SinkColumns
    max_body_size: int
    timeout: float


def sink_settings(options: Mapping[str, str], schema: StructType) -> SinkSettings:
    max_body = positive_option(options, "maxFrameSize", FrameLimits().max_frame_size)
    assert max_body is not None
    timeout = seconds_option(options, "timeout", DEFAULT_TIMEOUT)
    return SinkSettings(broker_url(options), sink_columns(schema), max_body, timeout)


@dataclass(frozen=True)
class PublishedCount(WriterCommitMessage):
    rows: int


# One row to publish: its destination, its headers as (name, value) pairs (a null value is no
# header), its body; None where the column is null or absent.
SinkRow = tuple[str | None, Iterable[tuple[str, str | None]] | None, bytes | bytearray | str | None]


def batch_rows(columns: SinkColumns, batches: Iterable[pa.RecordBatch]) -> Iterator[SinkRow]:
    """The rows of Arrow record batches (what Spark hands a writer), a column at a time."""
    for batch in batches:
        destinations = batch.column(columns.destination).to_pylist()
        bodies = batch.column(columns.body).to_pylist()
        if columns.headers is None:
            yield from zip(destinations, repeat(None), bodies)  # noqa: B905 (repeat is endless)
        else:  # a map column comes as a list of (key, value) pairs per row
            yield from zip(destinations, batch.column(columns.headers).to_pylist(), bodies, strict=True)


def row_values(columns: SinkColumns, rows: Iterable[Any]) -> Iterator[SinkRow]:
    """The rows of PySpark ``Row``\\ s (what Spark hands a row-based writer: PySpark 4.0's
    streaming writer)."""
    destination, body, headers = columns.destination, columns.body, columns.headers
    for row in rows:
        pairs = None if headers is None or row[headers] is None else row[headers].items()
        yield row[destination], pairs, row[body]


def publish_rows(settings: SinkSettings, rows: Iterable[SinkRow]) -> int:
    """Publish every row and wait for all confirms; the number of rows confirmed."""
    planner = PublishPlanner(max_body_size=settings.max_body_size)
    published = 0
    with BlockingBroker(settings.url, connection_name="spark sink", timeout=settings.timeout) as broker:
        broker.confirm_select()
        for destination, pairs, body in rows:
            broker.refresh_token()  # options token / tokenFile: a long write outlives its token
            # a null map value is no header, as a SEND cannot carry a header without value
            headers = None if pairs is None else {k: v for k, v in pairs if v is not None}
            try:
                plan, data = planner.plan(destination, headers, body)
            except RowError as error:
                raise RowError(f"row {published + 1} of this task cannot be published: {error}") from None
            if plan.declare is not None:
                queue, params = plan.declare
                broker.queue_declare(
                    queue,
                    durable=params.durable,
                    exclusive=params.exclusive,
                    auto_delete=params.auto_delete,
                    arguments=dict(params.arguments),
                )
            broker.publish(plan.exchange, plan.routing_key, plan.properties, data, mandatory=plan.mandatory)
            published += 1
            if broker.published - broker.confirmed >= CONFIRM_WINDOW:
                broker.drain_confirms(keep_unconfirmed=CONFIRM_WINDOW // 2)
        broker.drain_confirms()
    return published


class StompBatchWriter(DataSourceArrowWriter):
    """A batch write: each task publishes the record batches Spark hands it."""

    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        self.settings = sink_settings(options, schema)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return PublishedCount(publish_rows(self.settings, batch_rows(self.settings.columns, iterator)))


class StompStreamWriter(_StreamWriter):
    """Each micro-batch's rows published by its tasks; Spark's commit needs nothing more (a
    replayed batch after a crash publishes again: at-least-once).  Record batches from PySpark
    4.1, rows before."""

    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        self.settings = sink_settings(options, schema)

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        columns = self.settings.columns
        rows = batch_rows(columns, iterator) if STREAM_WRITER_TAKES_ARROW else row_values(columns, iterator)
        return PublishedCount(publish_rows(self.settings, rows))
