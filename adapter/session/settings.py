"""What a session is made of before it runs: its settings (frozen values, and the process-wide
registries beside them), its states, its id, its limits.

Pure: standard library and ``adapter.mapping`` / ``adapter.stomp`` only.
"""

from __future__ import annotations

import base64
from collections.abc import Generator
from dataclasses import dataclass, field
from enum import Enum, auto

from ..caps import ConnectionCap
from ..dispatch import rules as dispatch
from ..errors import StompError
from ..mapping.budget import Budgets
from ..mapping.operations import Operation
from ..mapping.profile import ClientIds, Profile
from ..sharing.rules import Registry
from ..stomp.codec import FrameLimits
from .ack_coalescing import TagPool
from .tokens import TokenValidator

# The operations of one client frame, in order; a synchronous one's result is sent back in.
Steps = Generator[Operation, object, None]

# Transaction limits of the newer plugin (docs/behaviour.md#limits, [main]); 3.10.8 has none.
MAX_TRANSACTIONS = 16
MAX_TRANSACTION_ACTIONS = 1024
# The ERROR body of a CONNECT over stomp.max_connections (message "Bad CONNECT"), the plugin's words
NODE_LIMIT_REACHED = "Connection refused: node connection limit reached"


@dataclass(frozen=True, slots=True)
class SessionRegistries:
    """The process-wide state the sessions of a process share and change: who is connected
    under which client id, the queue dispatchers, the connection cap, the byte pools, the
    shared subscriptions and the delivery tags recorded to coalesce ACKs.  Built once per
    process (cli.py); each field is a mutable registry of its own, owned by its module
    (mapping/profile.py, dispatch/rules.py, caps.py, mapping/budget.py, sharing/rules.py,
    session/ack_coalescing.py), so no field is ever replaced."""

    # activemq profile: the client ids connected now, shared by every connection of the process
    client_ids: ClientIds = field(default_factory=ClientIds)
    # activemq profile: the dispatchers of selector subscriptions on queues, per process
    dispatchers: dispatch.Dispatchers = field(default_factory=dispatch.Dispatchers)
    # stomp.max_connections: the sessions of every listener of the process, or None (no cap)
    connection_cap: ConnectionCap | None = None
    # the byte pools of transactions and kept deliveries, per process, and the per-connection
    # bounds (adapter/mapping/budget.py)
    budgets: Budgets = field(default_factory=Budgets)
    # adapter.shared_subscriptions: the process's shared topic subscriptions (adapter/sharing/
    # rules.py), or None (off: every subscription has its own queue, as with the plugin)
    shared: Registry | None = None
    # the unsettled delivery tags the sessions record to coalesce their ACKs, per process
    # (adapter/session/ack_coalescing.py)
    ack_tags: TagPool = field(default_factory=TagPool)


@dataclass(frozen=True, slots=True)
class SessionSettings:
    """What the session needs from the configuration, as frozen values; built by ``adapter.config``
    (cli.py ``session_settings``)."""

    default_user: str | None = "guest"
    default_pass: str | None = field(default="guest", repr=False)  # a password: never in a repr
    default_vhost: str = "/"
    implicit_connect: bool = False
    hide_server_info: bool = False
    default_nack_requeue: bool = True
    # adapter.min_client_heartbeat (ms): what CONNECTED asks of a client that can send heart-beats
    min_client_heartbeat: int = 0
    # adapter.default_retry_delays: (destination prefix, x-retry-delays) for the client-individual
    # subscriptions that do not say (adapter/session/retries.py)
    default_retry_delays: tuple[tuple[str, str], ...] = ()
    default_topic_exchange: str = "amq.topic"
    loopback_users: frozenset[str] = frozenset({"guest"})
    trailing_lf: bool = True
    frame_limits: FrameLimits = field(default_factory=FrameLimits)
    unauthenticated_limits: FrameLimits = field(default_factory=lambda: FrameLimits(max_frame_size=65536))
    # the STOMP dialect: "rabbitmq" (the plugin's) or "activemq" (adapter/mapping/profile.py)
    profile: str = Profile.RABBITMQ
    # adapter.plugin_behaviour: "3.10" or "current" (adapter/session/edition.py)
    plugin_behaviour: str = "3.10"
    # adapter.declare_exchanges: declare-exchange:true declares the exchange (adapter/mapping/exchanges.py)
    declare_exchanges: bool = False
    # the process-wide registries every session shares and changes (SessionRegistries): beside
    # the values, never among them, and the same object in every copy of these settings
    registries: SessionRegistries = field(default_factory=SessionRegistries, compare=False)
    # adapter.oauth2_signing_key_file / adapter.oauth2_jwks_file: tokens checked before they
    # reach the broker (adapter/session/tokens.py), or None (the broker alone decides); its keys
    # are read once at start-up and never change, but it is left out of comparisons
    token_validator: TokenValidator | None = field(default=None, compare=False)


class RefusedWithReceipt(StompError):
    """A refusal answered with ERROR and then the frame's RECEIPT, as the plugin answers a
    failed synchronous AMQP call (docs/behaviour.md#receipts)."""


class State(Enum):
    AWAITING_CONNECT = auto()
    CONNECTED = auto()
    CLOSED = auto()


def new_session_id(random16: bytes) -> str:
    """``session-`` + base64url (no padding) of 16 random bytes, as the plugin does
    (docs/behaviour.md#authentication)."""
    return "session-" + base64.urlsafe_b64encode(random16).rstrip(b"=").decode("ascii")
