"""The data source's numeric options, checked before anything starts: a bad value fails with
the option's name, never with Python's own conversion error."""

from __future__ import annotations

import pytest
from pyspark.sql.types import BinaryType, StringType, StructField, StructType

from adapter.spark.sink import sink_settings
from adapter.spark.source import DEFAULT_TIMEOUT, source_options
from adapter.spark.streams import StreamOptionError

URL = "amqp://guest:guest@localhost:5672/"
SINK_SCHEMA = StructType([StructField("destination", StringType()), StructField("body", BinaryType())])
BAD_SECONDS = ["soon", "", "0", "-1", "nan", "inf"]
BASE = {"url": URL, "destination": "/amq/queue/events"}


@pytest.mark.parametrize("value", BAD_SECONDS)
def test_a_bad_read_timeout_names_the_option(value):
    with pytest.raises(
        StreamOptionError, match=f"option 'timeout' must be a positive number of seconds, got '{value}'"
    ):
        source_options({"url": URL, "destination": "/amq/queue/events", "timeout": value})


@pytest.mark.parametrize("value", BAD_SECONDS)
def test_a_bad_sink_timeout_names_the_option(value):
    with pytest.raises(StreamOptionError, match="option 'timeout' must be a positive number of seconds"):
        sink_settings({"url": URL, "timeout": value}, SINK_SCHEMA)


@pytest.mark.parametrize("value", ["4 MiB", "1.5", "0", "-10", ""])
def test_a_bad_frame_size_names_the_option(value):
    with pytest.raises(
        StreamOptionError, match=f"option 'maxFrameSize' must be a positive integer, got '{value}'"
    ):
        sink_settings({"url": URL, "maxFrameSize": value}, SINK_SCHEMA)


def test_good_values_are_taken():
    assert (
        source_options({"url": URL, "destination": "/amq/queue/events", "timeout": "2.5"}).read.timeout == 2.5
    )
    settings = sink_settings({"url": URL, "maxFrameSize": "1024", "timeout": "7"}, SINK_SCHEMA)
    assert (settings.max_body_size, settings.timeout) == (1024, 7.0)
    assert sink_settings({"url": URL}, SINK_SCHEMA).timeout == DEFAULT_TIMEOUT


# ------------------------------------------------------------------ the broker URL's password
SECRET = "hunter2"


def test_the_password_is_not_in_the_repr_of_the_options():
    """Spark logs and shows options and settings objects (a failed task's repr, a debugger):
    the password is ``***`` there, every node's."""
    url = f"amqp://reader:{SECRET}@h1:5672/v,amqps://reader:{SECRET}-2@h2/v"
    source = source_options({"url": url, "destination": "/amq/queue/events"})
    sink = sink_settings({"url": url}, SINK_SCHEMA)
    for shown in (repr(source), repr(source.url), repr(source.read), repr(sink), str(source.url)):
        assert SECRET not in shown, shown
    assert "password='***'" in repr(source.url)
    assert source.url.password == SECRET and source.url.others[0].password == f"{SECRET}-2"


@pytest.mark.parametrize(
    "url",
    [
        f"amqp://reader:{SECRET}/x@host:5672/",  # an unencoded / ends the host part early
        f"amqp://reader:{SECRET}?x@host/",
        f"amqp://reader:{SECRET}#x@host/",
        f"amqp://reader:{SECRET}[x@host/",
        f"amqp://reader:{SECRET},x@host/",  # a comma splits the list of nodes
        f"amqp://reader:12345/{SECRET}@host/",  # reads as host "reader", port 12345
        f"amqp://reader:{SECRET}@host:port/",
    ],
)
def test_a_url_that_cannot_be_read_does_not_show_the_password(url):
    with pytest.raises(StreamOptionError) as info:
        source_options({"url": url, "destination": "/amq/queue/events"})
    assert SECRET not in str(info.value) and "12345" not in str(info.value), str(info.value)
    assert "option 'url'" in str(info.value)


# ------------------------------------------------------------------- micro-batch bounds
@pytest.mark.parametrize(
    ("raw", "seconds"),
    [("15m", 900.0), ("30s", 30.0), ("500ms", 0.5), ("2h", 7200.0), ("1500", 1.5), ("0", 0.0)],
)
def test_max_trigger_delay_takes_kafkas_durations(raw, seconds):
    options = source_options({**BASE, "minOffsetsPerTrigger": "10", "maxTriggerDelay": raw})
    assert (options.min_offsets_per_trigger, options.max_trigger_delay) == (10, seconds)


def test_the_bounds_default_to_none_and_fifteen_minutes():
    options = source_options(BASE)
    assert options.max_bytes_per_trigger is None and options.min_offsets_per_trigger is None
    assert options.max_trigger_delay == 900.0


@pytest.mark.parametrize("value", ["soon", "-1s", "inf", "1 week"])
def test_a_bad_max_trigger_delay_names_the_option(value):
    with pytest.raises(StreamOptionError, match="'maxTriggerDelay'"):
        source_options({**BASE, "maxTriggerDelay": value})


@pytest.mark.parametrize("name", ["maxBytesPerTrigger", "minOffsetsPerTrigger"])
@pytest.mark.parametrize("value", ["0", "-5", "1 MiB"])
def test_a_bad_bound_names_the_option(name, value):
    with pytest.raises(StreamOptionError, match=repr(name)):
        source_options({**BASE, name: value})
