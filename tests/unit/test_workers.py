"""The pure parts of --workers: the restart back-off, the sum of the workers' metrics (with the
counters of dead workers kept), the workers setting, and the slot sockets sharing one port."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from adapter.config import ConfigError, load_settings
from adapter.server.workermetrics import Snapshot, WorkerMetrics, render_metrics, take_snapshot
from adapter.server.workers import ListenerPlan, bind_slot, restart_delay


def test_restart_delay_grows_and_is_capped() -> None:
    delays = [restart_delay(failures) for failures in range(10)]
    assert delays == [0.0, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]


class _Fixed(Collector):
    def __init__(self, metrics: list[Metric]) -> None:
        self.metrics = metrics

    def collect(self):  # type: ignore[no-untyped-def]
        yield from self.metrics


def worker_snapshot(opened: int, live: int, confirms: list[float], started: float) -> Snapshot:
    """A worker's series, taken the way a worker takes them."""
    counter = CounterMetricFamily("stomp_adapter_connections_opened", "opened", labels=["listener"])
    counter.add_metric(["tcp"], opened)
    gauge = GaugeMetricFamily("stomp_adapter_connections", "now", labels=["listener", "state"])
    gauge.add_metric(["tcp", "connected"], live)
    histogram = HistogramMetricFamily("stomp_adapter_publisher_confirm_seconds", "latency")
    below = sum(1 for seconds in confirms if seconds <= 0.001)
    histogram.add_metric([], [("0.001", below), ("+Inf", len(confirms))], sum(confirms))
    start = GaugeMetricFamily("process_start_time_seconds", "start", value=started)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fixed([counter, gauge, histogram, start]))
    return take_snapshot(registry)


def values(metrics: list[Metric]) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = render_metrics(metrics).decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_workers_series_are_added_up() -> None:
    total = WorkerMetrics()
    one = worker_snapshot(opened=3, live=2, confirms=[0.0005, 0.002], started=100.0)
    two = worker_snapshot(opened=4, live=1, confirms=[0.0002], started=90.0)
    summed = values(total.combine([one, two]))
    assert summed[("stomp_adapter_connections_opened_total", frozenset({("listener", "tcp")}))] == 7
    live = ("stomp_adapter_connections", frozenset({("listener", "tcp"), ("state", "connected")}))
    assert summed[live] == 3
    assert summed[("stomp_adapter_publisher_confirm_seconds_bucket", frozenset({("le", "0.001")}))] == 2
    assert summed[("stomp_adapter_publisher_confirm_seconds_bucket", frozenset({("le", "+Inf")}))] == 3
    assert summed[("stomp_adapter_publisher_confirm_seconds_count", frozenset())] == 3
    assert summed[("stomp_adapter_publisher_confirm_seconds_sum", frozenset())] == pytest.approx(0.0027)
    # a start time is not added: the oldest worker's
    assert summed[("process_start_time_seconds", frozenset())] == 90.0


def test_a_dead_workers_counters_stay_and_its_gauges_go() -> None:
    total = WorkerMetrics()
    survivor = worker_snapshot(opened=4, live=1, confirms=[], started=90.0)
    dead = worker_snapshot(opened=10, live=5, confirms=[0.0001], started=80.0)
    before = values(total.combine([survivor, dead]))
    total.retire(dead)
    replacement = worker_snapshot(opened=0, live=0, confirms=[], started=120.0)
    after = values(total.combine([survivor, replacement]))
    opened = ("stomp_adapter_connections_opened_total", frozenset({("listener", "tcp")}))
    assert before[opened] == after[opened] == 14  # never goes down: no false counter reset
    live = ("stomp_adapter_connections", frozenset({("listener", "tcp"), ("state", "connected")}))
    assert after[live] == 1
    assert after[("stomp_adapter_publisher_confirm_seconds_count", frozenset())] == 1
    assert after[("process_start_time_seconds", frozenset())] == 90.0


def test_a_malformed_snapshot_is_skipped() -> None:
    good = worker_snapshot(opened=1, live=0, confirms=[], started=1.0)
    broken: Snapshot = [
        {"name": "x"},
        {"name": "y", "type": "counter", "help": "", "samples": [["y_total", None, 1]]},
    ]
    summed = values(WorkerMetrics().combine([good, broken]))
    assert summed[("stomp_adapter_connections_opened_total", frozenset({("listener", "tcp")}))] == 1


def destination_snapshot(published: dict[str, int]) -> Snapshot:
    family = CounterMetricFamily(
        "stomp_adapter_destination_messages_published", "published", labels=["destination"]
    )
    for destination, count in published.items():
        family.add_metric([destination], count)
    receipts = HistogramMetricFamily("stomp_adapter_receipt_seconds", "receipts", labels=["command"])
    receipts.add_metric(["SEND"], [("0.001", 1), ("+Inf", 2)], 0.5)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fixed([family, receipts]))
    return take_snapshot(registry)


def test_the_supervisor_bounds_the_destinations_again() -> None:
    """Each worker admitted its own 2 destinations; the sum keeps 2 and adds the rest to other."""
    total = WorkerMetrics(destination_limit=2)
    one = destination_snapshot({"/queue/a": 5, "/queue/b": 1, "other": 2})
    two = destination_snapshot({"/queue/c": 7, "/queue/a": 1, "/temp-queue/*": 3})
    summed = values(total.combine([one, two]))
    name = "stomp_adapter_destination_messages_published_total"
    by_destination = {dict(labels)["destination"]: v for (n, labels), v in summed.items() if n == name}
    assert by_destination == {"/queue/a": 6, "/queue/b": 1, "other": 9, "/temp-queue/*": 3}
    command = frozenset({("command", "SEND"), ("le", "+Inf")})
    assert summed[("stomp_adapter_receipt_seconds_bucket", command)] == 4  # receipts add up too
    # later scrapes keep the same series, whatever order the workers answer in
    again = values(total.combine([two, one]))
    assert {dict(labels)["destination"]: v for (n, labels), v in again.items() if n == name} == by_destination


def test_workers_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_settings().workers == 1
    path = tmp_path / "adapter.ini"
    path.write_text("adapter.workers = 3\n")
    assert load_settings(path).workers == 3
    monkeypatch.setenv("STOMP_ADAPTER_WORKERS", "2")
    assert load_settings(path).workers == 2
    assert load_settings(path, {"workers": "4"}).workers == 4
    for wrong in ("0", "-1", "two", "1000"):
        with pytest.raises(ConfigError, match="--workers"):
            load_settings(path, {"workers": wrong})


def test_every_slot_binds_the_port_the_first_one_got() -> None:
    plans = [ListenerPlan("127.0.0.1", 0, 16)]
    first, second = bind_slot(plans), bind_slot(plans)
    try:
        (one,) = first[("127.0.0.1", 0)]
        (two,) = second[("127.0.0.1", 0)]
        port = one.getsockname()[1]
        assert port != 0
        assert two.getsockname()[1] == port
        assert one.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT) == 1
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass  # the kernel queued it on one of the two; both are listening
    finally:
        for sockets in (*first.values(), *second.values()):
            for sock in sockets:
                sock.close()
