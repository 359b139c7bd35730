"""adapter/amqp/link_lifecycle.py: a client connection's way to its AMQP link and back, over
in-memory links (tests/unit/fake_amqp.py): the queues left to delete go first, a deletion that
fails does not keep the link, closes take their turn and a shutdown's cancel drops the link, a
link that came after its client left is closed (or given back with reuse)."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

import pytest

from adapter.amqp.admission import Gate
from adapter.amqp.brokers import BrokerNodes, parse_nodes
from adapter.amqp.connection import AmqpError
from adapter.amqp.link_lifecycle import LinkGlue
from adapter.amqp.login import BrokerLogin
from tests.unit.fake_amqp import FakeAmqp
from tests.unit.test_login import Services as LoginServices


@dataclass
class Services(LoginServices):
    amqp_closes: Gate = field(default_factory=lambda: Gate(1))
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def spawn(self, coro: Any) -> asyncio.Task[None]:
        task = asyncio.ensure_future(coro)
        self.tasks.append(task)
        return task


def make(**options: Any) -> tuple[LinkGlue[BrokerLogin], Services]:
    services = Services(BrokerNodes(parse_nodes("amqp://guest:guest@node-a:5672/")), **options)
    return LinkGlue(services, BrokerLogin(services, asyncio.get_running_loop())), services


class Undeletable(FakeAmqp):
    async def delete_queue_on_fresh_channel(self, queue: str) -> None:
        raise AmqpError(403, "ACCESS_REFUSED - no configure access")


async def test_at_the_end_the_queues_left_go_first_then_the_link() -> None:
    glue, services = make()
    glue.delete_on_close.append("sub-q")
    link, done = FakeAmqp(None), []
    glue.close(link, "10.0.0.1:4000", session_failed=False, done=lambda: done.append(True))  # type: ignore[arg-type]
    assert done == []  # in the background
    await services.tasks[0]
    assert link.deleted == ["sub-q"] and link.closed and done == [True]


async def test_a_queue_that_cannot_be_deleted_is_logged_and_the_link_still_goes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    glue, services = make()
    glue.delete_on_close.append("sub-q")
    link = Undeletable(None)
    with caplog.at_level(logging.INFO, "adapter.connection"):
        glue.close(link, "10.0.0.1:4000", session_failed=False, done=lambda: None)  # type: ignore[arg-type]
        await services.tasks[0]
    assert "peer=10.0.0.1:4000: could not delete subscription queue 'sub-q'" in caplog.text
    assert link.closed


async def test_closes_take_their_turn_and_a_shutdown_drops_the_one_waiting() -> None:
    glue, services = make()
    assert services.amqp_closes.try_enter()  # every place taken
    link, done = FakeAmqp(None), []
    glue.close(link, "peer", session_failed=False, done=lambda: done.append(True))  # type: ignore[arg-type]
    await asyncio.sleep(0)
    assert not link.closed and services.amqp_closes.waiting == 1
    services.tasks[0].cancel()  # the shutdown's deadline
    with pytest.raises(asyncio.CancelledError):
        await services.tasks[0]
    await asyncio.sleep(0)
    assert link.dropped and not link.closed and done == [True]


async def test_a_link_closed_already_is_done_at_once() -> None:
    glue, services = make()
    done: list[bool] = []
    closed = FakeAmqp(None)
    closed.is_open = False  # the broker closed it
    glue.close(closed, "peer", session_failed=False, done=lambda: done.append(True))  # type: ignore[arg-type]
    assert done == [True] and services.tasks == [] and not closed.closed


async def test_a_link_that_came_after_its_client_left_is_closed_or_given_back() -> None:
    glue, services = make()
    link = FakeAmqp(None)
    glue.came_too_late(link, session_failed=True)  # type: ignore[arg-type]
    assert link.closed and services.tasks == []  # no reuse: closed at once
    glue, services = make(amqp_reuse=object())
    given_back = FakeAmqp(None)
    glue.came_too_late(given_back, session_failed=False)  # type: ignore[arg-type]
    assert not given_back.closed and len(services.tasks) == 1  # released in the background
    await services.tasks[0]
    assert given_back.closed  # BrokerLogin.release: the pool takes only AMQP connections
