"""The pure parts of ``python -m bench.scale``: arguments, the plan of clients, the line protocol
between the bench and its client processes, the figures and the table (bench/scale_stats.py),
and how a client of bench/scale_fleet.py reads what a server sends (whole, byte by byte, with
trailing data)."""

from __future__ import annotations

import json
import math

import pytest

from bench.scale import adapter_ini, parse_args
from bench.scale_fleet import Fleet, Subscriber, _interleave
from bench.scale_stats import (
    Closed,
    Failed,
    Fanout,
    Measurement,
    Opened,
    ProtocolError,
    Round,
    Share,
    adapter_setting,
    breakdown_per_client,
    client_counts,
    command,
    erlang_total_kb,
    event,
    ini_text,
    parse_event,
    parse_stamp,
    per_client_kb,
    percentile,
    plan_clients,
    processes_for,
    source_addresses,
    stamp_body,
    table,
)

# ------------------------------------------------------------------------------ arguments


def test_client_counts_keep_order_and_drop_repeats() -> None:
    assert client_counts("1000,5000,10000") == [1000, 5000, 10000]
    assert client_counts("5k, 1_000,5000") == [5000, 1000]


@pytest.mark.parametrize("text", ["", ",", "0", "-5", "ten", "1000,x", "1.5k"])
def test_client_counts_refuse_what_is_not_a_positive_count(text: str) -> None:
    with pytest.raises(ValueError):
        client_counts(text)


def test_adapter_setting_is_split_at_the_first_equals_sign() -> None:
    assert adapter_setting("adapter.amqp_sessions_per_connection=8") == (
        "adapter.amqp_sessions_per_connection",
        "8",
    )
    assert adapter_setting(" adapter.amqp_url = amqp://u:p=q@h/ ") == ("adapter.amqp_url", "amqp://u:p=q@h/")


@pytest.mark.parametrize("text", ["no-equals", "=value", "two words=1", "key=a\nb"])
def test_adapter_setting_refuses_what_is_not_one_ini_line(text: str) -> None:
    with pytest.raises(ValueError):
        adapter_setting(text)


def test_ini_text_passes_settings_through_and_a_later_value_wins() -> None:
    text = ini_text(
        {"adapter.workers": "2", "adapter.http_listen": "none"},
        [("adapter.shared_subscriptions", "true"), ("adapter.workers", "1")],
    )
    assert text == "adapter.workers = 1\nadapter.http_listen = none\nadapter.shared_subscriptions = true\n"


def test_the_adapter_ini_names_the_broker_the_workers_and_the_websocket_listener() -> None:
    class Node:
        amqp_url = "amqp://guest:guest@127.0.0.1:40001/"

    ini = adapter_ini(Node(), 40002, 2)  # type: ignore[arg-type]
    assert ini["adapter.amqp_url"] == Node.amqp_url
    assert ini["adapter.workers"] == "2"
    assert ini["web_stomp.tcp.listener"] == "127.0.0.1:40002"


def test_parse_args_defaults_and_pass_through_settings() -> None:
    args = parse_args(
        [
            "--clients",
            "1000,5000",
            "--adapter-setting",
            "adapter.amqp_sessions_per_connection=8",
            "--adapter-setting",
            "adapter.shared_subscriptions=true",
        ]
    )
    assert args.clients == [1000, 5000]
    assert args.sides == ["adapter", "plugin"]
    assert args.workers == 2
    assert args.adapter_setting == [
        ("adapter.amqp_sessions_per_connection", "8"),
        ("adapter.shared_subscriptions", "true"),
    ]
    assert args.sources == ["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"]


