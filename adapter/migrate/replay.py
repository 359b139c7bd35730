"""Replay of a recording's client side against an adapter, and where its answers differ.

Owns the rehearsal of a cut-over: each recorded connection is opened again to the target (an
adapter in the ``activemq`` profile) and sent its client's frames, in the recorded order across
all connections, and what comes back is compared with what the recorded upstream answered, per
connection: the ERROR frames (by ``message``, in any order; an ERROR worded differently for the
same outcome, as wordings.EQUIVALENT_ERRORS declares, is reported as equivalent and is no
difference), the receipts, the MESSAGE count per subscription.

How the recorded order is kept without timing luck: before a client frame is sent, the replay
waits (at most ``wait`` seconds, for all connections at once) until every connection has
received what the upstream had sent it before that frame: the receipts, the MESSAGEs per
subscription, the ERRORs.  So an ACK goes after the message it acknowledges, and a SEND of
another connection after the SUBSCRIBE receipt that preceded it.  A connection that stays
behind is not waited for again until the recording expects more of it.

The values only the upstream could know are translated: the ``id`` or
``message-id`` of an ACK/NACK becomes the target's id of the same message (same subscription,
same position), and a SEND to a recorded ``reply-to`` value goes to the target's ``reply-to`` of
the same message.  CONNECT gets the passcode given to the replay (recordings never hold one) and
asks for no heart-beats (the replay sends none).  A DISCONNECT (or the client's close) is sent
``SETTLE`` seconds after its turn, so that a message the upstream did not send but the target
does arrives before it and is counted.  The frames of other connections that the upstream saw
after that end and that it could change wait for it: a SEND or SUBSCRIBE (a subscriber that
is still there on the target would take messages the recording gave to another one), and a
CONNECT with the same ``client-id`` (ActiveMQ, and the profile, refuse a client-id that is
still connected).

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
from .wordings import compare_errors

__all__ = ["END_RECEIPT", "SETTLE", "ConnectionResult", "ReplayOptions", "replay"]

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
    ) -> None:
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

    def covers(self, other: _Answers) -> bool:
        """Whether this side has received at least what ``other`` has."""
        return (
            (self.connected or not other.connected)
            and len(self.errors) >= len(other.errors)
            and self.receipts >= other.receipts
            and all(self.messages[key] >= count for key, count in other.messages.items())
        )


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

    def describe(self) -> str:
        who = f"{self.conn} ({self.login or '?'}@{self.client}" + (
            f", client-id {self.client_id})" if self.client_id else ")"
        )
        caveats = sorted(name for name in self.idioms if idiom(name).support != "same")
        lines = [f"{who}: {'differs' if self.differences else 'same'}"]
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
        except (OSError, FrameError):
            pass
        finally:
            self.closed = True
            self.changed.set()

    async def caught_up(self, timeout: float) -> bool:
        """Wait until the target has answered what the upstream had answered so far."""
        return await self.until(lambda: self.replayed.covers(self.recorded), timeout)

    async def end_confirmed_by_target(self, timeout: float) -> bool:
        """Wait until the target has sent the RECEIPT of the DISCONNECT."""
        return await self.until(lambda: self.end_confirmed, timeout)

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
        )


def _encode(command: str, headers: Sequence[tuple[str, str]], body: bytes) -> bytes:
    # the recorded header bytes as they were on the wire (still escaped)
    head = "".join(f"{name}:{value}\n" for name, value in headers)
    return f"{command}\n{head}\n".encode("utf-8", "surrogateescape") + body + b"\0"


class _Replay:
    def __init__(self, events: Sequence[Event], options: ReplayOptions) -> None:
        self.events = events
        self.options = options
        self.connections: dict[str, _Connection] = {}
        self.reply_tos: dict[str, str] = {}  # a recorded reply-to -> the target's for the same message
        self.later: list[asyncio.Task[None]] = []
        # the delayed ends of connections not yet done, and by client-id: what the upstream saw
        # after an end and that it could change waits for it
        self.ending: list[asyncio.Task[None]] = []
        self.ending_ids: dict[str, list[asyncio.Task[None]]] = {}
        subscription_ids: dict[str, set[str]] = {}
        for event in events:
            if event.direction == "in" and event.command == "SUBSCRIBE":
                sub_id = event.header("id")
                if sub_id is not None:
                    subscription_ids.setdefault(event.conn, set()).add(sub_id)
        self.subscription_ids = subscription_ids
        self.skipped: set[str] = set()  # recorded mid-connection: their CONNECT is not in the recording
        # the connections whose recorded answers grew since the target last caught up with them
        self.behind: set[_Connection] = set()

    def connection(self, event: Event) -> _Connection:
        connection = self.connections.get(event.conn)
        if connection is None:
            connection = _Connection(event.conn, event.client, self.subscription_ids.get(event.conn, set()))
            self.connections[event.conn] = connection
        return connection

    def _rewrite(self, connection: _Connection, event: Event) -> list[tuple[str, str]]:
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

    async def _acked_delivered(self, connection: _Connection, event: Event) -> bool:
        """Whether the target has delivered the message an ACK or NACK names (waiting for it at
        most ``wait`` seconds).  The upstream may have sent more before the client's first ACK
        than the target will (a prefetch the upstream ignored, as RabbitMQ's plugin ignores
        ``activemq.prefetchSize``): the target sends the rest once the first ones are
        acknowledged.  The upstream's id of a message the target never delivered means nothing
        to the target (or, worse, names another of its messages): such a frame is not sent."""
        recorded = connection.recorded.keys
        keys = [
            recorded[value]
            for name, value in event.headers
            if name in ("id", "message-id") and value in recorded
        ]
        if not keys:
            return True
        return await connection.until(
            lambda: all(key in connection.replayed.handles for key in keys), self.options.wait
        )

    def _learn_reply_tos(self) -> None:
        for connection in self.connections.values():
            for key, recorded in connection.recorded.reply_tos.items():
                replayed = connection.replayed.reply_tos.get(key)
                if replayed is not None:
                    self.reply_tos[recorded] = replayed

    async def _catch_up(self) -> None:
        """Wait until every connection has what the upstream had answered it so far (all at
        once, at most ``wait`` seconds); one that does not is not waited for again until the
        recording expects more of it."""
        if self.behind:
            behind, self.behind = self.behind, set()
            await asyncio.gather(*(c.caught_up(self.options.wait) for c in behind if c.writer is not None))

    def _end(self, connection: _Connection, data: bytes | None) -> None:
        """The connection's DISCONNECT (``data``) or close, ``SETTLE`` seconds from now."""
        connection.finished = True
        task = asyncio.create_task(self._later(connection, data))
        self.later.append(task)
        self.ending.append(task)
        if connection.client_id is not None:
            self.ending_ids.setdefault(connection.client_id, []).append(task)

    async def _ended(self, tasks: Sequence[asyncio.Task[None]]) -> None:
        """Wait for these delayed ends (those of connections the upstream saw end first)."""
        if tasks:
            await asyncio.gather(*tasks)
            self.ending = [task for task in self.ending if not task.done()]

    async def _later(self, connection: _Connection, data: bytes | None) -> None:
        await asyncio.sleep(SETTLE)
        if data is not None and connection.write(data):
            await connection.end_confirmed_by_target(self.options.wait)
            await connection.caught_up(self.options.wait)
        await connection.close()

    async def run(self) -> list[ConnectionResult]:
        options = self.options
        started = time.monotonic()
        first = self.events[0].ts if self.events else 0.0
        for event in self.events:
            if event.conn in self.skipped:
                continue
            connection = self.connection(event)
            if event.kind == "close":
                if connection.writer is not None and not connection.finished:
                    self._end(connection, None)
                continue
            if event.direction == "out":
                connection.recorded.take(event.command, event.headers, connection.subscription_ids)
                self.behind.add(connection)
                continue
            if event.command is None:
                continue  # a frame the tap could not parse: the upstream got bytes we cannot rebuild
            if connection.writer is None:
                if event.command not in _CONNECT:
                    self.skipped.add(event.conn)
                    del self.connections[event.conn]
                    continue
                connection.login = event.header("login")
                connection.client_id = event.header("client-id")
                if connection.client_id is not None:
                    await self._ended(self.ending_ids.pop(connection.client_id, []))
                await connection.open(options)
            connection.idioms.update(frame_idioms("in", event.command, event.headers))
            if options.speed > 0:
                delay = (event.ts - first) / options.speed - (time.monotonic() - started)
                if delay > 0:
                    await asyncio.sleep(delay)
            if event.command in ("SEND", "SUBSCRIBE"):
                await self._ended(self.ending)
            await self._catch_up()
            if event.command in ("ACK", "NACK") and not await self._acked_delivered(connection, event):
                connection.acks_undelivered += 1
                continue
            self._learn_reply_tos()
            data = _encode(event.command, self._rewrite(connection, event), event.body or b"")
            if event.command == "DISCONNECT":
                self._end(connection, data)
            else:
                connection.write(data)
                if event.command in _CONNECT:
                    await connection.caught_up(options.wait)
        for connection in list(self.connections.values()):
            if not connection.finished:
                self._end(connection, None)
        await asyncio.gather(*self.later)
        return [connection.result() for connection in self.connections.values()]


async def replay(events: Sequence[Event], options: ReplayOptions) -> list[ConnectionResult]:
    """Replay the client frames of ``events`` against ``options.host``:``options.port`` and
    compare each connection's answers with the recorded ones."""
    return await _Replay(events, options).run()
