"""Fixtures of tests/oauth2: one private RabbitMQ node with the oauth2 backend for the whole
test session (package scope: stopped once the last test here has run), the key that signs
its tokens, and in-process adapters in front of it.  Without RabbitMQ installed or root (the
node runs as the rabbitmq user) every test here fails and says what is missing."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.rabbit import ClusterUnavailable, RabbitNode, remove_private_node
from tests.oauth2.oauth2_node import TokenIssuer, start_oauth2_node
from tests.support import AdapterProcess, RawSession


@pytest.fixture(scope="package")
def issuer() -> TokenIssuer:
    return TokenIssuer()


@pytest.fixture(scope="package")
def oauth2_node(issuer: TokenIssuer) -> Iterator[RabbitNode]:
    try:
        node = start_oauth2_node(issuer)
    except ClusterUnavailable as error:
        pytest.fail(str(error), pytrace=False)
    try:
        yield node
    finally:
        remove_private_node(node)


@pytest.fixture
def key_file(issuer: TokenIssuer, tmp_path: Path) -> str:
    """The signing key's public half as a PEM file, for adapter.oauth2_signing_key_file."""
    path = tmp_path / "signing-key.pem"
    path.write_bytes(issuer.public_pem())
    return str(path)


@pytest.fixture
def oauth2_adapter(oauth2_node: RabbitNode) -> Iterator[Callable[..., AdapterProcess]]:
    """Factory of in-process adapters in front of the oauth2 node: ``oauth2_adapter(**settings)``."""
    started: list[AdapterProcess] = []

    def start(**settings: Any) -> AdapterProcess:
        server = AdapterProcess(oauth2_node.url, **settings)
        server.start()
        started.append(server)
        return server

    yield start
    RawSession.close_opened()
    for server in started:
        server.stop()
