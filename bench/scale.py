"""``python -m bench.scale``: N subscribed clients against the adapter and against the plugin.

For each N of ``--clients`` and each side of ``--sides`` (adapter, plugin) it:

1. starts a private RabbitMQ node (tests/cluster/rabbit.py ``private_node``: own node name,
   ports and data directory, run as the ``rabbitmq`` user, soft file limit raised to
   ``--broker-nofile``) with the STOMP, Web STOMP and management plugins on private ports, a
   fresh one per measurement so that memory freed by an earlier one does not hide the next
   one's (``--reuse-node``: one node for the whole run; ``--broker shared``: the machine's broker
   on 5672, its plugin on 61613 and 15674, only read, never bound);
2. on the adapter side, starts the adapter (``--workers``, TCP and WebSocket listeners on free
   ports, the node as its broker, and every ``--adapter-setting key=value`` as a line of its ini
   file, passed through unchecked: the adapter checks them when it starts);
3. starts ``--client-processes`` client processes (bench/scale_fleet.py), each connecting from
   its own 127.0.0.x source address, and reads the RSS of the adapter (all its processes) and of
   the broker (beam.smp, OS RSS), and the broker's own figures: ``erlang:memory(total)``
   (``rabbitmqctl eval``) and ``rabbitmq-diagnostics memory_breakdown`` by category;
4. opens the N clients (``--ws-share`` of them over WebSocket, ``--open-concurrency`` CONNECTs
   in flight at once over all processes), each subscribed to one shared ``/topic/...`` with a
   receipt: the open rate is N over the time until the last RECEIPT;
5. waits ``--settle`` seconds, reads the memory again: memory per client is the growth over N;
6. sends ``--rounds`` messages to the topic through the side under test (a separate STOMP
   connection), one at a time; the body carries the sender's CLOCK_MONOTONIC stamp, each client
   records its arrival: fan-out latency p50/p99/max over every delivery of every round;
7. closes everything it started (clients, adapter, node), also on Ctrl-C, SIGTERM or an error.

Prints a table after each measurement and at the end; ``--json FILE`` (default
``bench/results/scale-<date>-<time>.json``) has every figure, the conditions and the CPU
seconds of the adapter, the broker and the clients during the open and the fan-out.
docs/performance.md ("Scale") has the figures and the command.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import secrets
import signal
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from tests.cluster.rabbit import private_node, remove_private_node

from . import procstat
from .scale_stats import (
    Closed,
    Failed,
    Fanout,
    Measurement,
    Opened,
    ProtocolError,
    Round,
    Share,
    adapter_setting,
    breakdown_per_client,
    client_counts,
    command,
    erlang_total_kb,
    ini_text,
    parse_event,
    plan_clients,
    processes_for,
    source_addresses,
    stamp_body,
    table,
)
from .services import RESULTS, AdapterProcess, environment, free_port, raise_own_nofile
from .stomp import StompClient, connect, frame

ROOT = Path(__file__).resolve().parent.parent
NODE_LABEL = "stomp-scale"
PLUGINS = ("rabbitmq_stomp", "rabbitmq_web_stomp", "rabbitmq_management")
CLIENTS_PER_PROCESS = 15_000  # sockets of one client process, under the 20,000 file limit


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.scale",
        description="N subscribed STOMP clients (TCP and WebSocket) against the adapter and the "
        "plugin on a private RabbitMQ node: memory per client, open rate, fan-out latency.",
    )
    parser.add_argument(
        "--clients", type=client_counts, default=client_counts("1000,5000"), help="N list (default 1000,5000)"
    )
    parser.add_argument(
        "--sides",
        default="adapter,plugin",
        type=_sides,
        help="adapter, plugin or both (default adapter,plugin)",
    )
    parser.add_argument(
        "--ws-share", type=float, default=0.5, help="share of clients over WebSocket (default 0.5)"
    )
    parser.add_argument("--workers", type=int, default=2, help="adapter worker processes (default 2)")
    parser.add_argument(
        "--adapter-setting",
        type=adapter_setting,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an ini line for the adapter (repeatable), e.g. adapter.amqp_sessions_per_connection=8",
    )
    parser.add_argument("--client-processes", type=int, default=4, help="client processes (default 4)")
    parser.add_argument(
        "--source-addresses", type=int, default=4, help="127.0.0.2... to connect from (default 4)"
    )
    parser.add_argument(
        "--open-concurrency",
        type=int,
        default=32,
        help="CONNECTs in flight, all processes together (default 32)",
    )
    parser.add_argument(
        "--open-timeout", type=float, default=60.0, help="seconds for one client to subscribe"
    )
    parser.add_argument("--rounds", type=int, default=5, help="fan-out messages, one at a time (default 5)")
    parser.add_argument("--round-timeout", type=float, default=60.0, help="longest wait for one round")
    parser.add_argument("--round-gap", type=float, default=1.0, help="seconds between rounds (default 1)")
    parser.add_argument("--settle", type=float, default=3.0, help="seconds before memory is read (default 3)")
    parser.add_argument(
        "--ws-keepalive",
        type=float,
        default=20.0,
        help="seconds between EOLs a WebSocket client sends (default 20)",
    )
    parser.add_argument(
        "--broker",
        choices=("private", "shared"),
        default="private",
        help="private: a node of its own per measurement (default); shared: the broker on 5672 "
        "with its plugin on 61613/15674 (only read)",
    )
    parser.add_argument("--reuse-node", action="store_true", help="one private node for the whole run")
    parser.add_argument(
        "--broker-nofile",
        type=int,
        default=20_000,
        help="soft file limit of the private node (default 20000)",
    )
    parser.add_argument(
        "--broker-plugins",
        default=",".join(PLUGINS),
        help=f"plugins of the private node (default {','.join(PLUGINS)})",
    )
    parser.add_argument(
        "--no-memory-breakdown",
        action="store_true",
        help="skip the broker's own memory figures (memory_breakdown, erlang:memory)",
    )
    parser.add_argument("--json", help="output file (default bench/results/scale-<date>-<time>.json)")
    args = parser.parse_args(argv)
    for name in ("workers", "client_processes", "open_concurrency", "rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if not 0 <= args.ws_share <= 1:
        parser.error("--ws-share is from 0 to 1")
    try:
        args.sources = source_addresses(args.source_addresses)
    except ValueError as error:
        parser.error(str(error))
    return args


def _sides(text: str) -> list[str]:
    sides = [side.strip() for side in text.split(",") if side.strip()]
    if not sides or any(side not in ("adapter", "plugin") for side in sides):
        raise argparse.ArgumentTypeError("sides: adapter, plugin or adapter,plugin")
    return sides


# ------------------------------------------------------------------------------ the broker


class Broker:
    """Where the clients' messages live: AMQP for the adapter, the plugin's ports, the VM."""

    amqp_url: str
    stomp_port: int
    ws_port: int
    name: str

    def start(self) -> None: ...

    def pid(self) -> int | None:
        raise NotImplementedError

    def breakdown(self) -> dict[str, int]:
        return {}

    def erlang_kb(self) -> int | None:
        return None

    def close(self) -> None: ...


class PrivateBroker(Broker):
    def __init__(self, plugins: Sequence[str], nofile: int) -> None:
        self.node, (stomp, ws, management) = private_node(
            NODE_LABEL, extra_ports=3, plugins=plugins, nofile=nofile
        )
        # every listener on a private port (a plugin's keys only with the plugin: RabbitMQ
        # refuses the keys of a plugin that is not enabled)
        lines = {
            "rabbitmq_stomp": [f"stomp.listeners.tcp.1 = 127.0.0.1:{stomp}"],
            "rabbitmq_web_stomp": ["web_stomp.tcp.ip = 127.0.0.1", f"web_stomp.tcp.port = {ws}"],
            "rabbitmq_management": ["management.tcp.ip = 127.0.0.1", f"management.tcp.port = {management}"],
        }
        self.node.config_lines = tuple(line for plugin in plugins for line in lines.get(plugin, []))
        self.amqp_url = self.node.url
        self.stomp_port, self.ws_port = stomp, ws
        self.name = self.node.name

    def start(self) -> None:
        self.node.write_files()
        self.node.start()
        self.node.wait_started()

    def pid(self) -> int | None:
        return self.node.pid()

    def erlang_kb(self) -> int | None:
        result = self.node.ctl("eval", "erlang:memory(total).", check=False, timeout=120)
        return erlang_total_kb(result.stdout) if result.returncode == 0 else None

    def breakdown(self) -> dict[str, int]:
        """``rabbitmq-diagnostics memory_breakdown`` in bytes per category."""
        result = self.node.ctl(
            "memory_breakdown",
            "--unit",
            "bytes",
            "--formatter",
            "json",
            program="rabbitmq-diagnostics",
            check=False,
            timeout=120,
        )
        with contextlib.suppress(ValueError, KeyError, TypeError, AttributeError):
            return {name: int(v["bytes"]) for name, v in json.loads(result.stdout).items()}
        return {}

    def close(self) -> None:
        remove_private_node(self.node)


class SharedBroker(Broker):
    """The machine's broker: read, never started, stopped or reconfigured."""

    def __init__(self) -> None:
        self.amqp_url = "amqp://guest:guest@127.0.0.1:5672/"
        self.stomp_port, self.ws_port = 61613, 15674
        self.name = "rabbit@localhost (shared)"
        self._pid = procstat.find_broker_pid(5672)

    def pid(self) -> int | None:
        return self._pid


