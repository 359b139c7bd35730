"""The per-connection STOMP session: a small router over named parts.

Pure (sans-IO): imports neither asyncio, aio-pika, pamqp nor pydantic.  The shell
(``adapter/server/connection.py``) owns the sockets and the AMQP connection.

Each client frame is handled by a generator that yields operations (``adapter.mapping.operations``)
in the order they must happen; the shell executes them strictly in that order and sends each
synchronous operation's result back into the generator.  That order is what gives STOMP its
semantics over AMQP (see docs/architecture.md): a SEND's RECEIPT is released by the publisher
confirm that covers its sequence number, a transaction is a buffer replayed at COMMIT, and a
SUBSCRIBE's RECEIPT follows its consume and bind.

The session keeps the state machine (``state``), routes each frame to the part that handles it,
and runs the two quick paths of the message flow; every piece of per-connection state belongs
to one part:

* ``Login`` (login.py): admission, version, credentials, broker login -> an ``Identity``;
* ``Publishing`` (publishing.py): SEND the general way, reply-to queues, confirm mode;
* ``Subscriptions`` (subscriptions.py): SUBSCRIBE, UNSUBSCRIBE, ACK, NACK, the one ack-id parser;
* ``Targets`` (targets.py): destinations parsed, queues declared, temp queues, publish targets;
* ``Transactions`` (transactions.py), ``Confirms`` (confirms.py);
* ``Frames`` (frames.py): MESSAGE rendering (``on_delivery``), RECEIPT, ERROR, their counts;
* the profile's extension (extension.py; activemq.py), called at fixed hooks.

Broker events (deliveries, confirms, server-side cancels, channel errors) come in through the
``on_*`` methods, which return the bytes or operations to send.

Errors: every ERROR this module produces for a client frame is followed by closing the connection,
as STOMP 1.2 requires ("the server MUST ... close the connection").  The plugin leaves the
connection open after most of them; docs/compatibility.md lists that difference.  The one
exception is a server-initiated subscription cancel, which is not the client's error and leaves
the connection open, as in the plugin.
"""

from __future__ import annotations

from collections.abc import Callable

from ..errors import StompError
from ..mapping.operations import (
    AwaitConfirms,
    BasicAck,
    BasicPublish,
    CloseAmqp,
    CloseClient,
    DeleteQueueOnClose,
    Delivery,
    DispatchDelivery,
    Established,
    Operation,
    SendFrame,
)
from ..mapping.profile import rules_for
from ..stomp.codec import FrameError
from ..stomp.frame import Command, Frame
from .activemq import extension_for
from .confirms import Confirms
from .edition import edition_for
from .frames import Frames
from .login import Admitted, Identity, Login, LoginSteps, Refused
from .publishing import Publishing
from .retries import Retries
from .settings import RefusedWithReceipt, SessionSettings, State, Steps
from .subscription import Subscription
from .subscriptions import Subscriptions, parse_ack_id
from .targets import Targets
from .token_session import TokenSession
from .tokens import TOKEN_DESTINATION
from .transactions import Transactions

_CONNECTED = State.CONNECTED


