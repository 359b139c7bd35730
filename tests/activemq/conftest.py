"""Fixtures of the ActiveMQ comparison suite: a private Apache ActiveMQ 5.17 broker, the adapter
in the ``activemq`` profile, and a raw STOMP client that speaks to both.

Every conversation runs twice: once with ActiveMQ reached directly, once through the recording
tap (``stomp-amqp-adapter tap``, one per module, recording with bodies) in front of it.  The
tests assert the outcome literally, so both runs giving it is the tap's transparency; the
recording itself is checked in tests/spark/test_tap_on_activemq.py.

The broker is Debian's ``activemq`` package, started once per module from the test's own
directory: its own ``activemq.xml`` (KahaDB in the test's data directory, STOMP only, on a free
port, never 61613), its own tmp directory, no JMX.  The system service and its instance
directories are never touched.  Without the package the tests FAIL and say what to install: they
are never skipped.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support import AdapterProcess, BrokerProbe, free_port, wait_for_port
from tests.tap_support import TapProcess

ACTIVEMQ_HOME = Path("/usr/share/activemq")
ACTIVEMQ_JAR = ACTIVEMQ_HOME / "bin" / "activemq.jar"
_INSTALL = "install Debian's package: `apt-get install -y activemq` (.ci/run does it when missing)"

# One STOMP connector; persistent (KahaDB) so durable subscriptions and queues behave as in
# production; the scheduler on (AMQ_SCHEDULED_DELAY, off in ActiveMQ's default configuration);
# no JMX, no web console.
_BROKER_XML = """<beans xmlns="http://www.springframework.org/schema/beans"
  xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"
  xsi:schemaLocation="http://www.springframework.org/schema/beans
    http://www.springframework.org/schema/beans/spring-beans-2.0.xsd
    http://activemq.apache.org/schema/core http://activemq.apache.org/schema/core/activemq-core.xsd">
  <broker xmlns="http://activemq.apache.org/schema/core" brokerName="adapter-tests" useJmx="false"
          persistent="true" schedulerSupport="true" dataDirectory="{data}">
    <persistenceAdapter><kahaDB directory="{data}/kahadb"/></persistenceAdapter>
    <transportConnectors>
      <transportConnector name="stomp" uri="stomp://127.0.0.1:{port}"/>
    </transportConnectors>
  </broker>
</beans>
"""


@dataclass
class ActiveMQ:
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path


@pytest.fixture(scope="module")
def activemq(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ActiveMQ]:
    if not ACTIVEMQ_JAR.exists():
        pytest.fail(
            f"Apache ActiveMQ is not installed ({ACTIVEMQ_JAR} is missing): {_INSTALL}", pytrace=False
        )
    java = shutil.which("java")
    if java is None:
        pytest.fail(f"no `java` on PATH to run ActiveMQ: {_INSTALL}", pytrace=False)
    base = tmp_path_factory.mktemp("activemq")
    conf, data, tmp = base / "conf", base / "data", base / "tmp"
    for directory in (conf, data, tmp):
        directory.mkdir()
    port = free_port()
    (conf / "activemq.xml").write_text(_BROKER_XML.format(data=data, port=port))
    log_path = base / "activemq.log"
    command = [
        java,
        "-Xmx256m",
        f"-Dactivemq.home={ACTIVEMQ_HOME}",
        f"-Dactivemq.base={base}",
        f"-Dactivemq.conf={conf}",
        f"-Dactivemq.data={data}",
        f"-Djava.io.tmpdir={tmp}",
        "-jar",
        str(ACTIVEMQ_JAR),
        "start",
        f"xbean:file:{conf / 'activemq.xml'}",
    ]
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, cwd=base, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for_port(port, process, "ActiveMQ", log_path, timeout=60)
        yield ActiveMQ(port, process, log_path)
    finally:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


@pytest.fixture(scope="module")
def activemq_tap(activemq: ActiveMQ, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TapProcess]:
    """The recording tap in front of the module's ActiveMQ (bodies recorded, as for a replay)."""
    base = tmp_path_factory.mktemp("activemq-tap")
    tap = TapProcess(f"127.0.0.1:{activemq.port}", base / "recording", "--record-bodies")
    try:
        yield tap
    finally:
        status = tap.stop()
        assert status == 0, f"the tap exited with {status}: {tap.log()}"


