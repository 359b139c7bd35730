"""The migration report's pure parts: the idiom catalogue (names as issue #28 lists them, support
as docs/migration-activemq.md says), the idioms of one recorded frame, the topology planned
with the profile's own rules, and the HTML page (self-contained, in the promised order)."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

from adapter.mapping.profile import durable_subscription_queue
from adapter.migrate.idioms import (
    IDIOM_HEADERS,
    IDIOM_NAMES,
    IDIOMS,
    destination_kind,
    frame_idioms,
    idiom_headers,
    record_idioms,
)
from adapter.migrate.page import render
from adapter.migrate.topology import plan_topology
from tests.recordings import Recording, fleet

REPO = Path(__file__).resolve().parents[2]

ISSUE_NAMES = [
    "stomp-1.0",
    "stomp-1.1",
    "stomp-1.2",
    "selector-topic",
    "selector-queue",
    "durable-subscription",
    "prefetch-size",
    "expires",
    "non-persistent-send",
    "priority",
    "transaction",
    "nack",
    "ack-client",
    "ack-client-individual",
    "temp-queue",
    "temp-topic",
    "reply-to",
    "composite-destination",
    "wildcard-topic",
    "exclusive-consumer",
    "message-group",
    "scheduled-delivery",
    "browser",
    "transformation",
    "virtual-topic",
    "advisory-topic",
    "retroactive",
    "no-local",
    "receipt",
    "heart-beat",
]


def test_the_catalogue_names_exactly_the_idioms_of_the_issue() -> None:
    assert list(IDIOM_NAMES) == ISSUE_NAMES


def _table_rows() -> list[tuple[str, str]]:
    text = (REPO / "docs" / "migration-activemq.md").read_text()
    rows = []
    for line in text.splitlines():
        cells = line.split(" | ")
        if line.startswith("| ") and len(cells) >= 2:
            rows.append((cells[0], cells[1]))
    return rows


_SAYS = {"same": "**Same", "differs": "**Differs", "unsupported": "**Not supported"}


@pytest.mark.parametrize("idiom", [i for i in IDIOMS if i.doc is not None], ids=lambda i: i.name)
def test_each_support_is_what_its_row_of_the_docs_says(idiom) -> None:
    """The support comes from the docs' row of the behaviour; a row whose verdict changes fails
    here until the catalogue follows."""
    behaviour, says = idiom.doc
    rows = [adapter for first, adapter in _table_rows() if behaviour in first]
    assert len(rows) == 1, f"no single row of docs/migration-activemq.md starts with {behaviour!r}"
    assert says in rows[0]
    verdicts = {support for support, word in _SAYS.items() if rows[0].startswith(word)}
    if idiom.support == "same":
        assert verdicts == {"same"} and "**Differs" not in rows[0]
    elif idiom.support == "unsupported":
        assert verdicts == {"unsupported"}
    else:  # a row that is the same only in part, or says Differs
        assert "**Differs" in rows[0] or "Not on SUBSCRIBE" in rows[0] or verdicts == {"same"}


def test_every_idiom_that_is_not_plain_stomp_cites_the_docs() -> None:
    plain = {
        "stomp-1.0",
        "stomp-1.1",
        "stomp-1.2",
        "transaction",
        "ack-client",
        "ack-client-individual",
        "reply-to",
        "receipt",
        "heart-beat",
    }
    assert {i.name for i in IDIOMS if i.doc is None} == plain
    assert all(i.note for i in IDIOMS if i.support != "same")


def _name(keyword: str) -> str:
    """A header name from a keyword argument: ``activemq_x`` is ``activemq.x``, ``reply_to`` is
    ``reply-to``, upper-case names (``AMQ_SCHEDULED_DELAY``) stay as they are."""
    if keyword.startswith("activemq_"):
        return "activemq." + keyword.removeprefix("activemq_")
    return keyword if keyword[0].isupper() else keyword.replace("_", "-")


def H(**headers: str) -> list[list[str]]:
    return [[_name(name), value] for name, value in headers.items()]


ONE_FRAME = [
    ("out", "CONNECTED", H(version="1.1", session="s"), ["stomp-1.1"]),
    ("out", "CONNECTED", H(session="s"), ["stomp-1.0"]),
    ("in", "CONNECT", H(login="a", heart_beat="0,0"), []),
    ("in", "CONNECT", H(login="a", heart_beat="10000,0", receipt="r"), ["heart-beat", "receipt"]),
    ("in", "SEND", H(destination="/queue/a"), []),
    (
        "in",
        "SEND",
        H(destination="/queue/a", persistent="false", priority="9", expires="0"),
        ["non-persistent-send", "priority"],
    ),
    ("in", "SEND", H(destination="/queue/a", expires="1764100000000"), ["expires"]),
    ("in", "SEND", H(destination="/queue/a,/topic/b"), ["composite-destination"]),
    ("in", "SEND", H(destination="/topic/VirtualTopic.orders"), ["virtual-topic"]),
    ("in", "SUBSCRIBE", H(destination="/queue/Consumer.A.VirtualTopic.orders"), ["virtual-topic"]),
    ("in", "SUBSCRIBE", H(destination="/queue/Consumer.A.orders"), []),
    ("in", "SUBSCRIBE", H(destination="/topic/ActiveMQ.Advisory.Queue"), ["advisory-topic"]),
    ("in", "SEND", H(destination="/queue/a", AMQ_SCHEDULED_DELAY="1000"), ["scheduled-delivery"]),
    ("in", "SEND", H(destination="/queue/a", AMQ_SCHEDULED_CRON="* * * * *"), ["scheduled-delivery"]),
    ("in", "SEND", H(destination="/queue/a", JMSXGroupID="g"), ["message-group"]),
    ("in", "SEND", H(destination="/queue/a", reply_to="/temp-queue/r"), ["reply-to", "temp-queue"]),
    ("in", "SEND", H(destination="/remote-temp-queue/ID:x:1"), ["temp-queue"]),
    ("in", "SEND", H(destination="/queue/a", transaction="t"), ["transaction"]),
    ("in", "SEND", H(destination="/queue/a", transformation="jms-map-json"), ["transformation"]),
    ("in", "BEGIN", H(transaction="t"), ["transaction"]),
    ("in", "NACK", H(id="1"), ["nack"]),
    (
        "in",
        "SUBSCRIBE",
        H(destination="/topic/a.*", selector="x > 1"),
        ["selector-topic", "wildcard-topic"],
    ),
    ("in", "SUBSCRIBE", H(destination="/topic/a.>"), ["wildcard-topic"]),
    ("in", "SUBSCRIBE", H(destination="/topic/a*b"), []),  # only a whole word is a wildcard
    ("in", "SUBSCRIBE", H(destination="/queue/a", selector="x > 1"), ["selector-queue"]),
    ("in", "SUBSCRIBE", H(destination="/temp-topic/t"), ["temp-topic"]),
    (
        "in",
        "SUBSCRIBE",
        H(destination="/topic/a", activemq_subscriptionName="s"),
        ["durable-subscription"],
    ),
    ("in", "UNSUBSCRIBE", H(id="1", durable_subscription_name="s"), ["durable-subscription"]),
    (
        "in",
        "SUBSCRIBE",
        H(destination="/queue/a", ack="client", activemq_prefetchSize="5"),
        ["ack-client", "prefetch-size"],
    ),
    ("in", "SUBSCRIBE", H(destination="/queue/a", ack="client-individual"), ["ack-client-individual"]),
    (
        "in",
        "SUBSCRIBE",
        H(destination="/queue/a", activemq_exclusive="true", browser="TRUE"),
        ["browser", "exclusive-consumer"],
    ),
    ("in", "SUBSCRIBE", H(destination="/queue/a", activemq_exclusive="false", browser="false"), []),
    (
        "in",
        "SUBSCRIBE",
        H(destination="/topic/a", activemq_retroactive="true", activemq_noLocal="true"),
        ["no-local", "retroactive"],
    ),
    ("out", "MESSAGE", H(destination="/queue/a", expires="0", priority="4"), []),  # ActiveMQ's defaults
    ("in", None, [], []),  # a frame the tap could not parse
]


@pytest.mark.parametrize(("direction", "command", "headers", "idioms"), ONE_FRAME)
def test_the_idioms_of_one_frame(direction, command, headers, idioms) -> None:
    assert frame_idioms(direction, command, headers) == idioms


def test_the_first_of_repeated_headers_counts() -> None:
    headers = [["destination", "/queue/a"], ["persistent", "true"], ["persistent", "false"]]
    assert frame_idioms("in", "SEND", headers) == []


def test_the_idioms_of_a_frame_depend_on_its_idiom_headers_only(tmp_path) -> None:
    """The report runs frame_idioms once per distinct idiom_headers (and direction and
    command): for every frame of the cases above and of the synthetic fleet, and for hostile
    headers (repeated, too short, too long, null values), the reduction changes no idiom."""
    recording = Recording(tmp_path, bodies=False)
    fleet(recording)
    recording.close()
    frames = [(d, c, h) for d, c, h, _ in ONE_FRAME]
    for path in sorted(tmp_path.glob("tap-*.jsonl.gz")):
        with gzip.open(path, "rt") as lines:
            records = [json.loads(line) for line in lines]
        frames += [(r["dir"], r["command"], r["headers"]) for r in records if r["kind"] == "frame"]
    hostile = [
        [["receipt"], ["destination", "/queue/a"], ["persistent", "false", "extra"]],
        [["destination", "/topic/a.*"], ["destination", "/queue/b"], ["selector", None]],
        [
            ["expires", None],
            ["expires", "5"],
            ["ack", "client"],
            ["ack", "auto"],
            ["reply-to", "/temp-queue/x"],
        ],
        [["heart-beat", "0,0"], ["heart-beat", "10,0"], ["version", "1.2"], [], ["activemq.noLocal", "TRUE"]],
        None,
    ]
    frames += [
        (d, c, h)
        for h in hostile
        for d in ("in", "out")
        for c in ("SEND", "SUBSCRIBE", "CONNECT", "CONNECTED")
    ]
    for direction, command, headers in frames:
        reduced = idiom_headers(headers)
        assert all(pair[0] in IDIOM_HEADERS for pair in reduced)
        assert frame_idioms(direction, command, reduced) == frame_idioms(direction, command, headers), headers
    assert idiom_headers([["receipt", "r7"], ["message-id", "m"], ["destination", "/queue/a"]]) == [
        ["receipt", ""],
        ["destination", "/queue/a"],
    ]


def test_records_of_other_kinds_use_no_idiom() -> None:
    assert record_idioms({"kind": "open", "client": "a:1"}) == []
    assert record_idioms({"kind": "frame", "dir": "in", "command": "NACK", "headers": []}) == ["nack"]


def test_destination_kinds() -> None:
    assert [
        destination_kind(d) for d in ("/queue/a", "/topic/b", "/temp-queue/c", "/queue/a,/topic/b", "x")
    ] == ["queue", "topic", "temp-queue", "composite", "other"]


def test_the_synthetic_fleet_uses_exactly_the_idioms_it_says(tmp_path) -> None:
    """The generator's bookkeeping, checked without Spark: the report tests rely on it."""
    recording = Recording(tmp_path, bodies=False)
    expected = fleet(recording)
    recording.close()
    found: set[str] = set()
    for path in sorted(tmp_path.glob("tap-*.jsonl.gz")):
        with gzip.open(path, "rt") as lines:
            for line in lines:
                found.update(record_idioms(json.loads(line)))
    assert found == expected.idioms
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]  # the .part file is there


