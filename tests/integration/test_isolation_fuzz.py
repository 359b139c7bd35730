"""Random sessions of several users on shared AMQP connections and shared subscriptions, against
the real broker, hunting for the next isolation bug (issue 33): random honest and hostile frames
(names that are not UTF-8, names over 255 bytes, unknown or malformed queue arguments, frames
over the broker's frame_max, missing queues and exchanges, bad acks), while permissions and
limits of one user change mid-run through the management API.

The oracle, checked after every step:

* an ERROR reaches only the session whose own frame drew it, or a session of the one user whose
  rights or limits the run changed: the sessions of the other users, on the same shared
  connections as the hostile sessions of their own user, never get one, and each still makes a
  round trip at the end;
* no session receives a message its user may not read: a user without read permission on
  ``amq.topic`` never gets a topic MESSAGE, and after the changing user loses it, no
  subscription it makes gets one.

Seeded and deterministic in what it sends (the seed is in the failure message); not timed."""

from __future__ import annotations

import random
import select
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.support import AdapterProcess, BrokerProbe, Frame, RawSession, unique

PER_CONNECTION = 8
BAD = b"\xff\xfe"
NO_TOPIC_READ = {"configure": ".*", "write": ".*", "read": "^(?!amq\\.topic$).*"}


@dataclass
class Player:
    """One STOMP session and everything it has received."""

    user: str
    session: RawSession
    name: str
    seen: list[Frame] = field(default_factory=list)
    hostile_sent: bool = False  # it sent a frame meant to be refused: its ERROR is its own
    topic_subscriptions: set[str] = field(default_factory=set)
    after_revocation: set[str] = field(default_factory=set)  # its subscriptions made after
    ended: bool = False

    def drain(self) -> None:
        """Take whatever has arrived, without waiting."""
        sock = self.session.sock
        while not self.ended:
            readable, _, _ = select.select([sock], [], [], 0)
            if not readable:
                break
            try:
                more = self.session._more(time.monotonic() + 0.05)
            except OSError:
                more = False
            self._take()
            if not more:
                self.ended = True
        self._take()

    def _take(self) -> None:
        self.seen += self.session._pending
        self.session._pending = []

    def ask(self, frame: bytes) -> Frame | None:
        """Send ``frame`` (with a receipt) and wait for its RECEIPT or ERROR."""
        try:
            self.session.sock.sendall(frame + b"\0")
            got = self.session.frames_until(("RECEIPT", "ERROR"), timeout=10)
        except OSError:
            self.ended = True
            return None
        self.seen += got
        if not got or got[-1][0] not in ("RECEIPT", "ERROR"):
            self.ended = True
            return None
        return got[-1]

    def errors(self) -> list[Frame]:
        return [frame for frame in self.seen if frame[0] == "ERROR"]


