"""The data source shipped as docs/spark.md says, "On a cluster": ``spark-submit --py-files
adapter.zip`` with a Python that has PySpark and pyarrow but none of the adapter's own
dependencies, on the driver and in the Python workers (local[1] stands in for the cluster)."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from adapter.spark.broker import BlockingBroker
from adapter.spark.streams import next_offset
from tests.spark.conftest import publish

pytestmark = pytest.mark.timeout(240)

ROOT = Path(__file__).resolve().parents[2]

# imported by Python at start-up, driver and workers alike (PYTHONPATH reaches both): the
# adapter's dependencies become unimportable, as on a node where they are not installed
BLOCKER = """import sys
for name in ("lark", "pydantic", "pydantic_settings", "aio_pika", "aiormq", "pamqp", "wsproto", "h11"):
    sys.modules[name] = None
"""

JOB = """import sys
from pyspark.sql import SparkSession
from adapter.spark import register

url, stream = sys.argv[1:3]
spark = SparkSession.builder.appName("py-files").getOrCreate()
register(spark)
rows = (spark.read.format("stomp").option("url", url).option("destination", f"/amq/queue/{stream}")
        .load().collect())
print("BODIES", sorted(row.body.decode() for row in rows))
spark.createDataFrame([(f"/amq/queue/{stream}", b"from spark-submit")], "destination string, body binary") \\
    .write.format("stomp").option("url", url).mode("append").save()


def origin(_):
    import adapter
    return [adapter.__file__]


print("WORKER", spark.sparkContext.parallelize([0], 1).flatMap(origin).collect()[0])
spark.stop()
"""


def test_spark_submit_with_py_files_needs_no_server_dependency(
    amqp_url, queues, broker: BlockingBroker, tmp_path
):
    stream = queues("spark-py-files")
    publish(broker, stream, [b"one", b"two"])
    package = tmp_path / "adapter.zip"
    with zipfile.ZipFile(package, "w") as archive:
        for source in sorted((ROOT / "adapter").rglob("*")):
            if source.is_file() and "__pycache__" not in source.parts:
                archive.write(source, source.relative_to(ROOT))
    (tmp_path / "blocker").mkdir()
    (tmp_path / "blocker" / "sitecustomize.py").write_text(BLOCKER)
    (tmp_path / "job.py").write_text(JOB)
    environment = dict(
        os.environ,
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        PYTHONPATH=str(tmp_path / "blocker"),
    )
    command = [
        str(Path(sys.executable).parent / "spark-submit"),
        "--master",
        "local[1]",
        "--conf",
        "spark.ui.enabled=false",
        "--py-files",
        str(package),
        str(tmp_path / "job.py"),
        amqp_url,
        stream,
    ]
    # run outside the checkout, so that only the zip can provide the package
    result = subprocess.run(
        command, cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=200
    )
    # spark-submit prints the job's Python traceback on stdout, Spark's log on stderr
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "BODIES ['one', 'two']" in result.stdout
    worker_origin = next(line for line in result.stdout.splitlines() if line.startswith("WORKER "))
    assert "adapter.zip" in worker_origin
    assert next_offset(broker, stream) == 3  # the row the job wrote
