"""Zero loss: whatever the adapter acknowledged with a RECEIPT is on the broker, even when the
adapter process is killed with SIGKILL at a random moment.

The adapter runs as a real process (``python -m adapter``).  A producer on a raw socket keeps a
window of receipted, persistent SENDs (or of transactions: BEGIN, five persistent SENDs, COMMIT
with a receipt) in flight; the process is killed at a seeded random moment; then every message
whose SEND or COMMIT was receipted must be in the durable queue (an independent AMQP client
drains it).  Duplicates are allowed by STOMP's at-least-once contract and are counted.

Before the Reliability fix a COMMIT's RECEIPT went out before the broker had confirmed the
messages, and this test lost messages of receipted transactions in most runs.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.support import free_port, unique, wait_for_port

CONNECT = b"CONNECT\naccept-version:1.2\nhost:/\nlogin:guest\npasscode:guest\n\n\0"
RUNS = 3
WINDOW = 60  # receipts outstanding
SEED = int(os.environ.get("KILL9_SEED", "20261124"))


def start_adapter(amqp_url: str, log_path: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    log_file = log_path.open("ab")
    process = subprocess.Popen(
        [sys.executable, "-m", "adapter", "--listen", f"127.0.0.1:{port}", "--amqp-url", amqp_url],
        stdout=log_file,
        stderr=subprocess.STDOUT,
    )
    log_file.close()
    wait_for_port(port, process, "adapter", log_path)
    return process, port


class Producer:
    """Sends receipted work with a bounded window; records which receipts came back."""

    def __init__(self, port: int, queue: str, transactions: bool) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.sock.sendall(CONNECT)
        self.queue = queue
        self.transactions = transactions
        self.sent_units: dict[str, list[str]] = {}  # receipt id -> message ids it covers
        self.receipted: set[str] = set()
        self.errors: list[bytes] = []
        self._buffer = b""
        self._window = threading.Semaphore(WINDOW)
        self._connected = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        assert self._connected.wait(5), "no CONNECTED"

    def _read(self) -> None:
        while True:
            try:
                chunk = self.sock.recv(65536)
            except OSError:
                return
            if not chunk:
                return
            self._buffer += chunk
            while b"\0" in self._buffer:
                frame, _, self._buffer = self._buffer.partition(b"\0")
                frame = frame.lstrip(b"\r\n")
                if frame.startswith(b"CONNECTED"):
                    self._connected.set()
                elif frame.startswith(b"RECEIPT"):
                    for line in frame.split(b"\n"):
                        if line.startswith(b"receipt-id:"):
                            self.receipted.add(line[11:].decode())
                    self._window.release()
                elif frame.startswith(b"ERROR"):
                    self.errors.append(frame)

    def run(self, stop: threading.Event) -> None:
        n = 0
        try:
            while not stop.is_set():
                if not self._window.acquire(timeout=0.1):
                    continue
                n += 1
                self.sock.sendall(self._unit(n))
        except OSError:
            return  # the adapter was killed

    def _unit(self, n: int) -> bytes:
        send = f"SEND\ndestination:/queue/{self.queue}\npersistent:true\n"
        if not self.transactions:
            receipt = f"s{n}"
            self.sent_units[receipt] = [receipt]
            return f"{send}receipt:{receipt}\n\n{receipt}\0".encode()
        receipt = f"c{n}"
        ids = [f"t{n}-{k}" for k in range(5)]
        self.sent_units[receipt] = ids
        frames = [f"BEGIN\ntransaction:x{n}\n\n\0"]
        frames += [f"{send}transaction:x{n}\n\n{i}\0" for i in ids]
        frames.append(f"COMMIT\ntransaction:x{n}\nreceipt:{receipt}\n\n\0")
        return "".join(frames).encode()

    def close(self) -> None:
        self.sock.close()
        self._reader.join(5)


def drain(broker, queue: str) -> Counter[str]:  # type: ignore[no-untyped-def]
    """Every body in the queue, counted, read by an AMQP consumer (faster than basic.get)."""

    async def work(channel) -> Counter[str]:  # type: ignore[no-untyped-def]
        await channel.set_qos(prefetch_count=2000)
        q = await channel.declare_queue(queue, passive=True)
        total = q.declaration_result.message_count
        bodies: Counter[str] = Counter()
        received = 0
        if total:
            async with q.iterator() as messages:
                async for message in messages:
                    await message.ack()
                    bodies[message.body.decode()] += 1
                    received += 1
                    if received >= total:
                        break
        return bodies

    return broker.run(work)


@pytest.mark.parametrize("transactions", [False, True], ids=["receipted-sends", "receipted-commits"])
def test_receipted_messages_survive_sigkill(amqp_url, broker, tmp_path, transactions):
    rng = random.Random(SEED + transactions)
    report = []
    for run in range(RUNS):
        queue = unique("kill9")
        broker.declare_queue(queue, durable=True)
        process, port = start_adapter(amqp_url, tmp_path / "adapter.log")
        producer = Producer(port, queue, transactions)
        stop = threading.Event()
        sender = threading.Thread(target=producer.run, args=(stop,), daemon=True)
        sender.start()
        time.sleep(rng.uniform(0.3, 1.0))  # a random moment in a steady stream of work
        os.kill(process.pid, signal.SIGKILL)
        process.wait(10)
        stop.set()
        sender.join(5)
        producer.close()

        on_broker = drain(broker, queue)
        promised = [m for r in producer.receipted for m in producer.sent_units[r]]
        lost = [m for m in promised if on_broker[m] == 0]
        duplicates = sum(count - 1 for count in on_broker.values() if count > 1)
        report.append(
            f"run {run}: {len(producer.receipted)} receipts ({len(promised)} messages), "
            f"{sum(on_broker.values())} on the broker, {len(lost)} lost, {duplicates} duplicates"
        )
        assert producer.receipted, f"no receipt before the kill: {report}"
        assert not producer.errors, producer.errors[:3]
        assert lost == [], f"receipted but not on the broker: {lost[:10]} ({report})"
    print("\n".join(report))
