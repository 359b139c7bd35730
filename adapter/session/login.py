"""CONNECT: admission, version negotiation, credentials, the broker login; an established identity out.

Pure.  ``Login.connect`` is a generator of operations (the ``OpenConnection`` the shell runs)
that returns either ``Admitted`` (an ``Identity`` whose user, vhost and version are never
Optional, plus what CONNECTED needs) or ``Refused`` (the ERROR to send before closing).  The
session installs the identity and sends ``Established`` and CONNECTED; nothing after login asks
whether a user or a vhost exists.

Owns what the login leaves behind until the connection closes: the ``stomp.max_connections``
slot and the claimed ``client-id`` (both given back by ``close``), and the login figures the
shell logs (requested user and vhost, why a login failed).
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass

from ..mapping.operations import LoginResult, OpenConnection, Operation
from ..mapping.profile import RabbitMQRules, client_id_in_use
from ..stomp import heartbeat
from ..stomp.frame import SUPPORTED_VERSIONS, Command, Frame
from .edition import LEGACY, Edition
from .frames import Frames
from .settings import NODE_LIMIT_REACHED, SessionSettings
from .token_session import TokenSession


@dataclass(frozen=True, slots=True)
class Identity:
    """Who a connection is once it is logged in."""

    user: str
    vhost: str
    version: str  # the negotiated STOMP version, "1.0", "1.1" or "1.2"
    client_id: str | None = None  # activemq profile: CONNECT's client-id (named durable subscriptions)


@dataclass(frozen=True, slots=True)
class Admitted:
    identity: Identity
    server_version: str | None  # the broker's product/version, for CONNECTED's server header
    send_ms: int  # negotiated heart-beats (docs/behaviour.md#heart-beats)
    receive_ms: int


@dataclass(frozen=True, slots=True)
class Refused:
    message: str  # the ERROR's message header
    detail: str  # its body


LoginSteps = Generator[Operation, object, Admitted | Refused]

_FAILURES = {"auth": "access_refused", "vhost": "vhost"}


class Login:
    """CONNECT's checks and login for one session.  The session's stomp.max_connections slot
    and client id are held by ``owner``; the session gives None, which makes the login itself
    the holder (no reference back to the session: a closed session is freed by reference
    counting)."""

    __slots__ = (
        "_settings",
        "_edition",
        "_rules",
        "_owner",
        "peer_is_loopback",
        "forced_credentials",
        "requested_user",
        "requested_vhost",
        "failure",
        "_client_id",
        "_tokens",
    )

    def __init__(
        self,
        settings: SessionSettings,
        rules: RabbitMQRules,
        owner: object | None,
        peer_is_loopback: bool,
        edition: Edition = LEGACY,
        tokens: TokenSession | None = None,
    ) -> None:
        self._settings = settings
        self._tokens = tokens  # an OAuth 2.0 token as passcode (adapter/session/token_session.py)
        self._edition = edition  # whose ERROR texts (adapter/session/edition.py)
        self._rules = rules
        self._owner = owner  # who holds the connection slot and the client id (None: this login)
        self.peer_is_loopback = peer_is_loopback
        # login and passcode that replace CONNECT's (web_stomp.use_http_auth: the WebSocket
        # request's HTTP Basic credentials, else the default user, as the plugin forces them)
        self.forced_credentials: tuple[str, str] | None = None
        # the login and vhost the last CONNECT asked for, successful or not (for the close log line)
        self.requested_user: str | None = None
        self.requested_vhost: str | None = None
        # why the login failed, for the metrics (None: it did not)
        self.failure: str | None = None
        self._client_id: str | None = None

    @property
    def _holder(self) -> object:
        """Who holds the slot and the client id: ``owner``, else this login (a reference to
        itself kept as an attribute would be a cycle)."""
        return self if self._owner is None else self._owner

    def connect(self, frame: Frame) -> LoginSteps:
        """CONNECT or STOMP: stomp.max_connections, then the version, then the login."""
        if not self._admitted():
            return Refused("Bad CONNECT", NODE_LIMIT_REACHED)
        headers = frame.headers
        version = negotiate_version(headers.get("accept-version"))
        if version is None:
            return Refused(
                "Version mismatch", "Supported versions are " + ",".join(SUPPORTED_VERSIONS) + "\n"
            )
        if version == "1.0":
            # 1.0 header values are left-trimmed, the CONNECT frame included (docs/behaviour.md#limits)
            headers = {k: v.lstrip() for k, v in headers.items()}
        return (yield from self._login(version, headers))

    def implicit(self) -> LoginSteps:
        """docs/behaviour.md#authentication: a frame before CONNECT (stomp.implicit_connect) logs
        in with no headers as a 1.0 client."""
        if not self._admitted():
            return Refused("Bad CONNECT", NODE_LIMIT_REACHED)
        return (yield from self._login("1.0", {}))

    def _admitted(self) -> bool:
        """stomp.max_connections, checked first as the plugin does: the session takes its slot
        here (a login in progress counts, so the cap holds however many log in at once) and
        gives it back in close, whether the login succeeds or not."""
        cap = self._settings.registries.connection_cap
        if cap is None or cap.acquire(self._holder):
            return True
        self.failure = "max_connections"
        return False

    def _credentials(self, headers: dict[str, str]) -> tuple[str | None, str | None]:
        # docs/behaviour.md#authentication: a missing passcode falls back to the default passcode, a missing
        # login to the default user
        if self.forced_credentials is not None:
            if self._tokens is not None:
                self._tokens.handshake_token = None  # not used: the session keeps no copy of it
            return self.forced_credentials
        settings = self._settings
        login = headers.get("login")
        passcode = headers.get("passcode")
        if self._tokens is not None:
            # an OAuth 2.0 token: from the WebSocket handshake when CONNECT has no passcode, and
            # without a login header no default user (the broker's user is the token's subject)
            passcode, login = self._tokens.credentials(passcode, login)
        if login is not None:
            return login, passcode if passcode is not None else settings.default_pass
        return settings.default_user, passcode if passcode is not None else settings.default_pass

    def _login(self, version: str, headers: dict[str, str]) -> LoginSteps:
        user, password = self._credentials(headers)
        self.requested_user = user
        if user is None:
            self.failure = "missing_credentials"
            return Refused("Bad CONNECT", "Missing login or passcode header(s)")
        if user in self._settings.loopback_users and not self.peer_is_loopback:
            # RabbitMQ's loopback_users: the broker sees every connection coming from the
            # adapter's host, so the adapter applies the rule to the STOMP client's address
            self.failure = "loopback_only"
            return Refused("Bad CONNECT", "non-loopback access denied")
        vhost = headers.get("host", self._settings.default_vhost)
        self.requested_vhost = vhost
        try:
            client_heart_beat = heartbeat.parse_heart_beat(headers.get("heart-beat"))
        except heartbeat.HeartBeatError as error:
            return Refused("Processing error", str(error))
        if not _is_utf8(vhost) or len(vhost.encode("utf-8", "surrogateescape")) > 255:
            # no virtual host has such a name, and connection.open would carry it in a short
            # string the broker answers with a connection error (or that AMQP cannot carry at
            # all): the plugin's answer, unasked
            self.failure = "vhost"
            return Refused("Bad CONNECT", f"Virtual host '{vhost}' access denied")
        refusal = self._tokens.login_refusal(password) if self._tokens is not None else None
        if refusal is not None:
            # a token refused before it reaches the broker (adapter.oauth2_*: local validation)
            self.failure = "access_refused"
            return Refused("Bad CONNECT", refusal + "\n")
        if self._tokens is not None and self._tokens.subject:
            self.requested_user = self._tokens.subject  # the logs name a token's subject
        result = yield OpenConnection(user, password or "", vhost)
        assert isinstance(result, LoginResult)
        if not result.ok:
            self.failure = _FAILURES.get(result.failure or "", "broker_unavailable")
            if result.failure == "auth":
                return Refused("Bad CONNECT", self._edition.access_refused(user))
            if result.failure == "vhost":
                return Refused("Bad CONNECT", f"Virtual host '{vhost}' access denied")
            return Refused("Processing error", result.detail or "Processing error")
        self._rules.broker = result.broker  # the declare flags of this broker's plugin
        client_id = self._rules.client_id(headers)
        if client_id is not None:
            if not self._settings.registries.client_ids.claim(client_id, self._holder):
                return Refused(*client_id_in_use(client_id))
            self._client_id = client_id
        send_ms, receive_ms = heartbeat.negotiate(client_heart_beat, self._settings.min_client_heartbeat)
        # a token's user is its subject (the broker ignores the login header): the logs say so
        subject = self._tokens.subject if self._tokens is not None else None
        identity = Identity(subject or user, vhost, version, client_id)
        return Admitted(identity, result.server_version, send_ms, receive_ms)

    def connected_frame(self, admitted: Admitted, session_id: str, frames: Frames) -> bytes:
        headers = []
        if not self._settings.hide_server_info:
            headers.append(("server", admitted.server_version or "RabbitMQ"))
        headers += [
            ("session", session_id),
            ("heart-beat", f"{admitted.send_ms},{admitted.receive_ms}"),
            ("version", admitted.identity.version),
        ]
        # CONNECTED is never escaped (STOMP 1.2 "Value Encoding")
        return frames.encode(Command.CONNECTED, headers, escape_headers=False)

    def close(self) -> None:
        """The connection is gone: give back its client id and its stomp.max_connections slot."""
        if self._client_id is not None:
            self._settings.registries.client_ids.release(self._client_id, self._holder)
        cap = self._settings.registries.connection_cap
        if cap is not None:
            cap.release(self._holder)


def negotiate_version(accept: str | None) -> str | None:
    # split on "," without trimming; the highest supported version wins (docs/behaviour.md#authentication)
    offered = ["1.0"] if accept is None else accept.split(",")
    common = [v for v in SUPPORTED_VERSIONS if v in offered]
    return common[-1] if common else None


def _is_utf8(text: str) -> bool:
    """Whether a header value decoded with surrogateescape was valid UTF-8 on the wire."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
