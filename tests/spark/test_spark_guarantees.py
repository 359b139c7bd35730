"""What the data source promises under pressure, in a real local SparkSession against the real
RabbitMQ: reads finish on a stream that never stops growing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from adapter.spark.broker import BlockingBroker
from adapter.spark.streams import next_offset
from tests.spark.conftest import SteadyPublisher
from tests.spark.test_spark import read_stream

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
