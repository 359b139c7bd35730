"""What ``python -m adapter.migrate replay`` writes while it runs and when it ends.

Owns the replay's output: one result per connection as soon as that connection has ended (its
description, or one JSON object per line with ``--json -``), the progress line on a terminal
(connections replayed / total, with differences so far), and the summary, also of a replay that
was interrupted or stopped.  The wording is pure (``progress_line``, ``Summary``); ``Output``
writes it to the streams it is given.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, TextIO

from .replay import ConnectionResult

__all__ = ["Output", "Summary", "progress_line"]

# a terminal's carriage return and "erase to the end of the line"
_CLEAR: str = "\r\x1b[K"


def progress_line(replayed: int, total: int, differing: int, seconds: float) -> str:
    """The progress of a replay, as one line (without its end of line)."""
    return f"replay: {replayed}/{total} connections replayed, {differing} with differences, {seconds:.0f} s"


@dataclass(frozen=True)
class Summary:
    """What a replay did, when it ended: all of it, or what it had done when it was interrupted
    (``interrupted``: the signal's name) or stopped (``stopped``: why)."""

    replayed: int
    differing: int
    total: int
    cut_short: int = 0
    seconds: float = 0.0
    interrupted: str | None = None
    stopped: str | None = None

    def line(self) -> str:
        text = f"{self.replayed} connections replayed, {self.differing} with differences"
        if self.interrupted is None and self.stopped is None:
            return text
        cause = f"interrupted by {self.interrupted}" if self.interrupted else "stopped"
        left = self.total - self.replayed - self.cut_short
        return (
            f"{cause}: {text} (of {self.total} recorded; {self.cut_short} cut short,"
            f" {left} not started) in {self.seconds:.0f} s"
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "summary": {
                "replayed": self.replayed,
                "with_differences": self.differing,
                "connections": self.total,
                "cut_short": self.cut_short,
                "seconds": round(self.seconds, 1),
                "interrupted": self.interrupted,
                "stopped": self.stopped,
            }
        }


class Output:
    """The replay's writer: results on ``out`` as they come (text, or JSON lines), a progress
    line on ``err`` when ``progress`` (a terminal), the summary at the end."""

    def __init__(self, out: TextIO, err: TextIO, *, total: int, json_lines: bool, progress: bool) -> None:
        self.out = out
        self.err = err
        self.total = total
        self.json_lines = json_lines
        self.progress = progress
        self.replayed = 0
        self.differing = 0
        self.started = time.monotonic()
        self._progress_shown = False

    def result(self, result: ConnectionResult) -> None:
        self.replayed += 1
        self.differing += bool(result.differences)
        self._clear_progress()
        if self.json_lines:
            self.out.write(json.dumps(result.as_json()) + "\n")
        else:
            self.out.write(result.describe() + "\n")
        self.out.flush()
        self.show_progress()

    def show_progress(self) -> None:
        if not self.progress:
            return
        line = progress_line(self.replayed, self.total, self.differing, time.monotonic() - self.started)
        self.err.write(_CLEAR + line)
        self.err.flush()
        self._progress_shown = True

    def _clear_progress(self) -> None:
        if self._progress_shown:
            self.err.write(_CLEAR)
            self.err.flush()
            self._progress_shown = False

    def summary(self, summary: Summary) -> None:
        self._clear_progress()
        if summary.stopped:
            self.err.write(f"replay: {summary.stopped}\n")
            self.err.flush()
        if self.json_lines:
            self.out.write(json.dumps(summary.as_json()) + "\n")
        else:
            self.out.write(summary.line() + "\n")
        self.out.flush()
