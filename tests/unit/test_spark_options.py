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
