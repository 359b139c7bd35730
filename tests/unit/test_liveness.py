"""adapter/liveness.py: the pure heart-beat monitor shared by the STOMP shell and the AMQP link.
No loop, no socket: flags and ticks in, decisions out."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from adapter.liveness import Liveness


def test_a_silent_side_writes_a_heart_beat() -> None:
    monitor = Liveness()
    assert monitor.send_tick() is True


def test_written_bytes_count_as_a_heart_beat_for_one_tick() -> None:
    monitor = Liveness()
    monitor.wrote = True
    assert monitor.send_tick() is False
    assert monitor.wrote is False  # the next interval starts silent
    assert monitor.send_tick() is True


def test_output_about_to_be_written_counts_as_a_heart_beat() -> None:
    monitor = Liveness()
    assert monitor.send_tick(output_pending=True) is False


def test_a_read_keeps_the_peer_alive_for_one_tick() -> None:
    monitor = Liveness()
    monitor.read = True
    assert monitor.receive_tick() is False
    assert monitor.read is False
    assert monitor.receive_tick() is True  # STOMP: one silent interval (already with tolerance)


def test_silence_while_we_do_not_read_is_excused() -> None:
    monitor = Liveness()
    assert monitor.receive_tick(excused=True) is False
    assert monitor.missed == 0


def test_amqp_link_numbers_four_silent_ticks_fail() -> None:
    """The AMQP link ticks at half the interval and gives the broker two intervals."""
    monitor = Liveness(misses_allowed=4)
    assert [monitor.receive_tick() for _ in range(3)] == [False, False, False]
    assert monitor.receive_tick() is True


def test_one_read_restarts_the_count_of_silent_ticks() -> None:
    monitor = Liveness(misses_allowed=4)
    for _ in range(3):
        monitor.receive_tick()
    monitor.read = True
    assert monitor.receive_tick() is False
    assert monitor.missed == 0
    assert [monitor.receive_tick() for _ in range(4)] == [False, False, False, True]


def test_an_excused_tick_restarts_the_count() -> None:
    monitor = Liveness(misses_allowed=2)
    monitor.receive_tick()
    monitor.receive_tick(excused=True)
    assert monitor.receive_tick() is False


def test_send_and_receive_are_independent() -> None:
    monitor = Liveness()
    monitor.read = True
    assert monitor.send_tick() is True
    assert monitor.read is True  # a send tick does not consume the peer's liveness
    monitor.wrote = True
    assert monitor.receive_tick() is False
    assert monitor.wrote is True


def test_reset_forgets_everything() -> None:
    monitor = Liveness(misses_allowed=3)
    monitor.read = monitor.wrote = True
    monitor.missed = 2
    monitor.reset()
    assert (monitor.read, monitor.wrote, monitor.missed) == (False, False, 0)


def test_at_least_one_miss_is_needed() -> None:
    with pytest.raises(ValueError):
        Liveness(misses_allowed=0)


def test_the_monitor_imports_nothing() -> None:
    """Pure: usable by the asyncio shell, the AMQP link and a blocking client alike."""
    source = Path(__file__).resolve().parents[2] / "adapter" / "liveness.py"
    imports = [
        node
        for node in ast.walk(ast.parse(source.read_text()))
        if isinstance(node, ast.Import | ast.ImportFrom)
    ]
    assert all(isinstance(node, ast.ImportFrom) and node.module == "__future__" for node in imports)