# ------------------------------------------------------------------------ client processes


class FleetProcess:
    """One bench/scale_fleet.py process: commands to its stdin, events from its stdout."""

    def __init__(self, share: Share) -> None:
        self.share = share
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bench.scale_fleet",
            cwd=ROOT,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            start_new_session=True,  # a Ctrl-C reaches the bench, which closes them
            limit=1 << 24,
        )

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    async def ask(self, line: bytes, timeout: float) -> Opened | Round | Closed:
        assert self.proc is not None and self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(line)
        await self.proc.stdin.drain()
        async with asyncio.timeout(timeout):
            answer = await self.proc.stdout.readline()
        if not answer:
            raise ProtocolError(f"client process {self.proc.pid} exited ({await self.proc.wait()})")
        parsed = parse_event(answer)
        if isinstance(parsed, Failed):
            raise ProtocolError(f"client process {self.proc.pid}: {parsed.error}")
        return parsed

    async def close(self) -> None:
        if self.proc is None or self.proc.returncode is not None:
            return
        with contextlib.suppress(Exception):
            assert self.proc.stdin is not None
            self.proc.stdin.close()  # EOF: it closes its sockets and exits
        try:
            # it reads stdin between commands only: in the middle of an open (an interrupted
            # run) it is killed, which closes its sockets all the same
            await asyncio.wait_for(self.proc.wait(), 5)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            await self.proc.wait()


