"""Synthetic recordings of the tap (docs/recording-format.md), for the migration report and
replay tests until recordings made by the tap itself are used.

``Recording`` writes records exactly as the tap does: gzip JSON Lines files
``tap-<start>-<pid>-<seq>.jsonl.gz``, rotated every ``per_file`` records, plus one ``.part``
file that readers must ignore (it holds a frame using ``browser``, so a report that read it
would name an idiom the fleet does not use).  ``fleet()`` writes the conversations of a small
fleet of ActiveMQ applications, answered as ActiveMQ 5.x answers them, and returns what each
application uses, so the tests can assert the report names exactly that.
"""

from __future__ import annotations

import base64
import gzip
import itertools
import json
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

Headers = Iterable[tuple[str, str]]


class Recording:
    """One recording directory being written by a (pretend) tap."""

    def __init__(
        self,
        directory: Path,
        *,
        bodies: bool = True,
        start: float = 1_764_100_000.0,
        per_file: int = 40,
        tap: str = "5e1f0a",
        pid: int = 4242,
    ) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.bodies = bodies
        self.clock = start
        self.per_file = per_file
        self.tap = tap
        self.pid = pid
        self._records: list[dict[str, object]] = []
        self._seq = 0
        self._conns = itertools.count(1)
        self._ports = itertools.count(40000)
        self.frames = 0

    def tick(self, seconds: float = 0.01) -> float:
        self.clock += seconds
        return self.clock

    def write(self, record: dict[str, object]) -> None:
        self._records.append({"v": 1, "ts": round(self.tick(), 6), **record})
        if len(self._records) >= self.per_file:
            self._flush()

    def _flush(self) -> None:
        if not self._records:
            return
        self._seq += 1
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(self.clock))
        path = self.directory / f"tap-{stamp}-{self.pid}-{self._seq:06d}.jsonl.gz"
        with gzip.open(path, "wt", encoding="utf-8") as out:
            for record in self._records:
                out.write(json.dumps(record, ensure_ascii=True) + "\n")
        self._records = []

    def connection(self, host: str) -> Conn:
        conn = Conn(self, f"{self.tap}-{next(self._conns)}", f"{host}:{next(self._ports)}")
        self.write(
            {
                "conn": conn.id,
                "kind": "open",
                "client": conn.client,
                "listen": "0.0.0.0:61613",
                "upstream": "activemq:61613",
                "tls": False,
            }
        )
        return conn

    def close(self) -> None:
        """Write what is left, and a ``.part`` file (a file being written: never read)."""
        self._flush()
        part = self.directory / f".tap-19700101T000000Z-{self.pid}-{self._seq + 1:06d}.jsonl.gz.part"
        with gzip.open(part, "wt", encoding="utf-8") as out:
            record = {
                "v": 1,
                "ts": self.clock,
                "conn": "ignored-1",
                "kind": "frame",
                "client": "10.9.9.9:1",
                "dir": "in",
                "command": "SUBSCRIBE",
                "headers": [["destination", "/queue/never"], ["browser", "true"]],
                "body_len": 0,
            }
            out.write(json.dumps(record) + "\n")


