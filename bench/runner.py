"""``python -m bench``: run the scenarios against the adapter and RabbitMQ's STOMP plugin, A B A B.

Each round runs every selected scenario against the adapter, then against the plugin, so slow drift
of the machine (page cache, broker state, thermal) hits both sides alike.  The summary reports the
median of the rounds, the spread (min-max), the ratio adapter/plugin and the target from the
Performance issue; a second table gives the CPU seconds used during the measurements by the adapter
process, the broker (beam.smp) and the bench itself.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import math
import os
import secrets
import ssl
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from . import procstat
from .scenarios import LARGE_SIZES, SCENARIOS, BenchFailure, Config, Run, Side
from .services import RESULTS, AdapterProcess, QueueCleaner, environment, port_answers, raise_own_nofile
from .stomp import StompError, connect, header


@dataclass(frozen=True)
class Metric:
    key: str
    scenario: str
    label: str
    unit: str
    higher_is_better: bool
    target: str = ""  # "ratio>=0.8", "ratio<=1.5", "abs<=50" or "" (information only)


def metric_list(cfg: Config) -> list[Metric]:
    metrics = [
        Metric(
            "queue",
            "queue",
            f"queue: {cfg.producers} producers -> 1 consumer, auto ack",
            "msg/s",
            True,
            "ratio>=0.8",
        ),
        Metric(
            "persistent",
            "persistent",
            "persistent: SEND + receipt, 100 outstanding",
            "msg/s",
            True,
            "ratio>=0.8",
        ),
        Metric(
            "client-individual",
            "client-individual",
            "client-individual ACK, prefetch 100",
            "msg/s",
            True,
            "ratio>=0.8",
        ),
        Metric("topic", "topic", "topic: 1 producer -> 4 subscribers", "deliveries/s", True, "ratio>=0.8"),
        Metric("topic-published", "topic", "topic: messages published/s", "msg/s", True),
        Metric(
            "topic-selector",
            "topic-selector",
            "topic, 4 selectors matching half each (activemq)",
            "deliveries/s",
            True,
        ),
        Metric(
            "queue-2consumers",
            "queue-2consumers",
            "queue: producers -> 2 consumers, no selectors",
            "msg/s",
            True,
        ),
        Metric(
            "queue-selector",
            "queue-selector",
            "queue: producers -> 2 consumers, selectors matching half each (activemq)",
            "msg/s",
            True,
        ),
        Metric(
            "topic-selector-published",
            "topic-selector",
            "topic with selectors: messages published/s",
            "msg/s",
            True,
        ),
    ]
    for rate in cfg.rates:
        metrics.append(Metric(f"rr{rate}-p50", "reqrep", f"request/reply at {rate}/s, p50", "ms", False))
        metrics.append(
            Metric(f"rr{rate}-p99", "reqrep", f"request/reply at {rate}/s, p99", "ms", False, "ratio<=1.5")
        )
    for label, size in LARGE_SIZES.items():
        metrics += [
            Metric(
                f"queue-{label}",
                f"queue-{label}",
                f"queue, {size // 1024} KiB bodies: {cfg.producers} producers -> 1 consumer",
                "msg/s",
                True,
                "ratio>=0.8",
            ),
            Metric(
                f"queue-{label}-p50",
                f"queue-{label}",
                f"queue, {size // 1024} KiB bodies: send to MESSAGE, p50",
                "ms",
                False,
            ),
            Metric(
                f"queue-{label}-p99",
                f"queue-{label}",
                f"queue, {size // 1024} KiB bodies: send to MESSAGE, p99",
                "ms",
                False,
            ),
            Metric(
                f"persistent-{label}",
                f"persistent-{label}",
                f"persistent + receipt, {size // 1024} KiB bodies",
                "msg/s",
                True,
                "ratio>=0.8",
            ),
        ]
    metrics += [
        Metric("rrsat-p50", "reqrep", "request/reply, 1 outstanding, p50", "ms", False),
        Metric("rrsat-p99", "reqrep", "request/reply, 1 outstanding, p99", "ms", False, "ratio<=1.5"),
        Metric("rrsat-rate", "reqrep", "request/reply, 1 outstanding, rate", "req/s", True),
        Metric("connect", "connect", f"CONNECT+DISCONNECT, {cfg.connect_workers} workers", "cycles/s", True),
        Metric("connect-p50", "connect", "CONNECT+DISCONNECT cycle, p50", "ms", False),
        Metric("connect-p99", "connect", "CONNECT+DISCONNECT cycle, p99", "ms", False),
        Metric(
            "idle",
            "idle",
            f"idle connection, adapter RSS growth ({cfg.idle_connections} conns)",
            "KB/conn",
            False,
            "abs<=50",
        ),
        Metric(
            "idle-broker",
            "idle",
            "idle connection, broker RSS growth (adapter's AMQP links)",
            "KB/conn",
            False,
        ),
        Metric(
            "idle-open",
            "idle",
            f"opening {cfg.idle_connections} connections, {cfg.idle_concurrency} at a time",
            "conn/s",
            True,
        ),
    ]
    return metrics


# what a scenario's CPU is divided by, for "CPU per item"
ITEMS = {
    "queue": "delivered",
    "persistent": "receipted",
    **{f"queue-{label}": "delivered" for label in LARGE_SIZES},
    **{f"persistent-{label}": "receipted" for label in LARGE_SIZES},
    "client-individual": "acked",
    "topic": "delivered",
    "topic-selector": "delivered",
    "queue-2consumers": "delivered",
    "queue-selector": "delivered",
    "reqrep": "replies",
    "connect": "cycles",
    "idle": "connections",
}


# scenarios only run when named: the selector ones need the activemq profile (bench/activemq.py),
# queue-2consumers is their baseline
OPT_IN = ("topic-selector", "queue-2consumers", "queue-selector")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Benchmark the STOMP adapter against RabbitMQ's STOMP plugin (alternating A B A B).",
    )
    parser.add_argument(
        "--scenarios",
        default=",".join(name for name in SCENARIOS if name not in OPT_IN),
        help=f"comma-separated list (default: all but {', '.join(OPT_IN)}): {', '.join(SCENARIOS)}",
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds of A B measurements (default 3)")
    parser.add_argument(
        "--duration", type=float, default=5.0, help="seconds of load per measurement (default 5)"
    )
    parser.add_argument(
        "--messages",
        type=int,
        default=None,
        help="stop a measurement after this many messages/requests/cycles if --duration has not passed yet",
    )
    parser.add_argument("--size", type=int, default=1024, help="message body size in bytes (default 1024)")
    parser.add_argument(
        "--producers",
        type=int,
        default=2,
        help="producers in the queue and client-individual scenarios (default 2)",
    )
    parser.add_argument(
        "--window",
        type=int,
        default=2000,
        help="max messages in flight in throughput scenarios (default 2000)",
    )
    parser.add_argument(
        "--drain-timeout",
        type=float,
        default=15.0,
        help="max seconds to wait for in-flight messages after the load stops (default 15)",
    )
    parser.add_argument(
        "--rates", default="100,1000", help="request/reply fixed rates per second (default 100,1000)"
    )
    parser.add_argument(
        "--idle-connections", type=int, default=500, help="connections in the idle scenario (default 500)"
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="host of the adapter and the plugin (default 127.0.0.1)"
    )
    parser.add_argument(
        "--adapter-port",
        type=int,
        default=None,
        help="use the adapter already listening on this port "
        "(default: start one on a free port and stop it at the end)",
    )
    parser.add_argument(
        "--plugin-port",
        type=int,
        default=61613,
        help="RabbitMQ STOMP plugin port (default 61613; 0 = adapter only)",
    )
    parser.add_argument(
        "--amqp-port",
        type=int,
        default=5672,
        help="broker AMQP port, to find the broker process (default 5672)",
    )
    parser.add_argument(
        "--management-url",
        default="http://127.0.0.1:15672",
        help="management API, to delete the bench's queues",
    )
    parser.add_argument(
        "--json",
        metavar="FILE",
        help="write every measurement and the summary to FILE (default bench/results/run-<date>-<time>.json)",
    )
    parser.add_argument(
        "--websocket",
        choices=("both", "adapter"),
        help="speak STOMP over WebSocket (path --ws-path) to both sides, or to the --adapter-port side "
        "only (bench/web.py)",
    )
    parser.add_argument("--ws-path", default="/ws", help="the WebSocket path (default /ws)")
    parser.add_argument(
        "--ws-compress",
        action="store_true",
        help="over WebSocket, offer permessage-deflate as browsers do (both servers accept it by default)",
    )
    parser.add_argument("--no-uvloop", action="store_true", help="run the bench on asyncio's default loop")
    parser.add_argument(
        "--adapter-tls-ca",
        metavar="FILE",
        help="the --adapter-port side is a TLS listener whose certificate this CA signed (bench/tls.py)",
    )
    parser.add_argument(
        "--plugin-tls-ca",
        metavar="FILE",
        help="the --plugin-port side is a TLS listener whose certificate this CA signed, e.g. the "
        "plugin's stomp.listeners.ssl (docs/performance.md, 'TLS')",
    )
    args = parser.parse_args(argv)
    names = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown or not names:
        parser.error(f"unknown scenario(s) {unknown}; choose from {', '.join(SCENARIOS)}")
    args.scenario_names = names
    try:
        args.rate_list = tuple(int(r) for r in args.rates.split(",") if r.strip())
    except ValueError:
        parser.error("--rates must be a comma-separated list of integers")
    if args.rounds < 1 or args.duration <= 0 or args.size < 1:
        parser.error("--rounds, --duration and --size must be positive")
    return args


# ---------------------------------------------------------------------------------------- running
@dataclass
class Record:
    round: int
    scenario: str
    side: str
    metrics: dict[str, float]
    counts: dict[str, Any]
    cpu: dict[str, float | None]
    error: str | None
    notes: list[str]


async def measure(
    scenario: str, side: Side, cfg: Config, pids: dict[str, int | None], prefix: str, cleaner: QueueCleaner
) -> Record:
    info = SCENARIOS[scenario]
    run = Run(cfg, side, pids, prefix)
    budget = info.budget(cfg)
    error: str | None = None
    try:
        async with asyncio.timeout(budget):
            await info.run(run)
    except BenchFailure as failure:
        error = str(failure)
    except (StompError, OSError) as failure:
        error = f"{type(failure).__name__}: {failure}"
    except TimeoutError:
        error = f"the measurement did not finish within its {budget:g} s budget"
    if error is None and run.error is not None:
        error = run.error
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(run.close(), 20)
    await cleaner.delete(run.queues)
    outcome = run.outcome
    return Record(0, scenario, side.name, outcome.metrics, outcome.counts, outcome.cpu, error, outcome.notes)


async def background_load(seconds: float = 2.0) -> float | None:
    """CPUs' worth of work the machine does while the bench is idle (other processes)."""
    before = procstat.machine_busy_seconds()
    await asyncio.sleep(seconds)
    after = procstat.machine_busy_seconds()
    return None if before is None or after is None else round((after - before) / seconds, 2)


