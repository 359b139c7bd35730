"""The pure core stays pure: stomp/, mapping/, session/ and the AMQP framing module
(amqp/wire.py, amqp/framing.py) import no I/O or framework code."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "adapter"
PURE = sorted(
    [
        *ROOT.joinpath("stomp").glob("*.py"),
        *ROOT.joinpath("mapping").glob("*.py"),
        *ROOT.joinpath("session").glob("*.py"),
        ROOT / "caps.py",
        ROOT / "errors.py",
        ROOT / "codegen.py",
        ROOT / "amqp" / "wire.py",
        ROOT / "amqp" / "framing.py",
        ROOT / "server" / "proxy_protocol.py",
        ROOT / "server" / "brokers.py",
        ROOT / "server" / "resolver.py",
    ]
)
FORBIDDEN = {"asyncio", "aio_pika", "aiormq", "pamqp", "pydantic", "pydantic_settings", "socket", "uvloop"}


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("path", PURE, ids=lambda p: str(p.relative_to(ROOT)))
def test_pure_core_imports_no_io(path):
    assert not imported_modules(path) & FORBIDDEN


def test_only_the_amqp_package_talks_to_the_broker():
    for path in ROOT.rglob("*.py"):
        if path.parent.name == "amqp":
            continue
        assert not imported_modules(path) & {"aio_pika", "aiormq", "pamqp"}, path
