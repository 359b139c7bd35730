"""The migration report (adapter/migrate) in a real SparkSession and through ``spark-submit``:
on a synthetic recording of six ActiveMQ applications (tests/recordings.py), the report names
exactly the idioms each application uses, and nothing from the ``.part`` file being written."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from adapter.mapping.profile import durable_subscription_queue
from adapter.mapping.scheduled import DELAY_NOW, DELAY_REFUSED, MAX_DELAY_MS, bucket, delay_queue
from adapter.migrate.idioms import idiom, idiom_headers
from adapter.migrate.report import (
    IDIOM_KEY_SQL,
    build_report,
    decode,
    distinct_plans,
    frame_groups,
    read_recording,
)
from tests.recordings import Recording, fleet

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    directory = tmp_path_factory.mktemp("recording")
    recording = Recording(directory, bodies=True)
    expected = fleet(recording)
    recording.close()
    return directory, expected, recording.frames


def _by_application(document) -> dict[tuple[str, str, str | None], set[str]]:
    return {
        (app["host"], app["login"], app["client_id"]): {i["name"] for i in app["idioms"]}
        for app in document["applications"]
    }


@pytest.mark.timeout(300)
def test_the_report_names_exactly_the_idioms_each_application_uses(spark, recorded) -> None:
    directory, expected, frames = recorded
    document = build_report(spark, str(directory))
    assert set(document) >= {"idioms", "destinations", "applications", "totals"}
    assert {i["name"] for i in document["idioms"]} == expected.idioms
    assert _by_application(document) == {
        (a.host, a.login, a.client_id): set(a.idioms) for a in expected.applications
    }
    for entry in document["idioms"]:
        assert entry["support"] == idiom(entry["name"]).support
        assert entry["connections"] >= 1 and entry["frames"] >= entry["connections"]
    browser = next(i for i in document["idioms"] if i["name"] == "browser")
    assert (browser["connections"], browser["frames"]) == (1, 1)  # not the .part file's
    assert document["totals"]["frames"] == frames
    assert document["totals"]["connections"] == expected.connections
    orders = next(d for d in document["destinations"] if d["destination"].endswith(".orders"))
    assert (orders["kind"], orders["sent"], orders["delivered"], orders["max_size"]) == ("queue", 3, 3, 7)
    assert sum(orders["rate"]["sent"]) == 3
    queues = {q["name"] for q in document["topology"]["queues"]}
    feed = next(a for a in expected.applications if a.client_id)
    assert durable_subscription_queue(feed.client_id, "feed") in queues
    assert [r["message"] for r in document["refused"]] == ["Transformation not supported"]


BLOCKER = """import sys
for name in ("pydantic", "pydantic_settings", "aio_pika", "aiormq", "pamqp", "wsproto", "h11", "uvloop"):
    sys.modules[name] = None
"""


@pytest.mark.timeout(300)
def test_the_report_as_the_readme_runs_it(recorded, tmp_path) -> None:
    """``python -m adapter.migrate report`` from a virtualenv, with nothing said about Spark's
    Python: its workers must run this interpreter, not ``python3`` from the PATH (here, as for
    most users of a virtualenv, another Python, without this package: the workers failed with
    "No module named 'adapter'")."""
    directory, expected, _frames = recorded
    environment = {
        name: value
        for name, value in os.environ.items()
        if name not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")
    }
    command = [
        sys.executable,
        "-m",
        "adapter.migrate",
        "report",
        str(directory),
        "--json",
        str(tmp_path / "report.json"),
    ]
    result = subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=280)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-3000:]
    document = json.loads((tmp_path / "report.json").read_text())
    assert {i["name"] for i in document["idioms"]} == expected.idioms


@pytest.mark.timeout(300)
def test_the_report_through_spark_submit(recorded, tmp_path) -> None:
    """``spark-submit --py-files adapter.zip adapter/migrate/job.py report ...`` on a Python
    without the server's dependencies (lark stays: the driver plans the topology with the
    profile's rules, which compile selectors)."""
    directory, expected, _frames = recorded
    package = tmp_path / "adapter.zip"
    with zipfile.ZipFile(package, "w") as archive:
        for source in sorted((ROOT / "adapter").rglob("*")):
            if source.is_file() and "__pycache__" not in source.parts:
                archive.write(source, source.relative_to(ROOT))
    (tmp_path / "blocker").mkdir()
    (tmp_path / "blocker" / "sitecustomize.py").write_text(BLOCKER)
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
        "--conf",
        "spark.sql.shuffle.partitions=2",
        "--py-files",
        str(package),
        str(ROOT / "adapter" / "migrate" / "job.py"),
        "report",
        str(directory),
        "--out",
        str(tmp_path / "report.html"),
        "--json",
        str(tmp_path / "report.json"),
    ]
    result = subprocess.run(
        command, cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=280
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-3000:]
    document = json.loads((tmp_path / "report.json").read_text())
    assert {i["name"] for i in document["idioms"]} == expected.idioms
    page = (tmp_path / "report.html").read_text()
    assert "What to change before cutting over" in page and "<script" not in page


