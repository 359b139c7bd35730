"""The ``stomp`` sink: each row published as the adapter publishes a STOMP SEND.

Owns the writer classes (batch and streaming) and the per-task publishing loop: one AMQP
connection per task with publisher confirms, rows planned by ``messages.PublishPlanner`` (the
adapter's destination and header rules), every message persistent, and the task ends only once
the broker has confirmed every message it published.  A refused row, a nack, an unroutable
message to a named queue or a missing confirm fails the task (at-least-once: a retried task
publishes its rows again).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import BinaryType, MapType, StringType, StructType

from ..stomp.codec import FrameLimits
from .broker import BlockingBroker, BrokerUrl
from .messages import PublishPlanner, RowError
from .options import DEFAULT_TIMEOUT, broker_url, positive_option, seconds_option

# Publishes in flight before the task waits for confirms: bounds memory and the work a failed
# task has to redo, while keeping the socket busy.
CONFIRM_WINDOW: Final = 2000


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


def publish_rows(settings: SinkSettings, rows: Iterator[Any]) -> int:
    """Publish every row and wait for all confirms; the number of rows confirmed."""
    planner = PublishPlanner(max_body_size=settings.max_body_size)
    columns = settings.columns
    published = 0
    with BlockingBroker(settings.url, connection_name="spark sink", timeout=settings.timeout) as broker:
        broker.confirm_select()
        for row in rows:
            broker.refresh_token()  # options token / tokenFile: a long write outlives its token
            headers = None
            if columns.headers is not None and row[columns.headers] is not None:
                # a null map value is no header, as a SEND cannot carry a header without value
                headers = {k: v for k, v in row[columns.headers].items() if v is not None}
            try:
                plan = planner.plan(row[columns.destination], headers, row[columns.body])
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
            broker.publish(
                plan.exchange, plan.routing_key, plan.properties, plan.body, mandatory=plan.mandatory
            )
            published += 1
            if broker.published - broker.confirmed >= CONFIRM_WINDOW:
                broker.drain_confirms(keep_unconfirmed=CONFIRM_WINDOW // 2)
        broker.drain_confirms()
    return published


class StompBatchWriter(DataSourceWriter):
    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        self.settings = sink_settings(options, schema)

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        return PublishedCount(publish_rows(self.settings, iterator))


class StompStreamWriter(DataSourceStreamWriter):
    """Each micro-batch's rows published by its tasks; Spark's commit needs nothing more (a
    replayed batch after a crash publishes again: at-least-once)."""

    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        self.settings = sink_settings(options, schema)

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        return PublishedCount(publish_rows(self.settings, iterator))
