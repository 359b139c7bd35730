"""``--workers N``: a supervisor process that runs N adapter processes on the same listeners.

Owns both ends of it:

* the supervisor (``Supervisor``): binds every STOMP, TLS and WebSocket listener once per worker
  slot, as ``SO_REUSEPORT`` sockets on the same address, and starts each worker with its slot's
  sockets (``python -m adapter <the same arguments> --worker-spec ...``, the sockets passed as
  inherited descriptors); restarts a worker that dies, after a back-off that grows while it
  keeps dying; serves ``--http-listen`` itself, adding up the workers' series
  (adapter/server/workermetrics.py); and on SIGTERM/SIGINT stops every worker the way a single
  adapter stops (each closes its clients cleanly), killing those still running after
  ``shutdown_timeout``;
* the worker's end of the control socket (``WorkerControl``): it says when the worker listens,
  answers the supervisor's requests for a metrics snapshot, and shuts the worker down when the
  supervisor goes away (end of file on the socket), so a killed supervisor leaves no orphans.

Why the supervisor binds the sockets (and keeps them) rather than each worker binding its own
with ``SO_REUSEPORT``: a listening socket that closes takes the connections waiting in its
accept queue with it (reset).  A worker that dies here closes nothing: the supervisor still
holds the slot's sockets, the kernel keeps queueing that slot's share of new connections, and
the restarted worker accepts them.  It also makes ``--listen HOST:0`` work (the first slot's
bind picks the port, the others join it) and lets the supervisor know the addresses.  Why one
socket per slot rather than one socket shared by all workers: the kernel spreads connections
over ``SO_REUSEPORT`` sockets evenly (by a hash of the addresses and ports); a socket shared by
several processes wakes them all and the first to call accept() gets the connection, so one
busy-looping worker can take most of them.  During a long back-off (a crash loop) the slot's
sockets are closed, so its share goes to the live workers, and bound again for the restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from prometheus_client.metrics_core import Metric

from ..amqp.brokers import BrokerNodes
from .connection import BrokerSettings
from .health import BrokerCheck, Verdict
from .http import OperatorHttp
from .sharedcaps import CapTable
from .workermetrics import Snapshot, WorkerMetrics, render_metrics, take_snapshot

if TYPE_CHECKING:
    from .listener import Server

log = logging.getLogger("adapter.workers")

WORKER_SPEC_FLAG = "--worker-spec"
# a worker that ran this long before it died is restarted at once; one that died sooner counts
# towards the back-off
STABLE_SECONDS = 10.0
FIRST_BACKOFF_SECONDS = 0.5
MAX_BACKOFF_SECONDS = 30.0
# from this back-off on, the slot's sockets are closed while it waits (its connections go to
# the other workers instead of waiting in its accept queue)
RELEASE_SOCKETS_AFTER_SECONDS = 2.0
SNAPSHOT_TIMEOUT_SECONDS = 2.0  # a worker that does not answer in time: its last snapshot is used
KILL_GRACE_SECONDS = (
    5.0  # after shutdown_timeout, before SIGKILL (the worker's own shutdown takes that long at most)
)
_CONTROL_LINE_LIMIT = 64 * 1024 * 1024  # one snapshot per line


def restart_delay(quick_failures: int) -> float:
    """Seconds to wait before restarting a worker that died after ``quick_failures`` earlier
    deaths in a row, each within STABLE_SECONDS of its start: at once the first time, then 0.5,
    1, 2 ... up to 30 s, so a crash loop costs little CPU and fills the log slowly."""
    if quick_failures <= 0:
        return 0.0
    return float(min(FIRST_BACKOFF_SECONDS * 2 ** (quick_failures - 1), MAX_BACKOFF_SECONDS))


# --------------------------------------------------------------------------------------------
# The listening sockets
# --------------------------------------------------------------------------------------------


@dataclass(slots=True)
class ListenerPlan:
    """One configured listener: its (host, port) as configured (the worker's key for it), its
    backlog, and the addresses every slot binds (resolved, with the port the first bind got)."""

    host: str
    port: int
    backlog: int
    endpoints: list[tuple[socket.AddressFamily, tuple[Any, ...]]] = field(default_factory=list)


def _listening_socket(family: socket.AddressFamily, address: tuple[Any, ...], backlog: int) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if family == socket.AF_INET6:
            # as asyncio does: an IPv6 socket for "::" must not also take the IPv4 addresses
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(address)
        sock.listen(backlog)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def bind_slot(plans: Sequence[ListenerPlan]) -> dict[tuple[str, int], list[socket.socket]]:
    """One slot's listening sockets.  The first call resolves each host (all its addresses, as
    asyncio's create_server binds them) and fixes port 0 to the port the OS chose."""
    bound: dict[tuple[str, int], list[socket.socket]] = {}
    try:
        for plan in plans:
            sockets = bound.setdefault((plan.host, plan.port), [])
            if not plan.endpoints:
                infos = socket.getaddrinfo(
                    plan.host or None, plan.port, socket.AF_UNSPEC, socket.SOCK_STREAM, 0, socket.AI_PASSIVE
                )
                for info in dict.fromkeys(infos):  # the same address can come back twice
                    family, address = socket.AddressFamily(info[0]), tuple(info[4])
                    sock = _listening_socket(family, address, plan.backlog)
                    sockets.append(sock)
                    chosen = (*address[:1], sock.getsockname()[1], *address[2:])
                    plan.endpoints.append((family, chosen))
            else:
                for family, address in plan.endpoints:
                    sockets.append(_listening_socket(family, address, plan.backlog))
    except BaseException:
        for sockets in bound.values():
            for sock in sockets:
                sock.close()
        raise
    return bound


# --------------------------------------------------------------------------------------------
# The supervisor
# --------------------------------------------------------------------------------------------


@dataclass(slots=True, eq=False)
class WorkerSlot:
    index: int
    sockets: dict[tuple[str, int], list[socket.socket]]
    process: asyncio.subprocess.Process | None = None
    control: asyncio.StreamWriter | None = None
    ready: bool = False
    ever_ready: bool = False
    started_at: float = 0.0
    starts: int = 0
    quick_failures: int = 0
    snapshot: Snapshot | None = None
    requests: dict[int, asyncio.Future[Snapshot]] = field(default_factory=dict)

    def close_sockets(self) -> None:
        for sockets in self.sockets.values():
            for sock in sockets:
                sock.close()
        self.sockets = {}


class Supervisor:
    """The parent process of ``--workers N`` (see the module docstring)."""

    def __init__(
        self,
        *,
        workers: int,
        worker_command: Sequence[str],
        plans: Sequence[ListenerPlan],
        http_listen: tuple[str, int] | None,
        nodes: BrokerNodes,
        broker: BrokerSettings,
        shutdown_timeout: float,
        metrics_destinations: int = 0,
        cap_rows: int = 0,
    ) -> None:
        self.workers = workers
        # stomp.max_connections and web_stomp.max_connections, counted for every worker
        # together (adapter/server/sharedcaps.py); None when no cap is set
        self._cap_rows = cap_rows
        self.caps: CapTable | None = None
        self._worker_command = list(worker_command)
        self._plans = list(plans)
        self._http_listen = http_listen
        self.nodes = nodes
        self.broker = broker
        self._shutdown_timeout = shutdown_timeout
        self.slots: list[WorkerSlot] = []
        self.metrics_total = WorkerMetrics(destination_limit=metrics_destinations)
        self.restarts = 0
        self.broker_check = BrokerCheck(self)
        self.http_connections: set[OperatorHttp] = set()
        self.http_addresses: list[tuple[str, int]] = []
        self.shutting_down = False
        self._stop = asyncio.Event()
        self._failure: str | None = None
        self._next_request = 0

    # ---------------------------------------------------------------- running
    async def run(self) -> int:
        """Start the workers and the HTTP port; return the exit status once stopped."""
        loop = asyncio.get_running_loop()
        signals = 0

        def on_signal() -> None:
            nonlocal signals
            signals += 1
            if signals == 1:
                log.info(
                    "signal received: stopping %d workers (send it again to kill them at once)", self.workers
                )
                self._stop.set()
            else:
                log.warning("second signal: killing the workers and exiting now")
                self._kill_all()
                sys.exit(1)

        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, on_signal)
        http_server: asyncio.Server | None = None
        try:
            if self._cap_rows:
                self.caps = CapTable.create(self._cap_rows, self.workers)
            self.slots = [WorkerSlot(index, bind_slot(self._plans)) for index in range(self.workers)]
            for plan in self._plans:
                for family, address in plan.endpoints:
                    host = f"[{address[0]}]" if family == socket.AF_INET6 else address[0]
                    log.info("listening on %s:%s (%d workers)", host, address[1], self.workers)
            if self._http_listen is not None:
                host, port = self._http_listen
                http_server = await loop.create_server(
                    lambda: OperatorHttp(SupervisorEndpoints(self)), host or None, port, reuse_address=True
                )
                for sock in http_server.sockets:
                    address = sock.getsockname()
                    self.http_addresses.append((address[0], address[1]))
                    log.info(
                        "listening on %s:%s (HTTP metrics and health, all workers)", address[0], address[1]
                    )
            keepers = [loop.create_task(self._keep(slot)) for slot in self.slots]
            await self._stop.wait()
            self.shutting_down = True
            await self._stop_workers()
            for keeper in keepers:
                keeper.cancel()
            await asyncio.gather(*keepers, return_exceptions=True)
        finally:
            self.shutting_down = True
            if http_server is not None:
                http_server.close()
            for http in list(self.http_connections):
                http.abort()
            for slot in self.slots:
                slot.close_sockets()
            if self.caps is not None:
                self.caps.close()
                self.caps = None
        if self._failure is not None:
            log.error("%s", self._failure)
            return 1
        return 0

    async def _keep(self, slot: WorkerSlot) -> None:
        """Run the slot's worker; restart it when it dies, until the supervisor stops."""
        while not self._stop.is_set():
            if not slot.sockets:
                slot.sockets = bind_slot(self._plans)
            process = await self._start(slot)
            code = await process.wait()
            self._gone(slot)
            if self._stop.is_set():
                return
            if slot.starts == 1 and not slot.ever_ready:
                # the first start failed (a configuration the worker rejects, say): restarting
                # would fail the same way
                self._failure = f"worker {slot.index} exited with status {code} before it listened"
                self._stop.set()
                return
            lived = time.monotonic() - slot.started_at
            if lived >= STABLE_SECONDS:
                slot.quick_failures = 0
            delay = restart_delay(slot.quick_failures)
            slot.quick_failures += 1
            self.restarts += 1
            log.warning(
                "worker %d (pid %d) exited with status %s after %.1f s; restarting it in %.1f s",
                slot.index,
                process.pid,
                code,
                lived,
                delay,
            )
            if delay >= RELEASE_SOCKETS_AFTER_SECONDS:
                slot.close_sockets()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), delay)

    async def _start(self, slot: WorkerSlot) -> asyncio.subprocess.Process:
        ours, theirs = socket.socketpair()
        listeners = [
            (host, port, [sock.fileno() for sock in sockets])
            for (host, port), sockets in slot.sockets.items()
        ]
        spec = {
            "slot": slot.index,
            "control": theirs.fileno(),
            "listeners": listeners,
            "workers": self.workers,
        }
        descriptors = [theirs.fileno(), *(fd for _host, _port, fds in listeners for fd in fds)]
        if self.caps is not None:
            spec["caps"] = [self.caps.fd, self.caps.rows]
            descriptors.append(self.caps.fd)
        try:
            process = await asyncio.create_subprocess_exec(
                *self._worker_command,
                WORKER_SPEC_FLAG,
                json.dumps(spec),
                stdin=asyncio.subprocess.DEVNULL,
                pass_fds=descriptors,
                # its own session: a Ctrl-C in the terminal reaches the supervisor only, which
                # then stops each worker once (a second signal would make a worker exit at once)
                start_new_session=True,
            )
        finally:
            theirs.close()
        slot.process = process
        slot.started_at = time.monotonic()
        slot.starts += 1
        slot.ready = False
        log.info("worker %d started: pid %d", slot.index, process.pid)
        reader, writer = await asyncio.open_unix_connection(sock=ours, limit=_CONTROL_LINE_LIMIT)
        slot.control = writer
        asyncio.get_running_loop().create_task(self._read_control(slot, process, reader))
        return process

    async def _read_control(
        self, slot: WorkerSlot, process: asyncio.subprocess.Process, reader: asyncio.StreamReader
    ) -> None:
        while True:
            try:
                line = await reader.readline()
            except (OSError, ValueError):
                return
            if not line or slot.process is not process:
                return
            try:
                message = json.loads(line)
                kind = message["event"]
            except (ValueError, KeyError, TypeError):
                log.warning("worker %d sent an unreadable control message", slot.index)
                continue
            if kind == "ready":
                slot.ready = slot.ever_ready = True
                log.info("worker %d (pid %d) is listening", slot.index, process.pid)
            elif kind == "metrics":
                waiter = slot.requests.pop(message.get("id"), None)
                if waiter is not None and not waiter.done():
                    waiter.set_result(message.get("families") or [])

    def _gone(self, slot: WorkerSlot) -> None:
        """The slot's worker exited: keep its counters, forget its connection, and give back
        the connection-cap slots it held (its connections died with it)."""
        slot.ready = False
        if self.caps is not None:
            self.caps.clear(slot.index)
        if slot.snapshot is not None:
            self.metrics_total.retire(slot.snapshot)
            slot.snapshot = None
        for waiter in slot.requests.values():
            if not waiter.done():
                waiter.set_exception(ConnectionError("the worker exited"))
        slot.requests.clear()
        if slot.control is not None:
            slot.control.close()
            slot.control = None

    async def _stop_workers(self) -> None:
        running = [
            slot.process
            for slot in self.slots
            if slot.process is not None and slot.process.returncode is None
        ]
        for process in running:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
        if not running:
            return
        waits = [asyncio.ensure_future(process.wait()) for process in running]
        _, late = await asyncio.wait(waits, timeout=self._shutdown_timeout + KILL_GRACE_SECONDS)
        if late:
            log.warning("%d worker(s) still running after the shutdown timeout: killing them", len(late))
            self._kill_all()
            await asyncio.wait(late)

    def _kill_all(self) -> None:
        for slot in self.slots:
            if slot.process is not None and slot.process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    slot.process.kill()

    # ---------------------------------------------------------------- metrics and health
    async def snapshot(self, slot: WorkerSlot) -> Snapshot | None:
        """The worker's series now, or its last ones if it does not answer in time."""
        control = slot.control
        if control is None or not slot.ready:
            return slot.snapshot
        self._next_request += 1
        request = self._next_request
        waiter: asyncio.Future[Snapshot] = asyncio.get_running_loop().create_future()
        slot.requests[request] = waiter
        try:
            control.write(json.dumps({"request": "metrics", "id": request}).encode() + b"\n")
            async with asyncio.timeout(SNAPSHOT_TIMEOUT_SECONDS):
                slot.snapshot = await waiter
        except (TimeoutError, OSError) as error:
            log.warning(
                "worker %d gave no metrics (%s): its last ones are used", slot.index, error or "timeout"
            )
        finally:
            slot.requests.pop(request, None)
        return slot.snapshot

    async def metrics(self) -> list[Metric]:
        snapshots = await asyncio.gather(*(self.snapshot(slot) for slot in self.slots))
        metrics = self.metrics_total.combine(snapshot for snapshot in snapshots if snapshot is not None)
        workers = Metric("stomp_adapter_workers", "worker processes by state (--workers)", "gauge")
        for state in ("ready", "starting", "down"):
            count = sum(1 for slot in self.slots if _slot_state(slot) == state)
            workers.add_sample("stomp_adapter_workers", {"state": state}, count)
        restarts = Metric("stomp_adapter_worker_restarts", "workers restarted after they died", "counter")
        restarts.add_sample("stomp_adapter_worker_restarts_total", {}, self.restarts)
        return [*metrics, workers, restarts]

    def live(self) -> Verdict:
        if self.shutting_down:
            return Verdict(False, "shutting down")
        return Verdict(True, "ok")

    async def ready(self) -> Verdict:
        live = self.live()
        if not live.ok:
            return live
        waiting = [str(slot.index) for slot in self.slots if not slot.ready]
        if waiting:
            return Verdict(False, f"worker(s) {', '.join(waiting)} not listening (starting or restarting)")
        return await self.broker_check.verdict()


