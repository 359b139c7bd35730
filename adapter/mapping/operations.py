"""The operations the session asks its shell to perform, named after the AMQP methods they become.

The session (``adapter/session/``) is a generator per client frame that yields these values in
the order they must happen; the shell executes each one and sends the result back in.  Ops marked
*synchronous* wait for the broker's reply before the next op runs; the others are written to the
socket buffer at once (publishes, acks, frames to the client), which keeps the per-message path
free of futures.  Pure data: imports neither asyncio, aio-pika, pamqp nor pydantic.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from .destinations import BrokerGeneration
from .properties import MessageProperties


# --- connection ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class OpenConnection:
    """Synchronous: open the client's own AMQP connection and channel.  Result: LoginResult."""

    user: str
    password: str = field(repr=False)  # a passcode or an OAuth 2.0 token: never in a repr
    vhost: str = "/"


@dataclass(frozen=True, slots=True)
class UpdateSecret:
    """Synchronous: hand the session's AMQP connection a new token (``connection.update-secret``,
    a SEND to ``/auth/token``).  Result: None when the broker took it, else why not (text)."""

    token: str = field(repr=False)


@dataclass(frozen=True, slots=True)
class TokenExpiry:
    """The session's token expires at ``expires_at`` (seconds since the epoch): end the session
    with an ERROR then, unless a refresh moves it (None: no token, or one without ``exp``)."""

    expires_at: float | None


LoginFailure = Literal["", "auth", "vhost", "other"]


@dataclass(frozen=True, slots=True)
class LoginResult:
    ok: bool
    # "auth" (bad user/password), "vhost" (missing vhost or no access), "other"; "" on success
    failure: LoginFailure = ""
    detail: str = ""
    server_version: str = ""
    # whose plugin's queue.declare flags to use (adapter/amqp/connection.py reads the broker's
    # version at the handshake)
    broker: BrokerGeneration = BrokerGeneration.V3_10


@dataclass(frozen=True, slots=True)
class CloseAmqp:
    """Synchronous: close the AMQP connection cleanly (consumers end, unacked messages requeue)."""


# --- synchronous channel methods -----------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ConfirmSelect:
    pass


@dataclass(frozen=True, slots=True)
class QueueDeclare:
    """Result: the queue name (useful when ``queue`` is empty and the broker names it)."""

    queue: str
    durable: bool = False
    exclusive: bool = False
    auto_delete: bool = False
    arguments: dict[str, object] = field(default_factory=dict)
    passive: bool = False
    nowait: bool = False


@dataclass(frozen=True, slots=True)
class ExchangeDeclare:
    """``declare-exchange:true`` with adapter.declare_exchanges on (adapter/mapping/exchanges.py):
    never passive, internal or nowait, no arguments.  Result: None."""

    exchange: str
    type: str
    durable: bool
    auto_delete: bool


@dataclass(frozen=True, slots=True)
class QueueBind:
    queue: str
    exchange: str
    routing_key: str
    # binding arguments (a headers exchange's match), as (name, value) pairs
    arguments: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class QueueDelete:
    queue: str


@dataclass(frozen=True, slots=True)
class BasicQos:
    prefetch_count: int


@dataclass(frozen=True, slots=True)
class BasicConsume:
    queue: str
    consumer_tag: str
    no_ack: bool
    arguments: dict[str, object] = field(default_factory=dict)
    exclusive: bool = False  # activemq profile: activemq.exclusive


@dataclass(frozen=True, slots=True)
class BasicGet:
    """basic.get without no-ack (activemq profile: a queue browser): the result is the message,
    a ``Delivery`` of ``consumer_tag`` (the browser's subscription), or None when the queue had
    none ready.  It stays unacknowledged until the session settles it."""

    queue: str
    consumer_tag: str


@dataclass(frozen=True, slots=True)
class BasicCancel:
    consumer_tag: str


