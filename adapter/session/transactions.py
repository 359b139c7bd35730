"""A session's open transactions: named buffers of operations replayed at COMMIT.

Pure.  Owns the transaction limits (docs/behaviour.md#limits) and the bytes of the SEND bodies
the open transactions hold, against the per-connection and process-wide bounds
(adapter/mapping/budget.py): reserved as a SEND is buffered, given back at COMMIT, ABORT,
DISCONNECT and close.  What a COMMIT does with the actions (publishes with confirms, settles)
is the session's business.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..mapping.budget import Account
from ..mapping.destinations import DestinationError
from ..mapping.operations import BasicPublish, Operation
from ..stomp.frame import Frame
from .settings import MAX_TRANSACTION_ACTIONS, MAX_TRANSACTIONS

# one buffered action: the operation, and the receipt of the SEND that buffered it (or None)
Action = tuple[Operation, str | None]


class Transactions:
    __slots__ = ("_open", "_bytes")

    def __init__(self, account: Account) -> None:
        self._open: dict[str, list[Action]] = {}
        self._bytes = account

    @property
    def held_bytes(self) -> int:
        return self._bytes.held

    def of(self, headers: Mapping[str, str]) -> str | None:
        """The open transaction a frame's ``transaction`` header names, or None without one."""
        name = headers.get("transaction")
        if name is not None and name not in self._open:
            raise DestinationError("Bad transaction", f'Invalid transaction identifier: "{name}"\n')
        return name

    @staticmethod
    def name(frame: Frame) -> str:
        """BEGIN's, COMMIT's or ABORT's transaction header, which they must have."""
        name = frame.headers.get("transaction")
        if name is None:
            raise DestinationError(
                "Missing transaction", f"\"{frame.command}\" must include a 'transaction' header\n"
            )
        return name

    def begin(self, name: str) -> None:
        if name in self._open:
            # the plugin silently resets the open transaction (docs/behaviour.md#limits); we refuse
            raise DestinationError("Bad transaction", f'Transaction "{name}" is already open\n')
        if len(self._open) >= MAX_TRANSACTIONS:
            raise DestinationError(
                "Transaction limit exceeded", f"At most {MAX_TRANSACTIONS} transactions may be open\n"
            )
        self._open[name] = []

    def buffer(self, name: str, op: Operation, receipt: str | None) -> None:
        """Hold ``op`` until COMMIT; raises over the action limit or the byte budget."""
        actions = self._open[name]
        if len(actions) >= MAX_TRANSACTION_ACTIONS:
            raise DestinationError(
                "Transaction too large",
                f'Transaction "{name}" already holds {MAX_TRANSACTION_ACTIONS} actions\n',
            )
        if isinstance(op, BasicPublish):
            self._bytes.reserve(len(op.body))
        actions.append((op, receipt))

    def end(self, name: str) -> list[Action]:
        """The actions of transaction ``name`` (COMMIT, ABORT), its bytes given back."""
        actions = self._open.pop(name, None)
        if actions is None:
            raise DestinationError("Bad transaction", f'Invalid transaction identifier: "{name}"\n')
        self._bytes.release(sum(len(op.body) for op, _ in actions if isinstance(op, BasicPublish)))
        return actions

    def clear(self) -> None:
        """DISCONNECT: every open transaction is dropped."""
        self._open.clear()
        self._bytes.release(self._bytes.held)

    def close(self) -> None:
        """The connection is gone: give every byte back, for good."""
        self._bytes.close()
