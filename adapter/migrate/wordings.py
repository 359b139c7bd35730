"""The ERROR wordings that mean the same outcome on ActiveMQ and in the ``activemq`` profile.

Owns the table the replay uses when it compares the ERRORs the recorded upstream (ActiveMQ)
sent a connection with the adapter's: where both refuse the same frame the same way (an ERROR,
and the same close or not) but word the ``message`` header differently, the pair is reported as
equivalent, not as a difference.  Each entry is a row of the profile's table in
docs/migration-activemq.md, whose first column is the entry's ``name``; an entry is added only
with that row, and only for the same outcome (an ERROR one side sends and the other does not is
never equivalent: that stays a difference).

Pure: standard library only, no I/O.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

__all__ = ["EQUIVALENT_ERRORS", "ErrorComparison", "Wording", "compare_errors"]


@dataclass(frozen=True, slots=True)
class Wording:
    """One equivalence: ActiveMQ's ``message`` (``activemq`` matches its beginning; ActiveMQ
    appends details such as the client's address) and the adapter's (``adapter``, exactly,
    after ``\\1``-style references to the groups of ``activemq`` are filled in)."""

    name: str  # the row of docs/migration-activemq.md
    activemq: re.Pattern[str]
    adapter: str

    def adapter_says(self, recorded: str) -> str | None:
        """The adapter's wording of the same outcome, if ``recorded`` is ActiveMQ's wording."""
        match = self.activemq.match(recorded)
        return match.expand(self.adapter) if match is not None else None


# measured against ActiveMQ 5.17 through the tap (tests/spark/test_tap_on_activemq.py)
EQUIVALENT_ERRORS: Final[tuple[Wording, ...]] = (
    # ERROR on SUBSCRIBE either way; ActiveMQ names the JMS call that failed
    Wording("Invalid selector", re.compile(r"Couldn't create TopicSubscription"), "Invalid selector"),
    # ERROR then close either way; the adapter's header has no colon after "Client" (header
    # values are escaped for every STOMP version, as the plugin does)
    Wording(
        "A second connection with a `client-id` already connected",
        re.compile(r"Broker: [^ ]+ - Client: ([^ ]+) already connected from tcp://"),
        r"Client \1 already connected",
    ),
)


@dataclass(frozen=True, slots=True)
class ErrorComparison:
    """The ERRORs of one connection, compared: pairs that differ only in wording (recorded,
    replayed, the table's ``name``), and what is left over on either side (the difference)."""

    equivalent: list[tuple[str, str, str]]
    recorded_only: list[str]
    replayed_only: list[str]

    @property
    def differs(self) -> bool:
        return bool(self.recorded_only or self.replayed_only)


def compare_errors(
    recorded: Sequence[str], replayed: Sequence[str], table: Sequence[Wording] = EQUIVALENT_ERRORS
) -> ErrorComparison:
    """Match the recorded ERROR messages with the replayed ones, in any order: equal texts first,
    then the pairs ``table`` declares equivalent; what stays unmatched differs."""
    left = Counter(recorded)
    right = Counter(replayed)
    same = left & right
    left -= same
    right -= same
    equivalent: list[tuple[str, str, str]] = []
    recorded_only: list[str] = []
    for text in left.elements():
        for wording in table:
            theirs = wording.adapter_says(text)
            if theirs is not None and right[theirs] > 0:
                right[theirs] -= 1
                equivalent.append((text, theirs, wording.name))
                break
        else:
            recorded_only.append(text)
    return ErrorComparison(equivalent, recorded_only, list((+right).elements()))
