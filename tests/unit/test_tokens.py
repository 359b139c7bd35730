"""OAuth 2.0 tokens without a broker: the claims read untrusted, local validation (hostile tokens
first), the refresh rules and the session part's operations, and the places a token must never
appear (reprs, tap recordings)."""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from adapter.mapping import operations as ops
from adapter.server.handshake_token import SUBPROTOCOL_PREFIX, handshake_token
from adapter.session import Session, SessionSettings
from adapter.session.frames import Frames
from adapter.session.token_session import TokenRefused, TokenSession
from adapter.session.tokens import TokenClaims, TokenValidator, read_claims, refresh_refusal
from adapter.stomp.frame import Frame
from tests.unit.test_tap_recorder import Sink, direction

KEY = rsa.generate_private_key(65537, 2048)
OTHER_KEY = rsa.generate_private_key(65537, 2048)
PEM = KEY.public_key().public_bytes(
    serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
)


def mint(
    key: Any = KEY, algorithm: str = "RS256", headers: dict[str, Any] | None = None, **claims: Any
) -> str:
    payload = {"sub": "alice", "aud": ["rabbitmq"], "scope": "rabbitmq.read:*/*", "exp": time.time() + 60}
    payload.update(claims)
    return jwt.encode(
        {k: v for k, v in payload.items() if v is not None}, key, algorithm=algorithm, headers=headers
    )


