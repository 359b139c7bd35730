"""The pure parts of ``python -m bench.scale``: no sockets, no processes, no clock.

Owns how a run is planned (the list of N, how N clients are spread over client processes, TCP
and WebSocket, and source addresses; the adapter's ini file from ``--adapter-setting`` lines),
the line protocol between the bench and its client processes (``bench/scale_fleet.py``: one JSON
object a line, each way), and how measurements become figures (percentiles, memory per client,
the table).  tests/unit/test_bench_scale.py pins all of it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# ------------------------------------------------------------------------------ arguments


def client_counts(text: str) -> list[int]:
    """``--clients 1000,5000,10000``: positive integers, in the order given, no repeats."""
    counts: list[int] = []
    for part in text.split(","):
        part = part.strip().replace("_", "")
        if not part:
            continue
        if part.lower().endswith("k") and part[:-1].isdigit():
            value = int(part[:-1]) * 1000
        elif part.isdigit():
            value = int(part)
        else:
            raise ValueError(f"not a number of clients: {part!r}")
        if value < 1:
            raise ValueError("a number of clients must be at least 1")
        if value not in counts:
            counts.append(value)
    if not counts:
        raise ValueError("no number of clients given")
    return counts


def adapter_setting(text: str) -> tuple[str, str]:
    """``--adapter-setting key=value``: an ini line of the adapter (adapter/config/ checks the
    key and the value when the adapter starts; the bench only passes them on)."""
    key, sep, value = text.partition("=")
    key, value = key.strip(), value.strip()
    if not sep or not key or any(c.isspace() for c in key):
        raise ValueError(f"expected key=value, got {text!r}")
    if "\n" in value:
        raise ValueError("a value cannot span lines")
    return key, value


def ini_text(base: Mapping[str, str], settings: Iterable[tuple[str, str]]) -> str:
    """The adapter's ini file: the bench's own keys (``base``: listeners, broker, workers), then
    ``--adapter-setting`` lines, a later value of a key replacing an earlier one."""
    merged = dict(base)
    for key, value in settings:
        merged[key] = value
    return "".join(f"{key} = {value}\n" for key, value in merged.items())


@dataclass(frozen=True, slots=True)
class Share:
    """What one client process opens: ``tcp`` + ``ws`` clients from source address ``source``."""

    tcp: int
    ws: int
    source: str

    @property
    def total(self) -> int:
        return self.tcp + self.ws


def source_addresses(count: int) -> list[str]:
    """127.0.0.2, 127.0.0.3, ...: loopback addresses to connect from, so that the ~28,000
    ephemeral ports of one (source, destination) pair are not the wall.  Linux routes all of
    127/8 to lo; 127.0.0.1 is left to the servers' own connections (adapter -> broker)."""
    if not 1 <= count <= 250:
        raise ValueError("source addresses: from 1 to 250")
    return [f"127.0.0.{2 + i}" for i in range(count)]


def plan_clients(total: int, ws_share: float, processes: int, sources: Sequence[str]) -> list[Share]:
    """Spread ``total`` clients over ``processes`` processes as evenly as possible, round(total *
    ws_share) of them over WebSocket (also spread evenly), process i connecting from
    ``sources[i % len(sources)]``.  Processes left with nothing are dropped."""
    if not 0.0 <= ws_share <= 1.0:
        raise ValueError("the WebSocket share is from 0 to 1")
    if processes < 1 or not sources:
        raise ValueError("at least one process and one source address")
    ws_total = round(total * ws_share)
    shares = []
    for i in range(processes):
        clients = _part(total, processes, i)
        ws = _part(ws_total, processes, i)
        shares.append(Share(clients - ws, ws, sources[i % len(sources)]))
    return [share for share in shares if share.total]


def _part(total: int, parts: int, index: int) -> int:
    return total // parts + (1 if index < total % parts else 0)


def processes_for(total: int, wanted: int, per_process: int) -> int:
    """Client processes for ``total`` clients: ``wanted``, or more if one would hold more than
    ``per_process`` sockets (the file limit of a process)."""
    return max(wanted, math.ceil(total / per_process))


# ------------------------------------------------------------------------- the line protocol
# bench -> client process:  {"cmd": "open", ...} | {"cmd": "collect", "round": R, "timeout": S}
#                           | {"cmd": "close"}
# client process -> bench:  {"event": "opened", ...} | {"event": "round", ...} | {"event": "closed"}
#                           | {"event": "failed", "error": "..."}  (the process cannot go on)


def command(cmd: str, **fields: Any) -> bytes:
    return (json.dumps({"cmd": cmd, **fields}, separators=(",", ":")) + "\n").encode()


def event(name: str, **fields: Any) -> bytes:
    return (json.dumps({"event": name, **fields}, separators=(",", ":")) + "\n").encode()


class ProtocolError(Exception):
    """A line from a client process that is not what the protocol says."""


