"""A private three-node RabbitMQ cluster on this machine, for tests/cluster (and one stand-alone
private node with the STOMP plugins, for bench/scale.py and bench/fanout.py: ``private_node``;
the benches import this module, so it must not import pytest).

Owns starting, clustering, killing, restarting and removing the nodes.  Each node is the
machine's own RabbitMQ (the ``rabbitmq-server`` on the PATH) run with its own node name
(``stomp-cluster-<pid>-<n>@localhost``), its own AMQP and Erlang distribution ports (free ports
picked at run time, on 127.0.0.1 only), and its own configuration, plugin list (none), data and
log directories in a temporary directory.  The nodes run as the ``rabbitmq`` user, so they share
its Erlang cookie with each other and with ``rabbitmqctl``; the machine's own node
(``rabbit@localhost`` on 5672, with the STOMP plugins the compat tests use) is never named, so
it is never joined, stopped or otherwise touched.

Only documented RabbitMQ 3.10 environment variables are used (RABBITMQ_NODENAME, _NODE_PORT,
_NODE_IP_ADDRESS, _DIST_PORT, _MNESIA_BASE, _LOG_BASE, _CONFIG_FILE, _ADVANCED_CONFIG_FILE,
_CONF_ENV_FILE, _ENABLED_PLUGINS_FILE, _PID_FILE), in an otherwise empty environment, so neither
/etc/rabbitmq/rabbitmq-env.conf nor the test process's own variables reach the nodes.

A node runs in the foreground as a child process in its own session (not ``-detached``), so the
test process holds a handle on it: ``stop`` asks for a clean stop and ``kill`` sends SIGKILL to
the Erlang VM, as a crash would.  Nodes left behind by a test run that was itself killed are
found by their names (the pid in the name is no longer alive) and stopped at the next start.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

USER = "rabbitmq"
PREFIX = "stomp-cluster"
# ports the machine's own broker and its plugins use (or may use): never given to a test node
RESERVED_PORTS = frozenset({4369, 5671, 5672, 15672, 15674, 15675, 25672, 61613, 61614})
START_TIMEOUT = 120.0  # seconds for one node to boot (about 10-20 s on an idle 2-core machine)

T = TypeVar("T")


class ClusterUnavailable(RuntimeError):
    """What tests/cluster needs is missing; the message says what (the tests fail with it)."""


def _scripts_dir() -> Path:
    """The directory of the real ``rabbitmq-server`` script.  Debian's /usr/sbin/rabbitmq-server
    is a wrapper that sends the server's output to /var/log/rabbitmq/startup_log (the machine's
    own node's file), so the script behind it is run instead."""
    found = shutil.which("rabbitmq-server")
    if found is None:
        raise ClusterUnavailable(
            "tests/cluster needs RabbitMQ installed (rabbitmq-server is not on the PATH)"
        )
    real = Path(os.path.realpath(found))
    if real.name != "rabbitmq-server":  # Debian's rabbitmq-script-wrapper
        real = real.parent / "rabbitmq-server"
    if not (real.parent / "rabbitmqctl").exists():
        raise ClusterUnavailable(f"tests/cluster: no rabbitmqctl beside {real}")
    return real.parent


def _as_rabbitmq() -> list[str]:
    """The command prefix that runs a program as the rabbitmq user (so it uses that user's
    Erlang cookie)."""
    try:
        pwd.getpwnam(USER)
    except KeyError as error:
        raise ClusterUnavailable("tests/cluster needs the 'rabbitmq' user of a RabbitMQ package") from error
    if pwd.getpwuid(os.geteuid()).pw_name == USER:
        return []
    if os.geteuid() != 0:
        raise ClusterUnavailable(
            "tests/cluster runs RabbitMQ nodes as the 'rabbitmq' user: run the tests as root "
            "(as CI does) or as that user"
        )
    runuser = shutil.which("runuser")
    if runuser is None:
        raise ClusterUnavailable("tests/cluster needs runuser (util-linux) to run nodes as 'rabbitmq'")
    return [runuser, "-u", USER, "--"]


