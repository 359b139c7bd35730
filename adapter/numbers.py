"""Bounded parsing of the integers a client writes as text: the one place where client-controlled
text becomes an ``int`` (ACK/NACK ids, ``content-length``, ``prefetch-count``,
``activemq.prefetchSize``, the x- queue arguments, ``x-stream-offset``, ``priority``,
``timestamp``, ``expires`` ...).

Why: ``int()`` of a long digit string costs time quadratic in its length, and beyond
``sys.get_int_max_str_digits()`` (4,300 digits) it raises ``ValueError``, which nothing expects;
a header of 5,000 digits must be a clean ERROR, never a traceback.  Every integer the adapter
carries fits in 64 bits (AMQP long and long long, delivery tags, timestamps), so the significant
digits are counted first and more than ``MAX_DIGITS`` are refused before ``int()`` runs: nothing
is lost, and the callers' own range checks still answer "out of range" for a 20-digit value that
does not fit.

Pure: standard library only.
"""

from __future__ import annotations

from typing import Final

# 2**64 - 1 has 20 digits: every integer AMQP carries, with room for the callers' range checks
MAX_DIGITS: Final = 20


class TooManyDigits(ValueError):
    """An integer with more significant digits than allowed; ``str()`` names the limit."""

    def __init__(self, text: str, digits: int, limit: int) -> None:
        shown = repr(text) if len(text) <= 40 else f"{text[:40]!r}..."
        super().__init__(f"integer of {digits} digits, at most {limit} allowed: {shown}")
        self.digits = digits
        self.limit = limit


def decimal_integer(text: str, *, signed: bool = True, max_digits: int = MAX_DIGITS) -> int | None:
    """``text`` as an integer when it is an optional sign (only if ``signed``) followed by ASCII
    digits and nothing else; ``None`` otherwise.  Raises :class:`TooManyDigits` when it has more
    than ``max_digits`` significant digits (leading zeros do not count).  Linear in ``len(text)``:
    two C scans, and ``int()`` only ever sees at most ``max_digits`` digits."""
    negative = False
    digits = text
    if signed and text[:1] in ("+", "-"):
        negative = text[0] == "-"
        digits = text[1:]
    if not digits.isdigit() or not digits.isascii():  # isdigit() alone takes e.g. '²' or '٣'
        return None
    significant = digits.lstrip("0")
    if len(significant) > max_digits:
        raise TooManyDigits(text, len(significant), max_digits)
    value = int(significant) if significant else 0
    return -value if negative else value
