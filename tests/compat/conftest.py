"""Fixtures of the compatibility suite: RabbitMQ's STOMP plugin, the management API, ``compat``.

The plugin must be listening on 127.0.0.1:61613 and the management API on 127.0.0.1:15672
(CI: ``rabbitmq-plugins enable rabbitmq_stomp rabbitmq_management``).  If either is missing the
tests FAIL with a message saying so: they are never skipped, so a CI run cannot pass without
comparing anything.  ``STOMP_PLUGIN_PORT`` and ``RABBITMQ_MANAGEMENT_URL`` override the defaults.
"""

from __future__ import annotations

import os
import socket
import urllib.request
from collections.abc import Callable, Iterable, Iterator

import pytest

from tests.compat.conversation import Broker, Conversation, Difference, Transcript, compare
from tests.support import AdapterProcess

PLUGIN_PORT = int(os.environ.get("STOMP_PLUGIN_PORT", "61613"))
WEB_PLUGIN_PORT = int(os.environ.get("WEB_STOMP_PLUGIN_PORT", "15674"))
MANAGEMENT_URL = os.environ.get("RABBITMQ_MANAGEMENT_URL", "http://127.0.0.1:15672")

_ENABLE = "enable them with `rabbitmq-plugins enable rabbitmq_stomp rabbitmq_management rabbitmq_web_stomp`"


@pytest.fixture(scope="session")
def plugin_port() -> int:
    try:
        with socket.create_connection(("127.0.0.1", PLUGIN_PORT), timeout=2) as sock:
            sock.sendall(b"CONNECT\naccept-version:1.2\nlogin:guest\npasscode:guest\n\n\0")
            sock.settimeout(5)
            answer = sock.recv(4096)
    except OSError as error:
        pytest.fail(
            f"RabbitMQ's STOMP plugin is not reachable on 127.0.0.1:{PLUGIN_PORT} ({error}); the "
            f"compatibility suite compares the adapter with it and cannot run without it: {_ENABLE}",
            pytrace=False,
        )
    if not answer.startswith(b"CONNECTED"):
        pytest.fail(f"127.0.0.1:{PLUGIN_PORT} does not answer like a STOMP server: {answer!r}", pytrace=False)
    return PLUGIN_PORT


@pytest.fixture(scope="session")
def broker(amqp_url: str) -> Broker:
    try:
        request = urllib.request.Request(
            MANAGEMENT_URL + "/api/overview",
            headers={"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="},  # guest:guest
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            response.read()
    except OSError as error:
        pytest.fail(
            f"RabbitMQ's management API is not reachable at {MANAGEMENT_URL} ({error}); the "
            f"compatibility suite needs it to compare broker state: {_ENABLE}",
            pytrace=False,
        )
    return Broker(MANAGEMENT_URL, amqp_url)


@pytest.fixture
def compat(plugin_port: int, adapter, broker: Broker) -> Callable[..., tuple[Transcript, Transcript]]:
    """``compat(conversation, expect=[...])`` runs the conversation against the plugin and the
    adapter, asserts the declared differences and that everything else is identical; returns the
    raw (not normalised) transcripts."""

    def run(
        conversation: Conversation, expect: Iterable[Difference] = (), adapter_port: int | None = None
    ) -> tuple[Transcript, Transcript]:
        return compare(conversation, plugin_port, adapter_port or adapter.port, broker, expect)

    return run


@pytest.fixture(scope="session")
def web_plugin_port() -> int:
    """RabbitMQ's rabbitmq_web_stomp listener (STOMP over WebSocket, path /ws)."""
    try:
        from tests.compat.conversation import WebSocketStream

        stream = WebSocketStream(WEB_PLUGIN_PORT)
        stream.close()
    except OSError as error:
        pytest.fail(
            f"RabbitMQ's web_stomp plugin is not reachable on 127.0.0.1:{WEB_PLUGIN_PORT} ({error}); the "
            f"WebSocket compatibility tests compare the adapter with it: {_ENABLE}",
            pytrace=False,
        )
    return WEB_PLUGIN_PORT


@pytest.fixture(scope="session")
def web_adapter(amqp_url: str) -> Iterator[AdapterProcess]:
    """An adapter with a WebSocket listener (web_stomp) for the whole session."""
    server = AdapterProcess(amqp_url, web_stomp_listeners=["127.0.0.1:0"])
    server.start()
    yield server
    server.stop()


@pytest.fixture
def web_compat(
    web_plugin_port: int, web_adapter: AdapterProcess, broker: Broker
) -> Callable[..., tuple[Transcript, Transcript]]:
    """``web_compat(conversation, expect=[...])``: as ``compat``, over WebSocket against
    rabbitmq_web_stomp and the adapter's web_stomp listener."""

    def run(conversation: Conversation, expect: Iterable[Difference] = ()) -> tuple[Transcript, Transcript]:
        port = web_adapter.server.web_addresses[0][1]
        return compare(conversation, web_plugin_port, port, broker, expect, transport="ws")

    return run