def b64(value: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()


# --------------------------------------------------------------------------- reading, untrusted
def test_claims_are_read_from_a_jwt_and_a_password_is_no_token() -> None:
    claims = read_claims(mint(exp=2_000_000_000, scope="a b", aud="rabbitmq"))
    assert claims == TokenClaims("alice", 2_000_000_000.0, ("a", "b"), ("rabbitmq",), names=("alice", None))
    # the broker's user is client_id when the token has one
    assert read_claims(mint(client_id="svc")).subject == "svc"  # type: ignore[union-attr]
    for password in ("guest", "", None, "a.b", "a.b.c", "x" * 20_000, f"{b64([1])}.{b64({})}.s"):
        assert read_claims(password) is None, password
    # a header without alg, claims that are not an object: not a token
    assert read_claims(f"{b64({'typ': 'JWT'})}.{b64({'sub': 'a'})}.s") is None
    assert read_claims(f"{b64({'alg': 'RS256'})}.{b64(['sub'])}.s") is None
    # odd claims are read as absent, never raised on
    odd = read_claims(f"{b64({'alg': 'none'})}.{b64({'exp': True, 'scope': 7})}.")
    assert odd == TokenClaims("", None, (), ())
    # but a subject that is not a string is no subject the adapter could compare: refused
    for claims in ({"sub": 5}, {"sub": "a", "client_id": ["a"]}):
        odd = read_claims(f"{b64({'alg': 'none'})}.{b64(claims)}.")
        assert odd is not None and odd.defect and "not a string" in odd.defect, claims


def _unsigned(payload_json: str, header: object = None) -> str:
    """A JWT-shaped passcode whose claims are ``payload_json`` as it is (unsigned)."""
    payload = base64.urlsafe_b64encode(payload_json.encode()).rstrip(b"=").decode()
    return f"{b64(header or {'alg': 'RS256'})}.{payload}.c2ln"


HOSTILE_CLAIMS = {
    "exp 10^400": '{"sub":"a","exp":1' + "0" * 400 + "}",
    "exp 1e400 (infinite)": '{"sub":"a","exp":1e400}',
    "exp -1e400": '{"sub":"a","exp":-1e400}',
    "exp NaN": '{"sub":"a","exp":NaN}',
    "exp past the bound": '{"sub":"a","exp":1e15}',
    "nbf 10^400": '{"sub":"a","exp":2000000000,"nbf":1' + "0" * 400 + "}",
    "iat infinite": '{"sub":"a","exp":2000000000,"iat":Infinity}',
    "nested lists": '{"sub":"a","x":' + "[" * 6000 + "]" * 6000 + "}",
    "nested objects": '{"sub":"a","x":' + '{"a":' * 1500 + "1" + "}" * 1500 + "}",
}


@pytest.mark.parametrize("name", list(HOSTILE_CLAIMS))
def test_hostile_claims_are_refused_never_raised_on(name: str) -> None:
    """Unauthenticated input: a number too big for a float, infinities, nesting deep enough to
    exhaust the recursion limit.  Read as a token with a defect, which every check refuses
    (with or without local validation) before the broker sees it."""
    token = _unsigned(HOSTILE_CLAIMS[name])
    claims = read_claims(token)
    assert claims is not None and claims.defect, name
    assert claims.expires_at is None or claims.expires_at < 10**11
    sessions = TokenSession(None), TokenSession(TokenValidator.from_pem(PEM, None))
    for session in sessions:
        assert session.login_refusal(token) == claims.defect
    assert TokenValidator.from_pem(PEM, None).refusal(token)  # PyJWT never sees it raise either
    # in the handshake it is as a token (then refused at CONNECT), never an exception
    assert handshake_token({"authorization": f"Bearer {token}"}, [], None) == token


def test_a_sane_token_with_some_nesting_has_no_defect() -> None:
    nested = {"resource_access": {"app": {"roles": [["a"], ["b"]]}}, "exp": 2_000_000_000, "sub": "a"}
    claims = read_claims(_unsigned(json.dumps(nested)))
    assert claims is not None and claims.defect is None and claims.expires_at == 2_000_000_000.0


# --------------------------------------------------------------------------- local validation
def test_hostile_tokens_are_refused_by_local_validation() -> None:
    validator = TokenValidator.from_pem(PEM, "rabbitmq")
    assert validator.refusal(mint()) is None
    hostile = {
        "forged": mint(OTHER_KEY),
        "expired": mint(exp=time.time() - 1),
        "not yet": mint(nbf=time.time() + 60),
        "no exp": mint(exp=None),
        "other audience": mint(aud=["elsewhere"]),
        "alg none": jwt.encode(
            {"sub": "alice", "exp": time.time() + 60, "aud": "rabbitmq"}, None, algorithm="none"
        ),
        # HMAC keyed with the public key's bytes: the algorithm confusion attack
        "hs256 with the public key": _hs256_with(PEM),
        "garbage": "a.b.c",
        "truncated": mint()[:-10],
    }
    refusals = {name: validator.refusal(token) for name, token in hostile.items()}
    assert all(refusals.values()), refusals
    assert refusals["forged"] == "The token's signature is invalid"
    assert refusals["expired"] == "The token has expired"
    assert refusals["not yet"] == "The token is not valid yet (nbf)"
    assert "audience" in (refusals["other audience"] or "").lower()


def test_local_validation_forgives_a_few_seconds_of_clock_skew_on_nbf_and_iat_but_not_exp() -> None:
    """The issuer's clock may run a little ahead of the adapter's: a token minted "now" there
    has an iat (and often an nbf) a second in the adapter's future.  exp gets no leeway: a
    session must not outlive its token."""
    validator = TokenValidator.from_pem(PEM, None)
    now = time.time()
    assert validator.refusal(mint(nbf=now + 2, iat=now + 2)) is None
    assert validator.refusal(mint(nbf=now + 60)) == "The token is not valid yet (nbf)"
    assert validator.refusal(mint(iat=now + 60)) == "The token was issued in the future (iat)"
    assert validator.refusal(mint(exp=now - 1)) == "The token has expired"


def _hs256_with(secret: bytes) -> str:
    header = b64({"alg": "HS256", "typ": "JWT"})
    payload = b64({"sub": "alice", "exp": time.time() + 60, "aud": "rabbitmq"})
    import hashlib
    import hmac

    signature = hmac.new(secret, f"{header}.{payload}".encode(), hashlib.sha256).digest()
    return f"{header}.{payload}.{base64.urlsafe_b64encode(signature).rstrip(b'=').decode()}"


def test_a_jwks_file_picks_the_key_by_kid_and_refuses_unknown_ones() -> None:
    ec_key = ec.generate_private_key(ec.SECP256R1())
    jwks = {
        "keys": [
            {**json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(KEY.public_key())), "kid": "r", "alg": "RS256"},
            {**json.loads(jwt.algorithms.ECAlgorithm.to_jwk(ec_key.public_key())), "kid": "e"},
        ]
    }
    validator = TokenValidator.from_jwks(json.dumps(jwks).encode(), None)
    assert validator.refusal(mint(headers={"kid": "r"})) is None
    assert validator.refusal(mint(ec_key, "ES256", headers={"kid": "e"})) is None
    assert validator.refusal(mint(headers={"kid": "e"})) is not None  # RS256 on the EC key
    assert validator.refusal(mint(headers={"kid": "x"})) == "The token is signed with an unknown key"
    assert validator.refusal(mint()) == "The token is signed with an unknown key"  # no kid, two keys
    assert "PRIVATE" not in repr(validator) and "keys=['e', 'r']" in repr(validator)


