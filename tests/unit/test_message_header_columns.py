"""``message_header_columns`` and the Spark reader's rows built a column at a time, against
``message_headers`` and the reader's own row at a time.

For batches of generated messages that mostly share their header names (as the messages of one
stream do), with values that differ or not, and sometimes one message that breaks the shape: the
columns are exactly ``message_headers`` of each message, or None where the names differ; and the
rows the reader adds equal the rows it renders one delivery at a time.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from adapter.mapping import operations as ops
from adapter.mapping.properties import MessageProperties, message_header_columns, message_headers
from adapter.spark.messages import MessageRenderer, RowColumns
from tests.unit.test_message_headers import field_value, header_name, octet, wire_text
from tests.unit.test_spark_messages import rows_of

# each basic property's values, as tests/unit/test_message_headers.py draws them
VALUES = {
    "content_type": wire_text,
    "content_encoding": wire_text,
    "delivery_mode": octet,
    "priority": octet,
    "correlation_id": wire_text,
    "reply_to": wire_text | st.sampled_from(["/queue/q", "/topic/t", "amq.gen-x"]),
    "expiration": wire_text,
    "message_id": wire_text,
    "timestamp": st.integers(0, 2**64 - 1),
    "type": wire_text,
    "user_id": wire_text,
    "app_id": wire_text,
    "cluster_id": wire_text,
}
# a header value as it comes from a stream: mostly the same few, integers as x-stream-offset
table_value = st.one_of(st.sampled_from(["v", 7, True]), st.integers(-(2**63), 2**63 - 1), field_value)


@st.composite
def one_shape(draw: st.DrawFn) -> list[MessageProperties]:
    """Properties of a few messages with the same properties and headers-table names (in the
    same order), their values drawn anew or kept; sometimes one message of another shape."""
    present = draw(st.sets(st.sampled_from(sorted(VALUES))))
    names = draw(st.none() | st.lists(header_name, max_size=4, unique=True))
    shared = {attribute: draw(VALUES[attribute]) for attribute in present}
    shared_table = None if names is None else {name: draw(table_value) for name in names}
    messages = []
    for _ in range(draw(st.integers(1, 5))):
        fields = {a: draw(VALUES[a]) if draw(st.booleans()) else v for a, v in shared.items()}
        table = None
        if shared_table is not None:
            table = {n: draw(table_value) if draw(st.booleans()) else v for n, v in shared_table.items()}
        messages.append(MessageProperties(headers=table, **fields))  # type: ignore[arg-type]
    if draw(st.integers(0, 3)) == 0:  # one of another shape, somewhere
        other = draw(st.sampled_from(sorted(VALUES)))
        odd = MessageProperties(headers=dict(reversed((shared_table or {"odd": 1}).items())))
        setattr(odd, other, None if other in present else draw(VALUES[other]))
        messages.insert(draw(st.integers(0, len(messages))), odd)
    return messages


@settings(max_examples=400, deadline=None)
@given(messages=one_shape())
def test_the_columns_are_message_headers_of_each_message(messages):
    columns = message_header_columns(messages)
    expected = [message_headers(properties) for properties in messages]
    if columns is None:
        # only where the messages' header names (or the tables' names) differ
        shapes = {
            (tuple(name for name, _ in pairs), tuple(properties.headers or ()))
            for pairs, properties in zip(expected, messages, strict=True)
        }
        assert len(shapes) > 1
    else:
        assert all(len(values) == len(messages) for _, values in columns)
        for i, pairs in enumerate(expected):
            assert [(name, values[i]) for name, values in columns] == pairs


def test_no_messages_no_columns():
    assert message_header_columns([]) == []


bodies = st.sampled_from([b"", b"body", b"other body"])


@settings(max_examples=300, deadline=None)
@given(
    messages=one_shape(),
    body=st.none() | bodies,  # None: each message its own
    redelivered=st.none() | st.booleans(),
    data=st.data(),
)
def test_rows_added_a_column_at_a_time_are_the_rows_rendered_one_at_a_time(messages, body, redelivered, data):
    deliveries = [
        ops.Delivery(
            "T",
            number + 1,
            data.draw(st.booleans()) if redelivered is None else redelivered,
            data.draw(st.sampled_from(["", "amq.topic"])),
            "k",
            properties,
            data.draw(bodies) if body is None else body,
        )
        for number, properties in enumerate(messages)
    ]
    offsets = list(range(len(deliveries)))
    columns = RowColumns("s")
    renderer = MessageRenderer()
    renderer.add_rows(columns, deliveries[:1], offsets[:1])  # in two pieces, as two socket reads
    renderer.add_rows(columns, deliveries[1:], offsets[1:])
    rows = [renderer.row(delivery, "s", offset) for delivery, offset in zip(deliveries, offsets, strict=True)]
    assert [row[:2] for row in rows_of(columns)] == [row[:2] for row in rows]
    # each map in the frame's order, not only with the same entries
    ends = columns.header_ends
    assert [columns.header_names[a:b] for a, b in zip(ends, ends[1:], strict=False)] == [
        list(row[1]) for row in rows
    ]


@settings(max_examples=200, deadline=None)
@given(messages=one_shape(), body=bodies, data=st.data())
def test_the_map_column_arrow_builds_from_header_columns_is_the_one_built_from_rows(messages, body, data):
    from adapter.spark.source import arrow_batch

    deliveries = [ops.Delivery("T", 1, False, "", "k", properties, body) for properties in messages]
    columns = RowColumns("s")
    renderer = MessageRenderer()
    # in pieces, as reads of the socket bring them: column-wise, then row-wise, then column-wise
    cuts = sorted(data.draw(st.lists(st.integers(0, len(deliveries)), min_size=2, max_size=2)))
    for start, end in zip([0, *cuts], [*cuts, len(deliveries)], strict=True):
        renderer.add_rows(columns, deliveries[start:end], list(range(start, end)))
    batch = arrow_batch(columns)
    columns.flatten_headers()
    assert not columns.header_blocks
    assert batch.equals(arrow_batch(columns))
    assert batch.column("headers").to_pylist() == [
        list(renderer.row(delivery, "s", 0)[1].items()) for delivery in deliveries
    ]


def test_integer_header_values_are_python_s_decimal_text_in_arrow_too():
    from adapter.spark.source import arrow_batch

    integers = [0, -1, 7, -(2**63), 2**63 - 1]
    for values in (integers, [*integers, 2**64 - 1]):  # beyond int64: Python renders them
        deliveries = [
            ops.Delivery("T", 1, False, "", "k", MessageProperties(headers={"n": value}), b"")
            for value in values
        ]
        columns = RowColumns("s")
        MessageRenderer().add_rows(columns, deliveries, list(range(len(deliveries))))
        assert columns.header_blocks  # the column-wise path
        headers = arrow_batch(columns).column("headers").to_pylist()
        assert [dict(row)["n"] for row in headers] == [str(value) for value in values]
