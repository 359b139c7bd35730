"""The sink's rows without Spark or broker: what the record batches Spark hands a writer become,
the same as the ``Row``\\ s PySpark would have made of them."""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql import Row
from pyspark.sql.types import BinaryType, MapType, StringType, StructField, StructType

from adapter.spark.sink import batch_rows, row_values, sink_columns

SCHEMA = StructType(
    [
        StructField("headers", MapType(StringType(), StringType())),
        StructField("extra", StringType()),
        StructField("body", BinaryType()),
        StructField("destination", StringType()),
    ]
)
HEADERS = pa.map_(pa.string(), pa.string())


def batch(headers: list[object], bodies: list[object], destinations: list[object]) -> pa.RecordBatch:
    return pa.record_batch(
        [
            pa.array(headers, HEADERS),
            pa.array(["ignored"] * len(bodies)),
            pa.array(bodies, pa.binary()),
            pa.array(destinations, pa.string()),
        ],
        names=["headers", "extra", "body", "destination"],
    )


def as_dicts(rows: list[tuple[object, object, object]]) -> list[tuple[object, object, object]]:
    return [(d, None if h is None else dict(h), b) for d, h, b in rows]  # type: ignore[call-overload]


def test_record_batches_give_each_row_by_column_name_with_its_header_pairs():
    columns = sink_columns(SCHEMA)
    batches = [
        batch([[("a", "1"), ("b", None)], None], [b"x", None], ["/queue/q", None]),
        batch([[]], [b""], ["/topic/t"]),
    ]
    rows = list(batch_rows(columns, batches))
    assert as_dicts(rows) == [
        ("/queue/q", {"a": "1", "b": None}, b"x"),
        (None, None, None),
        ("/topic/t", {}, b""),
    ]
    # the same as the rows PySpark makes for a row-based writer
    spark_rows = [
        Row(headers={"a": "1", "b": None}, extra="ignored", body=b"x", destination="/queue/q"),
        Row(headers=None, extra="ignored", body=None, destination=None),
        Row(headers={}, extra="ignored", body=b"", destination="/topic/t"),
    ]
    assert as_dicts(list(row_values(columns, spark_rows))) == as_dicts(rows)


def test_without_a_headers_column_every_row_has_none():
    schema = StructType([StructField("destination", StringType()), StructField("body", StringType())])
    record = pa.record_batch(
        [pa.array(["/queue/q"] * 2), pa.array(["text", "more"])], names=["destination", "body"]
    )
    assert list(batch_rows(sink_columns(schema), [record])) == [
        ("/queue/q", None, "text"),
        ("/queue/q", None, "more"),
    ]
