"""The benchmark scenarios.  Each runs once against one side (adapter or plugin) and returns metrics.

Every measurement has the same shape: set up connections and subscriptions (not timed), start the
CPU meter, run the load for ``--duration`` seconds (or until ``--messages``), then *drain*: wait until
everything sent has arrived (deliveries, receipts, replies), bounded by ``--drain-timeout``.  Rates are
counted items over the time from the first send to the last arrival, so a side that queues work up
cannot look faster than it delivers.  A measurement that does not drain in time is reported as
incomplete with its counts, not silently.

Throughput scenarios bound the messages in flight (sent but not yet delivered) to ``--window``, so the
broker's queue stays short and both sides are measured in the same steady state.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ssl
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from . import procstat
from .stomp import StompClient, StompError, connect, frame, header


class BenchFailure(Exception):
    """The measurement could not run to the end (ERROR frame, lost connection, timeout ...)."""


@dataclass
class Config:
    host: str = "127.0.0.1"
    duration: float = 5.0
    messages: int | None = None
    size: int = 1024
    producers: int = 2
    window: int = 2000
    drain_timeout: float = 15.0
    rates: tuple[int, ...] = (100, 1000)
    connect_workers: int = 4
    idle_connections: int = 500
    idle_concurrency: int = 50


@dataclass
class Side:
    name: str  # "adapter" or "plugin"
    port: int
    tls: ssl.SSLContext | None = None  # connect over TLS (bench/tls.py)
    websocket: str | None = None  # connect over WebSocket at this path (bench/web.py)
    compress: bool = False  # over WebSocket: offer permessage-deflate, as browsers do


@dataclass
class Outcome:
    metrics: dict[str, float] = field(default_factory=dict)
    counts: dict[str, Any] = field(default_factory=dict)
    cpu: dict[str, float | None] = field(default_factory=dict)
    error: str | None = None
    notes: list[str] = field(default_factory=list)


class Run:
    """One measurement against one side: its connections, failure state, waits and CPU meter."""

    def __init__(self, cfg: Config, side: Side, pids: dict[str, int | None], queue_prefix: str) -> None:
        self.cfg = cfg
        self.side = side
        self.loop = asyncio.get_running_loop()
        self.meter = procstat.CpuMeter(pids)
        self.pids = pids
        self.queue_prefix = queue_prefix
        self.queues: list[str] = []
        self.clients: list[StompClient] = []
        self.error: str | None = None
        self._changed: asyncio.Future[None] | None = None
        self.outcome = Outcome()

    # ------------------------------------------------------------------ plumbing
    def queue(self, tag: str) -> str:
        name = f"{self.queue_prefix}{tag}"
        self.queues.append(name)
        return name

    async def client(self, name: str) -> StompClient:
        client = await connect(
            self.cfg.host,
            self.side.port,
            f"{self.side.name}/{name}",
            tls=self.side.tls,
            websocket=self.side.websocket,
            compress=self.side.compress,
        )
        client.on_failure = self.fail
        client.on_chunk = self.notify
        self.clients.append(client)
        return client

    def fail(self, text: str) -> None:
        if self.error is None:
            self.error = text
        self.notify()

    def check(self) -> None:
        if self.error is not None:
            raise BenchFailure(self.error)

    def notify(self) -> None:
        changed, self._changed = self._changed, None
        if changed is not None and not changed.done():
            changed.set_result(None)

    async def wait_until(self, condition: Callable[[], bool], deadline: float) -> bool:
        """Wait until ``condition()`` holds (checked after every read), or until ``deadline``."""
        loop = self.loop
        while not condition():
            self.check()
            if loop.time() >= deadline:
                return condition()
            if self._changed is None:
                self._changed = loop.create_future()
            # a timer per wait: if it fires a little early (timer resolution), the next pass arms another
            timer = loop.call_at(deadline, self.notify)
            try:
                await self._changed
            finally:
                timer.cancel()
        return True

    def start_meter(self) -> None:
        self.meter.start()

    def stop_meter(self) -> None:
        self.outcome.cpu = self.meter.stop()

    async def close(self) -> None:
        clients, self.clients = self.clients, []
        for client in clients:
            client.on_failure = None
            client.on_message = None
        await asyncio.gather(*(c.disconnect(5.0) for c in clients), return_exceptions=True)
        for client in clients:
            client.abort()

    # ------------------------------------------------------------------ shared pieces
    def send_frame(self, destination: str, extra: str = "") -> bytes:
        body = b"x" * self.cfg.size
        head = f"SEND\ndestination:{destination}\n{extra}content-length:{len(body)}\n\n"
        return head.encode() + body + b"\0"

    async def produce(
        self,
        client: StompClient,
        payload: bytes | Callable[[], bytes],
        in_flight: Callable[[], int],
        stop_at: float,
        quota: int | None,
        counter: list[int],
    ) -> None:
        """Write ``payload`` in batches until ``stop_at``/``quota``, keeping in_flight() <= window
        (a callable ``payload`` makes each frame when it is written: a send time in it)."""
        window = self.cfg.window
        size = len(payload) if isinstance(payload, bytes) else self.cfg.size
        batch = max(1, 65536 // size)
        low = window // 2
        loop = self.loop
        while (quota is None or quota > 0) and loop.time() < stop_at:
            self.check()
            credit = window - in_flight()
            if credit <= 0:
                await self.wait_until(lambda: in_flight() <= low, stop_at)
                continue
            n = min(batch, credit) if quota is None else min(batch, credit, quota)
            client.write(payload * n if isinstance(payload, bytes) else b"".join(payload() for _ in range(n)))
            counter[0] += n
            if quota is not None:
                quota -= n
            if client.paused:
                try:
                    async with asyncio.timeout(max(0.01, stop_at - loop.time())):
                        await client.drain()
                except TimeoutError:
                    break
            else:
                await asyncio.sleep(0)

    def quota(self, share: int = 1) -> int | None:
        if self.cfg.messages is None:
            return None
        return max(1, self.cfg.messages // share)

    async def drain(self, condition: Callable[[], bool], what: str) -> bool:
        drained = await self.wait_until(condition, self.loop.time() + self.cfg.drain_timeout)
        if not drained:
            self.outcome.notes.append(f"not drained within {self.cfg.drain_timeout:g} s: {what}")
        return drained


# ====================================================================== scenarios
async def queue_scenario(run: Run, metric: str = "queue", latency: bool = False) -> None:
    """N producers -> one /queue (non-persistent), one auto-ack consumer: delivered msg/s; with
    ``latency``, each SEND carries its send time and the p50/p99 from send to MESSAGE are
    reported too (``<metric>-p50``, ``<metric>-p99``, ms)."""
    cfg = run.cfg
    destination = "/queue/" + run.queue("q")
    consumer = await run.client("consumer")
    await consumer.request("SUBSCRIBE", {"destination": destination, "id": "0", "ack": "auto"})
    producers = [await run.client(f"producer{i}") for i in range(cfg.producers)]
    payload: bytes | Callable[[], bytes] = run.send_frame(destination)
    latencies: list[float] = []
    if latency:
        body = b"x" * cfg.size
        head = f"SEND\ndestination:{destination}\ncontent-length:{len(body)}\nbench-sent:".encode()
        tail = b"\n\n" + body + b"\0"
        now = time.monotonic  # uvloop's loop.time() has millisecond steps

        def stamped() -> bytes:
            return head + repr(now()).encode() + tail

        def on_message(raw: bytes, _body: bytes) -> None:
            stamp = header(raw, b"bench-sent")
            if stamp is not None:
                latencies.append(now() - float(stamp))

        payload = stamped
        consumer.on_message = on_message
    sent = [0]

    def in_flight() -> int:
        return sent[0] - consumer.messages

    loop = run.loop
    run.start_meter()
    t0 = loop.time()
    stop_at = t0 + cfg.duration
    await asyncio.gather(
        *(run.produce(p, payload, in_flight, stop_at, run.quota(cfg.producers), sent) for p in producers)
    )
    drained = await run.drain(
        lambda: consumer.messages >= sent[0], f"delivered {consumer.messages} of {sent[0]}"
    )
    elapsed = loop.time() - t0
    run.stop_meter()
    run.outcome.counts.update(sent=sent[0], delivered=consumer.messages, drained=drained, seconds=elapsed)
    run.outcome.metrics[metric] = consumer.messages / elapsed
    if latency:
        run.outcome.metrics[f"{metric}-p50"] = percentile(latencies, 50) * 1000
        run.outcome.metrics[f"{metric}-p99"] = percentile(latencies, 99) * 1000


async def persistent_scenario(run: Run, metric: str = "persistent") -> None:
    """One producer, SEND persistent:true with a receipt on every message, 100 receipts outstanding
    (fewer for large bodies: at most 32 MiB in flight)."""
    cfg = run.cfg
    window = min(100, max(4, _LARGE_IN_FLIGHT // cfg.size))
    destination = "/queue/" + run.queue("p")
    producer = await run.client("producer")
    body = b"x" * cfg.size
    head = f"SEND\ndestination:{destination}\npersistent:true\ncontent-length:{len(body)}\nreceipt:".encode()
    tail = b"\n\n" + body + b"\0"
    receipts = [0]

    def on_receipt(_rid: bytes) -> None:
        receipts[0] += 1

    producer.on_receipt = on_receipt
    sent = [0]
    quota = run.quota()
    loop = run.loop

    def window_free() -> bool:
        return sent[0] - receipts[0] < window

    run.start_meter()
    t0 = loop.time()
    stop_at = t0 + cfg.duration
    while loop.time() < stop_at and (quota is None or sent[0] < quota):
        run.check()
        free = window - (sent[0] - receipts[0])
        if free <= 0:
            await run.wait_until(window_free, stop_at)
            continue
        if quota is not None:
            free = min(free, quota - sent[0])
        first = sent[0]
        producer.write(b"".join(head + str(first + k).encode() + tail for k in range(free)))
        sent[0] += free
        await run.wait_until(window_free, stop_at)
    final = sent[0]
    drained = await run.drain(lambda: receipts[0] >= final, f"{receipts[0]} receipts of {final}")
    elapsed = loop.time() - t0
    run.stop_meter()
    run.outcome.counts.update(sent=final, receipted=receipts[0], drained=drained, seconds=elapsed)
    run.outcome.metrics[metric] = receipts[0] / elapsed


async def client_individual_scenario(run: Run) -> None:
    """N producers -> /queue; consumer ack:client-individual, prefetch-count 100, ACKs each message."""
    cfg = run.cfg
    destination = "/queue/" + run.queue("ci")
    consumer = await run.client("consumer")
    acked = [0]

    def on_message(raw: bytes, _body: bytes) -> None:
        ack = header(raw, b"ack")
        if ack is None:
            run.fail("MESSAGE without an ack header in client-individual mode")
            return
        consumer.send(b"ACK\nid:" + ack + b"\n\n\0")
        acked[0] += 1

    consumer.on_message = on_message
    await consumer.request(
        "SUBSCRIBE",
        {"destination": destination, "id": "0", "ack": "client-individual", "prefetch-count": "100"},
    )
    producers = [await run.client(f"producer{i}") for i in range(cfg.producers)]
    payload = run.send_frame(destination)
    sent = [0]

    def in_flight() -> int:
        return sent[0] - acked[0]

    loop = run.loop
    run.start_meter()
    t0 = loop.time()
    stop_at = t0 + cfg.duration
    await asyncio.gather(
        *(run.produce(p, payload, in_flight, stop_at, run.quota(cfg.producers), sent) for p in producers)
    )
    drained = await run.drain(lambda: acked[0] >= sent[0], f"acked {acked[0]} of {sent[0]}")
    elapsed = loop.time() - t0
    run.stop_meter()
    run.outcome.counts.update(sent=sent[0], acked=acked[0], drained=drained, seconds=elapsed)
    run.outcome.metrics["client-individual"] = acked[0] / elapsed


async def topic_scenario(run: Run, subscribers: int = 4, selectors: bool = False) -> None:
    """One producer -> /topic/<name>, four subscribers (one connection each): deliveries/s in total,
    and messages published/s.

    With ``selectors`` (the activemq profile, bench/activemq.py): messages alternate the header
    ``parity:0`` / ``parity:1`` and subscriber i has the selector ``parity = <i mod 2>``, so each
    selector matches half the messages and every message is tested by all four."""
    cfg = run.cfg
    destination = f"/topic/{run.queue_prefix}t"
    subs = [await run.client(f"sub{i}") for i in range(subscribers)]
    for i, sub in enumerate(subs):
        headers = {"destination": destination, "id": "0", "ack": "auto"}
        if selectors:
            headers["selector"] = f"parity = {i % 2}"
        await sub.request("SUBSCRIBE", headers)
    producer = await run.client("producer")
    # with selectors a unit is two messages (parity 0 and 1), of which each subscriber gets one
    per_unit = 2 if selectors else 1
    if selectors:
        payload = run.send_frame(destination, "parity:0\n") + run.send_frame(destination, "parity:1\n")
    else:
        payload = run.send_frame(destination)
    sent = [0]

    def in_flight() -> int:
        return sent[0] - min(s.messages for s in subs)

    def total() -> int:
        return sum(s.messages for s in subs)

    loop = run.loop
    run.start_meter()
    t0 = loop.time()
    await run.produce(producer, payload, in_flight, t0 + cfg.duration, run.quota(per_unit), sent)
    expected = sent[0] * subscribers
    drained = await run.drain(lambda: total() >= expected, f"delivered {total()} of {expected}")
    elapsed = loop.time() - t0
    run.stop_meter()
    published = sent[0] * per_unit
    run.outcome.counts.update(sent=published, delivered=total(), drained=drained, seconds=elapsed)
    name = "topic-selector" if selectors else "topic"
    run.outcome.metrics[name] = total() / elapsed
    run.outcome.metrics[f"{name}-published"] = published / elapsed


async def topic_selector_scenario(run: Run) -> None:
    await topic_scenario(run, selectors=True)


topic_selector_scenario.__doc__ = (
    "topic with a selector per subscriber matching half the messages (activemq profile only)"
)


async def queue_consumers_scenario(run: Run, selectors: bool = False) -> None:
    """N producers -> one /queue, two auto-ack consumers (one connection each): delivered msg/s.

    Messages alternate the header ``parity:0`` / ``parity:1``.  With ``selectors`` (the activemq
    profile, bench/activemq.py) consumer i has the selector ``parity = i``, so each gets exactly
    half, and the half the broker hands to the other one's channel is routed across by the
    queue's dispatcher (adapter/dispatch/rules.py); without, the broker shares them out."""
    cfg = run.cfg
    destination = "/queue/" + run.queue("qs" if selectors else "q2")
    consumers = [await run.client(f"consumer{i}") for i in range(2)]
    for i, consumer in enumerate(consumers):
        headers = {"destination": destination, "id": "0", "ack": "auto"}
        if selectors:
            headers["selector"] = f"parity = {i}"
        await consumer.request("SUBSCRIBE", headers)
    producers = [await run.client(f"producer{i}") for i in range(cfg.producers)]
    payload = run.send_frame(destination, "parity:0\n") + run.send_frame(destination, "parity:1\n")
    sent = [0]

    def delivered() -> int:
        return sum(c.messages for c in consumers)

    def in_flight() -> int:
        return 2 * sent[0] - delivered()

    loop = run.loop
    run.start_meter()
    t0 = loop.time()
    stop_at = t0 + cfg.duration
    await asyncio.gather(
        *(run.produce(p, payload, in_flight, stop_at, run.quota(2 * cfg.producers), sent) for p in producers)
    )
    expected = 2 * sent[0]
    drained = await run.drain(lambda: delivered() >= expected, f"delivered {delivered()} of {expected}")
    elapsed = loop.time() - t0
    run.stop_meter()
    if selectors and any(c.messages != sent[0] for c in consumers):
        run.fail(f"each selector consumer should get {sent[0]}: {[c.messages for c in consumers]}")
    run.outcome.counts.update(sent=expected, delivered=delivered(), drained=drained, seconds=elapsed)
    run.outcome.metrics["queue-selector" if selectors else "queue-2consumers"] = delivered() / elapsed


