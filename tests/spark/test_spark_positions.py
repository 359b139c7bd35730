"""Where a read starts and ends: timestamps (``x-stream-offset`` of the timestamp type), JSON
offsets per stream, ``Trigger.AvailableNow``, and several broker nodes in ``url``; a real local
SparkSession against the real RabbitMQ.

Timestamps in AMQP 0-9-1 are whole seconds and the broker finds a time by chunk, so the tests
publish groups of messages separated by a second boundary and name that boundary.
"""

from __future__ import annotations

import math
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from adapter.spark.broker import BlockingBroker
from tests.spark.conftest import publish
from tests.spark.test_spark import failure_text, read_stream

pytestmark = pytest.mark.timeout(240)


def next_second_boundary() -> int:
    """Wait past the next whole second; return it in milliseconds since the epoch."""
    boundary = math.ceil(time.time())
    time.sleep(boundary - time.time() + 0.3)
    return boundary * 1000


@pytest.fixture
def three_groups(queues, broker: BlockingBroker) -> tuple[str, int, int]:
    """A stream with a0..a2 (offsets 0-2), b0..b2 (3-5) and c0..c1 (6-7), each group written
    after a second boundary: (stream, ms between a and b, ms between b and c)."""
    stream = queues("spark-time")
    publish(broker, stream, [b"a0", b"a1", b"a2"])
    between_a_b = next_second_boundary()
    publish(broker, stream, [b"b0", b"b1", b"b2"])
    between_b_c = next_second_boundary()
    publish(broker, stream, [b"c0", b"c1"])
    return stream, between_a_b, between_b_c


def offsets(rows: list[Any]) -> list[int]:
    return [row.offset for row in rows]


def test_batch_reads_between_timestamps(spark, amqp_url, three_groups):
    stream, t1, t2 = three_groups
    destination = f"/amq/queue/{stream}"

    def read(**options: str) -> list[int]:
        return offsets(read_stream(spark, amqp_url, destination, **options))

    assert read(startingOffsets="", startingTimestamp=str(t1)) == [3, 4, 5, 6, 7]
    assert read(startingOffsets="", startingTimestamp=str(t1), endingTimestamp=str(t2)) == [3, 4, 5]
    assert read(startingOffsets="", startingOffsetsByTimestamp=f'{{"{stream}": {t2}}}') == [6, 7]
    assert read(endingOffsetsByTimestamp=f'{{"{stream}": {t1}}}') == [0, 1, 2]
    # a time after the newest message: the end of the stream, nothing to read yet
    assert read(startingOffsets="", startingTimestamp=str(t2 + 3_600_000)) == []
    rows = read_stream(spark, amqp_url, destination, startingOffsets="", startingTimestamp=str(t2))
    assert [row.body for row in rows] == [b"c0", b"c1"]


def test_json_offsets_per_stream(spark, amqp_url, queues, broker):
    first, second = queues("spark-json-a"), queues("spark-json-b")
    publish(broker, first, [b"a%d" % i for i in range(5)])
    publish(broker, second, [b"b%d" % i for i in range(4)])
    destinations = f"/amq/queue/{first},/amq/queue/{second}"

    rows = read_stream(
        spark,
        amqp_url,
        destinations,
        startingOffsets=f'{{"{first}": 3, "{second}": -2}}',
        endingOffsets=f'{{"{first}": -1, "{second}": 2}}',
    )
    assert sorted((row.stream, row.offset) for row in rows) == [
        (first, 3),
        (first, 4),
        (second, 0),
        (second, 1),
    ]


@pytest.mark.parametrize(
    ("options", "text"),
    [
        ({"startingOffsets": '{"nope": 1}'}, "names 'nope', which is not a stream read here"),
        ({"startingOffsets": "{}"}, "gives nothing for the stream"),
        ({"startingOffsets": '{"S": "first"}'}, "must be an offset, -2 (earliest) or -1 (latest)"),
        ({"startingOffsets": "1", "startingTimestamp": "5"}, "both say where to start"),
        ({"startingTimestamp": "yesterday"}, "milliseconds since the epoch"),
        ({"endingOffsets": "earliest"}, "must be latest, an offset number"),
        ({"endingOffsetsByTimestamp": "[1]"}, "must be a JSON object"),
        ({"timeout": "soon"}, "option 'timeout' must be a positive number of seconds, got 'soon'"),
    ],
)
def test_bad_positions_fail_naming_the_option(spark, amqp_url, queues, options, text):
    stream = queues("spark-badpos")
    options = {name: value.replace('"S"', f'"{stream}"') for name, value in options.items()}
    options.setdefault("startingOffsets", "")
    with pytest.raises(Exception) as failure:
        read_stream(spark, amqp_url, f"/amq/queue/{stream}", **options)
    assert text in failure_text(failure.value)


def run_available_now(
    spark: Any, url: str, stream: str, output: Path, checkpoint: Path, **options: str
) -> Any:
    reader = spark.readStream.format("stomp").option("url", url).option("destination", f"/amq/queue/{stream}")
    for name, value in options.items():
        reader = reader.option(name, value)
    query = (
        reader.load()
        .writeStream.format("parquet")
        .option("path", str(output))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    # AvailableNow ends the query by itself once what the streams held at its start is read
    finished = query.awaitTermination(180)
    assert finished, "the AvailableNow query did not stop by itself"
    assert query.exception() is None
    return query


def test_trigger_available_now_reads_what_is_there_in_several_batches_and_stops(
    spark, amqp_url, queues, broker, tmp_path
):
    stream = queues("spark-now")
    output, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    publish(broker, stream, [b"a%d" % i for i in range(8)])

    query = run_available_now(
        spark, amqp_url, stream, output, checkpoint, startingOffsets="earliest", maxOffsetsPerTrigger="3"
    )
    batches_with_rows = [p for p in query.recentProgress if p["numInputRows"] > 0]
    assert [p["numInputRows"] for p in batches_with_rows] == [3, 3, 2]
    assert sorted(offsets(spark.read.parquet(str(output)).collect())) == list(range(8))

    # again from the checkpoint: only what came since, once
    publish(broker, stream, [b"b%d" % i for i in range(4)])
    run_available_now(spark, amqp_url, stream, output, checkpoint, startingOffsets="earliest")
    rows = spark.read.parquet(str(output)).collect()
    assert sorted(offsets(rows)) == list(range(12))


def test_streaming_query_starts_at_a_timestamp(spark, amqp_url, three_groups, tmp_path):
    stream, t1, _ = three_groups
    output, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    run_available_now(spark, amqp_url, stream, output, checkpoint, startingTimestamp=str(t1))
    rows = spark.read.parquet(str(output)).collect()
    assert sorted(offsets(rows)) == [3, 4, 5, 6, 7]


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])  # closed again: nothing listens there


def test_several_broker_nodes_in_url(spark, amqp_url, queues, broker):
    stream = queues("spark-nodes")
    publish(broker, stream, [b"x", b"y"])
    down = f"amqp://guest:guest@127.0.0.1:{closed_port()}/"
    url = f"{down},{amqp_url}"
    # each connection starts at a random node: reading several times uses both orders
    for _ in range(3):
        assert [row.body for row in read_stream(spark, url, f"/amq/queue/{stream}")] == [b"x", b"y"]

    other_down = f"amqp://guest:guest@127.0.0.1:{closed_port()}/"
    with pytest.raises(Exception) as failure:
        read_stream(spark, f"{down},{other_down}", f"/amq/queue/{stream}")
    text = failure_text(failure.value)
    assert "no broker node could be used" in text and down.split("@")[1].rstrip("/") in text