def test_no_key_file_means_no_local_validation(tmp_path: Any) -> None:
    assert TokenValidator.from_files(None, None, "rabbitmq") is None
    path = tmp_path / "key.pem"
    path.write_bytes(PEM)
    validator = TokenValidator.from_files(str(path), None, None)
    assert validator is not None and validator.refusal(mint(aud=["anything"])) is None


# --------------------------------------------------------------------------- the refresh rules
def test_refresh_rules_the_broker_does_not_check() -> None:
    now = 1_000.0
    current = TokenClaims("alice", now + 10)
    assert refresh_refusal(current, TokenClaims("alice", now + 100), now) is None
    assert "another subject" in (refresh_refusal(current, TokenClaims("bob", now + 100), now) or "")
    assert "expired" in (refresh_refusal(current, TokenClaims("alice", now - 1), now) or "")
    # sub and client_id each, a missing one a value of its own: the subject the broker uses
    # (client_id, else sub) is not all the token names
    both = read_claims(mint(client_id="svc", sub="alice", exp=now + 10))
    assert both is not None
    for other, same in (
        ({"client_id": "svc", "sub": "alice"}, True),
        ({"client_id": "svc", "sub": "mallory"}, False),
        ({"client_id": "svc", "sub": None}, False),
        ({"client_id": None, "sub": "svc"}, False),
    ):
        new = read_claims(mint(exp=now + 100, **other))  # type: ignore[arg-type]
        assert new is not None
        refusal = refresh_refusal(both, new, now)
        assert (refusal is None) is same, (other, refusal)


def _drive(steps: Any, answers: dict[type, object]) -> list[ops.Operation]:
    out: list[ops.Operation] = []
    result: object = None
    while True:
        try:
            op = steps.send(result)
        except StopIteration:
            return out
        out.append(op)
        result = answers.get(type(op))


def test_the_session_part_refreshes_with_update_secret_then_receipts() -> None:
    clock = [1_000.0]
    tokens = TokenSession(None, lambda: clock[0])
    first = mint(exp=1_100)
    assert tokens.login_refusal("guest") is None and tokens.claims is None  # a password
    assert tokens.login_refusal(first) is None and tokens.subject == "alice"
    assert list(tokens.established()) == [ops.TokenExpiry(1_100.0)]
    frames = Frames({}, "s-1", True)
    second = mint(exp=1_200)
    frame = Frame("SEND", {"destination": "/auth/token", "receipt": "r1"}, second.encode())
    out = _drive(tokens.refresh(frame, frames), {})
    assert out[0] == ops.UpdateSecret(second) and out[1] == ops.TokenExpiry(1_200.0)
    assert isinstance(out[2], ops.SendFrame) and out[2].data.startswith(b"RECEIPT\nreceipt-id:r1\n")
    # the broker refused it: an ERROR, the claims unchanged
    third = Frame("SEND", {"destination": "/auth/token"}, mint(exp=1_300).encode())
    with pytest.raises(TokenRefused, match="Token refused"):
        _drive(tokens.refresh(third, frames), {ops.UpdateSecret: "NOT_ALLOWED"})
    assert tokens.claims is not None and tokens.claims.expires_at == 1_200.0
    # the expiry: only once exp has passed (a timer a little early is forgiven)
    assert tokens.expired() is None
    clock[0] = 1_199.9
    assert tokens.expired() is not None


