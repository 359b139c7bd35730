"""TLS scenarios: what TLS on either side of the adapter costs, against plain TCP in the same run.

``python -m bench.tls`` (needs Debian's stunnel4 and trustme, both installed by ``scripts/test``
and ``.ci/run``) sets up, with certificates made for the run:

1. **TLS listener vs plain listener**: one adapter with both; the bench compares them as its two
   sides (``--adapter-port`` = the TLS listener with ``--adapter-tls-ca``, ``--plugin-port`` = the
   plain one), alternating rounds, so "A/P" is TLS/plain.
2. **amqps:// vs amqp:// to the broker**: two adapters, one reaching the broker through stunnel
   (TLS terminated in front of RabbitMQ's plain port), one directly; "A/P" is amqps/amqp.

Arguments after ``--`` go to ``python -m bench`` (default: ``--scenarios queue,persistent,connect
--rounds 2 --duration 4``).  Results land in bench/results/ like every bench run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import trustme

from .services import free_port, wait_port

DEFAULT_ARGS = ["--scenarios", "queue,persistent,connect", "--rounds", "2", "--duration", "4"]


def main(argv: list[str]) -> int:
    bench_args = argv[argv.index("--") + 1 :] if "--" in argv else DEFAULT_ARGS
    stunnel = shutil.which("stunnel4") or shutil.which("stunnel")
    if not stunnel:
        raise SystemExit("stunnel4 is needed: apt-get install stunnel4")
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
        stunnel_port = free_port()
        (directory / "stunnel.conf").write_text(
            f"foreground = yes\npid =\n[amqps]\naccept = 127.0.0.1:{stunnel_port}\n"
            f"connect = 127.0.0.1:5672\ncert = {directory / 'server.pem'}\n"
        )
        start([stunnel, str(directory / "stunnel.conf")], {}, stunnel_port, "stunnel")
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
                f"amqps://guest:guest@localhost:{stunnel_port}/",
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
        print("== 2. adapter with amqps:// through stunnel (A) vs amqp:// (P)", flush=True)
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