# --- asynchronous methods: buffered, no reply awaited -------------------------------------------
class Delivery(NamedTuple):
    """One message the broker delivered to a consumer of this connection (basic.deliver, its
    content header and body), as it travels from the AMQP link through the shell to the session.

    A NamedTuple, not a dataclass: one is made per delivered message, and a tuple is the cheapest
    object that still names its fields."""

    consumer_tag: str
    delivery_tag: int
    redelivered: bool
    exchange: str
    routing_key: str
    properties: MessageProperties
    body: bytes


@dataclass(frozen=True, slots=True)
class BasicPublish:
    exchange: str
    routing_key: str
    properties: MessageProperties
    body: bytes
    # the STOMP destination it was sent to, as the client wrote it (one element of a composite
    # destination): only the per-destination metrics read it; "" for the adapter's own publishes
    destination: str = field(default="", compare=False)


@dataclass(frozen=True, slots=True)
class BasicPublishMandatory:
    """basic.publish with the mandatory flag: the adapter's own copy of a message it settles
    only once the copy is safe (a NACK's dead-letter or retry copy).  The broker returns one no
    queue takes (basic.return, before its confirm) rather than confirming and dropping it.  A
    type of its own, not a flag of ``BasicPublish``: a client's SEND is never mandatory (as the
    plugin's is not), and its publish pays nothing for the copies."""

    exchange: str
    routing_key: str
    properties: MessageProperties
    body: bytes


@dataclass(frozen=True, slots=True)
class BasicAck:
    delivery_tag: int
    multiple: bool


@dataclass(frozen=True, slots=True)
class BasicNack:
    delivery_tag: int
    multiple: bool
    requeue: bool


@dataclass(frozen=True, slots=True)
class RequeueGot:
    """Hand back the messages ``BasicGet`` took (a queue browser's): basic.nack with requeue,
    one by one (the channel may hold other subscriptions' deliveries), on the connection the
    gets ran on, so the broker puts each back in its place.  That is the session's own channel,
    or, on a shared AMQP connection, the probe connection its gets ran on
    (adapter/amqp/probe.py), which closes after them."""

    delivery_tags: tuple[int, ...]


# --- towards the STOMP client ---------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class SendFrame:
    data: bytes


@dataclass(frozen=True, slots=True)
class CloseClient:
    """Flush what was sent, close the AMQP connection and the client socket."""

    reason: str


@dataclass(frozen=True, slots=True)
class DeleteQueueOnClose:
    """After a channel error: delete ``queue`` on a fresh channel before the AMQP connection
    closes (the subscription queue of a SUBSCRIBE whose consume or bind failed)."""

    queue: str


@dataclass(frozen=True, slots=True)
class Established:
    """The client is logged in: switch the parser to ``version``'s rules and the authenticated
    frame limits, stop the login timer, and start heart-beats (every ``send_ms``, expect bytes
    every ``receive_ms``; 0 = off)."""

    version: str
    send_ms: int
    receive_ms: int


@dataclass(frozen=True, slots=True)
class AwaitConfirms:
    """Synchronous: wait until the broker has confirmed every publish sent so far.  Result:
    True, or False when the wait timed out."""


# --- selector subscriptions on a queue (activemq profile, adapter/dispatch/rules.py) ----------
@dataclass(frozen=True, slots=True)
class JoinDispatch:
    """Add the subscription ``consumer_tag`` to the process's dispatcher of ``queue`` (in the
    session's vhost), before its consume: from then on its deliveries go through the dispatcher.
    It gets nothing until ``ActivateDispatch`` (the broker may still refuse the consume)."""

    queue: str
    consumer_tag: str
    matches: Callable[[MessageProperties], bool]
    auto_ack: bool
    credit: int | None  # the STOMP prefetch, enforced by the dispatcher (None: unlimited)


