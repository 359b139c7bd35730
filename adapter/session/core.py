"""The per-connection STOMP session: a small router over named parts.

Pure (sans-IO): imports neither asyncio, aio-pika, pamqp nor pydantic.  The shell
(``adapter/server/connection.py``) owns the sockets and the AMQP connection.

Each client frame is handled by a generator that yields operations (``adapter.mapping.operations``)
in the order they must happen; the shell executes them strictly in that order and sends each
synchronous operation's result back into the generator.  That order is what gives STOMP its
semantics over AMQP (see docs/architecture.md): a SEND's RECEIPT is released by the publisher
confirm that covers its sequence number, a transaction is a buffer replayed at COMMIT, and a
SUBSCRIBE's RECEIPT follows its consume and bind.

The session keeps the state machine (``state``) and routes each frame to the part that handles
it; the two quick paths of the message flow are ``QuickPaths`` (quick.py), bound as
``quick_send`` and ``quick_ack``.  Every piece of per-connection state belongs to one part, and
``Parts`` (parts.py) holds them together:

* ``Login`` (login.py): admission, version, credentials, broker login -> an ``Identity``;
* ``Publishing`` (publishing.py): SEND the general way, reply-to queues, confirm mode;
* ``Subscriptions`` (subscriptions.py): SUBSCRIBE, UNSUBSCRIBE, ACK, NACK, the one ack-id parser;
* ``Targets`` (targets.py): destinations parsed, queues declared, temp queues, publish targets;
* ``Transactions`` (transactions.py), ``Confirms`` (confirms.py); BEGIN, COMMIT and ABORT are
  the functions of commit.py;
* ``TokenSession`` (token_session.py): an OAuth 2.0 token login, its refreshes (a SEND to
  ``/auth/token``) and its expiry;
* ``Frames`` (frames.py): MESSAGE rendering (``on_delivery``), RECEIPT, ERROR, their counts;
* the profile's extension (extension.py; activemq.py), called at fixed hooks.

Broker events (deliveries, confirms, server-side cancels, channel errors) come in through the
``on_*`` methods, which return the bytes or operations to send; those a part answers alone
(``on_delivery``, ``on_server_cancel``, ``render_dispatched`` ...) are that part's methods,
bound once, so that the shell's call reaches it without a forwarding call here.

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
from .commit import abort, begin, commit
from .confirms import Confirms
from .edition import edition_for
from .frames import Frames
from .login import Identity, Login, LoginSteps, Refused
from .parts import Parts
from .publishing import Publishing
from .quick import QuickPaths, declined
from .retries import Retries
from .settings import RefusedWithReceipt, SessionSettings, State, Steps
from .subscription import Subscription
from .subscriptions import Subscriptions
from .targets import Targets
from .token_session import TokenSession
from .tokens import TOKEN_DESTINATION
from .transactions import Transactions


class Session:
    # Bound once per session to the part that answers alone (the shell calls some of them for
    # every message, so a forwarding method here would cost one more call each time)
    on_delivery: Callable[[Delivery], bytes]  # MESSAGE rendering: Frames.render_message
    render_dispatched: Callable[[Delivery], bytes]  # a dispatcher's message: Frames.dispatched_message
    quick_send: Callable[[Frame], BasicPublish | None]  # QuickPaths.send
    quick_ack: Callable[[Frame], BasicAck | None]  # QuickPaths.ack
    on_server_cancel: Callable[[str], bytes]  # Subscriptions.server_cancel
    is_dispatched: Callable[[str], bool]  # Subscriptions.is_dispatched
    dropped_delivery_ack: Callable[[Delivery], BasicAck | DispatchDelivery | None]

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
        rules = rules_for(settings.profile)
        # whose visible behaviour: ERROR texts, consumer timeouts (adapter/session/edition.py)
        edition = edition_for(settings.plugin_behaviour)
        # the parts; each owns its piece of the connection's state (see the module docstring)
        # the OAuth 2.0 token a session may log in with and refresh (token_session.py)
        self.tokens = TokenSession(settings.token_validator)
        self.login = Login(settings, rules, None, peer_is_loopback, edition, self.tokens)
        by_tag: dict[str, Subscription] = {}  # consumer tag -> subscription, shared
        self.frames = frames = Frames(by_tag, session_id, settings.trailing_lf)
        confirms = Confirms()
        transactions = Transactions(settings.registries.budgets.transaction_account())
        targets = Targets(rules, settings.declare_exchanges, settings.default_topic_exchange)
        retries = Retries(confirms, frames, settings.registries.budgets.unacked_account())
        parts = self.parts = Parts(
            settings, rules, edition, self.login, by_tag, frames, confirms, transactions, targets, retries
        )
        extension = parts.extension = extension_for(parts)
        subscriptions = parts.subscriptions = Subscriptions(
            settings, rules, targets, transactions, frames, extension, by_tag, retries
        )
        parts.publishing = Publishing(
            settings, rules, targets, transactions, confirms, frames, extension, by_tag
        )
        self._quick = QuickPaths(parts)
        self.on_delivery = frames.render_message
        self.render_dispatched = frames.dispatched_message
        self.errors_sent = frames.errors_sent  # the ERRORs sent, by message (the one dict Frames keeps)
        # the quick paths, bound while logged in (_connect), declined before and after
        self.quick_send = self.quick_ack = declined
        self.on_server_cancel = subscriptions.server_cancel
        self.is_dispatched = subscriptions.is_dispatched
        self.dropped_delivery_ack = subscriptions.dropped_delivery_ack
        # the confirms part and the extension's per-confirm hook (None for the default profile),
        # bound once: the shell asks them per publish and per confirm
        self._confirms = confirms
        self._confirm_hook = extension.confirm_hook()
        # basic.return of one of the adapter's own mandatory copies: counted by the confirms part
        self.on_return = confirms.on_return

    # ------------------------------------------------------------------ identity and figures
    @property
    def identity(self) -> Identity:
        """Who the connection is logged in as; only asked once it is."""
        return self.parts.identity

    @property
    def user(self) -> str | None:
        identity = self.parts.logged_in
        return identity.user if identity is not None else None

    @property
    def vhost(self) -> str | None:
        identity = self.parts.logged_in
        return identity.vhost if identity is not None else None

    @property
    def version(self) -> str:
        identity = self.parts.logged_in
        return identity.version if identity is not None else "1.0"

    @property
    def peer_is_loopback(self) -> bool:
        return self.login.peer_is_loopback

    @peer_is_loopback.setter
    def peer_is_loopback(self, value: bool) -> None:
        self.login.peer_is_loopback = value

    @property
    def forced_credentials(self) -> tuple[str, str] | None:
        return self.login.forced_credentials

    @forced_credentials.setter
    def forced_credentials(self, value: tuple[str, str] | None) -> None:
        self.login.forced_credentials = value

    @property
    def plain_acks(self) -> bool:
        """Whether a subscription outside the dispatchers ever asked for client acks
        (adapter/dispatch/runtime.py)."""
        return self.parts.subscriptions.plain_acks

    @property
    def on_receipt(self) -> Callable[[str], None] | None:
        """Told the receipt-id of each RECEIPT as it is rendered (the shell times receipts)."""
        return self.frames.on_receipt

    @on_receipt.setter
    def on_receipt(self, value: Callable[[str], None] | None) -> None:
        self.frames.on_receipt = value

    # ------------------------------------------------------------------ frames from the client
    def handle_frame(self, frame: Frame) -> Steps:
        """Generator of the operations for one client frame (see module docstring)."""
        try:
            if self.state is State.CONNECTED:
                route = _ROUTES.get(frame.command)
                if route is None:
                    if frame.command in (Command.CONNECT, Command.STOMP):
                        yield from self._fail("Already connected", "A second CONNECT is not allowed", frame)
                    else:
                        yield from self._fail(
                            "Bad command", f'Could not interpret command "{frame.command}"\n', frame
                        )
                    return
                yield from route(self, frame)
            elif self.state is State.AWAITING_CONNECT:
                if frame.command in (Command.CONNECT, Command.STOMP):
                    yield from self._connect(self.login.connect(frame), frame, send_connected=True)
                elif self.settings.implicit_connect:
                    # docs/behaviour.md#authentication: log in, send no CONNECTED, then process
                    # the frame as usual
                    yield from self._connect(self.login.implicit(), frame, send_connected=False)
                    if self.parts.logged_in is not None:
                        route = _ROUTES.get(frame.command)
                        if route is None:
                            yield from self._fail(
                                "Bad command", f'Could not interpret command "{frame.command}"\n', frame
                            )
                        else:
                            yield from route(self, frame)
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
        identity = self.parts.logged_in = outcome.identity
        self.state = State.CONNECTED
        quick = self._quick
        self.quick_send, self.quick_ack = quick.send, quick.ack
        version_12 = identity.version == "1.2"
        subscriptions = self.parts.subscriptions
        if self.tokens.claims is not None:
            subscriptions.without_sharing()  # a token session never shares
        quick.ack_header = subscriptions.ack_header = "id" if version_12 else "message-id"
        subscriptions.client_id = identity.client_id
        self.frames.ack_lines = version_12
        yield Established(identity.version, outcome.send_ms, outcome.receive_ms)
        if send_connected:
            yield SendFrame(self.login.connected_frame(outcome, self.session_id, self.frames))
        yield from self.tokens.established()

    # ------------------------------------------------------------------ DISCONNECT
    def _disconnect(self, frame: Frame) -> Steps:
        # Unlike the plugin, which drops SEND receipts still waiting for their confirm
        # (docs/behaviour.md#receipts), we wait for the confirms so that every receipt asked for is sent.
        if self.confirms_outstanding:
            yield AwaitConfirms()
        self.parts.transactions.clear()
        yield CloseAmqp()
        yield from self.frames.receipt_of(frame)
        self.state = State.CLOSED
        self.quick_send = self.quick_ack = declined
        yield CloseClient("client sent DISCONNECT")

    # ------------------------------------------------------------------ broker events
    def on_confirm(self, delivery_tag: int, multiple: bool, ack: bool) -> list[bytes]:
        """The broker confirmed (ack) or refused (nack) publishes up to ``delivery_tag``: the
        frames to send, one item per frame."""
        receipts = self._confirms.settle(delivery_tag, multiple, ack)
        hook = self._confirm_hook
        if hook is not None:
            hook(delivery_tag, multiple, ack)
        if not receipts:
            return []
        return self.frames.confirmed(receipts, ack)

    @property
    def publish_seq(self) -> int:
        """The confirm sequence number of the last publish (0: confirms are off)."""
        return self._confirms.seq

    @property
    def confirms_outstanding(self) -> bool:
        return self._confirms.outstanding or self.parts.extension.confirms_outstanding

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
        subscriptions = self.parts.subscriptions
        queue, subscriptions.unfinished_queue = subscriptions.unfinished_queue, None
        if queue and frame is not None and frame.command == Command.SUBSCRIBE:
            operations.append(DeleteQueueOnClose(queue))
        message, detail = self.parts.edition.broker_error(name, text)
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
        parts = self.parts
        self.login.close()
        parts.transactions.close()
        parts.extension.close()
        parts.retries.close()

    def shutdown_notice(self) -> bytes:
        return self.frames.error("Server shutdown", "The server is shutting down\n")

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
        yield SendFrame(self.frames.error(message, detail, receipt=receipt))
        if also_receipt and receipt is not None:
            yield SendFrame(self.frames.receipt(receipt))
        self.state = State.CLOSED
        self.quick_send = self.quick_ack = declined
        yield CloseClient(message)


# The general path of each frame once logged in, keyed by str: frame.command is any text the
# client sent (Command is a StrEnum).  Plain functions of the session, one table for every
# session: a table of bound methods per session cost a connect cycle ~2 % more instructions
# (bench/instructions.py).
def _send(session: Session, frame: Frame) -> Steps:
    if frame.headers.get("destination") == TOKEN_DESTINATION:
        return session.tokens.refresh(frame, session.frames)  # a token refresh, never published
    return session.parts.publishing.send(frame)


_ROUTES: dict[str, Callable[[Session, Frame], Steps]] = {
    Command.SEND: _send,
    Command.SUBSCRIBE: lambda session, frame: session.parts.subscriptions.subscribe(frame),
    Command.UNSUBSCRIBE: lambda session, frame: session.parts.subscriptions.unsubscribe(frame),
    Command.ACK: lambda session, frame: session.parts.subscriptions.settle(frame, nack=False),
    Command.NACK: lambda session, frame: session.parts.subscriptions.settle(frame, nack=True),
    Command.BEGIN: lambda session, frame: begin(session.parts, frame),
    Command.COMMIT: lambda session, frame: commit(session.parts, frame),
    Command.ABORT: lambda session, frame: abort(session.parts, frame),
    Command.DISCONNECT: Session._disconnect,
}
