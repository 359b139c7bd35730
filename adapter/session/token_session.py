"""A session's OAuth 2.0 token: the login's checks, the refresh through ``/auth/token``, its expiry.

Pure: operations out (``UpdateSecret``, ``TokenExpiry``, frames), no clock of its own but the
one it is given.  One ``TokenSession`` per STOMP session owns the claims of the token the
session holds now (None: it logged in with a password) and decides:

* at CONNECT (``login_refusal``): whether the passcode is a token, and, with local validation
  (``TokenValidator``), whether it may reach the broker at all;
* on a SEND to ``/auth/token`` (``refresh``): whether the body may replace the session's token
  (a token, valid, same subject, not expired), then ``UpdateSecret`` and, once the broker took
  it, the new expiry and the frame's RECEIPT; any refusal is an ERROR that ends this session;
* when the token runs out: ``TokenExpiry`` tells the shell when (adapter/server/token_expiry.py
  keeps the timer and asks ``expired`` for the ERROR).

The shell never sees a token but in ``UpdateSecret`` (and the ``OpenConnection`` of the login),
whose reprs leave it out.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ..errors import StompError
from ..mapping.operations import TokenExpiry, UpdateSecret
from ..stomp.frame import Frame
from .frames import Frames
from .settings import Steps
from .tokens import TokenClaims, TokenValidator, read_claims, refresh_refusal

# the ERROR of a session whose token ran out (docs/behaviour.md, "OAuth 2.0 tokens")
EXPIRED_MESSAGE = "Token expired"


class TokenRefused(StompError):
    """A refresh the adapter or the broker refused: ERROR, then the session closes."""


class TokenSession:
    __slots__ = ("_validator", "_clock", "claims", "handshake_token", "refresh_pending")

    def __init__(self, validator: TokenValidator | None, clock: Callable[[], float] = time.time) -> None:
        self._validator = validator
        self._clock = clock
        self.claims: TokenClaims | None = None  # the token the session holds now
        # the token the WebSocket handshake carried (adapter/server/handshake_token.py), if any
        self.handshake_token: str | None = None
        # an update-secret is out for a refresh received while the token was still valid: the
        # expiry timer waits for its answer (which arms it again, or ends the session)
        self.refresh_pending = False

    def __repr__(self) -> str:
        return f"TokenSession(claims={self.claims!r})"

    @property
    def subject(self) -> str | None:
        """The token's subject (the broker's user name for it), for the logs; None: no token."""
        return self.claims.subject if self.claims is not None else None

    def credentials(self, passcode: str | None, login: str | None) -> tuple[str | None, str | None]:
        """CONNECT's passcode and login as the login uses them: the handshake's token when the
        CONNECT has no passcode, and an empty login for a token without one (never the default
        user, whose loopback_users rule concerns its password)."""
        if passcode is None and self.handshake_token is not None:
            passcode = self.handshake_token
        self.handshake_token = None  # used once: the session keeps no copy of it
        if login is None and read_claims(passcode) is not None:
            login = ""
        return passcode, login

    def login_refusal(self, passcode: str | None) -> str | None:
        """CONNECT's passcode: None lets the login go on to the broker (a password, or a token
        that passed), else why the token is refused before the broker sees it."""
        claims = read_claims(passcode)
        if claims is None:
            return None
        assert passcode is not None
        if claims.defect is not None:
            return claims.defect
        if self._validator is not None:
            refusal = self._validator.refusal(passcode)
            if refusal is not None:
                return refusal
        if claims.expires_at is not None and claims.expires_at <= self._clock():
            return "The token has expired"
        self.claims = claims
        return None

    def established(self) -> Steps:
        """After CONNECTED: when the token expires (nothing for a password login)."""
        if self.claims is not None and self.claims.expires_at is not None:
            yield TokenExpiry(self.claims.expires_at)

    def refresh(self, frame: Frame, frames: Frames) -> Steps:
        """A SEND to ``/auth/token``: the body replaces the session's token on its AMQP
        connection (``connection.update-secret``); RECEIPT once the broker took it."""
        current = self.claims
        if current is None:
            raise TokenRefused("Token refused", "The session did not log in with a token\n")
        if current.expires_at is not None and current.expires_at <= self._clock():
            # the expiry timer is about to end the session: a token that ran out is not renewed
            raise TokenRefused("Token refused", "The session's token has already expired\n")
        try:
            token = frame.body.decode("utf-8").strip()
        except UnicodeDecodeError:
            raise TokenRefused("Token refused", "The body of a SEND to /auth/token must be a JWT\n") from None
        claims = read_claims(token)
        if claims is None:
            raise TokenRefused("Token refused", "The body of a SEND to /auth/token must be a JWT\n")
        refusal = self._validator.refusal(token) if self._validator is not None else None
        if refusal is None:
            refusal = refresh_refusal(current, claims, self._clock())
        if refusal is not None:
            raise TokenRefused("Token refused", refusal + "\n")
        self.refresh_pending = True
        try:
            failure = yield UpdateSecret(token)
        finally:
            self.refresh_pending = False
        if failure is not None:
            raise TokenRefused("Token refused", f"The broker refused the new token: {failure}\n")
        self.claims = claims
        yield TokenExpiry(claims.expires_at)
        yield from frames.receipt_of(frame)

    def expired(self) -> str | None:
        """The shell's timer fired: the ERROR's body if the token has indeed expired (a refresh
        may have crossed the timer), else None."""
        claims = self.claims
        if self.refresh_pending:
            return None  # a refresh received before exp: its answer decides
        # a timer may fire a little early: a quarter of a second is forgiven
        if claims is None or claims.expires_at is None or claims.expires_at > self._clock() + 0.25:
            return None
        return "The session's OAuth 2.0 token expired and was not refreshed in time\n"
