"""Parse ``q`` / ``mq`` text into a :class:`~broker.query.ast.Filter`, and render it back.

The grammar is Orion's StringFilter (NGSI v2 Simple Query Language, ngsi-v2.md section 4)
plus the SilboPS string operators ``=^`` (prefix), ``=$`` (suffix) and ``=*`` (contains);
docs/query-language.md describes the language as built. In short::

    filter    := statement (';' statement)* [';']
    statement := path | '!' path | path op rhs
    path      := token ('.' token)*          token := name | "'" anything-but-quote "'"
    op        := '==' | ':' | '!=' | '<' | '<=' | '>' | '>=' | '~=' | '=^' | '=$' | '=*'

Whitespace around statements, operators, list items and range ends is ignored, as Orion's
``wsStrip`` does; it is not allowed inside an unquoted path. Quotes protect ``;``, ``,``,
``..`` and ``.`` wherever they appear. Every error is a :class:`QuerySyntaxError` carrying
what is wrong and the 1-based column where it was found; a ``~=`` pattern that does not
compile raises :class:`InvalidRegex` with the column in its message.
"""

from __future__ import annotations

import functools
import math
import re

from broker.errors import InvalidRegex, QuerySyntaxError
from broker.query.ast import Filter, Kind, Literal, Op, Range, Statement
from broker.query.dates import parse_iso8601
from broker.query.regex import compile_pattern

__all__ = [
    "MAX_EXPRESSION_LENGTH",
    "MAX_LIST_ITEMS",
    "MAX_STATEMENTS",
    "parse_filter",
    "parse_literal",
    "parse_statements",
    "render_filter",
    "render_statements",
]

MAX_EXPRESSION_LENGTH = 4096
MAX_STATEMENTS = 64
MAX_LIST_ITEMS = 256

# Longest first, so that '==' wins over '=^' and '<=' over '<'.
_OPERATORS: tuple[tuple[str, Op], ...] = (
    ("==", Op.EQ),
    ("=^", Op.PREFIX),
    ("=$", Op.SUFFIX),
    ("=*", Op.CONTAINS),
    ("!=", Op.NE),
    ("<=", Op.LE),
    (">=", Op.GE),
    ("~=", Op.MATCH),
    ("<", Op.LT),
    (">", Op.GT),
    (":", Op.EQ),
)
# How each operator is written back; EQ as '==' (its ':' spelling comes last above).
_SIGN: dict[Op, str] = {op: sign for sign, op in reversed(_OPERATORS)}
_SIGNS: dict[str, Op] = dict(_OPERATORS)
_COMPARISONS = frozenset({Op.EQ, Op.NE, Op.LT, Op.LE, Op.GT, Op.GE})
_ORDERINGS = frozenset({Op.LT, Op.LE, Op.GT, Op.GE})
_STRING_OPS = frozenset({Op.PREFIX, Op.SUFFIX, Op.CONTAINS})
# Characters that, right after a comparison operator, mean the user typed an operator that
# does not exist ('===', '<>', '>==', ':='); reported as such rather than as a bad value.
_OPERATOR_TAIL = frozenset("=<>")
# Never part of an unquoted path token: separators, operator starts and Orion's forbidden set.
_NOT_IN_NAME = frozenset(".'\"<>=;():")
# Orion's forbidden characters; an unquoted value may not hold them (quote the value).
_NOT_IN_VALUE = frozenset('<>"=;()')
# A decimal number as strtod reads it, minus hex, inf and nan (and Python's '1_0').
# a plain attribute name, a comparison sign, and a value that starts like one
_SIMPLE_HEAD = re.compile(r"([A-Za-z0-9_]+)(==|!=|<=|>=|<|>|:)(?=[^=<>!~:^$*\s])")
_NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def parse_filter(q: str = "", mq: str = "") -> Filter:
    """Parse a subscription's ``q`` and ``mq`` into one Filter (cached per text)."""
    return _parse_filter(q, mq)


@functools.lru_cache(maxsize=4096)
def _parse_filter(q: str, mq: str) -> Filter:
    return Filter(q=_parse_named(q, "q", False), mq=_parse_named(mq, "mq", True))


