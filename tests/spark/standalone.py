"""The long-lived Spark processes of tests/spark: a standalone cluster (a master and two
workers) and a Spark Connect server whose applications run on that cluster, all started from the
installed PySpark (``SPARK_HOME`` is the ``pyspark`` package) and bound to 127.0.0.1.

Owns those processes: each runs in its own process group with its output in a log file, is
ready when its log says so, and is stopped (SIGTERM, then SIGKILL) by the fixture that started
it.  Ports: the master, the workers and every web UI take a free port from the kernel (port 0)
and report it in their logs; the Connect server is given one found free just before it starts.
The standalone master's REST submission server (fixed port 6066) is switched off.

Executors find the ``adapter`` package as on a node where it is installed: their Python is this
interpreter (``spark.pyspark.python``), whose environment has the project installed.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pyspark

SPARK_HOME = Path(pyspark.__file__).resolve().parent

# Each worker offers this much; the Connect server's application takes CONNECT_CORES of the
# four cores, so that a spark-submit job (SUBMIT_CORES) finds the rest free at the same time.
WORKER_CORES = 2
WORKER_MEMORY = "2g"
CONNECT_CORES = 2
SUBMIT_CORES = 2
EXECUTOR_MEMORY = "512m"


class SparkProcessError(RuntimeError):
    """A Spark process that did not start; the text ends with the tail of its log."""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def spark_environment(**extra: str) -> dict[str, str]:
    """The environment of every Spark process: loopback only, this interpreter's PySpark."""
    environment = dict(os.environ)
    environment.update(
        SPARK_HOME=str(SPARK_HOME),
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_LOCAL_HOSTNAME="127.0.0.1",
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
    )
    # a Connect client's settings in the tests' environment are not the servers'
    environment.pop("SPARK_REMOTE", None)
    environment.pop("SPARK_CONNECT_MODE_ENABLED", None)
    environment.update(extra)
    return environment


class SparkProcess:
    """One JVM (with its launcher script) in its own process group, its output in ``log``."""

    def __init__(self, name: str, command: list[str], log: Path, environment: dict[str, str]) -> None:
        self.name = name
        self.log = log
        with log.open("wb") as output:
            self.process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                env=environment,
                cwd=log.parent,
                start_new_session=True,
            )

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, pattern: str, timeout: float) -> re.Match[str]:
        """The first match of ``pattern`` in the log, waiting for it up to ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while True:
            found = re.search(pattern, self.text())
            if found:
                return found
            if self.process.poll() is not None or time.monotonic() > deadline:
                status = "exited" if self.process.poll() is not None else f"not ready after {timeout:g} s"
                raise SparkProcessError(f"{self.name} {status}; its log ends:\n{self.text()[-3000:]}")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            # pid (comm) state ppid ...: comm may hold spaces, so split after its ")"
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _command_line(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


class StandaloneCluster:
    """A standalone master and two workers on 127.0.0.1 (``url`` is the master's)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.processes: list[SparkProcess] = []
        environment = spark_environment(
            SPARK_DAEMON_MEMORY="256m",
            SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false",
            SPARK_WORKER_DIR=str(directory / "work"),
        )
        spark_class = str(SPARK_HOME / "bin" / "spark-class")
        try:
            master = self._start(
                "the standalone master",
                [spark_class, "org.apache.spark.deploy.master.Master"]
                + ["--host", "127.0.0.1", "--port", "0", "--webui-port", "0"],
                "master.log",
                environment,
            )
            self.url = master.wait_for(r"Starting Spark master at (spark://127\.0\.0\.1:\d+)", 90).group(1)
            master.wait_for(r"I have been elected leader", 60)
            self.workers = [
                self._start(
                    f"standalone worker {n}",
                    [spark_class, "org.apache.spark.deploy.worker.Worker"]
                    + ["--host", "127.0.0.1", "--port", "0", "--webui-port", "0"]
                    + ["--cores", str(WORKER_CORES), "--memory", WORKER_MEMORY]
                    + ["--work-dir", str(directory / f"work-{n}"), self.url],
                    f"worker-{n}.log",
                    environment,
                )
                for n in (1, 2)
            ]
            for worker in self.workers:
                worker.wait_for(r"Successfully registered with master", 90)
        except BaseException:
            self.stop()
            raise

    def _start(self, name: str, command: list[str], log: str, environment: dict[str, str]) -> SparkProcess:
        process = SparkProcess(name, command, self.directory / log, environment)
        self.processes.append(process)
        return process

    def executors(self) -> list[tuple[int, str]]:
        """(pid, command line) of every executor JVM the workers run now."""
        return [
            (pid, line)
            for worker in self.workers
            for pid in _children(worker.process.pid)
            if "CoarseGrainedExecutorBackend" in (line := _command_line(pid))
        ]

    def submit_options(self) -> list[str]:
        """spark-submit options for a job on this cluster next to the Connect server's."""
        return [
            "--master",
            self.url,
            "--conf",
            f"spark.cores.max={SUBMIT_CORES}",
            "--conf",
            f"spark.executor.memory={EXECUTOR_MEMORY}",
            "--conf",
            "spark.ui.enabled=false",
            "--conf",
            f"spark.pyspark.python={sys.executable}",
        ]

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.stop()


class ConnectServer:
    """A Spark Connect server (``pyspark/sbin/start-connect-server.sh --wait``) whose
    application runs on ``cluster``; ``url`` is what ``SparkSession.builder.remote`` takes."""

    def __init__(self, cluster: StandaloneCluster, directory: Path) -> None:
        port = free_port()
        self.url = f"sc://127.0.0.1:{port}"
        confs = {
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(port),
            "spark.ui.enabled": "false",
            "spark.cores.max": str(CONNECT_CORES),
            "spark.executor.cores": "1",
            "spark.executor.memory": EXECUTOR_MEMORY,
            "spark.pyspark.python": sys.executable,
            "spark.sql.shuffle.partitions": "2",
            "spark.sql.streaming.pollingDelay": "100ms",
        }
        command = [str(SPARK_HOME / "sbin" / "start-connect-server.sh"), "--wait", "--master", cluster.url]
        command += ["--driver-memory", "768m"]
        for name, value in confs.items():
            command += ["--conf", f"{name}={value}"]
        environment = spark_environment(SPARK_PID_DIR=str(directory), SPARK_LOG_DIR=str(directory))
        self.process = SparkProcess(
            "the Spark Connect server", command, directory / "connect.log", environment
        )
        try:
            self.process.wait_for(r"Spark Connect server started", 120)
        except BaseException:
            self.process.stop()
            raise

    def stop(self) -> None:
        self.process.stop()
