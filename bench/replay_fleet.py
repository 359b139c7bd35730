"""``python -m bench.replay_fleet``: how long ``python -m adapter.migrate replay`` takes against
the span of the recording it replays (docs/migration-activemq.md, "Planning a migration").

1. **Record**: a synthetic fleet (``drive_fleet``: ``--connections`` STOMP connections over
   ``--span`` seconds) goes through the project's own tap (``python -m adapter tap
   --record-bodies``) in front of an adapter in the ``activemq`` profile.
2. **Replay** that recording against the same adapter at each ``--speeds`` value (default ``1``
   and ``0``), as the command line runs it (``--json -``), and report per speed: the wall time,
   its ratio to the recorded span, the connections replayed and those with differences.

``--recording DIR`` skips step 1 and replays a recording made before (``--keep DIR`` keeps the
one step 1 makes).  The fleet's shape, per application (one per 100 connections), each with its
own queue, request queue, jobs queue and topic, so the applications are unrelated to each other:

* a consumer of its queue for the whole span (``ack:client-individual``, an ACK per message),
  and short producers: CONNECT, one to three SENDs with a receipt, DISCONNECT;
* a responder on its request queue for the whole span, and short requesters: SUBSCRIBE to
  ``/temp-queue/replies``, a SEND with ``reply-to``, the reply, DISCONNECT;
* jobs: a producer SENDs one job and DISCONNECTs without a receipt (as php-stomp does), then a
  short poller SUBSCRIBEs (``activemq.prefetchSize:1``, ``ack:client``), ACKs it, DISCONNECTs;
* a durable subscriber that comes and goes with its ``client-id`` while a publisher SENDs to
  the topic in between; the last one removes the subscription.

Every connection waits for what it expects before it ends, so the recorded answers do not
depend on timing and a replay against the same adapter has no differences to report.  Needs
RabbitMQ on 127.0.0.1:5672 (guest/guest).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gzip
import itertools
import json
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .services import RESULTS, AdapterProcess, QueueCleaner, free_port, port_answers, raise_own_nofile
from .stomp import StompClient, frame, headers

__all__ = ["FleetShape", "drive_fleet", "main", "record_fleet", "recording_span", "start_tap"]

CONNECTIONS_PER_APPLICATION = 100


@dataclass(frozen=True)
class FleetShape:
    """How many connections of each kind one application opens (besides its two long ones)."""

    producers: int
    requesters: int
    jobs: int  # each a producer and a poller
    durable_sessions: int  # each a subscriber session, and a publisher between two of them

    @staticmethod
    def of(connections: int) -> FleetShape:
        short = max(connections - 2, 6)
        jobs = max(short // 10, 1)
        durable = max(short // 20, 1)
        requesters = max((short - 2 * jobs - 2 * durable) * 3 // 7, 1)
        producers = max(short - 2 * jobs - 2 * durable - requesters, 1)
        return FleetShape(producers, requesters, jobs, durable)

    @property
    def connections(self) -> int:
        return 2 + self.producers + self.requesters + 2 * self.jobs + 2 * self.durable_sessions


class _Client:
    """One bench STOMP connection (bench/stomp.py) with what this fleet needs: extra CONNECT
    headers, MESSAGEs counted and handed to a handler."""

    def __init__(self, client: StompClient) -> None:
        self.stomp = client
        self.received = 0
        self._arrived = asyncio.Event()
        self.handle: Callable[[dict[str, str], bytes], None] | None = None
        client.on_message = self._message
        client.on_failure = lambda text: None  # the fleet's own waits time out instead

    def _message(self, raw: bytes, body: bytes) -> None:
        self.received += 1
        if self.handle is not None:
            self.handle(headers(raw), body)
        self._arrived.set()

    async def until_received(self, count: int, timeout: float = 30.0) -> None:
        async with asyncio.timeout(timeout):
            while self.received < count:
                self._arrived.clear()
                await self._arrived.wait()

    def send(self, command: str, values: dict[str, str], body: bytes = b"") -> None:
        self.stomp.send(frame(command, values, body))

    async def request(self, command: str, values: dict[str, str], body: bytes = b"") -> None:
        """A frame with a receipt, and its RECEIPT awaited (bench/stomp.py's own receipt ids)."""
        if body:  # StompClient.request sends no body
            receipt = f"b{uuid.uuid4().hex[:12]}"
            waiter: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
            self.stomp._waiters[receipt.encode()] = waiter
            self.send(command, {**values, "receipt": receipt}, body)
            async with asyncio.timeout(15):
                await waiter
        else:
            await self.stomp.request(command, values)

    async def disconnect(self, receipt: bool = True) -> None:
        if receipt:
            await self.stomp.disconnect()
        else:
            self.send("DISCONNECT", {})
            await asyncio.sleep(0)
            self.stomp.abort()


async def _open(host: str, port: int, **extra: str) -> _Client:
    loop = asyncio.get_running_loop()
    _, client = await loop.create_connection(StompClient, host, port)
    connect = {"accept-version": "1.2", "host": "/", "login": "guest", "passcode": "guest"}
    client.send(frame("CONNECT", {**connect, "heart-beat": "0,0", **extra}))
    async with asyncio.timeout(15):
        await client.connected
    return _Client(client)


async def _at(start: float, offset: float) -> None:
    delay = start + offset - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)


