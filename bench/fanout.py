"""Fan-out of one message to many subscribers of one topic, and what each subscriber costs the
broker: the adapter with ``adapter.shared_subscriptions``, the adapter without it, and the plugin.

    python -m bench.fanout --subscribers 1000 --messages 20

For each target: N STOMP 1.2 clients connect and SUBSCRIBE (``ack:auto``, RECEIPT awaited) to one
``/topic/``; one more client SENDs ``--messages`` messages to it, one at a time, each after every
subscriber got the previous one; the latency of a message to a subscriber is from just before its
SEND is written to the read that brought its MESSAGE.  Reported: p50 / p99 / max over all
(message, subscriber) pairs, the time until the last subscriber had each message (median over
messages), and the broker's memory in the categories a client costs (management API,
``/api/nodes/<node>/memory``: connection, channel and queue processes, the STOMP plugin's, and
their statistics) and the
adapter's RSS after the subscriptions minus before, per subscriber.  The broker is shared with
whatever else runs on the machine: its memory figure is as noisy as that is.

Timings under load say so: this runs next to the broker on the same cores.

``--private-node`` runs every target against a RabbitMQ node of its own (the machine's
RabbitMQ, started as the ``rabbitmq`` user with its own name, ports and directory by
tests/cluster/rabbit.py ``private_node``, as bench/scale.py starts its nodes, with the STOMP and
management plugins), for when the machine's broker cannot take N more connections (its socket
limit, or other users' connections).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import statistics
import time
import urllib.request
import uuid
from typing import Any

from tests.cluster.rabbit import RabbitNode, private_node, remove_private_node

from .services import AdapterProcess, raise_own_nofile
from .stomp import StompClient, connect, frame

MANAGEMENT = "http://127.0.0.1:15672"
NODE_LABEL = "bench-fanout"  # the private node is bench-fanout-<pid>-1@localhost


def start_private_node() -> tuple[RabbitNode, int, str]:
    """Start a node of our own with the STOMP and management plugins, its soft file limit
    raised to 20,000 (runuser's 1024 would allow about 830 sockets); returns (the node, its
    STOMP port, its management URL).  ``remove_private_node`` stops and removes it."""
    node, (stomp_port, management) = private_node(
        NODE_LABEL, extra_ports=2, plugins=("rabbitmq_management", "rabbitmq_stomp"), nofile=20_000
    )
    node.config_lines = (
        f"stomp.listeners.tcp.1 = 127.0.0.1:{stomp_port}",
        f"management.tcp.port = {management}",
        "management.tcp.ip = 127.0.0.1",
    )
    node.write_files()
    node.start()
    node.wait_started()
    return node, stomp_port, f"http://127.0.0.1:{management}"


# the broker's memory categories that grow with connections, channels, queues and consumers (and
# their statistics); the node's total also moves with code loading, atoms and garbage collection
_PER_CLIENT = (
    "connection_readers",
    "connection_writers",
    "connection_channels",
    "connection_other",
    "queue_procs",
    "metrics",
    "mgmt_db",
    "plugins",
)


def broker_memory() -> int:
    """The broker node's memory in bytes in the categories a client costs (``_PER_CLIENT``;
    ``plugins`` holds the STOMP plugin's own connection processes)."""
    auth = base64.b64encode(b"guest:guest").decode()

    def get(path: str) -> Any:
        request = urllib.request.Request(MANAGEMENT + path, headers={"Authorization": f"Basic {auth}"})
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.load(response)

    node = get("/api/nodes")[0]["name"]
    memory = get(f"/api/nodes/{urllib.request.quote(node)}/memory")["memory"]
    return sum(int(memory[name]) for name in _PER_CLIENT)


