"""Byte budgets for what a client makes the adapter hold: a process-wide pool and per-connection
accounts that reserve and release bytes against it.

Two buffers a single connection controls are bounded this way (docs/behaviour.md, Limits):

* the SEND bodies of its open transactions, held until COMMIT or ABORT
  (``adapter.max_transaction_bytes`` per connection, ``adapter.transaction_bytes_budget`` for the
  process);
* activemq profile: the unacknowledged deliveries of its client-ack subscriptions, kept for a
  NACK to the dead-letter queue (``adapter.max_unacked_bytes``, ``adapter.unacked_bytes_budget``).

A reservation that would take a connection past its own bound, or the process past the pool's,
raises ``BudgetExceeded``: a ``StompError`` whose detail names the bound and its setting, so the
session answers it like any other refused frame (ERROR, then close) and the other connections
go on.  ``Account.close`` gives back whatever the connection still holds; the session calls it on
every close path, so the pool returns to zero however connections end.

``KeptDeliveries`` is the mapping of kept deliveries that charges an account for each body, so
the session keeps its dictionary code and the byte counting stays here.

Pure: no I/O, standard library only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, MutableMapping
from dataclasses import dataclass, field
from typing import TypeVar

from ..errors import StompError
from .operations import Delivery

__all__ = [
    "DEFAULT_BUDGET",
    "DEFAULT_PER_CONNECTION",
    "Account",
    "Budgets",
    "BudgetExceeded",
    "KeptDeliveries",
    "Pool",
]

# Defaults, argued in docs/configuration.md ("Byte budgets"): 16 maximum-size frames (4 MiB)
# per connection, and 16 such connections' worth for the whole process.
DEFAULT_PER_CONNECTION = 64 * 1024 * 1024
DEFAULT_BUDGET = 1024 * 1024 * 1024


class BudgetExceeded(StompError):
    """A reservation would break a byte bound; ``message``/``detail`` are the ERROR frame's."""


class Pool:
    """The bytes all connections of the process hold in one kind of buffer, and their bound.

    ``evicts``: when a reservation would take the pool past its bound, the owner (a user)
    holding the most in all its accounts gives up its largest account (``on_evicted`` ends that
    session), if that frees enough for the reservation; otherwise, or when that largest account
    is the reserving one, the reservation is refused as without eviction.  At most one account
    is evicted per reservation, so one delivery can never end more than one other session, and
    the owners' totals are kept as accounts change, so choosing costs one pass over the owners
    and one over the heaviest owner's accounts.  So one user's idle sessions cannot get another
    user's briefly slow session ended (the paused bytes of shared AMQP connections,
    adapter/amqp/shared.py)."""

    __slots__ = ("_by_owner", "_totals", "evicts", "limit", "setting", "used", "what")

    def __init__(self, limit: int, setting: str, what: str, *, evicts: bool = False) -> None:
        self.limit = limit
        self.setting = setting  # the ini key an operator raises
        self.what = what  # what the bytes are, for the ERROR ("Open transactions")
        self.used = 0
        self.evicts = evicts
        # evicts only: the open accounts holding bytes, by owner, and each owner's total
        self._by_owner: dict[str, set[Account]] = {}
        self._totals: dict[str, int] = {}

    def account(
        self,
        limit: int,
        setting: str,
        message: str,
        *,
        owner: str = "",
        on_evicted: Callable[[BudgetExceeded], None] | None = None,
    ) -> Account:
        """A connection's account: at most ``limit`` bytes (``setting``), ERROR ``message``;
        ``owner`` and ``on_evicted`` for a pool that ``evicts``."""
        return Account(self, limit, setting, message, owner, on_evicted)

    def _over(self) -> BudgetExceeded:
        return BudgetExceeded(
            "", f"{self.what} of all connections would hold more than {self.limit} bytes ({self.setting})\n"
        )

    def _make_room(self, reserving: Account, size: int) -> None:
        """Evict one account so that ``size`` more bytes for ``reserving`` fit, or raise for
        ``reserving``."""
        needed = self.used + size - self.limit
        totals = self._totals
        heaviest = max(totals, key=totals.__getitem__, default=None)
        mine = totals.get(reserving.owner, 0) + size
        if heaviest is None or mine >= totals[heaviest]:
            raise reserving.refused(self._over().detail)  # its own owner is the heaviest
        victim = max(self._by_owner[heaviest], key=lambda account: account.held)
        if victim.held < needed:
            raise reserving.refused(self._over().detail)  # one eviction would not make room
        victim.evict(self._over())

    def _changed(self, account: Account, delta: int) -> None:
        """``account`` holds ``delta`` bytes more (or fewer): the owners' books follow."""
        if not delta:
            return
        owner = account.owner
        total = self._totals.get(owner, 0) + delta
        accounts = self._by_owner.setdefault(owner, set())
        if account.held:
            accounts.add(account)
        else:
            accounts.discard(account)
        if total > 0 and accounts:
            self._totals[owner] = total
        else:
            self._totals.pop(owner, None)
            self._by_owner.pop(owner, None)


