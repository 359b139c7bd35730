"""The latency clocks of one client connection: publisher confirms and RECEIPTs.

Two histograms of ``ServerStats`` are fed from here (docs/configuration.md, metrics):

* confirm latency: one publish per connection is timed at a time (its sequence number and when
  it was sent; 0 when none is), so the message path pays one comparison, not a clock read and a
  dict entry per message;
* receipt latency, by command: the frames that ask for a receipt start a clock (only those read
  the clock), the RECEIPT stops it.  The receipted frames of one read share one clock reading, and
  so do the RECEIPTs one confirm releases.

``time.monotonic``, not the loop's clock: uvloop's has millisecond steps.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ..stomp.frame import Frame

if TYPE_CHECKING:
    from .stats import ServerStats

# receipts a connection times at once (see receipt_asked)
MAX_TIMED_RECEIPTS = 10_000
# never answered by a RECEIPT; plain strings: comparing with the enum members costs more
_ANSWERED_BY_CONNECTED = frozenset({"CONNECT", "STOMP"})


class LatencyClocks:
    """The running clocks of one connection (see the module docstring)."""

    __slots__ = (
        "_reused",
        "_stats",
        "_timed",
        "_timed_publish_at",
        "by_command",
        "confirm_clock",
        "read_clock",
        "timed_publish",
    )

    def __init__(self, stats: ServerStats) -> None:
        self._stats = stats
        self.by_command = stats.receipt_latency  # command -> histogram, filled on first use
        self.timed_publish = 0  # sequence number of the publish being timed, 0: none
        self._timed_publish_at = 0.0
        # receipt-id -> (command, when its frame was read) of each receipt asked for and not yet
        # answered; a receipt-id reused while it still waits queues its later frames here
        self._timed: dict[str, tuple[str, float]] = {}
        self._reused: dict[str, list[tuple[str, float]]] = {}
        # one clock reading shared by the receipted frames of one batch (reset as each starts)
        # and by the RECEIPTs one confirm releases (0: not read yet)
        self.read_clock = 0.0
        self.confirm_clock = 0.0

    def time_publish(self, seq: int) -> None:
        """Start timing the publish just made with confirm sequence number ``seq`` (0: confirms
        are off, nothing to time)."""
        if seq:
            self.timed_publish = seq
            self._timed_publish_at = time.monotonic()

    def confirmed(self, delivery_tag: int, multiple: bool) -> None:
        """A basic.ack or basic.nack from the broker: stop the publish clock if it covers the
        timed publish, and take the reading the RECEIPTs it releases will share."""
        now = 0.0
        timed = self.timed_publish
        if timed and (delivery_tag == timed or (multiple and delivery_tag > timed)):
            now = time.monotonic()
            self._stats.confirm_latency.observe(now - self._timed_publish_at)
            self.timed_publish = 0
        if self._timed:
            self.confirm_clock = now or time.monotonic()

    def receipt_asked(self, frame: Frame) -> None:
        """Start the clock of a frame's receipt (stopped by ``receipt_sent``).  The frames
        handled in one batch (one read, or those a broker reply let through) share one reading:
        the shell resets ``read_clock`` as each batch starts."""
        command = frame.command
        if command in _ANSWERED_BY_CONNECTED:
            return
        timed = self._timed
        if len(timed) >= MAX_TIMED_RECEIPTS:
            # receipts that never came (an aborted transaction's SENDs, a refused message) or a
            # client far ahead of its receipts: start over rather than grow
            timed.clear()
            self._reused.clear()
        now = self.read_clock
        if not now:
            now = self.read_clock = time.monotonic()
        receipt = frame.headers["receipt"]
        if receipt in timed:  # reused before its RECEIPT came: timed in order
            self._reused.setdefault(receipt, []).append((command, now))
        else:
            timed[receipt] = (command, now)

    def receipt_sent(self, receipt: str) -> None:
        """The session sent a RECEIPT (``Session.on_receipt``): observe its latency."""
        started = self._timed.pop(receipt, None)
        if started is None:
            return
        if self._reused:
            reused = self._reused.get(receipt)
            if reused:
                self._timed[receipt] = reused.pop(0)
                if not reused:
                    del self._reused[receipt]
        command, asked_at = started
        histogram = self.by_command.get(command)
        if histogram is None:
            histogram = self._stats.receipt_histogram(command)
        histogram.observe((self.confirm_clock or time.monotonic()) - asked_at)

    @property
    def waiting(self) -> int:
        """Receipts being timed (for tests and the bound)."""
        return len(self._timed) + sum(map(len, self._reused.values()))
