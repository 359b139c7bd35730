"""The per-connection STOMP session (pure, sans-IO): client frames and broker events in, ordered
operations out.  ``Session`` (core.py) is a small router over named parts:

* login.py          admission, version negotiation, credentials, broker login -> ``Identity``
* publishing.py     SEND the general way: destinations, declares, reply-to queues, confirm mode
* subscriptions.py  SUBSCRIBE, UNSUBSCRIBE, ACK, NACK; ``Subscription`` and the one ack-id parser
                    (quick and general ACK paths)
* targets.py        the destinations a connection has named: parsed, declared, published to
* transactions.py   open transactions, their limits and byte budget
* confirms.py       publisher confirms and the receipts waiting for them
* frames.py         MESSAGE rendering, RECEIPT / ERROR / CONNECTED, the frame counters
* extension.py      the hooks of a behaviour profile; the default profile's null extension
* activemq.py       the activemq profile's extension (dead-letter NACK, selectors, dispatchers,
                    temporary topics)
* settings.py       ``SessionSettings`` (frozen values), ``SessionRegistries`` (the process-wide
                    registries beside them), ``State``, the session id, the transaction limits
* parts.py          ``Parts``: the parts held together (the extension reads them there)
* quick.py          ``QuickPaths``: the common SEND and ACK as one plain call each
* ack_coalescing.py ``AckCoalescing``: the channel's unsettled deliveries and the run of quick
                    ACKs one read brings, written as one multiple ack where exactly equivalent
* commit.py         BEGIN, COMMIT, ABORT: the steps of the transactions' frames

Imports neither asyncio nor pydantic (tests/unit/test_layers.py).
"""

from .core import Session
from .login import Identity
from .settings import (
    MAX_TRANSACTION_ACTIONS,
    MAX_TRANSACTIONS,
    NODE_LIMIT_REACHED,
    SessionRegistries,
    SessionSettings,
    State,
    Steps,
    new_session_id,
)
from .subscription import ACK_MODES, AckMode, Subscription

__all__ = [
    "ACK_MODES",
    "MAX_TRANSACTIONS",
    "MAX_TRANSACTION_ACTIONS",
    "NODE_LIMIT_REACHED",
    "AckMode",
    "Identity",
    "Session",
    "SessionRegistries",
    "SessionSettings",
    "State",
    "Steps",
    "Subscription",
    "new_session_id",
]