def _parse_named(text: str, name: str, metadata: bool) -> tuple[Statement, ...]:
    try:
        return parse_statements(text, metadata=metadata)
    except QuerySyntaxError as exc:
        raise QuerySyntaxError(
            f"in {name}, {exc.reason}", expression=exc.expression, column=exc.column
        ) from None
    except InvalidRegex as exc:
        raise InvalidRegex(f"in {name}, {exc}") from exc


def parse_statements(text: str, *, metadata: bool = False) -> tuple[Statement, ...]:
    """Parse one ``q`` (or, with ``metadata``, one ``mq``) expression (cached per text)."""
    if not isinstance(text, str):
        raise QuerySyntaxError(
            f"a filter must be a string, not {type(text).__name__}", expression="", column=1
        )
    return _parse_statements(text, metadata)


@functools.lru_cache(maxsize=4096)
def _parse_statements(text: str, metadata: bool) -> tuple[Statement, ...]:
    if len(text) > MAX_EXPRESSION_LENGTH:
        raise QuerySyntaxError(
            f"the expression is {len(text)} characters long; at most {MAX_EXPRESSION_LENGTH}",
            expression=text,
            column=MAX_EXPRESSION_LENGTH + 1,
        )
    if not text.strip():
        return ()
    return tuple(
        _Parser(text, metadata).statement(start, end) for start, end in _statement_spans(text)
    )


def parse_literal(text: str) -> Literal:
    """Type one right-hand value as ``==`` would (quoted string, number, date, bool...)."""
    start, end = _strip(text, 0, len(text))
    if start == end:
        raise QuerySyntaxError("empty value", expression=text, column=1)
    return _Parser(text, False).literal(start, end)


def _error(text: str, index: int, message: str) -> QuerySyntaxError:
    return QuerySyntaxError(message, expression=text, column=index + 1)


def _strip(text: str, start: int, end: int) -> tuple[int, int]:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end


def _split(text: str, start: int, end: int, separator: str) -> list[tuple[int, int]]:
    """Split ``text[start:end]`` at ``separator`` outside single quotes (quotes balanced)."""
    spans = []
    quoted = False
    piece = start
    for i in range(start, end):
        char = text[i]
        if char == "'":
            quoted = not quoted
        elif char == separator and not quoted:
            spans.append((piece, i))
            piece = i + 1
    spans.append((piece, end))
    return spans


def _find_unquoted(text: str, start: int, end: int, needle: str) -> int:
    """Index of ``needle`` in ``text[start:end]`` outside quotes, or -1."""
    quoted = False
    for i in range(start, end):
        if text[i] == "'":
            quoted = not quoted
        elif not quoted and text.startswith(needle, i) and i + len(needle) <= end:
            return i
    return -1


def _statement_spans(text: str) -> list[tuple[int, int]]:
    """The stripped spans of the statements; checks quotes, empty statements and the count."""
    quote = -1
    for i, char in enumerate(text):
        if char == "'":
            quote = i if quote < 0 else -1
    if quote >= 0:
        raise _error(text, quote, "unterminated quote")
    pieces = _split(text, 0, len(text), ";")
    spans = []
    for number, (start, end) in enumerate(pieces):
        start, end = _strip(text, start, end)
        if start < end:
            spans.append((start, end))
        elif number == len(pieces) - 1 and number > 0:
            pass  # one trailing ';' is allowed
        elif number == 0:
            raise _error(text, end, "empty statement before ';'")
        else:
            raise _error(text, end, "empty statement between two ';'")
        if len(spans) > MAX_STATEMENTS:
            raise _error(text, start, f"more than {MAX_STATEMENTS} statements")
    return spans


def _classify(text: str) -> tuple[Kind, float | str | bool | None] | None:
    """Type an unquoted value (Orion's order); None when it is a number out of range."""
    if _NUMBER.fullmatch(text):
        number = float(text)
        return (Kind.NUMBER, number) if math.isfinite(number) else None
    epoch = parse_iso8601(text)
    if epoch is not None:
        return Kind.DATE, epoch
    if text == "true" or text == "false":
        return Kind.BOOL, text == "true"
    if text == "null":
        return Kind.NULL, None
    return Kind.STRING, text


