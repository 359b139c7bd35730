"""The connection cap (adapter/caps.py): stomp.max_connections and web_stomp.max_connections."""

from __future__ import annotations

import json
import socket

import pytest

from adapter.caps import ConnectionCap, worker_share
from adapter.cli import session_settings, web_listeners
from adapter.config import load_settings
from adapter.server.workers import WorkerSpec


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


def test_each_worker_applies_its_share_and_each_web_listener_counts_alone() -> None:
    """--workers 4 with stomp.max_connections = 10 and web_stomp.max_connections = 5: each
    process admits 3 STOMP sessions and 2 sockets per web_stomp listener (two ws:// listeners
    here; a wss:// one is built the same way but needs a certificate)."""
    settings = load_settings(
        None,
        {
            "max_connections": 10,
            "web_stomp_max_connections": 5,
            "web_stomp_listeners": ["127.0.0.1:0", "127.0.0.1:0"],
        },
    )
    cap = session_settings(settings, 4).connection_cap
    assert cap is not None and cap.limit == 3
    assert session_settings(settings).connection_cap.limit == 10  # type: ignore[union-attr]
    first, second = web_listeners(settings, 4)
    assert first.cap is not None and second.cap is not None and first.cap is not second.cap
    assert (first.cap.limit, second.cap.limit) == (2, 2)
    unlimited = load_settings(None, {"web_stomp_listeners": ["127.0.0.1:0"]})
    assert session_settings(unlimited).connection_cap is None
    assert web_listeners(unlimited)[0].cap is None


def test_the_worker_spec_carries_the_number_of_workers() -> None:
    with socket.socket() as control:
        text = json.dumps({"slot": 1, "control": control.fileno(), "listeners": [], "workers": 4})
        spec = WorkerSpec.parse(text)
        assert spec.workers == 4
        spec.control.detach()  # the same descriptor as ``control``