def _plan(
    command: str, destination: str | None, app: str = "app", client_id: str | None = None, **headers: str
):
    pairs = [(_name(k), v) for k, v in headers.items()]
    idioms = frame_idioms("in", command, [list(p) for p in [("destination", destination or ""), *pairs]])
    return {
        "application": app,
        "client_id": client_id,
        "command": command,
        "destination": destination,
        "headers": pairs,
        "idioms": idioms,
    }


def test_the_topology_comes_from_the_profile_s_rules() -> None:
    plans = [
        _plan("SEND", "/queue/orders", x_max_priority="9"),
        _plan("SEND", "/queue/a,/topic/b"),
        _plan("SUBSCRIBE", "/topic/prices.>", client_id="feed", id="1", activemq_subscriptionName="s"),
        _plan("SUBSCRIBE", "/topic/news", id="2"),
        _plan("SUBSCRIBE", "/queue/Consumer.A.VirtualTopic.orders", id="3"),
        _plan("SUBSCRIBE", "/queue/m", transformation="jms-map-json"),
        _plan("SUBSCRIBE", "/queue/s", selector="a = "),
        _plan("SUBSCRIBE", "/topic/a", activemq_subscriptionName="s"),  # no client-id
        _plan("NACK", None),
    ]
    topology, refused = plan_topology(plans)
    queues = {q["name"]: q for q in topology["queues"]}
    assert queues["orders"]["arguments"] == {"x-max-priority": 9}
    assert (queues["orders"]["durable"], queues["orders"]["exclusive"]) == (True, False)
    assert "a" in queues and "ActiveMQ.DLQ" in queues
    durable = durable_subscription_queue("feed", "s")
    assert queues[durable]["durable"] is True
    bindings = {(b["exchange"], b["routing_key"], b["queue"]): b for b in topology["bindings"]}
    assert ("amq.topic", "prices.#", durable) in bindings
    assert ("amq.topic", "news", "(one auto-delete queue per subscription)") in bindings
    # the profile binds a virtual topic's consumer queue itself: nothing left to do by hand
    virtual = bindings[("amq.topic", "VirtualTopic.orders", "Consumer.A.VirtualTopic.orders")]
    assert virtual["note"] == ""
    assert queues["Consumer.A.VirtualTopic.orders"]["durable"] is True
    assert {(r["destination"], r["message"]) for r in refused} == {
        ("/queue/m", "Transformation not supported"),
        ("/queue/s", "Invalid selector"),
        ("/topic/a", "Missing client-id"),
    }


