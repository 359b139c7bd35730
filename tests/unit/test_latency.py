"""adapter/server/latency.py: the confirm and receipt clocks, over real ServerStats histograms."""

from __future__ import annotations

from adapter.server import latency
from adapter.server.latency import LatencyClocks
from adapter.server.stats import ServerStats
from adapter.stomp.frame import Frame


def frame(command: str, receipt: str) -> Frame:
    return Frame(command, {"receipt": receipt}, b"")


def test_nothing_is_timed_without_confirms() -> None:
    stats = ServerStats()
    clocks = LatencyClocks(stats)
    clocks.time_publish(0)
    assert clocks.timed_publish == 0
    clocks.confirmed(1, False)
    assert stats.confirm_latency.observations == 0


def test_one_publish_at_a_time_is_timed_until_its_confirm() -> None:
    stats = ServerStats()
    clocks = LatencyClocks(stats)
    clocks.time_publish(3)
    clocks.confirmed(2, False)  # an earlier one
    assert stats.confirm_latency.observations == 0 and clocks.timed_publish == 3
    clocks.confirmed(3, False)
    assert stats.confirm_latency.observations == 1 and clocks.timed_publish == 0


def test_a_multiple_confirm_beyond_the_timed_publish_covers_it() -> None:
    stats = ServerStats()
    clocks = LatencyClocks(stats)
    clocks.time_publish(3)
    clocks.confirmed(7, True)
    assert stats.confirm_latency.observations == 1


def test_a_receipt_is_observed_under_its_command() -> None:
    stats = ServerStats()
    clocks = LatencyClocks(stats)
    clocks.receipt_asked(frame("SUBSCRIBE", "r1"))
    assert clocks.waiting == 1
    clocks.receipt_sent("r1")
    assert stats.receipt_latency["SUBSCRIBE"].observations == 1 and clocks.waiting == 0


def test_an_unknown_receipt_is_ignored() -> None:
    stats = ServerStats()
    LatencyClocks(stats).receipt_sent("never-asked")
    assert stats.receipt_latency == {}


def test_connect_is_answered_by_connected_not_timed() -> None:
    clocks = LatencyClocks(ServerStats())
    clocks.receipt_asked(frame("CONNECT", "c"))
    clocks.receipt_asked(frame("STOMP", "s"))
    assert clocks.waiting == 0


def test_a_reused_receipt_id_is_timed_in_order() -> None:
    stats = ServerStats()
    clocks = LatencyClocks(stats)
    clocks.receipt_asked(frame("SEND", "same"))
    clocks.receipt_asked(frame("UNSUBSCRIBE", "same"))
    assert clocks.waiting == 2
    clocks.receipt_sent("same")
    clocks.receipt_sent("same")
    assert stats.receipt_latency["SEND"].observations == 1
    assert stats.receipt_latency["UNSUBSCRIBE"].observations == 1
    assert clocks.waiting == 0


def test_the_frames_of_one_read_share_one_clock_reading() -> None:
    clocks = LatencyClocks(ServerStats())
    clocks.receipt_asked(frame("SEND", "a"))
    first = clocks.read_clock
    clocks.receipt_asked(frame("SEND", "b"))
    assert first and clocks.read_clock == first
    clocks.read_clock = 0.0  # the shell, as the next batch starts
    clocks.receipt_asked(frame("SEND", "c"))
    assert clocks.read_clock >= first


def test_receipts_released_by_one_confirm_share_its_reading() -> None:
    stats = ServerStats()
    clocks = LatencyClocks(stats)
    clocks.receipt_asked(frame("SEND", "a"))
    clocks.confirmed(1, False)  # nothing timed for confirms, but receipts wait: one reading
    assert clocks.confirm_clock > 0
    clocks.receipt_sent("a")
    assert stats.receipt_latency["SEND"].total == clocks.confirm_clock - clocks.read_clock


def test_receipts_that_never_come_do_not_grow_without_bound(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(latency, "MAX_TIMED_RECEIPTS", 3)
    clocks = LatencyClocks(ServerStats())
    for n in range(10):
        clocks.receipt_asked(frame("SEND", f"r{n}"))
    assert clocks.waiting <= 3
