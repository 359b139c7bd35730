"""``python -m adapter.migrate replay`` against an in-process adapter in the activemq profile:
a synthetic recording of ActiveMQ applications (tests/recordings.py, with bodies) replayed,
and the differences it reports are exactly the documented ones of the idioms the profile does
not serve the same (docs/migration-activemq.md), none for the others."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

from adapter.mapping.profile import durable_subscription_queue
from adapter.migrate.cli import main
from adapter.migrate.recording import load_conversations
from adapter.migrate.replay import ConnectionResult, ReplayOptions, replay
from tests.recordings import Recording, fleet
from tests.support import AdapterProcess, BrokerProbe, unique


def _kinds(differences: list[dict[str, object]]) -> set[tuple[str, str]]:
    found = set()
    for difference in differences:
        what = str(difference["what"])
        if what == "ERROR":
            recorded = list(difference["recorded"])  # type: ignore[call-overload]
            for message in difference["replayed"]:  # type: ignore[attr-defined]
                if message not in recorded:
                    found.add(("error", message))
        elif what.startswith("RECEIPT "):
            found.add(("receipt", str(difference["key"])))
        else:
            found.add(("messages", str(difference["key"])))
    return found


def _replayed(directory: Path, start_adapter: Callable[..., AdapterProcess]) -> list[ConnectionResult]:
    """The recording in ``directory`` replayed, without pauses, against a new adapter in the
    activemq profile."""
    port = start_adapter(profile="activemq").port
    events = load_conversations(directory, need_bodies=True)
    return asyncio.run(replay(events, ReplayOptions("127.0.0.1", port, speed=0, passcode="guest")))


def test_replay_reports_the_documented_differences_and_no_other(
    start_adapter: Callable[..., AdapterProcess], broker: BrokerProbe, tmp_path: Path
) -> None:
    recording = Recording(tmp_path / "rec", bodies=True)
    expected = fleet(recording, tag=unique("rp"))
    recording.close()
    for queue in expected.queues:
        broker.track_queue(queue)
    port = start_adapter(profile="activemq").port
    out = tmp_path / "replay.json"
    status = main(
        [
            "replay",
            str(tmp_path / "rec"),
            "--target",
            f"127.0.0.1:{port}",
            "--speed",
            "0",
            "--passcode",
            "guest",
            "--login",
            "guest",
            "--vhost",
            "/",
            "--wait",
            "3",
            "--json",
            str(out),
        ]
    )
    results = {r["conn"]: r for r in json.loads(out.read_text())}
    assert status == 1  # differences found
    assert len(results) == expected.connections
    for conn, result in results.items():
        found = _kinds(result["differences"])
        wanted = expected.differences.get(conn, set())
        if ("error", "*") in wanted:  # RabbitMQ's wording of an exclusive-use refusal
            assert any(kind == "error" for kind, _ in found), (conn, result)
            found = {f for f in found if f[0] != "error"}
            wanted = wanted - {("error", "*")}
        assert found == wanted, (conn, result)


def test_replay_refuses_a_recording_without_bodies(tmp_path: Path, capsys) -> None:
    recording = Recording(tmp_path / "rec", bodies=False)
    fleet(recording, tag="nobodies")
    recording.close()
    status = main(["replay", str(tmp_path / "rec"), "--target", "127.0.0.1:9", "--passcode", "x"])
    assert status == 2
    assert "--record-bodies" in capsys.readouterr().err


def test_a_client_id_used_again_after_its_connection_closed_is_replayed_in_that_order(
    start_adapter: Callable[..., AdapterProcess], tmp_path: Path
) -> None:
    """A durable subscriber that disconnects and comes back with its client-id (php-stomp's
    ``unset`` then ``new Stomp``): the replay must end the first connection before it opens the
    second, or the target refuses the client-id as already connected."""
    recording = Recording(tmp_path / "rec", bodies=True)
    client_id = unique("again")
    first = recording.connection("10.0.0.7").connect(client_id=client_id)
    first.send("DISCONNECT")  # no receipt: nothing for the replay to wait for
    first.close()
    second = recording.connection("10.0.0.7").connect(client_id=client_id)
    second.close()
    recording.close()
    results = _replayed(tmp_path / "rec", start_adapter)
    assert [(r.client_id, r.differences, r.not_sent) for r in results] == [(client_id, [], 0)] * 2


def test_a_subscriber_that_disconnects_without_a_receipt_is_gone_before_the_next_send(
    start_adapter: Callable[..., AdapterProcess], broker: BrokerProbe, tmp_path: Path
) -> None:
    """Net::Stomp's durable scenario (tests/legacy/client.pl), as the tap recorded it in front of
    ActiveMQ: the subscriber (ack:auto) DISCONNECTs without a receipt and closes at once, a
    publisher sends two messages straight away, the subscriber comes back with its client-id
    and gets both.  The replay must not send those SENDs before the target has finished with
    the first connection: its consumer, not yet cancelled, would take a message, and the second
    subscriber would miss it."""
    recording = Recording(tmp_path / "rec", bodies=True)
    name = unique("netstomp")
    topic = f"/topic/{name}"
    durable = ("activemq.subscriptionName", "sub")
    broker.track_queue(durable_subscription_queue(name, "sub"))
    first = recording.connection("10.0.0.9").connect("1.0", client_id=name)
    first.send("SUBSCRIBE", [("destination", topic), durable, ("receipt", "subscribed")])
    first.receipt("subscribed")
    first.send("DISCONNECT")  # Net::Stomp's disconnect: no receipt, then the socket's close
    first.close()
    publisher = recording.connection("10.0.0.9").connect("1.0")
    for body in (b"away-1", b"away-2"):
        publisher.send("SEND", [("destination", topic)], body)
    second = recording.connection("10.0.0.9").connect("1.0", client_id=name)
    second.send("SUBSCRIBE", [("destination", topic), durable, ("ack", "client")])
    for body in (b"away-1", b"away-2"):
        second.send("ACK", [("message-id", second.message(topic, topic, body))])
    second.send("UNSUBSCRIBE", [("destination", topic), durable])
    second.send("DISCONNECT")
    second.close()
    publisher.send("DISCONNECT")
    publisher.close()
    recording.close()
    results = _replayed(tmp_path / "rec", start_adapter)
    assert [(r.client_id, r.differences, r.not_sent) for r in results] == [
        (name, [], 0),
        (None, [], 0),
        (name, [], 0),
    ], "\n".join(r.describe() for r in results)


def test_acks_wait_for_what_a_prefetch_holds_back_on_the_target(
    start_adapter: Callable[..., AdapterProcess], broker: BrokerProbe, tmp_path: Path
) -> None:
    """The upstream (RabbitMQ's plugin ignores ``activemq.prefetchSize``) sent all 20 messages
    before the client's first ACK; the target, in the activemq profile, holds back all but 10
    until some are acknowledged.  The replay must wait for each acknowledged message to arrive,
    never send the upstream's id of a message the target has not delivered (it named another
    delivery tag there: the channel ended with PRECONDITION_FAILED, half the messages lost to
    the comparison)."""
    recording = Recording(tmp_path / "rec", bodies=True)
    queue = unique("prefetched")
    broker.track_queue(queue)
    destination = f"/queue/{queue}"
    client = recording.connection("10.0.0.11").connect("1.1")
    client.send(
        "SUBSCRIBE",
        [
            ("destination", destination),
            ("id", "1"),
            ("ack", "client-individual"),
            ("activemq.prefetchSize", "10"),
        ],
    )
    bodies = [f"order {n}".encode() for n in range(20)]
    for n, body in enumerate(bodies):
        client.send("SEND", [("destination", destination), ("receipt", f"r{n}")], body)
        client.receipt(f"r{n}")
    ids = [client.message("1", destination, body) for body in bodies]
    for message_id in ids:
        client.send("ACK", [("message-id", message_id), ("subscription", "1")])
    client.send("DISCONNECT", [("receipt", "bye")])
    client.receipt("bye")
    client.close()
    recording.close()
    results = _replayed(tmp_path / "rec", start_adapter)
    assert [(r.differences, r.not_sent) for r in results] == [([], 0)], "\n".join(
        r.describe() for r in results
    )
    assert broker.depth(queue) == 0  # every message acknowledged on the target