class Account:
    """One connection's share of a pool, with its own bound."""

    __slots__ = ("_closed", "held", "limit", "message", "on_evicted", "owner", "pool", "setting")

    def __init__(
        self,
        pool: Pool,
        limit: int,
        setting: str,
        message: str,
        owner: str = "",
        on_evicted: Callable[[BudgetExceeded], None] | None = None,
    ) -> None:
        self.pool = pool
        self.limit = limit
        self.setting = setting
        self.message = message
        self.owner = owner
        self.on_evicted = on_evicted
        self.held = 0
        self._closed = False

    def refused(self, detail: str) -> BudgetExceeded:
        return BudgetExceeded(self.message, detail)

    def reserve(self, size: int) -> None:
        """Hold ``size`` more bytes, or raise ``BudgetExceeded`` and hold nothing more."""
        if self._closed:
            return  # the connection is gone: nothing it still does may charge the pool
        pool = self.pool
        if self.held + size > self.limit:
            raise self.refused(
                f"{pool.what} of this connection would hold more than {self.limit} bytes ({self.setting})\n"
            )
        if pool.used + size > pool.limit:
            if not pool.evicts:
                raise self.refused(pool._over().detail)
            pool._make_room(self, size)
        self.held += size
        pool.used += size
        if pool.evicts:
            pool._changed(self, size)

    def release(self, size: int) -> None:
        """Give back ``size`` bytes reserved earlier (never more than the account holds)."""
        if self._closed:
            return
        size = min(size, self.held)
        self.held -= size
        self.pool.used -= size
        if self.pool.evicts:
            self.pool._changed(self, -size)

    def close(self) -> None:
        """The connection is gone: give back everything; later calls change nothing."""
        if not self._closed:
            held, self.held = self.held, 0
            self.pool.used -= held
            self._closed = True
            if self.pool.evicts:
                self.pool._changed(self, -held)

    def evict(self, error: BudgetExceeded) -> None:
        """The pool needs this account's bytes: give them all back, then tell its owner
        (``on_evicted``), whose session ends with ``error`` (worded for it)."""
        self.close()
        if self.on_evicted is not None:
            self.on_evicted(self.refused(error.detail))


K = TypeVar("K")


class KeptDeliveries(MutableMapping[K, Delivery]):
    """Deliveries by key, each body charged to ``account`` while it is in the mapping.

    Storing raises ``BudgetExceeded`` (and stores nothing) when the body does not fit; removing
    (``del``, ``pop``, ``clear``) gives its bytes back."""

    __slots__ = ("_account", "_items")

    def __init__(self, account: Account) -> None:
        self._account = account
        self._items: dict[K, Delivery] = {}

    def __setitem__(self, key: K, delivery: Delivery) -> None:
        old = self._items.get(key)
        if old is not None:
            self._account.release(len(old.body))
            del self._items[key]
        self._account.reserve(len(delivery.body))
        self._items[key] = delivery

    def __getitem__(self, key: K) -> Delivery:
        return self._items[key]

    def __delitem__(self, key: K) -> None:
        delivery = self._items.pop(key)
        self._account.release(len(delivery.body))

    def __iter__(self) -> Iterator[K]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def clear(self) -> None:
        """Remove every delivery, its bytes given back at once (``MutableMapping.clear`` pops
        them one by one, five calls even when there is nothing to remove)."""
        items = self._items
        if items:
            self._account.release(sum(len(delivery.body) for delivery in items.values()))
            items.clear()


@dataclass(slots=True)
class Budgets:
    """The process's byte pools and the per-connection bounds (``adapter.config`` builds it from
    the settings; ``SessionSettings`` carries it, shared by every connection of the process)."""

    max_transaction_bytes: int = DEFAULT_PER_CONNECTION
    transaction_bytes_budget: int = DEFAULT_BUDGET
    max_unacked_bytes: int = DEFAULT_PER_CONNECTION
    unacked_bytes_budget: int = DEFAULT_BUDGET
    transactions: Pool = field(init=False)
    unacked: Pool = field(init=False)

    def __post_init__(self) -> None:
        self.transactions = Pool(
            self.transaction_bytes_budget, "adapter.transaction_bytes_budget", "Open transactions"
        )
        self.unacked = Pool(
            self.unacked_bytes_budget, "adapter.unacked_bytes_budget", "Unacknowledged messages kept for NACK"
        )

    def transaction_account(self) -> Account:
        return self.transactions.account(
            self.max_transaction_bytes, "adapter.max_transaction_bytes", "Transaction bytes exceeded"
        )

    def unacked_account(self) -> Account:
        return self.unacked.account(
            self.max_unacked_bytes, "adapter.max_unacked_bytes", "Unacknowledged bytes exceeded"
        )