def _times(rng: random.Random, count: int, span: float) -> list[float]:
    """``count`` moments spread over ``span`` seconds (evenly, with jitter), in order."""
    return sorted((n + rng.random()) * span / max(count, 1) for n in range(count))


async def _application(host: str, port: int, name: str, shape: FleetShape, span: float, seed: int) -> int:
    """One application's connections over ``span`` seconds; the number it opened."""
    rng = random.Random(seed)
    start = time.monotonic()
    opened = itertools.count(1)

    async def orders() -> None:
        queue = f"/queue/{name}.orders"
        consumer = await _open(host, port)
        next(opened)

        def ack(values: dict[str, str], body: bytes) -> None:
            consumer.send("ACK", {"id": values.get("ack", "")})

        consumer.handle = ack
        await consumer.request("SUBSCRIBE", {"destination": queue, "id": "1", "ack": "client-individual"})
        sent = 0
        for moment in _times(rng, shape.producers, span):
            await _at(start, moment)
            producer = await _open(host, port)
            next(opened)
            for _ in range(rng.randint(1, 3)):
                await producer.request("SEND", {"destination": queue, "persistent": "true"}, b"order")
                sent += 1
            await producer.disconnect()
        await consumer.until_received(sent)
        await consumer.disconnect()

    async def rpc() -> None:
        queue = f"/queue/{name}.rpc"
        responder = await _open(host, port)
        next(opened)

        def answer(values: dict[str, str], body: bytes) -> None:
            responder.send("SEND", {"destination": values["reply-to"]}, b"pong")

        responder.handle = answer
        await responder.request("SUBSCRIBE", {"destination": queue, "id": "s"})
        for moment in _times(rng, shape.requesters, span):
            await _at(start, moment)
            requester = await _open(host, port)
            next(opened)
            await requester.request("SUBSCRIBE", {"destination": "/temp-queue/replies", "id": "r"})
            await requester.request(
                "SEND", {"destination": queue, "reply-to": "/temp-queue/replies"}, b"ping"
            )
            await requester.until_received(1)
            await requester.disconnect()
        await responder.until_received(shape.requesters)
        await responder.disconnect()

    async def jobs() -> None:
        queue = f"/queue/{name}.jobs"
        for moment in _times(rng, shape.jobs, span):
            await _at(start, moment)
            producer = await _open(host, port)
            next(opened)
            await producer.request("SEND", {"destination": queue}, b"job")
            await producer.disconnect(receipt=False)
            poller = await _open(host, port)
            next(opened)

            def ack(values: dict[str, str], body: bytes, poller: _Client = poller) -> None:
                poller.send("ACK", {"id": values.get("ack", "")})

            poller.handle = ack
            poller.send(
                "SUBSCRIBE",
                {"destination": queue, "id": "1", "ack": "client", "activemq.prefetchSize": "1"},
            )
            await poller.until_received(1)
            await poller.disconnect()

    async def news() -> None:
        topic = f"/topic/{name}.news"
        durable = {"destination": topic, "id": "1", "activemq.subscriptionName": "news"}
        backlog = 0
        moments = _times(rng, shape.durable_sessions, span)
        for index, moment in enumerate(moments):
            await _at(start, moment)
            subscriber = await _open(host, port, **{"client-id": f"{name}-news"})
            next(opened)
            await subscriber.request("SUBSCRIBE", durable)
            await subscriber.until_received(backlog)
            if index == len(moments) - 1:
                await subscriber.request("UNSUBSCRIBE", {"id": "1", "activemq.subscriptionName": "news"})
            await subscriber.disconnect()
            publisher = await _open(host, port)
            next(opened)
            backlog = rng.randint(1, 3) if index < len(moments) - 1 else 0
            for _ in range(backlog):
                await publisher.request("SEND", {"destination": topic}, b"news")
            await publisher.disconnect()

    await asyncio.gather(orders(), rpc(), jobs(), news())
    return next(opened) - 1


