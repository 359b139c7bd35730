"""OAuth 2.0 bearer tokens (JWTs): the reserved refresh destination, and the claims read untrusted.

Pure, standard library only.  Owns whether a passcode is a JWT and what the adapter reads from
it *without trusting it* (``read_claims``: ``exp``, the subject the broker uses, scopes and
audience), and the refresh rules RabbitMQ does not check (``refresh_refusal``).  Used by the
session (adapter/session/token_session.py; its local validation with the operator's keys is
adapter/session/tokens.py), the WebSocket handshake and the Spark connector.  A token is a
secret: nothing here logs one, and ``TokenClaims`` holds no part of the token itself.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass

# the reserved destination of a token refresh (a SEND whose body is the new token)
TOKEN_DESTINATION = "/auth/token"
# a JWT longer than this is not read (a passcode is bounded by the frame limits anyway)
MAX_TOKEN_LENGTH = 16 * 1024


@dataclass(frozen=True, slots=True)
class TokenClaims:
    """What the adapter reads of a token, untrusted: never the token itself."""

    subject: str  # the broker's user: ``client_id`` if present, else ``sub`` ("" if neither)
    expires_at: float | None  # ``exp``, seconds since the epoch
    scopes: tuple[str, ...] = ()
    audience: tuple[str, ...] = ()


def _b64_json(part: str) -> object:
    padded = part + "=" * (-len(part) % 4)
    try:
        return json.loads(base64.urlsafe_b64decode(padded.encode("ascii")))
    except (ValueError, binascii.Error, UnicodeError):
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
    header = _b64_json(header_part)
    payload = _b64_json(payload_part)
    if not isinstance(header, dict) or "alg" not in header or not isinstance(payload, dict):
        return None
    exp = payload.get("exp")
    expires_at = float(exp) if isinstance(exp, int | float) and not isinstance(exp, bool) else None
    subject = payload.get("client_id") or payload.get("sub") or ""
    return TokenClaims(
        subject=subject if isinstance(subject, str) else "",
        expires_at=expires_at,
        scopes=_strings(payload.get("scope")),
        audience=_strings(payload.get("aud")),
    )


def refresh_refusal(current: TokenClaims, new: TokenClaims, now: float) -> str | None:
    """Why a refreshed token cannot replace the session's (None: it can).  RabbitMQ's
    update-secret takes a token of another subject and an expired one alike."""
    if new.subject != current.subject:
        return "The new token is for another subject than the session's"
    if new.expires_at is not None and new.expires_at <= now:
        return "The new token has expired"
    return None