@dataclass
class Conn:
    """One recorded connection: ``send`` records a client frame, ``answer`` an upstream one."""

    recording: Recording
    id: str
    client: str
    version: str = "1.0"
    _message_ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def _frame(self, direction: str, command: str, headers: Headers, body: bytes) -> None:
        record: dict[str, object] = {
            "conn": self.id,
            "kind": "frame",
            "client": self.client,
            "dir": direction,
            "command": command,
            "headers": [[name, value] for name, value in headers],
            "body_len": len(body),
        }
        if self.recording.bodies:
            record["body"] = base64.b64encode(body).decode("ascii")
        self.recording.frames += 1
        self.recording.write(record)

    def send(self, command: str, headers: Headers = (), body: bytes = b"") -> None:
        self._frame("in", command, headers, body)

    def answer(self, command: str, headers: Headers = (), body: bytes = b"") -> None:
        self._frame("out", command, headers, body)

    def connect(
        self,
        version: str = "1.2",
        *,
        login: str = "guest",
        client_id: str | None = None,
        heart_beat: str | None = None,
        host: str | None = None,
    ) -> Conn:
        headers = [("login", login), ("passcode", "***")]
        if version != "1.0":
            headers.insert(0, ("accept-version", version))
        if host is not None:
            headers.append(("host", host))
        if client_id is not None:
            headers.append(("client-id", client_id))
        if heart_beat is not None:
            headers.append(("heart-beat", heart_beat))
        self.send("CONNECT", headers)
        answer = [("session", f"ID:amq-{self.id}")]
        if version != "1.0":
            answer = [("version", version), *answer, ("server", "ActiveMQ/5.17.2")]
            if heart_beat is not None:
                answer.append(("heart-beat", "0,0"))
        self.version = version
        self.answer("CONNECTED", answer)
        return self

    def receipt(self, receipt_id: str) -> None:
        self.answer("RECEIPT", [("receipt-id", receipt_id)])

    def message(self, subscription: str, destination: str, body: bytes, *extra: tuple[str, str]) -> str:
        """Record a MESSAGE as ActiveMQ sends it; the id a client ACKs it with."""
        message_id = f"ID:amq-{self.id}-1:1:1:1:{next(self._message_ids)}"
        headers = [
            ("content-length", str(len(body))),
            ("expires", "0"),
            ("destination", destination),
            ("subscription", subscription),
            ("priority", "4"),
            ("message-id", message_id),
            *extra,
            ("timestamp", str(int(self.recording.clock * 1000))),
        ]
        if self.version == "1.2":
            headers.append(("ack", message_id))
        self.answer("MESSAGE", headers, body)
        return message_id

    def close(self, by: str = "client") -> None:
        self.recording.write(
            {"conn": self.id, "kind": "close", "by": by, "reason": "", "bytes_in": 0, "bytes_out": 0}
        )


@dataclass(frozen=True)
class Application:
    host: str
    login: str
    client_id: str | None
    idioms: frozenset[str]


@dataclass
class Fleet:
    """What ``fleet()`` recorded: the applications and, per connection, the differences a
    replay against the adapter must report (``(kind, key)``: ``error`` with the ERROR's message,
    ``receipt`` with the receipt id that did not come, ``messages`` with the subscription)."""

    applications: list[Application]
    queues: list[str]
    differences: dict[str, set[tuple[str, str]]]
    connections: int = 0

    @property
    def idioms(self) -> set[str]:
        return set().union(*(app.idioms for app in self.applications))