# ---------------------------------------------------------------------------- one measurement


def tree_rss_kb(pid: int | None) -> int | None:
    """RSS of a process and its descendants (the adapter's supervisor and workers)."""
    if pid is None:
        return None
    total = procstat.rss_kb(pid)
    if total is None:
        return None
    for child in procstat.child_pids(pid):
        total += tree_rss_kb(child) or 0
    return total


async def warm_up(host: str, port: int, ws_port: int, destination: str, count: int) -> None:
    """``count`` TCP and ``count`` WebSocket clients subscribe (with a receipt) and leave."""
    clients = await asyncio.gather(
        *(connect(host, port, f"warm-up-tcp-{i}") for i in range(count)),
        *(connect(host, ws_port, f"warm-up-ws-{i}", websocket="/ws") for i in range(count)),
    )
    await asyncio.gather(
        *(c.request("SUBSCRIBE", {"id": "0", "destination": destination, "ack": "auto"}) for c in clients)
    )
    await asyncio.gather(*(c.disconnect() for c in clients))


def adapter_ini(broker: Broker, ws_port: int, workers: int) -> dict[str, str]:
    return {
        "adapter.amqp_url": broker.amqp_url,
        "adapter.workers": str(workers),
        "adapter.http_listen": "none",
        "web_stomp.tcp.listener": f"127.0.0.1:{ws_port}",
    }


