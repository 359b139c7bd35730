"""The event loop's spin after a read (adapter/busy_poll.py): when the pure core polls again, and
the shell on a real asyncio loop: it spins only after reads, stops after its window, never while
its thread waits for a CPU, and not at all where it is off or cannot read schedstat."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from adapter import busy_poll
from adapter.busy_poll import NO_POLL, BusyPollCore, BusyPoller

WINDOW = 50e-6
SECOND = 1_000_000_000  # nanoseconds


def test_it_polls_until_the_window_after_the_last_read_has_passed() -> None:
    core = BusyPollCore(WINDOW)
    assert core.poll_again(10.0, read_since=True)
    assert core.poll_again(10.0 + 40e-6, read_since=False)
    assert not core.poll_again(10.0 + 60e-6, read_since=False)
    # a read during the spin moves the end
    assert core.poll_again(10.0 + 40e-6, read_since=True)
    assert core.poll_again(10.0 + 80e-6, read_since=False)
    assert not core.poll_again(10.0 + 91e-6, read_since=False)


def test_without_a_read_it_never_polls() -> None:
    core = BusyPollCore(WINDOW)
    assert not core.poll_again(0.0, read_since=False)
    assert not core.poll_again(123.0, read_since=False)


def test_a_thread_kept_waiting_for_a_cpu_stops_polling_until_the_cpus_are_free_again() -> None:
    core = BusyPollCore(WINDOW)
    core.sample(1.0, 5 * SECOND)  # the first reading is only a baseline, whatever its total
    assert core.cpus_free
    assert core.next_sample == pytest.approx(1.0 + busy_poll.SAMPLE_SECONDS)
    # 20 ms of run-queue wait in 50 ms: 40 % of the time runnable but not running
    core.sample(1.05, 5 * SECOND + 20_000_000)
    assert not core.cpus_free
    assert not core.poll_again(1.05, read_since=True)  # a read does not override it
    # 1 ms in the next 50 ms: 2 %, under MAX_WAIT_SHARE
    core.sample(1.10, 5 * SECOND + 21_000_000)
    assert core.cpus_free
    assert core.poll_again(1.10, read_since=True)


def test_the_share_is_taken_against_the_bound_exactly() -> None:
    core = BusyPollCore(WINDOW, max_wait_share=0.10)
    core.sample(0.0, 0)
    core.sample(0.1, 10_000_000)  # exactly 10 %: still free
    assert core.cpus_free
    core.sample(0.2, 20_000_001)  # just over
    assert not core.cpus_free


def test_a_sample_at_the_same_instant_changes_nothing() -> None:
    core = BusyPollCore(WINDOW)
    core.sample(2.0, 0)
    core.sample(2.0, 10 * SECOND)  # no time passed: no share to take (no division by zero)
    assert core.cpus_free


def _run(coroutine_function):  # type: ignore[no-untyped-def]
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(coroutine_function(loop))
    finally:
        busy_poll.uninstall(loop)
        loop.close()


def test_a_loop_polls_after_a_read_and_then_sleeps_again() -> None:
    async def check(loop: asyncio.AbstractEventLoop) -> tuple[int, bool]:
        poller = busy_poll.install(loop, 2000)  # 2 ms: long enough to count turns on a slow machine
        assert isinstance(poller, BusyPoller)
        assert busy_poll.poller_of(loop) is poller
        turns = 0
        original = BusyPoller._turn  # noqa: SLF001

        def counted(self: BusyPoller) -> None:
            nonlocal turns
            turns += 1
            original(self)

        BusyPoller._turn = counted  # type: ignore[method-assign]  # noqa: SLF001
        try:
            poller.touch()
            poller.touch()  # a second read while spinning schedules no second spin
            await asyncio.sleep(0.05)
            spinning_after = poller._spinning  # noqa: SLF001
            turns_then = turns
            await asyncio.sleep(0.02)  # idle: no turn at all
            assert turns == turns_then
        finally:
            BusyPoller._turn = original  # type: ignore[method-assign]  # noqa: SLF001
        return turns, spinning_after

    turns, spinning_after = _run(check)
    assert turns >= 2  # it polled more than once before sleeping
    assert not spinning_after


def test_off_or_without_schedstat_there_is_no_poller(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    async def off(loop: asyncio.AbstractEventLoop) -> None:
        assert busy_poll.install(loop, 0) is None
        assert busy_poll.poller_of(loop) is NO_POLL
        NO_POLL.touch()  # does nothing, and costs a call

    _run(off)
    monkeypatch.setattr(busy_poll, "_SCHEDSTAT", str(tmp_path / "missing"))

    async def unreadable(loop: asyncio.AbstractEventLoop) -> None:
        assert busy_poll.install(loop, 50) is None
        assert busy_poll.poller_of(loop) is NO_POLL

    _run(unreadable)
    garbage = tmp_path / "schedstat"
    garbage.write_text("not numbers\n")
    monkeypatch.setattr(busy_poll, "_SCHEDSTAT", str(garbage))
    _run(unreadable)


def test_uninstalled_a_poller_stops_spinning_and_later_reads_start_nothing() -> None:
    async def check(loop: asyncio.AbstractEventLoop) -> None:
        poller = busy_poll.install(loop, 10_000)
        assert poller is not None
        poller.touch()
        await asyncio.sleep(0)
        busy_poll.uninstall(loop)  # the server's shutdown: the spin in progress ends at its next turn
        assert busy_poll.poller_of(loop) is NO_POLL
        await asyncio.sleep(0.001)
        assert not poller._spinning  # noqa: SLF001
        poller.touch()  # a protocol made earlier still holds it: one turn, which ends at once
        await asyncio.sleep(0.001)
        assert not poller._spinning  # noqa: SLF001

    _run(check)


def test_a_second_install_replaces_the_first() -> None:
    async def check(loop: asyncio.AbstractEventLoop) -> None:
        first = busy_poll.install(loop, 50)
        second = busy_poll.install(loop, 100)
        assert first is not None and second is not None
        assert busy_poll.poller_of(loop) is second
        assert second.core.window == pytest.approx(100e-6)
        first.touch()
        await asyncio.sleep(0.001)
        assert not first._spinning  # noqa: SLF001

    _run(check)


def _files(**texts: str):  # type: ignore[no-untyped-def]
    """A ``read`` over fake cgroup files: keyword names with ``__`` for ``/``."""
    table = {"/" + name.replace("__", "/"): text for name, text in texts.items()}
    return lambda path: table.get(path)


def test_a_cpu_quota_on_the_cgroup_or_an_ancestor_is_found_in_v2_and_v1() -> None:
    v2 = "0::/kubepods/pod1/c1\n"
    assert busy_poll.cpu_quota(v2, _files()) is None  # no files: no quota known
    read = _files(sys__fs__cgroup__kubepods__pod1__c1__cpu_max="max 100000\n")
    assert busy_poll.cpu_quota(v2.replace("cpu_max", "cpu.max"), read) is None
    table = {
        "/sys/fs/cgroup/kubepods/pod1/c1/cpu.max": "max 100000\n",
        "/sys/fs/cgroup/kubepods/pod1/cpu.max": "50000 100000\n",  # the pod's limit
    }
    assert busy_poll.cpu_quota(v2, table.get) == "/sys/fs/cgroup/kubepods/pod1/cpu.max"
    # a container in its own cgroup namespace sees its cgroup as the root
    assert (
        busy_poll.cpu_quota("0::/\n", {"/sys/fs/cgroup/cpu.max": "200000 100000"}.get)
        == "/sys/fs/cgroup/cpu.max"
    )
    # hybrid mode: v2 under unified/
    hybrid = {"/sys/fs/cgroup/unified/svc/cpu.max": "10000 100000"}
    assert busy_poll.cpu_quota("0::/svc\n", hybrid.get) == "/sys/fs/cgroup/unified/svc/cpu.max"
    # v1: the cpu controller's directory, alone or joined with cpuacct
    v1 = "12:memory:/x\n3:cpu,cpuacct:/docker/abc\n0::/\n"
    unlimited = {"/sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "-1\n"}
    assert busy_poll.cpu_quota(v1, unlimited.get) is None
    limited = {"/sys/fs/cgroup/cpu,cpuacct/docker/cpu.cfs_quota_us": "150000\n"}
    assert busy_poll.cpu_quota(v1, limited.get) == "/sys/fs/cgroup/cpu,cpuacct/docker/cpu.cfs_quota_us"


def test_odd_cgroup_text_is_no_quota() -> None:
    for text in ("", "garbage", "1:cpu", "::", "0::/a/../b\n", "2:cpu:/\n"):
        assert busy_poll.cpu_quota(text, {"/sys/fs/cgroup/cpu/x": ""}.get) is None
    assert busy_poll.cpu_quota("0::/\n", {"/sys/fs/cgroup/cpu.max": "\n"}.get) is None  # empty file


def test_under_a_cpu_quota_it_stays_off_and_says_so(monkeypatch: pytest.MonkeyPatch, caplog) -> None:  # type: ignore[no-untyped-def]
    files = {"/proc/self/cgroup": "0::/limited\n", "/sys/fs/cgroup/limited/cpu.max": "100000 100000\n"}
    monkeypatch.setattr(busy_poll, "_read_text", files.get)

    async def check(loop: asyncio.AbstractEventLoop) -> None:
        assert busy_poll.install(loop, 50) is None
        assert busy_poll.poller_of(loop) is NO_POLL

    with caplog.at_level("INFO", logger="adapter.server"):
        _run(check)
    assert "busy polling off" in caplog.text and "/sys/fs/cgroup/limited/cpu.max" in caplog.text


def _open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_schedstat_that_counts_nothing_stops_it_at_the_first_sample_and_leaks_no_descriptor(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog
) -> None:  # type: ignore[no-untyped-def]
    silent = tmp_path / "schedstat"
    silent.write_text("0 0 0\n")  # a kernel without scheduler statistics or delay accounting
    monkeypatch.setattr(busy_poll, "_SCHEDSTAT", str(silent))
    before = _open_descriptors()

    async def check(loop: asyncio.AbstractEventLoop) -> None:
        poller = busy_poll.install(loop, 10_000)
        assert poller is not None  # a young thread may show 0 too: install cannot tell
        poller.touch()
        await asyncio.sleep(0.005)
        assert not poller._spinning  # noqa: SLF001
        assert not poller.core.cpus_free

    with caplog.at_level("WARNING", logger="adapter.server"):
        _run(check)
    assert "keeps no scheduler statistics" in caplog.text
    assert _open_descriptors() == before


def test_a_failing_read_stops_it_for_good_with_a_warning(monkeypatch: pytest.MonkeyPatch, caplog) -> None:  # type: ignore[no-untyped-def]
    async def check(loop: asyncio.AbstractEventLoop) -> BusyPoller:
        poller = busy_poll.install(loop, 10_000)
        assert poller is not None

        def gone(descriptor: int) -> int:
            raise OSError(3, "No such process")

        monkeypatch.setattr(busy_poll, "_read_wait", gone)
        poller.core.next_sample = 0.0  # the next turn samples
        poller.touch()
        await asyncio.sleep(0.005)
        assert not poller._spinning  # noqa: SLF001
        poller.touch()  # later reads: one turn each, which ends at once
        await asyncio.sleep(0.005)
        assert not poller._spinning  # noqa: SLF001
        return poller

    with caplog.at_level("WARNING", logger="adapter.server"):
        _run(check)
    assert caplog.text.count("busy polling stopped") == 1


def test_a_loop_dropped_without_uninstall_frees_its_descriptor_and_entry() -> None:
    import gc
    import weakref

    entries = len(busy_poll._POLLERS)  # noqa: SLF001  # other tests' running adapters have theirs
    loop = asyncio.new_event_loop()
    gone = weakref.ref(loop)

    async def start(target: asyncio.AbstractEventLoop) -> int:
        poller = busy_poll.install(target, 50)
        assert poller is not None
        return poller._schedstat  # noqa: SLF001

    descriptor = loop.run_until_complete(start(loop))
    os.fstat(descriptor)  # open
    loop.close()  # no uninstall: a start that failed after the install, a shutdown cut short
    del loop
    gc.collect()
    with pytest.raises(OSError):
        os.fstat(descriptor)
    assert gone() is None  # the registry did not keep the loop alive
    assert len(busy_poll._POLLERS) == entries  # noqa: SLF001


def test_a_stopped_core_never_polls_or_samples_again() -> None:
    core = BusyPollCore(WINDOW)
    core.stop()
    assert not core.poll_again(1.0, read_since=True)
    assert core.next_sample == float("inf")
