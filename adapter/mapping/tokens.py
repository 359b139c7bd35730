"""OAuth 2.0 bearer tokens (JWTs): the reserved refresh destination, and the claims read untrusted.

Pure, standard library only.  Owns whether a passcode is a JWT and what the adapter reads from
it *without trusting it* (``read_claims``: ``exp``, the subject the broker uses, scopes and
audience), and the refresh rules RabbitMQ does not check (``refresh_refusal``).  Before anyone
has logged in, a passcode is hostile input: reading it never raises (numbers too big for a
float, infinities and nesting deep enough to exhaust the recursion limit are a ``defect`` that
refuses the token, found before anything recursive runs).  Used by the
session (adapter/session/token_session.py; its local validation with the operator's keys is
adapter/session/tokens.py), the WebSocket handshake and the Spark connector.  A token is a
secret: nothing here logs one, and ``TokenClaims`` holds no part of the token itself.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass

# the reserved destination of a token refresh (a SEND whose body is the new token)
TOKEN_DESTINATION = "/auth/token"
# a JWT longer than this is not read (a passcode is bounded by the frame limits anyway)
MAX_TOKEN_LENGTH = 16 * 1024
# the deepest nesting of arrays and objects read in a token's JSON (real tokens nest a few
# levels: Keycloak's resource_access.<client>.roles is three); checked before decoding, so no
# decoder (the adapter's, PyJWT's) ever recurses deeper
MAX_NESTING = 32
# exp, nbf and iat (NumericDate, seconds since the epoch) at or beyond this, in either
# direction, are no time (10^11 s is past the year 5000; beyond 2^53 a float is not exact)
MAX_TIMESTAMP = 10**11
_TIME_CLAIMS = ("exp", "nbf", "iat")
# a JSON string (whose brackets do not nest; an unterminated one runs to the end, so that no
# quote starts a second scan of the rest) or one bracket
_STRING_OR_BRACKET = re.compile(rb'"(?:[^"\\]|\\.)*"?|[\[\]{}]', re.DOTALL)


@dataclass(frozen=True, slots=True)
class TokenClaims:
    """What the adapter reads of a token, untrusted: never the token itself."""

    subject: str  # the broker's user: ``client_id`` if present, else ``sub`` ("" if neither)
    expires_at: float | None  # ``exp``, seconds since the epoch
    scopes: tuple[str, ...] = ()
    audience: tuple[str, ...] = ()
    # why the token is refused whatever else is checked (claims nested too deeply, a time
    # claim that is no time, a subject that is no string); None: readable
    defect: str | None = None
    # ``sub`` and ``client_id`` as the token has them (None: absent): a refresh keeps both
    names: tuple[str | None, str | None] = (None, None)


class _TooDeep(ValueError):
    """The JSON nests deeper than ``MAX_NESTING``."""


def _check_nesting(text: bytes) -> None:
    """Raise ``_TooDeep`` past ``MAX_NESTING``: one regular expression scan, no recursion."""
    if text.count(b"[") + text.count(b"{") <= MAX_NESTING:
        return  # too few brackets to nest that deep (the common case)
    depth = 0
    for found in _STRING_OR_BRACKET.finditer(text):
        char = found.group()
        if char in (b"[", b"{"):
            depth += 1
            if depth > MAX_NESTING:
                raise _TooDeep
        elif char in (b"]", b"}"):
            depth -= 1


def _time_defect(payload: dict[str, object]) -> str | None:
    for name in _TIME_CLAIMS:
        value = payload.get(name)
        # compared, never converted: an int of 400 digits overflows a float; NaN and the
        # infinities fail the comparison
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if number and not -MAX_TIMESTAMP < value < MAX_TIMESTAMP:  # type: ignore[operator]
            return f"The token's {name} is not a time"
    return None


def _b64_json(part: str) -> object:
    """The JSON of a base64url part; None if it is none; raises ``_TooDeep``."""
    padded = part + "=" * (-len(part) % 4)
    try:
        text = base64.urlsafe_b64decode(padded.encode("ascii"))
    except (ValueError, binascii.Error, UnicodeError):
        return None
    _check_nesting(text)
    try:
        return json.loads(text)
    except (
        ValueError,
        UnicodeError,
        OverflowError,
        RecursionError,
    ):  # RecursionError: never, kept as a guard
        return None


def _strings(value: object) -> tuple[str, ...]:
    if isinstance(value, str):
        return tuple(value.split())
    if isinstance(value, list):
        return tuple(item for item in value if isinstance(item, str))
    return ()


def read_claims(passcode: str | None) -> TokenClaims | None:
    """The claims of ``passcode`` if it is a JWT (three base64url parts, a JSON header with
    ``alg`` and a JSON object of claims), else None: a password, logged in as before."""
    if not passcode or len(passcode) > MAX_TOKEN_LENGTH or passcode.count(".") != 2:
        return None
    header_part, payload_part, _ = passcode.split(".")
    try:
        header = _b64_json(header_part)
    except _TooDeep:
        return None
    if not isinstance(header, dict) or "alg" not in header:
        return None
    try:
        payload = _b64_json(payload_part)
    except _TooDeep:
        return TokenClaims("", None, defect="The token's claims are nested too deeply")
    if not isinstance(payload, dict):
        return None
    defect = _time_defect(payload)
    if defect is not None:
        return TokenClaims("", None, defect=defect)
    sub, client_id = payload.get("sub"), payload.get("client_id")
    for name, value in (("sub", sub), ("client_id", client_id)):
        if value is not None and not isinstance(value, str):
            return TokenClaims("", None, defect=f"The token's {name} is not a string")
    assert sub is None or isinstance(sub, str)
    assert client_id is None or isinstance(client_id, str)
    exp = payload.get("exp")
    expires_at = float(exp) if isinstance(exp, int | float) and not isinstance(exp, bool) else None
    return TokenClaims(
        subject=client_id or sub or "",
        expires_at=expires_at,
        scopes=_strings(payload.get("scope")),
        audience=_strings(payload.get("aud")),
        names=(sub, client_id),
    )


def refresh_refusal(current: TokenClaims, new: TokenClaims, now: float) -> str | None:
    """Why a refreshed token cannot replace the session's (None: it can).  RabbitMQ's
    update-secret takes a token of another subject and an expired one alike."""
    if new.defect is not None:
        return new.defect
    # sub and client_id each (a missing one is a value too): the broker's user is client_id,
    # else sub, but a token names both, and the refresh must not change who it is for
    if new.subject != current.subject or new.names != current.names:
        return "The new token is for another subject than the session's"
    if new.expires_at is not None and new.expires_at <= now:
        return "The new token has expired"
    return None
