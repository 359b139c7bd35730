"""The benches that start private RabbitMQ nodes (bench/scale.py, bench/fanout.py) take them from
tests/cluster/rabbit.py, the one owner of such nodes; a bench runs without pytest, so importing
them must not import it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_benches_with_private_nodes_import_no_pytest() -> None:
    code = (
        "import sys, bench.fanout, bench.scale\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pytest', '_pytest')))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == "[]", result.stdout
