"""Functions generated once, at import, from a table: the unrolled form of a loop over the table.

Owns the one mechanism the adapter uses for that (as ``dataclasses`` and ``collections.namedtuple``
do in the standard library).  Used where a table is the clearest single source of truth and the
code it drives runs for every message, so that a loop over the table would cost a measurable
share of the per-message path: the AMQP basic properties (``BASIC_PROPERTIES`` in
adapter/mapping/properties.py), encoded and decoded in adapter/amqp/wire.py and rendered as
MESSAGE headers in adapter/mapping/properties.py.  Measured figures: docs/architecture.md,
"One table for the basic properties".

The generated source is registered with ``linecache`` under a readable file name, so tracebacks
and debuggers show its lines; ``generated_source`` returns it for reading and for tests.

Pure: no I/O.
"""

from __future__ import annotations

import linecache
from collections.abc import Callable, Mapping
from typing import Any

_SOURCES: dict[str, str] = {}


def generate_function(name: str, source: str, namespace: Mapping[str, object]) -> Callable[..., Any]:
    """Compile ``source``, which defines the function ``name``, with ``namespace`` as its globals."""
    filename = f"<generated {name}>"
    _SOURCES[name] = source
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    scope: dict[str, Any] = dict(namespace)
    exec(compile(source, filename, "exec"), scope)  # noqa: S102 - our own source, built from a constant table
    function: Callable[..., Any] = scope[name]
    return function


def generated_source(name: str) -> str:
    """The source ``generate_function`` compiled for ``name``."""
    return _SOURCES[name]