def fleet(recording: Recording, tag: str = "t") -> Fleet:
    """The conversations of six ActiveMQ applications (names made unique by ``tag``)."""
    r = recording
    q = f"mig-{tag}"  # prefix of every queue and topic name, so a test can clean up after itself
    queues: list[str] = []
    differences: dict[str, set[tuple[str, str]]] = {}

    # -- orders (php-stomp, STOMP 1.0): non-persistent sends with a priority; a client-ack
    #    consumer with a prefetch of 1
    orders = f"{q}.orders"
    queues.append(orders)
    producer = r.connection("10.0.0.5").connect("1.0", login="orders")
    for n in range(3):
        producer.send(
            "SEND",
            [
                ("destination", f"/queue/{orders}"),
                ("persistent", "false"),
                ("priority", "6"),
                ("receipt", f"o{n}"),
            ],
            b"order %d" % n,
        )
        producer.receipt(f"o{n}")
        r.tick(1.0)
    producer.send("DISCONNECT")
    producer.close()
    consumer = r.connection("10.0.0.5").connect("1.0", login="orders")
    consumer.send(
        "SUBSCRIBE",
        [("destination", f"/queue/{orders}"), ("ack", "client"), ("activemq.prefetchSize", "1")],
    )
    for n in range(3):
        message_id = consumer.message(f"/queue/{orders}", f"/queue/{orders}", b"order %d" % n)
        consumer.send("ACK", [("message-id", message_id)])
    consumer.send("DISCONNECT", [("receipt", "bye")])
    consumer.receipt("bye")
    consumer.close()
    orders_app = Application(
        "10.0.0.5",
        "orders",
        None,
        frozenset({"stomp-1.0", "non-persistent-send", "priority", "receipt", "ack-client", "prefetch-size"}),
    )

    # -- prices (Ruby stomp gem, STOMP 1.2): a durable subscription with a selector on a wildcard
    #    topic, heart-beats, messages that expire
    client_id = f"{q}-prices"
    queues.append(f"activemq-durable:{len(client_id)}:{client_id}:feed")
    subscriber = r.connection("10.0.0.6").connect(
        "1.2", login="prices", client_id=client_id, heart_beat="0,10000"
    )
    subscriber.send(
        "SUBSCRIBE",
        [
            ("destination", f"/topic/{q}.prices.>"),
            ("id", "1"),
            ("ack", "auto"),
            ("selector", "color = 'red'"),
            ("activemq.subscriptionName", "feed"),
            ("receipt", "s1"),
        ],
    )
    subscriber.receipt("s1")
    publisher = r.connection("10.0.0.6").connect("1.2", login="prices")
    expires = str(int((time.time() + 3600) * 1000))
    for n, color in enumerate(("red", "blue", "red")):
        publisher.send(
            "SEND",
            [
                ("destination", f"/topic/{q}.prices.eu"),
                ("color", color),
                ("expires", expires),
                ("receipt", f"p{n}"),
            ],
            b'{"price": 1}',
        )
        publisher.receipt(f"p{n}")
        if color == "red":
            subscriber.message("1", f"/topic/{q}.prices.eu", b'{"price": 1}', ("color", color))
        r.tick(2.0)
    publisher.send("DISCONNECT")
    publisher.close()
    # the durable subscription is removed at the end, as ActiveMQ clients do
    subscriber.send("UNSUBSCRIBE", [("id", "1")])
    subscriber.send("UNSUBSCRIBE", [("id", "1"), ("activemq.subscriptionName", "feed"), ("receipt", "u1")])
    subscriber.receipt("u1")
    subscriber.send("DISCONNECT")
    subscriber.close()
    # an application is (host, login, client-id): the subscriber and the publisher are two
    prices_feed = Application(
        "10.0.0.6",
        "prices",
        client_id,
        frozenset(
            {"stomp-1.2", "heart-beat", "wildcard-topic", "selector-topic", "durable-subscription", "receipt"}
        ),
    )
    prices_app = Application("10.0.0.6", "prices", None, frozenset({"stomp-1.2", "expires", "receipt"}))

    # -- billing (Java, STOMP 1.1): a transaction, a NACK, a selector on a queue, a composite SEND
    billing = f"{q}.billing"
    queues += [billing, f"{billing}.eu", f"{billing}.audit", "ActiveMQ.DLQ"]
    writer = r.connection("10.0.0.7").connect("1.1", login="billing")
    writer.send("BEGIN", [("transaction", "tx1")])
    writer.send(
        "SEND",
        [("destination", f"/queue/{billing}"), ("transaction", "tx1"), ("persistent", "true")],
        b"invoice",
    )
    writer.send("COMMIT", [("transaction", "tx1"), ("receipt", "c1")])
    writer.receipt("c1")
    writer.send(
        "SEND",
        [("destination", f"/queue/{billing}.audit,/topic/{billing}.events"), ("receipt", "a1")],
        b"audit",
    )
    writer.receipt("a1")
    reader = r.connection("10.0.0.7").connect("1.1", login="billing")
    reader.send(
        "SUBSCRIBE", [("destination", f"/queue/{billing}"), ("id", "b"), ("ack", "client-individual")]
    )
    message_id = reader.message("b", f"/queue/{billing}", b"invoice", ("persistent", "true"))
    reader.send("NACK", [("message-id", message_id), ("subscription", "b"), ("receipt", "n1")])
    reader.receipt("n1")
    reader.send(
        "SUBSCRIBE",
        [
            ("destination", f"/queue/{billing}.eu"),
            ("id", "eu"),
            ("selector", "region = 'eu'"),
            ("receipt", "s-eu"),
        ],
    )
    reader.receipt("s-eu")
    writer.send("SEND", [("destination", f"/queue/{billing}.eu"), ("region", "eu"), ("receipt", "e1")], b"eu")
    writer.receipt("e1")
    reader.message("eu", f"/queue/{billing}.eu", b"eu", ("region", "eu"))
    writer.send("DISCONNECT")
    writer.close()
    reader.send("DISCONNECT", [("receipt", "r-bye")])
    reader.receipt("r-bye")
    reader.close()
    billing_app = Application(
        "10.0.0.7",
        "billing",
        None,
        frozenset(
            {
                "stomp-1.1",
                "transaction",
                "composite-destination",
                "receipt",
                "ack-client-individual",
                "nack",
                "selector-queue",
            }
        ),
    )

    # -- rpc (a C client, STOMP 1.2): request/reply over a temporary queue; a temporary topic
    rpc = f"{q}.rpc"
    queues.append(rpc)
    server = r.connection("10.0.0.8").connect("1.2", login="rpc")
    server.send("SUBSCRIBE", [("destination", f"/queue/{rpc}"), ("id", "s"), ("receipt", "rs")])
    server.receipt("rs")
    requester = r.connection("10.0.0.8").connect("1.2", login="rpc")
    requester.send("SUBSCRIBE", [("destination", "/temp-queue/replies"), ("id", "r")])
    requester.send("SUBSCRIBE", [("destination", "/temp-topic/events"), ("id", "t"), ("receipt", "rt")])
    requester.receipt("rt")
    requester.send(
        "SEND",
        [("destination", f"/queue/{rpc}"), ("reply-to", "/temp-queue/replies"), ("receipt", "q1")],
        b"ping",
    )
    requester.receipt("q1")
    remote = f"/remote-temp-queue/ID:amq-{requester.id}:1:1"
    server.message("s", f"/queue/{rpc}", b"ping", ("reply-to", remote))
    server.send("SEND", [("destination", remote), ("receipt", "a1")], b"pong")
    server.receipt("a1")
    requester.message("r", remote, b"pong")
    requester.send("DISCONNECT")
    requester.close()
    server.send("DISCONNECT")
    server.close()
    rpc_app = Application(
        "10.0.0.8", "rpc", None, frozenset({"stomp-1.2", "temp-queue", "temp-topic", "reply-to", "receipt"})
    )

    # -- ops (a Perl script, STOMP 1.2): the idioms the profile does not support the same
    ops = f"{q}.ops"
    queues += [f"{ops}.jobs", f"{ops}.later", f"{ops}.map", f"{ops}.excl", f"Consumer.A.VirtualTopic.{ops}"]
    feeder = r.connection("10.0.0.9").connect("1.2", login="ops", host="localhost")
    for n in range(2):
        feeder.send(
            "SEND",
            [("destination", f"/queue/{ops}.jobs"), ("JMSXGroupID", "g1"), ("receipt", f"j{n}")],
            b"job %d" % n,
        )
        feeder.receipt(f"j{n}")
    browser = r.connection("10.0.0.9").connect("1.2", login="ops")
    browser.send("SUBSCRIBE", [("destination", f"/queue/{ops}.jobs"), ("id", "b"), ("browser", "true")])
    for n in range(2):
        browser.message("b", f"/queue/{ops}.jobs", b"job %d" % n, ("JMSXGroupID", "g1"))
    browser.message("b", f"/queue/{ops}.jobs", b"", ("browser", "end"))
    browser.send("DISCONNECT")
    browser.close()
    # the profile browses (basic.get + requeue) and ends with browser:end, as ActiveMQ: no difference

    virtual = r.connection("10.0.0.9").connect("1.2", login="ops")
    virtual.send(
        "SUBSCRIBE",
        [("destination", f"/queue/Consumer.A.VirtualTopic.{ops}"), ("id", "v"), ("receipt", "rv")],
    )
    virtual.receipt("rv")
    feeder.send("SEND", [("destination", f"/topic/VirtualTopic.{ops}"), ("receipt", "vt")], b"fan out")
    feeder.receipt("vt")
    virtual.message("v", f"/queue/Consumer.A.VirtualTopic.{ops}", b"fan out")
    virtual.send("DISCONNECT")
    virtual.close()
    # the consumer group's queue is bound to the virtual topic, as ActiveMQ: no difference

    feeder.send(
        "SEND",
        [("destination", f"/queue/{ops}.later"), ("AMQ_SCHEDULED_DELAY", "600000"), ("receipt", "later")],
        b"in ten minutes",
    )
    feeder.receipt("later")
    waiter = r.connection("10.0.0.9").connect("1.2", login="ops")
    waiter.send("SUBSCRIBE", [("destination", f"/queue/{ops}.later"), ("id", "w"), ("receipt", "rw")])
    waiter.receipt("rw")
    waiter.send("DISCONNECT")
    waiter.close()
    # the profile delays it too (a per-delay queue), so the waiter gets nothing: no difference

    first = r.connection("10.0.0.9").connect("1.2", login="ops")
    first.send(
        "SUBSCRIBE",
        [
            ("destination", f"/queue/{ops}.excl"),
            ("id", "x"),
            ("activemq.exclusive", "true"),
            ("receipt", "x1"),
        ],
    )
    first.receipt("x1")
    standby = r.connection("10.0.0.9").connect("1.2", login="ops")
    standby.send("SUBSCRIBE", [("destination", f"/queue/{ops}.excl"), ("id", "y"), ("receipt", "y1")])
    standby.receipt("y1")  # ActiveMQ keeps it waiting; RabbitMQ refuses it
    standby.send("DISCONNECT")
    standby.close()
    first.send("DISCONNECT")
    first.close()
    differences[standby.id] = {("error", "*")}  # RabbitMQ's access_refused, after the receipt

    mapper = r.connection("10.0.0.9").connect("1.2", login="ops")
    mapper.send(
        "SUBSCRIBE",
        [
            ("destination", f"/queue/{ops}.map"),
            ("id", "m"),
            ("transformation", "jms-map-json"),
            ("receipt", "m1"),
        ],
    )
    mapper.receipt("m1")
    mapper.send("DISCONNECT")
    mapper.close()
    differences[mapper.id] = {("error", "Transformation not supported"), ("receipt", "m1")}

    watcher = r.connection("10.0.0.9").connect("1.2", login="ops")
    watcher.send(
        "SUBSCRIBE",
        [
            ("destination", f"/topic/{ops}.chat"),
            ("id", "c"),
            ("activemq.noLocal", "true"),
            ("activemq.retroactive", "true"),
            ("receipt", "c1"),
        ],
    )
    watcher.receipt("c1")
    watcher.send("SUBSCRIBE", [("destination", "/topic/ActiveMQ.Advisory.Connection"), ("id", "adv")])
    watcher.message("adv", "/topic/ActiveMQ.Advisory.Connection", b"", ("type", "Advisory"))
    watcher.send("SEND", [("destination", f"/topic/{ops}.chat"), ("receipt", "c2")], b"hello myself")
    watcher.receipt("c2")
    watcher.send("DISCONNECT")
    watcher.close()
    # no advisory arrives; its own message does (noLocal ignored)
    differences[watcher.id] = {("messages", "adv"), ("messages", "c")}

    feeder.send("DISCONNECT")
    feeder.close()
    ops_app = Application(
        "10.0.0.9",
        "ops",
        None,
        frozenset(
            {
                "stomp-1.2",
                "receipt",
                "message-group",
                "browser",
                "virtual-topic",
                "scheduled-delivery",
                "exclusive-consumer",
                "transformation",
                "no-local",
                "retroactive",
                "advisory-topic",
            }
        ),
    )
    return Fleet(
        [orders_app, prices_feed, prices_app, billing_app, rpc_app, ops_app],
        queues,
        differences,
        connections=next(r._conns) - 1,
    )


