"""OAuth 2.0 bearer tokens (JWTs) as STOMP passcodes: what the adapter reads of them, and checks.

Pure (no I/O once built; ``TokenValidator.from_files`` reads the operator's key file once, at
start-up).  Owns:

* ``read_claims``, ``TokenClaims``, ``refresh_refusal`` (adapter/mapping/tokens.py, re-exported):
  the claims read *without trusting them*, and the refresh rules.  The broker still decides.
* ``TokenValidator``: with ``adapter.oauth2_signing_key_file`` or ``adapter.oauth2_jwks_file``,
  the signature, ``exp``, ``nbf`` and audience checked before anything is opened on the broker,
  so forged tokens never reach it (PyJWT does the cryptography).
A token is a secret wherever a passcode is: nothing here logs one, and ``TokenClaims`` holds no
part of the token itself.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa
from cryptography.hazmat.primitives.serialization import load_pem_public_key

from ..mapping.tokens import (
    MAX_TOKEN_LENGTH,
    TOKEN_DESTINATION,
    TokenClaims,
    read_claims,
    refresh_refusal,
)

__all__ = [
    "KEY_FILE_ERRORS",
    "MAX_TOKEN_LENGTH",
    "TOKEN_DESTINATION",
    "TokenClaims",
    "TokenValidator",
    "read_claims",
    "refresh_refusal",
]

# what reading a key file may raise: the file, its PEM or JSON, PyJWT's JWKS errors
KEY_FILE_ERRORS = (OSError, ValueError, TypeError, jwt.PyJWTError)
# seconds of clock difference forgiven when checking nbf and iat locally (the issuer's clock
# may run ahead of the adapter's); never for exp: a session must not outlive its token
SKEW_SECONDS = 5.0


# the algorithms a public key may verify; never HMAC with a public key's bytes
def _algorithms_for(key: object) -> list[str]:
    if isinstance(key, rsa.RSAPublicKey):
        return ["RS256", "RS384", "RS512", "PS256", "PS384", "PS512"]
    if isinstance(key, ec.EllipticCurvePublicKey):
        return ["ES256", "ES384", "ES512"]
    if isinstance(key, ed25519.Ed25519PublicKey | ed448.Ed448PublicKey):
        return ["EdDSA"]
    raise ValueError(f"unsupported signing key type {type(key).__name__}")


@dataclass(frozen=True, slots=True)
class _Key:
    key: Any
    algorithms: tuple[str, ...]


class TokenValidator:
    """Checks a token's signature, ``exp``, ``nbf`` and audience with the operator's keys
    before the broker sees it.  ``refusal(token)`` says why a token is refused (None: valid)."""

    __slots__ = ("_keys", "_default", "_any_kid", "_audience")

    def __init__(
        self, keys: Mapping[str, _Key], default: str | None, audience: str | None, *, any_kid: bool = False
    ) -> None:
        self._keys = dict(keys)
        self._default = default  # the key id of a token without ``kid``
        # the default key whatever the token's kid (a PEM file's key has no kid to match);
        # in a JWKS a kid that matches no key is an unknown key, never the single key's
        self._any_kid = any_kid
        self._audience = audience

    def __repr__(self) -> str:
        return f"TokenValidator(keys={sorted(self._keys)!r}, audience={self._audience!r})"

    @classmethod
    def from_pem(cls, pem: bytes, audience: str | None) -> TokenValidator:
        key = load_pem_public_key(pem)
        return cls({"": _Key(key, tuple(_algorithms_for(key)))}, "", audience, any_kid=True)

    @classmethod
    def from_jwks(cls, jwks: bytes, audience: str | None) -> TokenValidator:
        """The signing keys of a JWKS document; ``ValueError`` naming what is wrong with it (the
        operator's file, read at start-up: a ConfigError there, never a traceback)."""
        try:
            document = json.loads(jwks)
        except (ValueError, RecursionError):
            raise ValueError("the JWKS file is not JSON") from None
        entries = document.get("keys") if isinstance(document, dict) else None
        if not isinstance(entries, list):
            raise ValueError('the JWKS file is not an object with a "keys" list')
        keys: dict[str, _Key] = {}
        for number, entry in enumerate(entries):
            if not isinstance(entry, dict):
                raise ValueError(f"key {number} of the JWKS file is not an object")
            if entry.get("kty") == "oct":
                continue  # a shared secret is not a signing key the adapter may hold
            if entry.get("use", "sig") != "sig":
                continue  # an encryption key ("use": "enc") signs nothing
            algorithm = entry.get("alg")
            if algorithm is not None and (
                not isinstance(algorithm, str) or algorithm == "none" or algorithm.startswith("HS")
            ):
                raise ValueError(
                    f"key {number} of the JWKS file has alg {algorithm!r}: not a signing algorithm"
                )
            try:
                jwk = jwt.PyJWK(entry)
                key = _Key(jwk.key, (algorithm,) if algorithm else tuple(_algorithms_for(jwk.key)))
            except (jwt.PyJWTError, ValueError, TypeError, KeyError, NotImplementedError) as error:
                raise ValueError(f"key {number} of the JWKS file cannot be used: {error}") from None
            kid = entry.get("kid")
            keys[kid if isinstance(kid, str) and kid else str(number)] = key
        if not keys:
            raise ValueError("the JWKS file has no public signing key")
        return cls(keys, next(iter(keys)) if len(keys) == 1 else None, audience)

    @classmethod
    def from_files(
        cls, pem_file: str | None, jwks_file: str | None, audience: str | None
    ) -> TokenValidator | None:
        """The validator the settings ask for (None: no key configured, no local check)."""
        if jwks_file is not None:
            with open(jwks_file, "rb") as file:
                return cls.from_jwks(file.read(), audience)
        if pem_file is not None:
            with open(pem_file, "rb") as file:
                return cls.from_pem(file.read(), audience)
        return None

    def refusal(self, token: str) -> str | None:
        """Why ``token`` is not valid (words for the client's ERROR), or None."""
        claims = read_claims(token)  # bounded: PyJWT never decodes what nests too deeply
        if claims is None:
            return "The token is malformed"
        if claims.defect is not None:
            return claims.defect
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            return "The token is malformed"
        kid = header.get("kid")
        key = self._keys.get(kid) if isinstance(kid, str) else None
        if key is None and self._default is not None and (kid is None or self._any_kid):
            key = self._keys[self._default]  # a token without kid and a single key, or the PEM's
        if key is None:
            return "The token is signed with an unknown key"
        try:
            jwt.decode(
                token,
                key.key,
                algorithms=list(key.algorithms),
                audience=self._audience,
                leeway=SKEW_SECONDS,
                # exp is checked below, without the leeway
                options={"require": ["exp"], "verify_aud": self._audience is not None, "verify_exp": False},
            )
        except jwt.ImmatureSignatureError as error:
            if "(iat)" in str(error):
                return "The token was issued in the future (iat)"
            return "The token is not valid yet (nbf)"
        except (jwt.InvalidAudienceError, jwt.MissingRequiredClaimError) as error:
            return f"The token is refused: {error}"
        except jwt.InvalidAlgorithmError:
            return "The token's algorithm is not allowed for its key"
        except jwt.InvalidSignatureError:
            return "The token's signature is invalid"
        except (jwt.PyJWTError, ValueError, OverflowError, RecursionError):
            return "The token is malformed"
        if claims.expires_at is None:
            return "The token's exp is not a time"
        if claims.expires_at <= time.time():
            return "The token has expired"
        return None
