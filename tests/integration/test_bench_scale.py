"""``python -m bench.scale`` end to end, small: 20 clients (10 over TCP, 10 over WebSocket, from
two client processes and two source addresses) against an adapter it starts with 2 workers and
against RabbitMQ's STOMP and Web STOMP plugins, two fan-out rounds.

It runs on the machine's broker (``--broker shared``: 5672, the plugins on 61613 and 15674, only
read) because booting a private node per side costs more than CI can spend here; the private
node path is what bench/scale.py runs by default and docs/performance.md ("Scale") reports.
The figures themselves are not checked (timing goes in bench/): only that every client
subscribed, every message reached every client, and the memory readings were taken.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support import broker_answers

REPO = Path(__file__).resolve().parents[2]


def test_bench_scale_subscribes_every_client_and_delivers_every_round_on_both_sides(tmp_path: Path) -> None:
    for port, what in ((5672, "RabbitMQ"), (61613, "its STOMP plugin"), (15674, "its Web STOMP plugin")):
        assert broker_answers("127.0.0.1", port), f"{what} is not listening on 127.0.0.1:{port}"
    out = tmp_path / "scale.json"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.scale",
            "--broker",
            "shared",
            "--clients",
            "20",
            "--ws-share",
            "0.5",
            "--client-processes",
            "2",
            "--source-addresses",
            "2",
            "--rounds",
            "2",
            "--round-gap",
            "0.2",
            "--settle",
            "0.5",
            "--json",
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=55,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    data = json.loads(out.read_text())
    assert data["conditions"]["workers"] == 2
    assert data["conditions"]["source_addresses"] == ["127.0.0.2", "127.0.0.3"]
    sides = {m["side"]: m for m in data["measurements"]}
    assert sorted(sides) == ["adapter", "plugin"]
    for side, m in sides.items():
        assert (m["clients"], m["tcp"], m["ws"]) == (20, 10, 10), side
        assert (m["subscribed"], m["failed"], m["lost"]) == (20, 0, 0), (side, m["errors"])
        assert m["fanout"]["deliveries"] == 40 and m["fanout"]["missing"] == 0, side
        assert len(m["fanout"]["round_max_ms"]) == 2, side
        assert None not in m["broker_rss_kb"], side
        assert m["open_rate_per_s"] > 0, side
    assert None not in sides["adapter"]["adapter_rss_kb"]
    assert sides["plugin"]["adapter_rss_kb"] == [None, None]