def test_a_refresh_after_exp_is_refused_and_one_received_before_exp_is_waited_for() -> None:
    clock = [1_000.0]
    tokens = TokenSession(None, lambda: clock[0])
    assert tokens.login_refusal(mint(exp=1_100)) is None
    frames = Frames({}, "s-1", True)
    # received before exp: the broker's answer comes after exp, and the timer must not end
    # the session meanwhile (the answer's TokenExpiry arms it again)
    steps = tokens.refresh(Frame("SEND", {"destination": "/auth/token"}, mint(exp=1_300).encode()), frames)
    assert isinstance(next(steps), ops.UpdateSecret)
    clock[0] = 1_100.5
    assert tokens.refresh_pending and tokens.expired() is None
    assert steps.send(None) == ops.TokenExpiry(1_300.0)
    assert not tokens.refresh_pending
    # received after exp: refused, the session's token is gone
    clock[0] = 1_300.0
    late = Frame("SEND", {"destination": "/auth/token"}, mint(exp=1_400).encode())
    with pytest.raises(TokenRefused, match="Token refused") as refused:
        _drive(tokens.refresh(late, frames), {})
    assert "already expired" in refused.value.detail
    assert not tokens.refresh_pending


def test_a_token_never_appears_in_a_repr() -> None:
    token = mint()
    assert token not in repr(ops.UpdateSecret(token))
    assert token not in repr(ops.OpenConnection("", token, "/"))
    tokens = TokenSession(None)
    tokens.login_refusal(token)
    assert token not in repr(tokens) and "alice" in repr(tokens)


def test_a_session_routes_a_send_to_auth_token_to_its_token_and_never_publishes_it() -> None:
    session = Session(SessionSettings(), session_id="s-1", peer_is_loopback=True)
    token = mint(exp=time.time() + 60)
    connect = Frame("CONNECT", {"accept-version": "1.2", "passcode": token, "login": ""}, b"")
    login_ops = _drive(session.handle_frame(connect), {ops.OpenConnection: ops.LoginResult(True)})
    assert any(isinstance(op, ops.TokenExpiry) for op in login_ops)
    assert session.user == "alice"  # the token's subject, for the logs
    refresh = Frame(
        "SEND", {"destination": "/auth/token", "receipt": "r"}, mint(exp=time.time() + 120).encode()
    )
    assert session.quick_send(refresh) is None
    out = _drive(session.handle_frame(refresh), {})
    assert [type(op) for op in out] == [ops.UpdateSecret, ops.TokenExpiry, ops.SendFrame]
    assert not any(isinstance(op, ops.BasicPublish) for op in out)


# --------------------------------------------------------------------------- tap recordings
def test_the_tap_records_a_refresh_body_as_stars() -> None:
    sink = Sink()
    recorder = direction(sink, bodies=True)
    token = mint()
    recorder.feed(f"SEND\ndestination:/auth/token\r\nreceipt:r\n\n{token}\0".encode(), 1.0)
    recorder.feed(b"SEND\ndestination:/queue/a\n\nkept\0", 2.0)
    bodies = [base64.b64decode(record["body"]) for record in sink.frames()]
    assert bodies == [b"***", b"kept"]


@pytest.mark.parametrize(
    "line",
    [
        "destination: /auth/token",  # STOMP 1.0 trims a value's leading white space (the codec's lstrip)
        "destination:\t /auth/token",
        "destination:\u00a0/auth/token",  # white space to str.lstrip, as the codec decodes it
        "destination:/auth/token ",  # over-redacted: not a refresh, but no harm
        "destination:/auth/token\r",
    ],
)
def test_the_tap_records_a_stomp_10_refresh_body_as_stars(line: str) -> None:
    sink = Sink()
    recorder = direction(sink, bodies=True)
    token = mint()
    recorder.feed(f"SEND\nreceipt:r\n{line}\n\n{token}\0".encode(), 1.0)
    recorder.feed(b"SEND\ndestination:/queue/auth/token\nx:destination:/auth/token\n\nkept\0", 2.0)
    bodies = [base64.b64decode(record["body"]) for record in sink.frames()]
    assert bodies == [b"***", b"kept"]


