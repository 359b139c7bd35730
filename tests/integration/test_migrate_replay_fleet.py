"""The replay at fleet scale (issue #34), against in-process adapters in the activemq profile:
related connections in order and unrelated ones concurrently, a recording made by the
project's own tap replayed without differences, logins refused as results (and a replay whose
first logins are all refused stopped with the reason), results written as connections end,
and an interrupted replay's summary.  Timings are bench/replay_fleet.py's, not these tests'."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from adapter.migrate.cli import main
from adapter.migrate.recording import load_conversations
from adapter.migrate.replay import ConnectionResult, Replayer, ReplayOptions
from bench.replay_fleet import drive_fleet
from tests.recordings import Recording
from tests.support import AdapterProcess, BrokerProbe, unique
from tests.tap_support import TapProcess


def _unrelated_producers(
    recording: Recording, count: int, tag: str, login: str = "guest", gap: float = 0.0
) -> list[str]:
    """``count`` connections, each sending one message with a receipt to its own queue, one
    every ``gap`` seconds."""
    ids = []
    for n in range(count):
        recording.tick(gap)
        producer = recording.connection(f"10.0.1.{n}").connect("1.2", login=login)
        producer.send("SEND", [("destination", f"/queue/{tag}.{n}"), ("receipt", "sent")], b"x")
        producer.receipt("sent")
        producer.send("DISCONNECT", [("receipt", "bye")])
        producer.receipt("bye")
        producer.close()
        ids.append(producer.id)
    return ids


def test_a_recording_the_tap_made_of_a_small_fleet_replays_without_differences(
    start_adapter: Callable[..., AdapterProcess], broker: BrokerProbe, tmp_path: Path
) -> None:
    """bench/replay_fleet.py's fleet (long consumers and responders, short producers,
    requesters over temporary queues, job pollers, a durable subscriber coming back with its
    client-id) through the tap in front of an adapter, then replayed without pauses against
    another adapter: every connection replayed, none with a difference."""
    tag = unique("fleet")
    for kind in ("orders", "rpc", "jobs"):
        broker.track_queue(f"{tag}.a0.{kind}")
    recorded_on = start_adapter(profile="activemq").port
    tap = TapProcess(f"127.0.0.1:{recorded_on}", tmp_path / "rec", "--record-bodies")
    try:
        opened = asyncio.run(drive_fleet("127.0.0.1", tap.port, connections=60, span=4.0, tag=tag))
    finally:
        assert tap.stop() == 0
    events = load_conversations(tmp_path / "rec", need_bodies=True)
    replayer = Replayer(
        events, ReplayOptions("127.0.0.1", start_adapter(profile="activemq").port, speed=0, passcode="guest")
    )
    results = asyncio.run(replayer.run())
    assert len(results) == opened == replayer.total
    assert [r.describe() for r in results if r.differences or r.not_sent] == []
    assert len(replayer.groups) > 1  # the fleet's queues are unrelated: several groups


def test_an_unrelated_connection_is_not_held_up_by_one_that_waits(
    start_adapter: Callable[..., AdapterProcess], tmp_path: Path
) -> None:
    """The first connection's ACK waits for a message the target never delivers (the recording
    began after it was sent); a connection on another queue, recorded after that ACK, is
    replayed and ends meanwhile."""
    recording = Recording(tmp_path / "rec", bodies=True)
    tag = unique("apart")
    waiting = recording.connection("10.0.0.1").connect("1.2")
    waiting.send("SUBSCRIBE", [("destination", f"/queue/{tag}.never"), ("id", "1"), ("ack", "client")])
    waiting.send("ACK", [("id", waiting.message("1", f"/queue/{tag}.never", b"before the recording"))])
    waiting.send("DISCONNECT")
    waiting.close()
    (other,) = _unrelated_producers(recording, 1, tag)
    recording.close()
    port = start_adapter(profile="activemq").port
    events = load_conversations(tmp_path / "rec", need_bodies=True)

    async def scenario() -> tuple[list[str], Replayer]:
        ended: list[str] = []
        other_ended = asyncio.Event()

        def on_result(result: ConnectionResult) -> None:
            ended.append(result.conn)
            if result.conn == other:
                other_ended.set()

        # the first connection waits up to 600 s for its message: the other one must not
        replayer = Replayer(
            events, ReplayOptions("127.0.0.1", port, speed=0, passcode="guest", wait=600), on_result
        )
        replaying = asyncio.create_task(replayer.run())
        await asyncio.wait_for(other_ended.wait(), 120)
        replaying.cancel()
        with pytest.raises(asyncio.CancelledError):
            await replaying
        return ended, replayer

    ended, replayer = asyncio.run(scenario())
    assert ended == [other]
    assert replayer.cut_short == 1  # the waiting one: closed by the cancel, no result
    assert [r.differences for r in replayer.results] == [[]]


def test_a_replay_whose_first_logins_are_refused_stops_and_says_to_give_a_passcode(
    start_adapter: Callable[..., AdapterProcess], tmp_path: Path, capsys, monkeypatch
) -> None:
    monkeypatch.delenv("STOMP_MIGRATE_PASSCODE", raising=False)
    recording = Recording(tmp_path / "rec", bodies=True)
    # one login every half second: the replay stops at the third, before the others start
    _unrelated_producers(recording, 12, unique("nopass"), gap=0.5)
    recording.close()
    port = start_adapter(profile="activemq").port
    status = main(["replay", str(tmp_path / "rec"), "--target", f"127.0.0.1:{port}", "--json"])
    captured = capsys.readouterr()
    assert status == 2
    assert "recordings hold no passcodes" in captured.err and "--passcode" in captured.err
    lines = [json.loads(line) for line in captured.out.splitlines()]
    *results, summary = lines
    assert len(results) == 3  # each refused login is a result of its own
    assert all(
        r["login_refused"]
        and {"what": "CONNECTED", "key": "login", "recorded": True, "replayed": False} in r["differences"]
        for r in results
    )
    assert summary["summary"]["stopped"].startswith("the target refused the first 3 logins")
    assert summary["summary"] | {"seconds": 0} == {
        "replayed": 3,
        "with_differences": 3,
        "connections": 12,
        "cut_short": 0,
        "seconds": 0,
        "interrupted": None,
        "stopped": summary["summary"]["stopped"],
    }


def test_refused_logins_after_an_accepted_one_are_results_and_the_replay_goes_on(
    start_adapter: Callable[..., AdapterProcess], tmp_path: Path, capsys
) -> None:
    recording = Recording(tmp_path / "rec", bodies=True)
    tag = unique("someone")
    accepted = _unrelated_producers(recording, 1, tag)
    refused = _unrelated_producers(recording, 4, f"{tag}.x", login="nobody-knows-me")
    recording.close()
    port = start_adapter(profile="activemq").port
    status = main(
        [
            "replay",
            str(tmp_path / "rec"),
            "--target",
            f"127.0.0.1:{port}",
            "--speed",
            "1",
            "--passcode",
            "guest",
            "--json",
        ]
    )
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    *results, summary = lines
    assert status == 1
    assert summary["summary"]["stopped"] is None and summary["summary"]["replayed"] == 5
    assert {r["conn"]: bool(r["login_refused"]) for r in results} == {
        **{conn: False for conn in accepted},
        **{conn: True for conn in refused},
    }


def test_stop_after_refused_logins_0_replays_every_refused_login_as_a_result(
    start_adapter: Callable[..., AdapterProcess], tmp_path: Path, capsys, monkeypatch
) -> None:
    monkeypatch.delenv("STOMP_MIGRATE_PASSCODE", raising=False)
    recording = Recording(tmp_path / "rec", bodies=True)
    ids = _unrelated_producers(recording, 5, unique("never"))
    recording.close()
    port = start_adapter(profile="activemq").port
    status = main(
        [
            "replay",
            str(tmp_path / "rec"),
            "--target",
            f"127.0.0.1:{port}",
            "--speed",
            "0",
            "--stop-after-refused-logins",
            "0",
        ]
    )
    out = capsys.readouterr().out
    assert status == 1
    assert sorted(line.split(" ")[0] for line in out.splitlines() if line.endswith(": differs")) == sorted(
        ids
    )
    assert out.count("login refused by the target") == 5
    assert out.endswith("5 connections replayed, 5 with differences\n")


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_replay_writes_what_it_replayed_and_a_summary(
    start_adapter: Callable[..., AdapterProcess], tmp_path: Path, signum: int
) -> None:
    """One connection ends at once; another one's next frame is an hour later in the
    recording.  The first result is on stdout before the replay ends (results as they come);
    the signal then ends the replay with the summary of what it did."""
    recording = Recording(tmp_path / "rec", bodies=True)
    tag = unique("cut")
    slow = recording.connection("10.0.0.1").connect("1.2")
    slow.send("SUBSCRIBE", [("destination", f"/queue/{tag}.slow"), ("id", "1"), ("receipt", "s")])
    slow.receipt("s")
    (quick,) = _unrelated_producers(recording, 1, tag)
    recording.tick(3600)
    slow.send("DISCONNECT")
    slow.close()
    recording.close()
    port = start_adapter(profile="activemq").port
    command = [
        sys.executable,
        "-m",
        "adapter.migrate",
        "replay",
        str(tmp_path / "rec"),
        "--target",
        f"127.0.0.1:{port}",
        "--passcode",
        "guest",
        "--json",
    ]
    environment = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment
    ) as child:
        assert child.stdout is not None
        first = json.loads(child.stdout.readline())
        assert first["conn"] == quick and first["differences"] == []
        child.send_signal(signum)
        rest = child.stdout.read()
        status = child.wait(60)
    assert status == 128 + signum
    (summary,) = [json.loads(line) for line in rest.splitlines()]
    assert summary["summary"] | {"seconds": 0} == {
        "replayed": 1,
        "with_differences": 0,
        "connections": 2,
        "cut_short": 1,
        "seconds": 0,
        "interrupted": signal.Signals(signum).name,
        "stopped": None,
    }