@dataclass(frozen=True, slots=True)
class Opened:
    """A client process has tried all its clients: ``subscribed`` got the RECEIPT of their
    SUBSCRIBE, ``failed`` did not (``errors``: the first few reasons)."""

    subscribed: int
    failed: int
    seconds: float
    errors: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Round:
    """Arrivals of round ``round`` in one client process: a latency per subscribed client that
    got the message (microseconds from the sender's stamp), ``missing`` that did not within the
    timeout, ``lost`` connections lost since the open."""

    round: int
    latencies_us: tuple[int, ...]
    missing: int
    lost: int


@dataclass(frozen=True, slots=True)
class Closed:
    pass


@dataclass(frozen=True, slots=True)
class Failed:
    error: str


Event = Opened | Round | Closed | Failed


def parse_event(line: bytes | str) -> Event:
    try:
        data = json.loads(line)
    except ValueError as error:
        raise ProtocolError(f"not JSON: {line[:200]!r}") from error
    if not isinstance(data, dict):
        raise ProtocolError(f"not an object: {line[:200]!r}")
    try:
        name = data["event"]
        if name == "opened":
            return Opened(
                _count(data["subscribed"]),
                _count(data["failed"]),
                float(data["seconds"]),
                tuple(str(e) for e in data.get("errors", ())),
            )
        if name == "round":
            latencies = data["latencies_us"]
            if not isinstance(latencies, list):
                raise ProtocolError("latencies_us is not a list")
            return Round(
                _count(data["round"]),
                tuple(int(v) for v in latencies),
                _count(data["missing"]),
                _count(data["lost"]),
            )
        if name == "closed":
            return Closed()
        if name == "failed":
            return Failed(str(data["error"]))
    except (KeyError, TypeError, ValueError) as error:
        raise ProtocolError(f"bad {data.get('event')!r} event: {error!r}: {line[:200]!r}") from error
    raise ProtocolError(f"unknown event {data.get('event')!r}")


def _count(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"not a count: {value!r}")
    return value


def parse_stamp(body: bytes) -> tuple[int, int]:
    """The body the sender writes: ``<round> <monotonic ns>`` (ASCII)."""
    round_text, _, stamp = body.partition(b" ")
    return int(round_text), int(stamp)


def stamp_body(round_no: int, monotonic_ns: int) -> bytes:
    return b"%d %d" % (round_no, monotonic_ns)


# ------------------------------------------------------------------------------- the figures


