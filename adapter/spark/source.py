"""The ``stomp`` data source: PySpark's Python Data Source API over the adapter's mapping.

Owns the Spark-facing classes and the option parsing: the data source itself (schema, which
reader or writer), the batch reader (a fixed offset range per stream, planned on the driver), the
streaming reader (offsets per stream as Spark's checkpointed JSON, one micro-batch = one range
per stream), and the option names and defaults documented in docs/spark.md.  The stream work
itself is in ``streams.py``, the message rules in ``messages.py``, publishing in ``sink.py``, the
option checks both share in ``options.py``.

Everything a task needs travels in its ``InputPartition`` (pickled to the executors), so the
executors need this package installed, nothing else.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.types import StructType

from ..mapping.properties import DecimalTexts
from .broker import BlockingBroker, BrokerUrl
from .messages import MessageRenderer, RowColumns
from .options import (
    DEFAULT_TIMEOUT,
    broker_url,
    duration_option,
    positive_option,
    required_option,
    seconds_option,
)
from .streams import (
    OffsetRange,
    ReadSettings,
    StreamOptionError,
    StreamRef,
    first_offset,
    next_offset,
    offset_at,
    offset_within_bytes,
    prepare_streams,
    read_deliveries,
    split_range,
    stream_refs,
)

FORMAT_NAME: Final = "stomp"

READ_SCHEMA: Final = (
    "destination string, headers map<string,string>, body binary, offset long,"
    " timestamp timestamp, stream string"
)

# READ_SCHEMA as Arrow, exactly as PySpark converts it (timestamps in UTC): read() hands Spark
# record batches of this schema (tests/spark checks it against PySpark's own conversion)
ARROW_SCHEMA: Final = pa.schema(
    [
        ("destination", pa.string()),
        ("headers", pa.map_(pa.string(), pa.string())),
        ("body", pa.binary()),
        ("offset", pa.int64()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("stream", pa.string()),
    ]
)
_HEADERS_TYPE: Final = ARROW_SCHEMA.field("headers").type
_TIMESTAMP_TYPE: Final = ARROW_SCHEMA.field("timestamp").type
# A record batch ends after this many rows, or once its bodies reach this many bytes (with what
# the socket read that reached them: at most one read, or one message, more).
ARROW_BATCH_ROWS: Final = 4096
ARROW_BATCH_BYTES: Final = 16 * 1024 * 1024

DEFAULT_PARTITION_SIZE: Final = 100_000
DEFAULT_PREFETCH: Final = 1000
# maxTriggerDelay's default, as Kafka's: 15 minutes
DEFAULT_MAX_TRIGGER_DELAY: Final = 15 * 60.0


# ------------------------------------------------------------------------------------ options
@dataclass(frozen=True, slots=True)
class SourceOptions:
    url: BrokerUrl
    streams: list[StreamRef]
    capture_arguments: dict[str, str]
    starting: dict[str, OffsetSpec] | None  # None: the default (latest streaming, earliest batch)
    ending: dict[str, OffsetSpec]
    max_offsets_per_trigger: int | None
    max_bytes_per_trigger: int | None
    min_offsets_per_trigger: int | None
    max_trigger_delay: float  # seconds
    partition_size: int
    read: ReadSettings


@dataclass(frozen=True, slots=True)
class OffsetSpec:
    """A position in one stream: ``earliest``, ``latest``, an ``offset`` (``value``), or a
    ``timestamp`` (``value`` in milliseconds since the epoch, as Kafka's): the first message of
    the first chunk the broker wrote at or after that time."""

    kind: Literal["earliest", "latest", "offset", "timestamp"]
    value: int = 0


_LATEST: Final = OffsetSpec("latest")


def _position(
    options: Mapping[str, str], streams: list[StreamRef], side: Literal["starting", "ending"]
) -> dict[str, OffsetSpec] | None:
    """The ``startingOffsets`` / ``startingTimestamp`` / ``startingOffsetsByTimestamp`` options
    (or the ``ending`` ones) as a position per stream queue; None when none is given."""
    names = [f"{side}Offsets", f"{side}Timestamp", f"{side}OffsetsByTimestamp"]
    given = [name for name in names if (options.get(name) or "").strip()]
    if len(given) > 1:
        raise StreamOptionError(
            f"options {given[0]!r} and {given[1]!r} both say where to {side[:-3]}: give only one"
        )
    if not given:
        return None
    name = given[0]
    raw = (options.get(name) or "").strip()
    queues = [ref.queue for ref in streams]
    if name.endswith("ByTimestamp"):
        return {
            queue: OffsetSpec("timestamp", _millis(name, v)) for queue, v in _per_stream(name, raw, queues)
        }
    if name.endswith("Timestamp"):
        return dict.fromkeys(queues, OffsetSpec("timestamp", _millis(name, raw)))
    if raw.startswith("{"):
        return {queue: _json_offset(name, v, side) for queue, v in _per_stream(name, raw, queues)}
    words = ("earliest", "latest") if side == "starting" else ("latest",)
    if raw in words:
        return dict.fromkeys(queues, OffsetSpec("earliest" if raw == "earliest" else "latest"))
    if raw.isdigit():
        return dict.fromkeys(queues, OffsetSpec("offset", int(raw)))
    raise StreamOptionError(
        f"option {name!r} must be {', '.join(words)}, an offset number or a JSON object "
        f'{{"<stream>": <offset>}}, got {raw!r}'
    )


def _per_stream(name: str, raw: str, queues: list[str]) -> list[tuple[str, object]]:
    """A JSON object with one entry for each stream read, as (stream, value) in stream order."""
    try:
        table = json.loads(raw)
    except ValueError as error:
        raise StreamOptionError(f"option {name!r} is not valid JSON ({error}): {raw!r}") from None
    if not isinstance(table, dict):
        raise StreamOptionError(f'option {name!r} must be a JSON object {{"<stream>": ...}}, got {raw!r}')
    unknown = sorted(set(table) - set(queues))
    if unknown:
        raise StreamOptionError(
            f"option {name!r} names {unknown[0]!r}, which is not a stream read here "
            f"(the streams of option 'destination': {', '.join(queues)})"
        )
    missing = [queue for queue in queues if queue not in table]
    if missing:
        raise StreamOptionError(f"option {name!r} gives nothing for the stream {missing[0]!r}")
    return [(queue, table[queue]) for queue in queues]


def _json_offset(name: str, value: object, side: str) -> OffsetSpec:
    # Kafka's convention in JSON offsets: -2 earliest, -1 latest
    if isinstance(value, int) and not isinstance(value, bool):
        if value >= 0:
            return OffsetSpec("offset", value)
        if value == -1:
            return _LATEST
        if value == -2 and side == "starting":
            return OffsetSpec("earliest")
    allowed = "an offset, -2 (earliest) or -1 (latest)" if side == "starting" else "an offset or -1 (latest)"
    raise StreamOptionError(f"option {name!r}: each stream's value must be {allowed}, got {value!r}")


def _millis(name: str, value: object) -> int:
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise StreamOptionError(
        f"option {name!r}: a timestamp is milliseconds since the epoch (e.g. 1700000000000), got {value!r}"
    )


def source_options(options: Mapping[str, str]) -> SourceOptions:
    """All read options, checked on the driver before anything is started."""
    url = broker_url(options)
    # x-max-age, x-max-length-bytes ...: queue arguments of a capture stream, as SUBSCRIBE headers
    capture_arguments = {k.lower(): v for k, v in options.items() if k.lower().startswith("x-")}
    streams = stream_refs(
        required_option(options, "destination", "/amq/queue/events"), options.get("stream"), capture_arguments
    )
    timeout = seconds_option(options, "timeout", DEFAULT_TIMEOUT)
    fail_on_data_loss = options.get("failOnDataLoss", "true").strip().lower() != "false"
    prefetch = positive_option(options, "prefetch", DEFAULT_PREFETCH)
    assert prefetch is not None
    if prefetch > 65535:
        raise StreamOptionError(f"option 'prefetch' is at most 65535 (an AMQP short), got {prefetch}")
    partition_size = positive_option(options, "partitionSize", DEFAULT_PARTITION_SIZE)
    assert partition_size is not None
    return SourceOptions(
        url=url,
        streams=streams,
        capture_arguments=capture_arguments,
        starting=_position(options, streams, "starting"),
        ending=_position(options, streams, "ending")
        or dict.fromkeys([ref.queue for ref in streams], _LATEST),
        max_offsets_per_trigger=positive_option(options, "maxOffsetsPerTrigger", None),
        max_bytes_per_trigger=positive_option(options, "maxBytesPerTrigger", None),
        min_offsets_per_trigger=positive_option(options, "minOffsetsPerTrigger", None),
        max_trigger_delay=duration_option(options, "maxTriggerDelay", DEFAULT_MAX_TRIGGER_DELAY),
        partition_size=partition_size,
        read=ReadSettings(
            url,
            prefetch,
            timeout,
            fail_on_data_loss,
            include_headers=options.get("includeHeaders", "true").strip().lower() != "false",
        ),
    )


# ------------------------------------------------------------------------------------ offsets
def _resolve(broker: BlockingBroker, queue: str, spec: OffsetSpec) -> int:
    """A position as a concrete offset of ``queue``.  A time after the newest message means
    the end of the stream (what comes next), as Kafka's ``latest`` strategy for timestamps."""
    if spec.kind == "offset":
        return spec.value
    if spec.kind == "earliest":
        first = first_offset(broker, queue)
        return 0 if first is None else first
    # the end first: a message that arrives after it is newer than the time looked for
    end = next_offset(broker, queue)
    if spec.kind == "timestamp":
        found = offset_at(broker, queue, spec.value // 1000)
        if found is not None:
            return found
    return 0 if end is None else end


def _connect(options: SourceOptions, purpose: str) -> BlockingBroker:
    broker = BlockingBroker(options.url, connection_name=f"spark {purpose}", timeout=options.read.timeout)
    try:
        prepare_streams(broker, options.streams, options.capture_arguments)
    except BaseException:
        broker.close()
        raise
    return broker


class RangePartition(InputPartition):
    """One task's work: an offset range and how to reach the broker."""

    def __init__(self, settings: ReadSettings, offsets: OffsetRange) -> None:
        super().__init__((offsets.queue, offsets.start, offsets.end))
        self.settings = settings
        self.offsets = offsets


def _partitions(options: SourceOptions, ranges: Mapping[str, tuple[int, int]]) -> list[RangePartition]:
    partitions = []
    for ref in options.streams:
        start, end = ranges[ref.queue]
        for piece in split_range(ref.queue, ref.destination, start, end, options.partition_size):
            partitions.append(RangePartition(options.read, piece))
    return partitions


def _read(partition: InputPartition) -> Iterator[pa.RecordBatch]:
    if not isinstance(partition, RangePartition):
        # a batch read with nothing to read: PySpark plans one InputPartition(None) instead of none
        return iter(())
    return record_batches(partition.settings, partition.offsets)


def record_batches(settings: ReadSettings, offsets: OffsetRange) -> Iterator[pa.RecordBatch]:
    """The messages of ``offsets`` as Arrow record batches of ``ARROW_SCHEMA``, built a column
    at a time from what each read of the socket brought.

    Spark takes record batches from ``read()`` as they are, where tuples would go through
    PySpark's per-value converters (a map column among them); and a column built from a list
    in one call costs less than a row appended at a time (docs/performance.md, "Spark")."""
    renderer = MessageRenderer(include_headers=settings.include_headers)
    columns = RowColumns(offsets.queue)
    for deliveries, numbers in read_deliveries(settings, offsets):
        while deliveries:
            room = ARROW_BATCH_ROWS - len(columns)
            if len(deliveries) > room:
                renderer.add_rows(columns, deliveries[:room], numbers[:room])
                deliveries, numbers = deliveries[room:], numbers[room:]
            else:
                renderer.add_rows(columns, deliveries, numbers)
                deliveries = []
            if len(columns) >= ARROW_BATCH_ROWS or columns.body_bytes >= ARROW_BATCH_BYTES:
                yield arrow_batch(columns)
                columns = RowColumns(offsets.queue)
    if len(columns):
        yield arrow_batch(columns)


def arrow_batch(columns: RowColumns) -> pa.RecordBatch:
    """One record batch of ``ARROW_SCHEMA`` holding the rows of ``columns``."""
    if columns.header_blocks:
        headers = _header_maps(columns.header_blocks)
    else:
        headers = pa.MapArray.from_arrays(
            pa.array(columns.header_ends, pa.int32()),
            pa.array(columns.header_names, pa.string()),
            pa.array(columns.header_values, pa.string()),
            type=_HEADERS_TYPE,
        )
    arrays = [
        pa.array(columns.destinations, pa.string()),
        headers,
        pa.array(columns.bodies, pa.binary()),
        pa.array(columns.offsets, pa.int64()),
        pa.array(columns.timestamps, _TIMESTAMP_TYPE),
        pa.repeat(pa.scalar(columns.stream, pa.string()), len(columns)),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA)


def _header_maps(blocks: list[tuple[tuple[str, ...], list[Sequence[str]]]]) -> pa.MapArray:
    """The map column of rows whose headers are ``blocks`` (``RowColumns.header_blocks``): each
    block's names repeated and its value columns interleaved by Arrow, not a Python string a
    map entry; a value every row of a block shares is converted once."""
    ends, names, values, end = [np.zeros(1, np.int64)], [], [], 0
    for block_names, columns in blocks:
        width, count = len(block_names), len(columns[0])
        ends.append(end + width * np.arange(1, count + 1, dtype=np.int64))
        end += width * count
        names.append(pa.array(block_names, pa.string()).take(np.tile(np.arange(width), count)))
        # row i's value of column j is at j * count + i of the columns one after the other
        order = (np.arange(count)[:, None] + np.arange(width)[None, :] * count).ravel()
        values.append(pa.concat_arrays([_text_array(column) for column in columns]).take(order))
    return pa.MapArray.from_arrays(
        pa.array(np.concatenate(ends).astype(np.int32)),
        pa.concat_arrays(names),
        pa.concat_arrays(values),
        type=_HEADERS_TYPE,
    )


def _text_array(column: Sequence[str]) -> pa.Array:
    if isinstance(column, DecimalTexts):
        try:  # Arrow's decimal text of an int64 is Python's
            return pa.array(column.integers, pa.int64()).cast(pa.string())
        except (OverflowError, pa.ArrowInvalid):  # beyond int64
            return pa.array(list(column), pa.string())
    if column.count(column[0]) == len(column):  # one value (the same object) in every row
        return pa.repeat(pa.scalar(column[0], pa.string()), len(column))
    return pa.array(column, pa.string())


# ------------------------------------------------------------------------------------ readers
class StompBatchReader(DataSourceReader):
    """A batch read: ``[startingOffsets, endingOffsets)`` of each stream, fixed at planning."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        with _connect(options, "batch planning") as broker:
            self.ranges = {}
            for ref in options.streams:
                starting = OffsetSpec("earliest") if options.starting is None else options.starting[ref.queue]
                start = _resolve(broker, ref.queue, starting)
                end = _resolve(broker, ref.queue, options.ending[ref.queue])
                self.ranges[ref.queue] = (start, max(start, end))

    def partitions(self) -> Sequence[InputPartition]:
        return _partitions(self.options, self.ranges)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(partition)


class StompStreamReader(DataSourceStreamReader):
    """A streaming read.  The offset Spark checkpoints is ``{stream: next offset to read}``;
    a micro-batch reads ``[previous, latest)`` of each stream, and a restarted query replays
    the last planned batch with the same ranges, so a file sink sees each message once."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._broker: BlockingBroker | None = None
        # Trigger.AvailableNow: each stream's end when the query started, never read past
        self._available_now: dict[str, int] | None = None
        # when the last micro-batch with new offsets was planned (minOffsetsPerTrigger waits
        # at most maxTriggerDelay from then; from the reader's start for the first)
        self._last_batch = time.monotonic()

    def _driver_broker(self) -> BlockingBroker:
        # one connection for the life of the query, kept by the driver-side reader
        if self._broker is None:
            self._broker = _connect(self.options, "stream planning")
        return self._broker

    def initialOffset(self) -> dict[str, int]:
        broker = self._driver_broker()
        starting = self.options.starting
        return {
            ref.queue: _resolve(broker, ref.queue, _LATEST if starting is None else starting[ref.queue])
            for ref in self.options.streams
        }

    def latestOffset(self, start: dict[str, int] | None = None, limit: object = None) -> dict[str, int]:
        """The end of the next micro-batch in each stream: the stream's next offset, bounded by
        ``maxOffsetsPerTrigger`` (per stream) and ``maxBytesPerTrigger`` (bodies, shared equally
        by the streams); ``start`` itself (no batch) while fewer than ``minOffsetsPerTrigger``
        offsets are new, for at most ``maxTriggerDelay`` since the last batch.

        Spark before 4.2 passes neither ``start`` nor ``limit``; from 4.2 the engine passes the
        read limit ``getDefaultReadLimit`` returned, or ReadAllAvailable (Trigger.Once), which
        lifts every bound."""
        broker = self._driver_broker()
        broker.refresh_token()  # the driver's connection lives as long as the query
        unbounded = type(limit).__name__ == "ReadAllAvailable"
        options = self.options
        cap = None if unbounded else options.max_offsets_per_trigger
        byte_budget = None if unbounded else options.max_bytes_per_trigger
        latest: dict[str, int] = {}
        begins: dict[str, int] = {}
        for ref in options.streams:
            if self._available_now is not None:
                end: int | None = self._available_now[ref.queue]
            else:
                end = next_offset(broker, ref.queue)
            begin = None if start is None else start.get(ref.queue)
            if begin is None:
                latest[ref.queue] = end or 0
                continue
            begins[ref.queue] = begin
            end = begin if end is None else max(begin, end)
            latest[ref.queue] = min(end, begin + cap) if cap else end
        if start is None or not begins:
            return latest
        new = sum(latest[queue] - begin for queue, begin in begins.items())
        minimum = options.min_offsets_per_trigger
        waiting = self._available_now is None and not unbounded
        if (
            waiting
            and minimum is not None
            and new < minimum
            and time.monotonic() - self._last_batch < options.max_trigger_delay
        ):
            return {**latest, **begins}
        if byte_budget is not None:
            share = max(1, byte_budget // len(begins))
            for queue, begin in begins.items():
                latest[queue] = offset_within_bytes(
                    broker, queue, begin, latest[queue], share, options.read.timeout
                )
        if any(latest[queue] > begin for queue, begin in begins.items()):
            self._last_batch = time.monotonic()
        return latest

    def prepareForTriggerAvailableNow(self) -> None:
        """Trigger.AvailableNow (Spark 4.2+): what the streams hold now is all the query reads;
        latestOffset then never goes past these ends, in as many micro-batches as the read
        limit (``maxOffsetsPerTrigger``) makes, and the query stops once they are reached."""
        broker = self._driver_broker()
        self._available_now = {ref.queue: next_offset(broker, ref.queue) or 0 for ref in self.options.streams}

    def getDefaultReadLimit(self) -> Any:
        """ReadMaxRows / ReadMaxBytes / ReadMinRows when one bound is set, so that the engine
        knows the query is rate-limited; latestOffset applies the options themselves (Python
        sources have no composite limit), whatever this returns, unless the engine passes
        ReadAllAvailable."""
        from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxBytes, ReadMaxRows, ReadMinRows

        options = self.options
        if options.max_offsets_per_trigger:
            return ReadMaxRows(options.max_offsets_per_trigger)
        if options.max_bytes_per_trigger:
            return ReadMaxBytes(options.max_bytes_per_trigger)
        if options.min_offsets_per_trigger:
            return ReadMinRows(options.min_offsets_per_trigger)
        return ReadAllAvailable()

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        ranges = {}
        for ref in self.options.streams:
            low = start.get(ref.queue)
            high = end.get(ref.queue, 0)
            ranges[ref.queue] = (high if low is None else low, high)
        return _partitions(self.options, ranges)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(partition)

    def commit(self, end: dict[str, int]) -> None:
        """Nothing to do: Spark keeps the offsets; a stream keeps its messages (retention)."""

    def stop(self) -> None:
        if self._broker is not None:
            self._broker.close()
            self._broker = None


# ------------------------------------------------------------------------------------ source
class StompDataSource(DataSource):
    """``spark.read[Stream].format("stomp")`` and ``df.write[Stream].format("stomp")``."""

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def schema(self) -> str:
        return READ_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return StompBatchReader(source_options(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return StompStreamReader(source_options(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from .sink import StompBatchWriter

        return StompBatchWriter(self.options, schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from .sink import StompStreamWriter

        return StompStreamWriter(self.options, schema)


try:  # PySpark 4.2+ asks a stream reader whether it supports Trigger.AvailableNow
    from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow
except ImportError:  # pragma: no cover - older PySpark: Spark reads everything in one batch
    pass
else:
    SupportsTriggerAvailableNow.register(StompStreamReader)
