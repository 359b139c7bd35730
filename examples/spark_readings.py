"""Example pipeline: STOMP readings in, per-window averages out, through Spark.

What it runs, with one command (`.venv/bin/python -m examples.spark_readings`):

1. an adapter on a free local port (unless --stomp HOST:PORT names a running one);
2. a Spark job that captures everything STOMP clients send to /topic/readings.<sensor> into
   the stream queue `readings` (declared and bound like a durable STOMP subscription), averages
   the readings per sensor and 5-second window, and publishes each result as a SEND to
   /topic/averages.<sensor>;
3. a STOMP client sending readings of three sensors, and a STOMP subscriber on
   /topic/averages.* printing the results as they arrive.

It stops after --seconds (default 30).  The STOMP clients are stomp.py, which the ``spark``
extra installs (``pip install '.[spark]'``); run it from the repository's root.  On a cluster
the same job runs unchanged through spark-submit: `spark-submit --py-files adapter.zip
examples/spark_readings.py --job-only --amqp-url amqp://user:pass@broker:5672/`
(docs/spark.md, "On a cluster").
"""

from __future__ import annotations

import argparse
import os
import random
import socket
import subprocess
import sys
import threading
import time
from typing import Any

READINGS = "/topic/readings.*"
STREAM = "readings"


def spark_job(spark: Any, amqp_url: str, checkpoint: str, stream: str = STREAM) -> Any:
    """The streaming query: readings -> averages per sensor and window -> STOMP."""
    from pyspark.sql import functions as F

    readings = (
        spark.readStream.format("stomp")
        .option("url", amqp_url)
        .option("destination", READINGS)
        .option("stream", stream)  # capture the topic into this stream queue
        .option("x-max-age", "1h")  # its retention, as a SUBSCRIBE header would set it
        .option("startingOffsets", "latest")
        .load()
    )
    averages = (
        readings.withColumn("sensor", F.element_at(F.split("destination", r"\."), -1))
        .withColumn("value", F.col("body").cast("string").cast("double"))
        .withColumn("at", F.coalesce("timestamp", F.current_timestamp()))
        .withWatermark("at", "5 seconds")
        .groupBy(F.window("at", "5 seconds"), "sensor")
        .agg(F.avg("value").alias("average"), F.count("*").alias("readings"))
    )
    results = averages.select(
        F.concat(F.lit("/topic/averages."), "sensor").alias("destination"),
        F.format_string("%.2f", "average").alias("body"),
        F.create_map(
            F.lit("content-type"),
            F.lit("text/plain"),
            F.lit("window-start"),
            F.col("window.start").cast("string"),
            F.lit("readings"),
            F.col("readings").cast("string"),
        ).alias("headers"),
    )
    return (
        results.writeStream.format("stomp")
        .option("url", amqp_url)
        .option("checkpointLocation", checkpoint)
        .outputMode("append")  # a window is published once the watermark has closed it
        .trigger(processingTime="1 second")
        .start()
    )


SETTLE = 12.0  # at most this long after the last reading for the last windows' averages
QUIET = 4.0  # averages stopped coming: none for this long after the last reading and the last one


def stomp_clients(port: int, seconds: float, stop: threading.Event) -> None:
    import stomp

    class Printer(stomp.ConnectionListener):  # type: ignore[misc]
        last: float | None = None  # when the latest average arrived (monotonic)

        def on_message(self, frame: Any) -> None:
            self.last = time.monotonic()
            headers = frame.headers
            print(
                f"{headers['destination']}: {frame.body} (window {headers.get('window-start')},"
                f" {headers.get('readings')} readings)",
                flush=True,
            )

    subscriber = stomp.Connection12([("127.0.0.1", port)], vhost="/")
    printer = Printer()
    subscriber.set_listener("printer", printer)
    subscriber.connect("guest", "guest", wait=True)
    subscriber.subscribe("/topic/averages.*", id="averages", ack="auto")
    sender = stomp.Connection12([("127.0.0.1", port)], vhost="/")
    sender.connect("guest", "guest", wait=True)
    deadline = time.monotonic() + seconds
    while not stop.is_set() and time.monotonic() < deadline:
        for sensor in ("kitchen", "garage", "attic"):
            # 'timestamp' (seconds) becomes the AMQP timestamp: the row's event time
            sender.send(
                f"/topic/readings.{sensor}",
                f"{20 + random.gauss(0, 2):.2f}",
                headers={"timestamp": str(int(time.time()))},
            )
        time.sleep(0.2)
    sender.disconnect()
    # windows are published once the watermark (newest reading - 5 s) passes them: the last ones
    # a trigger or two after the last reading.  Wait until averages stop coming (QUIET seconds
    # without one, the first one included), at most SETTLE seconds.
    stopped = time.monotonic()
    while not stop.is_set() and time.monotonic() < stopped + SETTLE:
        last = printer.last
        if last is not None and time.monotonic() > max(last, stopped) + QUIET:
            break
        time.sleep(0.2)
    subscriber.disconnect()


def start_adapter(amqp_url: str) -> tuple[subprocess.Popen[bytes], int]:
    """``python -m adapter`` on a free local port; returns once it accepts connections."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "adapter", "--listen", f"127.0.0.1:{port}", "--amqp-url", amqp_url]
    server = subprocess.Popen(command)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return server, port
        except OSError:
            time.sleep(0.2)
    server.terminate()
    raise SystemExit(f"the adapter did not start listening on 127.0.0.1:{port}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--amqp-url", default="amqp://guest:guest@127.0.0.1:5672/")
    parser.add_argument("--stomp", help="HOST:PORT of a running adapter (default: start one)")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--checkpoint", default="/tmp/stomp-readings-checkpoint")
    parser.add_argument("--stream", default=STREAM, help="the stream queue the readings are kept in")
    parser.add_argument("--job-only", action="store_true", help="only the Spark job (spark-submit)")
    args = parser.parse_args(argv)

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from adapter.spark import register

    spark = (
        SparkSession.builder.appName("stomp readings")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()  # local[*] unless spark-submit says otherwise
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    query = spark_job(spark, args.amqp_url, args.checkpoint, args.stream)
    if args.job_only:
        query.awaitTermination()
        return 0

    server = None
    if args.stomp:
        port = int(args.stomp.rsplit(":", 1)[1])
    else:
        server, port = start_adapter(args.amqp_url)
    stop = threading.Event()
    try:
        while not query.recentProgress:  # the stream is declared and bound by the first batch
            if not query.isActive:
                raise SystemExit(f"the Spark job failed: {query.exception()}")
            time.sleep(0.2)
        stomp_clients(port, args.seconds, stop)
    except KeyboardInterrupt:
        stop.set()
    finally:
        query.stop()
        spark.stop()
        if server is not None:
            server.terminate()
            server.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
