"""Debian's legacy STOMP clients against the adapter in the ``activemq`` profile.

Each client is a small program in this directory (``client.php``: the php-stomp extension,
``client.pl``: Net::Stomp, ``client.rb``: the Ruby stomp gem), written the way ActiveMQ
applications use them, run as a subprocess against an in-process adapter.  The programs print
what they receive; the test checks it, and what the broker holds afterwards.

Scenarios: ``queue`` (SEND non-persistent, SUBSCRIBE with client acks and
``activemq.prefetchSize:1``, ACK each), ``selector`` (a topic subscription with a JMS selector),
``durable`` (``client-id`` + ``activemq.subscriptionName``: messages sent while the subscriber
is away wait for it; then ActiveMQ's UNSUBSCRIBE sequence removes the subscription).

The same programs also run against the private Apache ActiveMQ of tests/activemq, directly and
through the recording tap in front of it: they print the same lines either way (the tap's
transparency), and the lines the adapter gives.

A missing interpreter or client library FAILS the test with the package to install: .ci/run
installs them.
"""

from __future__ import annotations

import shutil
import subprocess
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from adapter.mapping.profile import durable_subscription_queue
from tests.activemq.conftest import ActiveMQ, activemq, activemq_tap  # noqa: F401 - module fixtures
from tests.support import AdapterProcess, BrokerProbe

HERE = Path(__file__).parent
PACKAGES = "apt-get install -y php-cli php-stomp libnet-stomp-perl ruby-stomp (.ci/run does it)"
# client -> (interpreter, program)
CLIENTS = {
    "php-stomp": ("php", "client.php"),
    "net-stomp": ("perl", "client.pl"),
    "ruby-stomp": ("ruby", "client.rb"),
}
# exit status of a program whose client library is missing
MISSING_LIBRARY = 3


def run_client(client: str, port: int, scenario: str, name: str) -> list[str]:
    interpreter, program = CLIENTS[client]
    path = shutil.which(interpreter)
    if path is None:
        pytest.fail(f"{client}: no `{interpreter}` on PATH: {PACKAGES}", pytrace=False)
    done = subprocess.run(
        [path, str(HERE / program), str(port), scenario, name],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if done.returncode == MISSING_LIBRARY:
        pytest.fail(f"{client}: {done.stderr.strip()}: {PACKAGES}", pytrace=False)
    assert done.returncode == 0, f"{client} exited with {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout.splitlines()


@pytest.fixture
def activemq_adapter(start_adapter: Callable[..., AdapterProcess]) -> AdapterProcess:
    return start_adapter(profile="activemq")


@pytest.mark.parametrize("client", CLIENTS)
def test_queue_send_subscribe_ack(client: str, activemq_adapter: AdapterProcess, broker: BrokerProbe) -> None:
    queue = f"legacy-{client}-{uuid.uuid4().hex[:8]}"
    broker.track_queue(queue)
    lines = run_client(client, activemq_adapter.port, "queue", queue)
    assert lines == ["message one", "message two", "message three", "done"]
    # a shared durable queue (persistent:false did not make it the sender's), every message acked
    assert broker.idle_depth(queue) == 0


@pytest.mark.parametrize("client", CLIENTS)
def test_topic_selector(client: str, activemq_adapter: AdapterProcess) -> None:
    lines = run_client(client, activemq_adapter.port, "selector", f"legacy.{uuid.uuid4().hex[:8]}")
    assert lines == ["message red-big", "nothing more", "done"]


@pytest.mark.parametrize("client", CLIENTS)
def test_durable_subscription(client: str, activemq_adapter: AdapterProcess, broker: BrokerProbe) -> None:
    name = f"legacy-{client}-{uuid.uuid4().hex[:8]}"
    queue = durable_subscription_queue(name, "sub")
    broker.track_queue(queue)
    lines = run_client(client, activemq_adapter.port, "durable", name)
    assert lines == ["message away-1", "message away-2", "done"]
    assert broker.wait_gone(queue)  # ActiveMQ's UNSUBSCRIBE sequence removed it


# what each scenario prints, whichever broker is behind (the tests above, against the adapter)
PRINTS = {
    "queue": ["message one", "message two", "message three", "done"],
    "selector": ["message red-big", "nothing more", "done"],
    "durable": ["message away-1", "message away-2", "done"],
}


@pytest.mark.parametrize("via", ["direct", "via-tap"])
@pytest.mark.parametrize("scenario", PRINTS)
@pytest.mark.parametrize("client", CLIENTS)
def test_against_activemq_direct_and_through_the_tap(
    client: str,
    scenario: str,
    via: str,
    activemq: ActiveMQ,  # noqa: F811
    request: pytest.FixtureRequest,
) -> None:
    port = activemq.port if via == "direct" else request.getfixturevalue("activemq_tap").port
    name = (
        f"legacy-{client}-{uuid.uuid4().hex[:8]}"
        if scenario != "selector"
        else f"legacy.{uuid.uuid4().hex[:8]}"
    )
    assert run_client(client, port, scenario, name) == PRINTS[scenario]
