"""The rules of AMQP connection reuse (``adapter.amqp_connection_reuse``), without sockets or a
clock of their own: which idle connection a login may take, which ones must go, and how a
passcode is checked without being kept.

A pooled connection belongs to one (broker node, vhost, user): the broker authenticated that user
on it.  A later CONNECT may take it only with the same key *and* the same passcode; the passcode
is never stored, only a keyed BLAKE2b hash of it (a MAC, as HMAC is, in one C call) under a key
drawn at random when the process starts, compared in constant time (``hmac.compare_digest``).
A CONNECT whose passcode does not match logs in afresh, so the broker decides, exactly as
without reuse.

Two clocks bound what a pooled connection can outlive: ``idle_seconds`` since a session gave it
back, and ``max_age_seconds`` since the broker last authenticated the user on it, so that a
password change reaches every new session within ``max_age_seconds`` even when sessions keep
the connection busy (RabbitMQ closes a deleted user's connections itself).  ``max_size``
bounds the idle connections of the pool (the oldest idle one goes first).  The two clocks are
``Lifetime``, the one rule for pooled connections and for idle shared ones (adapter/amqp/multiplex.py).
The asyncio side (adapter/amqp/pool_runtime.py) owns the connections, the timer and the closing.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from dataclasses import dataclass
from typing import Generic, TypeVar

Connection = TypeVar("Connection")

# (broker node label, vhost, user): a connection is never handed to another of these
PoolKey = tuple[str, str, str]


class PasscodeCheck:
    """Keyed hashes of passcodes.  ``secret`` is drawn at random per process (a test may pass
    one); with it an attacker who reads the pool's memory learns no passcode without guessing
    it, and no two processes share digests."""

    def __init__(self, secret: bytes | None = None) -> None:
        self._secret = secret if secret is not None else os.urandom(32)

    def digest(self, passcode: str) -> bytes:
        raw = passcode.encode("utf-8", "surrogateescape")
        return hashlib.blake2b(raw, key=self._secret, digest_size=32).digest()

    @staticmethod
    def same(left: bytes, right: bytes) -> bool:
        return hmac.compare_digest(left, right)


@dataclass(frozen=True, slots=True)
class Lifetime:
    """How long a connection kept for later logins may live, by two clocks: ``idle_seconds``
    since its last session left, ``max_age_seconds`` since the broker last authenticated the
    user on it.  Every time is the caller's clock."""

    idle_seconds: float
    max_age_seconds: float

    def too_old(self, authenticated_at: float, now: float) -> bool:
        """Authenticated ``max_age_seconds`` ago or more: no new session may use it, so that the
        broker checks the password again."""
        return now - authenticated_at >= self.max_age_seconds

    def expired(self, authenticated_at: float, idle_since: float, now: float) -> bool:
        """An idle connection must close: idle for ``idle_seconds``, or too old."""
        return now - idle_since >= self.idle_seconds or self.too_old(authenticated_at, now)

    def expiry(self, authenticated_at: float, idle_since: float) -> float:
        """When an idle connection expires."""
        return min(idle_since + self.idle_seconds, authenticated_at + self.max_age_seconds)


@dataclass(slots=True)
class Pooled(Generic[Connection]):
    connection: Connection
    key: PoolKey
    passcode_digest: bytes
    authenticated_at: float  # when the broker logged the user in on this connection
    idle_since: float  # when the last session gave it back


