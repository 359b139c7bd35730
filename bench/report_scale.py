"""``python -m bench.report_scale``: how long ``python -m adapter.migrate report`` takes on a
recording of fleet size (issue 34 item 5: 10 million frames on ``local[*]`` in under 10 minutes).

1. **Write** a synthetic recording straight in the tap's format (docs/recording-format.md),
   ``--frames`` frame records (default 10,000,000) plus the ``open``, ``heartbeats`` and ``close``
   records of their connections, into ``--files`` gzip JSON Lines files (default: one per million
   records), so that Spark reads them in parallel as it would a tap's rotated files.  Writing
   through a live tap would take hours at this size; the records are what the tap writes, shaped
   like a fleet of ActiveMQ applications: ``--apps`` applications (client host, login, client-id),
   each connection a CONNECT/CONNECTED then a mix of the idioms the report names (persistent and
   non-persistent SENDs, request/reply with ``reply-to`` and temp queues, scheduled delays,
   selectors, client and individual acks with ACKs, transactions, durable topic subscribers,
   composite destinations, receipts), then DISCONNECT, over ``--span`` seconds.
2. **Report**: run ``python -m adapter.migrate report DIR --json FILE`` (``--master``, default
   ``local[*]``) as a user would, and print the wall time, the frames per second and what the
   report counted (so a wrong count shows).

``--recording DIR`` skips step 1 (``--keep DIR`` keeps the recording step 1 writes).  Generating
is deterministic for a ``--seed``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_START = 1_790_000_000.0  # 2026-09-21, any fixed time


def _frame(
    conn: str,
    client: str,
    ts: float,
    direction: str,
    command: str,
    headers: list[list[str]],
    body_len: int = 0,
) -> dict[str, Any]:
    return {
        "v": 1,
        "ts": round(ts, 6),
        "conn": conn,
        "kind": "frame",
        "client": client,
        "dir": direction,
        "command": command,
        "headers": headers,
        "body_len": body_len,
    }


def _session(rng: random.Random, app: int, n: int, ts: float, step: float) -> Iterator[dict[str, Any]]:
    """The records of one connection of application ``app``, about 20 frames."""
    conn = f"b3c4d5-{n}"
    host = f"10.1.{app // 250}.{app % 250 + 1}"
    client = f"{host}:{40000 + n % 20000}"
    yield {
        "v": 1,
        "ts": ts,
        "conn": conn,
        "kind": "open",
        "client": client,
        "listen": "0.0.0.0:61613",
        "upstream": "broker:61613",
        "tls": False,
    }
    connect = [["accept-version", "1.0,1.1,1.2"], ["host", "/"], ["login", f"app{app}"], ["passcode", "***"]]
    if app % 3 == 0:
        connect.append(["client-id", f"app{app}-client"])
    yield _frame(conn, client, ts, "in", "CONNECT", connect)
    ts += step
    yield _frame(
        conn,
        client,
        ts,
        "out",
        "CONNECTED",
        [["version", "1.2"], ["session", f"ID:broker-{n}"], ["heart-beat", "0,0"]],
    )
    queue = f"/queue/app{app}.orders"
    kind = rng.random()
    frames = 0
    while frames < 18:
        ts += step
        if kind < 0.45:  # a producer: persistent SENDs with receipts, some scheduled, some composite
            headers = [
                ["destination", queue if rng.random() < 0.9 else f"{queue},/topic/app{app}.audit"],
                ["persistent", "true"],
                ["receipt", str(frames)],
                ["content-type", "application/json"],
            ]
            if rng.random() < 0.1:
                headers.append(["AMQ_SCHEDULED_DELAY", str(rng.choice((1000, 5000, 60000)))])
            yield _frame(conn, client, ts, "in", "SEND", headers, rng.randint(100, 4000))
            yield _frame(conn, client, ts + step / 2, "out", "RECEIPT", [["receipt-id", str(frames)]])
            frames += 2
        elif kind < 0.7:  # a consumer: SUBSCRIBE (a selector sometimes), MESSAGEs and ACKs
            if frames == 0:
                subscribe = [
                    ["destination", queue],
                    ["id", "1"],
                    ["ack", rng.choice(("client", "client-individual"))],
                    ["activemq.prefetchSize", "10"],
                ]
                if rng.random() < 0.2:
                    subscribe.append(["selector", f"region = 'r{app % 7}'"])
                yield _frame(conn, client, ts, "in", "SUBSCRIBE", subscribe)
                frames += 1
            tag = f"ID:broker-{n}-{frames}"
            yield _frame(
                conn,
                client,
                ts,
                "out",
                "MESSAGE",
                [
                    ["destination", queue],
                    ["subscription", "1"],
                    ["message-id", tag],
                    ["ack", tag],
                    ["persistent", "true"],
                ],
                rng.randint(100, 4000),
            )
            yield _frame(conn, client, ts + step / 2, "in", "ACK", [["id", tag]])
            frames += 2
        elif kind < 0.85:  # request/reply over a temp queue
            cid = f"{n}-{frames}"
            yield _frame(
                conn,
                client,
                ts,
                "in",
                "SEND",
                [
                    ["destination", f"/queue/app{app}.rpc"],
                    ["reply-to", "/temp-queue/replies"],
                    ["correlation-id", cid],
                ],
                200,
            )
            yield _frame(
                conn,
                client,
                ts + step / 2,
                "out",
                "MESSAGE",
                [
                    ["destination", "/temp-queue/replies"],
                    ["correlation-id", cid],
                    ["message-id", f"ID:r{cid}"],
                    ["subscription", "/temp-queue/replies"],
                ],
                300,
            )
            frames += 2
        elif kind < 0.95:  # a transaction of SENDs
            tx = f"tx{frames}"
            yield _frame(conn, client, ts, "in", "BEGIN", [["transaction", tx]])
            for _ in range(3):
                yield _frame(
                    conn, client, ts, "in", "SEND", [["destination", queue], ["transaction", tx]], 500
                )
            yield _frame(conn, client, ts, "in", "COMMIT", [["transaction", tx], ["receipt", tx]])
            yield _frame(conn, client, ts + step / 2, "out", "RECEIPT", [["receipt-id", tx]])
            frames += 6
        else:  # a durable topic subscriber
            topic = f"/topic/app{app}.events"
            if frames == 0:
                yield _frame(
                    conn,
                    client,
                    ts,
                    "in",
                    "SUBSCRIBE",
                    [
                        ["destination", topic],
                        ["id", "d"],
                        ["activemq.subscriptionName", f"app{app}-durable"],
                        ["ack", "auto"],
                    ],
                )
                frames += 1
            yield _frame(
                conn,
                client,
                ts,
                "out",
                "MESSAGE",
                [["destination", topic], ["subscription", "d"], ["message-id", f"ID:t{n}-{frames}"]],
                250,
            )
            frames += 1
    ts += step
    yield _frame(conn, client, ts, "in", "DISCONNECT", [["receipt", "bye"]])
    yield _frame(conn, client, ts + step / 2, "out", "RECEIPT", [["receipt-id", "bye"]])
    yield {
        "v": 1,
        "ts": ts + step,
        "conn": conn,
        "kind": "close",
        "by": "client",
        "reason": "client closed",
        "bytes_in": 0,
        "bytes_out": 0,
    }


def write_recording(
    directory: Path, frames: int, apps: int, span: float, per_file: int, seed: int
) -> tuple[int, int]:
    """Write the synthetic recording; returns (frame records, connections)."""
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    connections = max(1, frames // 22)
    written = 0
    batch: list[str] = []
    file_number = 0

    def spill() -> None:
        nonlocal file_number
        file_number += 1
        name = directory / f"tap-20260921T000000Z-1-{file_number:06d}.jsonl.gz"
        with gzip.open(name, "wt", compresslevel=1) as out:
            out.write("\n".join(batch))
            out.write("\n")
        batch.clear()

    for n in range(connections):
        ts = _START + span * n / connections
        for record in _session(rng, rng.randrange(apps), n, ts, 0.01):
            batch.append(json.dumps(record, separators=(",", ":")))
            written += record["kind"] == "frame"
        if len(batch) >= per_file:
            spill()
    if batch:
        spill()
    return written, connections


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.report_scale", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--frames", type=int, default=10_000_000)
    parser.add_argument("--apps", type=int, default=2000)
    parser.add_argument("--span", type=float, default=7 * 86400.0, help="recorded seconds (default a week)")
    parser.add_argument("--per-file", type=int, default=1_000_000, help="records per file")
    parser.add_argument("--seed", type=int, default=34)
    parser.add_argument("--recording", type=Path, help="report on this recording instead of writing one")
    parser.add_argument("--keep", type=Path, help="write the recording here and keep it")
    parser.add_argument("--master", default="local[*]")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-report-") as scratch:
        recording = args.recording
        if recording is None:
            recording = args.keep or Path(scratch) / "recording"
            started = time.monotonic()
            frames, connections = write_recording(
                recording, args.frames, args.apps, args.span, args.per_file, args.seed
            )
            took = time.monotonic() - started
            print(
                f"wrote {frames:,} frames, {connections:,} connections, {took:.0f} s: {recording}", flush=True
            )
        report = Path(scratch) / "report.json"
        command = [
            sys.executable,
            "-m",
            "adapter.migrate",
            "report",
            str(recording),
            "--json",
            str(report),
            "--master",
            args.master,
        ]
        started = time.monotonic()
        subprocess.run(command, check=True, env={**os.environ, "PYSPARK_PYTHON": sys.executable})
        elapsed = time.monotonic() - started
        data = json.loads(report.read_text())
        totals = data.get("totals", {})
        print(f"report: {elapsed:.0f} s wall on {args.master}; totals: {json.dumps(totals)[:600]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
