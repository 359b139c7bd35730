"""The connection cap (adapter/caps.py): stomp.max_connections and web_stomp.max_connections."""

from __future__ import annotations

import pytest

from adapter.caps import ConnectionCap, worker_share


def test_admits_up_to_the_limit_then_refuses() -> None:
    cap = ConnectionCap(2)
    a, b, c = object(), object(), object()
    assert cap.acquire(a) and cap.acquire(b)
    assert not cap.acquire(c)
    assert cap.in_use == 2
    assert not cap.holds(c)


def test_a_released_slot_is_admitted_again() -> None:
    cap = ConnectionCap(1)
    a, b = object(), object()
    assert cap.acquire(a)
    assert not cap.acquire(b)
    cap.release(a)
    assert cap.in_use == 0
    assert cap.acquire(b)


def test_acquire_and_release_are_idempotent_per_holder() -> None:
    """A holder counts once however often it asks (a second CONNECT), and a second release
    (the connection's close reported twice) frees nothing that belongs to another."""
    cap = ConnectionCap(2)
    a, b = object(), object()
    assert cap.acquire(a) and cap.acquire(a)
    assert cap.in_use == 1
    assert cap.acquire(b)
    cap.release(a)
    cap.release(a)
    cap.release(object())  # never admitted: nothing to free
    assert cap.in_use == 1 and cap.holds(b)


def test_limit_zero_refuses_everyone() -> None:
    cap = ConnectionCap(0)
    assert not cap.acquire(object())
    assert cap.in_use == 0


def test_no_limit() -> None:
    cap = ConnectionCap(None)
    holders = [object() for _ in range(1000)]
    assert all(cap.acquire(h) for h in holders)
    assert cap.in_use == 1000


def test_negative_limit_is_a_bug() -> None:
    with pytest.raises(ValueError):
        ConnectionCap(-1)


@pytest.mark.parametrize(
    ("limit", "workers", "share"),
    [(None, 4, None), (10, 1, 10), (10, 4, 3), (8, 4, 2), (1, 4, 1), (0, 4, 0), (3, 8, 1)],
)
def test_worker_share_is_the_ceiling(limit: int | None, workers: int, share: int | None) -> None:
    assert worker_share(limit, workers) == share
