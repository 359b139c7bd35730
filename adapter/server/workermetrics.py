"""The metrics of ``--workers N``: each worker's series as plain data, and their sum.

Owns the snapshot format a worker sends its supervisor over the control socket (a list of
families: name, type, help text, samples) and how the supervisor adds the workers' snapshots
into the one set of series it serves on ``--http-listen``:

* every sample is summed over the workers (connections, frames, bytes, CPU seconds, memory,
  open file descriptors, histogram buckets ...), except the few where a sum means nothing
  (``KEPT_MINIMUM``: the oldest start time, the smallest descriptor limit; ``KEPT_MAXIMUM``:
  the info series, 1 when any worker has it);
* the per-destination series (``adapter.metrics_destinations`` = N) are bounded again: each
  worker admits its own N destinations, so their union could reach N x workers; the supervisor
  admits at most N of the labels it sees, in the order it first sees them, for its whole life,
  and adds the others into ``destination="other"`` (stats.LabelBound);
* a worker that dies takes its counters with it, and a sum that drops would look to
  Prometheus' ``rate()`` like a counter reset (a spike of the whole total).  So the last
  snapshot the supervisor had of a dead worker is *retired*: its counter and histogram samples
  stay in the total, its gauges (connections now, memory) leave it.  What the worker counted
  after that last snapshot is lost; the total never goes down.

Why not prometheus_client's multiprocess mode: it shares values of prometheus_client metric
objects through memory-mapped files, while the adapter counts in plain attributes and builds
its series at scrape time with a custom collector (adapter/server/metrics.py), which the
multiprocess mode does not carry across processes.

No I/O here: the supervisor (adapter/server/workers.py) moves the snapshots.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from .stats import DESTINATION_FAMILIES, LabelBound

# families whose workers' values are not added: the minimum is the meaningful one
KEPT_MINIMUM = frozenset({"process_start_time_seconds", "process_max_fds"})
# families of info series (value 1): one worker's is the supervisor's
KEPT_MAXIMUM = frozenset({"stomp_adapter_broker_info"})
# families whose samples only grow: what a dead worker counted stays in the total
MONOTONIC_TYPES = frozenset({"counter", "histogram", "summary"})

SampleKey = tuple[str, tuple[tuple[str, str], ...]]  # sample name, sorted labels
Snapshot = list[
    dict[str, Any]
]  # the JSON form: [{"name", "type", "help", "samples": [[name, labels, value]]}]


def take_snapshot(registry: CollectorRegistry) -> Snapshot:
    """A worker's series now, as JSON-ready data."""
    return [
        {
            "name": family.name,
            "type": family.type,
            "help": family.documentation,
            "samples": [[sample.name, dict(sample.labels), sample.value] for sample in family.samples],
        }
        for family in registry.collect()
    ]


@dataclass(slots=True)
class _Family:
    type: str
    help: str
    samples: dict[SampleKey, float] = field(default_factory=dict)


def _read(snapshot: Snapshot) -> Iterator[tuple[str, str, str, SampleKey, float]]:
    """(family, type, help, sample key, value) of each sample; malformed entries are skipped
    (a snapshot comes from another process, not from a client, but a bug there must not break
    the scrape)."""
    for family in snapshot:
        try:
            name, kind, documentation = str(family["name"]), str(family["type"]), str(family["help"])
            for sample_name, labels, value in family["samples"]:
                key = (str(sample_name), tuple(sorted((str(k), str(v)) for k, v in labels.items())))
                yield name, kind, documentation, key, float(value)
        except (KeyError, TypeError, ValueError, AttributeError):
            continue


class WorkerMetrics:
    """The counters of workers that are gone, and the sum of those with the live snapshots."""

    def __init__(self, destination_limit: int = 0) -> None:
        self._retired: dict[str, _Family] = {}
        self._destination_bound = LabelBound(destination_limit)

    def retire(self, snapshot: Snapshot) -> None:
        """Keep the counters of a worker that died (its last snapshot)."""
        for name, kind, documentation, key, value in _read(snapshot):
            if kind not in MONOTONIC_TYPES or name in KEPT_MINIMUM:
                continue
            family = self._retired.setdefault(name, _Family(kind, documentation))
            family.samples[key] = family.samples.get(key, 0.0) + value

    def combine(self, snapshots: Iterable[Snapshot]) -> list[Metric]:
        """The live workers' snapshots added together, with the retired counters."""
        families: dict[str, _Family] = {
            name: _Family(family.type, family.help, dict(family.samples))
            for name, family in self._retired.items()
        }
        for snapshot in snapshots:
            for name, kind, documentation, key, value in _read(snapshot):
                family = families.setdefault(name, _Family(kind, documentation))
                if key not in family.samples:
                    family.samples[key] = value
                elif name in KEPT_MINIMUM:
                    family.samples[key] = min(family.samples[key], value)
                elif name in KEPT_MAXIMUM:
                    family.samples[key] = max(family.samples[key], value)
                else:
                    family.samples[key] += value
        for name in DESTINATION_FAMILIES:
            if name in families:
                self._bound_destinations(families[name])
        metrics = []
        for name, family in families.items():
            metric = Metric(name, family.help, family.type)
            for (sample_name, labels), value in family.samples.items():
                metric.add_sample(sample_name, dict(labels), value)
            metrics.append(metric)
        return metrics

    def _bound_destinations(self, family: _Family) -> None:
        """Fold the destinations past the supervisor's bound into other (see the docstring)."""
        folded: dict[SampleKey, float] = {}
        for (sample_name, labels), value in family.samples.items():
            labels = tuple(
                (key, self._destination_bound.fold(label) if key == "destination" else label)
                for key, label in labels
            )
            folded[(sample_name, labels)] = folded.get((sample_name, labels), 0.0) + value
        family.samples = folded


class _FixedCollector(Collector):
    def __init__(self, metrics: list[Metric]) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        yield from self._metrics


def render_metrics(metrics: list[Metric]) -> bytes:
    """The Prometheus text format of ``metrics``."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_FixedCollector(metrics))
    return generate_latest(registry)