class Session:
    # MESSAGE rendering: the Frames part's own method, bound once per session (the shell calls
    # it for every delivery, so a forwarding call here would cost one more call per message)
    on_delivery: Callable[[Delivery], bytes]

    def __init__(
        self,
        settings: SessionSettings,
        *,
        session_id: str,
        peer_is_loopback: bool,
    ) -> None:
        self.settings = settings
        self.session_id = session_id
        self.state = State.AWAITING_CONNECT
        self._rules = rules = rules_for(settings.profile)
        self._identity: Identity | None = None
        # whose visible behaviour: ERROR texts, consumer timeouts (adapter/session/edition.py)
        self._edition = edition = edition_for(settings.plugin_behaviour)
        # the OAuth 2.0 token a session may log in with and refresh (token_session.py)
        self.tokens = TokenSession(settings.token_validator)
        self._login = Login(settings, rules, self, peer_is_loopback, edition, self.tokens)
        # the parts; each owns its piece of the connection's state (see the module docstring)
        self._by_tag: dict[str, Subscription] = {}  # consumer tag -> subscription, shared
        self._frames = frames = Frames(self._by_tag, session_id, settings.trailing_lf)
        self._confirms = confirms = Confirms()
        self._transactions = transactions = Transactions(settings.budgets.transaction_account())
        self._targets = targets = Targets(rules, settings.declare_exchanges, settings.default_topic_exchange)
        self._extension = extension = extension_for(self)
        self._retries = Retries(confirms, frames, settings.budgets.unacked_account())
        self._subscriptions = Subscriptions(
            settings, rules, targets, transactions, frames, extension, self._by_tag, self._retries
        )
        self._publishing = Publishing(
            settings, rules, targets, transactions, confirms, frames, extension, self._by_tag
        )
        # Bound once, read by the per-message paths (quick_send, quick_ack, on_delivery,
        # on_confirm) without a call or a lookup through a part: the same objects the parts own.
        self.on_delivery = frames.deliver
        self._count_publish = confirms.count
        self._send_properties = rules.send_properties
        self._general_send_headers = rules.general_send_headers
        self._send_targets = targets.send_targets
        self._temp_queues = targets.temp_queues
        self._ack_header = "message-id"
        # the extension's per-message hooks, None for the default profile
        self._quick_settle = extension.quick_settle_hook()
        self._confirm_hook = extension.confirm_hook()

    # ------------------------------------------------------------------ identity and figures
    @property
    def identity(self) -> Identity:
        """Who the connection is logged in as; only asked once it is."""
        assert self._identity is not None, "not logged in"
        return self._identity

    @property
    def user(self) -> str | None:
        return self._identity.user if self._identity is not None else None

    @property
    def vhost(self) -> str | None:
        return self._identity.vhost if self._identity is not None else None

    @property
    def version(self) -> str:
        return self._identity.version if self._identity is not None else "1.0"

    @property
    def client_id(self) -> str | None:
        """activemq profile: CONNECT's client-id, the owner of named durable subscriptions."""
        return self._identity.client_id if self._identity is not None else None

    @property
    def peer_is_loopback(self) -> bool:
        return self._login.peer_is_loopback

    @peer_is_loopback.setter
    def peer_is_loopback(self, value: bool) -> None:
        self._login.peer_is_loopback = value

    @property
    def forced_credentials(self) -> tuple[str, str] | None:
        return self._login.forced_credentials

    @forced_credentials.setter
    def forced_credentials(self, value: tuple[str, str] | None) -> None:
        self._login.forced_credentials = value

    @property
    def login_failure(self) -> str | None:
        return self._login.failure

    @property
    def requested_user(self) -> str | None:
        return self._login.requested_user

    @property
    def requested_vhost(self) -> str | None:
        return self._login.requested_vhost

    @property
    def messages_sent(self) -> int:
        return self._frames.messages_sent

    @property
    def frames_sent(self) -> dict[str, int]:
        return self._frames.frames_sent

    @property
    def errors_sent(self) -> dict[str, int]:
        return self._frames.errors_sent

    @property
    def plain_acks(self) -> bool:
        """Whether a subscription outside the dispatchers ever asked for client acks
        (adapter/server/dispatching.py)."""
        return self._subscriptions.plain_acks

    @property
    def on_receipt(self) -> Callable[[str], None] | None:
        """Told the receipt-id of each RECEIPT as it is rendered (the shell times receipts)."""
        return self._frames.on_receipt

    @on_receipt.setter
    def on_receipt(self, value: Callable[[str], None] | None) -> None:
        self._frames.on_receipt = value

    # ------------------------------------------------------------------ frames from the client
    def handle_frame(self, frame: Frame) -> Steps:
        """Generator of the operations for one client frame (see module docstring)."""
        try:
            if self.state is State.CONNECTED:
                handler = self._HANDLERS.get(frame.command)
                if handler is None:
                    if frame.command in (Command.CONNECT, Command.STOMP):
                        yield from self._fail("Already connected", "A second CONNECT is not allowed", frame)
                    else:
                        yield from self._fail(
                            "Bad command", f'Could not interpret command "{frame.command}"\n', frame
                        )
                    return
                yield from handler(self, frame)
            elif self.state is State.AWAITING_CONNECT:
                if frame.command in (Command.CONNECT, Command.STOMP):
                    yield from self._connect(self._login.connect(frame), frame, send_connected=True)
                elif self.settings.implicit_connect:
                    # docs/behaviour.md#authentication: log in, send no CONNECTED, then process
                    # the frame as usual
                    yield from self._connect(self._login.implicit(), frame, send_connected=False)
                    if self._identity is not None:  # logged in
                        yield from self._HANDLERS.get(frame.command, Session._bad_command)(self, frame)
                else:
                    yield from self._fail("Illegal command", "You must log in using CONNECT first", frame)
        except StompError as error:  # DestinationError, ProcessingError, RefusedWithReceipt
            also_receipt = isinstance(error, RefusedWithReceipt)
            yield from self._fail(error.message, error.detail, frame, also_receipt=also_receipt)

    def on_frame_error(self, error: FrameError) -> list[Operation]:
        """The byte stream broke the grammar or a limit: ERROR, then close (the plugin is silent)."""
        return list(self._fail(error.message, error.detail, None))

    # ------------------------------------------------------------------ CONNECT
    def _connect(self, login: LoginSteps, frame: Frame, send_connected: bool) -> Steps:
        outcome = yield from login
        if isinstance(outcome, Refused):
            yield from self._fail(outcome.message, outcome.detail, frame)
            return
        self._establish(outcome)
        yield Established(outcome.identity.version, outcome.send_ms, outcome.receive_ms)
        if send_connected:
            yield SendFrame(self._login.connected_frame(outcome, self.session_id, self._frames))
        yield from self.tokens.established()

    def _establish(self, admitted: Admitted) -> None:
        identity = self._identity = admitted.identity
        if self.tokens.claims is not None:
            self._subscriptions.without_sharing()  # a token session never shares
        self.state = State.CONNECTED
        version_12 = identity.version == "1.2"
        self._ack_header = self._subscriptions.ack_header = "id" if version_12 else "message-id"
        self._subscriptions.client_id = identity.client_id
        self._frames.ack_lines = version_12

    # ------------------------------------------------------------------ the quick paths
    # The two frames of the message flow, each as one plain call that reads the parts' state
    # directly: a call into a part per message is the cost these paths exist to avoid.
    def quick_send(self, frame: Frame) -> BasicPublish | None:
        """The common SEND in one plain call, or None: then ``handle_frame`` handles it as usual.

        A SEND whose destination this connection has already published to (so it is parsed,
        valid and declared), outside a transaction, with no ``reply-to`` or one to an existing
        temp queue, and with a ``receipt`` only once confirms are on, needs exactly one publish.
        This path gives the same result as ``handle_frame`` without the generator machinery,
        which costs about a quarter of the adapter's per-SEND time (bench/micro.py).  Anything
        else, errors included, goes the general way (``Publishing.send``), which reports them
        in the plugin's order.
        """
        if self.state is not _CONNECTED:
            return None
        headers = frame.headers
        destination = headers.get("destination", "")
        target = self._send_targets.get(destination)
        if target is None or "transaction" in headers or "message-id" in headers:
            return None
        if not self._general_send_headers.isdisjoint(headers):
            # x- arguments are checked on every SEND, a declare-exchange may ask for a declare;
            # activemq: a scheduled SEND is planned there
            return None
        receipt = headers.get("receipt")
        if receipt is not None and not self._confirms.on:
            return None
        reply_to = headers.get("reply-to")
        if reply_to is not None:
            if not reply_to.startswith("/temp-queue/"):
                return None
            reply_to = self._temp_queues.get(reply_to[12:])
            if reply_to is None:
                return None
        try:
            properties = self._send_properties(headers, reply_to)
        except StompError:
            return None  # the general path sends the ERROR
        if properties is None:
            return None  # not to be published (activemq: already expired): the general path
        self._count_publish(receipt)
        return BasicPublish(target[0], target[1], properties, frame.body, destination)

    def quick_ack(self, frame: Frame) -> BasicAck | None:
        """An ACK outside a transaction and without a receipt, for a message of a current
        subscription, as one plain call; None sends it the general way (see ``quick_send``).
        The ack id is read by the general path's parser: any error declines."""
        headers = frame.headers
        if self.state is not _CONNECTED or "transaction" in headers or "receipt" in headers:
            return None
        header = self._ack_header
        value = headers.get(header)
        if value is None:
            return None
        try:
            subscription, delivery_tag = parse_ack_id(value, self._by_tag, "ACK", header)
        except StompError:
            return None
        if subscription.shared or subscription.retry is not None:
            # the general path refuses it (adapter.shared_subscriptions), or settles what the
            # retries keep (x-retry-delays)
            return None
        # 'client' acks are cumulative: AMQP multiple=true (docs/behaviour.md#receipts)
        multiple = subscription.ack_mode == "client"
        if multiple and self._retries.holding:
            return None  # it settles kept retry deliveries too: the general path sweeps them
        settle = self._quick_settle
        if settle is not None and not settle(subscription, delivery_tag, multiple):
            return None
        return BasicAck(delivery_tag, multiple)

    # ------------------------------------------------------------------ frames, to their parts
    def _send(self, frame: Frame) -> Steps:
        if frame.headers.get("destination") == TOKEN_DESTINATION:
            return self.tokens.refresh(frame, self._frames)  # a token refresh, never published
        return self._publishing.send(frame)

    def _subscribe(self, frame: Frame) -> Steps:
        return self._subscriptions.subscribe(frame)

    def _unsubscribe(self, frame: Frame) -> Steps:
        return self._subscriptions.unsubscribe(frame)

    def _ack(self, frame: Frame) -> Steps:
        return self._subscriptions.settle(frame, nack=False)

    def _nack(self, frame: Frame) -> Steps:
        return self._subscriptions.settle(frame, nack=True)

    def render_dispatched(self, delivery: Delivery) -> bytes:
        """A message the dispatcher gives one of this session's dispatched subscriptions
        (its consumer tag and message number in place of the AMQP ones)."""
        return self._frames.deliver(delivery, True)

    # ------------------------------------------------------------------ transactions
    def _begin(self, frame: Frame) -> Steps:
        self._transactions.begin(Transactions.name(frame))
        yield from self._frames.receipt_of(frame)

    def _commit(self, frame: Frame) -> Steps:
        actions = self._transactions.end(Transactions.name(frame))
        receipt = frame.headers.get("receipt")
        # A COMMIT's RECEIPT means what a SEND's does: the broker has every message of the
        # transaction.  So with a receipt, confirms go on before its first publish, and the
        # RECEIPT waits for the confirms of all of them (the plugin, inside the broker, sends it
        # at once: docs/compatibility.md).
        publishes = receipt is not None and any(isinstance(op, BasicPublish) for op, _ in actions)
        publishing = self._publishing
        if publishes:
            yield from publishing.confirm_mode()
        first_seq = self._confirms.seq + 1
        for op, op_receipt in actions:
            if isinstance(op, BasicPublish):
                yield from publishing.publish(op, op_receipt)
            else:
                self._extension.committed(op)
                yield op
        if publishes:
            assert receipt is not None
            self._confirms.wait_for_all(receipt, first_seq)
        else:
            yield from self._frames.receipt_of(frame)

    def _abort(self, frame: Frame) -> Steps:
        self._transactions.end(Transactions.name(frame))
        yield from self._frames.receipt_of(frame)

    # ------------------------------------------------------------------ DISCONNECT
    def _disconnect(self, frame: Frame) -> Steps:
        # Unlike the plugin, which drops SEND receipts still waiting for their confirm
        # (docs/behaviour.md#receipts), we wait for the confirms so that every receipt asked for is sent.
        if self.confirms_outstanding:
            yield AwaitConfirms()
        self._transactions.clear()
        yield CloseAmqp()
        yield from self._frames.receipt_of(frame)
        self.state = State.CLOSED
        yield CloseClient("client sent DISCONNECT")

    def _bad_command(self, frame: Frame) -> Steps:
        yield from self._fail("Bad command", f'Could not interpret command "{frame.command}"\n', frame)

    # keyed by str: frame.command is any text the client sent (Command is a StrEnum)
    _HANDLERS: dict[str, Callable[[Session, Frame], Steps]] = {
        Command.SEND: _send,
        Command.SUBSCRIBE: _subscribe,
        Command.UNSUBSCRIBE: _unsubscribe,
        Command.ACK: _ack,
        Command.NACK: _nack,
        Command.BEGIN: _begin,
        Command.COMMIT: _commit,
        Command.ABORT: _abort,
        Command.DISCONNECT: _disconnect,
    }

    # ------------------------------------------------------------------ broker events
    def subscription_destination(self, consumer_tag: str) -> str | None:
        """The destination header of the SUBSCRIBE behind a consumer (per-destination metrics)."""
        subscription = self._by_tag.get(consumer_tag)
        return subscription.destination if subscription is not None else None

    def dropped_delivery_ack(self, delivery: Delivery) -> BasicAck | DispatchDelivery | None:
        """What to do with a delivery ``on_delivery`` rendered no bytes for (subscriptions.py)."""
        return self._subscriptions.dropped_delivery_ack(delivery)

    def on_confirm(self, delivery_tag: int, multiple: bool, ack: bool) -> bytes:
        """The broker confirmed (ack) or refused (nack) publishes up to ``delivery_tag``."""
        receipts = self._confirms.settle(delivery_tag, multiple, ack)
        hook = self._confirm_hook
        if hook is not None:
            hook(delivery_tag, multiple, ack)
        if not receipts:
            return b""
        return self._frames.confirmed(receipts, ack)

    @property
    def publish_seq(self) -> int:
        """The confirm sequence number of the last publish (0: confirms are off)."""
        return self._confirms.seq

    @property
    def confirms_outstanding(self) -> bool:
        return self._confirms.outstanding or self._extension.confirms_outstanding

    def is_dispatched(self, consumer_tag: str) -> bool:
        """Whether ``consumer_tag`` is a subscription of a queue dispatcher (activemq profile)."""
        subscription = self._by_tag.get(consumer_tag)
        return subscription is not None and subscription.dispatched

    def on_server_cancel(self, consumer_tag: str) -> bytes:
        """The broker cancelled a consumer (e.g. its queue was deleted): docs/behaviour.md#error-handling."""
        subscription = self._subscriptions.cancelled_by_server(consumer_tag)
        if subscription is None:
            return b""
        if subscription.id is not None:
            header, description = subscription.id, f"id='{subscription.id}'"
        else:
            header, description = subscription.destination, f"destination='{subscription.destination}'"
        return self._frames.error(
            "Server cancelled subscription",
            "The server has canceled a subscription.\n"
            f'No more messages will be delivered for "{description}".\n',
            extra=[("subscription", header)],
        )

    def on_broker_error(self, name: str, text: str, frame: Frame | None) -> list[Operation]:
        """The broker closed the channel or connection (docs/behaviour.md#error-handling).

        ``frame`` is the client frame whose synchronous AMQP call was waiting, if any: the plugin
        then sends ERROR, the frame's RECEIPT, and closes; we do the same.  Except for SEND: its
        RECEIPT only ever means "confirmed by the broker", so a SEND whose declare, temp-queue
        or confirm.select failed gets none (the plugin's do_receipt ignores SEND too,
        docs/behaviour.md#error-handling).
        """
        also_receipt = frame is not None and frame.command != Command.SEND
        operations: list[Operation] = []
        subscriptions = self._subscriptions
        queue, subscriptions.unfinished_queue = subscriptions.unfinished_queue, None
        if queue and frame is not None and frame.command == Command.SUBSCRIBE:
            operations.append(DeleteQueueOnClose(queue))
        message, detail = self._edition.broker_error(name, text)
        operations += self._fail(message, detail, frame, also_receipt=also_receipt)
        return operations

    def close_with_error(self, message: str, detail: str, frame: Frame | None = None) -> list[Operation]:
        """An error found by the shell (timeouts, values AMQP cannot carry): ERROR, then close."""
        return list(self._fail(message, detail, frame))

    def on_connection_lost(self, reason: str) -> list[Operation]:
        """The AMQP connection died without a close from the broker (network, broker crash)."""
        return list(self._fail("AMQP connection died", f"Reason: {reason}", None))

    def on_closed(self) -> None:
        """The connection is gone (whatever closed it): give back its client id, its
        stomp.max_connections slot and the bytes it held (its transactions, its kept deliveries,
        which the broker requeues)."""
        self._login.close()
        self._transactions.close()
        self._extension.close()
        self._retries.close()

    def shutdown_notice(self) -> bytes:
        return self._frames.error("Server shutdown", "The server is shutting down\n")

    # ------------------------------------------------------------------ receipts and errors
    def _fail(self, message: str, detail: str, frame: Frame | None, *, also_receipt: bool = False) -> Steps:
        """ERROR (with receipt-id if the frame asked for a receipt), then close the connection.

        ``also_receipt`` additionally sends the RECEIPT frame the plugin sends after ERROR when a
        synchronous AMQP call failed (docs/behaviour.md#receipts), so plugin clients see what they expect.
        """
        if self.state is State.CLOSED:
            return
        receipt = None
        if frame is not None and frame.command not in (Command.CONNECT, Command.STOMP):
            receipt = frame.headers.get("receipt")
        yield SendFrame(self._frames.error(message, detail, receipt=receipt))
        if also_receipt and receipt is not None:
            yield SendFrame(self._frames.receipt(receipt))
        self.state = State.CLOSED
        yield CloseClient(message)
