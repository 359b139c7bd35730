"""The micro-batch bounds of the streaming reader in a local SparkSession against the real
RabbitMQ: ``maxBytesPerTrigger`` (body bytes, shared by the streams), ``minOffsetsPerTrigger``
with ``maxTriggerDelay`` (as Kafka's), and Trigger.AvailableNow, which lifts the minimum; and
``includeHeaders=false``, which spares the reader the MESSAGE headers."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.spark.conftest import publish
from tests.spark.test_spark import read_stream
from tests.spark.test_spark_positions import run_available_now

pytestmark = pytest.mark.timeout(300)


def planned(checkpoint: Path) -> list[dict[str, int]]:
    """The end offsets of every planned micro-batch, in order (Spark's offset log)."""
    log = checkpoint / "offsets"
    batches = sorted(int(entry.name) for entry in log.iterdir() if entry.name.isdigit())
    return [json.loads((log / str(n)).read_text().splitlines()[-1]) for n in batches]


def test_max_bytes_per_trigger_bounds_each_batch_by_body_bytes(spark, amqp_url, queues, broker, tmp_path):
    stream = queues("spark-bytes")
    # 100-byte bodies, and one of 1,000 bytes: alone over the bound, it still makes a batch
    bodies = [b"%03d" % i + b"x" * 97 for i in range(7)] + [b"y" * 1000] + [b"z" * 100]
    publish(broker, stream, bodies)
    run_available_now(
        spark,
        amqp_url,
        stream,
        tmp_path / "out",
        tmp_path / "checkpoint",
        startingOffsets="earliest",
        maxBytesPerTrigger="250",
    )
    assert [batch[stream] for batch in planned(tmp_path / "checkpoint")] == [2, 4, 6, 7, 8, 9]
    written = spark.read.parquet(str(tmp_path / "out")).collect()
    assert sorted(row.offset for row in written) == list(range(9))


def test_max_bytes_per_trigger_is_shared_by_the_streams(spark, amqp_url, queues, broker, tmp_path):
    first, second = queues("spark-bytes-a"), queues("spark-bytes-b")
    publish(broker, first, [b"a" * 100] * 6)
    publish(broker, second, [b"b" * 100] * 2)
    query = (
        spark.readStream.format("stomp")
        .option("url", amqp_url)
        .option("destination", f"/amq/queue/{first},/amq/queue/{second}")
        .option("startingOffsets", "earliest")
        .option("maxBytesPerTrigger", "400")
        .load()
        .writeStream.format("parquet")
        .option("path", str(tmp_path / "out"))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(180), "the AvailableNow query did not stop by itself"
    assert query.exception() is None
    # 200 bytes (two messages) a stream and batch, whatever the other stream has left
    assert planned(tmp_path / "checkpoint") == [
        {first: 2, second: 2},
        {first: 4, second: 2},
        {first: 6, second: 2},
    ]


def start_query(spark: Any, amqp_url: str, stream: str, tmp_path: Path, **options: str) -> Any:
    reader = spark.readStream.format("stomp").option("url", amqp_url)
    reader = reader.option("destination", f"/amq/queue/{stream}").option("startingOffsets", "earliest")
    for name, value in options.items():
        reader = reader.option(name, value)
    return (
        reader.load()
        .writeStream.format("parquet")
        .option("path", str(tmp_path / "out"))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )


def rows_read(query: Any) -> list[int]:
    return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"] > 0]


def wait_for_rows(query: Any, total: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while sum(rows_read(query)) < total:
        assert query.exception() is None, query.exception()
        assert time.monotonic() < deadline, f"only {sum(rows_read(query))} of {total} rows read"
        time.sleep(0.1)


def test_min_offsets_per_trigger_waits_until_enough_have_arrived(spark, amqp_url, queues, broker, tmp_path):
    stream = queues("spark-min")
    publish(broker, stream, [b"early %d" % i for i in range(3)])
    query = start_query(spark, amqp_url, stream, tmp_path, minOffsetsPerTrigger="5", maxTriggerDelay="1h")
    try:
        # triggers go by (every 200 ms) with 3 of the 5 offsets there: no batch
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            assert query.exception() is None
            time.sleep(0.2)
        assert query.isActive and rows_read(query) == []
        # Spark may plan one empty first batch (from the initial offset to itself), no more
        assert all(batch[stream] == 0 for batch in planned(tmp_path / "checkpoint"))
        publish(broker, stream, [b"late %d" % i for i in range(2)])
        wait_for_rows(query, 5, 60)
    finally:
        query.stop()
    assert rows_read(query) == [5]


def test_max_trigger_delay_ends_the_wait(spark, amqp_url, queues, broker, tmp_path):
    stream = queues("spark-delay")
    publish(broker, stream, [b"only %d" % i for i in range(3)])
    query = start_query(spark, amqp_url, stream, tmp_path, minOffsetsPerTrigger="1000", maxTriggerDelay="2s")
    try:
        wait_for_rows(query, 3, 60)  # far fewer than 1,000, read once the 2 s have passed
    finally:
        query.stop()
    assert rows_read(query) == [3]


def test_trigger_available_now_does_not_wait_for_the_minimum(spark, amqp_url, queues, broker, tmp_path):
    stream = queues("spark-min-now")
    publish(broker, stream, [b"n%d" % i for i in range(4)])
    query = run_available_now(
        spark,
        amqp_url,
        stream,
        tmp_path / "out",
        tmp_path / "checkpoint",
        startingOffsets="earliest",
        minOffsetsPerTrigger="100",
    )
    assert rows_read(query) == [4]


def test_include_headers_false_reads_an_empty_headers_map(spark, amqp_url, queues, broker):
    stream = queues("spark-no-headers")
    publish(broker, stream, [b"h0", b"h1"], {"colour": "red"})
    rows = read_stream(spark, amqp_url, f"/amq/queue/{stream}", includeHeaders="false")
    assert [(row.offset, row.body, row.headers, row.destination) for row in rows] == [
        (0, b"h0", {}, f"/queue/{stream}"),
        (1, b"h1", {}, f"/queue/{stream}"),
    ]
