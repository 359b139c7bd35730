"""Which address the AMQP connections go to: the broker's host name, resolved at most every 30 s.

Every STOMP login opens its own AMQP connection.  Given a host name, ``create_connection`` resolves
it on every call, in a thread-pool thread (uvloop and asyncio both run ``getaddrinfo`` off the
loop): on the benchmark machine that cost about 0.8 ms per login, an eighth of the connect rate
(docs/performance.md).  So the address that last worked is reused for ``ttl`` seconds.  After
that, or after a connect that failed, the next login goes by name again: the resolver's answer is
fresh, and ``create_connection`` tries each address it returns, as it would without this cache.

This module does no I/O; the shell tells it what happened.  (When TLS to the broker is added,
the name must still go to the handshake as ``server_hostname``.)
"""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Callable

RESOLVE_TTL_SECONDS = 30.0


def is_ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class BrokerAddress:
    def __init__(
        self, name: str, ttl: float = RESOLVE_TTL_SECONDS, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.name = name
        self._ttl = ttl
        self._clock = clock
        self._literal = is_ip_literal(name)
        self._address: str | None = None
        self._expires = 0.0

    def target(self) -> str:
        """What to connect to now: the address that worked recently, else the name itself."""
        if self._address is not None and self._clock() < self._expires:
            return self._address
        return self.name

    def connected(self, target: str, address: str | None) -> None:
        """A connection to ``target`` succeeded and reached ``address`` (the peer's IP)."""
        if self._literal or target != self.name or not address:
            return  # only a lookup by name starts a new period: the cache cannot outlive the TTL
        self._address = address
        self._expires = self._clock() + self._ttl

    def failed(self) -> None:
        """The broker could not be reached: resolve the name again on the next attempt."""
        self._address = None