class Run:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.run_id = secrets.token_hex(3)
        self.directory = Path(tempfile.mkdtemp(prefix="bench-scale-"))
        self.results: list[Measurement] = []

    @contextlib.contextmanager
    def broker(self) -> Iterator[Broker]:
        if self.args.broker == "shared":
            yield SharedBroker()
            return
        broker = PrivateBroker([p for p in self.args.broker_plugins.split(",") if p], self.args.broker_nofile)
        try:
            print(f"starting a private node {broker.name} ...", flush=True)
            started = time.monotonic()
            broker.start()
            print(
                f"  up in {time.monotonic() - started:.0f} s (AMQP {broker.node.amqp_port}, "
                f"STOMP {broker.stomp_port}, Web STOMP {broker.ws_port})",
                flush=True,
            )
            yield broker
        finally:
            print(f"stopping {broker.name} ...", flush=True)
            broker.close()

    async def measure(self, broker: Broker, side: str, n: int) -> Measurement:
        args = self.args
        processes = processes_for(n, args.client_processes, CLIENTS_PER_PROCESS)
        shares = plan_clients(n, args.ws_share, processes, args.sources)
        m = Measurement(side, n, sum(s.tcp for s in shares), sum(s.ws for s in shares))
        m.settings = dict(args.adapter_setting) if side == "adapter" else {}
        adapter: AdapterProcess | None = None
        fleets = [FleetProcess(share) for share in shares]
        sender: StompClient | None = None
        try:
            if side == "adapter":
                ws_port = free_port()
                ini = self.directory / f"adapter-{n}.ini"
                ini.write_text(ini_text(adapter_ini(broker, ws_port, args.workers), args.adapter_setting))
                adapter = AdapterProcess(label=f"scale-adapter-{n}")
                await asyncio.to_thread(adapter.start, 60.0, ["--config", str(ini)])
                host, stomp_port = "127.0.0.1", adapter.port
                await asyncio.to_thread(_wait_port, ws_port)
            else:
                host, stomp_port, ws_port = "127.0.0.1", broker.stomp_port, broker.ws_port
            await asyncio.gather(*(fleet.start() for fleet in fleets))
            # the sender, and a few clients that come and go first, so that what the first
            # logins of each worker cost once (imports, caches, pools) is in the baseline
            sender = await connect(host, stomp_port, "scale-sender")
            await warm_up(
                host, stomp_port, ws_port, f"/topic/bench-scale-{self.run_id}-warm-up", 2 * args.workers
            )
            await asyncio.sleep(1.0)
            adapter_pid = adapter.pid if adapter else None
            broker_pid = broker.pid()
            before = (tree_rss_kb(adapter_pid), procstat.rss_kb(broker_pid) if broker_pid else None)
            breakdown_before = {} if args.no_memory_breakdown else await asyncio.to_thread(broker.breakdown)
            erlang_before = None if args.no_memory_breakdown else await asyncio.to_thread(broker.erlang_kb)

            destination = f"/topic/bench-scale-{self.run_id}-{n}-{side}"
            per_process = max(1, args.open_concurrency // len(fleets))
            meter = procstat.CpuMeter(self._pids(adapter_pid, broker_pid, fleets))
            meter.start()
            started = time.monotonic()
            opened = await asyncio.gather(
                *(
                    fleet.ask(
                        command(
                            "open",
                            host=host,
                            port=stomp_port,
                            ws_port=ws_port,
                            ws_path="/ws",
                            tcp=fleet.share.tcp,
                            ws=fleet.share.ws,
                            source=fleet.share.source,
                            destination=destination,
                            concurrency=per_process,
                            timeout=args.open_timeout,
                            keepalive=args.ws_keepalive if fleet.share.ws else 0,
                        ),
                        timeout=args.open_timeout * (fleet.share.total / per_process + 2),
                    )
                    for fleet in fleets
                )
            )
            m.open_seconds = round(time.monotonic() - started, 2)
            m.cpu_seconds.update(_prefixed("open", meter.stop()))
            for result in opened:
                assert isinstance(result, Opened)
                m.subscribed += result.subscribed
                m.failed += result.failed
                m.errors = (m.errors + [e for e in result.errors if e not in m.errors])[:5]
            print(
                f"  {side} N={n}: {m.subscribed:,} subscribed in {m.open_seconds:.1f} s"
                + (f", {m.failed:,} failed: {m.errors[:2]}" if m.failed else ""),
                flush=True,
            )

            await asyncio.sleep(args.settle)
            after = (tree_rss_kb(adapter_pid), procstat.rss_kb(broker_pid) if broker_pid else None)
            breakdown_after = {} if args.no_memory_breakdown else await asyncio.to_thread(broker.breakdown)
            erlang_after = None if args.no_memory_breakdown else await asyncio.to_thread(broker.erlang_kb)
            m.adapter_rss_kb = (before[0], after[0])
            m.broker_rss_kb = (before[1], after[1])
            m.broker_erlang_kb = (erlang_before, erlang_after)
            m.broker_breakdown_per_client = breakdown_per_client(
                breakdown_before, breakdown_after, m.subscribed
            )

            if m.subscribed:
                m.fanout, m.lost = await self.fan_out(sender, destination, fleets, adapter_pid, broker_pid, m)
            return m
        finally:
            if sender is not None:
                sender.abort()
            await asyncio.gather(*(fleet.close() for fleet in fleets), return_exceptions=True)
            if adapter is not None:
                await asyncio.to_thread(adapter.stop, 10.0)

    async def fan_out(
        self,
        sender: StompClient,
        destination: str,
        fleets: list[FleetProcess],
        adapter_pid: int | None,
        broker_pid: int | None,
        m: Measurement,
    ) -> tuple[Fanout, int]:
        args = self.args
        rounds: list[list[Round]] = []
        meter = procstat.CpuMeter(self._pids(adapter_pid, broker_pid, fleets))
        meter.start()
        lost = 0
        for round_no in range(1, args.rounds + 1):
            sender.write(
                frame("SEND", {"destination": destination}, stamp_body(round_no, time.monotonic_ns()))
            )
            reports = await asyncio.gather(
                *(
                    fleet.ask(
                        command("collect", round=round_no, timeout=args.round_timeout),
                        args.round_timeout + 30,
                    )
                    for fleet in fleets
                )
            )
            this_round = [report for report in reports if isinstance(report, Round)]
            rounds.append(this_round)
            lost = sum(report.lost for report in this_round)
            if round_no < args.rounds:
                await asyncio.sleep(args.round_gap)
        m.cpu_seconds.update(_prefixed("fanout", meter.stop()))
        return Fanout.of(rounds), lost

    @staticmethod
    def _pids(
        adapter_pid: int | None, broker_pid: int | None, fleets: list[FleetProcess]
    ) -> dict[str, int | None]:
        pids: dict[str, int | None] = {"adapter": adapter_pid, "broker": broker_pid}
        for i, fleet in enumerate(fleets):
            pids[f"client{i}"] = fleet.pid
        return pids

    async def run(self) -> int:
        args = self.args
        task = asyncio.current_task()
        assert task is not None
        # SIGTERM as Ctrl-C: cancel, so that every finally below stops what it started
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
        if args.broker == "shared" or args.reuse_node:
            with self.broker() as broker:
                for n in args.clients:
                    for side in args.sides:
                        await self._one(broker, side, n)
        else:
            for n in args.clients:
                for side in args.sides:
                    with self.broker() as broker:
                        await self._one(broker, side, n)
        return 0

    async def _one(self, broker: Broker, side: str, n: int) -> None:
        m = await self.measure(broker, side, n)
        self.results.append(m)
        print(table([m]), flush=True)


def _prefixed(prefix: str, cpu: dict[str, float | None]) -> dict[str, float | None]:
    """CpuMeter's figures with the client processes added up as ``clients``."""
    out: dict[str, float | None] = {}
    clients = 0.0
    for name, value in cpu.items():
        if name.startswith("client"):
            clients += value or 0.0
        else:
            out[f"{prefix}_{name}"] = value
    out[f"{prefix}_clients"] = round(clients, 3)
    return out


def _wait_port(port: int, timeout: float = 30.0) -> None:
    from .services import port_answers

    deadline = time.monotonic() + timeout
    while not port_answers("127.0.0.1", port):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the adapter's WebSocket listener did not open on {port}")
        time.sleep(0.1)


def conditions(args: argparse.Namespace) -> dict[str, Any]:
    try:
        load: tuple[float, ...] = os.getloadavg()
    except OSError:
        load = ()
    return {
        **environment(),
        "loadavg_at_start": [round(v, 2) for v in load],
        "broker": args.broker,
        "reuse_node": args.reuse_node,
        "broker_nofile": args.broker_nofile,
        "broker_plugins": args.broker_plugins,
        "workers": args.workers,
        "ws_share": args.ws_share,
        "client_processes": args.client_processes,
        "source_addresses": args.sources,
        "open_concurrency": args.open_concurrency,
        "rounds": args.rounds,
        "adapter_settings": dict(args.adapter_setting),
        "memory": "RSS from /proc/<pid>/status (adapter: supervisor + workers; broker: beam.smp); "
        "erl: erlang:memory(total) (rabbitmqctl eval); broker_breakdown: rabbitmq-diagnostics "
        "memory_breakdown growth per client by category (its 'binary', like erlang:memory, counts "
        "allocated binaries whole, resident or not)",
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    raise_own_nofile()
    with contextlib.suppress(ImportError):
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())

    started_at = datetime.datetime.now(datetime.UTC)
    run = Run(args)
    cond = conditions(args)
    status = 1
    try:
        status = asyncio.run(run.run())
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("interrupted: everything started was stopped", file=sys.stderr)
        status = 130
    except Exception as error:  # noqa: BLE001 - reported; what ran is still written out
        print(f"failed: {error!r}", file=sys.stderr)
        status = 1
    finally:
        with contextlib.suppress(OSError):
            for path in run.directory.iterdir():
                path.unlink()
            run.directory.rmdir()
    if run.results:
        print()
        print(table(run.results))
        json_path = Path(args.json) if args.json else RESULTS / f"scale-{started_at:%Y%m%d-%H%M%S}.json"
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(
            json.dumps(
                {
                    "started": started_at.isoformat(timespec="seconds"),
                    "conditions": cond,
                    "measurements": [m.to_json() for m in run.results],
                },
                indent=2,
            )
        )
        print(f"wrote {json_path}")
    return status


if __name__ == "__main__":
    sys.exit(main())
