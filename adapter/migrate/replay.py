"""Replay of a recording's client side against an adapter, and where its answers differ.

Owns the rehearsal of a cut-over: each recorded connection is opened again to the target (an
adapter in the ``activemq`` profile) and sent its client's frames, in the recorded order among
the connections related to it, and what comes back is compared with what the recorded upstream answered, per
connection: the ERROR frames (by ``message``, in any order; an ERROR worded differently for the
same outcome, as wordings.EQUIVALENT_ERRORS declares, is reported as equivalent and is no
difference), the receipts, the MESSAGE count per subscription.

How the recorded order is kept without timing luck, and only where it matters: the connections
are split into groups of related ones (related.py: a destination, a ``reply-to``, a
``client-id`` they share); the groups are replayed concurrently, each in its recorded order and
on the recording's clock (``speed`` times faster; at speed 0 without pauses, at most
``groups_at_once`` groups at a time), so the replay takes about the recording's span, not a
time that grows with its number of connections.  Inside a group, before a client frame is sent,
the replay waits (at most ``wait`` seconds, for the group's connections at once) until each
connection of the group has received what the upstream had sent it before that frame: the
receipts, the MESSAGEs per subscription, the ERRORs.  So an ACK goes after the message it
acknowledges, and a SEND of another connection after the SUBSCRIBE receipt that preceded it.  A
connection that stays behind is not waited for again until the recording expects more of it.

The values only the upstream could know are translated: the ``id`` or
``message-id`` of an ACK/NACK becomes the target's id of the same message (same subscription,
same position), and a SEND to a recorded ``reply-to`` value goes to the target's ``reply-to`` of
the same message.  CONNECT gets the passcode given to the replay (recordings never hold one) and
asks for no heart-beats (the replay sends none).  A DISCONNECT (or the client's close) is sent
``SETTLE`` seconds after its turn (at once when the target has closed the connection already),
so that a message the upstream did not send but the target does arrives before it and is
counted.  The frames of the same group that the upstream saw after that end and that it could
change wait for it: a SEND or SUBSCRIBE waits for the ends of the group's connections that
subscribed to a destination it reaches (related.name_components: the same name, a wildcard that
matches it; a subscriber that is still there on the target would take messages the recording
gave to another one; a producer, or a requester on its own temporary queue, takes none of
them), and a CONNECT waits for
the ends of the connections with its ``client-id`` (ActiveMQ, and the profile, refuse a
client-id that is still connected).

An end is over when the target says so, not when the replay has written it: a DISCONNECT
goes with a ``receipt`` header (the replay's own, ``END_RECEIPT``, when the client asked for
none; its RECEIPT is not compared) and the end waits for that RECEIPT (at most ``wait``
seconds) before the socket is closed.  STOMP's graceful disconnect is exactly this (STOMP 1.2,
"DISCONNECT"), and the adapter sends that RECEIPT only once its AMQP channel is closed, when
the broker has cancelled the connection's consumers.  Without it a client that disconnects
without a receipt (Net::Stomp does) and a SEND of another connection right after were a race
on the target: the old subscription's consumer, not yet cancelled, took the message
(with ``ack:auto`` it is gone), and the next subscriber of a durable subscription missed it.
A client's close without DISCONNECT has no such answer: the target's teardown after it is
not observable, and a frame of another connection right after it may still race with it.

Results as it goes, and a quick stop: each connection's result is handed to ``on_result`` when
the connection has ended.  A login the upstream accepted and the target refuses is a result of
its own (a ``CONNECTED`` difference, with the target's ERROR); when the first
``stop_after_refused_logins`` logins are all refused the replay stops (``Replayer.stopped`` says
why: recordings hold no passcodes, so it is nearly always a missing ``--passcode``).

asyncio streams and the project's frame parser; no Spark.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from ..stomp.codec import FrameError, FrameLimits, FrameParser
from .idioms import frame_idioms, idiom
from .recording import Event
from .related import destinations_reached, name_components, related_groups, split_by_group
from .wordings import compare_errors

__all__ = [
    "END_RECEIPT",
    "SETTLE",
    "ConnectionResult",
    "ReplayOptions",
    "Replayer",
    "refused_logins_message",
    "replay",
]

SETTLE: Final = 1.0
# the receipt id the replay adds to a DISCONNECT that has none (so that the target says when the
# connection's end is done); its RECEIPT is the replay's, not the client's, and is not compared
END_RECEIPT: Final = "stomp-migrate-replay-end"
_CONNECT: Final = frozenset({"CONNECT", "STOMP"})


@dataclass(frozen=True, slots=True)
class ReplayOptions:
    host: str
    port: int
    speed: float = 1.0  # 0: no pauses between frames (only the waits for answers)
    login: str | None = None
    passcode: str | None = None
    vhost: str | None = None
    wait: float = 5.0
    # stop when the first N logins (of connections the upstream let in) are all refused; 0: never
    stop_after_refused_logins: int = 3
    # at speed 0, at most this many groups of related connections replayed at once
    groups_at_once: int = 100


@dataclass
class _Answers:
    """What one side (the recorded upstream, or the target) answered a connection."""

    connected: bool = False
    errors: list[str] = field(default_factory=list)
    receipts: set[str] = field(default_factory=set)
    messages: Counter[str] = field(default_factory=Counter)
    # the ack handle and reply-to of each MESSAGE, by (subscription, position)
    handles: dict[tuple[str, int], str] = field(default_factory=dict)
    keys: dict[str, tuple[str, int]] = field(default_factory=dict)  # handles, the other way
    reply_tos: dict[tuple[str, int], str] = field(default_factory=dict)

    def take(
        self, command: str | None, headers: Iterable[tuple[str, str]], subscription_ids: set[str]
    ) -> tuple[str, int] | None:
        """Count one frame; for a MESSAGE with a ``reply-to``, its (subscription, position)."""
        values: dict[str, str] = {}
        for name, value in headers:
            values.setdefault(name, value)
        if command == "CONNECTED":
            self.connected = True
        elif command == "ERROR":
            self.errors.append(values.get("message", ""))
        elif command == "RECEIPT":
            self.receipts.add(values.get("receipt-id", ""))
        elif command == "MESSAGE":
            sub = values.get("subscription")
            key = sub if sub in subscription_ids else f"destination {values.get('destination', '?')}"
            position = self.messages[key]
            self.messages[key] += 1
            handle = values.get("ack") or values.get("message-id")
            if handle is not None:
                self.handles[(key, position)] = handle
                self.keys[handle] = (key, position)
            if "reply-to" in values:
                self.reply_tos[(key, position)] = values["reply-to"]
                return key, position
        return None


@dataclass
class ConnectionResult:
    """The comparison of one connection: its client, application, idioms and differences."""

    conn: str
    client: str
    login: str | None
    client_id: str | None
    idioms: set[str]
    differences: list[dict[str, Any]] = field(default_factory=list)
    not_sent: int = 0
    # ERRORs worded differently for the same outcome (wordings.EQUIVALENT_ERRORS): not differences
    equivalent: list[dict[str, Any]] = field(default_factory=list)
    # the target refused the login the upstream accepted: its ERROR message (or how it ended)
    login_refused: str | None = None

    def describe(self) -> str:
        who = f"{self.conn} ({self.login or '?'}@{self.client}" + (
            f", client-id {self.client_id})" if self.client_id else ")"
        )
        caveats = sorted(name for name in self.idioms if idiom(name).support != "same")
        lines = [f"{who}: {'differs' if self.differences else 'same'}"]
        if self.login_refused is not None:
            lines.append(f"  login refused by the target: {self.login_refused}")
        for difference in self.differences:
            lines.append(
                f"  {difference['what']}: recorded {difference['recorded']},"
                f" replayed {difference['replayed']}"
            )
        for same in self.equivalent:
            lines.append(
                f"  ERROR equivalent ({same['wording']}): recorded {same['recorded']!r},"
                f" replayed {same['replayed']!r}"
            )
        if self.not_sent:
            lines.append(f"  {self.not_sent} client frames not sent: the target had closed the connection")
        if caveats:
            lines.append(f"  uses {', '.join(f'{n} ({idiom(n).support})' for n in caveats)}")
        return "\n".join(lines)

    def as_json(self) -> dict[str, Any]:
        return {
            "conn": self.conn,
            "client": self.client,
            "login": self.login,
            "client_id": self.client_id,
            "idioms": sorted(self.idioms),
            "differences": self.differences,
            "equivalent": self.equivalent,
            "frames_not_sent": self.not_sent,
            "login_refused": self.login_refused,
        }


class _Connection:
    """One recorded connection, replayed."""

    def __init__(self, conn: str, client: str, subscription_ids: set[str]) -> None:
        self.conn = conn
        self.client = client
        self.subscription_ids = subscription_ids
        self.recorded = _Answers()
        self.replayed = _Answers()
        self.changed = asyncio.Event()
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.reading: asyncio.Task[None] | None = None
        self.closed = False
        self.finished = False  # the client's DISCONNECT or close has been sent
        # the receipt id of the DISCONNECT sent, and whether the replay added it
        self.end_receipt: str | None = None
        self.end_receipt_added = False
        self.end_confirmed = False  # the target's RECEIPT for that DISCONNECT came
        self.login: str | None = None
        self.client_id: str | None = None
        self.idioms: set[str] = set()
        self.not_sent = 0
        self.acks_undelivered = 0  # ACK/NACK frames of messages the target did not deliver
        # the destinations (related.name_components) it has subscribed to: its end matters to
        # later SENDs and SUBSCRIBEs there
        self.subscribed_to: set[str] = set()
        self.login_refused: str | None = None
        self.reported = False  # its result has been written
        # the receipts the upstream had sent by the recording so far that the target has not
        # (kept as they come: a set comparison per frame was quadratic on a long connection)
        self.receipts_missing: set[str] = set()

    async def open(self, options: ReplayOptions) -> None:
        self.reader, self.writer = await asyncio.open_connection(options.host, options.port)
        self.reading = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.reader is not None
        parser = FrameParser(FrameLimits(max_frame_size=256 * 1024 * 1024, max_headers=10_000))
        try:
            while True:
                data = await self.reader.read(65536)
                if not data:
                    break
                parser.feed(data)
                while (frame := parser.next_frame()) is not None:
                    if frame.command == "CONNECTED":
                        parser.set_version(frame.headers.get("version", "1.0"))
                    self.changed.set()
                    if (
                        frame.command == "RECEIPT"
                        and self.end_receipt is not None
                        and frame.headers.get("receipt-id") == self.end_receipt
                    ):
                        self.end_confirmed = True
                        if self.end_receipt_added:
                            continue  # the replay's own: not an answer to compare
                    self.replayed.take(frame.command, frame.headers.items(), self.subscription_ids)
                    if frame.command == "RECEIPT":
                        self.receipts_missing.discard(frame.headers.get("receipt-id", ""))
        except (OSError, FrameError):
            pass
        finally:
            self.closed = True
            self.changed.set()

    async def caught_up(self, timeout: float) -> bool:
        """Wait until the target has answered what the upstream had answered so far."""
        return await self.until(self.has_caught_up, timeout)

    def has_caught_up(self) -> bool:
        """Whether the target has sent at least what the upstream had (by the recording so far):
        the CONNECTED, as many ERRORs, every receipt, as many MESSAGEs per subscription."""
        recorded, replayed = self.recorded, self.replayed
        return (
            (replayed.connected or not recorded.connected)
            and len(replayed.errors) >= len(recorded.errors)
            and not self.receipts_missing
            and all(replayed.messages[key] >= count for key, count in recorded.messages.items())
        )

    def take_recorded(
        self, command: str | None, headers: Sequence[tuple[str, str]]
    ) -> tuple[str, int] | None:
        """A frame the upstream sent (see _Answers.take)."""
        if command == "RECEIPT":
            receipt = next((value for name, value in headers if name == "receipt-id"), "")
            if receipt not in self.replayed.receipts:
                self.receipts_missing.add(receipt)
        return self.recorded.take(command, headers, self.subscription_ids)

    async def end_confirmed_by_target(self, timeout: float) -> bool:
        """Wait until the target has sent the RECEIPT of the DISCONNECT."""
        return await self.until(lambda: self.end_confirmed, timeout)

    def login_answered(self) -> bool:
        """Whether the target has answered the CONNECT (CONNECTED, or ERROR)."""
        return self.replayed.connected or bool(self.replayed.errors)

    def refusal(self) -> str:
        """How the target refused the login: its ERROR's message, or that it closed."""
        if self.replayed.errors:
            return self.replayed.errors[0] or "ERROR without a message"
        return "the connection closed without CONNECTED" if self.closed else "no CONNECTED in time"

    async def until(self, done: Callable[[], bool], timeout: float) -> bool:
        """Wait until ``done()`` holds after a frame from the target (False: closed, or not within
        ``timeout`` seconds)."""
        deadline = time.monotonic() + timeout
        while not done():
            remaining = deadline - time.monotonic()
            if self.closed or remaining <= 0:
                return False
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), remaining)
        return True

    def write(self, data: bytes) -> bool:
        if self.closed or self.writer is None or self.writer.is_closing():
            self.not_sent += 1
            return False
        self.writer.write(data)
        return True

    async def close(self) -> None:
        if self.writer is not None and not self.writer.is_closing():
            self.writer.close()
            with contextlib.suppress(OSError):
                await self.writer.wait_closed()
        if self.reading is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.reading, 5)

    def result(self) -> ConnectionResult:
        recorded, replayed = self.recorded, self.replayed
        differences: list[dict[str, Any]] = []
        errors = compare_errors(recorded.errors, replayed.errors)
        if errors.differs:
            differences.append(
                {
                    "what": "ERROR",
                    "key": "",
                    "recorded": errors.recorded_only,
                    "replayed": errors.replayed_only,
                }
            )
        equivalent = [
            {"what": "ERROR", "wording": name, "recorded": mine, "replayed": theirs}
            for mine, theirs, name in errors.equivalent
        ]
        for receipt in sorted(recorded.receipts ^ replayed.receipts):
            differences.append(
                {
                    "what": f"RECEIPT {receipt}",
                    "key": receipt,
                    "recorded": receipt in recorded.receipts,
                    "replayed": receipt in replayed.receipts,
                }
            )
        for key in sorted(set(recorded.messages) | set(replayed.messages)):
            if recorded.messages[key] != replayed.messages[key]:
                differences.append(
                    {
                        "what": f"MESSAGEs of subscription {key}",
                        "key": key,
                        "recorded": recorded.messages[key],
                        "replayed": replayed.messages[key],
                    }
                )
        if self.login_refused is not None:
            differences.append({"what": "CONNECTED", "key": "login", "recorded": True, "replayed": False})
        if self.acks_undelivered:
            differences.append(
                {
                    "what": "ACK/NACK of a message the target did not deliver (not sent)",
                    "key": "acks",
                    "recorded": self.acks_undelivered,
                    "replayed": 0,
                }
            )
        return ConnectionResult(
            self.conn,
            self.client,
            self.login,
            self.client_id,
            self.idioms,
            differences,
            self.not_sent,
            equivalent,
            self.login_refused,
        )


