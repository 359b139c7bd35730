"""JMS message selectors (adapter/mapping/selector.py): the JMS 1.1 rules, three-valued logic,
ActiveMQ's numeric reading of header text, and refusals of bad or hostile selectors."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapter.mapping.selector import MAX_SELECTOR_LENGTH, SelectorError, compile_selector

MESSAGE = {
    "color": "red",
    "weight": "7",
    "price": "2.5",
    "name": "a_b%c",
    "flag": "true",
    "JMSPriority": 5,
    "JMSType": "order",
}


def matches(selector: str, message: dict[str, object] = MESSAGE) -> bool:
    return compile_selector(selector).matches(message.get)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("color = 'red'", True),
        ("color <> 'red'", False),
        ("color = 'Red'", False),  # strings are case-sensitive
        ("COLOR = 'red'", False),  # so are identifiers
        ("color = 'red' and weight between 1 and 9", True),  # keywords are not
        ("weight > 5", True),  # header text that looks like a number compares as one
        ("weight = 7.0", True),
        ("price < 3", True),
        ("price * 2 = 5", True),
        ("weight / 2 = 3", True),  # integer division truncates, as in Java
        ("weight - 10 = -3", True),
        ("-weight = -7", True),
        ("JMSPriority + 1 = 6", True),
        ("0x10 = 16", True),
        ("010 = 8", True),  # octal, as ActiveMQ reads Java literals
        ("1.5e1 = 15", True),
        ("weight BETWEEN 5 AND 10", True),
        ("weight NOT BETWEEN 5 AND 10", False),
        ("color IN ('green', 'red')", True),
        ("color NOT IN ('red')", False),
        ("name LIKE 'a%'", True),
        ("name LIKE 'a_b_c'", True),
        ("name LIKE 'a!_b!%c' ESCAPE '!'", True),
        ("name LIKE 'a!_x%' ESCAPE '!'", False),
        ("name NOT LIKE 'b%'", True),
        ("missing IS NULL", True),
        ("color IS NOT NULL", True),
        ("flag = TRUE", True),
        ("flag", True),
        ("TRUE", True),
        ("FALSE", False),
        ("color = 'it''s'", False),
        ("(color = 'blue' OR weight > 5) AND JMSType = 'order'", True),
        ("NOT (color = 'blue')", True),
        ("color > 'a'", False),  # JMS: strings compare with = and <> only
        ("weight > 'a'", False),
    ],
)
def test_selector(selector: str, expected: bool) -> None:
    assert matches(selector) is expected


@pytest.mark.parametrize(
    "selector",
    [
        "missing = 1",
        "NOT missing = 1",
        "missing <> 1",
        "missing > 1 OR missing <= 1",
        "missing LIKE '%'",
        "missing IN ('a')",
        "missing BETWEEN 1 AND 2",
        "color + 1 = 2",
        "weight / 0 = 1",
    ],
)
def test_unknown_never_matches(selector: str) -> None:
    """A NULL property, or a value that cannot take part, makes the term UNKNOWN: not matched,
    and NOT of UNKNOWN is UNKNOWN too."""
    assert matches(selector) is False


def test_text_that_is_not_a_number_compares_false_with_a_number() -> None:
    """JMS 1.1 3.8.1.1: comparing values of unlike types is false (not UNKNOWN), so NOT of it
    matches; ActiveMQ does the same (tests/activemq: test_selectors_against_hostile_numbers)."""
    message = {"weight": "abc"}
    for term in ("weight > 5", "weight = 5", "weight BETWEEN 1 AND 9", "5 < weight", "weight <> 5"):
        assert matches(term, message) is False  # type: ignore[arg-type]
        assert matches(f"NOT ({term})", message) is True  # type: ignore[arg-type]
    assert matches("NOT (missing > 5)", message) is False  # type: ignore[arg-type]  # NULL: UNKNOWN


def test_three_valued_and_or() -> None:
    assert matches("missing = 1 OR color = 'red'")  # UNKNOWN OR TRUE = TRUE
    assert not matches("missing = 1 AND color = 'red'")  # UNKNOWN AND TRUE = UNKNOWN
    assert not matches("NOT (missing = 1 AND color = 'red')")
    assert matches("NOT (missing = 1 AND color = 'blue')")  # UNKNOWN AND FALSE = FALSE


@pytest.mark.parametrize(
    ("selector", "quoted"),
    [
        ("color =", "color ="),
        ("color = 'red' AND", "AND"),
        ("foo(1) = 1", "foo(1)"),  # no functions in JMS selectors
        ("a = 'unterminated", "unterminated"),
        ("name LIKE 'a' ESCAPE 'ab'", "ab"),
        ("name LIKE 'a!' ESCAPE '!'", "a!"),
    ],
)
def test_invalid_selectors_are_refused_with_the_text_quoted(selector: str, quoted: str) -> None:
    with pytest.raises(SelectorError) as error:
        compile_selector(selector)
    assert quoted in str(error.value)


def test_hostile_selectors_are_refused_cheaply() -> None:
    with pytest.raises(SelectorError, match="longer than"):
        compile_selector("a = 1 OR " * (MAX_SELECTOR_LENGTH // 8) + "a = 1")
    with pytest.raises(SelectorError, match="nested deeper"):
        compile_selector("(" * 100 + "a = 1" + ")" * 100)
    with pytest.raises(SelectorError, match="empty"):
        compile_selector("   ")


VALUES = st.none() | st.sampled_from(["1", "2", "x", "true", "-3", "2.5"]) | st.integers(-3, 3)


@settings(max_examples=300, deadline=None)
@given(st.fixed_dictionaries({"a": VALUES, "b": VALUES}))
def test_excluded_middle_holds_only_for_known_values(message: dict[str, object]) -> None:
    """P OR NOT P matches exactly when P is not UNKNOWN, for every value a header can have."""
    for term in ("a = 1", "a > b", "a + b = 2", "a LIKE '1%'", "a IN ('1', 'x')", "a BETWEEN b AND 2"):
        p = matches(term, message)
        not_p = matches(f"NOT ({term})", message)
        assert not (p and not_p), term
        assert matches(f"({term}) OR NOT ({term})", message) is (p or not_p), term
