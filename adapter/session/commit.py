"""BEGIN, COMMIT and ABORT: what a session does with the transactions' frames.

Pure.  Owns nothing: the open transactions are ``Transactions``' (transactions.py), the confirm
sequence ``Confirms``', the publishing ``Publishing``'s; these are the steps of the three frames,
plain functions of the session's parts (the session's route table names them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..mapping.operations import BasicPublish
from ..stomp.frame import Frame
from .settings import Steps
from .transactions import Transactions

if TYPE_CHECKING:
    from .parts import Parts


def begin(parts: Parts, frame: Frame) -> Steps:
    parts.transactions.begin(Transactions.name(frame))
    yield from parts.frames.receipt_of(frame)


def commit(parts: Parts, frame: Frame) -> Steps:
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


def abort(parts: Parts, frame: Frame) -> Steps:
    parts.transactions.end(Transactions.name(frame))
    yield from parts.frames.receipt_of(frame)