def _body_of(event: Event) -> bytes:
    """The body to send for a recorded client frame: the recorded one; for one the tap left out
    because of its size (``omitted``), as many filler bytes (its length still matters: limits,
    ``content-length``, what consumers are sent); else none."""
    if event.body is not None:
        return event.body
    if "body" in event.omitted and event.body_len > 0:
        return b"x" * event.body_len
    return b""


def _encode(command: str, headers: Sequence[tuple[str, str]], body: bytes) -> bytes:
    # the recorded header bytes as they were on the wire (still escaped)
    head = "".join(f"{name}:{value}\n" for name, value in headers)
    return f"{command}\n{head}\n".encode("utf-8", "surrogateescape") + body + b"\0"


class _Group:
    """The replay of one group of related connections (related.py): its frames in recorded
    order, and what its frames wait for, which is only ever about its own connections."""

    def __init__(self, replayer: Replayer, events: Sequence[Event]) -> None:
        self.replayer = replayer
        self.events = events
        # the connections whose recorded answers grew since the target last caught up with them
        self.behind: set[_Connection] = set()
        # the delayed ends not yet done of connections that subscribed, by the destinations they
        # subscribed to (a SEND or SUBSCRIBE there that the upstream saw after such an end waits
        # for it), and of all connections by client-id
        self.subscriber_ends: dict[str, list[asyncio.Task[None]]] = {}
        self.ends_by_client_id: dict[str, list[asyncio.Task[None]]] = {}
        self.ends: list[asyncio.Task[None]] = []
        # the recorded MESSAGEs with a reply-to whose target's reply-to (the same message's on the
        # target) is not known yet: (connection, (subscription, position))
        self.unlearned: list[tuple[_Connection, tuple[str, int]]] = []

    async def run(self) -> None:
        replayer, options = self.replayer, self.replayer.options
        try:
            for event in self.events:
                await self._step(event, replayer, options)
            for connection in self._connections():
                if not connection.finished:
                    self._end(connection, None)
            await asyncio.gather(*self.ends)
        finally:
            for task in self.ends:
                task.cancel()

    def _connections(self) -> list[_Connection]:
        conns = dict.fromkeys(event.conn for event in self.events)
        return [self.replayer.connections[c] for c in conns if c in self.replayer.connections]

    async def _step(self, event: Event, replayer: Replayer, options: ReplayOptions) -> None:
        if event.conn in replayer.skipped:
            return
        connection = replayer.connection(event)
        if event.kind == "close":
            if connection.writer is not None and not connection.finished:
                # what the upstream sent it before it closed (a scheduled message 1.5 s late, say)
                # is waited for first, as a DISCONNECT's catch-up does
                await self._catch_up(options.wait)
                self._end(connection, None)
            return
        if event.direction == "out":
            answered = connection.take_recorded(event.command, event.headers)
            if answered is not None:
                self.unlearned.append((connection, answered))
            self.behind.add(connection)
            return
        if event.command is None:
            return  # a frame the tap could not parse: the upstream got bytes we cannot rebuild
        if connection.writer is None:
            if event.command not in _CONNECT:
                replayer.skip(connection)
                return
            connection.login = event.header("login")
            connection.client_id = event.header("client-id")
            if connection.client_id is not None:
                await self._ended(self.ends_by_client_id.pop(connection.client_id, []))
            await replayer.turn_of(event)
            await connection.open(options)
        else:
            await replayer.turn_of(event)
        connection.idioms.update(frame_idioms("in", event.command, event.headers))
        reached: set[str] = set()
        if event.command in ("SEND", "SUBSCRIBE"):
            reached = replayer.reached(connection, event)
            await self._ended([task for name in reached for task in self.subscriber_ends.pop(name, [])])
        await self._catch_up(options.wait)
        if event.command in ("ACK", "NACK") and not await _acked_delivered(connection, event, options.wait):
            connection.acks_undelivered += 1
            return
        self._learn_reply_tos()
        data = _encode(event.command, replayer.rewrite(connection, event), _body_of(event))
        if event.command == "DISCONNECT":
            self._end(connection, data)
            return
        connection.write(data)
        if event.command == "SUBSCRIBE":
            connection.subscribed_to |= reached
        elif event.command in _CONNECT:
            await connection.until(connection.login_answered, options.wait)
            replayer.login_done(connection)

    def _learn_reply_tos(self) -> None:
        """The target's reply-to of each recorded MESSAGE with one, once the target has sent
        that MESSAGE: a SEND to the recorded value goes there."""
        if not self.unlearned:
            return
        reply_tos, unlearned = self.replayer.reply_tos, []
        for connection, key in self.unlearned:
            replayed = connection.replayed.reply_tos.get(key)
            if replayed is None:
                unlearned.append((connection, key))
            else:
                reply_tos[connection.recorded.reply_tos[key]] = replayed
        self.unlearned = unlearned

    async def _catch_up(self, wait: float) -> None:
        """Wait until every connection of the group has what the upstream had answered it so
        far (all at once, at most ``wait`` seconds); one that does not is not waited for again
        until the recording expects more of it.  A connection whose end is under way is not
        waited for here: what it still lacks came after its DISCONNECT (that frame's RECEIPT,
        the last MESSAGEs), and its end waits for that itself."""
        if self.behind:
            behind, self.behind = self.behind, set()
            await asyncio.gather(
                *(c.caught_up(wait) for c in behind if c.writer is not None and not c.finished)
            )

    def _end(self, connection: _Connection, data: bytes | None) -> None:
        """The connection's DISCONNECT (``data``) or close, ``SETTLE`` seconds from now."""
        connection.finished = True
        task = asyncio.create_task(self.replayer.end(connection, data))
        self.ends.append(task)
        for name in connection.subscribed_to:
            self.subscriber_ends.setdefault(name, []).append(task)
        if connection.client_id is not None:
            self.ends_by_client_id.setdefault(connection.client_id, []).append(task)

    @staticmethod
    async def _ended(tasks: Sequence[asyncio.Task[None]]) -> None:
        """Wait for these delayed ends (those of connections the upstream saw end first)."""
        if tasks:
            await asyncio.gather(*tasks)