def traffic(recording: Recording, frames: int, span: float = 3600.0, tag: str = "t") -> None:
    """``frames`` frames of steady ActiveMQ traffic over ``span`` seconds after the recording's
    clock: producers SEND to eight destinations whose rates rise and fall over the span, and
    consumers receive them (the load of the report's timing, docs/performance.md)."""
    import math
    import random

    rng = random.Random(28)
    destinations = [
        ("/queue/orders.incoming", "10.0.1.10", "shop", 1.0, 0.0),
        ("/queue/orders.paid", "10.0.1.10", "shop", 0.6, 1.0),
        ("/topic/prices.eu.stocks", "10.0.1.20", "prices", 1.4, 2.0),
        ("/topic/prices.us.stocks", "10.0.1.20", "prices", 1.1, 2.6),
        ("/queue/billing.invoices", "10.0.1.30", "billing", 0.4, 3.3),
        ("/queue/mail.outgoing", "10.0.1.40", "mailer", 0.3, 4.1),
        ("/topic/audit.events", "10.0.1.50", "audit", 0.8, 5.0),
        ("/queue/reports.nightly", "10.0.1.60", "reports", 0.2, 0.5),
    ]
    producers = {}
    consumers = {}
    for destination, host, login, _weight, _phase in destinations:
        version = "1.0" if login == "shop" else "1.2"
        producers[destination] = recording.connection(host).connect(version, login=login)
        consumer = recording.connection(host).connect(version, login=f"{login}-worker")
        consumer.send("SUBSCRIBE", [("destination", destination), ("id", "1"), ("ack", "auto")])
        consumers[destination] = consumer
    start = recording.clock
    pairs = max(frames // 2 - len(destinations) * 3, 1)
    for n in range(pairs):
        now = start + span * n / pairs
        weights = [
            w * (1.2 + math.sin(2 * math.pi * (now - start) / span * 2 + phase))
            for _, _, _, w, phase in destinations
        ]
        destination = rng.choices([d[0] for d in destinations], weights)[0]
        size = rng.choice((120, 480, 900, 2400, 16000))
        recording.clock = now
        producer = producers[destination]
        headers = [("destination", destination), ("content-type", "application/json"), ("persistent", "true")]
        if n % 7 == 0:
            headers.append(("receipt", f"r{n}"))
        producer.send("SEND", headers, b"x" * size)
        consumers[destination].message("1", destination, b"x" * size)
    recording.clock = start + span
