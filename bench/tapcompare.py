"""``python -m bench.tapcompare``: the recording tap against a plain byte relay and against direct,
in one alternating run (docs/performance.md, "The recording tap").

Starts one process per proxy, each in front of RabbitMQ's STOMP plugin: the tap of this checkout
(recording without bodies into a temporary directory), optionally the tap of another source tree
(``--other-tap NAME=DIR``, e.g. an older commit unpacked with ``git archive``), and the plain relay of
bench/relay.py.  Each round runs ``python -m bench`` once per proxy (one round of the chosen
scenarios, the proxy as the "adapter" side, the plugin direct as the other), the proxies in a
different order every round, so the machine's drift and other people's load hit all of them.
It prints, per round and as medians: queue throughput through each proxy and direct, the ratios
to direct and to the relay of the same round (and to the relay with Nagle's algorithm left on,
``--nagle-relay``), the request/reply p99 at 1,000 msg/s added by
each proxy, and each proxy's CPU per queued message.

    python -m bench.tapcompare --rounds 4 --duration 5 [--other-tap before=/tmp/tap-before]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from .services import ROOT, free_port, wait_port


@dataclass
class Proxy:
    name: str
    port: int
    process: subprocess.Popen[bytes]


def _start(name: str, command: list[str], cwd: Path, port: int, log: Path) -> Proxy:
    with open(log, "wb") as out:
        process = subprocess.Popen(command, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
    wait_port(port, process, name)
    return Proxy(name, port, process)


def _stop(proxy: Proxy) -> None:
    if proxy.process.poll() is None:
        proxy.process.send_signal(signal.SIGTERM)
        try:
            proxy.process.wait(30)
        except subprocess.TimeoutExpired:
            proxy.process.kill()
            proxy.process.wait(10)


def _bench(proxy: Proxy, args: argparse.Namespace, out: Path) -> dict[str, float]:
    """One ``python -m bench`` round through ``proxy``: its figures and direct's."""
    command = [
        sys.executable,
        "-m",
        "bench",
        "--adapter-port",
        str(proxy.port),
        "--plugin-port",
        str(args.plugin_port),
        "--scenarios",
        args.scenarios,
        "--rates",
        "1000",
        "--rounds",
        "1",
        "--duration",
        str(args.duration),
        "--json",
        str(out),
    ]
    subprocess.run(command, cwd=ROOT, check=False, stdout=subprocess.DEVNULL)
    data = json.loads(out.read_text())
    figures: dict[str, float] = {}
    for row in data["summary"]:
        for side in ("adapter", "plugin"):
            if row.get(side) and "median" in row[side]:
                figures[f"{row['metric']}:{side}"] = row[side]["median"]
    for measurement in data["measurements"]:
        if measurement["scenario"] == "queue" and measurement["side"] == "adapter":
            cpu = measurement["cpu"].get("adapter")
            delivered = measurement["counts"].get("delivered") or measurement["counts"].get("received")
            if cpu is not None and delivered:
                figures["cpu_us"] = 1e6 * cpu / delivered
            figures["other_cpu"] = measurement["cpu"].get("other") or 0.0
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tapcompare", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--plugin-port", type=int, default=61613)
    parser.add_argument(
        "--scenarios", default="queue,reqrep", help="of python -m bench (default queue,reqrep)"
    )
    parser.add_argument(
        "--other-tap",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="a source tree whose tap runs too, under NAME (repeat for several)",
    )
    parser.add_argument(
        "--tap-args",
        action="append",
        default=[],
        metavar="NAME=ARGS",
        help="more arguments for the tap NAME ('tap' is this checkout's), e.g. tap='--tcp-nodelay true'",
    )
    parser.add_argument(
        "--first-port",
        type=int,
        default=0,
        help="the proxies listen on this port and the next ones (default: ports the kernel picks)",
    )
    parser.add_argument("--no-relay", action="store_true", help="no relay (the ratios to direct only)")
    parser.add_argument(
        "--nagle-relay", action="store_true", help="also the relay with --nagle, as 'relay-nagle'"
    )
    args = parser.parse_args()
    upstream = f"127.0.0.1:{args.plugin_port}"
    work = Path(tempfile.mkdtemp(prefix="tapcompare-"))
    proxies: list[Proxy] = []
    ports = iter(range(args.first_port, args.first_port + 100)) if args.first_port else None

    def next_port() -> int:
        return next(ports) if ports is not None else free_port()

    try:
        trees = [("tap", ROOT)]
        for given in args.other_tap:
            name, _, tree = given.partition("=")
            trees.append((name, Path(tree).resolve()))
        for name, tree in trees:
            port = next_port()
            command = [sys.executable, "-m", "adapter", "tap", "--listen", f"127.0.0.1:{port}"]
            command += ["--upstream", upstream, "--record", str(work / f"rec-{name}")]
            command += [
                arg
                for given in args.tap_args
                if given.startswith(f"{name}=")
                for arg in shlex.split(given.partition("=")[2])
            ]
            proxies.append(_start(name, command, tree, port, work / f"{name}.log"))
        relays: list[tuple[str, list[str]]] = [] if args.no_relay else [("relay", [])]
        if args.nagle_relay:
            relays.append(("relay-nagle", ["--nagle"]))
        for name, extra in relays:
            port = next_port()
            command = [sys.executable, "-m", "bench.relay", "--listen", f"127.0.0.1:{port}"]
            command += ["--upstream", upstream, *extra]
            proxies.append(_start(name, command, ROOT, port, work / f"{name}.log"))
        results: dict[str, list[dict[str, float]]] = {proxy.name: [] for proxy in proxies}
        print(
            f"{time.strftime('%Y-%m-%d %H:%M:%S')} load {os.getloadavg()[0]:.2f}; work in {work}", flush=True
        )
        for round_no in range(args.rounds):
            order = proxies[round_no % len(proxies) :] + proxies[: round_no % len(proxies)]
            for proxy in order:
                figures = _bench(proxy, args, work / f"{proxy.name}-{round_no}.json")
                results[proxy.name].append(figures)
                print(f"round {round_no + 1} {proxy.name}: {_line(figures)}", flush=True)
        print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} load {os.getloadavg()[0]:.2f}")
        print(f"\nmedians of {args.rounds} rounds:")
        for name, rows in results.items():
            ratios = [r["queue:adapter"] / r["queue:plugin"] for r in rows if r.get("queue:plugin")]
            text = f"{name}: queue {_median(rows, 'queue:adapter'):,.0f} msg/s"
            text += f", direct {_median(rows, 'queue:plugin'):,.0f}, {_median_of(ratios):.2f}x of direct"
            for relay_name, _ in relays if not name.startswith("relay") else []:
                per_round = [
                    r["queue:adapter"] / q["queue:adapter"]
                    for r, q in zip(rows, results[relay_name], strict=True)
                    if q.get("queue:adapter")
                ]
                text += f", {_median_of(per_round):.2f}x of {relay_name} (per round: "
                text += ", ".join(f"{x:.2f}" for x in per_round) + ")"
            added = [
                r["rr1000-p99:adapter"] - r["rr1000-p99:plugin"] for r in rows if "rr1000-p99:plugin" in r
            ]
            text += f"; added p99 at 1,000/s {_median_of(added):+.2f} ms (per round: "
            text += ", ".join(f"{x:+.2f}" for x in added) + ")"
            text += f"; CPU {_median(rows, 'cpu_us'):.1f} µs/message"
            print(text)
    finally:
        for proxy in proxies:
            _stop(proxy)
    return 0


def _median_of(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _median(rows: list[dict[str, float]], key: str) -> float:
    values = [r[key] for r in rows if key in r]
    return statistics.median(values) if values else float("nan")


def _line(figures: dict[str, float]) -> str:
    return (
        f"queue {figures.get('queue:adapter', 0):,.0f} / direct {figures.get('queue:plugin', 0):,.0f} msg/s; "
        f"p99 at 1,000/s {figures.get('rr1000-p99:adapter', 0):.2f}"
        f" / {figures.get('rr1000-p99:plugin', 0):.2f} ms; "
        f"CPU {figures.get('cpu_us', 0):.1f} µs/message; other CPU {figures.get('other_cpu', 0):.2f} s"
    )


if __name__ == "__main__":
    sys.exit(main())