def _slot_state(slot: WorkerSlot) -> str:
    if slot.ready:
        return "ready"
    if slot.process is not None and slot.process.returncode is None:
        return "starting"
    return "down"


class SupervisorEndpoints:
    """What the supervisor's HTTP port answers (adapter/server/http.py)."""

    def __init__(self, supervisor: Supervisor) -> None:
        self._supervisor = supervisor

    @property
    def http_connections(self) -> set[OperatorHttp]:
        return self._supervisor.http_connections

    async def metrics(self) -> bytes:
        return render_metrics(await self._supervisor.metrics())

    def live(self) -> Verdict:
        return self._supervisor.live()

    async def ready(self) -> Verdict:
        return await self._supervisor.ready()


# --------------------------------------------------------------------------------------------
# The worker's end
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """What the supervisor hands a worker: its slot, the control socket, the listening sockets,
    how many workers there are, and the connection caps' shared table (None: no cap set)."""

    slot: int
    control: socket.socket
    sockets: dict[tuple[str, int], list[socket.socket]]
    workers: int = 1
    caps: CapTable | None = None

    @classmethod
    def parse(cls, text: str) -> WorkerSpec:
        spec = json.loads(text)
        control = socket.socket(fileno=int(spec["control"]))
        sockets = {
            (str(host), int(port)): [socket.socket(fileno=int(fd)) for fd in fds]
            for host, port, fds in spec["listeners"]
        }
        workers = int(spec.get("workers", 1))
        caps = None
        if spec.get("caps"):
            fd, rows = spec["caps"]
            caps = CapTable(int(fd), int(rows), workers)
        return cls(int(spec["slot"]), control, sockets, workers, caps)


class WorkerControl:
    """The worker's end of the control socket (see the module docstring)."""

    def __init__(self, control: socket.socket) -> None:
        self._control = control

    async def run(self, server: Server, stop: asyncio.Event) -> None:
        """Tell the supervisor the worker listens, answer its requests; set ``stop`` when the
        supervisor is gone."""
        reader, writer = await asyncio.open_unix_connection(sock=self._control, limit=_CONTROL_LINE_LIMIT)
        try:
            writer.write(json.dumps({"event": "ready", "pid": os.getpid()}).encode() + b"\n")
            while True:
                line = await reader.readline()
                if not line:
                    break
                try:
                    request = json.loads(line)
                except ValueError:
                    continue
                if request.get("request") == "metrics":
                    answer = {
                        "event": "metrics",
                        "id": request.get("id"),
                        "families": take_snapshot(server.registry),
                    }
                    writer.write(json.dumps(answer).encode() + b"\n")
        except (OSError, ValueError):
            pass
        finally:
            writer.close()
        if not stop.is_set():
            log.warning("the supervisor has gone: shutting down")
            stop.set()
