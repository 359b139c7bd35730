"""adapter/amqp/admission.py: at most adapter.max_logins_in_flight logins at once, the others
served in their order of arrival, and no place lost when a waiting login is cancelled."""

from __future__ import annotations

import asyncio

import pytest

from adapter.amqp.admission import Gate, turn


def test_up_to_the_limit_enter_then_they_wait_in_order() -> None:
    gate = Gate(2)
    assert gate.enter("a") and gate.enter("b")
    assert not gate.enter("c") and not gate.enter("d")
    assert (gate.in_flight, gate.waiting) == (2, 2)
    assert gate.leave() == "c"  # a's place passes to c
    assert gate.leave() == "d"
    assert (gate.in_flight, gate.waiting) == (2, 0)
    assert gate.leave() is None and gate.leave() is None
    assert gate.in_flight == 0


def test_a_newcomer_never_overtakes_the_line() -> None:
    gate = Gate(1)
    assert gate.enter("a")
    assert not gate.enter("b")
    gate.withdraw("nobody")  # nothing happens
    assert gate.leave() == "b"
    assert not gate.enter("c")  # b holds the place now


def test_a_withdrawn_ticket_leaves_the_line() -> None:
    gate = Gate(1)
    gate.enter("a")
    gate.enter("b")
    gate.enter("c")
    gate.withdraw("b")
    assert gate.leave() == "c"


def test_at_least_one_login_gets_through() -> None:
    with pytest.raises(ValueError):
        Gate(0)


async def test_no_more_than_the_limit_run_at_once_and_all_run() -> None:
    gate = Gate(3)
    running = 0
    most = 0
    order: list[int] = []

    async def login(number: int) -> None:
        nonlocal running, most
        async with turn(gate):
            running += 1
            most = max(most, running)
            order.append(number)
            await asyncio.sleep(0.001)
            running -= 1

    await asyncio.gather(*(login(n) for n in range(50)))
    assert most == 3
    assert order == list(range(50))  # first come, first served
    assert (gate.in_flight, gate.waiting) == (0, 0)


async def test_a_login_cancelled_in_line_loses_no_place() -> None:
    gate = Gate(1)
    release = asyncio.Event()
    entered: list[str] = []

    async def login(name: str) -> None:
        async with turn(gate):
            entered.append(name)
            await release.wait()

    first = asyncio.create_task(login("first"))
    await asyncio.sleep(0)
    second = asyncio.create_task(login("second"))
    third = asyncio.create_task(login("third"))
    await asyncio.sleep(0)
    assert gate.waiting == 2
    second.cancel()  # e.g. the server shuts down while it waits
    release.set()
    await asyncio.gather(first, third, return_exceptions=True)
    assert second.cancelled()
    assert entered == ["first", "third"]
    assert (gate.in_flight, gate.waiting) == (0, 0)


async def test_a_login_that_fails_passes_its_place_on() -> None:
    gate = Gate(1)

    async def failing() -> None:
        async with turn(gate):
            raise OSError("refused")

    async def fine() -> str:
        async with turn(gate):
            return "in"

    results = await asyncio.gather(failing(), fine(), return_exceptions=True)
    assert isinstance(results[0], OSError) and results[1] == "in"
    assert gate.in_flight == 0


def test_the_watch_says_when_the_line_is_full_and_when_it_has_drained() -> None:
    gate = Gate(1)
    said: list[bool] = []
    gate.watch(4, said.append)
    assert gate.enter("in")
    for ticket in "abc":
        gate.enter(ticket)
    assert said == []
    gate.enter("d")  # the 4th waiting
    gate.enter("e")
    assert said == [True]
    gate.leave()  # 4 wait
    gate.withdraw("e")  # 3 wait
    assert said == [True]
    gate.leave()  # 2 wait: half of the high water
    assert said == [True, False]
    gate.leave()
    gate.leave()
    assert said == [True, False]