# --------------------------------------------------------------------------- the WebSocket handshake
def test_the_handshake_token_is_read_from_its_three_carriers_and_nothing_else() -> None:
    token = mint()
    encoded = base64.urlsafe_b64encode(token.encode()).rstrip(b"=").decode()
    assert handshake_token({"authorization": f"Bearer {token}"}, [], None) == token
    assert handshake_token({"authorization": f"bearer  {token} "}, [], None) == token
    assert handshake_token({"cookie": f"a=1; stomp_token={token}; b=2"}, [], "stomp_token") == token
    assert handshake_token({}, ["v12.stomp", SUBPROTOCOL_PREFIX + encoded], None) == token
    # the first carrier wins; a cookie is only read when one is configured
    second = mint(sub="bob")
    assert handshake_token({"authorization": f"Bearer {token}", "cookie": f"t={second}"}, [], "t") == token
    assert handshake_token({"authorization": "Bearer abc", "cookie": f"t={second}"}, [], "t") == second
    assert handshake_token({"cookie": f"stomp_token={token}"}, [], None) is None
    hostile: list[tuple[dict[str, str], list[str]]] = [
        ({"authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="}, []),
        ({"authorization": "Bearer " + "x" * 20_000}, []),
        ({"authorization": "Bearer "}, []),
        ({"authorization": "Bearer not-a-jwt"}, []),
        ({"cookie": "stomp_token=caf\u00e9"}, []),
        ({}, [SUBPROTOCOL_PREFIX + "!!!not base64"]),
        ({}, [SUBPROTOCOL_PREFIX + base64.urlsafe_b64encode("t\u00e9".encode()).decode()]),
        ({}, [SUBPROTOCOL_PREFIX]),
    ]
    for headers, protocols in hostile:
        assert handshake_token(headers, protocols, "stomp_token") is None, (headers, protocols)


def test_the_handshake_token_is_the_passcode_of_a_connect_without_one() -> None:
    session = Session(SessionSettings(), session_id="s-1", peer_is_loopback=False)
    token = mint(exp=time.time() + 60)
    session.tokens.handshake_token = token
    # no login header: no default user either (guest's loopback_users rule would refuse it)
    logged_in = {ops.OpenConnection: ops.LoginResult(True)}
    out = _drive(session.handle_frame(Frame("CONNECT", {"accept-version": "1.2"}, b"")), logged_in)
    assert out[0] == ops.OpenConnection("", token, "/")
    # a CONNECT with its own passcode keeps it
    other = Session(SessionSettings(), session_id="s-2", peer_is_loopback=True)
    other.tokens.handshake_token = token
    connect = Frame("CONNECT", {"accept-version": "1.2", "login": "u", "passcode": "p"}, b"")
    assert _drive(other.handle_frame(connect), logged_in)[0] == ops.OpenConnection("u", "p", "/")
    assert other.tokens.handshake_token is None  # used or not, the session keeps no copy
    # use_http_auth's forced credentials win, and the handshake's token is not kept either
    forced = Session(SessionSettings(), session_id="s-3", peer_is_loopback=True)
    forced.tokens.handshake_token = token
    forced.forced_credentials = ("guest", "guest")
    assert _drive(forced.handle_frame(connect), logged_in)[0] == ops.OpenConnection("guest", "guest", "/")
    assert forced.tokens.handshake_token is None


def test_a_key_file_that_cannot_be_used_stops_start_up_naming_the_setting(tmp_path: Any) -> None:
    from adapter.cli import token_validator
    from adapter.config import ConfigError, Settings

    bad = tmp_path / "bad.pem"
    bad.write_text("not a key")
    jwks = tmp_path / "keys.json"
    jwks.write_text('{"keys": [{"kty": "oct", "k": "c2VjcmV0"}]}')
    for settings, named in (
        (Settings(oauth2_signing_key_file=str(bad)), "adapter.oauth2_signing_key_file"),
        (Settings(oauth2_signing_key_file=str(tmp_path / "missing.pem")), "adapter.oauth2_signing_key_file"),
        (Settings(oauth2_jwks_file=str(jwks)), "adapter.oauth2_jwks_file"),
    ):
        with pytest.raises(ConfigError, match=named):
            token_validator(settings)
    assert token_validator(Settings()) is None


