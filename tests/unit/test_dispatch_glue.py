"""adapter/dispatch/runtime.py's DispatchGlue: a connection's acks for the queue dispatchers,
gathered and written one loop turn later, and the leave on close, over an in-memory channel."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from adapter.dispatch import rules as dispatch
from adapter.dispatch.runtime import DispatchGlue, DispatchMembership


@dataclass
class Owner:
    settled: list[tuple[int, bool, bool]] = field(default_factory=list)

    def deliver_dispatched(self, delivery: object) -> None:
        raise AssertionError("no delivery in these tests")

    def settle_dispatched(self, delivery_tag: int, ack: bool, requeue: bool) -> None:
        self.settled.append((delivery_tag, ack, requeue))


@dataclass
class Wire:
    written: list[tuple[str, int, bool]] = field(default_factory=list)
    flushes: int = 0

    def ack(self, delivery_tag: int, multiple: bool) -> None:
        self.written.append(("ack", delivery_tag, multiple))

    def nack(self, delivery_tag: int, multiple: bool, requeue: bool) -> None:
        self.written.append(("nack", delivery_tag, multiple))

    def flush(self) -> None:
        self.flushes += 1


def make(coalesce: bool = True) -> tuple[DispatchGlue, Wire, dict[str, Wire | None]]:
    loop = asyncio.get_running_loop()
    wire = Wire()
    current: dict[str, Wire | None] = {"channel": wire}
    link = DispatchMembership(Owner(), dispatch.Dispatchers(), "/", loop)
    glue = DispatchGlue(link, loop, lambda: current["channel"], lambda: coalesce)
    return glue, wire, current


async def test_acks_of_one_loop_turn_are_written_together_once() -> None:
    glue, wire, _current = make()
    glue.link.outstanding.update({1, 2, 3})
    for tag in (1, 2, 3):
        glue.settle(wire, tag, True, True)
    assert wire.written == []  # gathered
    await asyncio.sleep(0)
    assert wire.written == [("ack", 3, True)] and wire.flushes == 1


async def test_acks_stay_apart_when_the_channel_has_other_unsettled_deliveries() -> None:
    glue, wire, _current = make(coalesce=False)
    glue.link.outstanding.update({1, 2})
    glue.settle(wire, 1, True, True)
    glue.settle(wire, 2, True, True)
    await asyncio.sleep(0)
    assert wire.written == [("ack", 1, False), ("ack", 2, False)]


async def test_a_nack_is_written_at_once() -> None:
    glue, wire, _current = make()
    glue.link.outstanding.add(5)
    glue.settle(wire, 5, False, True)
    assert wire.written == [("nack", 5, False)]
    await asyncio.sleep(0)
    assert wire.flushes == 1


async def test_a_channel_gone_before_the_flush_gets_nothing() -> None:
    glue, wire, current = make()
    glue.link.outstanding.add(1)
    glue.settle(wire, 1, True, True)
    current["channel"] = None
    await asyncio.sleep(0)
    assert wire.written == [] and wire.flushes == 0


async def test_leaving_writes_the_gathered_acks_first() -> None:
    glue, wire, _current = make()
    glue.link.outstanding.update({1, 2})
    glue.settle(wire, 1, True, True)
    glue.leave()
    assert wire.written == [("ack", 1, False)]


async def test_leaving_without_a_channel_still_leaves() -> None:
    glue, _wire, current = make()
    current["channel"] = None
    glue.leave()  # nothing to write to; the members leave all the same
    glue.set_paused(True)
