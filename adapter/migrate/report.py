"""The migration report's Spark job: a recording of the tap in, the report's data out.

Owns the reading of a recording (docs/recording-format.md) with Spark and every aggregation of
it: per application (client host, login, client-id), per destination, per idiom, over time.
The recording is read and decoded once, with Spark SQL only (``decode``: the few fields and
headers the report looks at), and reduced to groups of frames alike (``frame_groups``: per
connection, command, destination, idiom and plan headers, time bucket of a message), several
times fewer rows than frames; every figure of the report is a DataFrame aggregation of those
groups, and only aggregated rows (one per idiom, application, destination, time bucket,
distinct SUBSCRIBE, delay bucket of a scheduled SEND ...) reach the driver with ``collect``.
The idioms of a frame come from the pure ``idioms.frame_idioms``, and a delay's bucket from
``mapping.scheduled.delay_plan``, run in the Python workers as Arrow UDFs once per distinct
kind of frame and per distinct delay (neither needs more than the standard library).

``build_report`` returns the report as plain data (the ``report.json`` document); the RabbitMQ
topology in it is planned by adapter/migrate/topology.py with the profile's own rules.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Final

from ..mapping.scheduled import DELAY_HEADER, delay_plan
from .idioms import IDIOM_HEADERS, IDIOM_NAMES, IDIOM_PRESENCE_HEADERS, IDIOMS, destination_kind, frame_idioms
from .topology import plan_topology

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

__all__ = [
    "FORMAT_VERSION",
    "IDIOM_KEY_SQL",
    "RECORD_SCHEMA",
    "build_report",
    "decode",
    "distinct_plans",
    "frame_groups",
    "read_recording",
]

FORMAT_VERSION: Final = 1
# the fields of docs/recording-format.md the report reads (the body is never read: a recording
# made with --record-bodies is analysed without loading a byte of payload)
RECORD_SCHEMA: Final = (
    "v long, ts double, conn string, kind string, client string, dir string, command string, "
    "headers array<array<string>>, body_len long, count long, `by` string, reason string, error string"
)
# the destinations whose rates are charted, and given over time in report.json, by volume
TOP_DESTINATIONS: Final = 12
# how many time buckets a rate has at most: the bucket is the smallest "nice" width that keeps
# the recording's span within this many
MAX_BUCKETS: Final = 120
_NICE_WIDTHS: Final = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400)
# headers a SUBSCRIBE or SEND plan depends on (adapter/mapping/profile.py): kept for the topology
_PLAN_HEADERS: Final = (
    "id",
    "ack",
    "selector",
    "durable",
    "persistent",
    "auto-delete",
    "exclusive",
    "activemq.subscriptionName",
    "durable-subscription-name",
    "transformation",
    "x-queue-name",
    # scheduled delivery: a delay queue per delay bucket (distinct_plans keeps one value a bucket)
    DELAY_HEADER,
    "AMQ_SCHEDULED_PERIOD",
    "AMQ_SCHEDULED_REPEAT",
    "AMQ_SCHEDULED_CRON",
)
_APP: Final = ("host", "login", "client_id")


def read_recording(spark: SparkSession, path: str) -> DataFrame:
    """Every record of the recording in ``path`` (a directory of ``*.jsonl.gz``; the ``.part``
    file being written is skipped, as Spark skips every name starting with a dot)."""
    return spark.read.schema(RECORD_SCHEMA).option("pathGlobFilter", "*.jsonl.gz").json(path)


def _header(name: str, column: str = "headers") -> Column:
    """The first ``name`` header of a frame, or null (STOMP: the first repeated header wins)."""
    from pyspark.sql import functions as F

    return F.expr(f"try_element_at(try_element_at(filter({column}, h -> h[0] = '{name}'), 1), 2)")


def _bucket_width(span: float) -> int:
    for width in _NICE_WIDTHS:
        if span / width <= MAX_BUCKETS:
            return width
    return int(math.ceil(span / MAX_BUCKETS / 86400)) * 86400


def _app_key(row: Any) -> tuple[str, str, str]:
    return (row["host"] or "", row["login"] or "", row["client_id"] or "")


def _app_name(key: tuple[str, str, str]) -> str:
    host, login, client_id = key
    name = f"{login or '(no login)'}@{host or '?'}"
    return f"{name} client-id {client_id}" if client_id else name


def build_report(spark: SparkSession, path: str) -> dict[str, Any]:
    """The report of the recording in ``path``, as the ``report.json`` document.

    The recording is read and decoded once (``decode``, kept in memory or on local disk while
    the totals and the frame groups are computed), then reduced to ``frame_groups``, which every
    aggregation of the report reads."""
    from pyspark.sql import functions as F

    decoded = decode(read_recording(spark, path)).persist()
    try:
        total = decoded.agg(
            F.count(F.lit(1)).alias("records"),
            F.sum(F.when(F.col("kind") == "frame", 1).otherwise(0)).alias("frames"),
            F.countDistinct("conn").alias("connections"),
            F.min("ts").alias("start"),
            F.max("ts").alias("end"),
            F.sum(F.when(F.col("kind") == "dropped", F.col("count")).otherwise(0)).alias("dropped"),
            F.sum(F.when((F.col("kind") == "frame") & F.col("command").isNull(), 1).otherwise(0)).alias(
                "unparsable"
            ),
        ).collect()[0]
        start = float(total["start"] or 0.0)
        end = float(total["end"] or start)
        width = _bucket_width(max(end - start, 1.0))
        # as many partitions as cores: a persisted plan keeps the 200 of the shuffle before it
        # (adaptive execution does not coalesce it), 200 tasks for each aggregation of a few
        # hundred thousand rows
        groups = frame_groups(decoded, start, width).coalesce(spark.sparkContext.defaultParallelism).persist()
        try:
            groups.count()  # materialised while the decoded records are still at hand
            decoded.unpersist()
            return _aggregate(groups, total=total, start=start, end=end, width=width, path=path)
        finally:
            groups.unpersist()
    finally:
        decoded.unpersist()


# what frame_idioms reads of a frame's headers (``idioms.idiom_headers``) in Spark SQL, an
# empty array without headers (frame_idioms reads None and [] alike)
IDIOM_KEY_SQL: Final = (
    "coalesce(transform(filter(headers, h -> size(h) >= 2 AND h[0] IN ({wanted})), "
    "h -> array(h[0], CASE WHEN h[0] IN ({presence}) THEN '' ELSE h[1] END)), array())".format(
        wanted=", ".join(f"'{name}'" for name in IDIOM_HEADERS),
        presence=", ".join(f"'{name}'" for name in IDIOM_PRESENCE_HEADERS),
    )
)


def decode(records: DataFrame) -> DataFrame:
    """Each record of ``records`` reduced to what the report reads of it: its kind, connection,
    time and ``count`` (of a ``dropped`` record) and, for a frame, its client address,
    direction, command, body length, destination, the headers its idioms depend on
    (``idiom_key``, for the client's frames and CONNECTED), the headers a SEND's, SUBSCRIBE's or
    NACK's plan depends on (``plan_headers``), a CONNECT's login, client-id and host, and an
    ERROR's message.  No Python runs per record: everything here is Spark SQL."""
    from pyspark.sql import functions as F

    is_frame = F.col("kind") == "frame"
    is_connect = F.col("command").isin("CONNECT", "STOMP") & (F.col("dir") == "in")
    return records.select(
        "kind",
        "conn",
        "ts",
        F.when(F.col("kind") == "dropped", F.col("count")).alias("count"),
        F.when(is_frame, F.col("client")).alias("client"),
        F.when(is_frame, F.col("dir")).alias("dir"),
        F.when(is_frame, F.col("command")).alias("command"),
        F.when(is_frame, F.col("body_len")).alias("body_len"),
        F.when(is_frame, _header("destination")).alias("destination"),
        F.when(
            is_frame & ((F.col("dir") == "in") | (F.col("command") == "CONNECTED")), F.expr(IDIOM_KEY_SQL)
        ).alias("idiom_key"),
        # the plan headers only: a frame's other headers (message ids, receipts, custom
        # properties) are not needed past this point
        F.when(
            is_frame & (F.col("dir") == "in") & F.col("command").isin("SEND", "SUBSCRIBE", "NACK"),
            F.expr(
                "filter(headers, h -> h[0] IN ({}) OR h[0] LIKE 'x-%')".format(
                    ", ".join(f"'{h}'" for h in _PLAN_HEADERS)
                )
            ),
        ).alias("plan_headers"),
        F.when(is_frame & is_connect, _header("login")).alias("connect_login"),
        F.when(is_frame & is_connect, _header("client-id")).alias("connect_client_id"),
        F.when(is_frame & is_connect, _header("host")).alias("connect_host"),
        F.when(is_frame & (F.col("command") == "ERROR"), _header("message")).alias("error_message"),
    )


def _is_message() -> Column:
    from pyspark.sql import functions as F

    return ((F.col("dir") == "in") & (F.col("command") == "SEND")) | (
        (F.col("dir") == "out") & (F.col("command") == "MESSAGE")
    )


def frame_groups(decoded: DataFrame, start: float = 0.0, width: int = 1) -> DataFrame:
    """The frames of ``decoded`` (``decode``) in groups of frames alike: the same connection,
    direction, command, destination, idiom and plan headers, CONNECT fields, ERROR message and,
    for a message (a client's SEND, a MESSAGE), time bucket (``width`` seconds from ``start``);
    each group with its number of frames, their bytes, largest body, first and last time, and
    its connection's application (host, login, client-id) and vhost and its idioms.

    A connection's frames fall into a few groups (its SENDs to one queue are one group), so
    what the report aggregates is several times smaller than the recording, and
    ``idioms.frame_idioms`` runs (in the Python workers, as an Arrow UDF) once per distinct
    direction, command and ``idiom_key``, not once per frame."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType, StringType

    # (the client address is a key, not a first(): an aggregation whose buffers are all of fixed
    # width runs as a hash aggregation, not a sort; a connection has one client address)
    keys = (
        "conn",
        "client",
        "dir",
        "command",
        "destination",
        "idiom_key",
        "plan_headers",
        "connect_login",
        "connect_client_id",
        "connect_host",
        "error_message",
        "bucket",
    )
    grouped = (
        decoded.filter(F.col("kind") == "frame")
        .withColumn("bucket", F.when(_is_message(), ((F.col("ts") - start) / width).cast("int")))
        .groupBy(*keys)
        .agg(
            F.count(F.lit(1)).alias("frames"),
            F.sum("body_len").alias("bytes"),
            F.max("body_len").alias("max_size"),
            F.min("ts").alias("first"),
            F.max("ts").alias("last"),
        )
    )
    # the application of each connection: its client host and its first CONNECT's login and
    # client-id (docs/recording-format.md)
    connections = grouped.groupBy("conn").agg(
        F.regexp_replace(
            F.regexp_extract(F.first("client", ignorenulls=True), r"^(.*):[0-9]+$", 1), r"[\[\]]", ""
        ).alias("host"),
        F.min_by("connect_login", F.when(F.col("connect_login").isNotNull(), F.col("first"))).alias("login"),
        F.min_by(
            "connect_client_id",
            F.when(
                F.col("connect_login").isNotNull() | F.col("connect_client_id").isNotNull(), F.col("first")
            ),
        ).alias("client_id"),
        F.min_by("connect_host", F.when(F.col("connect_host").isNotNull(), F.col("first"))).alias("vhost"),
    )
    idioms_udf = F.udf(frame_idioms, ArrayType(StringType()), useArrow=True)
    idioms = (
        grouped.filter(F.col("idiom_key").isNotNull())
        .select("dir", "command", "idiom_key")
        .distinct()
        .withColumn("idioms", idioms_udf("dir", "command", "idiom_key"))
    )
    return (
        grouped.join(connections, "conn", "left")
        .join(F.broadcast(idioms), ["dir", "command", "idiom_key"], "left")
        .drop("client", "connect_login", "connect_client_id", "connect_host", "idiom_key")
    )


def distinct_plans(groups: DataFrame) -> DataFrame:
    """What the topology and the refusals are planned from (``groups``: ``frame_groups``): the
    distinct client SENDs, SUBSCRIBEs and NACKs by application, destination, the headers
    their plan depends on and their idioms.

    A scheduled SEND's delay is not part of that key as it is: its ``delay_plan`` is (the delay
    bucket, in the Python workers), and each group keeps one recorded value of it, which
    plans the same delay queue.  So the rows that reach the driver are bounded by the delay
    queues the profile can create (adapter/mapping/scheduled.py: at most ``MAX_BUCKETS``, 760,
    per plan of a SEND), not by the distinct delays clients sent."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType

    delay_udf = F.udf(delay_plan, StringType(), useArrow=True)
    return (
        groups.filter((F.col("dir") == "in") & F.col("command").isin("SEND", "SUBSCRIBE", "NACK"))
        .select(
            *_APP,
            "command",
            "destination",
            F.expr(f"filter(plan_headers, h -> h[0] != '{DELAY_HEADER}')").alias("plan_headers"),
            _header(DELAY_HEADER, "plan_headers").alias("delay"),
            "idioms",
        )
        .distinct()  # the UDF runs once per distinct plan and delay, not once per frame
        .withColumn("delay_plan", delay_udf("delay"))
        .groupBy(*_APP, "command", "destination", "plan_headers", "idioms", "delay_plan")
        .agg(F.min("delay").alias("delay"))
    )