class Run:
    """The state of one seeded run (see the module docstring)."""

    def __init__(self, adapter: AdapterProcess, broker: BrokerProbe, seed: int, steps: int) -> None:
        self.adapter = adapter
        self.broker = broker
        self.rng = random.Random(seed)
        self.seed = seed
        self.change_at = self.rng.randrange(steps // 4, steps // 2)
        self.log: list[str] = []
        # two users nothing happens to, one without read on amq.topic from the start, one whose
        # rights and limits change mid-run
        self.steady = [broker.create_user("pw", "fz-a"), broker.create_user("pw", "fz-b")]
        self.unread = broker.create_user("pw", "fz-noread", permissions=NO_TOPIC_READ)
        self.changing = broker.create_user("pw", "fz-change")
        self.changed = False
        self.revoked = False
        self.topics = [unique("fz-t") for _ in range(3)]
        self.queues = [unique("fz-q") for _ in range(3)]
        broker.track_queue(*self.queues)
        self.stream = unique("fz-stream")  # RabbitMQ answers some misuses of a stream with a connection error
        broker.declare_queue(self.stream, durable=True, arguments={"x-queue-type": "stream"})
        self.players: list[Player] = []
        for user in (*self.steady, self.unread, self.changing):
            for _ in range(3):
                self.join(user)

    def join(self, user: str) -> Player | None:
        session = RawSession(self.adapter.port, user, "pw")
        if session.command != "CONNECTED":
            assert user == self.changing and self.changed, (self.seed, user, session.body, self.log[-5:])
            return None
        player = Player(user, session, unique("p"))
        self.players.append(player)
        return player

    def live(self) -> list[Player]:
        return [p for p in self.players if not p.ended]

    # ------------------------------------------------------------------ steps
    def step(self, number: int) -> None:
        roll = self.rng.random()
        if not self.changed and number == self.change_at:
            self.change()
        elif roll < 0.1:
            self.join(self.rng.choice([*self.steady, self.unread, self.changing]))
        else:
            players = self.live()
            if not players:
                return
            player = self.rng.choice(players)
            if roll < 0.35:
                self.hostile(player)
            else:
                self.honest(player)
        for player in self.live():
            player.drain()
        self.check()

    def honest(self, player: Player) -> None:
        kind = self.rng.choice(["send-queue", "send-topic", "sub-queue", "sub-topic"])
        topic, queue = self.rng.choice(self.topics), self.rng.choice(self.queues)
        body = f"{self.seed}-{len(self.log)}"
        if kind == "send-queue":
            frame = f"SEND\ndestination:/queue/{queue}\nreceipt:r\n\n{body}"
        elif kind == "send-topic":
            frame = f"SEND\ndestination:/topic/{topic}\nreceipt:r\n\n{body}"
        elif kind == "sub-queue":
            frame = f"SUBSCRIBE\nid:{unique('q')}\ndestination:/queue/{queue}\nreceipt:r\n\n"
        else:
            sub_id = unique("t")
            frame = f"SUBSCRIBE\nid:{sub_id}\ndestination:/topic/{topic}\nreceipt:r\n\n"
            if player.user == self.unread:
                player.hostile_sent = True  # refused by the broker: its own ERROR
            if self.revoked and player.user == self.changing:
                player.after_revocation.add(sub_id)
            player.topic_subscriptions.add(sub_id)
        self.log.append(f"{player.name} ({player.user}): {frame.splitlines()[0]} {frame.splitlines()[1]}")
        answer = player.ask(frame.encode())
        if answer is not None and answer[0] == "ERROR" and not self.allowed_error(player):
            raise AssertionError(f"seed {self.seed}: an honest frame got {answer}: {self.log[-10:]}")

    def hostile(self, player: Player) -> None:
        # a queue of its own: a refused or odd declare must not change the honest queues
        queue = unique("fz-h")
        self.broker.track_queue(queue)
        big = "h" * 90_000
        frames = [
            b"SUBSCRIBE\nid:1\ndestination:/queue/q" + BAD + b"\nreceipt:r\n\n",
            b"SUBSCRIBE\nid:x" + BAD + b"\ndestination:/queue/" + queue.encode() + b"\nreceipt:r\n\n",
            b"SEND\ndestination:/queue/"
            + queue.encode()
            + b"\nreply-to:/temp-queue/r"
            + BAD
            + b"\nreceipt:r\n\nx",
            b"SUBSCRIBE\nid:1\ndestination:/topic/t\nx-queue-name:n" + BAD + b"\nreceipt:r\n\n",
            b"SUBSCRIBE\nid:1\ndestination:/queue/" + b"n" * 300 + b"\nreceipt:r\n\n",
            b"SUBSCRIBE\nid:1\ndestination:/queue/" + queue.encode() + b"\nx-max-length:lots\nreceipt:r\n\n",
            b"SUBSCRIBE\nid:1\ndestination:/queue/" + queue.encode() + b"\nx-message-ttl:-5\nreceipt:r\n\n",
            b"SUBSCRIBE\nid:1\ndestination:/amq/queue/" + unique("absent").encode() + b"\nreceipt:r\n\n",
            b"SUBSCRIBE\nid:1\ndestination:/exchange/" + unique("absent").encode() + b"/k\nreceipt:r\n\n",
            f"SEND\ndestination:/queue/{queue}\nx-a:{big}\nx-b:{big}\nreceipt:r\n\nx".encode(),
            b"ACK\nid:nonsense\nreceipt:r\n\n",
            b"SUBSCRIBE\nid:1\ndestination:/queue/" + queue.encode() + b"\nprefetch-count:-1\nreceipt:r\n\n",
            b"SUBSCRIBE\nid:1\ndestination:/queue/"
            + queue.encode()
            + b"\nx-unknown-argument:1\nreceipt:r\n\n",
            b"SEND\ndestination:/topic/t" + BAD + b"\nreceipt:r\n\nx",
            f"SUBSCRIBE\nid:1\ndestination:/amq/queue/{self.stream}\nack:auto\nprefetch-count:10\nreceipt:r\n\n".encode(),
            f"SUBSCRIBE\nid:1\ndestination:/amq/queue/{self.stream}\nack:auto\nreceipt:r\n\n".encode(),
            f"SUBSCRIBE\nid:1\ndestination:/amq/queue/{self.stream}\nack:client\nreceipt:r\n\n".encode(),
        ]
        frame = self.rng.choice(frames)
        player.hostile_sent = True
        self.log.append(f"{player.name} ({player.user}): hostile {frame[:60]!r}")
        player.ask(frame)

    def change(self) -> None:
        """The changing user loses read on amq.topic and gets a channel limit at what it holds."""
        self.changed = True
        quoted = urllib.parse.quote(self.changing, safe="")
        which = self.rng.choice(["revoke", "limit", "both"])
        if which in ("revoke", "both"):
            self.broker.management(f"/api/permissions/%2F/{quoted}", "PUT", NO_TOPIC_READ)
            self.revoked = True
        if which in ("limit", "both"):
            self.broker.management(f"/api/user-limits/{quoted}/max-channels", "PUT", {"value": 2})
        self.log.append(f"changed {self.changing}: {which}")

    # ------------------------------------------------------------------ the oracle
    def allowed_error(self, player: Player) -> bool:
        return player.hostile_sent or (player.user == self.changing and self.changed)

    def check(self) -> None:
        for player in self.players:
            if player.errors() and not self.allowed_error(player):
                raise AssertionError(
                    f"seed {self.seed}: {player.name} of {player.user} sent nothing hostile and its user "
                    f"was not changed, yet got {player.errors()}: {self.log[-10:]}"
                )
            for frame in player.seen:
                if frame[0] != "MESSAGE":
                    continue
                subscription = frame[1].get("subscription", "")
                if player.user == self.unread and subscription in player.topic_subscriptions:
                    raise AssertionError(f"seed {self.seed}: {player.user} read a topic: {frame}")
                if subscription in player.after_revocation:
                    raise AssertionError(
                        f"seed {self.seed}: a subscription made after the revocation read {frame}"
                    )

    def finish(self) -> None:
        """Every session of the steady users that sent nothing hostile is still served."""
        for player in self.live():
            player.drain()
        self.check()
        for player in self.live():
            if player.user in self.steady and not player.hostile_sent:
                own = unique("fz-end")
                self.broker.track_queue(own)
                player.session._pending = []
                player.session.round_trip(own)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_sessions_of_several_users_keep_their_fates_apart(
    start_adapter: Any, broker: BrokerProbe, seed: int
) -> None:
    adapter = start_adapter(
        amqp_sessions_per_connection=PER_CONNECTION,
        shared_subscriptions=True,
        amqp_connection_max_age_seconds=2,
    )
    steps = 80
    run = Run(adapter, broker, seed, steps)
    for number in range(steps):
        run.step(number)
    run.finish()
