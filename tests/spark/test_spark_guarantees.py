"""What the data source promises under pressure, in a real local SparkSession against the real
RabbitMQ: reads finish on a stream that never stops growing, a query killed before its commit
writes every message once after the restart, the streaming sink reaches STOMP subscribers, and
a message the broker refuses (basic.nack) fails the write.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from adapter.spark.broker import BlockingBroker, parse_broker_url
from adapter.spark.streams import OffsetRange, ReadSettings, next_offset, read_deliveries
from tests.spark.conftest import SteadyPublisher, publish
from tests.spark.test_spark import failure_text, read_stream, write_rows
from tests.spark.test_spark_positions import run_available_now
from tests.support import StompClient

pytestmark = pytest.mark.timeout(300)

# a message every 20 ms: far more often than the end probe's quiet time (0.2 s)
STEADY_INTERVAL = 0.02


def finishes(work: Callable[[], Any], within: float, what: str) -> Any:
    """``work()`` run in a thread; its result, or a test failure naming ``what`` if it has not
    returned after ``within`` seconds (a liveness bound, not a measurement)."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["result"] = work()
        except BaseException as error:
            outcome["error"] = error

    thread = threading.Thread(target=run, name=what, daemon=True)
    thread.start()
    thread.join(within)
    assert not thread.is_alive(), f"{what} did not finish within {within:g} s"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


def offsets(rows: list[Any]) -> list[int]:
    return sorted(row.offset for row in rows)


# ------------------------------------------------------------------- a stream that keeps growing
def test_end_probe_finishes_while_messages_keep_arriving(amqp_url, queues, broker: BlockingBroker):
    stream = queues("spark-busy-probe")
    with SteadyPublisher(amqp_url, stream, STEADY_INTERVAL) as publisher:
        publisher.wait_for(10)
        before = publisher.confirmed
        end = finishes(lambda: next_offset(broker, stream), 30, "the end probe")
        after = publisher.confirmed
    # every message confirmed before the probe is below the end; the end is a delivered offset
    assert before <= end <= after + 1


def test_batch_and_streaming_reads_finish_while_messages_keep_arriving(spark, amqp_url, queues, tmp_path):
    stream = queues("spark-busy")
    destination = f"/amq/queue/{stream}"
    output, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    with SteadyPublisher(amqp_url, stream, STEADY_INTERVAL) as publisher:
        publisher.wait_for(20)
        before = publisher.confirmed
        rows = finishes(
            lambda: read_stream(spark, amqp_url, destination, endingOffsets="latest"),
            120,
            "the batch read with endingOffsets=latest",
        )
        assert len(rows) >= before
        assert offsets(rows) == list(range(len(rows)))

        query = (
            spark.readStream.format("stomp")
            .option("url", amqp_url)
            .option("destination", destination)
            .option("startingOffsets", "earliest")
            .load()
            .writeStream.format("parquet")
            .option("path", str(output))
            .option("checkpointLocation", str(checkpoint))
            .trigger(processingTime="300 milliseconds")
            .start()
        )
        try:
            # each trigger asks for the latest offset: several batches while publishing goes on
            deadline = time.monotonic() + 120
            while len([p for p in query.recentProgress if p["numInputRows"] > 0]) < 3:
                assert query.exception() is None
                assert time.monotonic() < deadline, "no three micro-batches while messages kept arriving"
                time.sleep(0.2)
        except BaseException:
            query.stop()
            raise
    published = publisher.stop()
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    assert query.exception() is None
    written = spark.read.parquet(str(output)).select("offset").collect()
    assert len(written) == published
    assert offsets(written) == list(range(published))


# ------------------------------------------------------------------- a query killed before commit
def remove_log_entry(log: Path, batch: int) -> None:
    """Forget batch ``batch`` in a Spark metadata log (the file and its checksum), as if the
    query had died before writing it."""
    (log / str(batch)).unlink()
    (log / f".{batch}.crc").unlink(missing_ok=True)


def last_batch(log: Path) -> int:
    return max(int(entry.name) for entry in log.iterdir() if entry.name.isdigit())


@pytest.mark.parametrize("killed", ["before the query's commit", "before the sink's and the query's commit"])
def test_a_query_killed_before_its_commit_writes_every_message_once(
    spark, amqp_url, queues, broker, tmp_path, killed
):
    stream = queues("spark-killed")
    output, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    publish(broker, stream, [b"a%d" % i for i in range(10)])
    run_available_now(
        spark, amqp_url, stream, output, checkpoint, startingOffsets="earliest", maxOffsetsPerTrigger="4"
    )
    batch = last_batch(checkpoint / "commits")
    assert batch == 2  # [0, 4), [4, 8), [8, 10)
    # the batch was planned (offsets/2) and its rows written, but the commit never happened
    remove_log_entry(checkpoint / "commits", batch)
    if "sink" in killed:
        # the parquet files of batch 2 stay in the directory, unlisted: the batch runs again
        remove_log_entry(output / "_spark_metadata", batch)
    publish(broker, stream, [b"b%d" % i for i in range(5)])

    run_available_now(spark, amqp_url, stream, output, checkpoint, startingOffsets="earliest")

    assert (checkpoint / "commits" / str(batch)).exists()
    written = spark.read.parquet(str(output)).collect()
    assert offsets(written) == list(range(15))
    assert sorted(row.body for row in written) == sorted(
        [b"a%d" % i for i in range(10)] + [b"b%d" % i for i in range(5)]
    )


