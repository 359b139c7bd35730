"""The ``stomp`` data source in a real local SparkSession against the real RabbitMQ.

* messages SENT by a STOMP client through the adapter arrive as rows whose headers are the
  headers a STOMP subscriber of the same stream receives;
* a streaming query stopped and restarted from its checkpoint writes every message to a
  parquet sink exactly once;
* rows written by the sink reach STOMP subscribers as a SEND's message would;
* bad input fails the query or the task with a message naming the cause.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

import pytest

from adapter.spark.broker import BlockingBroker
from tests.spark.conftest import publish
from tests.support import StompClient

pytestmark = pytest.mark.timeout(180)

# the MESSAGE headers that belong to the subscriber's own subscription, not to the message
SUBSCRIPTION_HEADERS = {"subscription", "message-id", "ack"}


def read_stream(spark: Any, url: str, destination: str, **options: str) -> list[Any]:
    reader = spark.read.format("stomp").option("url", url).option("destination", destination)
    for name, value in {"startingOffsets": "earliest", **options}.items():
        reader = reader.option(name, value)
    return sorted(reader.load().collect(), key=lambda row: row.offset)


def test_sent_messages_arrive_with_the_headers_a_subscriber_sees(spark, amqp_url, queues, start_adapter):
    stream = queues("spark-sent")
    destination = f"/amq/queue/{stream}"
    adapter = start_adapter()
    sender = StompClient(adapter.port)
    subscriber = StompClient(adapter.port)
    try:
        sends = [
            ({"content-type": "text/plain", "custom": "a:b\\c", "persistent": "true"}, "first"),
            ({"reply-to": "/queue/answers", "correlation-id": "c-1", "priority": "5"}, "second"),
            ({"amqp-message-id": "m-3", "type": "reading", "x-custom": "x"}, "third \u00e9"),
        ]
        for headers, body in sends:
            sender.conn.send(destination, body, headers=dict(headers, receipt=f"r-{body[:5]}"))
            sender.next("RECEIPT")
        subscriber.conn.subscribe(
            destination, id="s1", ack="client", headers={"x-stream-offset": "first", "prefetch-count": "10"}
        )
        seen = subscriber.messages(3)
    finally:
        sender.close()
        subscriber.close()

    rows = read_stream(spark, amqp_url, destination)

    assert [row.body for row in rows] == [body.encode() for _, body in sends]
    assert [row.offset for row in rows] == [0, 1, 2]
    for row, message in zip(rows, seen, strict=True):
        expected = {k: v for k, v in message.headers.items() if k not in SUBSCRIPTION_HEADERS}
        assert row.headers == expected
        assert row.destination == message.headers["destination"] == f"/queue/{stream}"
        assert row.stream == stream
    assert rows[0].headers["custom"] == "a:b\\c"
    assert rows[1].headers["reply-to"] == "/queue/answers"


def test_batch_read_between_offsets(spark, amqp_url, queues, broker):
    stream = queues("spark-range")
    publish(broker, stream, [b"m%d" % i for i in range(10)])

    rows = read_stream(spark, amqp_url, f"/amq/queue/{stream}", startingOffsets="3", endingOffsets="7")

    assert [row.offset for row in rows] == [3, 4, 5, 6]
    assert [row.body for row in rows] == [b"m3", b"m4", b"m5", b"m6"]


def run_until_caught_up(spark: Any, amqp_url: str, destination: str, output: Path, checkpoint: Path) -> None:
    query = (
        spark.readStream.format("stomp")
        .option("url", amqp_url)
        .option("destination", destination)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "7")  # several micro-batches per run
        .load()
        .writeStream.format("parquet")
        .option("path", str(output))
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    assert query.exception() is None


def test_streaming_restart_from_checkpoint_loses_and_duplicates_nothing(
    spark, amqp_url, queues, broker, tmp_path
):
    stream = queues("spark-restart")
    destination = f"/amq/queue/{stream}"
    output, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    publish(broker, stream, [b"a%d" % i for i in range(20)])
    run_until_caught_up(spark, amqp_url, destination, output, checkpoint)
    first_run = spark.read.parquet(str(output)).count()

    publish(broker, stream, [b"b%d" % i for i in range(15)])
    run_until_caught_up(spark, amqp_url, destination, output, checkpoint)

    rows = spark.read.parquet(str(output)).select("offset", "body").collect()
    assert first_run == 20
    assert sorted(row.offset for row in rows) == list(range(35))
    assert sorted(row.body for row in rows) == sorted(
        [b"a%d" % i for i in range(20)] + [b"b%d" % i for i in range(15)]
    )


@pytest.mark.parametrize(
    ("captured", "delivered"),
    [
        ("/topic/{key}", "/topic/{key}"),
        # the topic exchange named: bound the same way, and a subscriber is told /topic/<key>
        ("/exchange/amq.topic/{key}", "/topic/{key}"),
        ("/exchange/amq.direct/{key}", "/exchange/amq.direct/{key}"),
    ],
)
def test_streaming_captures_a_topic_into_a_stream(
    spark, amqp_url, queues, start_adapter, tmp_path, captured, delivered
):
    stream = queues("spark-capture", declare=False)
    key = f"{stream}.readings"
    topic, delivered = captured.format(key=key), delivered.format(key=key)
    query = (
        spark.readStream.format("stomp")
        .option("url", amqp_url)
        .option("destination", topic)
        .option("stream", stream)
        .option("startingOffsets", "earliest")
        .load()
        .writeStream.format("memory")
        .queryName("captured")
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        deadline = time.monotonic() + 30
        while not query.recentProgress and time.monotonic() < deadline:
            time.sleep(0.2)  # the first batch has declared and bound the stream
        adapter = start_adapter()
        sender = StompClient(adapter.port)
        try:
            for i in range(3):
                sender.conn.send(topic, f"reading {i}", headers={"receipt": f"r{i}"})
                sender.next("RECEIPT")
        finally:
            sender.close()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            query.processAllAvailable()
            if spark.sql("select count(*) from captured").first()[0] >= 3:
                break
        rows = spark.sql("select * from captured order by offset").collect()
    finally:
        query.stop()
    assert [row.body for row in rows] == [b"reading 0", b"reading 1", b"reading 2"]
    assert {row.destination for row in rows} == {delivered}
    assert {row.headers["destination"] for row in rows} == {delivered}


def test_sink_rows_reach_stomp_subscribers(spark, amqp_url, queues, start_adapter):
    queue = queues("spark-sink", stream=False, declare=False)
    topic = f"/topic/{queue}.results"
    adapter = start_adapter()
    subscriber = StompClient(adapter.port)
    try:
        subscriber.conn.subscribe(f"/queue/{queue}", id="q", ack="auto", headers={"receipt": "sub-q"})
        subscriber.next("RECEIPT")
        subscriber.conn.subscribe(topic, id="t", ack="auto", headers={"receipt": "sub-t"})
        subscriber.next("RECEIPT")
        rows = spark.createDataFrame(
            [
                (f"/queue/{queue}", b"binary body", {"content-type": "application/octet-stream", "k": "v"}),
                (topic, b"to the topic", None),
            ],
            "destination string, body binary, headers map<string,string>",
        )
        rows.write.format("stomp").option("url", amqp_url).mode("append").save()
        text_rows = spark.createDataFrame(
            [(f"/queue/{queue}", "text body")], "destination string, body string"
        )
        text_rows.write.format("stomp").option("url", amqp_url).mode("append").save()

        messages = {(m.headers["destination"], m.body) for m in subscriber.messages(3, timeout=15)}
        assert messages == {
            (f"/queue/{queue}", "binary body"),
            (topic, "to the topic"),
            (f"/queue/{queue}", "text body"),
        }
    finally:
        subscriber.close()
    # a second subscription to the queue sees the stored message's headers
    check = StompClient(adapter.port, auto_decode=False)
    try:
        check.conn.subscribe(f"/queue/{queue}", id="again", ack="auto")
        assert check.nothing_more()  # auto-acked above: the queue is empty, nothing lost twice
    finally:
        check.close()


def test_sink_message_headers_as_a_send_would_publish_them(spark, amqp_url, queues, start_adapter):
    queue = queues("spark-sink-headers", stream=False, declare=False)
    spark.createDataFrame(
        [(f"/queue/{queue}", "hello", {"content-type": "text/plain", "custom": "x", "correlation-id": "c"})],
        "destination string, body string, headers map<string,string>",
    ).write.format("stomp").option("url", amqp_url).mode("append").save()
    adapter = start_adapter()
    subscriber = StompClient(adapter.port)
    try:
        subscriber.conn.subscribe(f"/queue/{queue}", id="q", ack="auto")
        message = subscriber.next("MESSAGE")
    finally:
        subscriber.close()
    assert message.body == "hello"
    assert message.headers["content-type"] == "text/plain"
    assert message.headers["custom"] == "x"
    assert message.headers["correlation-id"] == "c"
    assert message.headers["persistent"] == "true"


# ------------------------------------------------------------------------------ bad input
def failure_text(error: BaseException) -> str:
    return str(error) + "".join(str(arg) for arg in getattr(error, "args", ()))


def write_rows(spark: Any, url: str, rows: list[tuple[Any, ...]], schema: str, **options: str) -> None:
    writer = spark.createDataFrame(rows, schema).write.format("stomp").option("url", url).mode("append")
    for name, value in options.items():
        writer = writer.option(name, value)
    writer.save()


def test_missing_stream_fails_the_read_naming_it(spark, amqp_url):
    with pytest.raises(Exception) as failure:
        read_stream(spark, amqp_url, "/amq/queue/spark-no-such-stream")
    text = failure_text(failure.value)
    assert "spark-no-such-stream" in text and "not_found" in text


def test_missing_stream_fails_the_streaming_query(spark, amqp_url, tmp_path):
    query = (
        spark.readStream.format("stomp")
        .option("url", amqp_url)
        .option("destination", "/amq/queue/spark-no-such-stream")
        .load()
        .writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .start()
    )
    with pytest.raises(Exception) as failure:
        query.awaitTermination(60)
    query.stop()
    text = failure_text(failure.value)
    assert "spark-no-such-stream" in text and "not_found" in text


@pytest.mark.parametrize(
    ("destination", "cause"),
    [
        ("/foo/bar", "Unknown destination"),
        ("/temp-queue/x", "Invalid destination"),
        ("/queue/", "Invalid destination"),
        (None, "Missing destination"),
        ("/amq/queue/spark-no-such-queue", "NO_ROUTE"),
    ],
)
def test_sink_refuses_what_the_adapter_refuses(spark, amqp_url, destination, cause):
    with pytest.raises(Exception) as failure:
        write_rows(spark, amqp_url, [(destination, b"x")], "destination string, body binary")
    assert cause in failure_text(failure.value)


def test_sink_refuses_a_body_over_the_frame_limit(spark, amqp_url, queues):
    queue = queues("spark-big", stream=False, declare=False)
    with pytest.raises(Exception) as failure:
        write_rows(
            spark,
            amqp_url,
            [(f"/queue/{queue}", b"x" * 2048)],
            "destination string, body binary",
            maxFrameSize="1024",
        )
    assert "over the frame limit" in failure_text(failure.value)


def test_a_bad_frame_size_option_fails_the_write_naming_it(spark, amqp_url):
    with pytest.raises(Exception) as failure:
        write_rows(
            spark, amqp_url, [("/queue/x", b"x")], "destination string, body binary", maxFrameSize="4 MiB"
        )
    assert "option 'maxFrameSize' must be a positive integer, got '4 MiB'" in failure_text(failure.value)


def test_sink_needs_a_destination_column(spark, amqp_url):
    with pytest.raises(Exception) as failure:
        write_rows(spark, amqp_url, [("x",)], "body string")
    assert "needs a 'destination' column" in failure_text(failure.value)


def test_unreachable_broker_fails_with_the_address(spark):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again below: nothing listens there
    url = f"amqp://guest:guest@127.0.0.1:{port}/"
    with pytest.raises(Exception) as failure:
        read_stream(spark, url, "/amq/queue/anything")
    assert f"cannot reach the broker at amqp://guest@127.0.0.1:{port}" in failure_text(failure.value)
    with pytest.raises(Exception) as failure:
        write_rows(spark, url, [("/queue/x", b"x")], "destination string, body binary")
    assert "cannot reach the broker" in failure_text(failure.value)


def test_a_classic_queue_is_refused_as_a_stream(spark, amqp_url, broker: BlockingBroker, queues):
    queue = queues("spark-classic", stream=False)
    publish(broker, queue, [b"x"])
    with pytest.raises(Exception) as failure:
        read_stream(spark, amqp_url, f"/amq/queue/{queue}")
    text = failure_text(failure.value)
    assert queue in text and "invalid arg 'x-stream-offset'" in text


def test_record_batches_have_the_schema_pyspark_expects(spark, amqp_url, queues, broker):
    """read() hands Spark Arrow record batches: their schema is PySpark's own conversion of the
    source's schema, and rows spanning several batches keep every column (nulls included)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    from adapter.spark import source

    stream = queues("spark-arrow")
    frame = spark.read.format("stomp").option("url", amqp_url).option("destination", f"/amq/queue/{stream}")
    assert source.ARROW_SCHEMA.equals(to_arrow_schema(frame.load().schema, timezone="UTC"))

    count = source.ARROW_BATCH_ROWS + 5
    publish(broker, stream, [b"m%d" % i for i in range(count)], headers={"n": 1})
    rows = read_stream(spark, amqp_url, f"/amq/queue/{stream}")
    assert [row.offset for row in rows] == list(range(count))
    assert rows[-1].body == b"m%d" % (count - 1)
    assert rows[-1].headers["n"] == "1" and rows[-1].headers["x-stream-offset"] == str(count - 1)
    assert rows[0].timestamp is None and rows[0].stream == stream