@dataclass(frozen=True, slots=True)
class ActivateDispatch:
    """The broker accepted the consume of ``consumer_tag`` (and its RECEIPT is out): the
    dispatcher may deliver to it now, the held messages it matches first."""

    consumer_tag: str


@dataclass(frozen=True, slots=True)
class LeaveDispatch:
    """The subscription ``consumer_tag`` ended (UNSUBSCRIBE): its dispatcher requeues what it holds."""

    consumer_tag: str


@dataclass(frozen=True, slots=True)
class DispatchDelivery:
    """A delivery of a dispatched subscription: the dispatcher delivers or parks it."""

    delivery: Delivery


@dataclass(frozen=True, slots=True)
class DispatchSettle:
    """The client's ACK (``ack``) or NACK of message ``number`` of a dispatched subscription
    (``multiple``: and of its earlier ones): the dispatcher settles it on its origin's channel."""

    consumer_tag: str
    number: int
    multiple: bool
    ack: bool
    requeue: bool = True


# --- shared topic subscriptions (adapter.shared_subscriptions, adapter/sharing/rules.py) --------
@dataclass(frozen=True, slots=True)
class JoinShared:
    """Synchronous: add the subscription ``consumer_tag`` to the process's shared subscription
    of ``destination`` for this session's vhost, user and passcode; the first member's join
    opens it (its own AMQP connection, then ``declare``, the consume and the bind with the
    member's credentials), later ones touch no broker.  ``head`` and ``id_prefix`` are the
    member's own bytes of every MESSAGE (its command and subscription lines, its escaped
    message-id up to the number).  Result: True once joined; False when the shell declines
    (the bounds on how many shared subscriptions may be open): the session then subscribes
    plainly.  A broker refusal arrives as an AmqpError."""

    destination: str
    consumer_tag: str
    head: bytes
    id_prefix: bytes
    declare: QueueDeclare
    bind_exchange: str
    bind_key: str


@dataclass(frozen=True, slots=True)
class LeaveShared:
    """The shared subscription ``consumer_tag`` ended (UNSUBSCRIBE): it leaves its group; the
    last member's leave ends the group's consumer, queue and connection."""

    consumer_tag: str


# The synchronous operations that are one AMQP method and its reply (AmqpConnection.execute);
# the other synchronous ones (login, close, waiting for confirms) belong to the shell.
BROKER_CALLS = (
    ConfirmSelect,
    ExchangeDeclare,
    QueueDeclare,
    QueueBind,
    QueueDelete,
    BasicQos,
    BasicConsume,
    BasicCancel,
    BasicGet,
)

DISPATCH_OPS = (JoinDispatch, ActivateDispatch, LeaveDispatch, DispatchDelivery, DispatchSettle)
DispatchOp = JoinDispatch | ActivateDispatch | LeaveDispatch | DispatchDelivery | DispatchSettle

SYNCHRONOUS_OPS = (
    OpenConnection,
    CloseAmqp,
    ConfirmSelect,
    ExchangeDeclare,
    QueueDeclare,
    QueueBind,
    QueueDelete,
    BasicQos,
    BasicConsume,
    BasicCancel,
    BasicGet,
    AwaitConfirms,
    JoinShared,
    UpdateSecret,
)

Operation = (
    OpenConnection
    | CloseAmqp
    | ConfirmSelect
    | ExchangeDeclare
    | QueueDeclare
    | QueueBind
    | QueueDelete
    | BasicQos
    | BasicConsume
    | BasicCancel
    | BasicGet
    | BasicPublish
    | BasicPublishMandatory
    | BasicAck
    | BasicNack
    | RequeueGot
    | SendFrame
    | CloseClient
    | Established
    | DeleteQueueOnClose
    | AwaitConfirms
    | JoinDispatch
    | ActivateDispatch
    | LeaveDispatch
    | DispatchDelivery
    | DispatchSettle
    | JoinShared
    | LeaveShared
    | UpdateSecret
    | TokenExpiry
)
