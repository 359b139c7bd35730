"""``python -m bench.spark_ratio``: the ``stomp`` data source against bare AMQP clients, in
alternating rounds, on ``local[*]`` or on a standalone cluster (docs/performance.md, "Spark").

Each round runs, one after the other: a bare consumer of the whole stream (the data source's
own blocking client, the same prefetch, acknowledging every 256 as the reader does), a Spark
batch read of the same stream into the ``noop`` sink, the same with ``includeHeaders=false``, a
bare confirmed publisher, and the Spark sink writing as many rows.  Alternating keeps a change
of load on the machine from favouring one side; the ratios are the medians of the per-round
ratios.

Then where a read's time goes, without Spark's JVM, on the same stream (``bench.spark_breakdown``
measures both sides in more detail): the consumer alone and the data source's ``read()`` of the
whole range in one task, in µs per row; and Spark's fixed cost per job (a read of an empty range).

``--master standalone`` starts a master and two workers on 127.0.0.1 (tests/spark/standalone.py)
and gives the application two one-core executors; ``local[*]`` runs the executors' work in
this machine's cores.  The streams are deleted at the end.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from adapter.spark.broker import BlockingBroker, parse_broker_url
from bench.spark import BODY, bare_consume, bare_publish
from bench.spark_breakdown import source_read, source_task

PREFETCH = 1000


def timed(work: Callable[[], Any]) -> float:
    started = time.perf_counter()
    work()
    return time.perf_counter() - started


def session(master: str, directory: Path) -> tuple[Any, Any]:
    """A SparkSession on ``master`` and the cluster started for it (None on local[*])."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.config("spark.ui.enabled", "false")
    builder = builder.config("spark.sql.shuffle.partitions", "2")
    cluster = None
    if master == "standalone":
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from tests.spark.standalone import EXECUTOR_MEMORY, StandaloneCluster

        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # the driver too, as the cluster
        cluster = StandaloneCluster(directory)
        builder = builder.master(cluster.url).config("spark.cores.max", "2")
        builder = builder.config("spark.executor.cores", "1").config("spark.executor.memory", EXECUTOR_MEMORY)
        builder = builder.config("spark.pyspark.python", sys.executable)
    else:
        builder = builder.master(master)
    return builder.getOrCreate(), cluster


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--amqp-url", default=os.environ.get("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
    )
    parser.add_argument("--master", default="local[*]", help="local[*], local[N] or standalone")
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tasks", type=int, default=2, help="Spark tasks per read and write")
    args = parser.parse_args(argv)
    url, count = args.amqp_url, args.messages
    partition_size = -(-count // args.tasks)

    with tempfile.TemporaryDirectory(prefix="bench-spark-") as directory:
        spark, cluster = session(args.master, Path(directory))
        try:
            return run(spark, args, url, count, partition_size)
        finally:
            spark.stop()
            if cluster is not None:
                cluster.stop()


def run(spark: Any, args: argparse.Namespace, url: str, count: int, partition_size: int) -> int:
    from adapter.spark import register

    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    source, sink = f"bench-spark-in-{uuid.uuid4().hex[:8]}", f"bench-spark-out-{uuid.uuid4().hex[:8]}"
    with BlockingBroker(parse_broker_url(url), connection_name="bench setup") as broker:
        for name in (source, sink):
            broker.queue_declare(name, durable=True, arguments={"x-queue-type": "stream"})
    try:
        bare_publish(url, source, count)

        def spark_read(end: int = count, headers: str = "true") -> None:
            frame = (
                spark.read.format("stomp")
                .option("url", url)
                .option("destination", f"/amq/queue/{source}")
                .option("startingOffsets", "0")
                .option("endingOffsets", str(end))
                .option("partitionSize", str(partition_size))
                .option("prefetch", str(PREFETCH))
                .option("includeHeaders", headers)
                .load()
            )
            frame.write.format("noop").mode("overwrite").save()

        rows = spark.range(count).selectExpr(
            f"'/amq/queue/{sink}' as destination", f"repeat('x', {len(BODY)}) as body"
        )
        rows = rows.repartition(args.tasks).cache()
        rows.count()

        def spark_write() -> None:
            rows.write.format("stomp").option("url", url).mode("append").save()

        # warm-up: connections, the Python workers, the JIT
        bare_consume(url, source, count, PREFETCH)
        spark_read()
        bare_publish(url, sink, count // 10)
        spark_write()
        rounds: list[tuple[float, float, float, float, float]] = []
        for _ in range(args.rounds):
            rounds.append(
                (
                    timed(lambda: bare_consume(url, source, count, PREFETCH)),
                    timed(spark_read),
                    timed(lambda: spark_read(headers="false")),
                    timed(lambda: bare_publish(url, sink, count)),
                    timed(spark_write),
                )
            )

        task = source_task(url, source, count)
        consumer = min(timed(lambda: bare_consume(url, source, count, PREFETCH)) for _ in range(3))
        reading = min(timed(lambda: source_read(task, count)) for _ in range(3))
        empty_job = min(timed(lambda: spark_read(0)) for _ in range(3))
    finally:
        with BlockingBroker(parse_broker_url(url), connection_name="bench cleanup") as broker:
            for name in (source, sink):
                broker.queue_delete(name)

    print(f"{args.master}: {count} messages of {len(BODY)} B, {args.tasks} tasks, {os.cpu_count()} cores,")
    print(f"{args.rounds} alternating rounds after a warm-up; prefetch {PREFETCH}")
    print(
        f"{'round':>5}{'bare in':>10}{'Spark in':>10}{'ratio':>7}{'no hdrs':>10}{'ratio':>7}"
        f"{'bare out':>10}{'Spark out':>10}{'ratio':>7}"
    )
    ins, bare_ins, outs = [], [], []
    for n, (bare_in, spark_in, spark_bare_in, bare_out, spark_out) in enumerate(rounds, 1):
        ins.append(bare_in / spark_in)
        bare_ins.append(bare_in / spark_bare_in)
        outs.append(bare_out / spark_out)
        print(
            f"{n:>5}{count / bare_in:>10.0f}{count / spark_in:>10.0f}{ins[-1]:>7.2f}"
            f"{count / spark_bare_in:>10.0f}{bare_ins[-1]:>7.2f}"
            f"{count / bare_out:>10.0f}{count / spark_out:>10.0f}{outs[-1]:>7.2f}"
        )
    print(
        f"median ratio: in {statistics.median(ins):.2f} (includeHeaders=false "
        f"{statistics.median(bare_ins):.2f}), out {statistics.median(outs):.2f}"
    )
    per_row = 1e6 / count
    print(
        f"per row without Spark (one task, best of 3): consumer {consumer * per_row:.1f} µs, "
        f"read() {reading * per_row:.1f} µs; "
        f"Spark's cost of an empty read job {empty_job:.2f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