def _document() -> dict:
    idiom = {
        "name": "browser",
        "title": "Queue browsing",
        "connections": 1,
        "frames": 2,
        "applications": 1,
        "commands": {"SUBSCRIBE": 2},
        "support": "unsupported",
        "note": "Browse <elsewhere>.",
    }
    app = {
        "name": "ops@10.0.0.9",
        "host": "10.0.0.9",
        "login": "ops",
        "client_id": None,
        "connections": 1,
        "frames": 5,
        "first": 1.0,
        "last": 2.0,
        "vhosts": [],
        "stomp_versions": ["1.2"],
        "idioms": [{**idiom, "frames": 2}],
        "destinations": {
            "queue": [
                {
                    "destination": "/queue/j",
                    "sent": 2,
                    "delivered": 1,
                    "bytes": 10,
                    "max_size": 5,
                    "subscriptions": 1,
                }
            ]
        },
        "errors": {},
        "rate": {"sent": [1, 1], "delivered": [0, 1]},
    }
    return {
        "version": 1,
        "recording": "/rec",
        "totals": {
            "records": 9,
            "frames": 5,
            "connections": 1,
            "applications": 1,
            "messages_sent": 2,
            "messages_delivered": 1,
            "bytes_sent": 10,
            "start": 1.0,
            "end": 2.0,
            "bucket_seconds": 1,
            "buckets": 2,
            "dropped_records": 0,
            "unparsable_frames": 0,
        },
        "idioms": [idiom],
        "destinations": [
            {
                "destination": "/queue/j",
                "kind": "queue",
                "sent": 2,
                "delivered": 1,
                "bytes_sent": 10,
                "bytes_delivered": 5,
                "max_size": 5,
                "applications": 1,
                "avg_size": 5,
                "rate": {"sent": [1, 1], "delivered": [0, 1]},
            }
        ],
        "applications": [app],
        "topology": {
            "queues": [
                {
                    "name": "j",
                    "durable": True,
                    "auto_delete": False,
                    "exclusive": False,
                    "arguments": {},
                    "declared_by": ["SEND"],
                    "applications": ["ops@10.0.0.9"],
                    "note": "",
                }
            ],
            "exchanges": [],
            "bindings": [],
        },
        "refused": [],
    }