def _free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports nothing listens on now, none of them RESERVED_PORTS."""
    ports: list[int] = []
    while len(ports) < count:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in ports and port not in RESERVED_PORTS:
            ports.append(port)
    return ports


def _parallel(work: Callable[[T], Any], items: Iterable[T]) -> list[Any]:
    items = list(items)
    with ThreadPoolExecutor(max(1, len(items))) as pool:
        return list(pool.map(work, items))


@dataclass
class RabbitNode:
    """One node: its name, ports, directory and (while it runs) its process."""

    name: str
    amqp_port: int
    dist_port: int
    directory: Path
    scripts: Path
    prefix: list[str]
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    # what a node of another user (bench/scale.py, bench/fanout.py) needs beyond a cluster node:
    # plugins, more rabbitmq.conf lines (their listeners), and the soft file limit the VM starts
    # with (RabbitMQ sizes its socket limit from it)
    plugins: tuple[str, ...] = ()
    config_lines: tuple[str, ...] = ()
    nofile: int | None = None

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.amqp_port}/"

    @property
    def home(self) -> str:
        return pwd.getpwnam(USER).pw_dir

    def _env(self) -> dict[str, str]:
        d = self.directory
        return {
            "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
            "HOME": self.home,  # where the rabbitmq user's .erlang.cookie is
            "LANG": "C.UTF-8",
            "RABBITMQ_NODENAME": self.name,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.amqp_port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_MNESIA_BASE": str(d / "mnesia"),
            "RABBITMQ_LOG_BASE": str(d / "log"),
            "RABBITMQ_CONFIG_FILE": str(d / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(d / "advanced.config"),  # absent: none
            "RABBITMQ_CONF_ENV_FILE": str(d / "rabbitmq-env.conf"),  # empty: not /etc/rabbitmq's
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(d / "enabled_plugins"),
            "RABBITMQ_PID_FILE": str(d / "node.pid"),
            # distribution and epmd on loopback only, as the machine's own node is configured
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            "ERL_FLAGS": "-kernel inet_dist_use_interface {127,0,0,1}",
        }

    def _command(self, program: str, *args: str) -> list[str]:
        env = [f"{key}={value}" for key, value in self._env().items()]
        return [*self.prefix, "env", "-i", *env, str(self.scripts / program), *args]

    def write_files(self) -> None:
        d = self.directory
        d.mkdir()
        (d / "rabbitmq.conf").write_text(
            "# a private node (tests/cluster/rabbit.py)\n"
            f"listeners.tcp.1 = 127.0.0.1:{self.amqp_port}\n"
            + "".join(f"{line}\n" for line in self.config_lines)
        )
        # tests/cluster needs no plugin; the benches ask for the STOMP ones
        (d / "enabled_plugins").write_text(f"[{','.join(self.plugins)}].\n")
        (d / "rabbitmq-env.conf").write_text("")
        for path in (d, *d.iterdir()):
            shutil.chown(path, USER, USER)

    def start(self) -> None:
        """Start the VM (returns at once; ``wait_started`` waits for the boot)."""
        assert not self.running, f"{self.name} is already running"
        with (self.directory / "console.log").open("ab") as log:
            command = self._command("rabbitmq-server")
            if self.nofile is not None:
                # runuser's pam_limits sets the soft limit back to 1024 (init's default), so it is
                # raised after it, by util-linux's prlimit (up to the hard limit)
                at = len(self.prefix)
                command[at:at] = ["prlimit", f"--nofile={self.nofile}:"]
            self.process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.directory,
                start_new_session=True,
            )

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def ctl(
        self, *args: str, timeout: float = 60.0, check: bool = True, program: str = "rabbitmqctl"
    ) -> subprocess.CompletedProcess[str]:
        """``rabbitmqctl -n <this node> args...`` (or another CLI tool, ``program``:
        rabbitmq-diagnostics, rabbitmq-plugins) as the rabbitmq user."""
        result = subprocess.run(
            self._command(program, "-n", self.name, *args),
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd="/",
        )
        if check and result.returncode != 0:
            raise ClusterUnavailable(
                f"{program} -n {self.name} {' '.join(args)} failed ({result.returncode}): "
                f"{result.stdout[-500:]}{result.stderr[-1500:]}\n{self.log_tail()}"
            )
        return result

    def wait_started(self, timeout: float = START_TIMEOUT) -> None:
        """Until the node has booted (``rabbitmqctl await_startup``; it fails at once while the
        node has not even registered its name, hence the loop)."""
        deadline = time.monotonic() + timeout
        while True:
            if not self.running:
                raise ClusterUnavailable(f"{self.name} exited while starting:\n{self.log_tail()}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ClusterUnavailable(
                    f"{self.name} did not start within {timeout:.0f} s:\n{self.log_tail()}"
                )
            result = self.ctl(
                "await_startup", "--timeout", str(int(max(remaining, 1))), timeout=remaining + 15, check=False
            )
            if result.returncode == 0:
                return
            time.sleep(0.5)

    def pid(self) -> int | None:
        """The Erlang VM's process id (from the pid file RabbitMQ writes when it boots)."""
        with contextlib.suppress(OSError, ValueError):
            return int((self.directory / "node.pid").read_text().strip())
        return None

    def kill(self) -> None:
        """SIGKILL the Erlang VM, as a crash or a lost machine would end it: no connection is
        closed cleanly, the other nodes see the node down."""
        pid = self.pid()
        assert pid is not None and self.process is not None, f"{self.name} has no pid file"
        os.kill(pid, signal.SIGKILL)
        self.process.wait(30)

    def stop(self) -> None:
        """A clean stop (``rabbitmqctl stop``), then SIGKILL to what is left of the session."""
        if self.process is None:
            return
        if self.running:
            with contextlib.suppress(subprocess.TimeoutExpired, ClusterUnavailable):
                self.ctl("stop", timeout=60, check=False)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(30)
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def log_tail(self, lines: int = 30) -> str:
        texts = []
        for path in (self.directory / "console.log", self.directory / "log" / f"{self.name}.log"):
            with contextlib.suppress(OSError):
                texts.append(
                    f"--- {path}:\n" + "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
                )
        return "\n".join(texts)


