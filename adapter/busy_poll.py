"""Busy polling: after a read, the event loop keeps polling its sockets for a few microseconds
before it sleeps (``adapter.busy_poll_microseconds``), so that the answer a client waits for
finds the adapter awake.

Why.  A request/reply round trip crosses the adapter four times (request in, request out to the
responder, reply in, reply out), and each crossing used to begin with waking the adapter from
``epoll_wait``.  Waking a sleeping process is the dear part of a hop on a virtual machine (an
idle vCPU halts, and the wake-up goes through the hypervisor): the plugin, inside the broker,
pays none of these.  The broker's answer to what the adapter just wrote usually comes back
within tens of microseconds, so a short spin after each read catches it (docs/performance.md,
"Measured design choices").

How.  ``BusyPoller.touch`` (one call per read, from a STOMP session's connection once it
has logged in, a WebSocket's through it, and an AMQP connection once its handshake is done: a
login's steps wait for the broker's work, not for a wake-up) marks the loop active and, if it
is not spinning yet, schedules a turn; a turn re-schedules itself with ``call_soon`` until
``window`` has passed since the last read, so the loop polls its sockets with a zero timeout
instead of sleeping.  Each turn yields the CPU (``sched_yield``: a hint to the kernel to run
a process waiting for this CPU first), and the spinning stops while this thread itself is kept
waiting for a CPU: ``BusyPollCore`` samples the thread's run-queue wait
(``/proc/thread-self/schedstat``) every ``SAMPLE_SECONDS`` while it spins and, when the thread
spent more than ``MAX_WAIT_SHARE`` of the interval runnable but not running, spins no more until
a later sample finds it below.  That share is averaged over the interval, spun or not, so a
lightly loaded adapter on a busy host may go on spinning: the yield is then what gives way.
What it costs: at most one CPU per process, bought by reads (every read, a heart-beat's
included, starts or stretches a window), so a connection that reads more often than the window
keeps its process spinning; with no reads at all nothing spins.  It stays off where schedstat
cannot be read and where the process runs under a CPU quota (``cpu_quota``:
a container's CPU limit, which polling would spend and get the process throttled, unseen by the
run-queue wait).  A failure to read schedstat later, or one that counts nothing (a kernel
without scheduler statistics), stops it for good at the first sample, with a WARNING.

One poller per event loop (``install`` / ``poller_of``): the protocols take it when they are
logged in; until then, and on a loop without one, they hold ``NO_POLL``, whose ``touch`` does
nothing.

Owns: ``BusyPollCore`` (pure: when to spin, from the clock and the wait samples), ``BusyPoller``
(the shell on one loop), the per-loop registry.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import weakref
from collections.abc import Callable
from dataclasses import dataclass

__all__ = [
    "MAX_WAIT_SHARE",
    "NO_POLL",
    "NoPoll",
    "SAMPLE_SECONDS",
    "BusyPollCore",
    "BusyPoller",
    "cpu_quota",
    "install",
    "poller_of",
    "uninstall",
]

# the run-queue wait, as a share of the sampling interval, above which the CPUs count as busy
MAX_WAIT_SHARE = 0.10
# how often the run-queue wait is sampled while spinning
SAMPLE_SECONDS = 0.05
_SCHEDSTAT = "/proc/thread-self/schedstat"

log = logging.getLogger("adapter.server")


@dataclass(slots=True)
class BusyPollCore:
    """When to poll once more instead of sleeping.  ``window``: seconds of polling after the last
    read.  Times are the loop's clock in seconds, waits nanoseconds of run-queue wait as
    schedstat counts them (a running total)."""

    window: float
    max_wait_share: float = MAX_WAIT_SHARE
    sample_seconds: float = SAMPLE_SECONDS
    until: float = 0.0  # polling goes on until then
    cpus_free: bool = True  # the last sample found this thread not kept waiting for a CPU
    next_sample: float = 0.0
    _sampled_at: float | None = None
    _waited: int = 0

    def poll_again(self, now: float, read_since: bool) -> bool:
        """Called at each turn: ``read_since`` whether a read came since the last turn."""
        if read_since:
            self.until = now + self.window
        return self.cpus_free and now < self.until

    def sample(self, now: float, waited: int) -> None:
        """A new reading of the thread's total run-queue wait."""
        if self._sampled_at is not None and now > self._sampled_at:
            share = (waited - self._waited) / 1e9 / (now - self._sampled_at)
            self.cpus_free = share <= self.max_wait_share
        self._sampled_at = now
        self._waited = waited
        self.next_sample = now + self.sample_seconds

    def stop(self) -> None:
        """No more polling, and no more samples, for good."""
        self.cpus_free = False
        self.next_sample = float("inf")


class NoPoll:
    """The poller of a loop without busy polling."""

    __slots__ = ()

    def touch(self) -> None:
        pass


NO_POLL = NoPoll()


def _read_counts(descriptor: int) -> tuple[int, int]:
    """The thread's time on a CPU and its run-queue wait, in nanoseconds (schedstat's first two
    fields).  Raises OSError, ValueError or IndexError where it cannot be read as such."""
    fields = os.pread(descriptor, 128, 0).split()
    return int(fields[0]), int(fields[1])


