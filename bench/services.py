"""The processes and broker state around a benchmark run.

* `AdapterProcess`: the adapter as a subprocess (``python -m adapter --listen 127.0.0.1:PORT``) on a
  free port, its log in ``bench/results/``, stopped with SIGTERM (then SIGKILL) at the end.
* `QueueCleaner`: deletes the ``bench-<run id>-*`` queues each measurement creates.  STOMP cannot
  delete a queue, so this goes through the management API (``DELETE /api/queues/<vhost>/<name>``)
  and falls back to an AMQP ``queue.delete`` through aio-pika when the API does not answer.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from . import procstat

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, process: subprocess.Popen[bytes], what: str, timeout: float = 20.0) -> None:
    """Wait until ``process`` (a server the bench started) accepts on 127.0.0.1:``port``."""
    deadline = time.monotonic() + timeout
    while not port_answers("127.0.0.1", port):
        if process.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"{what} did not start on port {port}")
        time.sleep(0.05)


def port_answers(host: str, port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _raise_nofile() -> None:
    # 500 idle STOMP clients = 1000 sockets in the adapter (client + AMQP): lift the soft limit
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 65536, hard))


def raise_own_nofile() -> None:
    with contextlib.suppress(ValueError, OSError):
        _raise_nofile()


class AdapterProcess:
    def __init__(self, host: str = "127.0.0.1", port: int | None = None, label: str = "adapter") -> None:
        self.host = host
        self.port = port or free_port()
        self.label = label
        self.proc: subprocess.Popen[bytes] | None = None
        RESULTS.mkdir(parents=True, exist_ok=True)
        self.log_path = RESULTS / f"{label}-{self.port}.log"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self, timeout: float = 20.0, extra: list[str] | tuple[str, ...] = ()) -> None:
        """``extra``: more command-line flags (e.g. ``--shared-subscriptions``)."""
        command = [
            sys.executable,
            "-m",
            "adapter",
            "--listen",
            f"{self.host}:{self.port}",
            "--log-level",
            "WARNING",
            *extra,
        ]
        log = open(self.log_path, "wb")  # noqa: SIM115 - handed to the child
        self.proc = subprocess.Popen(
            command,
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=_raise_nofile,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"the adapter exited with status {self.proc.returncode} at start-up:\n{self.log_tail()}"
                )
            if port_answers(self.host, self.port, 0.5):
                return
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"the adapter did not listen on {self.host}:{self.port} within {timeout:g} s")

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 15.0) -> int | None:
        if self.proc is None:
            return None
        # the workers of --workers N run in their own sessions: remember them, so that none
        # outlives a supervisor that had to be killed
        workers = procstat.child_pids(self.proc.pid)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        for pid in workers:
            with contextlib.suppress(OSError):
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if b"adapter" not in f.read():
                        continue  # gone, and the pid is someone else's now
                os.kill(pid, signal.SIGKILL)
        try:  # keep only logs that say something
            if self.log_path.stat().st_size == 0:
                self.log_path.unlink()
        except OSError:
            pass
        return self.proc.returncode


class QueueCleaner:
    def __init__(
        self,
        prefix: str,
        management_url: str = "http://127.0.0.1:15672",
        amqp_url: str = "amqp://guest:guest@127.0.0.1:5672/",
        vhost: str = "/",
        user: str = "guest",
        password: str = "guest",
    ) -> None:
        self.prefix = prefix
        self.management_url = management_url.rstrip("/")
        self.amqp_url = amqp_url
        self.vhost = vhost
        self._auth = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        self.deleted = 0
        self.failures: list[str] = []

    def _http(self, method: str, path: str) -> bytes:
        request = urllib.request.Request(
            self.management_url + path, method=method, headers={"Authorization": self._auth}
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.read()

    def _vhost_path(self) -> str:
        return urllib.parse.quote(self.vhost, safe="")

    def list_queues(self) -> list[str] | None:
        """Names of this run's queues, or None when the management API does not answer."""
        try:
            data = json.loads(self._http("GET", f"/api/queues/{self._vhost_path()}?columns=name"))
        except (OSError, urllib.error.URLError, ValueError):
            return None
        return [q["name"] for q in data if q.get("name", "").startswith(self.prefix)]

    async def delete(self, names: list[str]) -> None:
        names = [n for n in names if n.startswith(self.prefix)]
        if not names:
            return
        leftover = await asyncio.to_thread(self._delete_http, names)
        if leftover:
            await self._delete_amqp(leftover)

    def _delete_http(self, names: list[str]) -> list[str]:
        leftover = []
        for name in names:
            try:
                self._http("DELETE", f"/api/queues/{self._vhost_path()}/{urllib.parse.quote(name, safe='')}")
                self.deleted += 1
            except urllib.error.HTTPError as error:
                if error.code != 404:  # 404: already gone (auto-delete/exclusive)
                    leftover.append(name)
            except (OSError, urllib.error.URLError):
                leftover.append(name)
        return leftover

    async def _delete_amqp(self, names: list[str]) -> None:
        try:
            import aio_pika
        except ImportError:
            self.failures.extend(names)
            return
        try:
            connection = await aio_pika.connect(self.amqp_url, timeout=10)
        except Exception as error:  # noqa: BLE001 - reported, not fatal
            self.failures.append(f"{names}: {error}")
            return
        async with connection:
            for name in names:
                channel = await connection.channel()
                try:
                    await channel.queue_delete(name)
                    self.deleted += 1
                except Exception:  # noqa: BLE001 - gone already, or in use by someone else
                    pass

    async def sweep(self) -> list[str]:
        """Delete whatever of this run's queues is left; returns what could not be deleted."""
        names = await asyncio.to_thread(self.list_queues)
        if names:
            await self.delete(names)
            names = await asyncio.to_thread(self.list_queues) or []
        return names or []


def environment() -> dict[str, object]:
    """Conditions of the run, for the report."""
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "cpus": os.cpu_count(),
        "cpu_model": cpu,
        "python": sys.version.split()[0],
        "kernel": os.uname().release,
    }