# ------------------------------------------------------------------- the sink
def test_streaming_sink_rows_reach_a_stomp_subscriber(
    spark, amqp_url, queues, broker, start_adapter, tmp_path
):
    from pyspark.sql import functions as F

    stream = queues("spark-stream-in")
    target = queues("spark-stream-out", stream=False, declare=False)
    publish(broker, stream, [b"r0", b"r1", b"r2"])
    adapter = start_adapter()
    subscriber = StompClient(adapter.port)
    try:
        subscriber.conn.subscribe(f"/queue/{target}", id="s", ack="auto", headers={"receipt": "sub"})
        subscriber.next("RECEIPT")
        query = (
            spark.readStream.format("stomp")
            .option("url", amqp_url)
            .option("destination", f"/amq/queue/{stream}")
            .option("startingOffsets", "earliest")
            .load()
            .select(
                F.lit(f"/queue/{target}").alias("destination"),
                "body",
                F.create_map(F.lit("source-offset"), F.col("offset").cast("string")).alias("headers"),
            )
            .writeStream.format("stomp")
            .option("url", amqp_url)
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        assert query.awaitTermination(180), "the AvailableNow query did not stop by itself"
        assert query.exception() is None
        received = subscriber.messages(3, timeout=15)
    finally:
        subscriber.close()
    assert sorted((m.body, m.headers["source-offset"]) for m in received) == [
        ("r0", "0"),
        ("r1", "1"),
        ("r2", "2"),
    ]
    assert {m.headers["destination"] for m in received} == {f"/queue/{target}"}


def test_a_message_the_broker_refuses_fails_the_write(spark, amqp_url, queues, broker):
    queue = queues("spark-full", stream=False, declare=False)
    # holds one message and refuses (basic.nack) every further publish
    broker.queue_declare(queue, durable=True, arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    with pytest.raises(Exception) as failure:
        write_rows(
            spark,
            amqp_url,
            [(f"/amq/queue/{queue}", b"m%d" % i) for i in range(3)],
            "destination string, body binary",
        )
    text = failure_text(failure.value)
    # the rows may be split over two tasks: whichever publishes second is refused
    assert "the broker refused (basic.nack)" in text
    assert broker.queue_declare(queue, passive=True).message_count == 1


def test_a_query_from_latest_killed_before_its_first_commit_loses_nothing(spark, amqp_url, queues, tmp_path):
    """Spark keeps no starting position for a Python source: a restarted query whose first
    batch was never committed asks the source for its initial offset again, and "latest" has
    moved on meanwhile.  Nothing from the first batch's end on may be lost."""
    stream = queues("spark-killed-latest")
    output, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    def start(**trigger: Any) -> Any:
        return (
            spark.readStream.format("stomp")
            .option("url", amqp_url)
            .option("destination", f"/amq/queue/{stream}")
            .option("startingOffsets", "latest")
            .load()
            .writeStream.format("parquet")
            .option("path", str(output))
            .option("checkpointLocation", str(checkpoint))
            .trigger(**trigger)
            .start()
        )

    with SteadyPublisher(amqp_url, stream, STEADY_INTERVAL) as publisher:
        publisher.wait_for(10)
        first = start(once=True)
        assert first.awaitTermination(120), "the first batch did not finish"
        assert first.exception() is None
        # what the first batch read, and where it ended
        first_batch = offsets(spark.read.parquet(str(output)).collect())
        first_end = json.loads((checkpoint / "offsets" / "0").read_text().splitlines()[-1])[stream]
        # killed after writing its files, before the sink's and the query's commit
        remove_log_entry(checkpoint / "commits", 0)
        remove_log_entry(output / "_spark_metadata", 0)
        publisher.wait_for(publisher.confirmed + 20)
        second = start(processingTime="300 milliseconds")
    published = publisher.stop()
    try:
        second.processAllAvailable()
    finally:
        second.stop()
    assert second.exception() is None
    written = offsets(spark.read.parquet(str(output)).collect())
    start_offset = first_batch[0] if first_batch else first_end
    assert written == list(range(start_offset, published))


def test_a_prefetch_below_the_ack_batch_still_reads_the_whole_range(amqp_url, queues, broker: BlockingBroker):
    """Option prefetch=10: the reader acknowledges before the broker stops sending (it acked
    every 256 deliveries, and a stream consumer gets no more than the prefetch unacknowledged)."""
    stream = queues("spark-prefetch")
    publish(broker, stream, [b"m%d" % i for i in range(600)])
    settings = ReadSettings(parse_broker_url(amqp_url), prefetch=10, timeout=10.0)
    pieces = read_deliveries(settings, OffsetRange(stream, f"/amq/queue/{stream}", 0, 600))
    assert [offset for _, offsets in pieces for offset in offsets] == list(range(600))
