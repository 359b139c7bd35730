"""Pure parts of the operator's view: counters and their label bounds, the histogram, the JSON log
format, and the new settings (adapter/server/stats.py, adapter/logs.py, adapter/config/)."""

from __future__ import annotations

import json
import logging
import re
import sys
from pathlib import Path

import pytest

from adapter.config import ConfigError, load_settings
from adapter.logs import JsonLinesFormatter
from adapter.server.stats import (
    MAX_ERROR_MESSAGES,
    OTHER,
    REPLY_QUEUE_LABEL,
    TEMP_QUEUE_LABEL,
    TEMP_TOPIC_LABEL,
    DestinationCounts,
    Histogram,
    LabelBound,
    ServerStats,
    TrafficCounts,
)


def test_histogram_buckets_are_cumulative() -> None:
    histogram = Histogram((0.001, 0.01, 0.1))
    for seconds in (0.0005, 0.001, 0.005, 0.05, 3.0):
        histogram.observe(seconds)
    assert histogram.cumulative() == [("0.001", 2), ("0.01", 3), ("0.1", 4), ("+Inf", 5)]
    assert histogram.observations == 5
    assert histogram.total == pytest.approx(3.0565)


def test_unknown_client_commands_are_other() -> None:
    counts = TrafficCounts()
    counts.add_frames_received({"SEND": 3, "HELLO": 1, "GET": 2})
    assert counts.frames_received == {"SEND": 3, OTHER: 3}


def test_error_messages_are_bounded() -> None:
    counts = TrafficCounts()
    counts.add_errors_sent({f"message {n}": 1 for n in range(MAX_ERROR_MESSAGES + 5)})
    assert len(counts.errors_sent) == MAX_ERROR_MESSAGES + 1
    assert counts.errors_sent[OTHER] == 5
    counts.add_errors_sent({"message 0": 2})  # a known message keeps its series
    assert counts.errors_sent["message 0"] == 3


def test_merging_adds_every_counter() -> None:
    first = TrafficCounts(messages_published=2, bytes_sent=10, paused_seconds={"broker": 0.5})
    first.add_frames_received({"SEND": 2})
    second = TrafficCounts(messages_published=1, acks=4, paused_seconds={"broker": 0.25, "input": 1.0})
    second.add_frames_received({"SEND": 1, "ACK": 4})
    merged = first.merged(second)
    assert merged.messages_published == 3 and merged.acks == 4 and merged.bytes_sent == 10
    assert merged.frames_received == {"SEND": 3, "ACK": 4}
    assert merged.paused_seconds == {"broker": 0.75, "input": 1.0}
    assert first.messages_published == 2  # the operands are left alone


def test_destinations_past_the_bound_are_other() -> None:
    counts = DestinationCounts(2)
    for destination in ("/queue/a", "/topic/b", "/queue/c", "/queue/a", "/queue/d", "/topic/b"):
        counts.count_published(destination)
    assert counts.published == {"/queue/a": 2, "/topic/b": 2, OTHER: 2}
    counts.count_delivered("/queue/c")  # not admitted by publishing: still other for deliveries
    counts.count_delivered("/queue/a")
    assert counts.delivered == {OTHER: 1, "/queue/a": 1}


def test_temporary_destinations_share_a_series_outside_the_bound() -> None:
    counts = DestinationCounts(1)
    for n in range(50):
        counts.count_published(f"/reply-queue/amq.gen-{n}")
        counts.count_delivered(f"/temp-queue/t{n}")
    counts.count_published("/queue/a")  # the bound is still free for a real destination
    assert counts.published == {REPLY_QUEUE_LABEL: 50, "/queue/a": 1}
    assert counts.delivered == {TEMP_QUEUE_LABEL: 50}
    assert counts.label("/queue/b") == OTHER
    assert counts.label("/temp-topic/private") == TEMP_TOPIC_LABEL
    assert counts.label(OTHER) == OTHER  # a destination named like the shared label is not admitted


def test_destinations_beyond_the_bound_are_not_remembered() -> None:
    counts = DestinationCounts(3)
    for n in range(10_000):
        counts.count_published(f"/queue/q{n}")
    assert len(counts.published) == 4 and counts.published[OTHER] == 9_997
    assert len(counts._admitted) == 3


def test_a_label_bound_is_sticky() -> None:
    bound = LabelBound(2)
    assert [bound.fold(label) for label in ("/queue/a", OTHER, "/queue/b", "/queue/c", "/queue/a")] == [
        "/queue/a",
        OTHER,
        "/queue/b",
        OTHER,
        "/queue/a",
    ]
    assert bound.fold(TEMP_QUEUE_LABEL) == TEMP_QUEUE_LABEL
    assert bound.fold("/queue/c") == OTHER  # once other, always other: sums never go down


def test_receipt_latency_has_a_histogram_per_command() -> None:
    stats = ServerStats()
    stats.observe_receipt("SEND", 0.002)
    stats.observe_receipt("SEND", 0.0004)
    stats.observe_receipt("SUBSCRIBE", 0.02)
    assert {command: h.observations for command, h in stats.receipt_latency.items()} == {
        "SEND": 2,
        "SUBSCRIBE": 1,
    }
    assert stats.receipt_latency["SEND"].total == pytest.approx(0.0024)