@pytest.mark.parametrize(
    "argv",
    [
        ["--sides", "broker"],
        ["--ws-share", "1.5"],
        ["--workers", "0"],
        ["--client-processes", "0"],
        ["--source-addresses", "0"],
        ["--adapter-setting", "nothing"],
        ["--clients", "0"],
    ],
)
def test_parse_args_refuses_bad_arguments(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(argv)


# ---------------------------------------------------------------------------- the plan


def test_plan_spreads_clients_and_websockets_evenly() -> None:
    shares = plan_clients(10, 0.5, 3, ["127.0.0.2", "127.0.0.3"])
    assert shares == [Share(2, 2, "127.0.0.2"), Share(1, 2, "127.0.0.3"), Share(2, 1, "127.0.0.2")]
    assert sum(s.total for s in shares) == 10
    assert sum(s.ws for s in shares) == 5


def test_plan_drops_processes_with_nothing_to_open() -> None:
    assert plan_clients(2, 0.0, 4, ["127.0.0.2"]) == [Share(1, 0, "127.0.0.2"), Share(1, 0, "127.0.0.2")]
    assert plan_clients(3, 1.0, 1, ["127.0.0.9"]) == [Share(0, 3, "127.0.0.9")]


@pytest.mark.parametrize(
    "share,processes,sources", [(-0.1, 1, ["a"]), (1.1, 1, ["a"]), (0.5, 0, ["a"]), (0.5, 1, [])]
)
def test_plan_refuses_impossible_mixes(share: float, processes: int, sources: list[str]) -> None:
    with pytest.raises(ValueError):
        plan_clients(10, share, processes, sources)


def test_source_addresses_leave_127_0_0_1_to_the_servers() -> None:
    assert source_addresses(2) == ["127.0.0.2", "127.0.0.3"]
    assert source_addresses(250)[-1] == "127.0.0.251"
    for bad in (0, 251):
        with pytest.raises(ValueError):
            source_addresses(bad)


def test_more_processes_when_one_would_pass_its_file_limit() -> None:
    assert processes_for(10_000, 4, 15_000) == 4
    assert processes_for(40_000, 2, 15_000) == 3


def test_interleave_spreads_websockets_through_the_open() -> None:
    assert _interleave(2, 2) == ["tcp", "ws", "tcp", "ws"]
    assert _interleave(3, 0) == ["tcp"] * 3
    assert _interleave(0, 2) == ["ws", "ws"]
    order = _interleave(700, 300)
    assert order.count("ws") == 300
    assert order[:100].count("ws") == 30


# ----------------------------------------------------------------------- the line protocol


def test_commands_and_events_are_one_json_line_each() -> None:
    line = command("collect", round=3, timeout=5.0)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert json.loads(line) == {"cmd": "collect", "round": 3, "timeout": 5.0}


def test_events_round_trip() -> None:
    assert parse_event(event("opened", subscribed=9, failed=1, seconds=2.5, errors=["x"])) == Opened(
        9, 1, 2.5, ("x",)
    )
    assert parse_event(event("round", round=2, latencies_us=[5, 7], missing=1, lost=0)) == Round(
        2, (5, 7), 1, 0
    )
    assert parse_event(event("closed")) == Closed()
    assert parse_event(event("failed", error="boom")) == Failed("boom")


@pytest.mark.parametrize(
    "line",
    [
        b"not json\n",
        b"[1, 2]\n",
        b'{"event": "unknown"}\n',
        b'{"event": "opened", "subscribed": 1}\n',
        b'{"event": "opened", "subscribed": -1, "failed": 0, "seconds": 1}\n',
        b'{"event": "opened", "subscribed": true, "failed": 0, "seconds": 1}\n',
        b'{"event": "round", "round": 1, "latencies_us": 5, "missing": 0, "lost": 0}\n',
        b'{"event": "round", "round": 1, "latencies_us": ["x"], "missing": 0, "lost": 0}\n',
    ],
)
def test_bad_event_lines_are_protocol_errors(line: bytes) -> None:
    with pytest.raises(ProtocolError):
        parse_event(line)


def test_stamp_round_trip() -> None:
    assert parse_stamp(stamp_body(7, 123456789012)) == (7, 123456789012)
    with pytest.raises(ValueError):
        parse_stamp(b"hello")


# ------------------------------------------------------------------------------ the figures


def test_percentile_is_nearest_rank() -> None:
    values = list(range(1, 101))
    assert percentile(values, 50) == 50
    assert percentile(values, 99) == 99
    assert percentile(values, 100) == 100
    assert percentile(values, 0) == 1
    assert percentile([5.0], 99) == 5.0
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1], 101)