class _Parser:
    """Parses the statements of one expression; every index is into the whole text."""

    def __init__(self, text: str, metadata: bool) -> None:
        self.text = text
        self.metadata = metadata

    def statement(self, start: int, end: int) -> Statement:
        """Parse the statement in ``text[start:end]`` (stripped, non-empty)."""
        simple = self.simple(start, end)
        return simple if simple is not None else self.general(start, end)

    def simple(self, start: int, end: int) -> Statement | None:
        """The common ``name<op>value`` statement, read without the general machinery, or
        None when the statement is anything else. Gives exactly what :meth:`general` gives."""
        head = _SIMPLE_HEAD.match(self.text, start, end)
        if head is None:
            return None
        sign = head.group(2)
        rhs_start, rhs_end = _strip(self.text, head.end(), end)
        statement = self.comparison((head.group(1),), _SIGNS[sign], sign, rhs_start, rhs_end, start)
        return self.checked(statement)

    def general(self, start: int, end: int) -> Statement:
        """Parse any statement in ``text[start:end]`` (stripped, non-empty)."""
        text = self.text
        if text[start] == "!":
            name, _ = _strip(text, start + 1, end)
            path, pos = self.path(name, end)
            if pos < end:
                raise _error(text, pos, f"'!{self.shown(name, pos)}' takes no operator")
            return self.checked(Statement(path, Op.NOT_EXISTS, column=start + 1))
        path, pos = self.path(start, end)
        if pos == end:
            return self.checked(Statement(path, Op.EXISTS, column=start + 1))
        op, rhs = self.operator(start, pos, end)
        rhs_start, rhs_end = _strip(text, rhs, end)
        if rhs_start == rhs_end:
            raise _error(text, rhs, f"missing value after '{text[pos:rhs]}'")
        if op is Op.MATCH:
            statement = Statement(
                path, op, pattern=self.pattern(rhs_start, rhs_end), column=start + 1
            )
        elif op in _STRING_OPS:
            value = self.single(op, text[pos:rhs], rhs_start, rhs_end, string=True)
            statement = Statement(path, op, values=(value,), column=start + 1)
        else:
            statement = self.comparison(path, op, text[pos:rhs], rhs_start, rhs_end, start)
        return self.checked(statement)

    def checked(self, statement: Statement) -> Statement:
        """Reject an mq path without a metadata name."""
        if self.metadata and len(statement.path) < 2:
            raise _error(
                self.text,
                statement.column - 1 + (statement.op is Op.NOT_EXISTS),
                f"an mq path needs an attribute and a metadata name "
                f"(attribute.metadata), not '{statement.path[0]}'",
            )
        return statement

    def shown(self, start: int, end: int) -> str:
        """The source text of a path, for messages."""
        return self.text[start:end].rstrip()

    def path(self, start: int, end: int) -> tuple[tuple[str, ...], int]:
        """Parse a dotted path at ``start``; return it and the index after it."""
        text = self.text
        tokens: list[str] = []
        pos = start
        while True:
            if pos < end and text[pos] == "'":
                close = text.find("'", pos + 1, end)
                if close < 0:
                    raise _error(text, pos, "unterminated quote")
                if close == pos + 1:
                    raise _error(text, pos, self.empty_name(tokens))
                tokens.append(text[pos + 1 : close])
                pos = close + 1
            else:
                token_start = pos
                while pos < end and self.name_char(pos, end):
                    pos += 1
                if pos == token_start:
                    if pos < end and text[pos].isspace():
                        raise _error(text, pos, "whitespace is not allowed inside a path")
                    raise _error(text, pos, self.empty_name(tokens))
                tokens.append(text[token_start:pos])
            if pos < end and text[pos] == ".":
                pos += 1
                continue
            after = pos
            while after < end and text[after].isspace():
                after += 1
            if after < end and text[after] == ".":
                raise _error(text, pos, "whitespace is not allowed inside a path")
            return tuple(tokens), after

    def name_char(self, pos: int, end: int) -> bool:
        """Whether ``text[pos]`` continues an unquoted path token."""
        char = self.text[pos]
        if char in _NOT_IN_NAME or char.isspace() or not char.isprintable():
            return False
        if char == "!" or char == "~":
            # As in Orion, 'a!b' is a name but 'a!=b' is the operator '!='
            return not (pos + 1 < end and self.text[pos + 1] == "=")
        return True

    @staticmethod
    def empty_name(tokens: list[str]) -> str:
        if not tokens:
            return "empty attribute name"
        return f"empty name after '{'.'.join(tokens)}.'"

    def operator(self, start: int, pos: int, end: int) -> tuple[Op, int]:
        """Read the operator at ``pos``; return it and the index of its right-hand side."""
        text = self.text
        found = next(((sign, op) for sign, op in _OPERATORS if text.startswith(sign, pos)), None)
        if found is not None:
            sign, op = found
            tail = pos + len(sign)
            if op not in _COMPARISONS or tail >= end or text[tail] not in _OPERATOR_TAIL:
                return op, tail
        if found is not None or text[pos] == "=":
            run = pos
            while run < end and text[run] in "=!<>~:^$*":
                run += 1
            raise _error(
                text,
                pos,
                f"unknown operator '{text[pos:run]}' after '{self.shown(start, pos)}' "
                "(equality is '==' or ':')",
            )
        raise _error(text, pos, f"expected an operator or ';' after '{self.shown(start, pos)}'")

    def pattern(self, start: int, end: int) -> str:
        """A ``~=`` pattern: the raw text, or the inside of one pair of quotes around it."""
        text = self.text
        raw = text[start:end]
        if len(raw) >= 2 and raw[0] == "'" and raw[-1] == "'" and "'" not in raw[1:-1]:
            raw = raw[1:-1]
            start += 1
        if not raw:
            raise _error(text, start, "empty pattern")
        try:
            compile_pattern(raw)
        except InvalidRegex as exc:
            raise InvalidRegex(f"{exc} (column {start + 1})") from exc
        return raw

    def comparison(
        self, path: tuple[str, ...], op: Op, sign: str, start: int, end: int, at: int
    ) -> Statement:
        """A ``==``/``!=``/ordering statement: one value, a list or a range."""
        text = self.text
        items = _split(text, start, end, ",")
        dots = _find_unquoted(text, start, end, "..")
        if len(items) > 1 or dots >= 0:
            if op not in (Op.EQ, Op.NE):
                what = "a list" if len(items) > 1 else "a range"
                where = items[1][0] - 1 if len(items) > 1 else dots
                raise _error(
                    text, where, f"{what} is only allowed with '==', ':' and '!=', not '{sign}'"
                )
            if len(items) > 1 and dots >= 0:
                raise _error(text, dots, "a value cannot be both a list and a range")
        if len(items) > 1:
            return Statement(path, op, values=self.list(items), column=at + 1)
        if dots >= 0:
            return Statement(path, op, range=self.range(start, dots, end), column=at + 1)
        value = self.single(op, sign, start, end, string=False)
        return Statement(path, op, values=(value,), column=at + 1)

    def single(self, op: Op, sign: str, start: int, end: int, *, string: bool) -> Literal:
        """The one value of an ordering or string operator."""
        text = self.text
        if string:
            comma = _find_unquoted(text, start, end, ",")
            dots = _find_unquoted(text, start, end, "..")
            if comma >= 0 or dots >= 0:
                what = "a list" if comma >= 0 else "a range"
                raise _error(
                    text,
                    comma if comma >= 0 else dots,
                    f"{what} is only allowed with '==', ':' and '!=', not '{sign}' "
                    "(quote the value to take it literally)",
                )
        value = self.literal(start, end, string=string)
        if op in _ORDERINGS and value.kind in (Kind.BOOL, Kind.NULL):
            raise _error(
                text,
                start,
                f"'{sign}' compares numbers, dates and strings, not {value.kind.value}",
            )
        return value

    def list(self, items: list[tuple[int, int]]) -> tuple[Literal, ...]:
        """The values of a comma list; each item is typed on its own (kinds may mix)."""
        text = self.text
        values: list[Literal] = []
        for number, (start, end) in enumerate(items):
            start, end = _strip(text, start, end)
            if start == end:
                raise _error(text, start, "empty item in list")
            if number == MAX_LIST_ITEMS:
                raise _error(text, start, f"a list has at most {MAX_LIST_ITEMS} items")
            values.append(self.literal(start, end))
        return tuple(values)

    def range(self, start: int, dots: int, end: int) -> Range:
        """A range ``low..high``: both ends numeric (numbers or dates) or both strings."""
        text = self.text
        low_start, low_end = _strip(text, start, dots)
        high_start, high_end = _strip(text, dots + 2, end)
        if low_start == low_end:
            raise _error(text, dots, "missing low end of range")
        if high_start == high_end:
            raise _error(text, dots + 2, "missing high end of range")
        extra = _find_unquoted(text, high_start, high_end, "..")
        if extra >= 0:
            raise _error(text, extra, "a range has exactly two ends")
        low = self.literal(low_start, low_end)
        high = self.literal(high_start, high_end)
        for literal, at in ((low, low_start), (high, high_start)):
            if literal.kind in (Kind.BOOL, Kind.NULL):
                raise _error(text, at, f"a range cannot have a {literal.kind.value} end")
        if low.kind is not high.kind and not (low.kind.numeric and high.kind.numeric):
            raise _error(
                text,
                high_start,
                f"range ends must be of one type, numeric or string: '{low.text}' is a "
                f"{low.kind.value}, '{high.text}' a {high.kind.value}",
            )
        return Range(low, high)

    def literal(self, start: int, end: int, *, string: bool = False) -> Literal:
        """Type the value in ``text[start:end]`` (stripped, non-empty)."""
        text = self.text
        if text[start] == "'":
            close = text.find("'", start + 1, end)
            if close < 0:
                raise _error(text, start, "unterminated quote")
            if close != end - 1:
                raise _error(text, close + 1, "unexpected text after the closing quote")
            inside = text[start + 1 : close]
            return Literal(Kind.STRING, inside, inside)
        raw = text[start:end]
        for i in range(start, end):
            char = text[i]
            if char == "'":
                raise _error(text, i, "a quote must enclose the whole value")
            if char in _NOT_IN_VALUE:
                raise _error(
                    text, i, f"character '{char}' is not allowed in an unquoted value; quote it"
                )
        if string:
            return Literal(Kind.STRING, raw, raw)
        typed = _classify(raw)
        if typed is None:
            raise _error(text, start, f"number '{raw}' is out of range")
        return Literal(typed[0], typed[1], raw)