def private_node(
    label: str,
    *,
    extra_ports: int = 0,
    plugins: Iterable[str] = (),
    nofile: int | None = None,
) -> tuple[RabbitNode, list[int]]:
    """One stand-alone node named ``<label>-<pid>-1@localhost`` in a new temporary directory
    (``node.directory.parent``, removed by ``remove_private_node``), with ``extra_ports`` more
    free ports for the caller's listeners (returned; put them in ``node.config_lines`` before
    ``start``).  Leftovers of an earlier run of the same ``label`` whose process is gone are
    stopped and removed first, as RabbitCluster does for its own."""
    scripts = _scripts_dir()
    prefix = _as_rabbitmq()
    _stop_leftovers(scripts, prefix, label)
    base = Path(tempfile.mkdtemp(prefix=f"{label}-{os.getpid()}-"))
    os.chmod(base, 0o755)  # mkdtemp's 0700 would keep the rabbitmq user out
    ports = _free_ports(2 + extra_ports)
    node = RabbitNode(
        f"{label}-{os.getpid()}-1@localhost",
        ports[0],
        ports[1],
        base / "node",
        scripts,
        prefix,
        plugins=tuple(plugins),
        nofile=nofile,
    )
    return node, ports[2:]


def remove_private_node(node: RabbitNode) -> None:
    """Stop a node of ``private_node`` (whatever state it is in) and remove its directory."""
    try:
        node.stop()
    finally:
        shutil.rmtree(node.directory.parent, ignore_errors=True)


