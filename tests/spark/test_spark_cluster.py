"""The ``stomp`` data source on a real Spark standalone cluster (a master and two workers on
127.0.0.1) and through Spark Connect, as docs/spark.md ("On a cluster", "Spark Connect") says a
user runs it: reads split over several tasks, the sink, streaming exactly-once across a restart,
a SIGKILLed executor in mid-batch and a SIGKILLed driver, and ``spark-submit --master spark://``
of the example pipeline.  The executors' Python has the project installed (no ``--py-files``).

The cluster and the Connect server are started once for tests/spark (conftest.py); the Connect
tests take their column functions from ``pyspark.sql.connect.functions``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from adapter.spark.streams import next_offset
from tests.spark.conftest import publish
from tests.spark.standalone import SPARK_HOME, StandaloneCluster, spark_environment
from tests.spark.test_example import assert_averages_arrived, example_arguments

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]


def stream_frame(spark: Any, amqp_url: str, stream: str, **options: str) -> Any:
    reader = spark.readStream.format("stomp").option("url", amqp_url)
    reader = reader.option("destination", f"/amq/queue/{stream}").option("startingOffsets", "earliest")
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def slowed(frame: Any) -> Any:
    """``frame`` with a 20 ms JVM pause per row (``Thread.sleep`` through ``reflect``), so that
    a micro-batch lasts long enough to be interrupted; nothing Python to ship to executors."""
    from pyspark.sql.connect import functions as CF

    pause = CF.expr("reflect('java.lang.Thread', 'sleep', cast(20 as bigint))")
    return frame.select("offset", "body", pause.alias("pause"))


def part_files(output: Path) -> list[Path]:
    return list(output.glob("part-*.parquet")) if output.exists() else []


def wait_for(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout:g} s"
        time.sleep(0.05)


# ------------------------------------------------------------------- Spark Connect on the cluster
def test_connect_batch_read_splits_a_stream_over_tasks(remote_spark, amqp_url, queues, broker):
    from pyspark.sql.connect import functions as CF

    stream = queues("spark-connect-read")
    publish(broker, stream, [b"m%d" % i for i in range(30)], {"colour": "blue"})
    frame = (
        remote_spark.read.format("stomp")
        .option("url", amqp_url)
        .option("destination", f"/amq/queue/{stream}")
        .option("partitionSize", "7")
        .load()
        .withColumn("task", CF.spark_partition_id())
    )
    rows = frame.collect()
    assert sorted(row.offset for row in rows) == list(range(30))
    assert {row.body for row in rows} == {b"m%d" % i for i in range(30)}
    assert {row.headers["colour"] for row in rows} == {"blue"}
    assert {row.destination for row in rows} == {f"/queue/{stream}"}  # as a subscriber reads it
    # [0, 7), [7, 14) ... [28, 30): five tasks, each reading its own range
    tasks: dict[int, list[int]] = {}
    for row in rows:
        tasks.setdefault(row.task, []).append(row.offset)
    assert sorted(sorted(offsets) for offsets in tasks.values()) == [
        list(range(low, min(low + 7, 30))) for low in range(0, 30, 7)
    ]


def test_connect_sink_publishes_every_row(remote_spark, amqp_url, queues, broker):
    stream = queues("spark-connect-sink")
    rows = [(f"/amq/queue/{stream}", b"w%d" % i, {"n": str(i)}) for i in range(20)]
    frame = remote_spark.createDataFrame(rows, "destination string, body binary, headers map<string,string>")
    frame.repartition(4).write.format("stomp").option("url", amqp_url).mode("append").save()
    assert next_offset(broker, stream) == 20
    back = remote_spark.read.format("stomp").option("url", amqp_url)
    read = back.option("destination", f"/amq/queue/{stream}").load().collect()
    assert sorted((row.body, row.headers["n"]) for row in read) == sorted(
        (b"w%d" % i, str(i)) for i in range(20)
    )


def test_connect_streaming_query_continues_from_its_checkpoint(
    remote_spark, amqp_url, queues, broker, tmp_path
):
    stream = queues("spark-connect-restart")
    output, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    def run() -> None:
        query = (
            stream_frame(remote_spark, amqp_url, stream, maxOffsetsPerTrigger="4")
            .writeStream.format("parquet")
            .option("path", str(output))
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        assert query.awaitTermination(120), "the AvailableNow query did not stop by itself"
        assert query.exception() is None

    publish(broker, stream, [b"a%d" % i for i in range(10)])
    run()
    publish(broker, stream, [b"b%d" % i for i in range(5)])
    run()
    written = remote_spark.read.parquet(str(output)).collect()
    assert sorted(row.offset for row in written) == list(range(15))
    # 10 offsets in batches of at most 4, then the 5 published in between
    assert sorted(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit()) == [
        0,
        1,
        2,
        3,
        4,
    ]


def test_an_executor_killed_in_mid_batch_loses_and_repeats_nothing(
    remote_spark, spark_cluster: StandaloneCluster, amqp_url, queues, broker, tmp_path
):
    stream = queues("spark-executor-kill")
    output, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    count = 400
    publish(broker, stream, [b"k%d" % i for i in range(count)])
    # 16 tasks of 25 rows, 0.5 s each, on two one-core executors: the batch lasts about 4 s
    query = (
        slowed(stream_frame(remote_spark, amqp_url, stream, partitionSize="25"))
        .writeStream.format("parquet")
        .option("path", str(output))
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="1 second")
        .start()
    )
    try:
        wait_for(lambda: part_files(output), 120, "the first task's file")
        assert not (checkpoint / "commits" / "0").exists(), "batch 0 was over before the kill"
        executors = [pid for pid, line in spark_cluster.executors() if "spark.connect.grpc" in line]
        assert executors, "no executor of the Connect server's application"
        os.kill(executors[0], signal.SIGKILL)
        wait_for(lambda: (checkpoint / "commits" / "0").exists(), 180, "batch 0's commit after the kill")
        query.processAllAvailable()
    finally:
        query.stop()
    assert query.exception() is None
    written = remote_spark.read.parquet(str(output)).select("offset").collect()
    assert sorted(row.offset for row in written) == list(range(count))
    # the killed task's files stay in the directory, outside the sink's log, so unread
    assert len(part_files(output)) >= 1


CLIENT_ONLY_SOURCE = """from pyspark.sql.datasource import DataSource, DataSourceReader


