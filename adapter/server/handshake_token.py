"""An OAuth 2.0 token handed over in the WebSocket handshake, so that browsers keep it out of URLs.

Owns where the WebSocket upgrade request may carry a token, in this order (the first found wins):

1. ``Authorization: Bearer <token>`` (a reverse proxy in front of the adapter sets it; a browser
   cannot set headers on a WebSocket);
2. the cookie named by ``adapter.web_stomp_token_cookie`` (none: not read);
3. a ``Sec-WebSocket-Protocol`` entry ``base64url.bearer.authorization.stomp.<token in base64url,
   without padding>`` (the form Kubernetes uses for bearer tokens in browser WebSockets; the
   client offers ``v12.stomp`` beside it, which the handshake answers: the token entry is never
   echoed).

Only a JWT counts (anything else is as if absent).  The token becomes the session's passcode
when its CONNECT has none (adapter/session/login.py).
The WebSocket shell calls ``handshake_token`` once, after the origin check.  Pure: no I/O, no
logging (a token is a secret: nothing here may print one).
"""

from __future__ import annotations

import base64
import binascii

from ..mapping.tokens import MAX_TOKEN_LENGTH, read_claims

# the Sec-WebSocket-Protocol entry's prefix (docs/configuration.md, "OAuth 2.0 tokens")
SUBPROTOCOL_PREFIX = "base64url.bearer.authorization.stomp."


def handshake_token(headers: dict[str, str], subprotocols: list[str], cookie_name: str | None) -> str | None:
    """The token the upgrade request carries (``headers``: names in lower case), or None."""
    authorization = headers.get("authorization", "")
    scheme, _, value = authorization.strip().partition(" ")
    if scheme.lower() == "bearer" and _plausible(value.strip()):
        return value.strip()
    if cookie_name is not None:
        for pair in headers.get("cookie", "").split(";"):
            name, _, value = pair.strip().partition("=")
            if name == cookie_name and _plausible(value.strip().strip('"')):
                return value.strip().strip('"')
    for entry in subprotocols:
        if entry.startswith(SUBPROTOCOL_PREFIX):
            encoded = entry[len(SUBPROTOCOL_PREFIX) :]
            try:
                token = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode("ascii")
            except (binascii.Error, UnicodeDecodeError, ValueError):
                continue
            if _plausible(token):
                return token
    return None


def is_bearer(headers: dict[str, str]) -> bool:
    """Whether the request's Authorization header is a bearer JWT (never use_http_auth's Basic
    credentials; any other value keeps the plugin's answer, close 1011: docs/compatibility.md W9)."""
    scheme, _, value = headers.get("authorization", "").strip().partition(" ")
    return scheme.lower() == "bearer" and _plausible(value.strip())


def _plausible(token: str) -> bool:
    """A JWT (what RabbitMQ's oauth2 backend takes), printable ASCII, within the length bound."""
    return (
        0 < len(token) <= MAX_TOKEN_LENGTH
        and token.isascii()
        and token.isprintable()
        and " " not in token
        and read_claims(token) is not None
    )