@pytest.fixture
def broker(amqp_url: str) -> Iterator[BrokerProbe]:
    """RabbitMQ through aio-pika: queues the adapter made durable are tracked and deleted."""
    probe = BrokerProbe(amqp_url)
    yield probe
    probe.close()


# ------------------------------------------------------------------------------------------------
# A raw STOMP client: frames as written, nothing added by a client library.


@dataclass
class Received:
    command: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Peer:
    """One STOMP connection: ``send`` writes a frame, ``read`` returns the frames that arrive."""

    sock: socket.socket
    buffer: bytes = b""
    closed: bool = False
    pending: list[Received] = field(default_factory=list)

    def send(self, command: str, headers: dict[str, str] | None = None, body: bytes | str = b"") -> None:
        data = body.encode() if isinstance(body, str) else body
        lines = [command, *(f"{name}:{value}" for name, value in (headers or {}).items())]
        self.sock.sendall("\n".join(lines).encode() + b"\n\n" + data + b"\0")

    def _parse(self) -> Received | None:
        buffer = self.buffer.lstrip(b"\r\n")
        head_end = buffer.find(b"\n\n")
        if head_end < 0:
            self.buffer = buffer
            return None
        lines = buffer[:head_end].decode("utf-8", "replace").split("\n")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.rstrip("\r").partition(":")
            headers.setdefault(name, value)
        start = head_end + 2
        if "content-length" in headers:
            end = start + int(headers["content-length"])
            if len(buffer) < end + 1:
                self.buffer = buffer
                return None
        else:
            end = buffer.find(b"\0", start)
            if end < 0:
                self.buffer = buffer
                return None
        self.buffer = buffer[end + 1 :]
        return Received(lines[0], headers, buffer[start:end])

    def read(self, timeout: float = 5.0, until: Callable[[Received], bool] | None = None) -> list[Received]:
        """Frames until ``until`` matches one (inclusive), the peer closes or ``timeout`` passes."""
        frames: list[Received] = []
        while self.pending:
            frame = self.pending.pop(0)
            frames.append(frame)
            if until is not None and until(frame):
                return frames
        deadline = time.monotonic() + timeout
        while True:
            frame = self._parse()
            if frame is not None:
                frames.append(frame)
                if until is not None and until(frame):
                    return frames
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self.closed:
                return frames
            self.sock.settimeout(remaining)
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                return frames
            except OSError:
                chunk = b""
            if not chunk:
                self.closed = True
                continue
            self.buffer += chunk

    def request(self, command: str, headers: dict[str, str], body: bytes | str = b"") -> list[Received]:
        """Send with a receipt and read up to its RECEIPT (or an ERROR)."""
        receipt = f"r-{time.monotonic_ns()}"
        self.send(command, {**headers, "receipt": receipt}, body)
        frames = self.read(until=lambda f: f.command == "ERROR" or f.headers.get("receipt-id") == receipt)
        # messages that arrived meanwhile are kept for the next read
        self.pending += [f for f in frames if f.command == "MESSAGE"]
        return [f for f in frames if f.command != "MESSAGE"]

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.request("DISCONNECT", {})
        self.sock.close()


Connect = Callable[..., Peer]


def connector(port: int, peers: list[Peer]) -> Connect:
    def connect(client_id: str | None = None, version: str = "1.2") -> Peer:
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        peer = Peer(sock)
        headers = {"accept-version": version, "host": "/", "login": "guest", "passcode": "guest"}
        if client_id is not None:
            headers["client-id"] = client_id
        peer.send("CONNECT", headers)
        connected = peer.read(until=lambda f: True)
        assert connected and connected[0].command == "CONNECTED", connected
        peers.append(peer)
        return peer

    return connect


@pytest.fixture(params=["direct", "via-tap"])
def both(
    request: pytest.FixtureRequest, activemq: ActiveMQ, start_adapter: Callable[..., AdapterProcess]
) -> Iterator[dict[str, Connect]]:
    """``{"activemq": connect, "adapter": connect}``: the same conversation runs against each;
    ActiveMQ is reached directly, or through the recording tap (``via-tap``)."""
    port = activemq.port
    if request.param == "via-tap":
        port = request.getfixturevalue("activemq_tap").port
    adapter = start_adapter(profile="activemq")
    peers: list[Peer] = []
    yield {"activemq": connector(port, peers), "adapter": connector(adapter.port, peers)}
    for peer in peers:
        if not peer.closed:
            peer.sock.close()
