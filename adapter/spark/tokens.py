"""OAuth 2.0 tokens for the ``stomp`` data source and sink: where a task's token comes from, and
when its AMQP connection gets a fresh one.

Owns the options ``token`` (a JWT, the AMQP password; the user name is left empty, as RabbitMQ's
oauth2 backend ignores it) and ``tokenFile`` (a file holding the current token, read again
whenever a refresh is due, so that a long streaming query follows the file an identity agent
rotates; the file must be readable where the tasks run), and the refresh schedule of one
connection (``TokenRefresher``): a third of the token's remaining life before its ``exp``, at
most 60 s before it, the connection gets ``connection.update-secret`` with the file's (or the
option's) current token.  A file not rotated yet is read again every few seconds until it is,
or the token expires (then the broker's checks fail the task).

No I/O but reading the token file; never logs a token, and ``TokenSource``'s repr hides it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..mapping.tokens import read_claims

# a refresh is due this long before exp at most (less for short-lived tokens: a third of their life)
REFRESH_AHEAD = 60.0
# a token file not rotated yet is read again after this many seconds
RETRY_SECONDS = 5.0


class TokenError(ValueError):
    """A token option or file that cannot be used; the text names the option, never the token."""


@dataclass(frozen=True, slots=True)
class TokenSource:
    """The ``token`` or ``tokenFile`` option: what a task logs in and refreshes with."""

    token: str | None = field(default=None, repr=False)
    token_file: str | None = None

    def current(self) -> str:
        """The token to use now (the file read afresh)."""
        if self.token_file is None:
            assert self.token is not None
            return self.token
        try:
            with open(self.token_file, encoding="utf-8") as file:
                token = file.read(64 * 1024).strip()
        except (OSError, UnicodeDecodeError) as error:
            raise TokenError(f"option 'tokenFile': cannot read {self.token_file}: {error}") from None
        if read_claims(token) is None:
            raise TokenError(f"option 'tokenFile': {self.token_file} does not hold a JWT")
        return token


def token_source(token: str | None, token_file: str | None) -> TokenSource | None:
    """The options' token source (None: neither option, the URL's password is used)."""
    if token and token_file:
        raise TokenError("options 'token' and 'tokenFile': give one of them, not both")
    if token_file:
        source = TokenSource(token_file=token_file)
        source.current()  # checked on the driver, before a task starts
        return source
    if token:
        if read_claims(token.strip()) is None:
            raise TokenError("option 'token' is not a JWT")
        return TokenSource(token=token.strip())
    return None


class TokenRefresher:
    """When one connection's token needs replacing, and with what."""

    __slots__ = ("_source", "_token", "_due", "_clock")

    def __init__(self, source: TokenSource, token: str, clock: Callable[[], float] = time.time) -> None:
        self._source = source
        self._clock = clock
        self._token = token  # the connection's token now
        self._due = self._due_for(token)

    def __repr__(self) -> str:
        return f"TokenRefresher(source={self._source!r}, due={self._due!r})"

    def _due_for(self, token: str) -> float | None:
        claims = read_claims(token)
        if claims is None or claims.expires_at is None:
            return None
        now = self._clock()
        return claims.expires_at - min(REFRESH_AHEAD, max(0.0, claims.expires_at - now) / 3)

    def next_token(self) -> str | None:
        """A new token when a refresh is due and the source has one, else None."""
        if self._due is None or self._clock() < self._due:
            return None
        token = self._source.current()
        if token == self._token:
            self._due = self._clock() + RETRY_SECONDS  # the file is not rotated yet
            return None
        return token

    def refreshed(self, token: str) -> None:
        """The broker took ``token``."""
        self._token = token
        self._due = self._due_for(token)
