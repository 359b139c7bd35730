"""JMS message selectors (the SQL-92 subset of JMS 1.1, section 3.8.1), compiled once per
SUBSCRIBE into a plain Python predicate, for the ``activemq`` profile's ``selector`` header.

Owns the grammar, its compilation into closures, and JMS's evaluation rules:

* three-valued logic: an absent property is NULL; a comparison, arithmetic or LIKE involving
  NULL (or values that cannot be compared) is UNKNOWN, and AND/OR/NOT follow SQL's tables; a
  message matches only when the selector is TRUE, so a message whose property cannot be compared
  is simply not matched, as JMS requires;
* numbers: integer and decimal literals (``1``, ``1.5``, ``1e3``, ``0x1F``, ``017`` as ActiveMQ
  reads them); a property's text that looks like a number is compared as a number with a number
  (STOMP headers are all text; ActiveMQ converts them the same way);
* strings compare with ``=`` and ``<>`` only; booleans likewise;
* ``LIKE`` with ``%``, ``_`` and ``ESCAPE``; ``IN`` over string literals; ``BETWEEN``;
  ``IS [NOT] NULL``.

Why a parser library: lark builds an LALR(1) parser from the grammar below, so precedence,
keywords (case-insensitive) and error positions come from one declarative place rather than
string hacking; it is pure Python, small and maintained.  Parsing happens once per SUBSCRIBE;
per message only the compiled closures run.

Pure: no I/O, imports neither asyncio nor pydantic.  The mapping of a message's STOMP headers
and AMQP properties to the names a selector sees (``JMSPriority`` ...) belongs to the caller,
which passes a ``lookup(name) -> value or None``.
"""

from __future__ import annotations

import operator
import re
import weakref
from collections.abc import Callable
from dataclasses import dataclass

from lark import Lark, Token, Transformer, v_args
from lark.exceptions import LarkError, VisitError

# Bounds that keep a hostile SUBSCRIBE cheap: the text, and the nesting of parentheses (the tree
# is compiled recursively).
MAX_SELECTOR_LENGTH = 4096
MAX_NESTING = 50

Value = str | int | float | bool | None
Lookup = Callable[[str], Value]
Expr = Callable[[Lookup], Value]

_GRAMMAR = r"""
?start: or_expr
?or_expr: and_expr (_OR and_expr)*       -> or_
?and_expr: not_expr (_AND not_expr)*     -> and_
?not_expr: _NOT not_expr                 -> not_
         | predicate
?predicate: sum COMP_OP sum                              -> compare
          | sum _BETWEEN sum _AND sum                    -> between
          | sum _NOT _BETWEEN sum _AND sum               -> not_between
          | sum _IN "(" string ("," string)* ")"         -> in_
          | sum _NOT _IN "(" string ("," string)* ")"    -> not_in
          | sum _LIKE string (_ESCAPE string)?           -> like
          | sum _NOT _LIKE string (_ESCAPE string)?      -> not_like
          | sum _IS _NULL                                -> is_null
          | sum _IS _NOT _NULL                           -> is_not_null
          | sum
?sum: product (ADD_OP product)*          -> arithmetic
?product: unary (MUL_OP unary)*          -> arithmetic
?unary: ADD_OP unary                     -> sign
      | atom
?atom: NUMBER                            -> number
     | string
     | _TRUE                             -> true
     | _FALSE                            -> false
     | IDENT                             -> identifier
     | "(" or_expr ")"
string: STRING

_OR.2: /OR\b/i
_AND.2: /AND\b/i
_NOT.2: /NOT\b/i
_BETWEEN.2: /BETWEEN\b/i
_IN.2: /IN\b/i
_LIKE.2: /LIKE\b/i
_ESCAPE.2: /ESCAPE\b/i
_IS.2: /IS\b/i
_NULL.2: /NULL\b/i
_TRUE.2: /TRUE\b/i
_FALSE.2: /FALSE\b/i
COMP_OP: "<>" | "<=" | ">=" | "=" | "<" | ">"
ADD_OP: "+" | "-"
MUL_OP: "*" | "/"
NUMBER: /0[xX][0-9a-fA-F]+[lL]?/ | /(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?[dDfFlL]?/
STRING: /'([^']|'')*'/
IDENT: /[A-Za-z_$][A-Za-z0-9_$.]*/
%ignore /[ \t\r\n\f]+/
"""

_PARSER = Lark(_GRAMMAR, parser="lalr", maybe_placeholders=False)


class SelectorError(ValueError):
    """A selector that cannot be compiled; ``str()`` says why and quotes it."""


