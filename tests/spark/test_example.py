"""The example pipeline (examples/spark_readings.py) run as a user runs it, briefly: STOMP
readings in, and at least one window's average out to a STOMP subscriber.
(tests/spark/test_spark_cluster.py runs it through spark-submit on a standalone cluster.)"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(240)

ROOT = Path(__file__).resolve().parents[2]


def example_arguments(amqp_url: str, stream: str, checkpoint: Path) -> list[str]:
    # 12 s of readings: enough for the watermark (newest reading - 5 s) to close a 5 s window
    return ["--seconds", "12", "--amqp-url", amqp_url, "--stream", stream, "--checkpoint", str(checkpoint)]


def assert_averages_arrived(stdout: str) -> None:
    averages = re.findall(
        r"^/topic/averages\.(kitchen|garage|attic): (\d+\.\d\d) \(window [^,]+, (\d+) readings\)$",
        stdout,
        re.MULTILINE,
    )
    assert averages, f"no average arrived; the example printed:\n{stdout}"
    for _sensor, average, readings in averages:
        # readings are 20 +- N(0, 2): a window's average lies far inside these bounds
        assert 10 < float(average) < 30 and int(readings) > 0


def test_the_example_pipeline_publishes_averages(amqp_url, queues, tmp_path):
    stream = queues("spark-example", declare=False)  # the example declares it; deleted after
    command = [
        sys.executable,
        "-m",
        "examples.spark_readings",
        *example_arguments(amqp_url, stream, tmp_path / "checkpoint"),
    ]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=200)
    assert result.returncode == 0, result.stderr[-4000:]
    assert_averages_arrived(result.stdout)