@pytest.mark.timeout(300)
def test_distinct_delays_reach_the_driver_as_one_row_per_delay_bucket(spark, tmp_path) -> None:
    """3,000 scheduled SENDs to one queue, each with its own AMQ_SCHEDULED_DELAY (1 to 3,000 ms),
    a few to a topic, and some that delay nothing or that the profile refuses: the plans the
    driver collects are one per delay bucket (210 for the queue), and the topology has exactly
    the delay queues of those buckets, as adapter/mapping/scheduled.py names them."""
    directory = tmp_path / "recording"
    recording = Recording(directory, bodies=False, per_file=1_000)
    conn = recording.connection("10.0.0.3").connect(login="scheduler")
    queue_delays = range(1, 3_001)
    topic_delays = (5, 50, 5_000, 5_001, 5_099, 5_100)
    for delay in queue_delays:
        conn.send("SEND", [("destination", "/queue/later"), ("AMQ_SCHEDULED_DELAY", str(delay))], b"x")
    for delay in topic_delays:
        conn.send("SEND", [("destination", "/topic/ticks"), ("AMQ_SCHEDULED_DELAY", str(delay))], b"x")
    for value in ("0", "-1", "-250"):  # delivered at once
        conn.send("SEND", [("destination", "/queue/later"), ("AMQ_SCHEDULED_DELAY", value)], b"x")
    for value in ("soon", "1.5", str(MAX_DELAY_MS + 1)):  # refused: Processing error
        conn.send("SEND", [("destination", "/queue/later"), ("AMQ_SCHEDULED_DELAY", value)], b"x")
    conn.send("DISCONNECT")
    conn.close()
    recording.close()

    queue_buckets = {bucket(delay) for delay in queue_delays}
    topic_buckets = {bucket(delay) for delay in topic_delays}
    assert (len(queue_buckets), len(topic_buckets)) == (210, 4)
    plans = distinct_plans(frame_groups(decode(read_recording(spark, str(directory))))).collect()
    by_destination: dict[str, list[str]] = {}
    for row in plans:
        assert row["command"] == "SEND"
        by_destination.setdefault(row["destination"], []).append(row["delay_plan"])
    assert sorted(by_destination["/queue/later"]) == sorted(
        [str(b) for b in queue_buckets] + [DELAY_NOW, DELAY_REFUSED]
    )
    assert sorted(by_destination["/topic/ticks"]) == sorted(str(b) for b in topic_buckets)
    assert len(plans) == 210 + 2 + 4  # not the 3,012 distinct SENDs

    document = build_report(spark, str(directory))
    delay_queues = {
        q["name"] for q in document["topology"]["queues"] if q["name"].startswith("activemq.scheduled.")
    }
    assert delay_queues == {delay_queue(b, "")[0] for b in queue_buckets} | {
        delay_queue(b, "amq.topic")[0] for b in topic_buckets
    }
    (refusal,) = document["refused"]
    assert (refusal["destination"], refusal["message"]) == ("/queue/later", "Processing error")
    assert "AMQ_SCHEDULED_DELAY" in refusal["detail"]
    assert document["totals"]["frames"] == recording.frames


@pytest.mark.timeout(300)
def test_the_idiom_key_in_spark_sql_is_idiom_headers(spark, recorded, tmp_path) -> None:
    """The report runs frame_idioms once per distinct direction, command and idiom key: the key
    Spark computes is idioms.idiom_headers (checked there to change no frame's idioms) for
    every frame of the fleet and for hostile headers (short, long, repeated, null values)."""
    from pyspark.sql import functions as F

    directory, _expected, _frames = recorded
    hostile = tmp_path / "hostile"
    hostile.mkdir()
    headers = [
        [["receipt"], ["receipt", "r1", "extra"], ["destination", "/queue/a"], ["selector", None]],
        [["expires", None], ["expires", "5"], ["message-id", "m"], ["transaction", "t"], ["ack", "client"]],
        [["version", "1.2"], ["heart-beat", "10,0"], ["JMSXGroupID", "g"], ["AMQ_SCHEDULED_CRON", "* *"]],
        [["ack", "client"], [], ["browser", "true"]],
        [],
        None,
    ]
    with gzip.open(hostile / "tap-x-1-000001.jsonl.gz", "wt") as out:
        for n, pairs in enumerate(headers):
            record = {"v": 1, "ts": n, "conn": "c", "kind": "frame", "dir": "in", "command": "SEND"}
            out.write(json.dumps({**record, "headers": pairs}) + "\n")
    for path in (directory, hostile):
        rows = (
            read_recording(spark, str(path))
            .filter("kind = 'frame'")
            .select("headers", F.expr(IDIOM_KEY_SQL).alias("key"))
            .collect()
        )
        assert rows
        for row in rows:
            assert row["key"] == idiom_headers(row["headers"]), row["headers"]


@pytest.mark.timeout(300)
def test_a_send_without_destination_tied_with_a_named_one_is_reported(spark, tmp_path) -> None:
    """A SEND that names no destination (the broker refuses it; a recording keeps it) as often as
    a named one: the busiest destinations are ranked without comparing a missing name with a
    present one, and the report is written."""
    directory = tmp_path / "recording"
    recording = Recording(directory, bodies=False)
    conn = recording.connection("10.0.0.4").connect(login="careless")
    for _ in range(3):
        conn.send("SEND", [("destination", "/queue/named")], b"x")
        conn.send("SEND", [("content-type", "text/plain")], b"x")
    conn.send("DISCONNECT")
    conn.close()
    recording.close()
    document = build_report(spark, str(directory))
    names = [d["destination"] for d in document["destinations"]]
    assert "/queue/named" in names
    assert document["totals"]["frames"] == recording.frames
