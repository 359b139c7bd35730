"""A private RabbitMQ node whose users are OAuth 2.0 tokens, and the tokens the tests mint.

One stand-alone node (tests/cluster/rabbit.py ``private_node``: its own name, free ports picked at
run time, its own data directory, run as the ``rabbitmq`` user) with
``rabbitmq_auth_backend_oauth2`` first and the internal backend second (so ``guest`` still
works, for the tests' independent AMQP client), and a static signing key made by the test
(``auth_oauth2.signing_keys.<kid>``, RabbitMQ 3.10's way).  Tokens are minted with PyJWT.
"""

from __future__ import annotations

import shutil
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.cluster.rabbit import USER, RabbitNode, private_node, remove_private_node

RESOURCE = "rabbitmq"  # auth_oauth2.resource_server_id: the audience, and the scopes' prefix
KID = "stomp-test-key"
ALL_RIGHTS = (f"{RESOURCE}.configure:*/*", f"{RESOURCE}.read:*/*", f"{RESOURCE}.write:*/*")
NO_WRITE = (f"{RESOURCE}.configure:*/*", f"{RESOURCE}.read:*/*")


@dataclass
class TokenIssuer:
    """An RSA key pair: the public half is the broker's (and the adapter's) signing key."""

    key: rsa.RSAPrivateKey = field(default_factory=lambda: rsa.generate_private_key(65537, 2048))

    def public_pem(self) -> bytes:
        return self.key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )

    def mint(
        self,
        sub: str = "alice",
        scopes: tuple[str, ...] = ALL_RIGHTS,
        ttl: float = 300.0,
        *,
        audience: str = RESOURCE,
        key: rsa.RSAPrivateKey | None = None,
        **claims: Any,
    ) -> str:
        now = time.time()
        payload = {
            "sub": sub,
            "aud": [audience],
            "scope": " ".join(scopes),
            "iat": int(now),
            "exp": now + ttl,
            "jti": uuid.uuid4().hex,
            **claims,
        }
        return jwt.encode(payload, key or self.key, algorithm="RS256", headers={"kid": KID})


def start_oauth2_node(issuer: TokenIssuer) -> RabbitNode:
    node, _ = private_node("stomp-oauth2", plugins=("rabbitmq_auth_backend_oauth2",))
    node.directory.mkdir()
    key_file = node.directory / "signing-key.pem"
    key_file.write_bytes(issuer.public_pem())
    node.config_lines = (
        "auth_backends.1 = rabbit_auth_backend_oauth2",
        "auth_backends.2 = rabbit_auth_backend_internal",
        f"auth_oauth2.resource_server_id = {RESOURCE}",
        f"auth_oauth2.signing_keys.{KID} = {key_file}",
        f"auth_oauth2.default_key = {KID}",
    )
    _write_files(node)
    try:
        node.start()
        node.wait_started()
    except BaseException:
        remove_private_node(node)
        raise
    return node


def _write_files(node: RabbitNode) -> None:
    """``RabbitNode.write_files`` into a directory that already holds the key file."""
    d = node.directory
    (d / "rabbitmq.conf").write_text(
        "# a private node (tests/oauth2/oauth2_node.py)\n"
        f"listeners.tcp.1 = 127.0.0.1:{node.amqp_port}\n" + "".join(f"{line}\n" for line in node.config_lines)
    )
    (d / "enabled_plugins").write_text(f"[{','.join(node.plugins)}].\n")
    (d / "rabbitmq-env.conf").write_text("")
    for path in (d, *d.iterdir()):
        shutil.chown(path, USER, USER)


def connection_users(node: RabbitNode) -> list[str]:
    """The user of every AMQP connection the node has now (rabbitmqctl list_connections)."""
    out = node.ctl("list_connections", "user", "--no-table-headers", "--quiet").stdout
    return [line.strip() for line in out.splitlines() if line.strip()]
