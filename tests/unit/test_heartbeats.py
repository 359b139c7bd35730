"""adapter/server/heartbeats.py: the STOMP heart-beat timers over a fake host.  The ticks are
called directly (no waiting for a timer): the timers are checked to be armed, not to fire."""

from __future__ import annotations

import asyncio

from adapter.server.heartbeats import HeartBeats


class Host:
    def __init__(self) -> None:
        self.pending = False
        self.excused = False
        self.beats = 0
        self.timed_out: list[float] = []

    def heartbeat_output_pending(self) -> bool:
        return self.pending

    def write_heartbeat(self) -> None:
        self.beats += 1

    def reading_excused(self) -> bool:
        return self.excused

    def heartbeat_timed_out(self, interval: float) -> None:
        self.timed_out.append(interval)

    def idle_timed_out(self, seconds: float) -> None:
        self.timed_out.append(-seconds)  # negative: the idle timeout, not a heart-beat one


def make() -> tuple[HeartBeats, Host]:
    host = Host()
    return HeartBeats(host, asyncio.get_running_loop()), host


async def test_nothing_is_armed_before_start_or_with_zero_intervals() -> None:
    beats, _host = make()
    assert not beats.running
    beats.start(0, 0)
    assert not beats.running


async def test_start_arms_both_and_stop_cancels_both() -> None:
    beats, _host = make()
    beats.start(0.5, 1.5)
    assert beats.running
    beats.stop()
    assert not beats.running


async def test_start_forgets_reads_from_before_the_negotiation() -> None:
    beats, _host = make()
    beats.liveness.read = True
    beats.start(0, 1.0)
    assert beats.liveness.read is False
    beats.stop()


async def test_a_silent_send_interval_writes_one_heart_beat_and_rearms() -> None:
    beats, host = make()
    beats.start(10, 0)
    beats.send_tick(10)
    assert host.beats == 1 and beats.running
    beats.liveness.wrote = True  # a flush happened meanwhile
    beats.send_tick(10)
    assert host.beats == 1
    beats.stop()


async def test_pending_output_replaces_the_heart_beat() -> None:
    beats, host = make()
    host.pending = True
    beats.send_tick(10)
    assert host.beats == 0
    beats.stop()


async def test_a_silent_client_times_out_once_and_the_timers_stop() -> None:
    beats, host = make()
    beats.start(10, 15)
    beats.receive_tick(15)
    assert host.timed_out == [15] and not beats.running


async def test_a_client_that_read_stays() -> None:
    beats, host = make()
    beats.start(0, 15)
    beats.liveness.read = True
    beats.receive_tick(15)
    assert host.timed_out == [] and beats.running
    beats.stop()


async def test_a_client_we_do_not_read_is_excused() -> None:
    beats, host = make()
    host.excused = True
    beats.receive_tick(15)
    assert host.timed_out == []
    beats.stop()


async def test_without_heart_beats_the_idle_timeout_gives_up_a_silent_client() -> None:
    """adapter.idle_client_timeout: with no receive interval negotiated, the first tick (one per
    timeout) that finds nothing read gives the client up; a tick after a read, or while the
    adapter does not read the client, does not."""
    beats, host = make()
    beats.start(0, 0, idle=10.0)
    assert beats.running
    beats.liveness.read = True
    beats.idle_tick(10.0)  # it spoke
    host.excused = True
    beats.idle_tick(10.0)  # not read by the adapter: not the client's silence
    assert host.timed_out == []
    host.excused = False
    beats.idle_tick(10.0)
    assert host.timed_out == [-10.0] and not beats.running


async def test_a_negotiated_receive_interval_takes_precedence_over_the_idle_timeout() -> None:
    beats, host = make()
    beats.start(0, 1.5, idle=10.0)
    beats.receive_tick(1.5)
    assert host.timed_out == [1.5]


async def test_a_heartbeat_write_that_closes_the_connection_leaves_no_timer_armed() -> None:
    """A write that fails closes the connection at once (the timers are closed meanwhile): the
    tick must not re-arm itself on a closed connection, which would keep it alive for ever."""
    beats, host = make()

    def write_and_close() -> None:
        host.beats += 1
        beats.stop()

    host.write_heartbeat = write_and_close  # type: ignore[method-assign]
    beats.start(0.5, 0)
    beats.send_tick(0.5)
    assert host.beats == 1
    assert not beats.running