def rss(pid: int | None) -> int:
    if pid is None:
        return 0
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run_target(
    label: str, port: int, pid: int | None, subscribers: int, messages: int
) -> dict[str, Any]:
    topic = f"/topic/bench-fanout-{uuid.uuid4().hex[:8]}"
    memory_before, rss_before = broker_memory(), rss(pid)
    clients: list[StompClient] = []
    arrivals: list[float] = []
    got = 0
    all_in: asyncio.Future[None] | None = None

    def on_message(_raw: bytes, _body: bytes) -> None:
        nonlocal got
        arrivals.append(time.perf_counter())
        got += 1
        if got == subscribers and all_in is not None and not all_in.done():
            all_in.set_result(None)

    opened = time.perf_counter()
    for start in range(0, subscribers, 50):
        batch = await asyncio.gather(
            *(connect("127.0.0.1", port, f"{label}-{i}") for i in range(start, min(start + 50, subscribers)))
        )
        await asyncio.gather(
            *(c.request("SUBSCRIBE", {"destination": topic, "id": "s", "ack": "auto"}) for c in batch)
        )
        for client in batch:
            client.on_message = on_message
        clients.extend(batch)
    subscribe_seconds = time.perf_counter() - opened
    await asyncio.sleep(2)  # let the broker settle before reading its memory
    memory_after, rss_after = broker_memory(), rss(pid)
    publisher = await connect("127.0.0.1", port, f"{label}-publisher")
    latencies: list[float] = []
    lasts: list[float] = []
    loop = asyncio.get_running_loop()
    for n in range(messages):
        got = 0
        arrivals.clear()
        all_in = loop.create_future()
        sent = time.perf_counter()
        publisher.write(frame("SEND", {"destination": topic}, f"m{n}".encode()))
        await asyncio.wait_for(all_in, 60)
        latencies += [t - sent for t in arrivals]
        lasts.append(max(arrivals) - sent)
    await publisher.disconnect()
    await asyncio.gather(*(c.disconnect() for c in clients))
    return {
        "target": label,
        "subscribers": subscribers,
        "subscribe_s": subscribe_seconds,
        "p50_ms": quantile(latencies, 0.5) * 1000,
        "p99_ms": quantile(latencies, 0.99) * 1000,
        "max_ms": max(latencies) * 1000,
        "last_median_ms": statistics.median(lasts) * 1000,
        "broker_kb_per_sub": (memory_after - memory_before) / subscribers / 1024,
        "adapter_kb_per_sub": (rss_after - rss_before) / subscribers / 1024 if pid else None,
    }


async def main_async(args: argparse.Namespace) -> int:
    global MANAGEMENT
    raise_own_nofile()
    node = None
    if args.private_node:
        node, args.plugin_port, MANAGEMENT = start_private_node()
        os.environ["STOMP_ADAPTER_AMQP_URL"] = node.url  # the adapters the bench starts
        print(f"private node {node.name}: AMQP {node.amqp_port}, STOMP {args.plugin_port}, {MANAGEMENT}")
    try:
        return await _run(args)
    finally:
        if node is not None:
            remove_private_node(node)


async def _run(args: argparse.Namespace) -> int:
    rows = []
    for target in args.targets:
        if target == "plugin":
            rows.append(await run_target("plugin", args.plugin_port, None, args.subscribers, args.messages))
            continue
        extra = ["--shared-subscriptions"] if target == "shared" else []
        adapter = AdapterProcess(label=f"fanout-{target}")
        adapter.start(extra=extra)
        try:
            rows.append(await run_target(target, adapter.port, adapter.pid, args.subscribers, args.messages))
        finally:
            adapter.stop()
    print(
        f"{'target':<8} {'N':>6} {'subscribe s':>11} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} "
        f"{'last ms':>8} {'broker KB/sub':>13} {'adapter KB/sub':>14}"
    )
    for row in rows:
        adapter_kb = f"{row['adapter_kb_per_sub']:.1f}" if row["adapter_kb_per_sub"] is not None else "-"
        print(
            f"{row['target']:<8} {row['subscribers']:>6} {row['subscribe_s']:>11.2f} {row['p50_ms']:>8.1f} "
            f"{row['p99_ms']:>8.1f} {row['max_ms']:>8.1f} {row['last_median_ms']:>8.1f} "
            f"{row['broker_kb_per_sub']:>13.1f} {adapter_kb:>14}"
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fanout", description=__doc__.split("\n\n")[0])
    parser.add_argument("--subscribers", type=int, default=1000)
    parser.add_argument("--messages", type=int, default=20)
    parser.add_argument("--plugin-port", type=int, default=61613)
    parser.add_argument("--private-node", action="store_true", help="run against a RabbitMQ node of its own")
    parser.add_argument(
        "--targets", nargs="+", default=["shared", "plain", "plugin"], choices=["shared", "plain", "plugin"]
    )
    return asyncio.run(main_async(parser.parse_args(argv)))


if __name__ == "__main__":
    raise SystemExit(main())
