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

This module does no I/O; the shell reports what happened.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import unquote, urlsplit

from .resolver import BrokerHost

NodeOrder = Literal["round_robin", "shuffle"]
RETRY_AFTER_SECONDS = 5.0


@dataclass(slots=True)
class BrokerNode:
    """One broker node: where it is, whether it speaks TLS, and its address cache."""

    host: str
    port: int
    tls: bool
    resolver: BrokerHost = field(repr=False)
    failed_at: float | None = None

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
        nodes.append(BrokerNode(host, parts.port or (5671 if tls else 5672), tls, BrokerHost(host)))
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