def test_fanout_pools_every_delivery_of_every_round() -> None:
    rounds = [
        [Round(1, (1000, 2000), 0, 0), Round(1, (3000,), 1, 0)],
        [Round(2, tuple(range(1000, 101_000, 1000)), 0, 0)],
    ]
    fan = Fanout.of(rounds)
    assert fan.deliveries == 103
    assert fan.missing == 1
    assert fan.max_ms == 100.0
    assert fan.round_max_ms == (3.0, 100.0)
    assert fan.p50_ms == 49.0  # the 52nd of 1, 1, 2, 2, 3, 3, 4, ... 100 ms
    assert fan.p99_ms == 99.0


def test_fanout_without_any_delivery_says_so() -> None:
    fan = Fanout.of([[Round(1, (), 4, 0)]])
    assert fan.deliveries == 0 and fan.missing == 4 and math.isnan(fan.p99_ms)


def test_memory_per_client() -> None:
    assert per_client_kb(100_000, 300_000, 1000) == 200.0
    assert per_client_kb(None, 300_000, 1000) is None
    assert per_client_kb(100, 200, 0) is None


def _measurement(side: str) -> Measurement:
    m = Measurement(side, 1000, 500, 500, subscribed=1000, open_seconds=4.0)
    m.adapter_rss_kb = (50_000, 70_000) if side == "adapter" else (None, None)
    m.broker_rss_kb = (150_000, 350_000)
    m.broker_erlang_kb = (70_000, 250_000)
    m.fanout = Fanout(3000, 0, 12.5, 40.0, 55.0, (50.0, 55.0, 41.0))
    return m


def test_a_measurement_adds_adapter_and_broker_on_the_adapter_side_only() -> None:
    adapter, plugin = _measurement("adapter"), _measurement("plugin")
    assert adapter.open_rate == 250.0
    assert adapter.adapter_kb == 20.0 and adapter.broker_kb == 200.0
    assert adapter.total_kb == 220.0
    assert plugin.total_kb == plugin.broker_kb == 200.0
    assert plugin.broker_erlang_per_client_kb == 180.0
    data = adapter.to_json()
    assert data["kb_per_client"] == {
        "adapter_plus_broker": 220.0,
        "broker": 200.0,
        "adapter": 20.0,
        "broker_erlang": 180.0,
        "broker_breakdown": {},
    }
    assert data["fanout"]["p99_ms"] == 40.0
    json.dumps(data)  # all of it serialisable
    assert plugin.to_json()["kb_per_client"]["adapter"] is None


def test_the_table_has_a_row_per_measurement_and_dashes_for_the_unknown() -> None:
    empty = Measurement("plugin", 5000, 5000, 0, subscribed=4990, failed=10)
    text = table([_measurement("adapter"), _measurement("plugin"), empty])
    lines = text.splitlines()
    assert len(lines) == 5
    assert "adapter" in lines[2] and "220" in lines[2] and "12.5" in lines[2]
    assert "(10 failed)" in lines[4] and lines[4].rstrip().endswith("-")


# ----------------------------------------------------------- what a fleet client reads


class _Transport:
    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def close(self) -> None:
        self.closed = True


CONNECTED = b"CONNECTED\nversion:1.2\nserver:x\nheart-beat:0,0\n\n\0\n"
RECEIPT = b"RECEIPT\nreceipt-id:s\n\n\0\n"


