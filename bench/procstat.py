"""CPU time and RSS of processes from /proc (Linux), and finding the processes to watch.

No psutil: ``/proc/<pid>/stat`` fields 14 and 15 (utime, stime, in clock ticks) give CPU
seconds, ``VmRSS`` in ``/proc/<pid>/status`` gives the resident set size.  An adapter run with
``--workers N`` is a process tree: its CPU is the supervisor's plus its workers'.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a process (all its threads), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    # the command name (field 2) may contain spaces and parentheses: split after the last ')'
    fields = data[data.rindex(b")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def child_pids(pid: int) -> list[int]:
    children: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                children += [int(child) for child in f.read().split()]
    except OSError:
        return children
    return children


def tree_cpu_seconds(pid: int) -> float | None:
    """CPU seconds of a process and its live descendants (the workers of ``--workers N``)."""
    total = cpu_seconds(pid)
    if total is None:
        return None
    for child in child_pids(pid):
        total += tree_cpu_seconds(child) or 0.0
    return total


def rss_kb(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _listening_inodes(port: int) -> set[str]:
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    parts = line.split()
                    local, state, inode = parts[1], parts[3], parts[9]
                    if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:  # 0A = LISTEN
                        inodes.add(inode)
        except OSError:
            continue
    return inodes


def _parent_pid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    return int(data[data.rindex(b")") + 2 :].split()[1])


def pid_listening_on(port: int) -> int | None:
    """The process that has a listening socket on ``port`` (needs permission to read its fds);
    when several do (``--workers N``: the supervisor and its workers), the one whose parent is
    not among them."""
    inodes = _listening_inodes(port)
    if not inodes:
        return None
    targets = {f"socket:[{inode}]" for inode in inodes}
    holders: set[int] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            for fd in os.listdir(f"/proc/{entry}/fd"):
                try:
                    if os.readlink(f"/proc/{entry}/fd/{fd}") in targets:
                        holders.add(int(entry))
                        break
                except OSError:
                    continue
        except OSError:
            continue
    roots = sorted(pid for pid in holders if _parent_pid(pid) not in holders)
    return roots[0] if roots else None


def find_broker_pid(amqp_port: int = 5672) -> int | None:
    """The RabbitMQ node: the beam.smp process (the one listening on the AMQP port if several)."""
    candidates = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if b"beam.smp" in cmdline.split(b"\0", 1)[0]:
            candidates.append(int(entry))
    if len(candidates) == 1:
        return candidates[0]
    listener = pid_listening_on(amqp_port)
    if listener in candidates or (listener is not None and not candidates):
        return listener
    return candidates[0] if candidates else None


def machine_busy_seconds() -> float | None:
    """CPU seconds all CPUs spent not idle since boot (``cpu`` line of /proc/stat)."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    # user nice system idle iowait irq softirq steal (guest time is already in user)
    values = [int(v) for v in fields[1:9]]
    return (sum(values) - values[3] - values[4]) / _TICK


@dataclass
class CpuSample:
    wall: float
    cpu: dict[str, float | None]


class CpuMeter:
    """CPU seconds used by named processes between ``start()`` and ``stop()``, and by the rest."""

    def __init__(self, pids: dict[str, int | None]) -> None:
        self.pids = pids
        self._start: CpuSample | None = None

    def _sample(self) -> CpuSample:
        cpu = {
            name: ((tree_cpu_seconds if name == "adapter" else cpu_seconds)(pid) if pid else None)
            for name, pid in self.pids.items()
        }
        cpu["machine"] = machine_busy_seconds()
        return CpuSample(time.monotonic(), cpu)

    def start(self) -> None:
        self._start = self._sample()

    def stop(self) -> dict[str, float | None]:
        assert self._start is not None
        end = self._sample()
        result: dict[str, float | None] = {"wall": round(end.wall - self._start.wall, 3)}
        for name, before in self._start.cpu.items():
            after = end.cpu.get(name)
            result[name] = round(after - before, 3) if before is not None and after is not None else None
        # CPU used by everything else on the machine (other processes, kernel work not charged
        # to ours): a busy neighbour makes the numbers of that measurement suspect
        machine = result.pop("machine", None)
        if machine is not None:
            ours = sum(v for k, v in result.items() if k != "wall" and v is not None)
            result["other"] = round(max(0.0, machine - ours), 3)
        return result
