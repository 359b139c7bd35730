"""What the Spark data source needs on an executor: a job shipped with ``spark-submit --py-files
adapter.zip`` (docs/spark.md, "On a cluster") finds only PySpark, pyarrow and the standard
library there, none of the adapter's server dependencies."""

from __future__ import annotations

import subprocess
import sys

# the adapter's own dependencies (pyproject.toml), none of which an executor has
SERVER_DEPENDENCIES = (
    "lark",
    "pydantic",
    "pydantic_settings",
    "aio_pika",
    "aiormq",
    "pamqp",
    "wsproto",
    "h11",
)

SPARK_MODULES = (
    "adapter.spark",
    "adapter.spark.broker",
    "adapter.spark.messages",
    "adapter.spark.options",
    "adapter.spark.streams",
    "adapter.spark.source",
    "adapter.spark.sink",
)


def test_the_data_source_imports_without_the_server_dependencies():
    # a module set to None in sys.modules cannot be imported: as if it were not installed
    script = "\n".join(
        [
            "import sys",
            *(f"sys.modules[{name!r}] = None" for name in SERVER_DEPENDENCIES),
            *(f"import {module}" for module in SPARK_MODULES),
            "print('asyncio' in sys.modules)",
        ]
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    # nor asyncio: the data source is blocking code, without an event loop (docs/spark.md)
    assert result.stdout.strip() == "False"