@dataclass(frozen=True, slots=True)
class Selector:
    """A compiled selector: ``matches(lookup)`` is True only when the selector is TRUE."""

    text: str
    _expr: Expr

    def matches(self, lookup: Lookup) -> bool:
        return self._expr(lookup) is True


def compile_selector(text: str) -> Selector:
    """Parse and compile ``text``; raises SelectorError quoting it."""
    if len(text) > MAX_SELECTOR_LENGTH:
        raise SelectorError(f"selector longer than {MAX_SELECTOR_LENGTH} characters: {text[:60]!r}...")
    if not text.strip():
        raise SelectorError("empty selector")
    if _nesting(text) > MAX_NESTING:
        raise SelectorError(f"selector nested deeper than {MAX_NESTING} parentheses: {text[:60]!r}...")
    try:
        tree = _PARSER.parse(text)
        expr = _Compiler().transform(tree)
    except VisitError as error:
        raise SelectorError(f"invalid selector {text!r}: {error.orig_exc}") from None
    except LarkError as error:
        raise SelectorError(f"invalid selector {text!r}: {_describe(error)}") from None
    if isinstance(expr, _Literal | _Ident):  # e.g. "TRUE", "flag"
        expr = expr.as_expr()
    return Selector(text, expr)


def _nesting(text: str) -> int:
    depth = deepest = 0
    in_string = False
    for char in text:
        if char == "'":
            in_string = not in_string  # '' inside a string toggles twice: no effect
        elif not in_string:
            if char == "(":
                depth += 1
                deepest = max(deepest, depth)
            elif char == ")":
                depth -= 1
    return deepest


def _describe(error: LarkError) -> str:
    line = getattr(error, "line", None)
    column = getattr(error, "column", None)
    token = getattr(error, "token", None)
    where = f" at column {column}" if line is not None and column is not None else ""
    if token is not None and str(token):
        return f"unexpected {str(token)!r}{where}"
    char = getattr(error, "char", None)
    if char is not None:
        return f"unexpected character {char!r}{where}"
    return f"syntax error{where}"


# ---------------------------------------------------------------------------------------------
# values


def _number(text: str) -> int | float:
    """A numeric literal as ActiveMQ reads it (Java syntax: hex, octal, L/D/F suffixes)."""
    raw = text.rstrip("lLdDfF") if not text.lower().startswith("0x") else text.rstrip("lL")
    if raw.lower().startswith("0x"):
        return int(raw, 16)
    if re.fullmatch(r"0[0-7]+", raw):
        return int(raw, 8)
    if re.fullmatch(r"\d+", raw):
        return int(raw)
    return float(raw)


