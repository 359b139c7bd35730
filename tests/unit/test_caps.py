"""The connection cap (adapter/caps.py): stomp.max_connections and web_stomp.max_connections."""

from __future__ import annotations

import json
import socket

import pytest

from adapter.caps import ConnectionCap
from adapter.cli import cap_rows, session_settings, web_listeners
from adapter.config import load_settings
from adapter.server.sharedcaps import CapTable
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


def test_each_web_listener_counts_alone_and_a_worker_counts_in_the_shared_table() -> None:
    """stomp.max_connections = 10 and web_stomp.max_connections = 5 with two ws:// listeners:
    one process applies the values as they are; a worker of --workers 4 applies the same
    values to the rows of the table its supervisor shares (row 0 STOMP, then one per web
    listener), so the limits hold for the worker set together."""
    settings = load_settings(
        None,
        {
            "max_connections": 10,
            "web_stomp_max_connections": 5,
            "web_stomp_listeners": ["127.0.0.1:0", "127.0.0.1:0"],
        },
    )
    assert session_settings(settings).registries.connection_cap.limit == 10  # type: ignore[union-attr]
    first, second = web_listeners(settings)
    assert first.cap is not None and second.cap is not None and first.cap is not second.cap
    assert (first.cap.limit, second.cap.limit) == (5, 5)
    assert cap_rows(settings) == 3

    table = CapTable.create(cap_rows(settings), 4)
    with socket.socket() as control:
        worker = WorkerSpec(2, control, {}, 4, table)
        cap = session_settings(settings, worker).registries.connection_cap
        assert cap is not None and cap.limit == 10
        assert cap.acquire(object())
        assert table.held(0, 2) == 1  # this worker's column of the STOMP row
        first, second = web_listeners(settings, worker)
        assert first.cap is not None and second.cap is not None
        assert second.cap.acquire(object())
        assert (table.held(1, 2), table.held(2, 2)) == (0, 1)
        control.detach()
    table.close()

    unlimited = load_settings(None, {"web_stomp_listeners": ["127.0.0.1:0"]})
    assert session_settings(unlimited).registries.connection_cap is None
    assert web_listeners(unlimited)[0].cap is None
    assert cap_rows(unlimited) == 0  # no table at all


def test_the_worker_spec_carries_the_number_of_workers() -> None:
    with socket.socket() as control:
        text = json.dumps({"slot": 1, "control": control.fileno(), "listeners": [], "workers": 4})
        spec = WorkerSpec.parse(text)
        assert spec.workers == 4
        spec.control.detach()  # the same descriptor as ``control``


def test_the_worker_spec_carries_the_cap_table() -> None:
    table = CapTable.create(2, 3)
    with socket.socket() as control:
        text = json.dumps(
            {"slot": 1, "control": control.fileno(), "listeners": [], "workers": 3, "caps": [table.fd, 2]}
        )
        spec = WorkerSpec.parse(text)
        assert spec.caps is not None and (spec.caps.rows, spec.caps.workers) == (2, 3)
        spec.caps.count(1, 1, 5).take()
        assert table.held(1, 1) == 1  # the same memory
        spec.control.detach()
    table.close()
