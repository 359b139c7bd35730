"""WebSocket scenarios: the adapter's web_stomp listener against rabbitmq_web_stomp, and what
WebSocket costs the adapter against its own plain TCP listener, in the same run.

``python -m bench.web`` starts one adapter with a TCP and a WebSocket listener (path /ws) and runs:

1. **adapter vs plugin over WebSocket**: ``python -m bench --websocket both`` with the plugin's
   port 15674 (``rabbitmq-plugins enable rabbitmq_web_stomp``); "A/P" is adapter/plugin.
2. **WebSocket vs TCP on the adapter**: ``--websocket adapter`` with the adapter's own TCP listener
   as the "plugin" side, so "A/P" is WebSocket/TCP and the adapter CPU columns of both sides
   come from the same process (the CPU per message that WebSocket adds).

The bench client sends one WebSocket message per write, and producers write batches of frames,
so a batch of SENDs travels in one message (a browser's stompjs sends one message per frame);
every MESSAGE from a server is its own WebSocket message, as both servers frame them.

Arguments after ``--`` go to ``python -m bench`` (default: ``--scenarios queue,topic,connect
--rounds 2 --duration 4``); add ``--ws-compress`` there to offer permessage-deflate as browsers
do (both servers accept it by default).  ``--plugin-port`` before ``--`` changes the plugin's port.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from .services import free_port, wait_port

DEFAULT_ARGS = ["--scenarios", "queue,topic,connect", "--rounds", "2", "--duration", "4"]


def main(argv: list[str]) -> int:
    own = argv[: argv.index("--")] if "--" in argv else argv
    bench_args = argv[argv.index("--") + 1 :] if "--" in argv else DEFAULT_ARGS
    parser = argparse.ArgumentParser(
        prog="python -m bench.web",
        description="The adapter's WebSocket listener against rabbitmq_web_stomp, then against the "
        "adapter's own TCP listener. Arguments after -- go to python -m bench "
        f"(default: {' '.join(DEFAULT_ARGS)}).",
    )
    parser.add_argument(
        "--plugin-port",
        type=int,
        default=15674,
        help="rabbitmq_web_stomp's port, path /ws (default 15674)",
    )
    plugin_port = str(parser.parse_args(own).plugin_port)
    directory = Path(tempfile.mkdtemp(prefix="bench-web-"))
    tcp, web = free_port(), free_port()
    with (directory / "adapter.log").open("wb") as log:
        adapter = subprocess.Popen(
            [sys.executable, "-m", "adapter", "--log-level", "warning", "--listen", f"127.0.0.1:{tcp}"],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "STOMP_ADAPTER_WEB_STOMP_LISTENERS": f"127.0.0.1:{web}"},
        )
    try:
        wait_port(tcp, adapter, "the adapter (TCP)")
        wait_port(web, adapter, "the adapter (WebSocket)")
        bench = [sys.executable, "-m", "bench", *bench_args]
        print("== 1. adapter (A) vs rabbitmq_web_stomp (P), both over WebSocket", flush=True)
        first = subprocess.run(
            [*bench, "--adapter-port", str(web), "--plugin-port", plugin_port, "--websocket", "both"]
        ).returncode
        print("== 2. the adapter over WebSocket (A) vs over TCP (P), one adapter process", flush=True)
        second = subprocess.run(
            [*bench, "--adapter-port", str(web), "--plugin-port", str(tcp), "--websocket", "adapter"]
        ).returncode
        return first or second
    finally:
        adapter.terminate()
        adapter.wait(15)
        if adapter.returncode in (0, -signal.SIGTERM):
            shutil.rmtree(directory, ignore_errors=True)
        else:  # keep what the adapter said about its failure
            print(f"the adapter exited with {adapter.returncode}; its log: {directory / 'adapter.log'}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
