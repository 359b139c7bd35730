"""adapter/server/sharedcaps.py: the connection caps of --workers N, counted for the worker set
in shared memory.  The workers are played by counters of one table in this process, and, for
the lock, by real processes taking slots at the same time."""

from __future__ import annotations

import multiprocessing

import pytest

from adapter.caps import ConnectionCap
from adapter.server.sharedcaps import CapTable


@pytest.fixture
def table():
    table = CapTable.create(2, 3)
    yield table
    table.close()


def test_the_limit_holds_for_the_workers_together(table: CapTable) -> None:
    a, b, c = (ConnectionCap(4, table.count(0, slot, 4)) for slot in range(3))
    assert a.acquire("a1") and a.acquire("a2") and b.acquire("b1") and c.acquire("c1")
    assert not b.acquire("b2") and not a.acquire("a3")
    assert table.in_use(0) == 4
    c.release("c1")
    assert b.acquire("b2")  # a slot another worker gave back
    assert (table.held(0, 0), table.held(0, 1), table.held(0, 2)) == (2, 2, 0)


def test_a_holder_counts_once_and_a_second_release_frees_nothing(table: CapTable) -> None:
    cap = ConnectionCap(2, table.count(0, 0, 2))
    other = ConnectionCap(2, table.count(0, 1, 2))
    assert cap.acquire("x") and cap.acquire("x")
    assert table.in_use(0) == 1
    assert other.acquire("y")
    cap.release("x")
    cap.release("x")
    cap.release("never admitted")
    assert table.in_use(0) == 1 and other.holds("y")


def test_rows_count_apart(table: CapTable) -> None:
    stomp = ConnectionCap(1, table.count(0, 0, 1))
    web = ConnectionCap(1, table.count(1, 0, 1))
    assert stomp.acquire("s") and web.acquire("w")
    assert not stomp.acquire("s2") and not web.acquire("w2")


def test_a_dead_workers_slots_come_back(table: CapTable) -> None:
    """The supervisor zeroes the column of a worker that exited: whatever it held (it could
    not give anything back) is free for the others at once."""
    dead = ConnectionCap(3, table.count(0, 1, 3))
    alive = ConnectionCap(3, table.count(0, 2, 3))
    assert dead.acquire(1) and dead.acquire(2) and alive.acquire(3)
    assert not alive.acquire(4)
    table.clear(1)
    assert table.in_use(0) == 1
    assert alive.acquire(4) and alive.acquire(5)
    assert not alive.acquire(6)


def test_zero_refuses_everyone(table: CapTable) -> None:
    assert not ConnectionCap(0, table.count(0, 0, 0)).acquire("x")
    assert table.in_use(0) == 0


def test_a_counter_outside_the_table_is_a_bug(table: CapTable) -> None:
    with pytest.raises(ValueError):
        table.count(2, 0, 1)
    with pytest.raises(ValueError):
        table.count(0, 3, 1)


def _storm(fd: int, slot: int, tries: int, start: multiprocessing.synchronize.Event) -> None:
    table = CapTable(fd, 2, 3)
    count = table.count(0, slot, 50)
    start.wait()
    for _ in range(tries):
        count.take()


def test_workers_taking_at_once_never_pass_the_limit(table: CapTable) -> None:
    """Three processes take slots as fast as they can, 2,000 tries each, for a limit of 50:
    the table's lock makes each take see every column, so exactly 50 are admitted."""
    context = multiprocessing.get_context("fork")
    start = context.Event()
    workers = [context.Process(target=_storm, args=(table.fd, slot, 2000, start)) for slot in range(3)]
    for worker in workers:
        worker.start()
    start.set()
    for worker in workers:
        worker.join(60)
        assert worker.exitcode == 0
    assert table.in_use(0) == 50