def render_filter(f: Filter) -> tuple[str, str]:
    """Render a Filter as ``(q, mq)`` text that parses back to an equal Filter."""
    return render_statements(f.q), render_statements(f.mq)


def render_statements(statements: tuple[Statement, ...]) -> str:
    """Render statements as one ``;``-separated expression (columns are not kept)."""
    return ";".join(_render_statement(s) for s in statements)


def _render_statement(statement: Statement) -> str:
    path = ".".join(_render_token(token) for token in statement.path)
    op = statement.op
    if op is Op.EXISTS:
        return path
    if op is Op.NOT_EXISTS:
        return "!" + path
    if op is Op.MATCH:
        return path + "~=" + _render_pattern(statement.pattern or "")
    if statement.range is not None:
        low = _render_literal(statement.range.low)
        high = _render_literal(statement.range.high)
        # '1.' and '.5' are numbers: spaces keep '1. .. .5' from reading as '1' .. '..5'
        dots = " .. " if low.endswith(".") or high.startswith(".") else ".."
        return f"{path}{_SIGN[op]}{low}{dots}{high}"
    return path + _SIGN[op] + ",".join(_render_literal(v) for v in statement.values)


def _render_token(token: str) -> str:
    if token and all(
        char not in _NOT_IN_NAME and char not in "!~," and not char.isspace() and char.isprintable()
        for char in token
    ):
        return token
    return _quoted(token)


def _render_literal(literal: Literal) -> str:
    if literal.kind is not Kind.STRING:
        return literal.text
    text = literal.text
    plain = (
        text
        and not (text[0] == "." or text[-1] == ".")
        and ".." not in text
        and not any(char in _NOT_IN_VALUE or char in "',!" or char.isspace() for char in text)
        and _classify(text) == (Kind.STRING, text)
    )
    return text if plain else _quoted(text)


def _render_pattern(pattern: str) -> str:
    if "'" not in pattern:
        if ";" in pattern or pattern != pattern.strip():
            return _quoted(pattern)
        return pattern
    # Only raw text holds a quote: it must read back as itself
    raw_ok = (
        pattern == pattern.strip()
        and pattern.count("'") % 2 == 0
        and len(_split(pattern, 0, len(pattern), ";")) == 1
        and not (pattern[0] == "'" and pattern[-1] == "'" and "'" not in pattern[1:-1])
    )
    if not raw_ok:
        raise ValueError(f"pattern {pattern!r} cannot be written in the filter language")
    return pattern


def _quoted(text: str) -> str:
    if "'" in text:
        raise ValueError(f"{text!r} holds a quote, which the filter language cannot express")
    return f"'{text}'"