def _aggregate(
    groups: DataFrame, *, total: Any, start: float, end: float, width: int, path: str
) -> dict[str, Any]:
    """The report's aggregates, each a small ``collect`` over ``groups`` (``frame_groups``): a
    group's ``frames`` is summed where the report counts frames or messages."""
    from pyspark.sql import functions as F

    buckets = int((end - start) // width) + 1
    messages = groups.filter(_is_message()).select(
        *_APP,
        "bucket",
        "frames",
        "bytes",
        "max_size",
        F.when(F.col("command") == "SEND", "sent").otherwise("delivered").alias("flow"),
        # a composite SEND publishes to each of its destinations
        F.explode(
            F.when(F.col("command") == "SEND", F.split(F.col("destination"), ",")).otherwise(
                F.array(F.col("destination"))
            )
        ).alias("destination"),
    )

    # -- idioms per application and idiom, and per idiom and command; per idiom is their sum
    #    (a connection is of one application)
    used = groups.select(*_APP, "conn", "command", "frames", F.explode("idioms").alias("idiom"))
    per_app_idiom = (
        used.groupBy(*_APP, "idiom")
        .agg(F.countDistinct("conn").alias("connections"), F.sum("frames").alias("frames"))
        .collect()
    )
    per_idiom_command = used.groupBy("idiom", "command").agg(F.sum("frames").alias("count")).collect()

    # -- applications
    per_app = (
        groups.groupBy(*_APP)
        .agg(
            F.countDistinct("conn").alias("connections"),
            F.sum("frames").alias("frames"),
            F.min("first").alias("first"),
            F.max("last").alias("last"),
            F.collect_set("vhost").alias("vhosts"),
        )
        .collect()
    )
    errors = (
        groups.filter(F.col("error_message").isNotNull())
        .groupBy(*_APP, "error_message")
        .agg(F.sum("frames").alias("count"))
        .collect()
    )
    app_destinations = (
        messages.groupBy(*_APP, "destination", "flow")
        .agg(
            F.sum("frames").alias("messages"),
            F.sum("bytes").alias("bytes"),
            F.max("max_size").alias("max_size"),
        )
        .collect()
    )
    subscriptions = (
        groups.filter((F.col("dir") == "in") & (F.col("command") == "SUBSCRIBE"))
        .groupBy(*_APP, "destination")
        .agg(F.sum("frames").alias("count"))
        .collect()
    )
    app_rates = messages.groupBy(*_APP, "flow", "bucket").agg(F.sum("frames").alias("count")).collect()

    # -- destinations: totals (from the applications' rows), then the rates of the busiest
    destinations = _destination_totals(app_destinations)
    volume: dict[str, int] = defaultdict(int)
    for row in destinations:
        volume[row["destination"]] += row["messages"]
    # a frame may name no destination (None): ranked after the named ones of its volume
    top = sorted(volume, key=lambda d: (-volume[d], d is None, d or ""))[:TOP_DESTINATIONS]
    rates = (
        messages.filter(F.col("destination").isin(top))
        .groupBy("destination", "flow", "bucket")
        .agg(F.sum("frames").alias("count"))
        .collect()
        if top
        else []
    )

    # -- what the topology and the refusals are planned from: the distinct SENDs and SUBSCRIBEs
    #    (destination and the headers their plan depends on), one per delay bucket
    plans = distinct_plans(groups).collect()

    return _assemble(
        path=path,
        total=total,
        start=start,
        end=end,
        width=width,
        buckets=buckets,
        per_idiom=_idiom_totals(per_app_idiom),
        per_idiom_command=per_idiom_command,
        per_app_idiom=per_app_idiom,
        per_app=per_app,
        errors=errors,
        app_destinations=app_destinations,
        subscriptions=subscriptions,
        app_rates=app_rates,
        destinations=destinations,
        top=top,
        rates=rates,
        plans=plans,
    )


def _idiom_totals(per_app_idiom: Iterable[Any]) -> list[dict[str, Any]]:
    """Per idiom, its connections and frames: the sums over the applications (each connection
    is of exactly one application, so its connections are counted once)."""
    totals: dict[str, dict[str, Any]] = {}
    for row in per_app_idiom:
        entry = totals.setdefault(row["idiom"], {"idiom": row["idiom"], "connections": 0, "frames": 0})
        entry["connections"] += row["connections"]
        entry["frames"] += row["frames"]
    return list(totals.values())


def _destination_totals(app_destinations: Iterable[Any]) -> list[dict[str, Any]]:
    """Per destination and flow, the messages, bytes, largest body and applications: from the
    rows per application, destination and flow (one row per application)."""
    totals: dict[tuple[str, str], dict[str, Any]] = {}
    for row in app_destinations:
        entry = totals.setdefault(
            (row["destination"], row["flow"]),
            {
                "destination": row["destination"],
                "flow": row["flow"],
                "messages": 0,
                "bytes": None,
                "max_size": None,
                "applications": 0,
            },
        )
        entry["messages"] += row["messages"]
        if row["bytes"] is not None:
            entry["bytes"] = (entry["bytes"] or 0) + row["bytes"]
        if row["max_size"] is not None:
            entry["max_size"] = (
                row["max_size"] if entry["max_size"] is None else max(entry["max_size"], row["max_size"])
            )
        entry["applications"] += 1
    return list(totals.values())


def _series(rows: Iterable[Any], buckets: int) -> list[int]:
    counts = [0] * buckets
    for row in rows:
        if 0 <= row["bucket"] < buckets:
            counts[row["bucket"]] += row["count"]
    return counts


def _assemble(**parts: Any) -> dict[str, Any]:
    """The report.json document from the collected aggregates (all small)."""
    buckets: int = parts["buckets"]
    width: int = parts["width"]
    catalogue = {idiom.name: idiom for idiom in IDIOMS}
    order = {name: n for n, name in enumerate(IDIOM_NAMES)}

    commands: dict[str, dict[str, int]] = defaultdict(dict)
    for row in parts["per_idiom_command"]:
        commands[row["idiom"]][row["command"]] = row["count"]
    apps_of_idiom: dict[str, int] = defaultdict(int)
    for row in parts["per_app_idiom"]:
        apps_of_idiom[row["idiom"]] += 1
    idioms = [
        {
            "name": row["idiom"],
            "title": catalogue[row["idiom"]].title,
            "connections": row["connections"],
            "frames": row["frames"],
            "applications": apps_of_idiom[row["idiom"]],
            "commands": dict(sorted(commands[row["idiom"]].items())),
            "support": catalogue[row["idiom"]].support,
            "note": catalogue[row["idiom"]].note,
        }
        for row in sorted(parts["per_idiom"], key=lambda r: order.get(r["idiom"], 99))
        if row["idiom"] in catalogue
    ]

    # destinations
    by_destination: dict[str, dict[str, Any]] = {}
    for row in parts["destinations"]:
        name = row["destination"]
        entry = by_destination.setdefault(
            name,
            {
                "destination": name,
                "kind": destination_kind(name),
                "sent": 0,
                "delivered": 0,
                "bytes_sent": 0,
                "bytes_delivered": 0,
                "max_size": 0,
                "applications": 0,
            },
        )
        entry[row["flow"]] = row["messages"]
        entry[f"bytes_{row['flow']}"] = row["bytes"] or 0
        entry["max_size"] = max(entry["max_size"], row["max_size"] or 0)
        entry["applications"] = max(entry["applications"], row["applications"])
    rate_rows: dict[tuple[str, str], list[Any]] = defaultdict(list)
    for row in parts["rates"]:
        rate_rows[(row["destination"], row["flow"])].append(row)
    for name in parts["top"]:
        by_destination[name]["rate"] = {
            flow: _series(rate_rows[(name, flow)], buckets) for flow in ("sent", "delivered")
        }
    destinations = sorted(
        by_destination.values(),
        key=lambda d: (-(d["sent"] + d["delivered"]), d["destination"] is None, d["destination"] or ""),
    )
    for entry in destinations:
        sent = entry["sent"]
        entry["avg_size"] = round(entry["bytes_sent"] / sent) if sent else 0

    # applications
    apps: dict[tuple[str, str, str], dict[str, Any]] = {}
    for row in parts["per_app"]:
        key = _app_key(row)
        apps[key] = {
            "name": _app_name(key),
            "host": key[0],
            "login": row["login"],
            "client_id": row["client_id"],
            "connections": row["connections"],
            "frames": row["frames"],
            "first": row["first"],
            "last": row["last"],
            "vhosts": sorted(v for v in row["vhosts"] if v is not None),
            "stomp_versions": [],
            "idioms": [],
            "destinations": {},
            "errors": {},
            "rate": {"sent": [0] * buckets, "delivered": [0] * buckets},
        }
    for row in sorted(parts["per_app_idiom"], key=lambda r: order.get(r["idiom"], 99)):
        app = apps[_app_key(row)]
        name = row["idiom"]
        if name.startswith("stomp-"):
            app["stomp_versions"].append(name.removeprefix("stomp-"))
        app["idioms"].append(
            {
                "name": name,
                "connections": row["connections"],
                "frames": row["frames"],
                "support": catalogue[name].support,
                "note": catalogue[name].note,
            }
        )
    for row in parts["errors"]:
        apps[_app_key(row)]["errors"][row["error_message"]] = row["count"]
    app_dest: dict[tuple[tuple[str, str, str], str], dict[str, Any]] = {}
    for row in parts["app_destinations"]:
        where = (_app_key(row), row["destination"])
        entry = app_dest.setdefault(
            where,
            {
                "destination": row["destination"],
                "sent": 0,
                "delivered": 0,
                "bytes": 0,
                "max_size": 0,
                "subscriptions": 0,
            },
        )
        entry[row["flow"]] = row["messages"]
        entry["bytes"] += row["bytes"] or 0
        entry["max_size"] = max(entry["max_size"], row["max_size"] or 0)
    for row in parts["subscriptions"]:
        if row["destination"] is None:
            continue
        where = (_app_key(row), row["destination"])
        entry = app_dest.setdefault(
            where,
            {
                "destination": row["destination"],
                "sent": 0,
                "delivered": 0,
                "bytes": 0,
                "max_size": 0,
                "subscriptions": 0,
            },
        )
        entry["subscriptions"] = row["count"]
    for (key, name), entry in sorted(app_dest.items(), key=lambda item: (item[0][0], item[0][1])):
        apps[key]["destinations"].setdefault(destination_kind(name), []).append(entry)
    for row in parts["app_rates"]:
        rate = apps[_app_key(row)]["rate"][row["flow"]]
        if 0 <= row["bucket"] < buckets:
            rate[row["bucket"]] += row["count"]

    topology, refused = plan_topology(
        [
            {
                "application": _app_name(_app_key(row)),
                "client_id": row["client_id"],
                "command": row["command"],
                "destination": row["destination"],
                "headers": [tuple(pair) for pair in row["plan_headers"] or () if len(pair) >= 2]
                + ([(DELAY_HEADER, row["delay"])] if row["delay"] is not None else []),
                "idioms": list(row["idioms"] or ()),
            }
            for row in parts["plans"]
        ]
    )

    total = parts["total"]
    applications = sorted(apps.values(), key=lambda a: (-a["frames"], a["name"]))
    return {
        "version": FORMAT_VERSION,
        "recording": parts["path"],
        "totals": {
            "records": total["records"],
            "frames": total["frames"] or 0,
            "connections": total["connections"],
            "applications": len(applications),
            "messages_sent": sum(d["sent"] for d in destinations),
            "messages_delivered": sum(d["delivered"] for d in destinations),
            "bytes_sent": sum(d["bytes_sent"] for d in destinations),
            "start": parts["start"],
            "end": parts["end"],
            "bucket_seconds": width,
            "buckets": buckets,
            "dropped_records": total["dropped"] or 0,
            "unparsable_frames": total["unparsable"] or 0,
        },
        "idioms": idioms,
        "destinations": destinations,
        "applications": applications,
        "topology": topology,
        "refused": refused,
    }