async def server_header(
    host: str, port: int, websocket: str | None = None, tls: ssl.SSLContext | None = None
) -> str:
    try:
        client = await connect(host, port, "probe", timeout=10, tls=tls, websocket=websocket)
    except (StompError, OSError) as error:
        return f"? ({error})"
    value = header(client.connected.result(), b"server")
    await client.disconnect()
    return value.decode() if value else "?"


def fmt(value: float | None, unit: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if unit == "ms":
        return f"{value:.2f}"
    if unit == "KB/conn":
        return f"{value:.1f}"
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:.1f}"


def summarize(records: list[Record], metrics: list[Metric]) -> list[dict[str, Any]]:
    rows = []
    for metric in metrics:
        row: dict[str, Any] = {
            "metric": metric.key,
            "label": metric.label,
            "unit": metric.unit,
            "higher_is_better": metric.higher_is_better,
            "target": metric.target,
        }
        seen = False
        for side in ("adapter", "plugin"):
            relevant = [r for r in records if r.scenario == metric.scenario and r.side == side]
            values = [r.metrics[metric.key] for r in relevant if r.error is None and metric.key in r.metrics]
            failed = [r for r in relevant if r.error is not None]
            if relevant:
                seen = True
            row[side] = (
                {
                    "median": statistics.median(values),
                    "min": min(values),
                    "max": max(values),
                    "values": values,
                    "failed": len(failed),
                }
                if values
                else ({"failed": len(failed)} if relevant else None)
            )
        if not seen:
            continue
        a, p = row.get("adapter"), row.get("plugin")
        ratio = None
        if a and p and "median" in a and "median" in p and p["median"]:
            ratio = a["median"] / p["median"]
        row["ratio"] = ratio
        row["verdict"] = verdict(metric, a, ratio)
        rows.append(row)
    return rows


