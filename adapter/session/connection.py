"""The STOMP side of one client connection, sans-IO: bytes and broker events in; bytes for the
client and commands for the AMQP side out.

Pure: no socket, no event loop, no timer (tests/unit/test_stomp_connection.py drives it with
bytes and recording fakes).  ``StompConnection`` owns, for one client:

* the frame parser (``receive_data``) and the pump (``pump``): each frame goes through the
  session's quick paths (a SEND or ACK that needs exactly one AMQP call) or its operation
  generator, whose operations ``INTERPRETER`` carries out one by one; the individual ACKs of
  the quick path are held in ``acks`` (``AckCoalescing``, ack_coalescing.py) until the next
  other frame or the end of the pump, and written as one multiple ack where that is exactly
  equivalent;
* the MESSAGEs held behind the RECEIPT of the frame being handled (``held``), and the decision,
  for every MESSAGE, whether it waits there or goes to the client's output now;
* the three sources of MESSAGEs: the connection's own consumers (``on_deliver``, a broker
  event), the shared subscriptions (``deliver_shared``) and the queue dispatchers
  (``deliver_dispatched``), each handing its MESSAGE to the output (``ClientOutput.add_message``,
  ``add_pieces``, ``add``) or to ``held``;
* the connection's lifecycle (``Lifecycle``, checked by ``enter``) and its counters.

What it does not own: the bytes for the client once added (``ClientOutput``,
adapter/stomp/output.py: the buffer and the transport it is written to, bound by the shell,
written at the end of every read), and, asked for through ``Shell``: timers, flow control, the
login and the close.  Commands for the AMQP side are plain calls on ``AmqpCommands`` (the
session's AMQP link, which only buffers them), not event objects: one object made per message
would cost an allocation on the path every message takes.  A broker call that needs an answer
(declare, consume, login ...) makes the connection ``busy``: the shell runs it, hands the answer
back with ``call_returned`` and pumps again, so frames stay strictly in order.

Lives in ``adapter/session/`` because it drives ``Session`` and imports nothing but the pure
layers (stomp, mapping, session); tests/unit/test_layers.py checks it imports no I/O.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator
from enum import Enum
from typing import Any, Generic, Protocol, TypeVar

from ..mapping import operations as ops
from ..mapping.budget import BudgetExceeded
from ..mapping.destinations import ProcessingError
from ..sharing.rules import Member
from ..stomp.codec import FrameError, FrameParser
from ..stomp.frame import Frame
from ..stomp.output import ClientOutput
from .ack_coalescing import AckCoalescing
from .core import Session
from .frames import Frames
from .subscriptions import Subscriptions

__all__ = [
    "INTERPRETER",
    "AmqpCommands",
    "Broker",
    "ConnectionCounters",
    "Lifecycle",
    "Shell",
    "StompConnection",
]

log = logging.getLogger("adapter.connection")


class Lifecycle(Enum):
    """Where a client connection is.  ``StompConnection.enter`` allows only the moves in
    ``_NEXT``; ``closed`` and ``finished`` are kept in step with it (plain attributes, read on
    every message)."""

    NEW = "new"  # constructed, no socket yet
    PROXY_HEADER = "proxy-header"  # stomp.proxy_protocol: waiting for the client's address
    OPEN = "open"  # STOMP frames are read and handled (before and after CONNECT)
    CLOSED = "closed"  # closed by either side: nothing more is read, handled or sent
    FINISHED = "finished"  # counted and logged; the AMQP link is closing or closed


_NEXT: dict[Lifecycle, frozenset[Lifecycle]] = {
    Lifecycle.NEW: frozenset({Lifecycle.PROXY_HEADER, Lifecycle.OPEN, Lifecycle.CLOSED}),
    Lifecycle.PROXY_HEADER: frozenset({Lifecycle.OPEN, Lifecycle.CLOSED}),
    Lifecycle.OPEN: frozenset({Lifecycle.CLOSED}),
    Lifecycle.CLOSED: frozenset({Lifecycle.FINISHED}),
    Lifecycle.FINISHED: frozenset(),
}


class AmqpCommands(Protocol):
    """The AMQP side as the connection commands it (the session's link buffers each call)."""

    def publish(self, exchange: str, routing_key: str, properties: Any, body: bytes) -> None: ...

    def publish_mandatory(self, exchange: str, routing_key: str, properties: Any, body: bytes) -> None: ...

    def ack(self, delivery_tag: int, multiple: bool) -> None: ...

    def nack(self, delivery_tag: int, multiple: bool, requeue: bool) -> None: ...

    def declare_nowait(self, op: ops.QueueDeclare) -> None: ...


Link = TypeVar("Link", bound=AmqpCommands)


class Shell(Protocol):
    """What the connection asks of the asyncio shell around it: a flush, close, the operations
    that need the shell (login, timers, the feature runtimes)."""

    peer: str
    # the operations only the shell can carry out: type -> (shell, operation, in_frame) -> what
    # goes back into the frame's generator
    performed: dict[type, Callable[[Any, Any, bool], object]]

    def flush(self) -> None:
        """Write the client's output now (``ClientOutput.flush``, counted by the shell)."""
        ...

    def flush_soon(self) -> None: ...  # output was added outside a read: write it one turn later

    def close(self, reason: str) -> None: ...

    def over_budget(self, error: BudgetExceeded, later: bool) -> None: ...


class Broker(Protocol):
    """What the connection asks of the shell's side of the AMQP link beyond plain commands."""

    def start_call(self, op: ops.Operation) -> None:
        """Run a broker call; its answer comes back through ``call_returned``."""
        ...

    def confirms_settled(self) -> None: ...  # DISCONNECT's wait for confirms may end

    # the link's own events, passed through
    def amqp_closed(self, error: Any) -> None: ...

    def broker_backpressure(self, paused: bool) -> None: ...


class Clocks(Protocol):
    """The latency clocks (adapter/server/latency.py) as the message path feeds them."""

    read_clock: float
    confirm_clock: float
    timed_publish: int

    def receipt_asked(self, frame: Frame) -> None: ...

    def time_publish(self, seq: int) -> None: ...

    def confirmed(self, delivery_tag: int, multiple: bool) -> None: ...


class DestinationCounts(Protocol):
    """Per-destination series (adapter.metrics_destinations)."""

    def count_published(self, destination: str) -> None: ...

    def count_delivered(self, destination: str) -> None: ...


class ConnectionCounters:
    """What one connection counted, for the metrics and the close log line: plain attributes,
    read at scrape time and added to the server's totals when the connection finishes
    (adapter/server/stats.py says why not prometheus counters).  The connection counts frames,
    publishes, settlements and shared MESSAGEs; the shell counts bytes."""

    __slots__ = (
        "acks",
        "bytes_received",
        "bytes_sent",
        "frames_received",
        "messages_published",
        "nacks",
        "opened_at",
        "shared_messages",
    )

    def __init__(self, opened_at: float) -> None:
        self.opened_at = opened_at
        self.frames_received: dict[str, int] = {}
        self.messages_published = 0
        self.acks = 0
        self.nacks = 0
        self.shared_messages = 0  # MESSAGE frames of shared subscriptions (adapter.shared_subscriptions)
        self.bytes_received = 0
        self.bytes_sent = 0


class StompConnection(Generic[Link]):
    """One client's STOMP connection (see the module docstring)."""

    def __init__(
        self,
        session: Session,
        shell: Shell,
        broker: Broker,
        output: ClientOutput,
        clocks: Clocks,
        destinations: DestinationCounts | None,
        counters: ConnectionCounters,
    ) -> None:
        """``output``: the client's output, bound to its transport by the shell;
        ``destinations``: None when per-destination series are off (the message path then pays
        one comparison)."""
        self.session = session
        # the session's parts the delivery path asks by name: the MESSAGE renderer, and the
        # subscriptions (what a withheld delivery becomes, the destination a MESSAGE counts for)
        self.frames: Frames = session.frames
        self.subscriptions: Subscriptions = session.parts.subscriptions
        # the channel's unsettled deliveries and the run of quick ACKs held in a pump
        self.acks = AckCoalescing(session.parts.by_tag, session.settings.registries.ack_tags)
        self.shell = shell
        self.broker = broker
        self.parser = FrameParser(session.settings.unauthenticated_limits)
        self.amqp: Link | None = None  # the session's link, from login to its release
        self.clocks = clocks
        self.destinations = destinations
        self.counters = counters
        self.output = output  # the bytes for the client, until the shell's flush writes them
        self.held: list[bytes] = []  # MESSAGEs waiting for the frame being handled to finish
        # the frame being handled, its operation generator, and the last broker call's answer
        self.frame: Frame | None = None
        self.steps: Generator[ops.Operation, object, None] | None = None
        self.result: object = None
        self.busy = False  # a broker call is under way (the shell runs it)
        self.in_read = False  # pumping: whoever pumps writes the output at the end
        self.awaiting_confirms = False  # DISCONNECT waits for them (the shell's AwaitConfirms)
        self.lifecycle = Lifecycle.NEW
        self.closed = False  # lifecycle is CLOSED or FINISHED
        self.finished = False  # lifecycle is FINISHED

    def enter(self, state: Lifecycle) -> None:
        """Move to ``state``; any other move than those of ``_NEXT`` is a bug."""
        if state not in _NEXT[self.lifecycle]:
            raise AssertionError(
                f"connection lifecycle: {self.lifecycle.value} -> {state.value} is not allowed"
            )
        self.lifecycle = state
        was_closed = self.closed
        self.closed = state is Lifecycle.CLOSED or state is Lifecycle.FINISHED
        self.finished = state is Lifecycle.FINISHED
        if self.closed and not was_closed:
            self.acks.close()  # nothing more is settled here: the record's room goes back

    # ------------------------------------------------------------------ bytes in, bytes out
    def receive_data(self, data: bytes) -> None:
        """Bytes from the client; ``pump`` handles the frames they complete."""
        self.parser.feed(data)

    def write(self, data: bytes) -> None:
        if not data:
            return
        self.output.add(data)
        # inside a pump or a broker read the shell writes at its end; elsewhere (timers, close)
        # one loop turn later
        if not self.in_read:
            self.shell.flush_soon()

    # ------------------------------------------------------------------ the pump
    def pump(self) -> None:
        """Handle the frames available now, until one waits for the broker (``busy``), the
        input runs out or the connection closes."""
        session = self.session
        parser = self.parser
        clocks = self.clocks
        counters = self.counters
        acks = self.acks
        clocks.read_clock = 0.0  # the receipted frames of this batch share one reading
        try:
            self._pump(session, parser, clocks, counters, acks)
        finally:
            # the run of ACKs goes before anything written after this pump (the link is only
            # gone here if a bug ended the connection mid-frame: nothing goes then)
            if acks.held and self.amqp is not None:
                acks.release(self.amqp)

    def _pump(
        self,
        session: Session,
        parser: FrameParser,
        clocks: Clocks,
        counters: ConnectionCounters,
        acks: AckCoalescing,
    ) -> None:
        while not self.busy and not self.closed:
            steps = self.steps
            if steps is None:
                try:
                    frame = parser.next_frame()
                except FrameError as error:
                    if acks.held:  # the ACKs before the bad frame go out as they came
                        assert self.amqp is not None
                        acks.release(self.amqp)
                    self.run_all(session.on_frame_error(error))
                    return
                if frame is None:
                    break
                self.frame = frame
                received = counters.frames_received
                received[frame.command] = received.get(frame.command, 0) + 1
                if "receipt" in frame.headers:
                    clocks.receipt_asked(frame)
                # the two frames of the message flow skip the generator when they can
                command = frame.command
                ack = session.quick_ack(frame) if command == "ACK" else None
                if ack is not None and not ack.multiple:
                    acks.hold(ack.delivery_tag)  # written with the run it ends up in
                    counters.acks += 1
                    self.frame = None
                    continue
                if acks.held:  # nothing else on the channel changes place with the run
                    assert self.amqp is not None
                    acks.release(self.amqp)
                if command == "SEND":
                    publish = session.quick_send(frame)
                    if publish is not None:
                        # _op_publish, inline: one call less on the path every SEND takes
                        assert self.amqp is not None
                        try:
                            self.amqp.publish(
                                publish.exchange, publish.routing_key, publish.properties, publish.body
                            )
                            counters.messages_published += 1
                            if not clocks.timed_publish:
                                clocks.time_publish(session.publish_seq)
                            if self.destinations is not None:
                                self.destinations.count_published(publish.destination)
                        except ProcessingError as refused:  # a value AMQP cannot carry
                            self.processing_error(refused)
                            return
                        self.frame = None
                        continue
                elif ack is not None:  # a 'client' ACK: cumulative, multiple already
                    assert self.amqp is not None
                    self.amqp.ack(ack.delivery_tag, True)
                    acks.settled(ack.delivery_tag, True)
                    counters.acks += 1
                    self.frame = None
                    continue
                steps = self.steps = session.handle_frame(frame)
                result: object = None
            else:
                result = self.result
            try:
                op = steps.send(result)
                self.result = INTERPRETER[type(op)](self, op, True)
            except StopIteration:
                self.steps = None
                self.frame = None
                self.result = None
                if self.held:  # the frame's RECEIPT is out: the MESSAGEs behind it follow
                    held, self.held = self.held, []
                    for data in held:
                        self.write(data)
                continue
            except ProcessingError as refused:
                # a value AMQP cannot carry (a name over 255 bytes, an integer out of range ...);
                # not named ``error``: a compiled build gives a name one type per function
                self.processing_error(refused)
                return

    def execute(self, op: ops.Operation, in_frame: bool = True) -> object:
        """Run one operation through ``INTERPRETER``.  ``in_frame`` False: outside a frame's
        generator (an error, a timeout, a broker event), where nothing could take a broker
        call's answer, so an operation needing one is a bug and raises, never dropped."""
        entry = INTERPRETER.get(type(op))
        if entry is None:
            raise AssertionError(f"no interpreter entry for operation {op!r}")
        return entry(self, op, in_frame)

    def run_all(self, operations: list[ops.Operation]) -> None:
        """The operations of an answer outside a frame's generator (an error, a timeout)."""
        for op in operations:
            self.execute(op, in_frame=False)

    def start_call(self, op: ops.Operation, in_frame: bool) -> None:
        """``op`` waits for the broker: nothing more is handled until ``call_returned``."""
        if not in_frame:
            raise AssertionError(f"operation {op!r} cannot run outside a frame's handling")
        self.busy = True

    def call_returned(self, result: object) -> None:
        """The broker call's answer, for the frame's generator (the shell pumps next)."""
        self.result = result
        self.busy = False

    # ------------------------------------------------------------------ MESSAGEs
    # Each source decides where its MESSAGE goes.  While a frame is being handled (a SUBSCRIBE
    # waiting for its bind ...), a MESSAGE its consume may have let through waits for that
    # frame's RECEIPT (``held``, written when the frame's generator ends), as with the plugin,
    # which finishes a frame before it handles deliveries; else it goes to the client's output
    # (``ClientOutput``), written at the end of the read of the broker socket that brought it.
    def on_deliver(self, delivery: ops.Delivery) -> None:
        """Source 1, a broker event: a message for one of this connection's own consumers."""
        if self.closed:
            return
        try:
            head, body, trailer = self.frames.message_pieces(delivery)
        except BudgetExceeded as error:  # activemq profile: too many unacknowledged bytes kept
            self.shell.over_budget(error, False)
            return
        if not head:
            # filtered out by the subscription's selector, or for the queue's dispatcher
            # (activemq profile): settle it now, or hand it over
            ack = self.subscriptions.dropped_delivery_ack(delivery)
            if ack is not None:
                if type(ack) is not ops.BasicAck:
                    self.acks.lose_sight()  # the dispatcher settles it on this channel, unseen here
                else:  # read, then settled by the ack (a settlement of an unread tag stops the record)
                    self.acks.delivered(delivery.consumer_tag, delivery.delivery_tag)
                self.execute(ack)
            return
        if self.subscriptions.plain_acks:  # else every consumer of the channel is no-ack
            self.acks.delivered(delivery.consumer_tag, delivery.delivery_tag)
        if self.destinations is not None:
            _count_delivered(self, delivery.consumer_tag)
        if self.steps is None:  # not held: a large body is not copied into a frame
            self.output.add_message(head, body, trailer)
            return
        self.held.append(b"".join((head, body, trailer)))  # behind the frame's RECEIPT

    def deliver_shared(self, member: Member, pieces: tuple[bytes, ...]) -> None:
        """Source 2: one MESSAGE of a shared group (adapter/sharing/runtime.py), rendered once
        for the group: ``member``'s own bytes go around the delivery's ``pieces``."""
        if self.closed:
            return
        self.counters.shared_messages += 1
        if self.destinations is not None:
            _count_delivered(self, member.consumer_tag)
        if self.steps is not None:
            # the member joined during the frame being handled: its RECEIPT goes first
            self.held.append(b"".join((member.head, pieces[0], member.id_prefix, *pieces[1:])))
        else:
            self.output.add_pieces(member.head, pieces, member.id_prefix)

    def deliver_dispatched(self, delivery: ops.Delivery) -> None:
        """Source 3: the queue's dispatcher gives this client a message
        (adapter/dispatch/runtime.py)."""
        if self.closed:
            return
        try:
            data = self.session.render_dispatched(delivery)
        except BudgetExceeded as error:
            # closed one loop turn later, once the dispatcher has finished the actions it is
            # running: leaving then gives this message (and the others routed here) back
            self.shell.over_budget(error, True)
            return
        if data and self.destinations is not None:
            _count_delivered(self, delivery.consumer_tag)
        # not behind a RECEIPT: a member is only activated after its SUBSCRIBE's RECEIPT, so no
        # frame being handled can have let it through; and an auto-ack member's message is
        # acknowledged at its origin as it is sent: held, it would be lost if the frame being
        # handled ends the connection
        if data:
            self.output.add(data)
            if not self.in_read:
                self.shell.flush_soon()

    # ------------------------------------------------------------------ other broker events
    def on_confirm(self, delivery_tag: int, multiple: bool, ack: bool) -> None:
        if self.closed:
            return
        session = self.session
        clocks = self.clocks
        clocks.confirmed(delivery_tag, multiple)
        frames = session.on_confirm(delivery_tag, multiple, ack)
        clocks.confirm_clock = 0.0
        if frames:
            self.output.add_frames(frames)  # one item per frame; written at the end of the broker read
            if not ack:
                self.shell.close("the broker refused a message (basic.nack)")
        if self.awaiting_confirms and not session.confirms_outstanding:
            self.broker.confirms_settled()

    def on_return(self, code: int, text: str, exchange: str, routing_key: str) -> None:
        """basic.return: one of the session's mandatory copies routed nowhere (its confirm
        follows); the frame that published it sees it once the confirm came."""
        if self.closed:
            return
        log.info(
            "peer=%s: the broker returned the copy of a NACKed message (exchange %r, routing key %r): %s %s",
            self.shell.peer,
            exchange,
            routing_key,
            code,
            text,
        )
        self.session.on_return()

    def on_server_cancel(self, consumer_tag: str) -> None:
        if self.closed:
            return
        session = self.session
        dispatched = session.is_dispatched(consumer_tag)
        self.write(session.on_server_cancel(consumer_tag))
        if dispatched:
            # out of its dispatcher, or messages routed to it would be rendered for a
            # subscription that is gone (and, with auto acks, acked on their way there)
            _by_shell(self, ops.LeaveDispatch(consumer_tag), False)

    def on_read_done(self) -> None:
        if self.output.out:  # the end of a broker read: its MESSAGEs and RECEIPTs go out
            self.shell.flush()

    def on_amqp_closed(self, error: Any) -> None:
        self.broker.amqp_closed(error)

    def on_broker_backpressure(self, paused: bool) -> None:
        self.broker.broker_backpressure(paused)

    # ------------------------------------------------------------------ errors: ERROR, then close
    def close_with_error(self, message: str, detail: str) -> None:
        """ERROR, then close (a timeout, a bound passed)."""
        if not self.closed:
            self.run_all(self.session.close_with_error(message, detail))

    def broker_failed(self, name: str, code: int, text: str, *, of_frame: bool) -> None:
        """The broker refused or ended something of this session: ERROR (with the RECEIPT of the
        frame being handled, ``of_frame``), then close; ``code`` 0: the link died without one."""
        if self.closed:
            return
        if code:
            self.run_all(self.session.on_broker_error(name, text, self.frame if of_frame else None))
        else:
            self.run_all(self.session.on_connection_lost(text))

    def internal_error(self) -> None:
        """Called from an ``except`` block: log the traceback (a bug), answer ERROR, close."""
        log.exception("internal error peer=%s", self.shell.peer)
        self.steps = None
        if not self.closed:
            self.run_all(self.session.close_with_error("Internal error", "Internal error", self.frame))

    def processing_error(self, error: ProcessingError) -> None:
        log.info("processing error peer=%s: %s", self.shell.peer, error.detail)
        self.run_all(self.session.close_with_error(error.message, f"{error.detail}\n", self.frame))


def _count_delivered(connection: StompConnection[Any], consumer_tag: str) -> None:
    """Per-destination series: a MESSAGE for the subscription behind ``consumer_tag``."""
    assert connection.destinations is not None
    destination = connection.subscriptions.destination_of(consumer_tag)
    if destination is not None:
        connection.destinations.count_delivered(destination)


# ---------------------------------------------------------------------- the operation interpreter
# an entry: (connection, operation, in_frame) -> what goes back into the frame's generator
_Entry = Callable[[StompConnection[Any], Any, bool], object]


def _op_publish(connection: StompConnection[Any], op: ops.BasicPublish, in_frame: bool) -> None:
    amqp = connection.amqp
    assert amqp is not None
    amqp.publish(op.exchange, op.routing_key, op.properties, op.body)
    connection.counters.messages_published += 1
    clocks = connection.clocks
    if not clocks.timed_publish:
        clocks.time_publish(connection.session.publish_seq)
    if connection.destinations is not None and op.destination:  # "": a dead-letter copy
        connection.destinations.count_published(op.destination)


def _op_publish_mandatory(
    connection: StompConnection[Any], op: ops.BasicPublishMandatory, in_frame: bool
) -> None:
    """The adapter's own copy of a message it settles (a NACK's): counted and timed as a
    publish (``_op_publish``), not per destination (a client names none)."""
    amqp = connection.amqp
    assert amqp is not None
    amqp.publish_mandatory(op.exchange, op.routing_key, op.properties, op.body)
    connection.counters.messages_published += 1
    clocks = connection.clocks
    if not clocks.timed_publish:
        clocks.time_publish(connection.session.publish_seq)


def _op_send_frame(connection: StompConnection[Any], op: ops.SendFrame, in_frame: bool) -> None:
    connection.write(op.data)


def _op_ack(connection: StompConnection[Any], op: ops.BasicAck, in_frame: bool) -> None:
    assert connection.amqp is not None
    connection.amqp.ack(op.delivery_tag, op.multiple)
    connection.acks.settled(op.delivery_tag, op.multiple)
    connection.counters.acks += 1


def _op_nack(connection: StompConnection[Any], op: ops.BasicNack, in_frame: bool) -> None:
    assert connection.amqp is not None
    connection.amqp.nack(op.delivery_tag, op.multiple, op.requeue)
    connection.acks.settled(op.delivery_tag, op.multiple)
    connection.counters.nacks += 1


def _op_declare(connection: StompConnection[Any], op: ops.QueueDeclare, in_frame: bool) -> None:
    if not op.nowait:
        _broker_call(connection, op, in_frame)
        return
    assert connection.amqp is not None
    connection.amqp.declare_nowait(op)


def _op_established(connection: StompConnection[Any], op: ops.Established, in_frame: bool) -> object:
    parser = connection.parser
    parser.set_version(op.version)
    parser.limits = connection.session.settings.frame_limits
    return _by_shell(connection, op, in_frame)  # the login timer, heart-beats, the log line


def _broker_call(connection: StompConnection[Any], op: ops.Operation, in_frame: bool) -> None:
    connection.start_call(op, in_frame)
    connection.broker.start_call(op)


def _by_shell(connection: StompConnection[Any], op: ops.Operation, in_frame: bool) -> object:
    shell = connection.shell
    return shell.performed[type(op)](shell, op, in_frame)


# Every operation the session emits, and who carries it out.  A type missing here is a bug that
# closes the connection with "Internal error" (tests/unit/test_shell_interpreter.py checks that
# every operation type has an entry).
INTERPRETER: dict[type, _Entry] = {
    ops.BasicPublish: _op_publish,
    ops.BasicPublishMandatory: _op_publish_mandatory,
    ops.SendFrame: _op_send_frame,
    ops.BasicAck: _op_ack,
    ops.BasicNack: _op_nack,
    ops.QueueDeclare: _op_declare,  # nowait: at once; else a broker call
    ops.Established: _op_established,
    # the shell's: the link's requeue, the login (pooled: at once; else a call), the close, the
    # feature runtimes
    ops.RequeueGot: _by_shell,
    ops.OpenConnection: _by_shell,
    ops.CloseClient: _by_shell,
    ops.DeleteQueueOnClose: _by_shell,
    ops.LeaveShared: _by_shell,
    ops.TokenExpiry: _by_shell,  # an OAuth 2.0 token's expiry timer
    **{kind: _by_shell for kind in ops.DISPATCH_OPS},
    **{kind: _broker_call for kind in ops.BROKER_CALLS if kind is not ops.QueueDeclare},
    ops.AwaitConfirms: _broker_call,
    ops.CloseAmqp: _broker_call,
    ops.JoinShared: _broker_call,
    ops.UpdateSecret: _broker_call,  # a token refresh (SEND to /auth/token)
}