def _read_wait(descriptor: int) -> int:
    """This thread's total run-queue wait in nanoseconds.  Raises ValueError where the kernel
    counts nothing: its time on a CPU is still 0 although the thread has run (a kernel without
    scheduler statistics or delay accounting prints "0 0 0"; a thread younger than a scheduler
    tick may show 0 too, which is why ``install`` does not ask this)."""
    ran, waited = _read_counts(descriptor)
    if ran <= 0:
        raise ValueError("the kernel keeps no scheduler statistics for this thread")
    return waited


def cpu_quota(cgroups: str, read: Callable[[str], str | None], root: str = "/sys/fs/cgroup") -> str | None:
    """The file that caps this process's CPU time (a cgroup quota: v2 ``cpu.max`` other than
    ``max``, v1 ``cpu.cfs_quota_us`` other than -1) on its cgroup or an ancestor, or None.
    ``cgroups`` is /proc/self/cgroup's text, ``read`` a file's text (None if it cannot be read).
    Polling under a quota would spend the quota (a container's CPU limit) and get the process
    throttled, which no run-queue wait shows: busy polling stays off there."""
    for line in cgroups.splitlines():
        _, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if controllers == "":  # cgroup v2 (mounted at the root, or under unified/ in hybrid mode)
            bases, name, unlimited = [root, f"{root}/unified"], "cpu.max", "max"
        elif "cpu" in controllers.split(","):
            bases, name, unlimited = [f"{root}/{controllers}"], "cpu.cfs_quota_us", "-1"
        else:
            continue
        parts = [part for part in path.split("/") if part]
        for base in bases:
            for depth in range(len(parts), -1, -1):
                where = "/".join([base, *parts[:depth], name])
                text = read(where)
                if text is not None and text.split() and text.split()[0] != unlimited:
                    return where
    return None


def _close_quietly(descriptor: int) -> None:
    with contextlib.suppress(OSError):
        os.close(descriptor)


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as file:
            return file.read(256)
    except OSError:
        return None


class BusyPoller:
    """Busy polling on one event loop (the module docstring)."""

    __slots__ = ("core", "_loop", "_schedstat", "_release", "_read_since", "_spinning")

    def __init__(self, loop: asyncio.AbstractEventLoop, core: BusyPollCore, schedstat: int) -> None:
        self.core = core
        # weakly: the registry's value must not keep its key, the loop, alive
        self._loop = weakref.ref(loop)
        self._schedstat = schedstat  # an open descriptor of the loop thread's schedstat
        # closes it once: at close(), or when the loop goes if nothing uninstalled it (a start
        # that failed after the install, a shutdown cut short)
        self._release = weakref.finalize(loop, _close_quietly, schedstat)
        self._read_since = False
        self._spinning = False

    def touch(self) -> None:
        """A read came in."""
        self._read_since = True
        if not self._spinning:
            loop = self._loop()
            if loop is not None:
                self._spinning = True
                loop.call_soon(self._turn)

    def _turn(self) -> None:
        loop = self._loop()
        if loop is None:
            return
        core = self.core
        now = loop.time()
        if now >= core.next_sample:
            try:
                waited = _read_wait(self._schedstat)
            except (OSError, ValueError, IndexError) as error:  # the thread is gone, no counts
                log.warning("busy polling stopped: cannot read the loop thread's schedstat (%s)", error)
                self.close()
                self._spinning = False
                return
            core.sample(now, waited)
        read_since, self._read_since = self._read_since, False
        if core.poll_again(now, read_since):
            os.sched_yield()
            loop.call_soon(self._turn)
        else:
            self._spinning = False

    def close(self) -> None:
        """No more polling: a turn already scheduled ends the spin (and a later read's turn ends
        at once)."""
        self.core.stop()
        self._release()


_POLLERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, BusyPoller] = weakref.WeakKeyDictionary()


def install(loop: asyncio.AbstractEventLoop, microseconds: int) -> BusyPoller | None:
    """Busy polling of ``microseconds`` after each read on ``loop`` (called on the loop's thread,
    whose schedstat it opens); none (and ``poller_of`` gives ``NO_POLL``) with 0, under a CPU
    quota (`cpu_quota`), or without a schedstat that counts.  Replaces an earlier one."""
    uninstall(loop)
    if microseconds <= 0:
        return None
    quota = cpu_quota(_read_text("/proc/self/cgroup") or "", _read_text)
    if quota is not None:
        log.info("busy polling off: this process's CPU time is capped (%s)", quota)
        return None
    try:
        schedstat = os.open(_SCHEDSTAT, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        _read_counts(schedstat)
    except (OSError, ValueError, IndexError):
        os.close(schedstat)
        return None
    poller = _POLLERS[loop] = BusyPoller(loop, BusyPollCore(microseconds / 1e6), schedstat)
    return poller


def uninstall(loop: asyncio.AbstractEventLoop) -> None:
    poller = _POLLERS.pop(loop, None)
    if poller is not None:
        poller.close()


def poller_of(loop: asyncio.AbstractEventLoop) -> BusyPoller | NoPoll:
    """The poller the protocols of ``loop`` touch on each read."""
    return _POLLERS.get(loop, NO_POLL)