@pytest.mark.parametrize(
    "document",
    [
        "[]",
        '"keys"',
        '{"keys": "x"}',
        '{"keys": [5]}',
        '{"keys": [{"kty": "RSA"}]}',
        "RSA_ALG_NONE",
        "RSA_ALG_HS256",
        "ONLY_ENC",
        "{not json",
    ],
)
def test_a_hostile_jwks_file_stops_start_up_with_a_config_error(tmp_path: Any, document: str) -> None:
    from adapter.cli import token_validator
    from adapter.config import ConfigError, Settings

    rsa_jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(KEY.public_key()))
    named = {
        "RSA_ALG_NONE": {"keys": [{**rsa_jwk, "alg": "none"}]},
        "RSA_ALG_HS256": {"keys": [{**rsa_jwk, "alg": "HS256"}]},
        "ONLY_ENC": {"keys": [{**rsa_jwk, "use": "enc"}]},
    }
    path = tmp_path / "keys.json"
    path.write_text(json.dumps(named[document]) if document in named else document)
    with pytest.raises(ConfigError, match="adapter.oauth2_jwks_file"):
        token_validator(Settings(oauth2_jwks_file=str(path)))


def test_encryption_keys_are_no_signing_keys_and_a_kid_never_falls_back() -> None:
    rsa_jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(KEY.public_key()))
    other_jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(OTHER_KEY.public_key()))
    jwks = {"keys": [{**other_jwk, "kid": "e", "use": "enc"}, {**rsa_jwk, "kid": "s", "use": "sig"}]}
    validator = TokenValidator.from_jwks(json.dumps(jwks).encode(), None)
    assert validator.refusal(mint(headers={"kid": "s"})) is None
    assert (
        validator.refusal(mint(OTHER_KEY, headers={"kid": "e"})) == "The token is signed with an unknown key"
    )
    # one signing key: a token without kid uses it, one naming another kid does not
    assert validator.refusal(mint()) is None
    assert validator.refusal(mint(headers={"kid": "elsewhere"})) == "The token is signed with an unknown key"
    # a PEM file's key names no kid: any token's kid is checked with it
    assert TokenValidator.from_pem(PEM, None).refusal(mint(headers={"kid": "anything"})) is None


def test_a_token_cookie_without_an_origin_list_stops_start_up_naming_both_settings() -> None:
    """A browser sends a site's cookies with a WebSocket opened by any other site: without
    web_stomp.allow_origins, a token cookie would log a hostile page in as the user."""
    from adapter.cli import web_listeners
    from adapter.config import ConfigError, Settings

    hijackable = Settings(web_stomp_listeners=["127.0.0.1:0"], web_stomp_token_cookie="token")
    with pytest.raises(ConfigError, match="adapter.web_stomp_token_cookie") as refused:
        web_listeners(hijackable)
    assert "web_stomp.allow_origins" in str(refused.value)
    checked = Settings(
        web_stomp_listeners=["127.0.0.1:0"],
        web_stomp_token_cookie="token",
        web_stomp_allow_origins=("https://app.example.com",),
    )
    assert web_listeners(checked)[0].settings.token_cookie == "token"


# --------------------------------------------------------------------------- the Spark connector
def test_the_spark_refresher_is_due_a_third_of_the_life_before_exp_and_waits_for_a_rotation(
    tmp_path: Any,
) -> None:
    from adapter.spark.tokens import RETRY_SECONDS, TokenRefresher, TokenSource

    clock = [1_000.0]
    path = tmp_path / "token"
    first = mint(exp=1_090)
    path.write_text(first + "\n")
    refresher = TokenRefresher(TokenSource(token_file=str(path)), first, lambda: clock[0])
    assert refresher.next_token() is None  # due at 1_060 (a third of 90 s before exp)
    clock[0] = 1_060.0
    assert refresher.next_token() is None  # the file still holds the same token: retried later
    second = mint(exp=2_000)
    path.write_text(second)
    assert refresher.next_token() is None
    clock[0] += RETRY_SECONDS
    assert refresher.next_token() == second
    refresher.refreshed(second)
    assert refresher.next_token() is None  # due 60 s before 2_000 now
    clock[0] = 1_940.0
    path.write_text(mint(exp=3_000))
    assert refresher.next_token() is not None
    assert first not in repr(refresher) and second not in repr(TokenSource(token=second))
