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
instead of sleeping.  Each turn gives the CPU away
(``sched_yield``) to any process waiting for it on this CPU, and the spinning stops while this
thread itself has to wait for a CPU: ``BusyPollCore`` samples the thread's run-queue wait
(``/proc/thread-self/schedstat``) every ``SAMPLE_SECONDS`` and, when the thread spent more than
``MAX_WAIT_SHARE`` of the interval runnable but not running, spins no more until the next
sample finds the CPUs free again.  So at saturation (every CPU busy: the broker, the clients,
the adapter) nothing is spun, and an idle adapter never spins at all.  Where schedstat cannot be
read, nothing is spun either.

One poller per event loop (``install`` / ``poller_of``): the protocols take it when they are
logged in; until then, and on a loop without one, they hold ``NO_POLL``, whose ``touch`` does
nothing.

Owns: ``BusyPollCore`` (pure: when to spin, from the clock and the wait samples), ``BusyPoller``
(the shell on one loop), the per-loop registry.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import weakref
from dataclasses import dataclass

__all__ = [
    "MAX_WAIT_SHARE",
    "NO_POLL",
    "NoPoll",
    "SAMPLE_SECONDS",
    "BusyPollCore",
    "BusyPoller",
    "install",
    "poller_of",
    "uninstall",
]

# the run-queue wait, as a share of the sampling interval, above which the CPUs count as busy
MAX_WAIT_SHARE = 0.10
# how often the run-queue wait is sampled while spinning
SAMPLE_SECONDS = 0.05
_SCHEDSTAT = "/proc/thread-self/schedstat"


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


class NoPoll:
    """The poller of a loop without busy polling."""

    __slots__ = ()

    def touch(self) -> None:
        pass


NO_POLL = NoPoll()


def _read_wait(descriptor: int) -> int:
    """This thread's total run-queue wait in nanoseconds (the second field of schedstat)."""
    return int(os.pread(descriptor, 128, 0).split()[1])


class BusyPoller:
    """Busy polling on one event loop (the module docstring)."""

    __slots__ = ("core", "_loop", "_schedstat", "_read_since", "_spinning")

    def __init__(self, loop: asyncio.AbstractEventLoop, core: BusyPollCore, schedstat: int) -> None:
        self.core = core
        self._loop = loop
        self._schedstat = schedstat  # an open descriptor of the loop thread's schedstat
        self._read_since = False
        self._spinning = False

    def touch(self) -> None:
        """A read came in."""
        self._read_since = True
        if not self._spinning:
            self._spinning = True
            self._loop.call_soon(self._turn)

    def _turn(self) -> None:
        core = self.core
        now = self._loop.time()
        if now >= core.next_sample:
            core.sample(now, _read_wait(self._schedstat))
        read_since, self._read_since = self._read_since, False
        if core.poll_again(now, read_since):
            os.sched_yield()
            self._loop.call_soon(self._turn)
        else:
            self._spinning = False

    def close(self) -> None:
        """No more polling: a turn already scheduled ends the spin (and a later read's turn ends
        at once)."""
        self.core.cpus_free = False
        self.core.next_sample = float("inf")
        with contextlib.suppress(OSError):
            os.close(self._schedstat)


_POLLERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, BusyPoller] = weakref.WeakKeyDictionary()


def install(loop: asyncio.AbstractEventLoop, microseconds: int) -> BusyPoller | None:
    """Busy polling of ``microseconds`` after each read on ``loop`` (called on the loop's thread,
    whose schedstat it opens); 0, or no schedstat to read: none.  Replaces an earlier one."""
    uninstall(loop)
    if microseconds <= 0:
        return None
    try:
        schedstat = os.open(_SCHEDSTAT, os.O_RDONLY | os.O_CLOEXEC)
        _read_wait(schedstat)
    except (OSError, ValueError, IndexError):
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