_NUMERIC_TEXT = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def _as_number(value: Value) -> int | float | None:
    """A number, or text that looks like one (STOMP headers are text); else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return value
    if isinstance(value, str) and value.isdigit() and value.isascii():
        return int(value)  # the common case, without the regular expression
    if isinstance(value, str) and _NUMERIC_TEXT.fullmatch(value.strip()):
        text = value.strip()
        return int(text) if re.fullmatch(r"[+-]?\d+", text) else float(text)
    return None


def _compare(op: str, left: Value, right: Value) -> bool | None:
    if left is None or right is None:
        return None
    if isinstance(left, bool) or isinstance(right, bool):
        if not (isinstance(left, bool) and isinstance(right, bool)) or op not in ("=", "<>"):
            # a boolean literal against header text "true"/"false" compares as a boolean
            left_b, right_b = _as_bool(left), _as_bool(right)
            if left_b is None or right_b is None or op not in ("=", "<>"):
                return None
            left, right = left_b, right_b
        return (left == right) if op == "=" else (left != right)
    if isinstance(left, str) and isinstance(right, str):
        if op == "=":
            return left == right
        if op == "<>":
            return left != right
        return None  # JMS: strings compare with = and <> only
    a, b = _as_number(left), _as_number(right)
    if a is None or b is None:
        return None
    if op == "=":
        return a == b
    if op == "<>":
        return a != b
    if op == "<":
        return a < b
    if op == "<=":
        return a <= b
    if op == ">":
        return a > b
    return a >= b


def _as_bool(value: Value) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    return None


def _like_pattern(pattern: str, escape: str | None) -> re.Pattern[str]:
    if escape is not None and len(escape) != 1:
        raise SelectorError(f"ESCAPE must be one character, got {escape!r}")
    parts: list[str] = []
    chars = iter(pattern)
    for char in chars:
        if escape is not None and char == escape:
            following = next(chars, None)
            if following is None:
                raise SelectorError(f"LIKE pattern {pattern!r} ends with its escape character")
            parts.append(re.escape(following))
        elif char == "%":
            parts.append(".*")
        elif char == "_":
            parts.append(".")
        else:
            parts.append(re.escape(char))
    return re.compile("".join(parts), re.DOTALL)


# ---------------------------------------------------------------------------------------------
# compilation: every node becomes a closure lookup -> value (None = NULL/UNKNOWN)


@dataclass(frozen=True, slots=True)
class _Literal:
    """A constant, kept as such so the compiler can check literal types early."""

    value: Value

    def as_expr(self) -> Expr:
        value = self.value
        return lambda _lookup: value


@dataclass(frozen=True, slots=True)
class _Ident:
    """A property name, kept as such so a comparison with a literal can read it directly."""

    name: str

    def as_expr(self) -> Expr:
        name = self.name
        return lambda lookup: lookup(name)


Node = Expr | _Literal | _Ident


def _expr(node: Node) -> Expr:
    return node.as_expr() if isinstance(node, _Literal | _Ident) else node


_NUMERIC_OPS: dict[str, Callable[[float, float], bool]] = {
    "=": operator.eq,
    "<>": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


def _compare_with_literal(name: str, op: str, literal: Value) -> Expr | None:
    """The usual selector term, ``property <op> literal``, without the general dispatch: it is
    what runs per message (docs/performance.md: at most 2 µs per message and subscription)."""
    if isinstance(literal, str) and op in ("=", "<>"):
        equal = op == "="

        def text_compare(lookup: Lookup) -> bool | None:
            value = lookup(name)
            if isinstance(value, str):
                return (value == literal) is equal
            return _compare(op, value, literal)

        return _predicate(text_compare)
    if isinstance(literal, int | float) and not isinstance(literal, bool):
        test = _NUMERIC_OPS[op]

        def numeric_compare(lookup: Lookup) -> bool | None:
            number = _as_number(lookup(name))
            return None if number is None else test(number, literal)

        return _predicate(numeric_compare)
    return None


@v_args(inline=True)
class _Compiler(Transformer):  # type: ignore[type-arg]
    def number(self, token: Token) -> _Literal:
        return _Literal(_number(str(token)))

    def string(self, token: Token) -> _Literal:
        return _Literal(str(token)[1:-1].replace("''", "'"))

    def true(self) -> _Literal:
        return _Literal(True)

    def false(self) -> _Literal:
        return _Literal(False)

    def identifier(self, token: Token) -> _Ident:
        return _Ident(str(token))

    def sign(self, op: Token, operand: Node) -> Expr:
        inner = _expr(operand)
        negate = str(op) == "-"

        def signed(lookup: Lookup) -> Value:
            value = _as_number(inner(lookup))
            if value is None:
                return None
            return -value if negate else value

        return signed

    def arithmetic(self, first: Node, *rest: Node | Token) -> Expr:
        result = _expr(first)
        for index in range(0, len(rest), 2):
            op = str(rest[index])
            operand = _expr(rest[index + 1])  # type: ignore[arg-type]
            result = _arithmetic(op, result, operand)
        return result

    def compare(self, left: Node, op: Token, right: Node) -> Expr:
        operator_ = str(op)
        if isinstance(left, _Ident) and isinstance(right, _Literal):
            fast = _compare_with_literal(left.name, operator_, right.value)
            if fast is not None:
                return fast
        a, b = _expr(left), _expr(right)
        return _predicate(lambda lookup: _compare(operator_, a(lookup), b(lookup)))

    def between(self, value: Node, low: Node, high: Node) -> Expr:
        if (
            isinstance(value, _Ident)
            and isinstance(low, _Literal)
            and isinstance(high, _Literal)
            and _plain_number(low.value)
            and _plain_number(high.value)
        ):
            # the usual form, ``property BETWEEN 1 AND 100``: one conversion, one chained test
            name, lowest, highest = value.name, low.value, high.value

            def numeric_between(lookup: Lookup) -> bool | None:
                number = _as_number(lookup(name))
                return None if number is None else lowest <= number <= highest  # type: ignore[operator]

            return _predicate(numeric_between)
        v, lo, hi = _expr(value), _expr(low), _expr(high)

        def between(lookup: Lookup) -> bool | None:
            x = v(lookup)
            return _and(_compare(">=", x, lo(lookup)), _compare("<=", x, hi(lookup)))

        return _predicate(between)

    def not_between(self, value: Node, low: Node, high: Node) -> Expr:
        inner = self.between(value, low, high)
        return _predicate(lambda lookup: _not(inner(lookup)))  # type: ignore[arg-type]

    # IN, LIKE and IS take any operand, as ActiveMQ's grammar does (JMS names an identifier)
    def in_(self, operand: Node, *items: _Literal) -> Expr:
        inner = _expr(operand)
        values = frozenset(str(item.value) for item in items)

        def in_(lookup: Lookup) -> bool | None:
            value = inner(lookup)
            if value is None:
                return None
            if not isinstance(value, str):
                return None
            return value in values

        return _predicate(in_)

    def not_in(self, operand: Node, *items: _Literal) -> Expr:
        inner = self.in_(operand, *items)
        return _predicate(lambda lookup: _not(inner(lookup)))  # type: ignore[arg-type]

    def like(self, operand: Node, pattern: _Literal, escape: _Literal | None = None) -> Expr:
        inner = _expr(operand)
        regex = _like_pattern(str(pattern.value), None if escape is None else str(escape.value))
        fullmatch = regex.fullmatch

        def like(lookup: Lookup) -> bool | None:
            value = inner(lookup)
            if not isinstance(value, str):
                return None
            return fullmatch(value) is not None

        return _predicate(like)

    def not_like(self, operand: Node, pattern: _Literal, escape: _Literal | None = None) -> Expr:
        inner = self.like(operand, pattern, escape)
        return _predicate(lambda lookup: _not(inner(lookup)))  # type: ignore[arg-type]

    def is_null(self, operand: Node) -> Expr:
        inner = _expr(operand)
        return _predicate(lambda lookup: inner(lookup) is None)

    def is_not_null(self, operand: Node) -> Expr:
        inner = _expr(operand)
        return _predicate(lambda lookup: inner(lookup) is not None)

    def not_(self, operand: Node) -> Expr:
        inner = _condition(operand)

        def not_(lookup: Lookup) -> bool | None:
            value = inner(lookup)
            return None if value is None else not value

        return _predicate(not_)

    # AND and OR see conditions (True, False or None = UNKNOWN) and stop at the first operand
    # that decides; SQL's three-valued tables written out, one call per operand, because this
    # runs per message and subscription
    def and_(self, *operands: Node) -> Expr:
        parts = [_condition(operand) for operand in operands]
        if len(parts) == 1:  # the grammar wraps every expression in one AND and one OR
            return _predicate(parts[0])
        if len(parts) == 2:
            first, second = parts

            def and_two(lookup: Lookup) -> bool | None:
                a = first(lookup)
                if a is False:
                    return False
                b = second(lookup)
                if b is False:
                    return False
                return None if a is None or b is None else True

            return _predicate(and_two)

        def and_(lookup: Lookup) -> bool | None:
            unknown = False
            for part in parts:
                value = part(lookup)
                if value is False:
                    return False
                if value is None:
                    unknown = True
            return None if unknown else True

        return _predicate(and_)

    def or_(self, *operands: Node) -> Expr:
        parts = [_condition(operand) for operand in operands]
        if len(parts) == 1:
            return _predicate(parts[0])

        def or_(lookup: Lookup) -> bool | None:
            unknown = False
            for part in parts:
                value = part(lookup)
                if value is True:
                    return True
                if value is None:
                    unknown = True
            return None if unknown else False

        return _predicate(or_)


def _condition(node: Node) -> Callable[[Lookup], bool | None]:
    """An operand of AND, OR, NOT as a condition.  Predicates (comparisons, LIKE, IN, BETWEEN,
    IS NULL, AND, OR, NOT) already give True, False or None; a bare property, literal or
    arithmetic result is read as a boolean (header text "true"/"false"), anything else UNKNOWN."""
    if not isinstance(node, _Literal | _Ident) and node in _PREDICATES:
        return node  # type: ignore[return-value]
    value = _expr(node)
    return lambda lookup: _as_bool(value(lookup))


# the compiled closures that give a condition rather than a value (see _condition)
_PREDICATES: weakref.WeakSet[Callable[..., object]] = weakref.WeakSet()


def _predicate(expr: Expr) -> Expr:
    _PREDICATES.add(expr)
    return expr


def _plain_number(value: Value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _arithmetic(op: str, left: Expr, right: Expr) -> Expr:
    def arithmetic(lookup: Lookup) -> Value:
        a, b = _as_number(left(lookup)), _as_number(right(lookup))
        if a is None or b is None:
            return None
        if op == "+":
            return a + b
        if op == "-":
            return a - b
        if op == "*":
            return a * b
        if b == 0:
            return None  # division by zero: UNKNOWN rather than an exception per message
        if isinstance(a, int) and isinstance(b, int):
            return int(a / b)  # Java integer division truncates toward zero
        return a / b

    return arithmetic


def _not(value: bool | None) -> bool | None:
    return None if value is None else not value


def _and(a: bool | None, b: bool | None) -> bool | None:
    if a is False or b is False:
        return False
    if a is None or b is None:
        return None
    return True
