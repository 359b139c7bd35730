"""The layers hold.

* The pure core stays pure: stomp/, mapping/, session/, the AMQP framing modules
  (amqp/wire.py, amqp/framing.py) and every module of rules (the cores and rules of amqp/, a
  feature package's rules.py) import no I/O or framework code, asyncio least of all.
* The parts of ``adapter`` import each other only downwards (``DIRECTION``, the diagram
  docs/architecture.md shows), nothing imports cli, spark or migrate, and no modules import each other in
  a circle.

The import graph is read with ``ast``, never by importing: every ``import`` and ``from ... import``
counts wherever it stands (module level, inside a function, under ``if TYPE_CHECKING:``, in a
``try``), relative ones resolved against the importing module's package.  A ``TYPE_CHECKING``
import counts for the direction and for cycles alike: it names the other module in this one's
types, so it is a dependency of the design even though it costs nothing at run time (the
cycles this check was written against were all of that kind).  A module that only needs a few
attributes of one that builds on it names them in a ``typing.Protocol`` instead
(adapter/server/health.py ``Serving``, metrics.py ``Observed``).  ``from package import name``
is an import of the submodule ``package.name`` when there is one, of the package's
``__init__.py`` otherwise.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from textwrap import dedent

import pytest

REPO = Path(__file__).resolve().parents[2]
ROOT = REPO / "adapter"
PURE = sorted(
    [
        *ROOT.joinpath("stomp").glob("*.py"),
        *ROOT.joinpath("mapping").glob("*.py"),
        *ROOT.joinpath("session").glob("*.py"),
        ROOT / "caps.py",
        ROOT / "errors.py",
        ROOT / "numbers.py",
        ROOT / "codegen.py",
        ROOT / "amqp" / "wire.py",
        ROOT / "amqp" / "framing.py",
        # the rules beside their runtimes (pool.py / pool_runtime.py, ...) and the sans-IO cores
        ROOT / "amqp" / "client.py",
        ROOT / "amqp" / "channel.py",
        ROOT / "amqp" / "errors.py",
        ROOT / "amqp" / "pool.py",
        ROOT / "amqp" / "multiplex.py",
        ROOT / "amqp" / "probe.py",
        *(ROOT / feature / "rules.py" for feature in ("sharing", "dispatch")),
        ROOT / "server" / "proxy_protocol.py",
        ROOT / "amqp" / "brokers.py",
        ROOT / "amqp" / "resolver.py",
        ROOT / "tap" / "recorder.py",
    ]
)
FORBIDDEN = {"asyncio", "aio_pika", "aiormq", "pamqp", "pydantic", "pydantic_settings", "socket", "uvloop"}

# ------------------------------------------------------------------------------- the direction
# A part is the first name under adapter/: a module (cli, session, ...) or a sub-package (server,
# amqp, ...); ``__init__`` is adapter/__init__.py.  Each line of DIRECTION is a chain of levels,
# top first; a part may import its own modules and every part of a level after its own on the
# same line (any of them, not only the next).  Parts of one level, ``(a | b)`` or ``a, b``, stand
# side by side: that line lets neither import the other.  ``foundation`` stands for FOUNDATION.
# docs/architecture.md shows DIRECTION verbatim (test_the_docs_show_the_direction) and says why.
# A feature package (FEATURES) holds its pure rules and its runtime side by side; they stand on
# two levels, as ``sharing.rules`` and ``sharing.runtime`` (its __init__ is a docstring and
# stands with the rules).
DIRECTION = """\
__main__ -> cli -> config -> server -> sharing.runtime -> (session | amqp | dispatch.runtime) -> (sharing.rules | dispatch.rules) -> (stomp | mapping) -> foundation
                             spark  -> amqp, stomp, mapping, foundation
                             migrate -> mapping, stomp, foundation
            cli -> tap -> stomp, foundation
