"""A real browser against the adapter's WebSocket listener: Debian's Chromium, headless, driven
by playwright-core (tests/browser/drive.mjs), with the real @stomp/stompjs from npm, and the
adapter's own web console clicked through.  `.ci/run` installs chromium (apt) and the npm
packages (npm ci in tests/browser); without them these tests fail and say what is missing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import AdapterProcess, BrokerProbe, free_port, unique

HERE = Path(__file__).resolve().parent
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")


@pytest.fixture(scope="module")
def node() -> str:
    problems = []
    node = shutil.which("node")
    if node is None:
        problems.append("node is not installed")
    if not (HERE / "node_modules" / "playwright-core").is_dir():
        problems.append("npm packages missing: run `npm ci` in tests/browser")
    if not os.access(CHROMIUM, os.X_OK):
        problems.append(f"no Chromium at {CHROMIUM}: `apt-get install chromium`")
    if problems:
        pytest.fail(
            "browser tests cannot run: " + "; ".join(problems) + " (.ci/run does both)", pytrace=False
        )
    assert node is not None
    return node


class Driver:
    """drive.mjs as a child process: JSON events on its stdout, one line to its stdin to go on."""

    def __init__(self, node: str, *args: str) -> None:
        self.process = subprocess.Popen(
            [node, str(HERE / "drive.mjs"), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "CHROMIUM": CHROMIUM},
        )
        self.log: list[dict[str, Any]] = []

    def until(self, event: str) -> dict[str, Any]:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            message = json.loads(line)
            self.log.append(message)
            if message["event"] == "failed":
                raise AssertionError(f"the browser script failed: {message['text']}\nevents: {self.log}")
            if message["event"] == event:
                return message
        stderr = self.process.stderr.read() if self.process.stderr else ""
        raise AssertionError(f"drive.mjs ended before {event!r}: {stderr}\nevents: {self.log}")

    def go_on(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write("go\n")
        self.process.stdin.flush()

    def finish(self) -> None:
        """Wait for the script to close its browser; kill it if it waits for a step that a failed
        assertion skipped."""
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            pass
        finally:
            if self.process.poll() is None:
                self.process.kill()
            for stream in (self.process.stdin, self.process.stdout, self.process.stderr):
                if stream is not None:
                    stream.close()


@pytest.fixture
def web_adapter_on(amqp_url: str) -> Iterator[Any]:
    """Adapters on a fixed WebSocket port, so that one can be stopped and another started on
    the same address (the browser reconnects to it)."""
    started: list[AdapterProcess] = []

    def start(port: int) -> AdapterProcess:
        adapter = AdapterProcess(amqp_url, web_stomp_listeners=[f"127.0.0.1:{port}"])
        adapter.start()
        started.append(adapter)
        return adapter

    yield start
    for adapter in started:
        adapter.stop()


@pytest.fixture
def broker(amqp_url: str) -> Iterator[BrokerProbe]:
    """Deletes the durable queues the browser's SENDs create."""
    probe = BrokerProbe(amqp_url)
    yield probe
    probe.close()


def test_stompjs_in_chromium(node, web_adapter_on, broker):
    port = free_port()
    first_adapter = web_adapter_on(port)
    name = unique("browser")
    # the page also sends to NAME-acked and NAME-requests
    broker.track_queue(name, f"{name}-acked", f"{name}-requests")
    queue, topic = f"/queue/{name}", f"/topic/{unique('browser')}"
    driver = Driver(node, "stompjs", f"ws://127.0.0.1:{port}/ws", queue, topic)
    try:
        seen = driver.until("first")["seen"]
        connected = seen["connects"][0]
        assert connected["protocol"] == "v12.stomp"
        assert connected["headers"]["version"] == "1.2"
        assert connected["headers"]["heart-beat"] == "300,300"
        bodies = {(m["via"], m["body"]) for m in seen["messages"]}
        assert {
            ("queue", "to the queue"),
            ("topic", "to the topic"),
            ("client-ack", "please ack"),
            ("temp-queue", "answer to question"),
        } <= bodies
        reply = next(m for m in seen["messages"] if m["body"] == "answer to question")
        assert reply["headers"]["destination"].startswith(
            "/queue/amq.gen-"
        )  # the temp queue, as named by the broker
        assert seen["errors"] == [] and seen["closes"] == []  # heart-beats kept it up while idle

        driver.until("ready-for-restart")
        first_adapter.stop()
        # the broker requeues what a closed connection left unacknowledged: nothing here, so the
        # browser's client ACK took effect
        assert broker.idle_depth(f"{name}-acked") == 0
        web_adapter_on(port)  # a new adapter on the same address: stompjs reconnects by itself
        driver.go_on()
        seen = driver.until("second")["seen"]
        assert len(seen["connects"]) == 2
        assert seen["closes"], "the browser saw no close when the adapter stopped"
        assert "after the restart" in [m["body"] for m in seen["messages"]]
        # and the acked message is not delivered again after the reconnect
        assert [m["via"] for m in seen["messages"] if m["body"] == "please ack"] == ["client-ack"]
    finally:
        driver.finish()


def test_web_console_in_chromium(node, web_adapter_on, tmp_path: Path):
    port = free_port()
    web_adapter_on(port)
    topic = f"/topic/{unique('console')}"
    screenshot = tmp_path / "console.png"
    driver = Driver(node, "console", f"http://127.0.0.1:{port}/console", topic, str(screenshot))
    try:
        lines = driver.until("console")["lines"]
        assert f"{topic}  typed in the console" in lines
        assert any(line.startswith("connected to RabbitMQ/") for line in lines)
        closed = driver.until("console-closed")["lines"]
        assert closed[0].startswith("closed (1000 STOMP died)")
        assert "receipt disconnect" in closed
    finally:
        driver.finish()
    assert screenshot.stat().st_size > 1000 and screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
