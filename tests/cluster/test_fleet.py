"""A fleet of two adapter processes behind Debian's HAProxy, in front of the three-node cluster:
one adapter is killed (SIGKILL) while receipted producers send through the balancer; they
reconnect through HAProxy to the other adapter, and every message whose RECEIPT arrived is in
the queue afterwards (0 lost)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.clients import (
    ReceiptedProducer,
    declare_quorum_queue,
    delete_queue,
    drain,
    ini_text,
    wait_until,
)
from tests.support import free_port, run_adapter_with_config, unique, wait_for_port

pytestmark = pytest.mark.timeout(300)  # the first test also starts the cluster (about 20 s)

PRODUCERS = 4  # round robin: two on each adapter
BEFORE_KILL = 300
AFTER_KILL = 100


@contextlib.contextmanager
def haproxy(directory: Path, port: int, adapters: list[int]) -> Iterator[subprocess.Popen[bytes]]:
    """HAProxy (mode tcp) on 127.0.0.1:``port``, round robin over the adapters' STOMP ports,
    with health checks and redispatch, so a connection meant for a dead adapter goes to a live
    one."""
    binary = shutil.which("haproxy")
    assert binary, "haproxy is not installed: .ci/run installs Debian's haproxy"
    servers = "".join(
        f"  server adapter{i} 127.0.0.1:{p} check inter 500ms fall 1 rise 2\n" for i, p in enumerate(adapters)
    )
    config = directory / "haproxy.cfg"
    config.write_text(
        "defaults\n  mode tcp\n  timeout connect 5s\n  timeout client 60s\n  timeout server 60s\n"
        "  retries 3\n  option redispatch\n"
        f"frontend stomp\n  bind 127.0.0.1:{port}\n  default_backend adapters\n"
        f"backend adapters\n  balance roundrobin\n{servers}"
    )
    with (directory / "haproxy.log").open("wb") as log:
        process = subprocess.Popen([binary, "-db", "-f", str(config)], stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for_port(port, process, "haproxy", directory / "haproxy.log")
        yield process
    finally:
        process.terminate()
        process.wait(10)


@pytest.fixture
def fleet(cluster, adapter_settings, tmp_path: Path) -> Iterator[tuple[list[subprocess.Popen[bytes]], int]]:
    """Two adapter processes (``python -m adapter``, the variant's settings in their ini file,
    all three nodes in ``--amqp-url``) behind HAProxy: the processes and the balancer's port."""
    processes: list[subprocess.Popen[bytes]] = []
    ports = []
    try:
        for name in ("a1", "a2"):
            directory = tmp_path / name
            directory.mkdir()
            port = free_port()
            process, log = run_adapter_with_config(directory, cluster.urls, ini_text(adapter_settings), port)
            processes.append(process)
            wait_for_port(port, process, f"adapter {name}", log)
            ports.append(port)
        balancer = free_port()
        with haproxy(tmp_path, balancer, ports):
            yield processes, balancer
    finally:
        for process in processes:
            if process.poll() is None:
                process.terminate()
            process.wait(30)


def test_one_adapter_of_two_behind_haproxy_killed_loses_no_receipted_message(cluster, fleet):
    processes, balancer = fleet
    node = cluster.nodes[0]
    queue = unique("cluster-fleet")
    declare_quorum_queue(node.url, queue)
    producers = [ReceiptedProducer(f"p{i}", balancer, f"/amq/queue/{queue}") for i in range(PRODUCERS)]
    try:
        for producer in producers:
            producer.start()
        wait_until(lambda: sum(p.count for p in producers) >= BEFORE_KILL, f"{BEFORE_KILL} receipts")
        killed_at = time.monotonic()
        os.kill(processes[0].pid, signal.SIGKILL)
        processes[0].wait(10)
        wait_until(
            lambda: all(p.receipts_since(killed_at) >= AFTER_KILL for p in producers),
            f"{AFTER_KILL} receipts for every producer after the kill",
            timeout=120,
        )
    finally:
        for producer in producers:
            producer.stop()

    assert processes[1].poll() is None, "the other adapter died too"
    on_broker = drain(node.url, queue)
    receipted = set().union(*(p.receipted for p in producers))
    lost = sorted(receipted - set(on_broker))
    duplicates = sum(n - 1 for n in on_broker.values() if n > 1)
    print(
        f"\nadapter fleet: {len(receipted)} receipted, {sum(on_broker.values())} on the broker, "
        f"{len(lost)} lost, {duplicates} duplicates"
    )
    for p in producers:
        errors = Counter(o.error for o in p.outages)
        back = [f"{o.connected - o.noticed:.3f} s" for o in p.outages if o.connected is not None]
        wait = p.longest_wait_after(killed_at)
        print(
            f"  {p.name}: longest wait for a RECEIPT after the kill {wait:.2f} s; "
            f"lost its connection {dict(errors)}, CONNECTED again through HAProxy after {back}"
        )
    assert lost == [], f"receipted but not in the queue: {lost[:10]}"
    # the killed adapter's clients (half of them) lost their connection, without a STOMP frame
    # (the process was gone), and came back; the others were not touched
    cut_off = [p for p in producers if p.outages]
    assert len(cut_off) == PRODUCERS // 2, [p.outages for p in producers]
    ends = {o.error for p in cut_off for o in p.outages}
    assert all(e == "closed" or e.startswith("socket error") for e in ends), ends
    delete_queue(node.url, queue)