"""  # noqa: E501 - the diagram reads best on one line per chain
FOUNDATION = frozenset({"__init__", "busy_poll", "caps", "codegen", "errors", "liveness", "logs", "numbers"})
FEATURES = frozenset({"sharing", "dispatch"})


def may_import_from(direction: str, foundation: frozenset[str]) -> dict[str, frozenset[str]]:
    """The parts each part may import, read from a DIRECTION diagram."""

    def parts(level: str) -> set[str]:
        names = {name.strip() for name in level.strip().strip("()").replace("|", ",").split(",")}
        return (names - {"foundation"}) | (foundation if "foundation" in names else set())

    allowed: dict[str, set[str]] = {name: set() for name in foundation}
    for line in direction.splitlines():
        levels = [parts(level) for level in line.split("->")]
        for depth, level in enumerate(levels):
            below = set().union(*levels[depth + 1 :])
            for part in level:
                allowed.setdefault(part, set()).update(below)
    return {part: frozenset(below) for part, below in allowed.items()}


MAY_IMPORT = may_import_from(DIRECTION, FOUNDATION)


@dataclass(frozen=True, slots=True)
class Import:
    """``source`` imports ``target`` (both dotted module names) at ``path``:``line``."""

    source: str
    target: str
    path: Path
    line: int

    def where(self) -> str:
        return f"{self.path}:{self.line}"


def modules_of(root: Path) -> dict[str, Path]:
    """Every module of the package in ``root`` by dotted name (a package by its own name)."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _deepest(name: str, modules: Mapping[str, Path]) -> str | None:
    """The module ``import name`` runs last: ``name`` itself, or the nearest package above it."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(root: Path) -> list[Import]:
    """Every import between two modules of the package in ``root``, read with ast."""
    package = root.name
    modules = modules_of(root)
    found = []
    for source, path in modules.items():
        # the package a relative import starts from: a package's __init__ is in itself
        here = source if path.name == "__init__.py" else source.rpartition(".")[0]
        shown = path.relative_to(root.parent)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str | None] = []
            if isinstance(node, ast.Import):
                targets = [_deepest(alias.name, modules) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here.split(".")
                    if node.level - 1 >= len(base):
                        raise ValueError(f"{shown}:{node.lineno}: relative import beyond the package")
                    base = base[: len(base) - (node.level - 1)]
                    full = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    full = node.module or ""
                for alias in node.names:
                    submodule = f"{full}.{alias.name}"
                    targets.append(submodule if submodule in modules else _deepest(full, modules))
            for target in targets:
                if target is not None and target != source and target.split(".")[0] == package:
                    found.append(Import(source, target, shown, node.lineno))
    return sorted(found, key=lambda i: (i.source, i.target, i.line))


def _first_edges(imports: list[Import]) -> dict[str, dict[str, Import]]:
    """The graph: for each module, each module it imports, with the first line that does."""
    graph: dict[str, dict[str, Import]] = {}
    for edge in imports:
        graph.setdefault(edge.source, {}).setdefault(edge.target, edge)
    return graph


def _circles(graph: Mapping[str, Mapping[str, Import]]) -> Iterator[set[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()

    def visit(node: str) -> Iterator[set[str]]:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, {}):
            if target not in index:
                yield from visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                yield component

    for node in sorted(graph):
        if node not in index:
            yield from visit(node)


def _shortest_circle(graph: Mapping[str, Mapping[str, Import]], component: set[str]) -> list[Import]:
    """One shortest way round a component, from its first module back to it."""
    start = min(component)
    came_by: dict[str, Import] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for target, edge in sorted(graph.get(node, {}).items()):
                if target not in component or target in came_by:
                    continue
                came_by[target] = edge
                if target == start:
                    path = [edge]
                    while path[0].source != start:
                        path.insert(0, came_by[path[0].source])
                    return path
                following.append(target)
        frontier = following
    raise AssertionError(f"no way round {component}")  # pragma: no cover - a component has one


def cycles(imports: list[Import]) -> list[str]:
    """One readable message per import cycle: the modules round it, and the line of each import."""
    graph = _first_edges(imports)
    messages = []
    for component in _circles(graph):
        circle = _shortest_circle(graph, component)
        names = " -> ".join([edge.source for edge in circle] + [circle[0].source])
        lines = "".join(f"\n    {edge.where()} imports {edge.target}" for edge in circle)
        rest = sorted(component - {edge.source for edge in circle})
        also = f"\n  (in the same knot too: {', '.join(rest)})" if rest else ""
        messages.append(f"import cycle: {names}{lines}{also}")
    return messages


def part_of(module: str) -> str:
    """``adapter.server.http`` -> ``server``; ``adapter`` -> ``__init__``; in a feature package
    ``adapter.sharing.runtime`` -> ``sharing.runtime``, ``adapter.sharing`` -> ``sharing.rules``."""
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in FEATURES:
        return f"{parts[1]}.{parts[2] if len(parts) > 2 else 'rules'}"
    return parts[1] if len(parts) > 1 else "__init__"


def wrong_direction(imports: list[Import], may_import: Mapping[str, frozenset[str]]) -> list[str]:
    """One readable message per import the table does not allow, and per module of no part."""
    messages = []
    for edge in imports:
        source, target = part_of(edge.source), part_of(edge.target)
        if source == target:
            continue
        allowed = may_import.get(source)
        if allowed is None:
            messages.append(f"{edge.where()}: {edge.source} belongs to no part of DIRECTION")
        elif target not in allowed:
            messages.append(
                f"{edge.where()}: {source} must not import {target} ({edge.source} imports {edge.target});"
                f" {source} may import {', '.join(sorted(allowed)) or 'nothing of the package'}"
            )
    return messages


def unplaced(root: Path, may_import: Mapping[str, frozenset[str]]) -> list[str]:
    return [
        f"{path.relative_to(root.parent)}: part {part_of(name)!r} is not in DIRECTION: place it"
        for name, path in modules_of(root).items()
        if part_of(name) not in may_import
    ]


# ---------------------------------------------------------------------------- the adapter itself
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


def test_the_direction_reads_as_meant():
    """DIRECTION spelled out, so that a slip in the diagram or its reading shows here."""
    low = {"stomp", "mapping"} | FOUNDATION
    rules = {"sharing.rules", "dispatch.rules"} | low
    middle = {"session", "amqp", "dispatch.runtime"} | rules
    assert may_import_from(DIRECTION, FOUNDATION) == {
        "__main__": {"cli", "config", "server", "sharing.runtime"} | middle,
        "cli": {"config", "server", "sharing.runtime", "tap"} | middle,
        "config": {"server", "sharing.runtime"} | middle,
        "server": {"sharing.runtime"} | middle,
        "sharing.runtime": middle,
        "spark": {"amqp"} | low,
        "migrate": low,
        "tap": {"stomp"} | FOUNDATION,
        "session": rules,
        "amqp": rules,
        "dispatch.runtime": rules,
        "sharing.rules": low,
        "dispatch.rules": low,
        "stomp": FOUNDATION,
        "mapping": FOUNDATION,
        **{name: set() for name in FOUNDATION},
    }


def test_the_docs_show_the_direction():
    assert DIRECTION in (REPO / "docs" / "architecture.md").read_text()


def test_no_module_imports_itself_round_a_circle():
    assert cycles(imports_of(ROOT)) == []


def test_every_module_belongs_to_a_part():
    assert unplaced(ROOT, MAY_IMPORT) == []


def test_parts_import_only_downwards():
    assert wrong_direction(imports_of(ROOT), MAY_IMPORT) == []


def test_nothing_imports_cli_spark_or_migrate():
    """Said by DIRECTION already; checked on its own so that an edit of the diagram cannot undo it."""
    offending = [
        edge.where()
        for edge in imports_of(ROOT)
        if (part_of(edge.target) == "cli" and part_of(edge.source) not in {"cli", "__main__"})
        or (part_of(edge.target) == "spark" and part_of(edge.source) != "spark")
        or (part_of(edge.target) == "migrate" and part_of(edge.source) != "migrate")
    ]
    assert offending == []


def test_imports_are_all_static():
    """The graph above sees only import statements: no module imports by name at run time."""
    dynamic = [
        f"{path.relative_to(REPO)}:{node.lineno}"
        for path in sorted(ROOT.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
        and (
            (isinstance(node.func, ast.Name) and node.func.id in {"__import__", "import_module"})
            or (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
        )
    ]
    assert dynamic == []


# ----------------------------------------------------------------- the checker on a made-up tree
def make_tree(tmp_path: Path, files: Mapping[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(dedent(text))
    return tmp_path / "pkg"


TOY_RULES = {"__init__": frozenset(), "high": frozenset({"low", "__init__"}), "low": frozenset()}


def test_every_form_of_import_is_an_edge(tmp_path):
    root = make_tree(
        tmp_path,
        {
            "pkg/__init__.py": "VERSION = 1\n",
            "pkg/high/__init__.py": "from . import view\n",  # a package's own submodule
            "pkg/high/view.py": """\
                from __future__ import annotations
                from typing import TYPE_CHECKING

                import pkg.low.deep.leaf as leaf
                from .. import VERSION
                from ..low import tools
                from . import helper

                if TYPE_CHECKING:
                    from pkg.low.deep import Thing

                def later():
                    from ..low.deep.leaf import name
                    import os.path
                """,
            "pkg/high/helper.py": "from .view import *\n",
            "pkg/low/__init__.py": "",
            "pkg/low/tools.py": "",
            "pkg/low/deep/__init__.py": "class Thing: ...\n",
            "pkg/low/deep/leaf.py": "name = 1\n",
        },
    )
    edges = {(i.source, i.target, i.line) for i in imports_of(root)}
    assert edges == {
        ("pkg.high", "pkg.high.view", 1),
        ("pkg.high.view", "pkg.low.deep.leaf", 4),
        ("pkg.high.view", "pkg", 5),  # a name defined in pkg/__init__.py
        ("pkg.high.view", "pkg.low.tools", 6),  # a submodule, not pkg/low/__init__.py
        ("pkg.high.view", "pkg.high.helper", 7),
        ("pkg.high.view", "pkg.low.deep", 10),  # under TYPE_CHECKING
        ("pkg.high.view", "pkg.low.deep.leaf", 13),  # inside a function
        ("pkg.high.helper", "pkg.high.view", 1),
    }
    assert unplaced(root, TOY_RULES) == []
    assert wrong_direction(imports_of(root), TOY_RULES) == []


def test_a_cycle_is_found_and_each_import_round_it_named(tmp_path):
    root = make_tree(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/low/__init__.py": "",
            "pkg/low/a.py": "from .b import B\n",
            "pkg/low/b.py": "def f():\n    from pkg.low import c\n",
            "pkg/low/c.py": """\
                from typing import TYPE_CHECKING

                if TYPE_CHECKING:
                    from .a import A
                """,
            "pkg/low/d.py": "from . import a\n",  # leads into the circle, is not part of it
        },
    )
    assert cycles(imports_of(root)) == [
        "import cycle: pkg.low.a -> pkg.low.b -> pkg.low.c -> pkg.low.a"
        "\n    pkg/low/a.py:1 imports pkg.low.b"
        "\n    pkg/low/b.py:2 imports pkg.low.c"
        "\n    pkg/low/c.py:4 imports pkg.low.a"
    ]
    assert wrong_direction(imports_of(root), TOY_RULES) == []  # a cycle inside one part


def test_the_shortest_way_round_a_knot_is_shown_and_the_rest_listed(tmp_path):
    root = make_tree(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/low/__init__.py": "",
            "pkg/low/a.py": "from . import b, c\n",
            "pkg/low/b.py": "from . import c\n",
            "pkg/low/c.py": "from . import a\n",
        },
    )
    assert cycles(imports_of(root)) == [
        "import cycle: pkg.low.a -> pkg.low.c -> pkg.low.a"
        "\n    pkg/low/a.py:1 imports pkg.low.c"
        "\n    pkg/low/c.py:1 imports pkg.low.a"
        "\n  (in the same knot too: pkg.low.b)"
    ]


def test_an_import_upwards_is_named_with_its_line(tmp_path):
    root = make_tree(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/high.py": "from .low import tools\n",
            "pkg/low/__init__.py": "",
            "pkg/low/tools.py": "import json\n\n\ndef f():\n    from ..high import g\n",
        },
    )
    imports = imports_of(root)
    assert wrong_direction(imports, TOY_RULES) == [
        "pkg/low/tools.py:5: low must not import high (pkg.low.tools imports pkg.high);"
        " low may import nothing of the package"
    ]
    assert cycles(imports) == [
        "import cycle: pkg.high -> pkg.low.tools -> pkg.high"
        "\n    pkg/high.py:1 imports pkg.low.tools"
        "\n    pkg/low/tools.py:5 imports pkg.high"
    ]


def test_a_module_of_no_part_is_named(tmp_path):
    root = make_tree(
        tmp_path,
        {"pkg/__init__.py": "", "pkg/high.py": "from . import extra\n", "pkg/extra.py": ""},
    )
    assert unplaced(root, TOY_RULES) == ["pkg/extra.py: part 'extra' is not in DIRECTION: place it"]
    assert wrong_direction(imports_of(root), TOY_RULES) == [
        "pkg/high.py:1: high must not import extra (pkg.high imports pkg.extra);"
        " high may import __init__, low"
    ]


def test_a_clean_tree_passes(tmp_path):
    root = make_tree(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/high.py": "from .low import tools\nfrom . import low\n",
            "pkg/low/__init__.py": "from .tools import f\n",
            "pkg/low/tools.py": "def f(): ...\n",
        },
    )
    imports = imports_of(root)
    assert len(imports) == 3
    assert (
        cycles(imports) == []
        and wrong_direction(imports, TOY_RULES) == []
        and unplaced(root, TOY_RULES) == []
    )
