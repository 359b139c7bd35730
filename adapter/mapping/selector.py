"""JMS message selectors (the SQL-92 subset of JMS 1.1, section 3.8.1), compiled once per
SUBSCRIBE into a plain Python predicate, for the ``activemq`` profile's ``selector`` header.

Owns the grammar, its compilation into closures, and JMS's evaluation rules:

* three-valued logic: an absent property is NULL; a comparison, arithmetic or LIKE involving
  NULL is UNKNOWN, and AND/OR/NOT follow SQL's tables; a message matches only when the selector
  is TRUE.  A number compared with text that is not one (``'abc'``, or longer than
  ``MAX_NUMBER_LENGTH``) is FALSE, as JMS 1.1 (3.8.1.1, values of unlike types) and ActiveMQ
  have it, so ``NOT (price > 10)`` matches such a message;
* numbers: integer and decimal literals (``1``, ``1.5``, ``1e3``, ``0x1F``, ``017`` as ActiveMQ
  reads them); a property's text that looks like a number is compared as a number with a number
  (STOMP headers are all text; ActiveMQ converts them the same way);
* strings compare with ``=`` and ``<>`` only; booleans likewise;
* ``LIKE`` with ``%``, ``_`` and ``ESCAPE``; ``IN`` over string literals; ``BETWEEN``;
  ``IS [NOT] NULL``.

Bounded for hostile input (docs/behaviour.md#selectors), because any publisher chooses the header
values another user's selector is evaluated against, per message, on the event loop:

* a selector is at most ``MAX_SELECTOR_LENGTH`` characters and ``MAX_NESTING`` levels deep
  (parentheses, ``NOT`` and unary signs each count a level), checked after the (iterative) parse
  and before the (recursive) compilation, so no input reaches Python's recursion limit;
* header text is read as a number only when it is at most ``MAX_NUMBER_LENGTH`` characters, by
  an unambiguous pattern (linear); integers stay within Java's 64-bit ``long`` and continue as
  floats beyond it, so no arithmetic grows without bound or raises;
* ``LIKE`` is a wildcard matcher, not a regular expression: at most (n+1)*(m+1) steps for a value
  of n and a pattern of m characters (``LikePattern.run`` counts them).  A pattern with ``_``
  steps through the value in Python, one character at a time, so the ``_`` patterns of one
  selector share ``MAX_LIKE_SCAN`` characters per evaluation; one that would need more is
  UNKNOWN (a message it decides does not match);
* an arithmetic chain is one flat loop, not one nested closure per operator;
* evaluation never raises: ``Selector.matches`` is False for anything unforeseen.

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

from lark import Lark, Token, Transformer, Tree, v_args
from lark.exceptions import LarkError, VisitError

# Bounds that keep a hostile SUBSCRIBE cheap: the text, and its nesting (parentheses, NOT and unary
# signs; the tree is compiled recursively).  At the bound, compiling and evaluating take about a
# quarter of Python's default recursion limit (test_selector_bounds.py checks a third).
MAX_SELECTOR_LENGTH = 4096
MAX_NESTING = 50
# Header text longer than this is never read as a number (it is still text): more than any Java
# long (19 digits) or double written out needs in practice, and it keeps int()/float() off the
# thousands of digits a hostile publisher can send (int() raises beyond 4,300 digits).
MAX_NUMBER_LENGTH = 100
# Characters the LIKE patterns with ``_`` of one selector may step through per evaluation, shared
# evenly among them (each is a Python loop over the value).  256 ``h LIKE '%_x'`` terms against a
# 100 KB header took 3 s per message and subscription; this bound is a few milliseconds.  The
# ``%``-only patterns search in C and have no such bound.
MAX_LIKE_SCAN = 65536

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
        try:
            return self._expr(lookup) is True
        except Exception:
            # Nothing is known to raise (numbers, LIKE, arithmetic and depth are bounded), but a
            # publisher chooses the values: an exception here would be raised in a delivery
            # callback and cost the subscriber its broker link.  JMS: what cannot be evaluated
            # does not match.
            return False


def compile_selector(text: str) -> Selector:
    """Parse and compile ``text``; raises SelectorError quoting it."""
    if len(text) > MAX_SELECTOR_LENGTH:
        raise SelectorError(f"selector longer than {MAX_SELECTOR_LENGTH} characters: {text[:60]!r}...")
    if not text.strip():
        raise SelectorError("empty selector")
    if _nesting(text) > MAX_NESTING:  # cheap, before parsing
        raise SelectorError(f"selector nested deeper than {MAX_NESTING} levels: {text[:60]!r}...")
    try:
        tree = _PARSER.parse(text)  # LALR: an explicit stack, no recursion
        if _tree_nesting(tree) > MAX_NESTING:
            raise SelectorError(f"selector nested deeper than {MAX_NESTING} levels: {text[:60]!r}...")
        compiler = _Compiler()
        expr = compiler.transform(tree)
        compiler.share_scan()
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


# the tree nodes that nest: a parenthesised expression (each one is an ``or_`` node, and so is the
# whole selector), NOT and a unary sign; no other rule of the grammar recurses
_NESTING_RULES = frozenset({"or_", "not_", "sign"})


def _tree_nesting(tree: Tree[Token]) -> int:
    """The most nesting levels on any path of the parsed tree, walked with an explicit stack
    (the tree may be deeper than the recursion limit: ``NOT`` x 1000 parses fine)."""
    deepest = 0
    stack: list[tuple[Tree[Token], int]] = [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        if node.data in _NESTING_RULES:
            depth += 1
            if depth > deepest:
                deepest = depth
        stack.extend((child, depth) for child in node.children if isinstance(child, Tree))
    return deepest - 1  # the whole selector's own or_


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
    """A numeric literal as ActiveMQ reads it (Java syntax: hex, octal, L/D/F suffixes).  The
    selector is at most 4,096 characters, so int() never sees more than its 4,300 digits."""
    raw = text.rstrip("lLdDfF") if not text.lower().startswith("0x") else text.rstrip("lL")
    if raw.lower().startswith("0x"):
        return _long(int(raw, 16))
    if re.fullmatch(r"0[0-7]+", raw):
        return _long(int(raw, 8))
    if re.fullmatch(r"\d+", raw):
        return _long(int(raw))
    return float(raw)


_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1


def _long(number: int) -> int | float:
    """An integer within Java's ``long``, else the nearest float (infinite beyond the doubles):
    integer arithmetic then never grows past 128 bits and never meets OverflowError.  (Java
    wraps a long; ActiveMQ compares an over-long literal as a BigDecimal.  Either way such
    values are outside what a selector can usefully compare.)"""
    if _LONG_MIN <= number <= _LONG_MAX:
        return number
    try:
        return float(number)
    except OverflowError:
        return float("inf") if number > 0 else float("-inf")


# An optional sign, digits with at most one point, an optional exponent: no part can match what
# another could, so a failing match backtracks at most once per character (linear; the old
# ``\d+\.?\d*`` split a run of digits in every possible way: quadratic on "1" x 20,000 + "x").
_NUMERIC_TEXT = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_INTEGER_TEXT = re.compile(r"[+-]?[0-9]+")


def _as_number(value: Value) -> int | float | None:
    """A number, or text that looks like one (STOMP headers are text) and is at most
    ``MAX_NUMBER_LENGTH`` characters; else None."""
    if isinstance(value, str):
        if len(value) > MAX_NUMBER_LENGTH:
            return None  # never a number, however it continues: nothing is scanned
        if value.isdigit() and value.isascii():
            return _long(int(value))  # the common case, without the regular expression
        text = value.strip()
        if _NUMERIC_TEXT.fullmatch(text) is None:
            return None
        return _long(int(text)) if _INTEGER_TEXT.fullmatch(text) else float(text)
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return value
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
        return False  # JMS 1.1 3.8.1.1: comparing values of unlike types is false (not NULL)
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


class LikePattern:
    """A compiled ``LIKE`` pattern: ``%`` any run of characters, ``_`` any one character.

    Not a regular expression: ``'%a%a%a%a%a%a%a%a%b'`` compiled to ``.*a.*a...`` backtracks
    n^8 ways on a value of n ``a``.  Two matchers, both bounded by (n+1)*(m+1) steps for a value
    of n and a pattern of m characters, ``run`` counting them:

    * no ``_``: the pattern is literal pieces between ``%``; the first must start the value, the
      last end it, and each one between is taken at its leftmost place after the previous one
      (for ``%`` alone leftmost is always right).  Each piece is one ``str`` search (C) over at
      most n characters, so the pieces cost at most n times their lengths together;
    * with ``_``: a bit-parallel automaton (Shift-And): bit j of one integer says "the first j
      symbols of the pattern match the value so far"; one shift, two ANDs and an OR per
      character of the value, on integers of at most m bits.
    """

    __slots__ = (
        "_fixed",
        "_last",
        "_loops",
        "_masks",
        "_any",
        "_pieces",
        "_size",
        "_accept",
        "_tail_any",
        "limit",
    )

    def __init__(self, symbols: list[str | None]) -> None:
        """``symbols``: a character to match, None for ``%`` (any run), ``""`` for ``_`` (any one)."""
        pieces: list[list[str]] = [[]]
        has_any = False
        for symbol in symbols:
            if symbol is None:
                pieces.append([])
            else:
                has_any = has_any or symbol == ""
                pieces[-1].append(symbol)
        self._pieces: tuple[str, ...] | None = None if has_any else tuple("".join(p) for p in pieces)
        self._fixed = sum(len(p) for p in pieces)  # characters a match takes besides the % runs
        self._last = len(pieces) == 1  # no %: the value is exactly as long as the pattern
        masks: dict[str, int] = {}
        any_mask = loops = 0
        bit = 1
        for symbol in symbols:
            if symbol is None:
                loops |= bit  # a % after the symbols so far: their state stays on, whatever follows
                continue
            bit <<= 1
            if symbol == "":
                any_mask |= bit
            else:
                masks[symbol] = masks.get(symbol, 0) | bit
        self._masks = {char: mask | any_mask for char, mask in masks.items()}
        self._any = any_mask
        self._loops = loops
        self._size = self._fixed + 1  # bits per state
        self._accept = bit
        self._tail_any = bool(loops & bit)  # ends with %: matched as soon as the rest has matched
        # characters the automaton may step through (None: all of them); past it, UNKNOWN
        self.limit: int | None = None

    def matches(self, value: str) -> bool | None:
        """Whether ``value`` matches; None (UNKNOWN) when deciding it would step through more
        than ``limit`` characters."""
        return self.run(value)[0]

    def run(self, value: str) -> tuple[bool | None, int]:
        """(whether ``value`` matches, the steps taken): a ``str`` primitive over k characters
        for a piece of p counts k*p, one automaton step counts the bits of its state."""
        n = len(value)
        if n < self._fixed or (self._last and n != self._fixed):
            return False, 1
        pieces = self._pieces
        if pieces is not None:
            return self._run_pieces(value, pieces)
        state, steps, masks, any_mask, loops = 1, 0, self._masks, self._any, self._loops
        size, accept, limit = self._size, self._accept, self.limit
        cut = limit is not None and n > limit
        scanned = value[:limit] if cut else value
        if self._tail_any:
            for char in scanned:
                state = ((state << 1) & masks.get(char, any_mask)) | (state & loops)
                steps += size
                if state & accept:
                    return True, steps
                if not state:
                    return False, steps
        else:
            for char in scanned:
                state = ((state << 1) & masks.get(char, any_mask)) | (state & loops)
                steps += size
                if not state:
                    return False, steps
        if cut:
            return None, steps  # undecided within the characters it may look at
        return bool(state & accept), steps

    @staticmethod
    def _run_pieces(value: str, pieces: tuple[str, ...]) -> tuple[bool, int]:
        first, last = pieces[0], pieces[-1]
        if len(pieces) == 1:
            return value == first, len(first) + 1
        steps = len(first) + len(last) + 1
        if not value.startswith(first) or not value.endswith(last):
            return False, steps
        start, end = len(first), len(value) - len(last)
        for piece in pieces[1:-1]:
            if not piece:
                continue
            steps += (end - start) * len(piece)
            found = value.find(piece, start, end)
            if found < 0:
                return False, steps
            start = found + len(piece)
        return True, steps


def like_pattern(pattern: str, escape: str | None) -> LikePattern:
    """Compile a LIKE pattern (``escape``: the ESCAPE character, if any); SelectorError when the
    escape is not one character or the pattern ends with it."""
    if escape is not None and len(escape) != 1:
        raise SelectorError(f"ESCAPE must be one character, got {escape!r}")
    symbols: list[str | None] = []
    chars = iter(pattern)
    for char in chars:
        if escape is not None and char == escape:
            following = next(chars, None)
            if following is None:
                raise SelectorError(f"LIKE pattern {pattern!r} ends with its escape character")
            symbols.append(following)
        elif char == "%":
            if not symbols or symbols[-1] is not None:  # %% is %
                symbols.append(None)
        elif char == "_":
            symbols.append("")
        else:
            symbols.append(char)
    return LikePattern(symbols)


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
            value = lookup(name)
            if value is None:
                return None
            number = _as_number(value)
            return False if number is None else test(number, literal)  # unlike types: false

        return _predicate(numeric_compare)
    return None


@v_args(inline=True)
class _Compiler(Transformer):  # type: ignore[type-arg]
    def __init__(self) -> None:
        super().__init__()
        self._automata: list[LikePattern] = []  # the LIKE patterns with "_" (Python loops)

    def share_scan(self) -> None:
        """Give the selector's ``_`` patterns ``MAX_LIKE_SCAN`` characters per evaluation."""
        if self._automata:
            share = MAX_LIKE_SCAN // len(self._automata)
            for pattern in self._automata:
                # a step on a state of more than 64 bits costs one word operation per 64 more
                pattern.limit = max(1, share // (1 + pattern._size // 64))

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
            if value is None or not negate:
                return value
            return _long(-value) if isinstance(value, int) else -value  # -(-2**63) is no long

        return signed

    def arithmetic(self, first: Node, *rest: Node | Token) -> Node:
        if not rest:
            return first  # the grammar wraps every operand: keep it, so the fast paths see it
        operands = [_expr(first)]
        ops: list[str] = []
        for index in range(0, len(rest), 2):
            ops.append(str(rest[index]))
            operands.append(_expr(rest[index + 1]))  # type: ignore[arg-type]
        return _arithmetic(tuple(ops), tuple(operands))

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
                value = lookup(name)
                if value is None:
                    return None
                number = _as_number(value)
                if number is None:
                    return False  # unlike types: false, as in _compare
                return lowest <= number <= highest  # type: ignore[operator]

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
        compiled = like_pattern(str(pattern.value), None if escape is None else str(escape.value))
        if compiled._pieces is None:
            self._automata.append(compiled)
        match = compiled.matches

        def like(lookup: Lookup) -> bool | None:
            value = inner(lookup)
            if not isinstance(value, str):
                return None
            return match(value)

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


def _arithmetic(ops: tuple[str, ...], operands: tuple[Expr, ...]) -> Expr:
    """``a op b op c ...`` left to right in one loop: a chain of a thousand ``+`` nests no
    closures (it used to, and raised RecursionError per message)."""
    first, rest = operands[0], tuple(zip(ops, operands[1:], strict=True))

    def arithmetic(lookup: Lookup) -> Value:
        result = _as_number(first(lookup))
        for op, operand in rest:
            if result is None:
                return None
            result = _apply(op, result, _as_number(operand(lookup)))
        return result

    return arithmetic


def _apply(op: str, a: int | float, b: int | float | None) -> int | float | None:
    if b is None:
        return None
    if op == "+":
        result = a + b
    elif op == "-":
        result = a - b
    elif op == "*":
        result = a * b
    elif b == 0:
        return None  # division by zero: UNKNOWN rather than an exception per message
    elif isinstance(a, int) and isinstance(b, int):
        quotient = abs(a) // abs(b)  # Java integer division truncates toward zero; exact
        result = quotient if (a < 0) == (b < 0) else -quotient
    else:
        result = a / b
    return _long(result) if isinstance(result, int) else result


def _not(value: bool | None) -> bool | None:
    return None if value is None else not value


def _and(a: bool | None, b: bool | None) -> bool | None:
    if a is False or b is False:
        return False
    if a is None or b is None:
        return None
    return True