def verdict(metric: Metric, adapter: dict[str, Any] | None, ratio: float | None) -> str:
    if not metric.target:
        return ""
    if not adapter or "median" not in adapter:
        return "NOT YET (failed)"
    kind, _, rest = metric.target.partition(">=") if ">=" in metric.target else metric.target.partition("<=")
    limit = float(rest)
    if kind == "abs":
        value = adapter["median"]
    else:
        if ratio is None:
            return "n/a (no plugin value)"
        value = ratio
    ok = value >= limit if ">=" in metric.target else value <= limit
    return "ok" if ok else "NOT YET"


def target_text(metric_target: str) -> str:
    if not metric_target:
        return ""
    kind, op, limit = (
        metric_target.partition(">=") if ">=" in metric_target else metric_target.partition("<=")
    )
    sign = "≥" if op == ">=" else "≤"
    return f"{sign} {limit}x" if kind == "ratio" else f"{sign} {limit}"


def print_summary(rows: list[dict[str, Any]]) -> list[str]:
    header_row = [
        "metric",
        "unit",
        "adapter median",
        "adapter min–max",
        "plugin median",
        "plugin min–max",
        "A/P",
        "target",
        "",
    ]
    lines = []
    table = []
    for row in rows:
        unit = row["unit"]
        cells = [row["label"], unit]
        for side in ("adapter", "plugin"):
            data = row.get(side)
            if data is None:
                cells += ["n/a", ""]
            elif "median" not in data:
                cells += ["FAILED", ""]
            else:
                spread = f"{fmt(data['min'], unit)}–{fmt(data['max'], unit)}"
                if data.get("failed"):
                    spread += f" ({data['failed']} failed)"
                cells += [fmt(data["median"], unit), spread]
        cells.append(f"{row['ratio']:.2f}x" if row.get("ratio") is not None else "")
        cells.append(target_text(row["target"]))
        cells.append(row["verdict"])
        table.append(cells)
    widths = [max(len(str(r[i])) for r in [header_row, *table]) for i in range(len(header_row))]
    right = {2, 4, 6}
    for r in [header_row, *table]:
        lines.append(
            "  ".join(
                (str(c).rjust(w) if i in right else str(c).ljust(w))
                for i, (c, w) in enumerate(zip(r, widths, strict=True))
            )
        )
        if r is header_row:
            lines.append("  ".join("-" * w for w in widths))
    return lines