async def queue_selector_scenario(run: Run) -> None:
    await queue_consumers_scenario(run, selectors=True)


queue_consumers_scenario.__doc__ = "queue with two competing consumers (the baseline of queue-selector)"
queue_selector_scenario.__doc__ = (
    "queue with two competing consumers whose selectors match half the messages each (activemq only)"
)


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), int(-(-p * len(ordered) // 100))))
    return ordered[rank - 1]


async def request_reply_scenario(run: Run) -> None:
    """Requests to a /queue with reply-to:/temp-queue/...; a STOMP responder answers to reply-to.

    Latency is measured from the *intended* send time at fixed rates (open loop, so a stall is not
    hidden by sending less), and from the actual send time with one request outstanding (saturation).
    """
    cfg = run.cfg
    destination = "/queue/" + run.queue("rpc")
    responder = await run.client("responder")
    requester = await run.client("requester")
    body = b"x" * cfg.size
    length = str(len(body)).encode()

    def respond(raw: bytes, request_body: bytes) -> None:
        reply_to = header(raw, b"reply-to")
        cid = header(raw, b"correlation-id")
        if reply_to is None or cid is None:
            run.fail(f"request without reply-to/correlation-id: {raw[:200]!r}")
            return
        responder.send(
            b"SEND\ndestination:"
            + reply_to
            + b"\ncorrelation-id:"
            + cid
            + b"\ncontent-length:"
            + str(len(request_body)).encode()
            + b"\n\n"
            + request_body
            + b"\0"
        )

    responder.on_message = respond
    await responder.request("SUBSCRIBE", {"destination": destination, "id": "0", "ack": "auto"})

    head = f"SEND\ndestination:{destination}\nreply-to:/temp-queue/bench\ncorrelation-id:".encode()
    tail = b"\ncontent-length:" + length + b"\n\n" + body + b"\0"

    def request(cid: int) -> bytes:
        return head + str(cid).encode() + tail

    intended: dict[int, float] = {}
    latencies: list[float] = []
    closed_loop = {"on": False, "stop": 0.0, "next": 0}
    clock = time.perf_counter

    def on_reply(raw: bytes, _body: bytes) -> None:
        now = clock()
        cid_raw = header(raw, b"correlation-id")
        start = intended.pop(int(cid_raw), None) if cid_raw is not None else None
        if start is None:
            run.fail(f"unexpected reply: {raw[:200]!r}")
            return
        latencies.append(now - start)
        if (
            closed_loop["on"]
            and now < closed_loop["stop"]
            and (cfg.messages is None or len(latencies) < cfg.messages)
        ):
            cid = closed_loop["next"]
            closed_loop["next"] = cid + 1
            intended[cid] = clock()
            requester.write(request(cid))

    requester.on_message = on_reply
    loop = run.loop
    cid = 0

    # warm-up: the first reply-to declares the temp queue and its consumer; not measured
    for _ in range(20):
        intended[cid] = clock()
        requester.write(request(cid))
        cid += 1
        if not await run.wait_until(lambda: not intended, loop.time() + 10):
            raise BenchFailure("request/reply warm-up: no reply within 10 s")
    latencies.clear()

    counts: dict[str, Any] = {}
    run.start_meter()
    t_all = loop.time()
    for rate in cfg.rates:
        total = max(1, int(rate * cfg.duration))
        if cfg.messages is not None:
            total = min(total, cfg.messages)
        latencies.clear()
        start = clock() + 0.005
        i = 0
        while i < total:
            run.check()
            due = min(total, int((clock() - start) * rate) + 1)
            if due > i:
                parts = []
                for k in range(i, due):
                    intended[cid + k] = start + k / rate
                    parts.append(request(cid + k))
                requester.write(b"".join(parts))
                i = due
            await asyncio.sleep(max(0.0, start + i / rate - clock()))
        cid += total
        drained = await run.drain(
            lambda: not intended, f"{len(intended)} of {total} replies missing at {rate}/s"
        )
        name = f"rr{rate}"
        run.outcome.metrics[f"{name}-p50"] = percentile(latencies, 50) * 1000
        run.outcome.metrics[f"{name}-p99"] = percentile(latencies, 99) * 1000
        counts[name] = {"requests": total, "replies": len(latencies), "drained": drained}
        intended.clear()

    # saturation: one request outstanding, the next sent from the reply's callback
    latencies.clear()
    closed_loop.update(on=True, stop=clock() + cfg.duration, next=cid + 1)
    t_sat = loop.time()
    intended[cid] = clock()
    requester.write(request(cid))
    await run.wait_until(lambda: not intended, loop.time() + cfg.duration + 10)
    closed_loop["on"] = False
    drained = await run.drain(lambda: not intended, "the last saturation reply is missing")
    sat_elapsed = loop.time() - t_sat
    run.stop_meter()
    run.outcome.metrics["rrsat-p50"] = percentile(latencies, 50) * 1000
    run.outcome.metrics["rrsat-p99"] = percentile(latencies, 99) * 1000
    run.outcome.metrics["rrsat-rate"] = len(latencies) / sat_elapsed
    counts["rrsat"] = {"replies": len(latencies), "drained": drained, "seconds": sat_elapsed}
    counts["seconds"] = loop.time() - t_all
    counts["replies"] = sum(c["replies"] for c in counts.values() if isinstance(c, dict))
    run.outcome.counts.update(counts)


async def connect_scenario(run: Run) -> None:
    """CONNECT + DISCONNECT (with receipt) cycles, sequential on each of 4 concurrent workers."""
    cfg = run.cfg
    loop = run.loop
    cycles = [0]
    latencies: list[float] = []

    async def worker(n: int, stop_at: float) -> None:
        while loop.time() < stop_at and (cfg.messages is None or cycles[0] < cfg.messages):
            started = time.perf_counter()
            client = await connect(
                cfg.host,
                run.side.port,
                f"{run.side.name}/cycle{n}",
                timeout=10,
                tls=run.side.tls,
                websocket=run.side.websocket,
                compress=run.side.compress,
            )
            client.expect_close = True  # the server closes after the DISCONNECT receipt
            if run.side.websocket:
                # rabbitmq_web_stomp closes before the DISCONNECT's RECEIPT goes out
                # (docs/compatibility.md, W1): over WebSocket the server's close ends the cycle
                client.send(frame("DISCONNECT", {"receipt": "bye"}))
                try:
                    async with asyncio.timeout(10):
                        await client.closed
                except TimeoutError:
                    raise StompError("no close within 10 s of DISCONNECT") from None
            else:
                await client.request("DISCONNECT", {}, timeout=10)
            client.abort()
            latencies.append(time.perf_counter() - started)
            cycles[0] += 1

    run.start_meter()
    t0 = loop.time()
    stop_at = t0 + cfg.duration
    try:
        await asyncio.gather(*(worker(n, stop_at) for n in range(cfg.connect_workers)))
    except (StompError, OSError) as error:
        raise BenchFailure(f"connect/disconnect cycle failed after {cycles[0]} cycles: {error}") from None
    elapsed = loop.time() - t0
    run.stop_meter()
    run.outcome.counts.update(cycles=cycles[0], seconds=elapsed)
    run.outcome.metrics["connect"] = cycles[0] / elapsed
    run.outcome.metrics["connect-p50"] = percentile(latencies, 50) * 1000
    run.outcome.metrics["connect-p99"] = percentile(latencies, 99) * 1000


async def idle_scenario(run: Run) -> None:
    """500 connected, idle clients: RSS growth of the adapter process per connection."""
    cfg = run.cfg
    pid = run.pids.get("adapter")
    if pid is None:
        raise BenchFailure("the adapter's pid is unknown (is it running on this machine?)")
    broker = run.pids.get("broker")
    # warm-up: the first connections import and allocate what every later one shares
    for i in range(5):
        client = await connect(
            cfg.host, run.side.port, f"warmup{i}", tls=run.side.tls, websocket=run.side.websocket
        )
        await client.disconnect()
    await asyncio.sleep(1.0)
    base = procstat.rss_kb(pid)
    broker_base = procstat.rss_kb(broker) if broker else None
    semaphore = asyncio.Semaphore(cfg.idle_concurrency)

    async def open_one(i: int) -> StompClient:
        async with semaphore:
            return await run.client(f"idle{i}")

    run.start_meter()
    t0 = run.loop.time()
    try:
        await asyncio.gather(*(open_one(i) for i in range(cfg.idle_connections)))
    except (StompError, OSError) as error:
        raise BenchFailure(
            f"opened {len(run.clients)} of {cfg.idle_connections} connections: {error}"
        ) from None
    opened = run.loop.time() - t0
    await asyncio.sleep(2.0)  # idle: let anything lazy settle
    run.check()
    after = procstat.rss_kb(pid)
    broker_after = procstat.rss_kb(broker) if broker else None
    run.stop_meter()
    n = cfg.idle_connections
    assert base is not None and after is not None
    run.outcome.metrics["idle"] = (after - base) / n
    if broker_base is not None and broker_after is not None:
        run.outcome.metrics["idle-broker"] = (broker_after - broker_base) / n
    run.outcome.metrics["idle-open"] = n / opened
    await run.close()
    await asyncio.sleep(1.0)
    released = procstat.rss_kb(pid)
    run.outcome.counts.update(
        connections=n,
        rss_before_kb=base,
        rss_connected_kb=after,
        rss_after_close_kb=released,
        open_seconds=opened,
    )


Scenario = Callable[[Run], Coroutine[Any, Any, None]]


@dataclass(frozen=True)
class ScenarioInfo:
    name: str
    run: Scenario
    sides: tuple[str, ...]  # which sides it runs against
    budget: Callable[[Config], float]  # upper bound of the measurement's wall time (s)


def _throughput_budget(cfg: Config) -> float:
    return 30 + cfg.duration + cfg.drain_timeout


# Large-message scenarios bound the bytes in flight rather than the messages.
_LARGE_IN_FLIGHT = 32 * 1024 * 1024
LARGE_SIZES = {"64k": 64 * 1024, "1m": 1024 * 1024}


def _with_body_size(
    base: Callable[..., Coroutine[Any, Any, None]], size: int, metric: str, **options: bool
) -> Scenario:
    """``base`` with ``size``-byte bodies (whatever --size says) and a window of at most 32 MiB."""

    async def scenario(run: Run) -> None:
        window = max(4, min(run.cfg.window, _LARGE_IN_FLIGHT // size))
        run.cfg = dataclasses.replace(run.cfg, size=size, window=window)
        await base(run, metric=metric, **options)

    scenario.__doc__ = f"{base.__doc__} With {size}-byte bodies."
    return scenario


SCENARIOS: dict[str, ScenarioInfo] = {
    info.name: info
    for info in (
        ScenarioInfo("queue", queue_scenario, ("adapter", "plugin"), _throughput_budget),
        ScenarioInfo("persistent", persistent_scenario, ("adapter", "plugin"), _throughput_budget),
        ScenarioInfo(
            "client-individual", client_individual_scenario, ("adapter", "plugin"), _throughput_budget
        ),
        ScenarioInfo("topic", topic_scenario, ("adapter", "plugin"), _throughput_budget),
        ScenarioInfo("topic-selector", topic_selector_scenario, ("adapter",), _throughput_budget),
        ScenarioInfo("queue-2consumers", queue_consumers_scenario, ("adapter",), _throughput_budget),
        ScenarioInfo("queue-selector", queue_selector_scenario, ("adapter",), _throughput_budget),
        ScenarioInfo(
            "reqrep",
            request_reply_scenario,
            ("adapter", "plugin"),
            lambda cfg: 60 + (len(cfg.rates) + 1) * (cfg.duration + cfg.drain_timeout),
        ),
        ScenarioInfo("connect", connect_scenario, ("adapter", "plugin"), lambda cfg: 30 + cfg.duration),
        ScenarioInfo("idle", idle_scenario, ("adapter",), lambda cfg: 120),
        *(
            ScenarioInfo(
                f"{kind}-{label}",
                _with_body_size(base, size, f"{kind}-{label}", **options),
                ("adapter", "plugin"),
                _throughput_budget,
            )
            for label, size in LARGE_SIZES.items()
            for kind, base, options in (
                ("queue", queue_scenario, {"latency": True}),
                ("persistent", persistent_scenario, {}),
            )
        ),
    )
}