def test_the_page_is_self_contained_and_starts_with_what_to_change() -> None:
    page = render(_document())
    assert "<script" not in page
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert "@import" not in page and "url(" not in page
    order = [
        page.index(text)
        for text in (
            "What to change before cutting over",
            "Message rates per destination",
            "The RabbitMQ topology",
        )
    ]
    assert order == sorted(order)
    assert "Browse &lt;elsewhere&gt;." in page  # escaped
    assert page.count("<svg") == 1


def test_the_topology_has_the_delay_queues_of_scheduled_sends() -> None:
    """A SEND with AMQ_SCHEDULED_DELAY: the delay queue of its bucket and target exchange, as
    adapter/mapping/scheduled.py declares it, bound to amq.headers; one per bucket, whatever
    the delays in it; the scheduling the profile refuses is listed as refused."""
    plans = [
        _plan("SEND", "/queue/orders", AMQ_SCHEDULED_DELAY="1234"),
        _plan("SEND", "/queue/orders", AMQ_SCHEDULED_DELAY="1250"),  # the same bucket: 1300 ms
        _plan("SEND", "/topic/prices", AMQ_SCHEDULED_DELAY="50"),
        _plan("SEND", "/queue/now", AMQ_SCHEDULED_DELAY="0"),  # at once: no delay queue
        _plan("SEND", "/queue/again", AMQ_SCHEDULED_DELAY="10", AMQ_SCHEDULED_REPEAT="3"),
        _plan("SEND", "/exchange/x/k", AMQ_SCHEDULED_DELAY="10"),
    ]
    topology, refused = plan_topology(plans)
    queues = {q["name"]: q for q in topology["queues"]}
    delayed = {name: q for name, q in queues.items() if name.startswith("activemq.scheduled.")}
    assert delayed.keys() == {"activemq.scheduled.1300ms.amq.default", "activemq.scheduled.50ms.amq.topic"}
    to_queue = delayed["activemq.scheduled.1300ms.amq.default"]
    assert to_queue["durable"] is True and to_queue["arguments"] == {
        "x-message-ttl": 1300,
        "x-expires": 1300 + 60_000,
        "x-dead-letter-exchange": "",
    }
    assert delayed["activemq.scheduled.50ms.amq.topic"]["arguments"]["x-dead-letter-exchange"] == "amq.topic"
    bindings = {(b["exchange"], b["queue"]) for b in topology["bindings"]}
    assert {("amq.headers", name) for name in delayed} <= bindings
    assert "amq.headers" in {e["name"] for e in topology["exchanges"]}
    assert {"orders", "now"} <= queues.keys() and "again" not in queues
    assert {(r["destination"], r["message"]) for r in refused} == {
        ("/queue/again", "Scheduled delivery not supported"),
        ("/exchange/x/k", "Scheduled delivery not supported"),
    }
