"""The rules of session multiplexing (``adapter.amqp_sessions_per_connection``), without sockets
or a clock of their own: which shared AMQP connection a login joins, when a connection takes no
more sessions, and which ones must close.

A shared connection belongs to one (broker node, vhost, user), like a pooled one
(adapter/amqp/pool.py): the broker authenticated that user on it.  A later CONNECT may join it
only with the same key *and* the same passcode, checked as the pool checks it (a keyed digest,
compared in constant time with every candidate; the passcode itself is never kept).  A CONNECT
whose passcode matches none logs in afresh, so the broker decides.

A connection carries at most ``per_connection`` sessions, and never more than the channels the
broker negotiated (``channel_max``).  It takes no new session once it is *retired*: it failed,
the broker blocked it, a session left a queue on it that lives as long as the connection, or the
broker authenticated the user on it more than ``max_age_seconds`` ago (so that a password change
reaches every new session within that time).  A retired connection closes when its last session
leaves.  A connection that is not retired and has no session left waits ``idle_seconds`` for the
next login (at most ``max_idle`` of them per process, the oldest going first), then closes.

Joins fill the fullest connection that still has room: fewer connections for the broker to keep.

The asyncio side (adapter/amqp/multiplex_runtime.py) owns the connections, the timers and the closing.
Pure: standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

from .pool import Lifetime, PasscodeCheck, PoolKey

Connection = TypeVar("Connection")


@dataclass(slots=True, eq=False)
class Shared(Generic[Connection]):
    connection: Connection
    key: PoolKey
    passcode_digest: bytes
    capacity: int  # sessions it may carry: min(per_connection, channel_max)
    authenticated_at: float  # when the broker logged the user in on this connection
    sessions: int = 1  # a connection is registered by the login that opened it
    retired: bool = False
    idle_since: float | None = None  # when its last session left (None: it has sessions)


class SharedConnections(Generic[Connection]):
    """Every shared connection of a process by key.  Every method takes ``now`` from the
    caller's clock where time matters."""

    def __init__(
        self, *, per_connection: int, max_age_seconds: float, idle_seconds: float, max_idle: int
    ) -> None:
        if per_connection < 2:
            raise ValueError("multiplexing needs at least 2 sessions per connection")
        self.per_connection = per_connection
        self.lifetime = Lifetime(idle_seconds, max_age_seconds)  # the pool's rule (pool.py)
        self.max_idle = max_idle
        self._by_key: dict[PoolKey, list[Shared[Connection]]] = {}
        self._entries: dict[int, Shared[Connection]] = {}  # by id(connection)
        # (vhost, user) whose channel.open the broker refused on a shared connection: their
        # sessions get a connection each from then on (``channels_refused``)
        self.unshared: set[tuple[str, str]] = set()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def sessions(self) -> int:
        """Sessions on all shared connections."""
        return sum(entry.sessions for entry in self._entries.values())

    def entry(self, connection: Connection) -> Shared[Connection] | None:
        return self._entries.get(id(connection))

    # ------------------------------------------------------------------ logins
    def admit(self, key: PoolKey, passcode_digest: bytes, now: float) -> Connection | None:
        """A connection of ``key`` logged in with this passcode that has room for one more
        session, with that session counted; None: log in afresh (the broker decides).  Every
        entry of the key is compared, so the time taken does not tell which one matched.  An
        entry past ``max_age_seconds`` is retired on the way (and closes when empty)."""
        entries = self._by_key.get(key)
        if not entries or key[1:] in self.unshared:
            return None
        found: Shared[Connection] | None = None
        for entry in entries:
            matches = PasscodeCheck.same(entry.passcode_digest, passcode_digest)
            if entry.retired:
                continue
            if self.lifetime.too_old(entry.authenticated_at, now):
                entry.retired = True
                continue
            has_room = entry.sessions < entry.capacity
            if matches and has_room and (found is None or entry.sessions > found.sessions):
                found = entry  # the fullest with room
        if found is None:
            return None
        found.sessions += 1
        found.idle_since = None
        return found.connection

    def opened(
        self, connection: Connection, key: PoolKey, passcode_digest: bytes, channel_max: int, now: float
    ) -> list[Connection]:
        """A fresh login succeeded on ``connection`` (its session counted).  Returns the
        connections to close now: idle ones of ``key`` logged in with another passcode (the
        broker has just accepted this one; after a password change the old one's go).  Busy
        ones of another passcode take no new session (retired)."""
        capacity = min(self.per_connection, channel_max or 65535)
        entry = Shared(connection, key, passcode_digest, capacity, now)
        entry.retired = key[1:] in self.unshared  # a connection of its own: it closes with the session
        self._by_key.setdefault(key, []).append(entry)
        self._entries[id(connection)] = entry
        stale: list[Connection] = []
        for other in list(self._by_key[key]):
            if other is entry or PasscodeCheck.same(other.passcode_digest, passcode_digest):
                continue
            other.retired = True
            if other.sessions == 0:
                self._remove(other)
                stale.append(other.connection)
        return stale

    def left(self, connection: Connection, now: float) -> list[Connection]:
        """A session of ``connection`` ended.  Returns the connections to close now: this one
        if it is retired and empty, and the oldest idle ones beyond ``max_idle``."""
        entry = self._entries.get(id(connection))
        if entry is None:
            return []  # forgotten (failed) meanwhile: whoever forgot it closes it
        entry.sessions = max(0, entry.sessions - 1)
        if entry.sessions:
            return []
        if entry.retired or self.max_idle <= 0:
            self._remove(entry)
            return [connection]
        entry.idle_since = now
        idle = [e for e in self._entries.values() if e.idle_since is not None]
        closing: list[Connection] = []
        while len(idle) > self.max_idle:
            oldest = min(idle, key=lambda e: e.idle_since or 0.0)
            idle.remove(oldest)
            self._remove(oldest)
            closing.append(oldest.connection)
        return closing

    def retire(self, connection: Connection) -> list[Connection]:
        """``connection`` takes no new session (blocked, a connection-bound queue left on it);
        returns it if it has no session left (close it now)."""
        entry = self._entries.get(id(connection))
        if entry is None:
            return []
        entry.retired = True
        if entry.sessions == 0:
            self._remove(entry)
            return [connection]
        return []

    def channels_refused(self, connection: Connection) -> list[Connection] | None:
        """The broker closed ``connection`` because a channel.open passed a channel limit (a
        user's ``max-channels``, the node's ``channel_max_per_node``: 530 NOT_ALLOWED, a
        connection error): every session on it has ended.  Its user stops being multiplexed
        for the life of the process, so the next refusal ends the one session whose channel
        it was, as without multiplexing.  Returns the user's idle connections to close now
        (its busy ones take no new session and close with their last), or None when the user
        was unshared already (or the connection is not here)."""
        entry = self._entries.get(id(connection))
        if entry is None or entry.key[1:] in self.unshared:
            return None
        who = entry.key[1:]
        self.unshared.add(who)
        idle = []
        for other in list(self._entries.values()):
            if other.key[1:] == who and other is not entry:
                other.retired = True
                if other.sessions == 0:
                    self._remove(other)
                    idle.append(other.connection)
        return idle

    def forget(self, connection: Connection) -> bool:
        """``connection`` failed or was closed: it is gone with its sessions.  False if it was
        not here."""
        entry = self._entries.get(id(connection))
        if entry is None:
            return False
        self._remove(entry)
        return True

    # ------------------------------------------------------------------ expiry and shutdown
    def expiry_of(self, connection: Connection) -> float | None:
        """When an idle ``connection`` expires (None: it has sessions, or is not here)."""
        entry = self._entries.get(id(connection))
        if entry is None or entry.idle_since is None:
            return None
        return self.lifetime.expiry(entry.authenticated_at, entry.idle_since)

    def expired(self, now: float) -> list[Connection]:
        """Take out and return the idle connections whose time is up."""
        gone = [
            entry
            for entry in self._entries.values()
            if entry.idle_since is not None
            and self.lifetime.expired(entry.authenticated_at, entry.idle_since, now)
        ]
        for entry in gone:
            self._remove(entry)
        return [entry.connection for entry in gone]

    def next_expiry(self) -> float | None:
        deadlines = [
            self.lifetime.expiry(e.authenticated_at, e.idle_since)
            for e in self._entries.values()
            if e.idle_since is not None
        ]
        return min(deadlines) if deadlines else None

    def shutdown(self) -> list[Connection]:
        """Shutdown: every connection takes no new session; take out and return the idle ones
        (close them now; the others close as their last session leaves)."""
        idle = [entry for entry in self._entries.values() if entry.sessions == 0]
        for entry in self._entries.values():
            entry.retired = True
        for entry in idle:
            self._remove(entry)
        return [entry.connection for entry in idle]

    def drain(self) -> list[Connection]:
        """Take out and return every connection (shutdown)."""
        everything = [entry.connection for entry in self._entries.values()]
        self._by_key.clear()
        self._entries.clear()
        return everything

    def _remove(self, entry: Shared[Connection]) -> None:
        self._entries.pop(id(entry.connection), None)
        entries = self._by_key.get(entry.key)
        if entries is not None:
            if entry in entries:
                entries.remove(entry)
            if not entries:
                del self._by_key[entry.key]
