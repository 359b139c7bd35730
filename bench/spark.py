"""``python -m bench.spark``: rows per second through the ``stomp`` Spark data source against
bare AMQP clients on the same stream (docs/performance.md, "Spark").

In: a stream of N 1 KiB messages read by Spark into the no-op sink, against a bare AMQP
consumer reading the same stream (the ceiling).  Out: N rows published by the sink (publisher
confirms), against a bare confirmed publisher.  The bare clients are the data source's own
blocking client without Spark, so the difference is Spark's share: scheduling, the Python
worker, the Arrow record batches, and the MESSAGE headers per row.

Each figure is the best of --rounds runs (default 3) after one warm-up; the streams are deleted
at the end.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from collections.abc import Callable

from adapter.mapping.properties import MessageProperties
from adapter.spark.broker import BlockingBroker, parse_broker_url

BODY = b"x" * 1024


def bare_publish(url: str, queue: str, count: int) -> None:
    with BlockingBroker(parse_broker_url(url), connection_name="bench publisher") as broker:
        broker.confirm_select()
        properties = MessageProperties(headers={}, delivery_mode=2)
        for _ in range(count):
            broker.publish("", queue, properties, BODY, mandatory=False)
            if broker.published - broker.confirmed >= 2000:
                broker.drain_confirms(keep_unconfirmed=1000)
        broker.drain_confirms()


def bare_consume(url: str, queue: str, count: int, prefetch: int = 1000) -> None:
    with BlockingBroker(parse_broker_url(url), connection_name="bench consumer") as broker:
        broker.basic_qos(prefetch)
        broker.basic_consume(queue, "bench", {"x-stream-offset": ("longstr", "first")})
        received = 0
        while received < count:
            taken = broker.take_deliveries(time.monotonic() + 30, at_most=1)
            if not taken:
                raise SystemExit(f"bare consumer: only {received} of {count} messages")
            delivery = taken[0]
            received += 1
            if received % 256 == 0:
                broker.ack(delivery.delivery_tag, True)


def best_rate(rounds: int, count: int, run: Callable[[], None]) -> float:
    run()  # warm-up (JIT, Python workers, connections)
    best = 0.0
    for _ in range(rounds):
        started = time.perf_counter()
        run()
        best = max(best, count / (time.perf_counter() - started))
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--amqp-url", default=os.environ.get("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
    )
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--partition-size", type=int, default=25_000, help="offsets per Spark task")
    args = parser.parse_args(argv)
    url, count = args.amqp_url, args.messages

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from adapter.spark import register

    spark = (
        SparkSession.builder.master("local[*]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    source, sink = f"bench-spark-in-{uuid.uuid4().hex[:8]}", f"bench-spark-out-{uuid.uuid4().hex[:8]}"
    with BlockingBroker(parse_broker_url(url), connection_name="bench setup") as broker:
        for name in (source, sink):
            broker.queue_declare(name, durable=True, arguments={"x-queue-type": "stream"})
    try:
        publish_rate = best_rate(args.rounds, count, lambda: bare_publish(url, sink, count))
        bare_publish(url, source, count)
        consume_rate = best_rate(args.rounds, count, lambda: bare_consume(url, source, count))

        def spark_in() -> None:
            frame = (
                spark.read.format("stomp")
                .option("url", url)
                .option("destination", f"/amq/queue/{source}")
                .option("startingOffsets", "0")
                .option("endingOffsets", str(count))
                .option("partitionSize", str(args.partition_size))
                .load()
            )
            frame.write.format("noop").mode("overwrite").save()

        rows = spark.range(count).selectExpr(
            f"'/amq/queue/{sink}' as destination", f"repeat('x', {len(BODY)}) as body"
        )
        rows = rows.repartition(max(1, count // args.partition_size)).cache()
        rows.count()

        def spark_out() -> None:
            rows.write.format("stomp").option("url", url).mode("append").save()

        spark_in_rate = best_rate(args.rounds, count, spark_in)
        spark_out_rate = best_rate(args.rounds, count, spark_out)
    finally:
        with BlockingBroker(parse_broker_url(url), connection_name="bench cleanup") as broker:
            for name in (source, sink):
                broker.queue_delete(name)
        spark.stop()

    print(f"{count} messages of {len(BODY)} B, {os.cpu_count()} cores, best of {args.rounds}")
    print(f"{'':28}{'rows/s':>10}{'ratio':>8}")
    print(f"{'in:  bare AMQP consumer':28}{consume_rate:>10.0f}{1:>8.2f}")
    print(f"{'in:  Spark -> noop sink':28}{spark_in_rate:>10.0f}{spark_in_rate / consume_rate:>8.2f}")
    print(f"{'out: bare confirmed publisher':28}{publish_rate:>10.0f}{1:>8.2f}")
    print(f"{'out: Spark stomp sink':28}{spark_out_rate:>10.0f}{spark_out_rate / publish_rate:>8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