class RabbitCluster:
    """Three (``size``) nodes, clustered with the first; stopped and removed by ``close``."""

    def __init__(self, size: int = 3) -> None:
        self.scripts = _scripts_dir()
        self.prefix = _as_rabbitmq()
        _stop_leftovers(self.scripts, self.prefix)
        self.base = Path(tempfile.mkdtemp(prefix=f"{PREFIX}-{os.getpid()}-"))
        os.chmod(self.base, 0o755)  # mkdtemp's 0700 would keep the rabbitmq user out
        ports = _free_ports(2 * size)
        self.nodes = [
            RabbitNode(
                f"{PREFIX}-{os.getpid()}-{i + 1}@localhost",
                ports[2 * i],
                ports[2 * i + 1],
                self.base / f"node{i + 1}",
                self.scripts,
                self.prefix,
            )
            for i in range(size)
        ]

    @property
    def urls(self) -> str:
        """All nodes as a comma-separated ``--amqp-url`` list."""
        return ",".join(node.url for node in self.nodes)

    def urls_from(self, first: RabbitNode) -> str:
        """All nodes, ``first`` first (the adapter's first login goes to the first node)."""
        ordered = [first] + [node for node in self.nodes if node is not first]
        return ",".join(node.url for node in ordered)

    def node_named(self, name: str) -> RabbitNode:
        return next(node for node in self.nodes if node.name == name)

    def start(self) -> None:
        """Start every node at once, then join the others to the first one by one."""
        for node in self.nodes:
            node.write_files()
            node.start()
        _parallel(lambda node: node.wait_started(), self.nodes)
        seed = self.nodes[0]
        for node in self.nodes[1:]:
            node.ctl("stop_app")
            node.ctl("join_cluster", seed.name)
            node.ctl("start_app")
        self.check_clustered()

    def check_clustered(self) -> None:
        status = json.loads(self.nodes[0].ctl("cluster_status", "--formatter", "json").stdout)
        running = set(status.get("running_nodes", []))
        expected = {node.name for node in self.nodes}
        if running != expected:
            raise ClusterUnavailable(
                f"cluster not formed: running {sorted(running)}, expected {sorted(expected)}"
            )

    def ensure_running(self) -> None:
        """Bring back what a test took away: restart killed nodes, start stopped apps (all at
        once), and check that all nodes run in one cluster."""

        def revive(node: RabbitNode) -> None:
            if not node.running:
                node.start()
                node.wait_started()
            elif node.ctl("await_startup", "--timeout", "1", check=False).returncode != 0:
                node.ctl("start_app", timeout=START_TIMEOUT)

        _parallel(revive, self.nodes)
        self.check_clustered()

    def quorum_leader(self, queue: str) -> RabbitNode:
        """The node that holds the leader of quorum queue ``queue`` (vhost "/")."""
        for node in self.nodes:
            if not node.running:
                continue
            out = node.ctl("list_queues", "name", "leader", "--no-table-headers", "--quiet").stdout
            for line in out.splitlines():
                parts = line.split("\t")
                if len(parts) == 2 and parts[0] == queue:
                    return self.node_named(parts[1].strip())
            raise AssertionError(f"no quorum queue {queue!r} on {node.name}: {out!r}")
        raise AssertionError("no node runs")

    def queue_counts(self, queue: str) -> tuple[int, int]:
        """(ready, unacknowledged) messages of ``queue`` (vhost "/"), as a running node sees
        them.  (A quorum queue keeps counting a consumer whose node is down as a consumer, so
        its consumer count cannot say that every channel is done with it.)"""
        node = next(node for node in self.nodes if node.running)
        out = node.ctl(
            "list_queues",
            "name",
            "messages_ready",
            "messages_unacknowledged",
            "--no-table-headers",
            "--quiet",
        ).stdout
        for line in out.splitlines():
            parts = line.split("\t")
            if len(parts) == 3 and parts[0] == queue:
                return int(parts[1]), int(parts[2])
        raise AssertionError(f"no queue {queue!r} on {node.name}: {out!r}")

    def close(self) -> None:
        """Stop every node (in parallel) and remove the directory, whatever state they are in."""
        try:
            _parallel(lambda node: node.stop(), self.nodes)
        finally:
            shutil.rmtree(self.base, ignore_errors=True)


def _stop_leftovers(scripts: Path, prefix: list[str], label: str = PREFIX) -> None:
    """Stop the nodes and remove the directories of earlier runs (of nodes named ``label``-...)
    whose test process is gone (a run killed before its teardown)."""
    epmd = shutil.which("epmd")
    names = ""
    if epmd is not None:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            names = subprocess.run([epmd, "-names"], capture_output=True, text=True, timeout=10).stdout
    for short, pid in re.findall(rf"^name ({re.escape(label)}-(\d+)-\d+) at port", names, re.MULTILINE):
        if not _alive(int(pid)):
            with contextlib.suppress(subprocess.SubprocessError):
                subprocess.run(
                    [
                        *prefix,
                        "env",
                        f"HOME={pwd.getpwnam(USER).pw_dir}",
                        str(scripts / "rabbitmqctl"),
                        "-n",
                        f"{short}@localhost",
                        "stop",
                    ],
                    capture_output=True,
                    timeout=60,
                    cwd="/",
                )
    for path in Path(tempfile.gettempdir()).glob(f"{label}-*-*"):
        match = re.fullmatch(rf"{re.escape(label)}-(\d+)-.*", path.name)
        if match and not _alive(int(match.group(1))):
            shutil.rmtree(path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