def _message(round_no: int, stamp: int) -> bytes:
    body = stamp_body(round_no, stamp)
    return (
        b"MESSAGE\nsubscription:0\ndestination:/topic/t\nmessage-id:T_0@@session-x@@1\n"
        b"content-length:%d\n\n%s\0\n" % (len(body), body)
    )


def _feed(client: Subscriber, data: bytes, how: str) -> None:
    if how == "whole":
        client.data_received(data)
    elif how == "bytes":
        for i in range(len(data)):
            client.data_received(data[i : i + 1])
    else:  # split in two at every frame's middle, with the next frame's start glued on
        half = len(data) // 2
        client.data_received(data[:half])
        client.data_received(data[half:])


@pytest.mark.parametrize("how", ["whole", "bytes", "halves"])
def test_a_client_subscribes_then_records_each_round(how: str) -> None:
    fleet = Fleet()
    client = Subscriber(fleet, b"SUBSCRIBE...\0", ws=False)
    transport = _Transport()
    client.connection_made(transport)
    _feed(client, CONNECTED, how)
    assert transport.written == [b"SUBSCRIBE...\0"] and client.state == "subscribing"
    _feed(client, RECEIPT, how)
    assert client.state == "subscribed" and fleet.subscribed == 1
    _feed(client, _message(1, 0) + b"\n\n" + _message(2, 0), how)
    assert sorted(fleet.latencies) == [1, 2]
    assert all(len(v) == 1 and v[0] > 0 for v in fleet.latencies.values())
    assert client.rest == b"" and fleet.errors == []


def test_an_error_frame_fails_the_client_and_says_why() -> None:
    fleet = Fleet()
    client = Subscriber(fleet, b"", ws=True)
    transport = _Transport()
    client.connection_made(transport)
    client.data_received(b"ERROR\nmessage:Access refused\ncontent-length:0\n\n\0")
    assert client.state == "failed" and transport.closed
    assert fleet.errors == ["ERROR 'Access refused' while connecting"]


def test_a_subscribed_client_that_loses_its_connection_counts_as_lost() -> None:
    fleet = Fleet()
    client = Subscriber(fleet, b"S", ws=False)
    client.connection_made(_Transport())
    client.data_received(CONNECTED + RECEIPT)
    client.connection_lost(None)
    assert client.state == "lost" and fleet.lost == 1 and fleet.live() == 0
    assert fleet.errors == ["connection closed while subscribed"]


def test_a_body_that_is_not_a_stamp_is_reported_not_counted() -> None:
    fleet = Fleet()
    client = Subscriber(fleet, b"S", ws=False)
    client.connection_made(_Transport())
    client.data_received(CONNECTED + RECEIPT + b"MESSAGE\ndestination:/topic/t\n\nhello\0")
    assert fleet.latencies == {} and fleet.errors == ["unexpected MESSAGE body b'hello'"]


def test_erlang_total_is_read_from_the_last_line_of_rabbitmqctl_eval() -> None:
    assert erlang_total_kb("74045240\n") == 72309
    assert erlang_total_kb("Warning: something\n1048576\n") == 1024
    assert erlang_total_kb("") is None
    assert erlang_total_kb("{badrpc,nodedown}") is None


def test_the_breakdown_per_client_keeps_what_grew_largest_first() -> None:
    before = {"queue_procs": 0, "connection_readers": 0, "binary": 1024 * 1000, "reserved_unallocated": 0}
    after = {
        "queue_procs": 30 * 1024 * 1000,
        "connection_readers": 50 * 1024 * 1000,
        "binary": 1024 * 1000 + 10,
        "mgmt_db": 2 * 1024 * 1000,
        "reserved_unallocated": 99 * 1024 * 1000,
    }
    assert breakdown_per_client(before, after, 1000) == {
        "connection_readers": 50.0,
        "queue_procs": 30.0,
        "mgmt_db": 2.0,
    }
    assert breakdown_per_client({}, after, 1000) == {}
