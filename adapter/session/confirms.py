"""Publisher confirms and the receipts that wait for them.

Pure.  Once confirm mode is on (``on``), the broker numbers publishes 1, 2, ...; a SEND's
receipt waits for the confirm of its number, a COMMIT's (or a composite SEND's) for every number
of its publishes (docs/behaviour.md#receipts).  ``settle`` turns a broker ``basic.ack`` /
``basic.nack`` into the receipt ids it completes; the session renders them (a nack as ERROR,
never as RECEIPT).

It also counts what the broker refused or returned, for the adapter's own copies of a message
it settles only once the copy is safe (a NACK's dead-letter or retry copy: activemq.py and
retries.py in this package): such a copy is published mandatory, and the broker returns one no
queue takes (basic.return) before it confirms it, so a copy whose confirm came with no new
refusal and no new return is in a queue.  Client SENDs are never mandatory, so every return is
one of those copies.
"""

from __future__ import annotations


class Confirms:
    __slots__ = ("on", "refused", "returned", "seq", "_receipts", "_commits", "_copies")

    def __init__(self) -> None:
        self.on = False  # confirm.select sent
        self.seq = 0  # the sequence number of the last publish (0: confirms are off)
        self.refused = 0  # basic.nacks received so far (a retry copy checks none came: retries.py)
        self.returned = 0  # basic.returns received so far (a mandatory copy checks none came)
        self._receipts: dict[int, str] = {}
        # (receipt, sequence numbers not yet confirmed): COMMIT and composite SEND receipts
        self._commits: list[tuple[str, set[int]]] = []
        # the numbers of the adapter's own copies not yet confirmed (retries.py): AwaitConfirms
        # waits for them as for a receipt
        self._copies: set[int] = set()

    def count(self, receipt: str | None) -> None:
        """After a publish: take the next number once confirms are on; a receipt waits for it."""
        if self.on:
            self.seq += 1
            if receipt is not None:
                self._receipts[self.seq] = receipt

    def count_copy(self) -> None:
        """After the publish of one of the adapter's own copies (confirms on): it is
        ``outstanding`` until its confirm, so AwaitConfirms waits for it."""
        self.count(None)
        self._copies.add(self.seq)

    def on_return(self) -> None:
        """The broker returned a mandatory publish (basic.return): one of the adapter's own
        copies routed nowhere.  Counted; the frame that published it reads the count once the
        copy's confirm (which follows the return) has come."""
        self.returned += 1

    def wait_for_all(self, receipt: str, first_seq: int) -> None:
        """``receipt`` waits for every publish from ``first_seq`` to the last one."""
        self._commits.append((receipt, set(range(first_seq, self.seq + 1))))

    @property
    def outstanding(self) -> bool:
        return bool(self._receipts or self._commits or self._copies)

    def settle(self, delivery_tag: int, multiple: bool, ack: bool) -> list[str]:
        """The receipts a broker confirm (``ack``) or refusal completes, in order."""
        if not ack:
            self.refused += 1
        copies = self._copies
        if copies:
            if multiple:
                copies -= {seq for seq in copies if seq <= delivery_tag}
            else:
                copies.discard(delivery_tag)
        pending = self._receipts
        receipts: list[str] = []
        if pending:
            if multiple:
                settled = []
                for seq in pending:
                    if seq > delivery_tag:
                        break
                    settled.append(seq)
                receipts = [pending.pop(seq) for seq in settled]
            else:
                receipt = pending.pop(delivery_tag, None)
                if receipt is not None:
                    receipts.append(receipt)
        if self._commits:
            receipts += self._settle_commits(delivery_tag, multiple, ack)
        return receipts

    def _settle_commits(self, delivery_tag: int, multiple: bool, ack: bool) -> list[str]:
        """The COMMIT receipts this confirm completes; on a nack, those it touches (they
        become ERRORs, never RECEIPTs)."""
        done: list[str] = []
        waiting: list[tuple[str, set[int]]] = []
        for receipt, seqs in self._commits:
            if multiple:
                hit = {seq for seq in seqs if seq <= delivery_tag}
                seqs -= hit
            else:
                hit = {delivery_tag} & seqs
                seqs.discard(delivery_tag)
            if (hit and not ack) or not seqs:
                done.append(receipt)
            else:
                waiting.append((receipt, seqs))
        self._commits = waiting
        return done
