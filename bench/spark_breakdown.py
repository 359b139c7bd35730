"""``python -m bench.spark_breakdown``: where one Spark task's Python time goes, per row, without
Spark's JVM (docs/performance.md, "Spark").

A task of the ``stomp`` source runs ``read(partition)`` in a Python worker, which then writes the
record batches to the JVM as an Arrow IPC stream; a task of the sink gets Arrow record batches from
the JVM and, unless the writer takes them as they are (``DataSourceArrowWriter``), has PySpark turn
each row into a ``Row`` first.  This bench runs exactly that Python work in one process, on one
stream of N 1 KiB messages, beside the bare AMQP clients of ``bench.spark``:

read, µs per row:

* ``bare consumer``: the blocking client alone, acknowledging every 256 (what the ratio divides by);
* ``source read()``: the data source's ``read`` of the whole range as one partition, every record
  batch it yields consumed;
* ``+ IPC out``: the same, each batch also written as Arrow IPC (the worker's share after ``read``).

write, µs per row:

* ``bare publisher``: confirmed, the same window as the sink;
* ``sink write()``: the sink's ``write`` fed as the Python worker feeds it: record batches of
  ``spark.sql.execution.arrow.maxRecordsPerBatch`` (10,000) rows, turned into ``Row``\\ s by
  PySpark's own converters when the writer takes rows.

Each variant runs ``--rounds`` times, the variants alternating, after a warm-up; the figures are
the best round's wall-clock time and the best round's CPU time of this process (the Python
work itself, which the rest of the machine disturbs less; the broker's is not in it).
``--in-memory`` adds the reader's own work on deliveries read beforehand (rendering the rows into
columns, with and without headers; making them record batches), CPU µs per row: the part of
``read()`` that is neither the socket nor the AMQP decoding.  ``--profile read|write`` prints
cProfile's top functions of one more run instead of nothing.  The stream and the sink's queue are
deleted at the end.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa

from adapter.spark.broker import BlockingBroker, parse_broker_url
from bench.spark import BODY, bare_consume, bare_publish

PREFETCH = 1000
# PySpark's default spark.sql.execution.arrow.maxRecordsPerBatch: the batches a sink task gets
SINK_BATCH_ROWS = 10_000


def source_task(url: str, stream: str, count: int) -> tuple[Any, Any]:
    """The reader and the one partition of a batch read of offsets [0, count), planned as the
    driver plans them."""
    from adapter.spark.source import StompDataSource

    source = StompDataSource(
        {
            "url": url,
            "destination": f"/amq/queue/{stream}",
            "startingOffsets": "0",
            "endingOffsets": str(count),
            "partitionSize": str(count),
            "prefetch": str(PREFETCH),
        }
    )
    reader = source.reader(None)  # type: ignore[arg-type]
    (partition,) = reader.partitions()
    return reader, partition


def source_read(task: tuple[Any, Any], count: int, *, ipc: bool = False) -> None:
    """One task's ``read()``, every batch consumed (and written as Arrow IPC with ``ipc``)."""
    reader, partition = task
    rows = 0
    if ipc:
        sink = pa.MockOutputStream()
        writer = None
        for batch in reader.read(partition):
            if writer is None:
                writer = pa.ipc.new_stream(sink, batch.schema)
            writer.write_batch(batch)
            rows += batch.num_rows
        if writer is not None:
            writer.close()
    else:
        rows = sum(batch.num_rows for batch in reader.read(partition))
    if rows != count:
        raise SystemExit(f"source read: {rows} rows of {count}")


def in_memory(url: str, stream: str, count: int, rounds: int) -> dict[str, float]:
    """CPU µs per row of the reader's own work on deliveries already read (no socket, no
    broker): the rows rendered into columns (with and without headers) and the columns made
    record batches; the best of ``rounds``."""
    from adapter.spark.messages import MessageRenderer, RowColumns
    from adapter.spark.source import ARROW_BATCH_ROWS, arrow_batch
    from adapter.spark.streams import OffsetRange, ReadSettings, read_deliveries

    pieces = list(read_deliveries(ReadSettings(parse_broker_url(url)), OffsetRange(stream, "", 0, count)))

    def render(include_headers: bool) -> list[RowColumns]:
        renderer = MessageRenderer(include_headers=include_headers)
        batches = [RowColumns(stream)]
        for deliveries, offsets in pieces:
            renderer.add_rows(batches[-1], deliveries, offsets)
            if len(batches[-1]) >= ARROW_BATCH_ROWS:
                batches.append(RowColumns(stream))
        return batches

    def cpu(work: Callable[[], Any]) -> float:
        return min(timed(work)[1] for _ in range(rounds)) * 1e6 / count

    full, bare = render(True), render(False)
    return {
        "render, headers": cpu(lambda: render(True)),
        "render, includeHeaders=false": cpu(lambda: render(False)),
        "Arrow, headers": cpu(lambda: [arrow_batch(columns) for columns in full]),
        "Arrow, includeHeaders=false": cpu(lambda: [arrow_batch(columns) for columns in bare]),
    }


