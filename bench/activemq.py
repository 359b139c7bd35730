"""``python -m bench.activemq``: what the ``activemq`` profile costs (docs/performance.md).

1. **Selector micro benchmark**: typical JMS selectors, compiled once, evaluated against the
   properties of a delivered message exactly as the session does for each delivery of a
   subscription with a selector (``selector.matches(selector_lookup(properties))``): µs per
   message per subscription, best of ``--repeat``: the per-message cost a selector adds, on a
   topic (once per subscription) or on a queue (once per consumer tried by the dispatcher).
2. **End to end**: two adapter processes, one in the default profile and one in the ``activemq``
   profile, measured alternately round by round (``python -m bench --adapter-port … --plugin-port
   0 --rounds 1`` each, so each side's own adapter CPU is measured): ``queue``, ``persistent``,
   ``topic`` on both, and ``topic-selector`` (four subscribers, each selector matching half the
   messages) on the activemq one, in the same run as its ``topic`` without selectors; and
   ``queue-selector`` (two competing consumers on one queue, each selector matching half the
   messages, routed by the queue's dispatcher) in the same run as ``queue-2consumers`` (the
   same two consumers without selectors).

3. **A backlog no consumer matches**: ``--backlog`` (2000) messages on a queue, then one
   selector consumer (``ack:client-individual``) that matches none of them, for
   ``--backlog-seconds`` (30): the CPU seconds the activemq adapter process and the broker use
   meanwhile (the adapter holds up to 200 of them and releases them with back-off; nothing may
   be delivered), and the queue depth afterwards (all of them still there).

Arguments: ``--rounds`` (3), ``--duration`` seconds per measurement (4), ``--repeat`` (5).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path
from typing import Any

from adapter.mapping.profile import selector_lookup
from adapter.mapping.properties import MessageProperties
from adapter.mapping.selector import compile_selector

from . import procstat
from .runner import ITEMS
from .services import RESULTS, QueueCleaner, free_port, port_answers

# typical selectors of ActiveMQ applications, and the message they are tested against
SELECTORS = {
    "equality": "color = 'red'",
    "and-range": "color = 'red' AND weight > 5",
    "jms-header": "JMSType = 'order' OR JMSPriority >= 7",
    "in-like": "region IN ('eu', 'us', 'apac') AND name LIKE 'ord%'",
    "between-not": "weight BETWEEN 1 AND 100 AND NOT (color = 'blue')",
}
PROPERTIES = MessageProperties(
    type="order",
    priority=4,
    delivery_mode=2,
    headers={"color": "red", "weight": "12", "region": "eu", "name": "order-17", "customer": "c-991"},
)
SIDE_SCENARIOS = {
    "default": "queue,persistent,topic",
    "activemq": "queue,persistent,topic,topic-selector,queue-2consumers,queue-selector",
}


def micro(iterations: int, repeat: int) -> dict[str, float]:
    """µs per evaluation (one delivery, one subscription), best of ``repeat``."""
    out: dict[str, float] = {}
    for name, text in SELECTORS.items():
        selector = compile_selector(text)
        best = float("inf")
        for _ in range(repeat):
            start = time.perf_counter()
            for _ in range(iterations):
                selector.matches(selector_lookup(PROPERTIES))
            best = min(best, time.perf_counter() - start)
        out[name] = best / iterations * 1e6
    start = time.perf_counter()
    for _ in range(100):
        compile_selector(SELECTORS["and-range"])
    out["compile and-range (once per SUBSCRIBE)"] = (time.perf_counter() - start) / 100 * 1e6
    return out


def start_adapter(profile: str, log: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "adapter", "--log-level", "warning", "--listen", f"127.0.0.1:{port}"]
            + ["--profile", "rabbitmq" if profile == "default" else profile],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 20
    while not port_answers("127.0.0.1", port, 0.5):
        if process.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the {profile} adapter did not start (see {log})")
        time.sleep(0.1)
    return process, port


def one_round(side: str, port: int, duration: float, directory: Path, round_no: int) -> list[dict[str, Any]]:
    path = directory / f"{side}-r{round_no}.json"
    command = [sys.executable, "-m", "bench", "--scenarios", SIDE_SCENARIOS[side], "--rounds", "1"]
    command += ["--duration", str(duration), "--adapter-port", str(port), "--plugin-port", "0"]
    subprocess.run([*command, "--json", str(path)], check=False, stdout=subprocess.DEVNULL)
    records: list[dict[str, Any]] = json.loads(path.read_text())["measurements"]
    for record in records:
        record["side"] = side
        record["round"] = round_no
    return records


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def table(records: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| metric | side | median | min-max | adapter CPU µs/item | other CPU s (median) | errors |",
        "|---|---|---|---|---|---|---|",
    ]
    keys = sorted({(r["scenario"], k) for r in records for k in r["metrics"]})
    for scenario, key in keys:
        for side in ("default", "activemq"):
            rows = [r for r in records if r["side"] == side and r["scenario"] == scenario]
            values = [r["metrics"][key] for r in rows if key in r["metrics"]]
            if not values:
                continue
            per_item = [
                r["cpu"]["adapter"] / r["counts"][ITEMS[scenario]] * 1e6
                for r in rows
                if r["cpu"].get("adapter") is not None and r["counts"].get(ITEMS[scenario])
            ]
            other = [r["cpu"]["other"] for r in rows if r["cpu"].get("other") is not None]
            errors = sum(1 for r in rows if r.get("error"))
            cpu = median(per_item)
            lines.append(
                f"| {key} | {side} | {median(values):,.0f} | {min(values):,.0f}-{max(values):,.0f} | "
                f"{'' if cpu is None else f'{cpu:.1f}'} | {median(other) or 0:.2f} | {errors} |"
            )
    return lines


def backlog(port: int, adapter_pid: int, messages: int, seconds: float) -> dict[str, Any]:
    """Section 3: CPU while a selector consumer sits on a backlog it does not match."""
    queue = f"bench-backlog-{os.getpid()}-{time.monotonic_ns()}"
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        reader = _FrameReader(sock)
        sock.sendall(b"CONNECT\naccept-version:1.2\nlogin:guest\npasscode:guest\n\n\0")
        reader.expect(b"CONNECTED")
        batch = b"".join(
            f"SEND\ndestination:/queue/{queue}\ncolour:green\n\nbacklog\0".encode() for _ in range(messages)
        )
        sock.sendall(
            batch + f"SEND\ndestination:/queue/{queue}\nreceipt:sent\ncolour:green\n\nlast\0".encode()
        )
        reader.expect(b"RECEIPT")
        subscribe = (
            f"SUBSCRIBE\ndestination:/queue/{queue}\nid:1\nack:client-individual\n"
            "selector:colour = 'red'\nreceipt:subscribed\n\n\0"
        )
        broker_pid = procstat.find_broker_pid()
        sock.sendall(subscribe.encode())
        reader.expect(b"RECEIPT")
        adapter_before = procstat.cpu_seconds(adapter_pid)
        broker_before = procstat.cpu_seconds(broker_pid) if broker_pid else None
        busy_before = procstat.machine_busy_seconds()
        start = time.monotonic()
        delivered = reader.count_messages(seconds)
        wall = time.monotonic() - start
        adapter_after = procstat.cpu_seconds(adapter_pid)
        broker_after = procstat.cpu_seconds(broker_pid) if broker_pid else None
        busy_after = procstat.machine_busy_seconds()
        sock.sendall(b"DISCONNECT\nreceipt:bye\n\n\0")
        reader.expect(b"RECEIPT")
    cleaner = QueueCleaner(queue)
    time.sleep(1)  # the broker requeues the held messages when the channel closes
    depth = _depth(cleaner, queue)
    asyncio.run(cleaner.delete([queue]))

    def used(before: float | None, after: float | None) -> float | None:
        return None if before is None or after is None else after - before

    return {
        "messages": messages + 1,
        "seconds": wall,
        "delivered": delivered,
        "adapter_cpu_s": used(adapter_before, adapter_after),
        "broker_cpu_s": used(broker_before, broker_after),
        "machine_busy_cpu_s": used(busy_before, busy_after),
        "depth_after": depth,
    }


def _depth(cleaner: QueueCleaner, queue: str) -> int | None:
    path = f"/api/queues/{cleaner._vhost_path()}/{urllib.parse.quote(queue, safe='')}?columns=messages"
    for _ in range(20):  # the management API's figures lag
        try:
            depth = json.loads(cleaner._http("GET", path)).get("messages")
        except (OSError, ValueError):
            return None
        if depth:
            return int(depth)
        time.sleep(0.5)
    return 0


class _FrameReader:
    """Just enough STOMP reading for section 3: whole frames, by command."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""

    def _frame(self, timeout: float) -> bytes | None:
        deadline = time.monotonic() + timeout
        while b"\0" not in self.buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            self.sock.settimeout(remaining)
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                return None
            if not chunk:
                raise SystemExit("the adapter closed the backlog connection")
            self.buffer += chunk
        frame, self.buffer = self.buffer.split(b"\0", 1)
        return frame.lstrip(b"\r\n")

    def expect(self, command: bytes) -> None:
        frame = self._frame(30)
        if frame is None or not frame.startswith(command + b"\n"):
            raise SystemExit(f"backlog: expected {command!r}, got {frame!r}")

    def count_messages(self, seconds: float) -> int:
        deadline = time.monotonic() + seconds
        count = 0
        while (remaining := deadline - time.monotonic()) > 0:
            frame = self._frame(remaining)
            if frame is not None and frame.startswith(b"MESSAGE\n"):
                count += 1
        return count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.activemq", description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=4.0)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=100_000)
    parser.add_argument("--backlog", type=int, default=2000)
    parser.add_argument("--backlog-seconds", type=float, default=30.0)
    args = parser.parse_args(argv)
    started = datetime.datetime.now(datetime.UTC)
    print("== 1. selector micro benchmark: µs per message per subscription (best of repeats)", flush=True)
    figures = micro(args.iterations, args.repeat)
    for name, value in figures.items():
        print(f"  {name:40s} {value:7.2f} µs", flush=True)
    directory = Path(tempfile.mkdtemp(prefix="bench-activemq-"))
    adapters = {side: start_adapter(side, directory / f"{side}.log") for side in ("default", "activemq")}
    records: list[dict[str, Any]] = []
    try:
        print("== 2. default profile vs activemq profile, alternating rounds", flush=True)
        for round_no in range(1, args.rounds + 1):
            order = ("default", "activemq") if round_no % 2 else ("activemq", "default")
            for side in order:
                records += one_round(side, adapters[side][1], args.duration, directory, round_no)
                print(f"  round {round_no} {side} done", flush=True)
        print("== 3. a backlog no consumer matches (activemq profile)", flush=True)
        held = backlog(
            adapters["activemq"][1], adapters["activemq"][0].pid, args.backlog, args.backlog_seconds
        )
        print("  " + json.dumps(held), flush=True)
    finally:
        for process, _port in adapters.values():
            process.terminate()
            process.wait(15)
    lines = table(records)
    print("\n".join(lines))
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"activemq-{started:%Y%m%d-%H%M%S}.json"
    out.write_text(
        json.dumps(
            {
                "date": started.isoformat(),
                "cpus": os.cpu_count(),
                "micro_us": figures,
                "backlog": held,
                "measurements": records,
            },
            indent=2,
            default=str,
        )
    )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
