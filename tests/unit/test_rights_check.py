"""adapter/amqp/rights_check.py without a broker: the question asked of the broker is replaced
by one the test answers, so what is checked is the sharing of checks: a join never gets an
answer that began before it arrived, joins that arrive while a check runs share the next one,
and every waiter gets the refusal."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from adapter.amqp.connection import AmqpError
from adapter.amqp.rights_check import RightsCheck
from adapter.mapping import operations as ops


class Spawner:
    """The server's ``spawn``: the checks' tasks (and its login timeout, which bounds a check)."""

    login_timeout = 5.0

    def spawn(self, coro: Any) -> asyncio.Task[None]:
        return asyncio.get_running_loop().create_task(coro)


class AnsweredCheck(RightsCheck):
    """A RightsCheck whose broker is the test: each check waits for the test's answer."""

    __slots__ = ("answers", "asked")

    def __init__(self) -> None:
        services = Spawner()
        super().__init__(
            services,  # type: ignore[arg-type]
            asyncio.get_running_loop(),
            ("u", "p", "/"),
            ops.QueueBind("q", "x", "k"),
            "t",
            min_interval=0.0,
        )
        self.asked: list[asyncio.Future[None]] = []

    async def _ask(self) -> None:
        answer: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.asked.append(answer)
        await answer


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_join_waits_for_a_check_that_began_after_it_arrived() -> None:
    check = AnsweredCheck()
    first = asyncio.ensure_future(check.confirm())
    await settle()
    assert len(check.asked) == 1
    late = [asyncio.ensure_future(check.confirm()) for _ in range(50)]  # arrive while it runs
    await settle()
    check.asked[0].set_result(None)
    await settle()
    assert first.done() and not any(join.done() for join in late)  # the first answer is too old
    assert len(check.asked) == 2  # one more check for all fifty
    check.asked[1].set_result(None)
    await settle()
    assert all(join.done() and join.exception() is None for join in late)
    assert check.checks == 2


async def test_a_refusal_reaches_every_join_waiting_for_it() -> None:
    check = AnsweredCheck()
    joins = [asyncio.ensure_future(check.confirm()) for _ in range(3)]
    await settle()
    for answer in range(2):  # the first join's check, then the one the two others share
        check.asked[answer].set_exception(AmqpError(403, "ACCESS_REFUSED - access to exchange 'amq.topic'"))
        await settle()
    errors = [join.exception() for join in joins]
    assert all(isinstance(e, AmqpError) and e.code == 403 for e in errors)


async def test_a_broker_that_cannot_be_asked_refuses_the_join_with_code_0() -> None:
    check = AnsweredCheck()
    join = asyncio.ensure_future(check.confirm())
    await settle()
    check.asked[0].set_exception(OSError("connection refused"))
    with pytest.raises(AmqpError) as error:
        await join
    assert error.value.code == 0 and "could not be asked" in error.value.text


async def test_a_join_that_goes_away_does_not_cancel_the_check_the_others_wait_for() -> None:
    check = AnsweredCheck()
    leaving = asyncio.ensure_future(check.confirm())
    staying = asyncio.ensure_future(check.confirm())
    await settle()
    leaving.cancel()
    await settle()
    check.asked[0].set_result(None)
    await settle()
    assert len(check.asked) == 2  # staying arrived during the first check: it waits for the next
    check.asked[1].set_result(None)
    await settle()
    assert staying.done() and staying.exception() is None


def test_which_failures_say_the_rights_are_gone() -> None:
    from adapter.amqp.rights_check import revokes

    assert revokes(AmqpError(403, "ACCESS_REFUSED - access to exchange 'amq.topic' refused"))
    assert revokes(AmqpError(530, "NOT_ALLOWED - access to vhost '/' refused for user 'u'"))
    # limits and failures to ask say nothing about the user's rights: the group goes on
    assert not revokes(
        AmqpError(
            530, "NOT_ALLOWED - access to vhost 'v' refused for user 'u': connection limit (3) is reached"
        )
    )
    assert not revokes(
        AmqpError(530, "NOT_ALLOWED - number of channels opened for user 'u' has reached the limit")
    )
    assert not revokes(AmqpError(0, "the broker could not be asked: timed out"))
    assert not revokes(AmqpError(406, "PRECONDITION_FAILED - inequivalent arg"))


async def test_a_check_that_never_answers_fails_within_the_login_timeouts() -> None:
    class Stuck(AnsweredCheck):
        async def _ask(self) -> None:
            await asyncio.sleep(3600)

    check = Stuck()
    check._services.login_timeout = 0.01  # type: ignore[attr-defined]
    with pytest.raises(AmqpError) as error:
        await check.confirm()
    assert error.value.code == 0


async def test_rounds_start_at_most_once_per_interval() -> None:
    check = AnsweredCheck()
    check._min_interval = 0.2
    first = asyncio.ensure_future(check.confirm())
    await settle()
    check.asked[0].set_result(None)
    await first
    second = asyncio.ensure_future(check.confirm())
    await settle()
    assert len(check.asked) == 1  # waits out the interval before it asks
    await asyncio.sleep(0.25)
    assert len(check.asked) == 2
    check.asked[1].set_result(None)
    await second
