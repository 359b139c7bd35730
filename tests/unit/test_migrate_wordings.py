"""The table of ERROR wordings that mean the same outcome (adapter/migrate/wordings.py), the
pure comparison of a connection's ERRORs with it, and the replay's use of it."""

from __future__ import annotations

import re
from pathlib import Path

from adapter.migrate.replay import _Connection
from adapter.migrate.wordings import EQUIVALENT_ERRORS, Wording, compare_errors

SELECTOR_AMQ = "Couldn't create TopicSubscription: javax.jms.InvalidSelectorException: Not a valid selector"
CLIENT_ID_AMQ = "Broker: localhost - Client: app-7 already connected from tcp://127.0.0.1:40112"


def test_each_wording_is_a_row_of_the_profile_table_in_the_migration_guide() -> None:
    guide = (Path(__file__).parents[2] / "docs" / "migration-activemq.md").read_text()
    first_columns = [line.split("|")[1].strip() for line in guide.splitlines() if line.startswith("| ")]
    for wording in EQUIVALENT_ERRORS:
        assert any(column.startswith(wording.name) for column in first_columns), wording.name
    assert len({w.name for w in EQUIVALENT_ERRORS}) == len(EQUIVALENT_ERRORS)


def test_activemqs_wording_translates_to_the_adapters_with_its_groups() -> None:
    selector, client_id = EQUIVALENT_ERRORS
    assert selector.adapter_says(SELECTOR_AMQ) == "Invalid selector"
    assert client_id.adapter_says(CLIENT_ID_AMQ) == "Client app-7 already connected"
    assert selector.adapter_says("Invalid selector") is None  # only ActiveMQ's wording is translated
    assert client_id.adapter_says("Client app-7 already connected") is None


def test_equal_texts_match_in_any_order_and_nothing_differs() -> None:
    result = compare_errors(["b", "a", "a"], ["a", "b", "a"])
    assert not result.differs and result.equivalent == []


def test_a_wording_of_the_table_is_equivalent_not_a_difference() -> None:
    result = compare_errors(
        [SELECTOR_AMQ, CLIENT_ID_AMQ], ["Client app-7 already connected", "Invalid selector"]
    )
    assert not result.differs
    assert sorted(name for _, _, name in result.equivalent) == sorted(w.name for w in EQUIVALENT_ERRORS)
    assert (SELECTOR_AMQ, "Invalid selector", "Invalid selector") in result.equivalent


def test_the_wrong_group_or_another_text_still_differs() -> None:
    result = compare_errors([CLIENT_ID_AMQ], ["Client app-8 already connected"])
    assert result.differs
    assert result.recorded_only == [CLIENT_ID_AMQ]
    assert result.replayed_only == ["Client app-8 already connected"]
    assert result.equivalent == []


def test_an_error_only_one_side_sends_is_never_equivalent() -> None:
    assert compare_errors([SELECTOR_AMQ], []).recorded_only == [SELECTOR_AMQ]
    assert compare_errors([], ["Invalid selector"]).replayed_only == ["Invalid selector"]
    # two recorded, one replayed: one pair is equivalent, the other ERROR is the difference
    result = compare_errors([SELECTOR_AMQ, SELECTOR_AMQ], ["Invalid selector"])
    assert len(result.equivalent) == 1 and result.recorded_only == [SELECTOR_AMQ]


def test_only_whats_left_after_the_matches_is_reported() -> None:
    result = compare_errors(["same", SELECTOR_AMQ, "gone"], ["Invalid selector", "same", "new"])
    assert result.recorded_only == ["gone"] and result.replayed_only == ["new"]
    assert [name for _, _, name in result.equivalent] == ["Invalid selector"]


def test_a_table_can_be_given() -> None:
    table = [Wording("x", re.compile(r"Queue (\w+) is gone"), r"NOT_FOUND - no queue '\1'")]
    result = compare_errors(["Queue q1 is gone, sorry"], ["NOT_FOUND - no queue 'q1'"], table)
    assert result.equivalent == [("Queue q1 is gone, sorry", "NOT_FOUND - no queue 'q1'", "x")]
    assert compare_errors([SELECTOR_AMQ], ["Invalid selector"], table).differs  # not in that table


def _result(recorded: list[str], replayed: list[str]):
    connection = _Connection("c-1", "10.0.0.7:5000", set())
    connection.recorded.errors = recorded
    connection.replayed.errors = replayed
    return connection.result()


def test_the_replay_reports_an_equivalent_wording_as_equivalent_and_no_difference() -> None:
    result = _result([CLIENT_ID_AMQ], ["Client app-7 already connected"])
    assert result.differences == []
    assert result.equivalent == [
        {
            "what": "ERROR",
            "wording": "A second connection with a `client-id` already connected",
            "recorded": CLIENT_ID_AMQ,
            "replayed": "Client app-7 already connected",
        }
    ]
    text = result.describe()
    assert text.splitlines()[0].endswith(": same") and "ERROR equivalent" in text
    assert result.as_json()["equivalent"] == result.equivalent


def test_the_replay_reports_the_errors_left_over_as_the_difference() -> None:
    result = _result([SELECTOR_AMQ, "No durable subscription exists"], ["Invalid selector"])
    assert result.differences == [
        {"what": "ERROR", "key": "", "recorded": ["No durable subscription exists"], "replayed": []}
    ]
    assert len(result.equivalent) == 1
    assert result.describe().splitlines()[0].endswith(": differs")