class ClientOnly(DataSource):
    @classmethod
    def name(cls):
        return "client_only"

    def schema(self):
        return "x int"

    def reader(self, schema):
        return Reader()


class Reader(DataSourceReader):
    def read(self, partition):
        yield (1,)
"""


def test_connect_needs_the_data_source_installed_on_the_server(remote_spark, tmp_path, monkeypatch):
    """Registering sends the class by reference (its module's name): a class the server's
    Python cannot import fails at the first read, which is why the server and the executors
    need the ``adapter`` package installed (docs/spark.md, "Spark Connect")."""
    (tmp_path / "client_only_source.py").write_text(CLIENT_ONLY_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    import client_only_source

    remote_spark.dataSource.register(client_only_source.ClientOnly)
    with pytest.raises(Exception) as failure:
        remote_spark.read.format("client_only").load().collect()
    text = str(failure.value)
    assert "PYTHON_DATA_SOURCE_ERROR" in text
    assert "ModuleNotFoundError: No module named 'client_only_source'" in text


# ------------------------------------------------------------------- spark-submit to the cluster
DRIVER_JOB = """import sys
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from adapter.spark import register

url, stream, output, checkpoint, mode = sys.argv[1:6]
spark = SparkSession.builder.appName("stomp exactly-once").getOrCreate()
register(spark)
frame = (spark.readStream.format("stomp").option("url", url).option("destination", f"/amq/queue/{stream}")
         .option("startingOffsets", "earliest").option("partitionSize", "25").load())
frame = frame.select("offset", "body", F.expr("reflect('java.lang.Thread', 'sleep', cast(20 as bigint))"))
writer = frame.writeStream.format("parquet").option("path", output).option("checkpointLocation", checkpoint)
if mode == "forever":
    writer.trigger(processingTime="1 second").start().awaitTermination()
else:
    query = writer.trigger(availableNow=True).start()
    query.awaitTermination()
    print("DONE", query.exception())
"""


def submit(cluster: StandaloneCluster, tmp_path: Path, script: Path, *arguments: str, **popen: Any) -> Any:
    command = [str(SPARK_HOME / "bin" / "spark-submit"), *cluster.submit_options(), str(script), *arguments]
    return subprocess.Popen(
        command,
        cwd=tmp_path,
        env=spark_environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        **popen,
    )


def test_a_driver_killed_in_mid_batch_loses_and_repeats_nothing(
    spark, spark_cluster: StandaloneCluster, amqp_url, queues, broker, tmp_path
):
    stream = queues("spark-driver-kill")
    output, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    script = tmp_path / "job.py"
    script.write_text(DRIVER_JOB)
    publish(broker, stream, [b"d%d" % i for i in range(400)])
    arguments = [amqp_url, stream, str(output), str(checkpoint)]
    driver = submit(spark_cluster, tmp_path, script, *arguments, "forever")
    try:
        wait_for(lambda: part_files(output) or driver.poll() is not None, 150, "the first task's file")
        assert driver.poll() is None, driver.communicate()[0][-3000:]
        assert not (checkpoint / "commits" / "0").exists(), "batch 0 was over before the kill"
    finally:
        os.killpg(driver.pid, signal.SIGKILL)  # spark-submit's JVM and the Python driver
        driver.communicate()
    publish(broker, stream, [b"e%d" % i for i in range(50)])
    rerun = submit(spark_cluster, tmp_path, script, *arguments, "now")
    stdout, stderr = rerun.communicate(timeout=200)
    assert rerun.returncode == 0 and "DONE None" in stdout, stdout[-3000:] + stderr[-3000:]
    written = spark.read.parquet(str(output)).select("offset").collect()
    assert sorted(row.offset for row in written) == list(range(450))


def test_the_example_pipeline_through_spark_submit_on_the_cluster(spark_cluster, amqp_url, queues, tmp_path):
    stream = queues("spark-example-cluster", declare=False)
    process = submit(
        spark_cluster,
        tmp_path,
        ROOT / "examples" / "spark_readings.py",
        *example_arguments(amqp_url, stream, tmp_path / "checkpoint"),
    )
    stdout, stderr = process.communicate(timeout=240)
    assert process.returncode == 0, stdout[-3000:] + stderr[-3000:]
    assert_averages_arrived(stdout)


def test_the_migration_report_through_spark_submit_on_the_cluster(spark_cluster, tmp_path):
    from tests.recordings import Recording, fleet

    recording = Recording(tmp_path / "recording", bodies=True)
    expected = fleet(recording)
    recording.close()
    process = submit(
        spark_cluster,
        tmp_path,
        ROOT / "adapter" / "migrate" / "job.py",
        "report",
        str(tmp_path / "recording"),
        "--json",
        str(tmp_path / "report.json"),
    )
    stdout, stderr = process.communicate(timeout=240)
    assert process.returncode == 0, stdout[-3000:] + stderr[-3000:]
    document = json.loads((tmp_path / "report.json").read_text())
    assert {i["name"] for i in document["idioms"]} == expected.idioms