def cpu_rows(records: list[Record]) -> list[dict[str, Any]]:
    rows = []
    order = list(dict.fromkeys(r.scenario for r in records))
    for scenario in order:
        for side in ("adapter", "plugin"):
            relevant = [
                r for r in records if r.scenario == scenario and r.side == side and r.error is None and r.cpu
            ]
            if not relevant:
                continue

            def med(key: str, rel: list[Record] = relevant) -> float | None:
                vals = [r.cpu.get(key) for r in rel if r.cpu.get(key) is not None]
                return statistics.median(vals) if vals else None

            per_item = []
            for r in relevant:
                items = r.counts.get(ITEMS[scenario])
                if not items:
                    continue
                total = (r.cpu.get("broker") or 0.0) + (
                    (r.cpu.get("adapter") or 0.0) if side == "adapter" else 0.0
                )
                per_item.append(total / items * 1e6)
            rows.append(
                {
                    "scenario": scenario,
                    "side": side,
                    "wall": med("wall"),
                    "adapter": med("adapter"),
                    "broker": med("broker"),
                    "bench": med("bench"),
                    "other": med("other"),
                    "server_us_per_item": statistics.median(per_item) if per_item else None,
                    "item": ITEMS[scenario],
                }
            )
    return rows


def print_cpu(rows: list[dict[str, Any]]) -> list[str]:
    head = [
        "scenario",
        "side",
        "wall s",
        "adapter CPU s",
        "broker CPU s",
        "bench CPU s",
        "other CPU s",
        "server CPU µs/item",
        "item",
    ]
    table = []
    for row in rows:
        table.append(
            [
                row["scenario"],
                row["side"],
                *(
                    f"{row[k]:.2f}" if row[k] is not None else "-"
                    for k in ("wall", "adapter", "broker", "bench", "other")
                ),
                f"{row['server_us_per_item']:.0f}" if row["server_us_per_item"] is not None else "-",
                row["item"],
            ]
        )
    widths = [max(len(str(r[i])) for r in [head, *table]) for i in range(len(head))]
    lines = []
    for r in [head, *table]:
        lines.append(
            "  ".join(
                (str(c).rjust(w) if 2 <= i <= 7 else str(c).ljust(w))
                for i, (c, w) in enumerate(zip(r, widths, strict=True))
            )
        )
        if r is head:
            lines.append("  ".join("-" * w for w in widths))
    return lines