async def _acked_delivered(connection: _Connection, event: Event, wait: float) -> bool:
    """Whether the target has delivered the message an ACK or NACK names (waiting for it at
    most ``wait`` seconds).  The upstream may have sent more before the client's first ACK
    than the target will (a prefetch the upstream ignored, as RabbitMQ's plugin ignores
    ``activemq.prefetchSize``): the target sends the rest once the first ones are
    acknowledged.  The upstream's id of a message the target never delivered means nothing
    to the target (or, worse, names another of its messages): such a frame is not sent."""
    recorded = connection.recorded.keys
    keys = [
        recorded[value] for name, value in event.headers if name in ("id", "message-id") and value in recorded
    ]
    if not keys:
        return True
    return await connection.until(lambda: all(key in connection.replayed.handles for key in keys), wait)


def refused_logins_message(refused: int, answer: str) -> str:
    """Why a replay stopped when its first logins were all refused, and what to do about it."""
    return (
        f"the target refused the first {refused} logins (it answered: {answer}); recordings hold no"
        " passcodes, so the replay sends the one it is given: --passcode PASS (or the variable"
        " STOMP_MIGRATE_PASSCODE) for the recorded logins, with --login USER to log every connection"
        " in as one user; --stop-after-refused-logins 0 replays on regardless"
    )