async def drive_fleet(host: str, port: int, connections: int, span: float, tag: str, seed: int = 34) -> int:
    """The fleet (see the module's docstring) against ``host``:``port``: about ``connections``
    connections over ``span`` seconds, names starting with ``tag``; the number opened."""
    applications = max(round(connections / CONNECTIONS_PER_APPLICATION), 1)
    shape = FleetShape.of(connections // applications)
    opened = await asyncio.gather(
        *(_application(host, port, f"{tag}.a{n}", shape, span, seed * 1000 + n) for n in range(applications))
    )
    return sum(opened)


def start_tap(upstream_port: int, record: Path) -> tuple[subprocess.Popen[bytes], int]:
    """``python -m adapter tap --record-bodies`` in front of 127.0.0.1:``upstream_port``."""
    port = free_port()
    log = open(RESULTS / f"tap-{port}.log", "wb")  # noqa: SIM115 - handed to the child
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "adapter",
            "tap",
            "--listen",
            f"127.0.0.1:{port}",
            "--upstream",
            f"127.0.0.1:{upstream_port}",
            "--record",
            str(record),
            "--record-bodies",
            "--http-listen",
            f"127.0.0.1:{free_port()}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()
    deadline = time.monotonic() + 30
    while not port_answers("127.0.0.1", port):
        if process.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the tap did not start on port {port}")
        time.sleep(0.05)
    return process, port


def record_fleet(adapter_port: int, record: Path, connections: int, span: float, tag: str) -> int:
    """The fleet through a tap in front of the adapter, recorded in ``record``; the connections."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    tap, tap_port = start_tap(adapter_port, record)
    try:
        return asyncio.run(drive_fleet("127.0.0.1", tap_port, connections, span, tag))
    finally:
        tap.terminate()
        tap.wait(30)


def recording_span(record: Path) -> float:
    """Seconds from the recording's first record to its last."""
    stamps = []
    for path in record.glob("*.jsonl.gz"):
        with gzip.open(path, "rt") as lines:
            stamps.extend(json.loads(line)["ts"] for line in lines if line.strip())
    return max(stamps) - min(stamps) if stamps else 0.0


def recorded_tag(record: Path) -> str | None:
    """The ``bench-…`` prefix of the fleet's names in a recording this bench made."""
    for path in sorted(record.glob("*.jsonl.gz")):
        with gzip.open(path, "rt") as lines:
            for line in lines:
                found = re.search(r"/queue/(bench-[0-9a-f]+)\.", line)
                if found:
                    return found.group(1)
    return None


def _replay(record: Path, port: int, speed: float, timeout: float, code: Path | None) -> dict[str, object]:
    command = [
        sys.executable,
        "-m",
        "adapter.migrate",
        "replay",
        str(record),
        "--target",
        f"127.0.0.1:{port}",
        "--passcode",
        "guest",
        "--speed",
        str(speed),
        "--json",
        "-",
    ]
    results_file = None
    if code is not None:  # another version's replay (which may not know --json -: it writes a file)
        results_file = Path(tempfile.mkdtemp(prefix="replay-json-")) / "results.json"
        command[-1:] = [str(results_file)]
    began = time.monotonic()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=code)
        output, status = done.stdout, done.returncode
    except subprocess.TimeoutExpired as expired:
        output = expired.stdout.decode() if isinstance(expired.stdout, bytes) else expired.stdout or ""
        status = None
    seconds = time.monotonic() - began
    if results_file is not None:
        results = json.loads(results_file.read_text()) if results_file.exists() else []
        shutil.rmtree(results_file.parent, ignore_errors=True)
    else:
        lines = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
        results = [line for line in lines if "conn" in line]
    return {
        "speed": speed,
        "seconds": round(seconds, 1),
        "status": status,
        "replayed": len(results),
        "with_differences": sum(1 for r in results if r["differences"]),
        "differences": [r for r in results if r["differences"]][:5],
    }


