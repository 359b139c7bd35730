"""The grouping of related recorded connections (adapter/migrate/related.py), on recordings
written as the tap writes them (tests/recordings.py), without a broker."""

from __future__ import annotations

from pathlib import Path

from adapter.migrate.recording import Event, load_conversations
from adapter.migrate.related import (
    destination_names,
    destinations_reached,
    name_components,
    related_groups,
    split_by_group,
    topic_matches,
)
from tests.recordings import Recording, fleet


def _groups(recording: Recording) -> list[list[str]]:
    recording.close()
    return related_groups(load_conversations(recording.directory, need_bodies=False))


def test_connections_on_different_destinations_are_not_related(tmp_path: Path) -> None:
    r = Recording(tmp_path / "rec")
    a = r.connection("10.0.0.1").connect()
    a.send("SEND", [("destination", "/queue/a")], b"x")
    b = r.connection("10.0.0.2").connect()
    b.send("SUBSCRIBE", [("destination", "/queue/b"), ("id", "1")])
    assert _groups(r) == [[a.id], [b.id]]


def test_a_shared_destination_relates_its_producers_and_consumers(tmp_path: Path) -> None:
    r = Recording(tmp_path / "rec")
    consumer = r.connection("10.0.0.1").connect()
    consumer.send("SUBSCRIBE", [("destination", "/queue/orders"), ("id", "1")])
    other = r.connection("10.0.0.3").connect()
    other.send("SEND", [("destination", "/queue/other")], b"x")
    producers = []
    for _ in range(3):
        producer = r.connection("10.0.0.2").connect()
        producer.send("SEND", [("destination", "/queue/orders")], b"x")
        producers.append(producer.id)
    assert _groups(r) == [[consumer.id, *producers], [other.id]]


def test_a_client_id_relates_the_connections_that_use_it(tmp_path: Path) -> None:
    r = Recording(tmp_path / "rec")
    first = r.connection("10.0.0.1").connect(client_id="app-7")
    stranger = r.connection("10.0.0.1").connect(client_id="app-8")
    again = r.connection("10.0.0.1").connect(client_id="app-7")
    assert _groups(r) == [[first.id, again.id], [stranger.id]]


def test_a_reply_to_chain_relates_the_requester_and_the_responder(tmp_path: Path) -> None:
    """The responder never names the requester's queue itself: it sends to the ``reply-to`` of
    the MESSAGE it got, a name only the recorded upstream's answers hold."""
    r = Recording(tmp_path / "rec")
    requester = r.connection("10.0.0.1").connect()
    requester.send("SUBSCRIBE", [("destination", "/temp-queue/replies"), ("id", "r")])
    requester.send("SEND", [("destination", "/queue/rpc.a"), ("reply-to", "/temp-queue/replies")], b"?")
    responder = r.connection("10.0.0.2").connect()
    remote = f"/remote-temp-queue/ID:amq-{requester.id}:1:1"
    responder.message("s", "/queue/rpc.b", b"?", ("reply-to", remote))  # another queue: only reply-to
    responder.send("SEND", [("destination", remote)], b"!")
    unrelated = r.connection("10.0.0.3").connect()
    unrelated.send("SUBSCRIBE", [("destination", "/temp-queue/replies"), ("id", "r")])
    requester.message("r", remote, b"!")
    groups = _groups(r)
    assert [requester.id, responder.id] in groups
    assert [unrelated.id] in groups  # the same temporary name, another connection's queue


def test_a_virtual_topic_relates_its_publishers_and_its_consumer_groups(tmp_path: Path) -> None:
    r = Recording(tmp_path / "rec")
    member = r.connection("10.0.0.1").connect()
    member.send("SUBSCRIBE", [("destination", "/queue/Consumer.A.VirtualTopic.orders"), ("id", "1")])
    publisher = r.connection("10.0.0.2").connect()
    publisher.send("SEND", [("destination", "/topic/VirtualTopic.orders")], b"x")
    assert _groups(r) == [[member.id, publisher.id]]


def test_a_wildcard_subscriber_is_related_to_the_topics_it_matches(tmp_path: Path) -> None:
    r = Recording(tmp_path / "rec")
    subscriber = r.connection("10.0.0.1").connect()
    subscriber.send("SUBSCRIBE", [("destination", "/topic/prices.>"), ("id", "1")])
    eu = r.connection("10.0.0.2").connect()
    eu.send("SEND", [("destination", "/topic/prices.eu"), ("color", "blue")], b"x")  # not delivered
    other = r.connection("10.0.0.3").connect()
    other.send("SEND", [("destination", "/topic/stocks.eu")], b"x")
    assert _groups(r) == [[subscriber.id, eu.id], [other.id]]


def test_a_composite_send_relates_each_of_its_destinations(tmp_path: Path) -> None:
    r = Recording(tmp_path / "rec")
    audit = r.connection("10.0.0.1").connect()
    audit.send("SUBSCRIBE", [("destination", "/queue/audit"), ("id", "1")])
    events = r.connection("10.0.0.2").connect()
    events.send("SUBSCRIBE", [("destination", "/topic/events"), ("id", "1")])
    writer = r.connection("10.0.0.3").connect()
    writer.send("SEND", [("destination", "/queue/audit,/topic/events")], b"x")
    assert _groups(r) == [[audit.id, events.id, writer.id]]