class ConnectionPool(Generic[Connection]):
    """Idle connections by key.  Every method takes ``now`` from the caller's clock."""

    def __init__(self, *, idle_seconds: float, max_age_seconds: float, max_size: int) -> None:
        self.lifetime = Lifetime(idle_seconds, max_age_seconds)
        self.max_size = max_size
        self._idle: dict[PoolKey, list[Pooled[Connection]]] = {}
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def _fresh(self, entry: Pooled[Connection], now: float) -> bool:
        return not self.lifetime.expired(entry.authenticated_at, entry.idle_since, now)

    def take(self, key: PoolKey, passcode_digest: bytes, now: float) -> Pooled[Connection] | None:
        """The most recently returned idle connection of ``key`` whose passcode matches and that
        has not expired, taken out of the pool; None if there is none (log in afresh).  Every
        entry of the key is compared, so the time taken does not tell which one matched."""
        entries = self._idle.get(key)
        if not entries:
            return None
        found = None
        for entry in entries:
            if PasscodeCheck.same(entry.passcode_digest, passcode_digest) and self._fresh(entry, now):
                found = entry  # the last match is the most recently returned one
        if found is not None:
            self._remove(found)
        return found

    def put(self, entry: Pooled[Connection]) -> list[Connection]:
        """Pool ``entry``; returns the connections to close now: the oldest idle ones beyond
        ``max_size`` (``entry``'s own connection if ``max_size`` is 0)."""
        if self.max_size <= 0:
            return [entry.connection]
        self._idle.setdefault(entry.key, []).append(entry)
        self._count += 1
        evicted = []
        while self._count > self.max_size:
            oldest = min((e for entries in self._idle.values() for e in entries), key=lambda e: e.idle_since)
            self._remove(oldest)
            evicted.append(oldest.connection)
        return evicted

    def discard(self, connection: Connection) -> bool:
        """Take ``connection`` out (the broker closed it, it failed); False if it was not here."""
        for entries in self._idle.values():
            for entry in entries:
                if entry.connection is connection:
                    self._remove(entry)
                    return True
        return False

    def other_passcodes(self, key: PoolKey, passcode_digest: bytes) -> list[Connection]:
        """Take out and return the connections of ``key`` logged in with another passcode: the
        broker has just accepted ``passcode_digest``'s passcode, so after a password change the
        connections of the old one are not kept for their remaining life."""
        stale = [
            entry
            for entry in self._idle.get(key, ())
            if not PasscodeCheck.same(entry.passcode_digest, passcode_digest)
        ]
        for entry in stale:
            self._remove(entry)
        return [entry.connection for entry in stale]

    def expired(self, now: float) -> list[Connection]:
        """Take out and return the connections idle for ``idle_seconds`` or authenticated
        ``max_age_seconds`` ago."""
        gone = [entry for entries in self._idle.values() for entry in entries if not self._fresh(entry, now)]
        for entry in gone:
            self._remove(entry)
        return [entry.connection for entry in gone]

    def expiry_of(self, entry: Pooled[Connection]) -> float:
        """When ``entry`` expires (the caller's clock)."""
        return self.lifetime.expiry(entry.authenticated_at, entry.idle_since)

    def next_expiry(self) -> float | None:
        """When the next idle connection expires (the caller's clock), None with an empty pool."""
        deadlines = [self.expiry_of(entry) for entries in self._idle.values() for entry in entries]
        return min(deadlines) if deadlines else None

    def drain(self) -> list[Connection]:
        """Take out and return every connection (shutdown)."""
        everything = [entry.connection for entries in self._idle.values() for entry in entries]
        self._idle.clear()
        self._count = 0
        return everything

    def _remove(self, entry: Pooled[Connection]) -> None:
        entries = self._idle[entry.key]
        entries.remove(entry)
        if not entries:
            del self._idle[entry.key]
        self._count -= 1


def may_return(
    *,
    reusable: bool,
    shutting_down: bool,
    queues_to_delete: bool,
    session_failed: bool,
) -> str | None:
    """Why a connection a session leaves must be closed instead of pooled, or None to pool it.
    ``reusable``: the connection's own verdict (open, no error, not blocked, no exclusive or
    auto-delete queue declared); ``queues_to_delete``: the session left subscription queues the
    adapter deletes on close (they would be the next session's); ``session_failed``: the session
    ended with an ERROR frame (whatever went wrong, the connection is not trusted further)."""
    if shutting_down:
        return "shutting down"
    if queues_to_delete:
        return "the session left queues to delete"
    if session_failed:
        return "the session ended with an error"
    if not reusable:
        return "the connection is not reusable"
    return None