def sweep(tag: str) -> None:
    """Delete the fleet's queues: those named after ``tag``, and its durable subscriptions' (the
    profile names them ``activemq-durable:N:<client-id>:<name>``), which a replay cut short leaves
    with messages the next replay would count."""
    asyncio.run(QueueCleaner(tag).sweep())
    durable = QueueCleaner("activemq-durable:")
    names = [name for name in durable.list_queues() or [] if f":{tag}." in name]
    asyncio.run(durable.delete(names))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.replay_fleet", description=__doc__.split("\n")[0])
    parser.add_argument("--connections", type=int, default=10_000)
    parser.add_argument("--span", type=float, default=600.0, help="seconds the fleet is recorded for")
    parser.add_argument("--speeds", default="1,0", help="replay speeds, comma-separated (default 1,0)")
    parser.add_argument("--recording", type=Path, help="replay this recording instead of making one")
    parser.add_argument("--keep", type=Path, help="keep the recording made in this directory")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds a replay may take at most")
    parser.add_argument(
        "--code",
        type=Path,
        help="replay with the adapter package in this directory (an older commit's, from git archive), "
        "for a before/after comparison",
    )
    args = parser.parse_args(argv)
    raise_own_nofile()
    tag = f"bench-{uuid.uuid4().hex[:8]}"
    adapter = AdapterProcess(label="replay-fleet")
    adapter.start(extra=["--profile", "activemq"])
    scratch = Path(tempfile.mkdtemp(prefix="replay-fleet-"))
    report: dict[str, object] = {}
    try:
        record = args.recording or args.keep or scratch / "rec"
        if args.recording is None:
            began = time.monotonic()
            opened = record_fleet(adapter.port, record, args.connections, args.span, tag)
            report["recorded"] = {"connections": opened, "seconds": round(time.monotonic() - began, 1)}
        else:
            tag = recorded_tag(record) or tag
        span = recording_span(record)
        report["span"] = round(span, 1)
        report["replays"] = []
        for speed in (float(s) for s in args.speeds.split(",")):
            # each replay from the state the recording began with: the fleet's queues empty
            sweep(tag)
            outcome = _replay(record, adapter.port, speed, args.timeout, args.code)
            outcome["ratio_to_span"] = round(float(outcome["seconds"]) / span, 2) if span else None  # type: ignore[arg-type]
            report["replays"].append(outcome)  # type: ignore[attr-defined]
            print(json.dumps(outcome), flush=True)
    finally:
        adapter.stop()
        with contextlib.suppress(Exception):
            sweep(tag)
        shutil.rmtree(scratch, ignore_errors=True)
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