def test_the_dead_letter_queue_relates_nacks_only_when_someone_reads_it(tmp_path: Path) -> None:
    r = Recording(tmp_path / "rec")
    nacker = r.connection("10.0.0.1").connect()
    nacker.send("NACK", [("message-id", "m1")])
    expiring = r.connection("10.0.0.2").connect()
    expiring.send("SEND", [("destination", "/queue/x"), ("expires", "1764100000000")], b"x")
    assert _groups(r) == [[nacker.id], [expiring.id]]
    reader = r.connection("10.0.0.3").connect()
    reader.send("SUBSCRIBE", [("destination", "/queue/ActiveMQ.DLQ"), ("id", "1")])
    assert _groups(r) == [[nacker.id, expiring.id, reader.id]]


def test_the_small_fleet_falls_into_its_applications(tmp_path: Path) -> None:
    """tests/recordings.py's fleet: orders, prices, billing and rpc are one group each; the ops
    scripts share the feeder's queues, except the exclusive pair, the mapper and the watcher."""
    r = Recording(tmp_path / "rec")
    fleet(r, tag="g")
    numbers = [[int(conn.rsplit("-", 1)[1]) for conn in group] for group in _groups(r)]
    # orders, prices, billing, rpc; feeder + browser + virtual + waiter; exclusive; mapper; watcher
    assert numbers == [[1, 2], [3, 4], [5, 6], [7, 8], [9, 10, 11, 12], [13, 14], [15], [16]]


def test_many_connections_on_one_name_do_not_recurse(tmp_path: Path) -> None:
    events = [
        Event(
            float(n), f"c{n}", "frame", direction="in", command="SEND", headers=(("destination", "/queue/q"),)
        )
        for n in range(50_000)
    ]
    groups = related_groups(events)
    assert len(groups) == 1 and len(groups[0]) == 50_000


def test_the_split_keeps_each_groups_events_in_recorded_order() -> None:
    def frame(ts: float, conn: str, destination: str) -> Event:
        return Event(
            ts, conn, "frame", direction="in", command="SEND", headers=(("destination", destination),)
        )

    events = [
        frame(1, "a", "/queue/x"),
        frame(2, "b", "/queue/y"),
        frame(3, "c", "/queue/x"),
        Event(4, "a", "close"),
        Event(5, "z", "close"),
    ]
    groups = related_groups(events)
    assert groups == [["a", "c"], ["b"]]
    assert [[(e.ts, e.conn) for e in part] for part in split_by_group(events, groups)] == [
        [(1, "a"), (3, "c"), (4, "a")],
        [(2, "b")],
    ]


def test_destination_names_and_topic_wildcards() -> None:
    assert destination_names("c1", "/queue/a, /topic/b") == ["/queue/a", "/topic/b"]
    assert destination_names("c1", "/temp-queue/r") == ["c1 /temp-queue/r"]
    assert destination_names("c1", "/queue/Consumer.A.VirtualTopic.x.y") == ["/topic/VirtualTopic.x.y"]
    assert destination_names("c1", "/queue/Consumer.A.Other") == ["/queue/Consumer.A.Other"]
    assert topic_matches("a.*.c", "a.b.c") and not topic_matches("a.*.c", "a.b.d")
    assert topic_matches("a.>", "a.b.c") and not topic_matches("a.>", "a")
    assert not topic_matches("a.*", "a.b.c") and topic_matches("a.b", "a.b")


def test_name_components_join_a_wildcard_with_the_topics_it_matches_and_nothing_else() -> None:
    def frame(conn: str, command: str, destination: str) -> Event:
        return Event(
            0.0, conn, "frame", direction="in", command=command, headers=(("destination", destination),)
        )

    events = [
        frame("a", "SUBSCRIBE", "/topic/prices.>"),
        frame("b", "SEND", "/topic/prices.eu"),
        frame("b", "SEND", "/topic/stocks.eu"),
        frame("c", "SUBSCRIBE", "/queue/Consumer.A.VirtualTopic.x"),
        frame("c", "SUBSCRIBE", "/temp-queue/replies"),
    ]
    components = name_components(events)
    assert destinations_reached(components, "b", "/topic/prices.eu") == destinations_reached(
        components, "a", "/topic/prices.>"
    )
    assert destinations_reached(components, "b", "/topic/stocks.eu") == {"/topic/stocks.eu"}
    assert destinations_reached(components, "d", "/topic/VirtualTopic.x") == destinations_reached(
        components, "c", "/queue/Consumer.A.VirtualTopic.x"
    )
    # another connection's temporary queue of the same name is not the subscriber's
    assert destinations_reached(components, "d", "/temp-queue/replies").isdisjoint(
        destinations_reached(components, "c", "/temp-queue/replies")
    )