def _record(message: str, *args: object, **extra: object) -> logging.LogRecord:
    record = logging.LogRecord("adapter.connection", logging.INFO, __file__, 1, message, args, None)
    record.__dict__.update(extra)
    return record


def test_json_lines_carry_the_fields() -> None:
    line = JsonLinesFormatter().format(
        _record("connection closed peer=%s", "1.2.3.4:5", fields={"event": "connection_closed", "frames": 3})
    )
    assert "\n" not in line
    entry = json.loads(line)
    assert entry["message"] == "connection closed peer=1.2.3.4:5"
    assert entry["level"] == "INFO" and entry["logger"] == "adapter.connection"
    assert entry["event"] == "connection_closed" and entry["frames"] == 3
    assert entry["time"].endswith("+00:00")


def test_json_fields_never_replace_the_base_keys() -> None:
    entry = json.loads(
        JsonLinesFormatter().format(_record("real", fields={"message": "forged", "level": "X"}))
    )
    assert entry["message"] == "real" and entry["level"] == "INFO"


def test_json_exceptions_stay_on_one_line() -> None:
    try:
        raise RuntimeError("boom\nsecond line")
    except RuntimeError:
        record = logging.LogRecord("adapter", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    line = JsonLinesFormatter().format(record)
    assert "\n" not in line
    assert "RuntimeError: boom" in json.loads(line)["exception"]


def test_new_settings_default_to_off_and_text() -> None:
    settings = load_settings(None, {})
    assert settings.http_listen is None
    assert settings.log_format == "text"
    assert settings.metrics_destinations == 0


def test_metrics_destinations_from_each_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ini = tmp_path / "adapter.ini"
    ini.write_text("adapter.metrics_destinations = 20\n")
    assert load_settings(ini, {}).metrics_destinations == 20
    monkeypatch.setenv("STOMP_ADAPTER_METRICS_DESTINATIONS", "30")
    assert load_settings(ini, {}).metrics_destinations == 30
    assert load_settings(ini, {"metrics_destinations": "40"}).metrics_destinations == 40
    with pytest.raises(ConfigError, match=r"--metrics-destinations = '-1': must be an integer from 0 to"):
        load_settings(None, {"metrics_destinations": "-1"})


def test_new_settings_from_each_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ini = tmp_path / "adapter.ini"
    ini.write_text("adapter.http_listen = 127.0.0.1:9613\nadapter.log_format = JSON\n")
    settings = load_settings(ini, {})
    assert settings.http_listen == "127.0.0.1:9613" and settings.log_format == "json"
    monkeypatch.setenv("STOMP_ADAPTER_HTTP_LISTEN", "[::1]:9614")
    assert load_settings(ini, {}).http_listen == "[::1]:9614"
    assert load_settings(ini, {"http_listen": "0.0.0.0:9615", "log_format": "text"}).log_format == "text"
    ini.write_text("adapter.http_listen = none\n")
    monkeypatch.delenv("STOMP_ADAPTER_HTTP_LISTEN")
    assert load_settings(ini, {}).http_listen is None


def test_bad_new_settings_name_the_key(tmp_path: Path) -> None:
    ini = tmp_path / "adapter.ini"
    ini.write_text("adapter.log_format = yaml\n")
    with pytest.raises(ConfigError, match=r"adapter.log_format = 'yaml': must be one of text, json"):
        load_settings(ini, {})
    with pytest.raises(ConfigError, match=r"command line: --http-listen = .*or none for no HTTP port"):
        load_settings(None, {"http_listen": "localhost:99999"})


def test_dashboard_uses_only_series_the_adapter_exports() -> None:
    """docs/grafana-dashboard.json must not chart a name the adapter does not expose."""
    from prometheus_client.parser import text_string_to_metric_families

    from adapter.cli import build_server
    from adapter.server.metrics import render

    # with the per-destination series on, whose families exist only then
    server = build_server(load_settings(None, {"listeners": ["127.0.0.1:0"], "metrics_destinations": 5}))
    text = render(server.registry).decode()
    exported = {sample.name for family in text_string_to_metric_families(text) for sample in family.samples}
    # a family without samples yet (ERROR frames by message, before the first ERROR) has its HELP line
    exported |= {line.split()[2] for line in text.splitlines() if line.startswith("# HELP ")}
    # and a histogram without observations yet (receipts by command) has its TYPE line
    exported |= {
        line.split()[2] + suffix
        for line in text.splitlines()
        if line.startswith("# TYPE ") and line.endswith(" histogram")
        for suffix in ("_bucket", "_count", "_sum")
    }
    dashboard = json.loads((Path(__file__).parents[2] / "docs" / "grafana-dashboard.json").read_text())
    expressions = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    charted = {
        name for expr in expressions for name in re.findall(r"\b((?:stomp_adapter|process)_\w+)\{", expr)
    }
    assert charted and charted <= exported, charted - exported