def percentile(ordered: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` from 0 to 100) of ascending ``ordered`` values: the
    smallest value with at least q% of the values at or below it."""
    if not ordered:
        raise ValueError("no values")
    if not 0 <= q <= 100:
        raise ValueError("q is from 0 to 100")
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


@dataclass(frozen=True, slots=True)
class Fanout:
    """Latencies of all deliveries of all rounds, in milliseconds."""

    deliveries: int
    missing: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    # the last arrival of each round (its max), so a single slow round shows
    round_max_ms: tuple[float, ...] = ()

    @staticmethod
    def of(rounds: Sequence[Sequence[Round]]) -> Fanout:
        """``rounds``: for each round, what every client process reported."""
        everything: list[int] = []
        missing = 0
        round_max = []
        for reports in rounds:
            this_round = [v for report in reports for v in report.latencies_us]
            missing += sum(report.missing for report in reports)
            everything += this_round
            if this_round:
                round_max.append(round(max(this_round) / 1000, 1))
        if not everything:
            return Fanout(0, missing, math.nan, math.nan, math.nan, tuple(round_max))
        everything.sort()
        return Fanout(
            len(everything),
            missing,
            round(percentile(everything, 50) / 1000, 2),
            round(percentile(everything, 99) / 1000, 2),
            round(everything[-1] / 1000, 2),
            tuple(round_max),
        )


def per_client_kb(before_kb: int | None, after_kb: int | None, clients: int) -> float | None:
    """(after - before) / clients, in KB; None when a reading is missing or nobody connected."""
    if before_kb is None or after_kb is None or clients <= 0:
        return None
    return round((after_kb - before_kb) / clients, 1)


# memory_breakdown categories that are not data of the node: what the allocators hold beyond it
# (they depend on vm_memory_calculation_strategy) and what the OS has reserved but not given
NOT_DATA = frozenset({"reserved_unallocated", "allocated_unused"})


def erlang_total_kb(output: str) -> int | None:
    """``rabbitmqctl eval 'erlang:memory(total).'`` prints the bytes the VM has allocated for
    its data; in KB, None if the output is not a number.  (It can be far above the RSS: the
    binaries a connection has allocated count whole, resident or not; docs/performance.md,
    "Scale".)"""
    text = output.strip().splitlines()[-1].strip() if output.strip() else ""
    return int(text) // 1024 if text.isdigit() else None


def breakdown_per_client(
    before: Mapping[str, int], after: Mapping[str, int], clients: int
) -> dict[str, float]:
    """Growth of each memory_breakdown category per client, in KB, largest first, those that
    grew by at least 0.1 KB per client."""
    if not before or not after or clients <= 0:
        return {}
    growth = {
        name: round((after[name] - before.get(name, 0)) / 1024 / clients, 1)
        for name in after
        if name not in NOT_DATA
    }
    return dict(sorted(((k, v) for k, v in growth.items() if abs(v) >= 0.1), key=lambda kv: -kv[1]))


@dataclass
class Measurement:
    """One side at one N: what the table and ``--json`` show."""

    side: str  # "adapter" or "plugin"
    clients: int  # asked for
    tcp: int
    ws: int
    subscribed: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)
    open_seconds: float | None = None
    # RSS in KB (OS, /proc/<pid>/status VmRSS): before the clients open and once all are in
    adapter_rss_kb: tuple[int | None, int | None] = (None, None)
    broker_rss_kb: tuple[int | None, int | None] = (None, None)
    # erlang:memory(total) of the node in KB (rabbitmqctl eval)
    broker_erlang_kb: tuple[int | None, int | None] = (None, None)
    broker_breakdown_per_client: dict[str, float] = field(default_factory=dict)
    fanout: Fanout | None = None
    lost: int = 0
    cpu_seconds: dict[str, float | None] = field(default_factory=dict)
    settings: dict[str, str] = field(default_factory=dict)

    @property
    def open_rate(self) -> float | None:
        if not self.open_seconds or not self.subscribed:
            return None
        return round(self.subscribed / self.open_seconds, 1)

    @property
    def adapter_kb(self) -> float | None:
        return per_client_kb(*self.adapter_rss_kb, self.subscribed)

    @property
    def broker_kb(self) -> float | None:
        return per_client_kb(*self.broker_rss_kb, self.subscribed)

    @property
    def broker_erlang_per_client_kb(self) -> float | None:
        return per_client_kb(*self.broker_erlang_kb, self.subscribed)

    @property
    def total_kb(self) -> float | None:
        """Adapter + broker per client (the plugin side: the broker alone)."""
        broker = self.broker_kb
        if self.side != "adapter":
            return broker
        adapter = self.adapter_kb
        return None if broker is None or adapter is None else round(broker + adapter, 1)

    def to_json(self) -> dict[str, Any]:
        return {
            "side": self.side,
            "clients": self.clients,
            "tcp": self.tcp,
            "ws": self.ws,
            "subscribed": self.subscribed,
            "failed": self.failed,
            "errors": self.errors,
            "open_seconds": self.open_seconds,
            "open_rate_per_s": self.open_rate,
            "adapter_rss_kb": list(self.adapter_rss_kb),
            "broker_rss_kb": list(self.broker_rss_kb),
            "broker_erlang_kb": list(self.broker_erlang_kb),
            "kb_per_client": {
                "adapter_plus_broker": self.total_kb,
                "broker": self.broker_kb,
                "adapter": self.adapter_kb if self.side == "adapter" else None,
                "broker_erlang": self.broker_erlang_per_client_kb,
                "broker_breakdown": self.broker_breakdown_per_client,
            },
            "fanout": None
            if self.fanout is None
            else {
                "deliveries": self.fanout.deliveries,
                "missing": self.fanout.missing,
                "p50_ms": _finite(self.fanout.p50_ms),
                "p99_ms": _finite(self.fanout.p99_ms),
                "max_ms": _finite(self.fanout.max_ms),
                "round_max_ms": list(self.fanout.round_max_ms),
            },
            "lost": self.lost,
            "cpu_seconds": self.cpu_seconds,
            "settings": self.settings,
        }


def _finite(value: float) -> float | None:
    return None if math.isnan(value) else value


COLUMNS = (
    ("N", 7),
    ("side", 8),
    ("subscribed", 10),
    ("open/s", 7),
    ("A+B KB/cl", 9),
    ("broker KB", 9),
    ("erl KB", 7),
    ("adapter KB", 10),
    ("p50 ms", 8),
    ("p99 ms", 8),
    ("max ms", 8),
    ("missing", 7),
)


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        return f"{value:,.1f}" if abs(value) < 100 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def table(measurements: Iterable[Measurement]) -> str:
    """The summary: one row per (N, side).  KB/cl columns are memory per subscribed client:
    adapter + broker (the plugin side: the broker alone), the broker alone (OS RSS of beam.smp),
    the broker's erlang:memory(total), the adapter alone (RSS of its processes)."""
    header = "  ".join(name.rjust(width) for name, width in COLUMNS)
    lines = [header, "-" * len(header)]
    for m in measurements:
        fan = m.fanout
        row = (
            m.clients,
            m.side,
            f"{m.subscribed:,}" + (f" ({m.failed:,} failed)" if m.failed else ""),
            m.open_rate,
            m.total_kb,
            m.broker_kb,
            m.broker_erlang_per_client_kb,
            m.adapter_kb if m.side == "adapter" else None,
            fan.p50_ms if fan else None,
            fan.p99_ms if fan else None,
            fan.max_ms if fan else None,
            fan.missing if fan else None,
        )
        lines.append("  ".join(_cell(v).rjust(width) for v, (_, width) in zip(row, COLUMNS, strict=True)))
    return "\n".join(lines)
