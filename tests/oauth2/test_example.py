"""README.md's "OAuth 2.0" example (examples/oauth2_refresh.py), run as a user would run it,
against an adapter in front of the private oauth2 node."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from cryptography.hazmat.primitives import serialization

from tests.oauth2.oauth2_node import KID, TokenIssuer
from tests.support import AdapterProcess

REPO = Path(__file__).resolve().parents[2]


def test_the_readme_example_logs_in_with_a_token_and_refreshes_it(
    oauth2_adapter: Callable[..., AdapterProcess], issuer: TokenIssuer, tmp_path: Path
) -> None:
    adapter = oauth2_adapter()
    key = tmp_path / "signing-key-private.pem"
    key.write_bytes(
        issuer.key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    done = subprocess.run(
        [sys.executable, "-m", "examples.oauth2_refresh", "--key", str(key), "--kid", KID]
        + ["--port", str(adapter.port), "--rounds", "2"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    # (a MESSAGE is printed by stomp.py's thread: its place among the refreshes may vary)
    assert sorted(done.stdout.splitlines()) == [
        "MESSAGE message 0",
        "MESSAGE message 1",
        "token refreshed 1",
        "token refreshed 2",
    ]
