"""The replay's output (adapter/migrate/progress.py): results as they come, the progress line
only when asked for (a terminal), the summary of a replay that ended, was interrupted or
stopped."""

from __future__ import annotations

import io
import json

from adapter.migrate.progress import Output, Summary, progress_line
from adapter.migrate.replay import ConnectionResult


def _result(conn: str, differs: bool = False) -> ConnectionResult:
    differences = (
        [{"what": "RECEIPT r1", "key": "r1", "recorded": True, "replayed": False}] if differs else []
    )
    return ConnectionResult(conn, "10.0.0.1:4000", "guest", None, {"receipt"}, differences)


def test_json_lines_one_per_result_then_the_summary_and_no_progress_off_a_terminal() -> None:
    out, err = io.StringIO(), io.StringIO()
    output = Output(out, err, total=3, json_lines=True, progress=False)
    output.result(_result("c-1"))
    assert [json.loads(line)["conn"] for line in out.getvalue().splitlines()] == ["c-1"]
    output.result(_result("c-2", differs=True))
    output.summary(Summary(replayed=2, differing=1, total=3, cut_short=1, seconds=4.2, interrupted="SIGTERM"))
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [line.get("conn") for line in lines] == ["c-1", "c-2", None]
    assert lines[1]["differences"][0]["what"] == "RECEIPT r1"
    assert lines[2] == {
        "summary": {
            "replayed": 2,
            "with_differences": 1,
            "connections": 3,
            "cut_short": 1,
            "seconds": 4.2,
            "interrupted": "SIGTERM",
            "stopped": None,
        }
    }
    assert err.getvalue() == ""


def test_on_a_terminal_the_progress_line_is_rewritten_and_cleared_before_each_result() -> None:
    out, err = io.StringIO(), io.StringIO()
    output = Output(out, err, total=5, json_lines=False, progress=True)
    output.show_progress()
    output.result(_result("c-1", differs=True))
    assert out.getvalue().startswith("c-1 (guest@10.0.0.1:4000): differs\n")
    # shown, cleared before the result, shown again with the new counts
    assert err.getvalue().split("\r\x1b[K") == [
        "",
        progress_line(0, 5, 0, 0),
        "",
        progress_line(1, 5, 1, 0),
    ]
    output.summary(Summary(replayed=1, differing=1, total=5))
    assert err.getvalue().endswith("\r\x1b[K")  # the terminal's line left clean
    assert out.getvalue().endswith("1 connections replayed, 1 with differences\n")


def test_the_summary_of_a_replay_that_ended_is_todays_line() -> None:
    assert Summary(replayed=17, differing=3, total=17).line() == "17 connections replayed, 3 with differences"


def test_the_summary_of_an_interrupted_or_stopped_replay_says_what_was_left() -> None:
    interrupted = Summary(
        replayed=40, differing=2, total=489, cut_short=7, seconds=12.4, interrupted="SIGINT"
    )
    assert interrupted.line() == (
        "interrupted by SIGINT: 40 connections replayed, 2 with differences"
        " (of 489 recorded; 7 cut short, 442 not started) in 12 s"
    )
    out, err = io.StringIO(), io.StringIO()
    stopped = Summary(replayed=3, differing=3, total=10, stopped="the target refused the first 3 logins")
    Output(out, err, total=10, json_lines=False, progress=False).summary(stopped)
    assert err.getvalue() == "replay: the target refused the first 3 logins\n"
    assert out.getvalue().startswith("stopped: 3 connections replayed, 3 with differences (of 10 recorded")
