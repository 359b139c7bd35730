"""BEGIN, COMMIT and ABORT: what a session does with the transactions' frames.

Pure.  Owns nothing: the open transactions are ``Transactions``' (transactions.py), the confirm
sequence ``Confirms``', the publishing ``Publishing``'s; this is the order COMMIT runs them in.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..mapping.operations import BasicPublish
from ..stomp.frame import Frame
from .settings import Steps
from .transactions import Transactions

if TYPE_CHECKING:
    from .parts import Parts


class TransactionFrames:
    """The steps of BEGIN, COMMIT and ABORT for one session."""

    __slots__ = ("_parts",)

    def __init__(self, parts: Parts) -> None:
        self._parts = parts

    def begin(self, frame: Frame) -> Steps:
        parts = self._parts
        parts.transactions.begin(Transactions.name(frame))
        yield from parts.frames.receipt_of(frame)

    def commit(self, frame: Frame) -> Steps:
        parts = self._parts
        actions = parts.transactions.end(Transactions.name(frame))
        receipt = frame.headers.get("receipt")
        # A COMMIT's RECEIPT means what a SEND's does: the broker has every message of the
        # transaction.  So with a receipt, confirms go on before its first publish, and the
        # RECEIPT waits for the confirms of all of them (the plugin, inside the broker, sends it
        # at once: docs/compatibility.md).
        publishes = receipt is not None and any(isinstance(op, BasicPublish) for op, _ in actions)
        publishing = parts.publishing
        if publishes:
            yield from publishing.confirm_mode()
        first_seq = parts.confirms.seq + 1
        for op, op_receipt in actions:
            if isinstance(op, BasicPublish):
                yield from publishing.publish(op, op_receipt)
            else:
                parts.extension.committed(op)
                yield op
        if publishes:
            assert receipt is not None
            parts.confirms.wait_for_all(receipt, first_seq)
        else:
            yield from parts.frames.receipt_of(frame)

    def abort(self, frame: Frame) -> Steps:
        parts = self._parts
        parts.transactions.end(Transactions.name(frame))
        yield from parts.frames.receipt_of(frame)
