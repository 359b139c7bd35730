"""TLS scenarios: what TLS on either side of the adapter costs, against plain TCP in the same run.

``python -m bench.tls`` (needs trustme, from the project's dev extras, and Debian's haproxy, or
stunnel4 with ``--terminator stunnel``; ``.ci/run`` installs both packages) sets up, with
certificates made for the run:

1. **TLS listener vs plain listener**: one adapter with both; the bench compares them as its two
   sides (``--adapter-port`` = the TLS listener with ``--adapter-tls-ca``, ``--plugin-port`` = the
   plain one), alternating rounds, so "A/P" is TLS/plain.
2. **amqps:// vs amqp:// to the broker**: two adapters, one reaching the broker through a TLS
   terminator in front of RabbitMQ's plain port, one directly; "A/P" is amqps/amqp.

The terminator is HAProxy (one thread, event-driven, as TLS is commonly terminated in front of a
RabbitMQ cluster) unless ``--terminator stunnel`` is given.  stunnel runs a thread per connection
and costs several milliseconds of CPU per connection on the bench's own CPUs, so with it the
``connect`` ratio measures stunnel more than the adapter (docs/performance.md, "TLS").

Arguments after ``--`` go to ``python -m bench`` (default: ``--scenarios queue,persistent,connect
--rounds 2 --duration 4``).  Results land in bench/results/ like every bench run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import trustme

from .services import free_port, wait_port

DEFAULT_ARGS = ["--scenarios", "queue,persistent,connect", "--rounds", "2", "--duration", "4"]


def terminator_command(kind: str, directory: Path, port: int) -> list[str]:
    """The command line of a TLS server on 127.0.0.1:``port`` that forwards to the broker's plain
    AMQP port, with the run's certificate; its configuration file goes into ``directory``."""
    certificate = directory / "server.pem"
    if kind == "haproxy":
        haproxy = shutil.which("haproxy") or "/usr/sbin/haproxy"
        if not Path(haproxy).exists():
            raise SystemExit("haproxy is needed: apt-get install haproxy")
        (directory / "haproxy.cfg").write_text(
            "global\n    maxconn 4000\n    nbthread 1\n"
            "defaults\n    mode tcp\n    timeout connect 5s\n"
            "    timeout client 1h\n    timeout server 1h\n"
            f"frontend amqps\n    bind 127.0.0.1:{port} ssl crt {certificate}\n"
            "    default_backend broker\n"
            "backend broker\n    server rabbitmq 127.0.0.1:5672\n"
        )
        return [haproxy, "-db", "-f", str(directory / "haproxy.cfg")]
    stunnel = shutil.which("stunnel4") or shutil.which("stunnel")
    if not stunnel:
        raise SystemExit("stunnel4 is needed: apt-get install stunnel4")
    (directory / "stunnel.conf").write_text(
        f"foreground = yes\npid =\n[amqps]\naccept = 127.0.0.1:{port}\n"
        f"connect = 127.0.0.1:5672\ncert = {certificate}\n"
    )
    return [stunnel, str(directory / "stunnel.conf")]


def main(argv: list[str]) -> int:
    own = argv[: argv.index("--")] if "--" in argv else argv
    bench_args = argv[argv.index("--") + 1 :] if "--" in argv else DEFAULT_ARGS
    parser = argparse.ArgumentParser(prog="python -m bench.tls", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--terminator",
        choices=("haproxy", "stunnel"),
        default="haproxy",
        help="the TLS server in front of the broker for the amqps:// side (default haproxy)",
    )
    options = parser.parse_args(own)
    directory = Path(tempfile.mkdtemp(prefix="bench-tls-"))
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(directory / "ca.pem"))
    ca.issue_cert("localhost", "127.0.0.1").private_key_and_cert_chain_pem.write_to_path(
        str(directory / "server.pem")
    )
    processes: list[subprocess.Popen[bytes]] = []

    def start(args: list[str], env: dict[str, str], port: int, what: str) -> None:
        log = (directory / f"{what}.log").open("wb")
        process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **env})
        processes.append(process)
        wait_port(port, process, what)

    try:
        terminator_port = free_port()
        start(
            terminator_command(options.terminator, directory, terminator_port),
            {},
            terminator_port,
            options.terminator,
        )
        adapter = [sys.executable, "-m", "adapter", "--log-level", "warning"]
        plain, tls = free_port(), free_port()
        start(
            [*adapter, "--listen", f"127.0.0.1:{plain}"],
            {
                "STOMP_ADAPTER_SSL_LISTENERS": f"127.0.0.1:{tls}",
                "STOMP_ADAPTER_SSL_CERTFILE": str(directory / "server.pem"),
            },
            plain,
            "adapter-both",
        )
        amqps = free_port()
        start(
            [
                *adapter,
                "--listen",
                f"127.0.0.1:{amqps}",
                "--amqp-url",
                f"amqps://guest:guest@localhost:{terminator_port}/",
            ],
            {"STOMP_ADAPTER_AMQP_TLS_CAFILE": str(directory / "ca.pem")},
            amqps,
            "adapter-amqps",
        )
        bench = [sys.executable, "-m", "bench", *bench_args]
        print("== 1. TLS listener (A) vs plain listener (P), one adapter process", flush=True)
        first = subprocess.run(
            [
                *bench,
                "--adapter-port",
                str(tls),
                "--plugin-port",
                str(plain),
                "--adapter-tls-ca",
                str(directory / "ca.pem"),
            ]
        ).returncode
        print(f"== 2. adapter with amqps:// through {options.terminator} (A) vs amqp:// (P)", flush=True)
        second = subprocess.run(
            [*bench, "--adapter-port", str(amqps), "--plugin-port", str(plain)]
        ).returncode
        return first or second
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(15)
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
