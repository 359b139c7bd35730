"""Shared fixtures: the broker, an in-process adapter on a free port, and STOMP clients.

Broker discovery (docs/architecture.md, "Tests"): ``AMQP_URL`` from the environment, then
``amqp://guest:guest@127.0.0.1:5672/`` if it answers, then a testcontainers RabbitMQ if a Docker
engine answers.  Without a broker, tests that need one fail with a clear message: they are
never skipped, so a CI run without RabbitMQ cannot pass silently.

The adapter under test runs in a thread with its own event loop and listens on port 0, never
on 61613 (RabbitMQ's own STOMP plugin may be listening there).

``--amqp-sessions-per-connection N`` runs every adapter the fixtures start with
adapter.amqp_sessions_per_connection = N (unless a test sets it itself): the same tests, with
concurrent sessions sharing AMQP connections.  Tests marked ``own_amqp_connection`` assume an
AMQP connection per session (they find a client's by its name or socket, or test the reuse
pool, which shared connections replace): they are deselected then
(tests/integration/test_multiplexing.py covers what they check, for shared connections).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit

import pytest
from hypothesis import settings

from tests.support import AdapterProcess, StompClient, broker_answers

# Property tests check what happens, never how fast: hypothesis's default 200 ms deadline per
# example failed a state-machine test once at load average 6.5 on this 2-core machine.
settings.register_profile("no-deadline", deadline=None)
settings.load_profile("no-deadline")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--amqp-sessions-per-connection",
        type=int,
        default=None,
        help="start every adapter with adapter.amqp_sessions_per_connection = N (multiplexing)",
    )


# Directories whose tests start private services (Spark JVMs, RabbitMQ nodes, ActiveMQ, Chromium):
# with pytest-xdist (scripts/test runs the whole suite on two workers) they run one after another in
# one worker, so that two of them never compete for the machine's two cores at once.
_SERIAL_DIRECTORIES = ("spark", "cluster", "oauth2", "activemq", "legacy", "browser")
# Files elsewhere that share a broker-wide name with those suites, so they run in the same group:
# the activemq profile's one dead-letter queue, ActiveMQ.DLQ, which tests/activemq and
# tests/spark/test_tap_on_activemq.py read (and delete at teardown).  The replays of
# tests/recordings.py NACK into it and read it; the other files run the profile with NACKs or
# rejections that can dead-letter a persistent message into it (run at the same time, one test
# took the other's dead letter, or found one more).
_SERIAL_FILES = tuple(
    f"tests/integration/{name}.py"
    for name in (
        "test_migrate_replay",
        "test_migrate_replay_fleet",
        "test_activemq_queue_selectors",
        "test_activemq_profile",
        "test_fuzz_stomp",
        "test_multiplexing",
        "test_hostile_numbers",
        "test_budgets",
    )
)


def _xdist_groups(items: list[pytest.Item]) -> None:
    """One xdist group per test file (its module fixtures start once), one for the service suites."""
    for item in items:
        path = item.path.relative_to(item.config.rootpath)
        directory = path.parts[1] if len(path.parts) > 2 else ""
        serial = directory in _SERIAL_DIRECTORIES or path.as_posix() in _SERIAL_FILES
        group = "services" if serial else str(path)
        item.add_marker(pytest.mark.xdist_group(group))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.pluginmanager.hasplugin("xdist"):
        _xdist_groups(items)
    if config.getoption("--amqp-sessions-per-connection") is None:
        return
    kept = [item for item in items if item.get_closest_marker("own_amqp_connection") is None]
    if len(kept) != len(items):
        config.hook.pytest_deselected(items=[item for item in items if item not in kept])
        items[:] = kept


@pytest.fixture(scope="session")
def adapter_defaults(request: pytest.FixtureRequest) -> dict[str, object]:
    """Settings every adapter the fixtures start gets unless a test gives its own."""
    sessions = request.config.getoption("--amqp-sessions-per-connection")
    return {} if sessions is None else {"amqp_sessions_per_connection": sessions}


def _find_broker() -> tuple[str, object | None]:
    url = os.environ.get("AMQP_URL")
    if url:
        return url, None
    local = "amqp://guest:guest@127.0.0.1:5672/"
    if broker_answers("127.0.0.1", 5672):
        return local, None
    try:  # users with Docker: start a throwaway RabbitMQ
        from testcontainers.rabbitmq import RabbitMqContainer

        container = RabbitMqContainer("rabbitmq:3.13-management")
        container.start()
        host = container.get_container_host_ip()
        port = container.get_exposed_port(5672)
        return f"amqp://guest:guest@{host}:{port}/", container
    except Exception as error:  # no Docker engine, no image ...
        pytest.fail(
            "No RabbitMQ broker: set AMQP_URL, start RabbitMQ on 127.0.0.1:5672 "
            f"(`rabbitmq-server -detached`), or run Docker for testcontainers ({error})",
            pytrace=False,
        )


@pytest.fixture(scope="session")
def amqp_url() -> Iterator[str]:
    url, container = _find_broker()
    yield url
    if container is not None:
        container.stop()  # type: ignore[attr-defined]


@pytest.fixture(scope="session")
def broker_host_port(amqp_url: str) -> tuple[str, int]:
    parts = urlsplit(amqp_url)
    return parts.hostname or "127.0.0.1", parts.port or 5672


@pytest.fixture(scope="session")
def adapter(amqp_url: str, adapter_defaults: dict[str, object]) -> Iterator[AdapterProcess]:
    """One adapter with default settings for the whole session."""
    server = AdapterProcess(amqp_url, **adapter_defaults)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def start_adapter(
    amqp_url: str, adapter_defaults: dict[str, object]
) -> Iterator[Callable[..., AdapterProcess]]:
    """Factory for an adapter with particular settings, e.g. ``start_adapter(login_timeout=1)``
    (``amqp_url=...`` replaces the test broker's URL, e.g. with several nodes)."""
    started: list[AdapterProcess] = []

    def start(**settings: object) -> AdapterProcess:
        url = str(settings.pop("amqp_url", amqp_url))
        server = AdapterProcess(url, **{**adapter_defaults, **settings})
        server.start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def stomp_client(adapter: AdapterProcess) -> Iterator[Callable[..., StompClient]]:
    """Factory for connected stomp.py clients; all are disconnected at teardown."""
    clients: list[StompClient] = []

    def connect(version: str = "1.2", *, port: int | None = None, **kwargs: object) -> StompClient:
        client = StompClient(port or adapter.port, version=version, **kwargs)
        clients.append(client)
        return client

    yield connect
    for client in clients:
        client.close()


@pytest.fixture
def raw_socket(adapter: AdapterProcess) -> Iterator[Callable[..., socket.socket]]:
    sockets: list[socket.socket] = []

    def open_socket(port: int | None = None) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", port or adapter.port), timeout=5)
        sockets.append(sock)
        return sock

    yield open_socket
    for sock in sockets:
        sock.close()
