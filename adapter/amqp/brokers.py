"""The broker nodes a login may use, and the order it tries them in.

``--amqp-url`` (and ``adapter.amqp_url.<name>`` in the ini file) may name several nodes of a
cluster.  Every STOMP login opens its own AMQP connection, so the choice is made per login:

* ``round_robin`` (the default): each login starts one node further along the list, so logins
  spread over the nodes;
* ``shuffle``: each login tries the nodes in a fresh random order;
* either way, a node that refused or timed out in the last ``RETRY_AFTER_SECONDS`` is tried only
  after the others, and is tried again once that time has passed (or when no other node is left).

A session never moves between nodes: when its AMQP connection drops, its client gets an ERROR
and the close, and its next CONNECT lands on a live node (docs/behaviour.md, "Broker nodes").

Each node also keeps the version its last connection.start announced, and which plugin's
queue.declare flags that version gets (docs/compatibility.md#broker-generations): logged when a
node is first seen and whenever it changes (a rolling upgrade), and exported as
``stomp_adapter_broker_info``.

This module does no socket I/O; the shell reports what happened.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import unquote, urlsplit

from ..mapping.destinations import NEWEST_BROKER, BrokerGeneration, broker_generation
from .resolver import BrokerAddress

log = logging.getLogger("adapter.server.brokers")  # the name the docs give (docs/behaviour.md)

NodeOrder = Literal["round_robin", "shuffle"]
RETRY_AFTER_SECONDS = 5.0


@dataclass(slots=True)
class BrokerNode:
    """One broker node: where it is, whether it speaks TLS, and its address cache."""

    host: str
    port: int
    tls: bool
    resolver: BrokerAddress = field(repr=False)
    failed_at: float | None = None
    # what the node's last connection.start said: its version ("" when it named none) and the
    # declare rules the adapter uses for it; None until a login reached it
    announced: tuple[str, BrokerGeneration] | None = None

    @property
    def label(self) -> str:
        scheme = "amqps" if self.tls else "amqp"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{scheme}://{host}:{self.port}"


def parse_nodes(amqp_urls: str) -> list[BrokerNode]:
    """The nodes of a comma-separated list of amqp:// and amqps:// URLs (validated by config)."""
    nodes = []
    for url in amqp_urls.split(","):
        parts = urlsplit(url.strip())
        tls = parts.scheme.lower() == "amqps"
        host = unquote(parts.hostname or "localhost")
        nodes.append(BrokerNode(host, parts.port or (5671 if tls else 5672), tls, BrokerAddress(host)))
    return nodes


class BrokerNodes:
    def __init__(
        self,
        nodes: list[BrokerNode],
        order: NodeOrder = "round_robin",
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        if not nodes:
            raise ValueError("no broker node")
        self.nodes = nodes
        self._order = order
        self._clock = clock
        self._rng = rng or random.Random()
        self._next = 0

    def attempt_order(self) -> list[BrokerNode]:
        """The nodes for one login, in the order to try them."""
        nodes = self.nodes
        if len(nodes) > 1:
            if self._order == "shuffle":
                nodes = self._rng.sample(nodes, len(nodes))
            else:
                start = self._next % len(nodes)
                self._next += 1
                nodes = nodes[start:] + nodes[:start]
        now = self._clock()
        healthy = [n for n in nodes if n.failed_at is None or now - n.failed_at >= RETRY_AFTER_SECONDS]
        resting = [n for n in nodes if n not in healthy]
        return healthy + resting

    def failed(self, node: BrokerNode) -> None:
        node.failed_at = self._clock()
        node.resolver.failed()

    def connected(self, node: BrokerNode, target: str, address: str | None) -> None:
        node.failed_at = None
        node.resolver.connected(target, address)

    def announced(self, node: BrokerNode, version: str | None) -> None:
        """A connection to ``node`` opened, and its connection.start named ``version`` (None:
        none).  Logged the first time and when it changes, not per login."""
        known = node.announced
        if known is not None and known[0] == (version or ""):
            return
        generation = broker_generation(version)
        rules = generation or NEWEST_BROKER
        node.announced = (version or "", rules)
        if generation is None:
            log.warning(
                "broker node %s announces %s: not a RabbitMQ version the adapter knows, so it "
                "declares queues as the newest plugin does (%s rules: non-durable subscriptions "
                "exclusive, which every version accepts)",
                node.label,
                f"version {version!r}" if version else "no version",
                rules.value,
            )
        else:
            log.info(
                "broker node %s is version %s: queues are declared with the %s rules "
                "(docs/compatibility.md, broker generations)",
                node.label,
                version,
                rules.value,
            )