class Replayer:
    """The replay of a recording's connections against the target, group by group (related.py):
    the groups run concurrently, each in its recorded order.

    ``on_result`` is called with each connection's result as soon as that connection has ended
    (its socket closed); ``results`` holds them in that order.  ``stopped`` says why the replay
    stopped early (its first logins were all refused), None otherwise."""

    def __init__(
        self,
        events: Sequence[Event],
        options: ReplayOptions,
        on_result: Callable[[ConnectionResult], None] | None = None,
    ) -> None:
        self.events = events
        self.options = options
        self.on_result = on_result
        self.connections: dict[str, _Connection] = {}
        self.reply_tos: dict[str, str] = {}  # a recorded reply-to -> the target's for the same message
        subscription_ids: dict[str, set[str]] = {}
        first_client_frame: dict[str, str] = {}
        self.accepted_upstream: set[str] = set()  # connections the upstream answered CONNECTED
        for event in events:
            if event.direction == "in" and event.command is not None:
                first_client_frame.setdefault(event.conn, event.command)
                if event.command == "SUBSCRIBE":
                    sub_id = event.header("id")
                    if sub_id is not None:
                        subscription_ids.setdefault(event.conn, set()).add(sub_id)
            elif event.direction == "out" and event.command == "CONNECTED":
                self.accepted_upstream.add(event.conn)
        self.subscription_ids = subscription_ids
        groups = related_groups(events)
        self.components = name_components(events)
        self.groups = [_Group(self, part) for part in split_by_group(events, groups)]
        # the connections the replay will open: recorded from their CONNECT on (or with no client
        # frame at all: compared, with nothing replayed), in the order of their first frame
        self.order = {
            conn: index
            for index, conn in enumerate(
                c for group in groups for c in group if first_client_frame.get(c, "CONNECT") in _CONNECT
            )
        }
        self.total = len(self.order)
        self.skipped: set[str] = set()  # recorded mid-connection: their CONNECT is not in the recording
        self.results: list[ConnectionResult] = []
        self.differing = 0
        self.logins = 0  # logins the upstream accepted, answered by the target so far
        self.logins_refused = 0
        self.stopped: str | None = None
        self._stop = asyncio.Event()
        self._started = 0.0
        self._first = events[0].ts if events else 0.0

    def connection(self, event: Event) -> _Connection:
        connection = self.connections.get(event.conn)
        if connection is None:
            connection = _Connection(event.conn, event.client, self.subscription_ids.get(event.conn, set()))
            self.connections[event.conn] = connection
        return connection

    def reached(self, connection: _Connection, event: Event) -> set[str]:
        """The destinations a SEND or SUBSCRIBE touches (as related.name_components names them)."""
        return destinations_reached(self.components, connection.conn, event.header("destination") or "")

    def skip(self, connection: _Connection) -> None:
        self.skipped.add(connection.conn)
        del self.connections[connection.conn]

    async def turn_of(self, event: Event) -> None:
        """Wait for the event's time on the replay's clock (``speed`` times the recorded one)."""
        if self.options.speed > 0:
            delay = (event.ts - self._first) / self.options.speed - (time.monotonic() - self._started)
            if delay > 0:
                await asyncio.sleep(delay)

    def rewrite(self, connection: _Connection, event: Event) -> list[tuple[str, str]]:
        options = self.options
        headers = list(event.headers)
        if event.command in _CONNECT:
            seen = {name for name, _ in headers}
            rewritten = []
            for name, value in headers:
                if name == "passcode" and options.passcode is not None:
                    value = options.passcode
                elif name == "login" and options.login is not None:
                    value = options.login
                elif name == "host" and options.vhost is not None:
                    value = options.vhost
                elif name == "heart-beat":
                    value = "0,0"
                rewritten.append((name, value))
            if "passcode" not in seen and options.passcode is not None:
                rewritten.append(("passcode", options.passcode))
            return rewritten
        if event.command == "DISCONNECT":
            # the target's RECEIPT says when the end is done (see the module's docstring)
            receipt = event.header("receipt")
            if receipt is None:
                receipt = END_RECEIPT
                connection.end_receipt_added = True
                headers.append(("receipt", receipt))
            connection.end_receipt = receipt
            return headers
        if event.command in ("ACK", "NACK"):
            recorded = connection.recorded.keys
            return [
                (name, connection.replayed.handles.get(recorded[value], value))
                if name in ("id", "message-id") and value in recorded
                else (name, value)
                for name, value in headers
            ]
        if event.command == "SEND":
            return [
                (name, self.reply_tos.get(value, value)) if name == "destination" else (name, value)
                for name, value in headers
            ]
        return headers

    def login_done(self, connection: _Connection) -> None:
        """Count the target's answer to a login the upstream accepted; stop the replay when the
        first ``stop_after_refused_logins`` of them were all refused."""
        if connection.conn not in self.accepted_upstream:
            return
        refused = not connection.replayed.connected
        if refused:
            connection.login_refused = connection.refusal()
        self.logins += 1
        self.logins_refused += refused
        limit = self.options.stop_after_refused_logins
        if limit > 0 and self.logins == limit and self.logins_refused == limit and self.stopped is None:
            self.stopped = refused_logins_message(limit, connection.login_refused or "")
            self._stop.set()

    async def end(self, connection: _Connection, data: bytes | None) -> None:
        """The connection's end: ``SETTLE`` seconds (not for a connection the target has closed
        already), its DISCONNECT ``data`` (or none: the client closed), the target's RECEIPT of it,
        the socket's close; then its result."""
        if not connection.closed:
            await asyncio.sleep(SETTLE)
        if data is not None and connection.write(data):
            await connection.end_confirmed_by_target(self.options.wait)
            await connection.caught_up(self.options.wait)
        await connection.close()
        self._report(connection)

    def _report(self, connection: _Connection) -> None:
        if connection.reported:
            return
        connection.reported = True
        result = connection.result()
        self.results.append(result)
        self.differing += bool(result.differences)
        if self.on_result is not None:
            self.on_result(result)

    async def run(self) -> list[ConnectionResult]:
        """Replay every group; the results of the connections that ended, in the order of their
        first frames in the recording."""
        self._started = time.monotonic()
        # without pauses every group would start at once: a bound on the groups under way
        bound = asyncio.Semaphore(
            self.options.groups_at_once if self.options.speed == 0 else len(self.groups) or 1
        )

        async def bounded(group: _Group) -> None:
            async with bound:
                await group.run()

        groups = [asyncio.create_task(bounded(group)) for group in self.groups]

        async def stop_asked() -> None:
            await self._stop.wait()

        stop = asyncio.create_task(stop_asked())
        work = asyncio.gather(*groups)  # done when all are, or at the first that fails
        try:
            either: list[asyncio.Future[Any]] = [work, stop]
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
            if work.done():
                work.result()  # a group that failed (the target unreachable ...) fails the replay
        finally:
            stop.cancel()
            for task in groups:
                task.cancel()
            await asyncio.gather(*groups, return_exceptions=True)
            if work.done() and not work.cancelled():
                work.exception()  # retrieved (it was raised above, or a stop came first)
            await self._close_all()
        return sorted(self.results, key=lambda result: self.order.get(result.conn, len(self.order)))

    async def _close_all(self) -> None:
        """After a stop or an interruption: the sockets still open closed; the refused logins
        among them reported (each is a result), the others not (their replay was cut short)."""
        open_connections = [c for c in self.connections.values() if c.writer is not None and not c.reported]
        await asyncio.gather(*(c.close() for c in open_connections), return_exceptions=True)
        for connection in open_connections:
            if connection.login_refused is not None:
                self._report(connection)

    @property
    def cut_short(self) -> int:
        """Connections opened and not (yet) reported: under way, or cut short by a stop."""
        return sum(1 for c in self.connections.values() if c.writer is not None and not c.reported)


async def replay(
    events: Sequence[Event],
    options: ReplayOptions,
    on_result: Callable[[ConnectionResult], None] | None = None,
) -> list[ConnectionResult]:
    """Replay the client frames of ``events`` against ``options.host``:``options.port`` and
    compare each connection's answers with the recorded ones."""
    return await Replayer(events, options, on_result).run()