def progress(record: Record, metrics: list[Metric]) -> str:
    units = {m.key: m.unit for m in metrics}
    if record.error:
        text = f"FAILED: {record.error}"
    else:
        text = ", ".join(
            f"{k} {fmt(v, units.get(k, ''))} {units.get(k, '')}".rstrip() for k, v in record.metrics.items()
        )
    cpu = record.cpu
    cpu_text = ""
    if cpu:
        parts = [
            f"{k} {cpu[k]:.2f}s" for k in ("adapter", "broker", "bench", "other") if cpu.get(k) is not None
        ]
        cpu_text = f"  [wall {cpu.get('wall', 0):.1f}s cpu {' '.join(parts)}]"
    notes = f"  ({'; '.join(record.notes)})" if record.notes else ""
    return f"[round {record.round}] {record.scenario:<17} {record.side:<7} {text}{cpu_text}{notes}"


async def main_async(args: argparse.Namespace) -> int:
    cfg = Config(
        host=args.host,
        duration=args.duration,
        messages=args.messages,
        size=args.size,
        producers=args.producers,
        window=args.window,
        drain_timeout=args.drain_timeout,
        rates=args.rate_list,
        idle_connections=args.idle_connections,
    )
    run_id = secrets.token_hex(3)
    prefix = f"bench-{run_id}-"
    cleaner = QueueCleaner(prefix, management_url=args.management_url)
    started = time.monotonic()
    started_at = datetime.datetime.now(datetime.UTC)

    adapter: AdapterProcess | None = None
    if args.adapter_port:
        adapter_port = args.adapter_port
        adapter_pid = procstat.pid_listening_on(adapter_port)
        if not port_answers(args.host, adapter_port):
            print(f"nothing listens on {args.host}:{adapter_port}", file=sys.stderr)
            return 2
        if adapter_pid is None:
            print(
                f"warning: cannot find the process listening on port {adapter_port}: no adapter CPU/RSS",
                file=sys.stderr,
            )
    else:
        adapter = AdapterProcess(args.host)
        adapter.start()
        adapter_port, adapter_pid = adapter.port, adapter.pid
    broker_pid = procstat.find_broker_pid(args.amqp_port)
    if broker_pid is None:
        print("warning: no beam.smp process found: no broker CPU", file=sys.stderr)
    plugin = args.plugin_port and port_answers(args.host, args.plugin_port)
    if args.plugin_port and not plugin:
        print(
            f"warning: the plugin does not answer on {args.host}:{args.plugin_port}: adapter only",
            file=sys.stderr,
        )

    tls = ssl.create_default_context(cafile=args.adapter_tls_ca) if args.adapter_tls_ca else None
    plugin_tls = ssl.create_default_context(cafile=args.plugin_tls_ca) if args.plugin_tls_ca else None
    ws_path = args.ws_path if args.websocket else None
    sides = {"adapter": Side("adapter", adapter_port, tls, websocket=ws_path)}
    if plugin:
        sides["plugin"] = Side(
            "plugin", args.plugin_port, plugin_tls, websocket=ws_path if args.websocket == "both" else None
        )
    conditions: dict[str, Any] = {
        **environment(),
        "date": started_at.isoformat(timespec="seconds"),
        "loop": type(asyncio.get_running_loop()).__module__.split(".")[0],
        "adapter_server_header": await server_header(
            args.host, adapter_port, sides["adapter"].websocket, sides["adapter"].tls
        ),
        "plugin_server_header": (
            await server_header(args.host, args.plugin_port, sides["plugin"].websocket, sides["plugin"].tls)
            if plugin
            else None
        ),
        "transport": {
            name: ("websocket" if side.websocket else "tcp") + (" over TLS" if side.tls else "")
            for name, side in sides.items()
        },
        "adapter": f"{args.host}:{adapter_port}" + (" (started by the bench)" if adapter else " (external)"),
        "adapter_pid": adapter_pid,
        "broker_pid": broker_pid,
        "bench_pid": os.getpid(),
    }
    metrics = metric_list(cfg)
    background = await background_load()
    conditions["background_cpus_before_run"] = background
    print(
        f"bench run {run_id}: scenarios {', '.join(args.scenario_names)}; "
        f"{args.rounds} rounds x {cfg.duration:g} s; "
        f"{cfg.size} B messages; adapter {conditions['adapter']} pid {adapter_pid}; "
        f"plugin {'port ' + str(args.plugin_port) if plugin else 'skipped'}; broker pid {broker_pid}; "
        f"{conditions['cpus']} CPUs; loop {conditions['loop']}",
        flush=True,
    )
    if background is not None and background > 0.2:
        print(
            f"warning: the machine is busy before the run ({background:.2f} CPUs used by other processes); "
            "results will be noisy",
            file=sys.stderr,
            flush=True,
        )
    records: list[Record] = []
    try:
        for round_no in range(1, args.rounds + 1):
            for scenario in args.scenario_names:
                for side_name in SCENARIOS[scenario].sides:
                    side = sides.get(side_name)
                    if side is None:
                        continue
                    pids = {"adapter": adapter_pid, "broker": broker_pid, "bench": os.getpid()}
                    fresh: AdapterProcess | None = None
                    if scenario == "idle" and adapter is not None:
                        # a fresh process per round: the main one's heap is warm from the other scenarios
                        fresh = AdapterProcess(args.host, label="adapter-idle")
                        fresh.start()
                        side = Side("adapter", fresh.port)
                        pids["adapter"] = fresh.pid
                    try:
                        record = await measure(
                            scenario, side, cfg, pids, f"{prefix}{scenario}-{side_name}-r{round_no}-", cleaner
                        )
                    finally:
                        if fresh is not None:
                            fresh.stop()
                    record.round = round_no
                    if side_name == "adapter" and adapter is not None and not adapter.alive():
                        record.error = (
                            record.error or ""
                        ) + f" | the adapter process died:\n{adapter.log_tail()}"
                        print(progress(record, metrics), flush=True)
                        adapter = AdapterProcess(args.host, adapter_port)
                        adapter.start()
                        adapter_pid = adapter.pid
                    else:
                        print(progress(record, metrics), flush=True)
                    records.append(record)
                    await asyncio.sleep(0.5)  # let the broker settle (queue deletion, GC)
    finally:
        leftovers = await cleaner.sweep()
        if leftovers:
            print(f"warning: could not delete queues {leftovers}", file=sys.stderr)
        if adapter is not None:
            adapter.stop()

    rows = summarize(records, metrics)
    cpu = cpu_rows(records)
    elapsed = time.monotonic() - started
    conditions["elapsed_seconds"] = round(elapsed, 1)
    print()
    print(
        f"Summary: median of {args.rounds} rounds, {cfg.duration:g} s each, {cfg.size} B bodies, "
        f"{conditions['cpus']} CPUs, {conditions['date']}  (A/P = adapter/plugin)"
    )
    for line in print_summary(rows):
        print(line)
    print()
    print("CPU during the measurements (medians); server CPU = broker (+ adapter for the adapter side)")
    for line in print_cpu(cpu):
        print(line)
    noisy = [
        r
        for r in records
        if r.cpu.get("other") is not None and r.cpu.get("wall") and r.cpu["other"] > 0.15 * r.cpu["wall"]
    ]
    if noisy:
        print()
        print(
            f"warning: {len(noisy)} of {len(records)} measurements ran while other processes used more than "
            "0.15 CPUs (column 'other CPU s'): the machine was not quiet"
        )
    failures = [r for r in records if r.error]
    if failures:
        print()
        print("Failures:")
        for r in failures:
            print(f"  round {r.round} {r.scenario} {r.side}: {r.error}")
    print(f"\ntotal time {elapsed:.0f} s; queues deleted: {cleaner.deleted}")
    json_path = Path(args.json) if args.json else RESULTS / f"run-{started_at:%Y%m%d-%H%M%S}.json"
    data = {
        "conditions": conditions,
        "config": {**asdict(cfg), "rounds": args.rounds, "scenarios": args.scenario_names},
        "summary": rows,
        "cpu": cpu,
        "measurements": [asdict(r) for r in records],
    }
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(data, indent=2, default=str))
    print(f"wrote {json_path}")
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    raise_own_nofile()
    if not args.no_uvloop:
        try:
            import uvloop

            asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
        except ImportError:
            pass
    try:
        return asyncio.run(main_async(args))
    except KeyboardInterrupt:
        return 130