def sink_batches(queue: str, count: int) -> list[pa.RecordBatch]:
    """The record batches a sink task gets for ``count`` rows (destination, body)."""
    schema = pa.schema([("destination", pa.string()), ("body", pa.binary())])
    batches = []
    for start in range(0, count, SINK_BATCH_ROWS):
        rows = min(SINK_BATCH_ROWS, count - start)
        batches.append(
            pa.record_batch(
                [pa.array([f"/amq/queue/{queue}"] * rows), pa.array([BODY] * rows)], schema=schema
            )
        )
    return batches


def rows_as_pyspark_makes_them(batches: list[pa.RecordBatch], spark_schema: Any) -> Iterator[Any]:
    """The ``Row``\\ s PySpark's write worker makes of the batches for a row-based writer: its
    own converters, called per value (pyspark/sql/worker/write_into_data_source.py)."""
    from pyspark.sql.conversion import ArrowTableToRowsConversion
    from pyspark.sql.types import _create_row

    converters = [
        ArrowTableToRowsConversion._create_converter(field.dataType, binary_as_bytes=True)
        for field in spark_schema.fields
    ]
    fields = spark_schema.fieldNames()
    for batch in batches:
        columns = [ArrowTableToRowsConversion._to_pylist(column) for column in batch.columns]
        for row in range(batch.num_rows):
            yield _create_row(fields, [converters[i](columns[i][row]) for i in range(batch.num_columns)])


def sink_write(url: str, batches: list[pa.RecordBatch]) -> None:
    """One task's ``write()`` of the batches, fed as the Python worker feeds it."""
    from pyspark.sql.datasource import DataSourceArrowWriter
    from pyspark.sql.types import BinaryType, StringType, StructField, StructType

    from adapter.spark.source import StompDataSource

    schema = StructType([StructField("destination", StringType()), StructField("body", BinaryType())])
    writer = StompDataSource({"url": url}).writer(schema, False)
    if isinstance(writer, DataSourceArrowWriter):
        writer.write(iter(batches))
    else:
        writer.write(rows_as_pyspark_makes_them(batches, schema))


def timed(work: Callable[[], Any]) -> tuple[float, float]:
    """(wall-clock, this process's CPU) seconds of ``work``."""
    started, cpu = time.perf_counter(), time.process_time()
    work()
    return time.perf_counter() - started, time.process_time() - cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--amqp-url", default=os.environ.get("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
    )
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--in-memory",
        action="store_true",
        help="also the reader's rendering and Arrow work without the socket",
    )
    parser.add_argument("--profile", choices=("read", "write"), help="cProfile one more run of this side")
    args = parser.parse_args(argv)
    url, count = args.amqp_url, args.messages

    stream, sink = f"bench-breakdown-in-{uuid.uuid4().hex[:8]}", f"bench-breakdown-out-{uuid.uuid4().hex[:8]}"
    with BlockingBroker(parse_broker_url(url), connection_name="bench setup") as broker:
        for name in (stream, sink):
            broker.queue_declare(name, durable=True, arguments={"x-queue-type": "stream"})
    try:
        bare_publish(url, stream, count)
        batches = sink_batches(sink, count)
        task = source_task(url, stream, count)
        variants: dict[str, Callable[[], None]] = {
            "read: bare consumer": lambda: bare_consume(url, stream, count, PREFETCH),
            "read: source read()": lambda: source_read(task, count),
            "read: + IPC out": lambda: source_read(task, count, ipc=True),
            "write: bare publisher": lambda: bare_publish(url, sink, count),
            "write: sink write()": lambda: sink_write(url, batches),
        }
        for work in variants.values():  # warm-up
            work()
        best = dict.fromkeys(variants, float("inf"))
        best_cpu = dict.fromkeys(variants, float("inf"))
        for _ in range(args.rounds):
            for name, work in variants.items():
                wall, cpu = timed(work)
                best[name] = min(best[name], wall)
                best_cpu[name] = min(best_cpu[name], cpu)
        memory = in_memory(url, stream, count, args.rounds) if args.in_memory else {}
        if args.profile:
            work = variants["read: source read()" if args.profile == "read" else "write: sink write()"]
            profile = cProfile.Profile()
            profile.runcall(work)
    finally:
        with BlockingBroker(parse_broker_url(url), connection_name="bench cleanup") as broker:
            for name in (stream, sink):
                broker.queue_delete(name)

    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    print(f"{count} messages of {len(BODY)} B, best of {args.rounds} alternating rounds; load average {load}")
    per_row = 1e6 / count
    print(f"{'':26}{'wall µs/row':>12}{'ratio':>7}{'CPU µs/row':>12}{'ratio':>7}")
    for side in ("read", "write"):
        names = [name for name in variants if name.startswith(side)]
        base, base_cpu = best[names[0]], best_cpu[names[0]]
        for name in names:
            print(
                f"{name:26}{best[name] * per_row:>12.2f}{base / best[name]:>7.2f}"
                f"{best_cpu[name] * per_row:>12.2f}{base_cpu / best_cpu[name]:>7.2f}"
            )
    for name, value in memory.items():
        print(f"read, in memory: {name:30}{value:>8.2f} CPU µs/row")
    if args.profile:
        pstats.Stats(profile).sort_stats("tottime").print_stats(25)
    return 0


if __name__ == "__main__":
    sys.exit(main())
