"""adapter/server/input_guard.py: the incomplete-input budget and the frame timeout, with a fake
process-wide counter.  The frame timer's callback is called directly with the frame's start
moved into the past, so no test waits for a clock."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from adapter.server.input_guard import InputGuard


@dataclass
class Limits:
    frame_timeout: float = 60.0


@dataclass
class Shared:
    incomplete_input: int = 0
    incomplete_input_budget: int = 1000
    limits: Limits = field(default_factory=Limits)


def make(shared: Shared | None = None) -> tuple[InputGuard, Shared, list[tuple[str, str]]]:
    shared = shared or Shared()
    failures: list[tuple[str, str]] = []
    guard = InputGuard(
        shared, asyncio.get_running_loop(), lambda m, d: failures.append((m, d)), lambda: "peer"
    )
    return guard, shared, failures


async def test_held_bytes_count_against_the_shared_budget_and_come_back() -> None:
    guard, shared, failures = make()
    guard.account(300, 0, False)
    assert shared.incomplete_input == 300 and guard.held == 300
    guard.account(100, 200, False)  # a frame was taken, a shorter one started
    assert shared.incomplete_input == 100
    guard.release()
    assert shared.incomplete_input == 0 and guard.held == 0 and failures == []


async def test_two_connections_share_one_budget() -> None:
    shared = Shared(incomplete_input_budget=500)
    first, _, first_failures = make(shared)
    second, _, second_failures = make(shared)
    first.account(400, 0, False)
    second.account(200, 0, False)  # 600 > 500: the one that grew is closed
    assert first_failures == []
    ((message, detail),) = second_failures
    assert message == "Too much incomplete input" and "500 bytes" in detail
    second.release()
    first.release()
    assert shared.incomplete_input == 0


async def test_shrinking_over_the_budget_is_not_a_failure() -> None:
    shared = Shared(incomplete_input_budget=100, incomplete_input=500)  # others hold too much
    guard, _, failures = make(shared)
    guard.held = 50
    guard.account(10, 40, False)
    assert failures == []


async def test_the_frame_clock_starts_with_the_first_held_byte() -> None:
    guard, _, _ = make()
    assert guard.started is None
    guard.account(10, 0, False)
    assert guard.started is not None
    guard.release()
    assert guard.started is None


async def test_more_bytes_of_the_same_frame_keep_its_clock() -> None:
    guard, _, _ = make()
    guard.account(10, 0, False)
    started = guard.started
    guard.account(20, 0, False)  # nothing consumed: still the same frame
    assert guard.started == started
    guard.release()


async def test_a_frame_taken_restarts_the_clock() -> None:
    guard, _, _ = make()
    guard.account(10, 0, False)
    assert guard.started is not None
    guard.started -= 100  # long ago
    guard.account(10, 50, False)  # 50 bytes consumed since: progress
    assert guard.started > asyncio.get_running_loop().time() - 1
    guard.release()


async def test_complete_frames_waiting_for_the_broker_stop_the_clock() -> None:
    guard, _, _ = make()
    guard.account(10, 0, False)
    guard.account(10, 0, True)
    assert guard.started is None
    guard.release()


async def test_a_late_frame_fails_with_the_timeout_named() -> None:
    guard, _, failures = make(Shared(limits=Limits(frame_timeout=2.5)))
    guard.account(10, 0, False)
    assert guard.started is not None
    guard.started -= 3
    guard.check_time()
    assert failures == [("Frame timeout", "A frame was not completed within 2.5 s\n")]
    guard.release()


async def test_a_frame_not_late_yet_is_looked_at_again() -> None:
    guard, _, failures = make(Shared(limits=Limits(frame_timeout=2.5)))
    guard.account(10, 0, False)
    guard.check_time()
    assert failures == []
    assert guard._timer is not None  # noqa: SLF001 - re-armed for the rest of the timeout
    guard.release()
    assert guard._timer is None  # noqa: SLF001


async def test_no_frame_waited_for_no_failure() -> None:
    guard, _, failures = make()
    guard.check_time()
    assert failures == []


async def test_frame_timeout_zero_arms_no_timer() -> None:
    guard, _, _ = make(Shared(limits=Limits(frame_timeout=0)))
    guard.account(10, 0, False)
    assert guard._timer is None  # noqa: SLF001
    guard.release()
