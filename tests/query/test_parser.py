"""The q / mq parser: typing, operators, paths, errors with columns, limits, rendering."""

from __future__ import annotations

import dataclasses
import string
from collections.abc import Callable
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.errors import InvalidInput, InvalidRegex, QuerySyntaxError
from broker.model.attribute import parse_iso8601
from broker.query.ast import Filter, Kind, Literal, Op, Range, Statement
from broker.query.parser import (
    MAX_EXPRESSION_LENGTH,
    MAX_LIST_ITEMS,
    MAX_STATEMENTS,
    _Parser,
    parse_filter,
    parse_literal,
    parse_statements,
    render_filter,
    render_statements,
)
from broker.query.regex import compile_pattern

JAN_2020 = 1577836800.0


def one(text: str, *, metadata: bool = False) -> Statement:
    """The single statement of ``text``."""
    (statement,) = parse_statements(text, metadata=metadata)
    return statement


def num(text: str) -> Literal:
    return Literal(Kind.NUMBER, float(text), text)


def text_(value: str) -> Literal:
    return Literal(Kind.STRING, value, value)


# -- literal typing ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("written", "kind", "value"),
    [
        ("20", Kind.NUMBER, 20.0),
        ("-1", Kind.NUMBER, -1.0),
        ("1.5", Kind.NUMBER, 1.5),
        ("1e3", Kind.NUMBER, 1000.0),
        ("1E-2", Kind.NUMBER, 0.01),
        ("+4", Kind.NUMBER, 4.0),
        (".5", Kind.NUMBER, 0.5),
        ("-0", Kind.NUMBER, 0.0),
        ("2020-01-01", Kind.DATE, JAN_2020),
        ("2020-01-01T00:00:00Z", Kind.DATE, JAN_2020),
        ("2020-01-01T01:00:00+01:00", Kind.DATE, JAN_2020),
        ("2020-01-01T00:00:00", Kind.DATE, JAN_2020),  # no offset: UTC, as Orion
        ("true", Kind.BOOL, True),
        ("false", Kind.BOOL, False),
        ("null", Kind.NULL, None),
        ("'20'", Kind.STRING, "20"),
        ("'true'", Kind.STRING, "true"),
        ("'null'", Kind.STRING, "null"),
        ("'2020-01-01'", Kind.STRING, "2020-01-01"),
        ("''", Kind.STRING, ""),
        ("' a b '", Kind.STRING, " a b "),
        ("Plaza", Kind.STRING, "Plaza"),
        ("New York", Kind.STRING, "New York"),  # Orion keeps inner spaces
        ("nan", Kind.STRING, "nan"),
        ("inf", Kind.STRING, "inf"),
        ("Infinity", Kind.STRING, "Infinity"),
        ("0x1A", Kind.STRING, "0x1A"),
        ("1_0", Kind.STRING, "1_0"),
        ("True", Kind.STRING, "True"),
        ("NULL", Kind.STRING, "NULL"),
        ("2020-13-01", Kind.STRING, "2020-13-01"),
        ("1.2.3", Kind.STRING, "1.2.3"),
        ("-", Kind.STRING, "-"),
    ],
)
def test_literal_typing(written: str, kind: Kind, value: object) -> None:
    literal = parse_literal(written)
    assert literal.kind is kind
    assert literal.value == value
    assert type(literal.value) is type(value)
    assert literal.text == written.strip("'")


def test_numbers_are_floats_and_bools_are_not_numbers() -> None:
    assert one("x==1").values[0].value.__class__ is float
    assert one("x==true").values[0].value is True


# -- operators --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("q", "op"),
    [
        ("t==5", Op.EQ),
        ("t:5", Op.EQ),
        ("t!=5", Op.NE),
        ("t<5", Op.LT),
        ("t<=5", Op.LE),
        ("t>5", Op.GT),
        ("t>=5", Op.GE),
    ],
)
def test_comparison_operators(q: str, op: Op) -> None:
    assert one(q) == Statement(("t",), op, values=(num("5"),))


@pytest.mark.parametrize(
    ("q", "op", "value"),
    [
        ("n=^Pla", Op.PREFIX, "Pla"),
        ("n=$za", Op.SUFFIX, "za"),
        ("n=*la", Op.CONTAINS, "la"),
        ("n=^20", Op.PREFIX, "20"),  # always a string
        ("n=$true", Op.SUFFIX, "true"),
        ("n=*null", Op.CONTAINS, "null"),
        ("n=^'a;b'", Op.PREFIX, "a;b"),
        ("n=^'a,b'", Op.PREFIX, "a,b"),
        ("n=$'x..y'", Op.SUFFIX, "x..y"),
        ("n=*' '", Op.CONTAINS, " "),
        ("n=^2020-01-01", Op.PREFIX, "2020-01-01"),
        ("n=^-", Op.PREFIX, "-"),
    ],
)
def test_string_operators(q: str, op: Op, value: str) -> None:
    assert one(q) == Statement(("n",), op, values=(text_(value),))


@pytest.mark.parametrize(
    ("q", "pattern"),
    [
        ("n~=^Pla", "^Pla"),
        ("n~=a(b|c)+$", "a(b|c)+$"),
        ("n~='a;b'", "a;b"),
        ("n~=' x '", " x "),
        ("n~=[0-9]{2,3}", "[0-9]{2,3}"),
        ("n~=a'b'c", "a'b'c"),  # quotes inside a pattern are kept as written
        ("n~==x", "=x"),
        ("n~=a..b,c", "a..b,c"),  # no lists or ranges for ~=
        ("n~= ^a ", "^a"),
    ],
)
def test_match_takes_the_raw_pattern(q: str, pattern: str) -> None:
    assert one(q) == Statement(("n",), Op.MATCH, pattern=pattern)


def test_unary_statements() -> None:
    assert one("temp") == Statement(("temp",), Op.EXISTS)
    assert one("!temp") == Statement(("temp",), Op.NOT_EXISTS)
    assert one("! temp") == Statement(("temp",), Op.NOT_EXISTS)
    assert one("!a.b") == Statement(("a", "b"), Op.NOT_EXISTS)


def test_whitespace_around_parts_is_ignored_as_orion_does() -> None:
    assert parse_statements("  temp  >  20 ;  name == 'x y'  ; ") == (
        Statement(("temp",), Op.GT, values=(num("20"),), column=3),
        Statement(("name",), Op.EQ, values=(text_("x y"),), column=18),
    )
    assert one("t == 1 , 2").values == (num("1"), num("2"))
    assert one("t == 1 .. 2").range == Range(num("1"), num("2"))


def test_whole_string_empty_or_blank_is_the_empty_filter() -> None:
    assert parse_filter("", "") == Filter()
    assert parse_filter("  ", "") == Filter()
    assert parse_filter("", "").empty


def test_trailing_semicolon_is_allowed() -> None:
    assert parse_statements("a;b;") == parse_statements("a;b") != ()
    assert len(parse_statements("a;b; ")) == 2


def test_statement_columns() -> None:
    columns = [s.column for s in parse_statements("a;  bb==1;'c.d'<2; !e")]
    assert columns == [1, 5, 11, 20]


# -- lists and ranges -------------------------------------------------------------------------


def test_lists() -> None:
    assert one("c==red,green,'a,b'").values == (text_("red"), text_("green"), text_("a,b"))
    assert one("c!=1,2").values == (num("1"), num("2"))
    assert one("c:1,2").op is Op.EQ


def test_list_items_are_typed_one_by_one() -> None:
    kinds = [v.kind for v in one("c==1,a,true,null,2020-01-01,'2'").values]
    assert kinds == [Kind.NUMBER, Kind.STRING, Kind.BOOL, Kind.NULL, Kind.DATE, Kind.STRING]


@pytest.mark.parametrize(
    ("q", "low", "high"),
    [
        ("t==1..5", num("1"), num("5")),
        ("t==-5..-1", num("-5"), num("-1")),
        ("t==1.5..2.5", num("1.5"), num("2.5")),
        ("t!=a..m", text_("a"), text_("m")),
        ("t=='a.b'..'c..d'", text_("a.b"), text_("c..d")),
        ("t==5..1", num("5"), num("1")),  # backwards: legal, matches nothing
        (
            "t==2020-01-01..2021-01-01",
            Literal(Kind.DATE, JAN_2020, "2020-01-01"),
            Literal(Kind.DATE, parse_iso8601("2021-01-01"), "2021-01-01"),
        ),
        ("t==0..2020-01-01", num("0"), Literal(Kind.DATE, JAN_2020, "2020-01-01")),
        ("t=='1'..'5'", text_("1"), text_("5")),
    ],
)
def test_ranges(q: str, low: Literal, high: Literal) -> None:
    statement = one(q)
    assert statement.range == Range(low, high)
    assert statement.values == ()


def test_quoted_dots_are_not_a_range_and_quoted_commas_not_a_list() -> None:
    assert one("t=='1..5'").values == (text_("1..5"),)
    assert one("t=='1,5'").values == (text_("1,5"),)


# -- paths ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("q", "path"),
    [
        ("a", ("a",)),
        ("a.b.c", ("a", "b", "c")),
        ("'a.b'.c", ("a.b", "c")),
        ("a.'b.c'", ("a", "b.c")),
        ("'a.b'", ("a.b",)),
        ("'a b'.c", ("a b", "c")),  # quotes protect anything but a quote
        ("'x=y;z'", ("x=y;z",)),
        ("urn-x_y*^$,", ("urn-x_y*^$,",)),
        ("a!b", ("a!b",)),  # as Orion: '!' only starts '!=' or a leading NOT
        ("a~b", ("a~b",)),
        ("température", ("température",)),
    ],
)
def test_paths(q: str, path: tuple[str, ...]) -> None:
    assert one(q).path == path


def test_paths_before_operators() -> None:
    assert one("a!=1").path == ("a",)
    assert one("a~=x").path == ("a",)
    assert one("'a.b'.c>=1").path == ("a.b", "c")


def test_mq_paths() -> None:
    assert one("temp.unit==C", metadata=True).path == ("temp", "unit")
    assert one("temp.info.x.y<3", metadata=True).path == ("temp", "info", "x", "y")
    assert one("!temp.unit", metadata=True).op is Op.NOT_EXISTS
    f = parse_filter("temp>1", "temp.unit")
    assert f.q[0].path == ("temp",)
    assert f.mq[0].path == ("temp", "unit")


# -- errors -----------------------------------------------------------------------------------

ERRORS = [
    # (q, part of the message, column)
    ("temp=5", "unknown operator '='", 5),
    ("temp=>5", "unknown operator '=>'", 5),
    ("temp<>5", "unknown operator '<>'", 5),
    ("temp===5", "unknown operator '==='", 5),
    ("temp!==5", "unknown operator '!=='", 5),
    ("temp:=5", "unknown operator ':='", 5),
    ("temp>==5", "unknown operator '>=='", 5),
    ("temp=~5", "unknown operator '=~'", 5),
    ("temp 5", "expected an operator or ';' after 'temp'", 6),
    ("a.b c", "expected an operator or ';' after 'a.b'", 5),
    ("a ~ b", "expected an operator or ';' after 'a'", 3),
    ("'abc", "unterminated quote", 1),
    ("a;b=='x", "unterminated quote", 6),
    ("x=='a'b'c'", "unexpected text after the closing quote", 7),
    ("x==ab'c'", "a quote must enclose the whole value", 6),
    ("==5", "empty attribute name", 1),
    ("!", "empty attribute name", 2),
    ("''==5", "empty attribute name", 1),
    ("a..b==1", "empty name after 'a.'", 3),
    ("a.", "empty name after 'a.'", 3),
    ("a.''", "empty name after 'a.'", 3),
    ("a. b", "whitespace is not allowed inside a path", 3),
    ("a .b", "whitespace is not allowed inside a path", 2),
    ("a<b>c", "character '>' is not allowed", 4),
    (";", "empty statement before ';'", 1),
    ("a;;b", "empty statement between two ';'", 3),
    ("a; ;b", "empty statement between two ';'", 4),
    (";a", "empty statement before ';'", 1),
    ("temp==", "missing value after '=='", 7),
    ("temp<  ", "missing value after '<'", 6),
    ("n=^", "missing value after '=^'", 4),
    ("n~=", "missing value after '~='", 4),
    ("n~=''", "empty pattern", 5),
    ("t<true", "'<' compares numbers, dates and strings, not bool", 3),
    ("t>=null", "'>=' compares numbers, dates and strings, not null", 4),
    ("t<1,2", "a list is only allowed with '==', ':' and '!='", 4),
    ("t>1..2", "a range is only allowed with '==', ':' and '!='", 4),
    ("n=^a,b", "a list is only allowed", 5),
    ("n=*a..b", "a range is only allowed", 5),
    ("t==1..2,3", "a value cannot be both a list and a range", 5),
    ("t==1..", "missing high end of range", 7),
    ("t==..2", "missing low end of range", 4),
    ("t==1..2..3", "a range has exactly two ends", 8),
    ("t==1..a", "range ends must be of one type", 7),
    ("t==a..2020-01-01", "range ends must be of one type", 7),
    ("t==true..false", "a range cannot have a bool end", 4),
    ("t==1..null", "a range cannot have a null end", 7),
    ("t==1,,2", "empty item in list", 6),
    ("t==1,", "empty item in list", 6),
    ("t==,1", "empty item in list", 4),
    ("t==1e999", "number '1e999' is out of range", 4),
    ("t==a=b", "character '=' is not allowed in an unquoted value", 5),
    ("t==(1)", "character '(' is not allowed in an unquoted value", 4),
    ('t=="x"', "character '\"' is not allowed in an unquoted value", 4),
    ("n=^a>b", "character '>' is not allowed", 5),
    ("!a==1", "'!a' takes no operator", 3),
]


@pytest.mark.parametrize(("q", "message", "column"), ERRORS)
def test_errors_say_what_and_where(q: str, message: str, column: int) -> None:
    with pytest.raises(QuerySyntaxError) as caught:
        parse_statements(q)
    assert message in caught.value.reason
    assert caught.value.column == column
    assert caught.value.expression == q
    assert f"(column {column})" in str(caught.value)


def test_parse_filter_names_the_expression_at_fault() -> None:
    with pytest.raises(QuerySyntaxError, match=r"^in q, unterminated quote \(column 4\)"):
        parse_filter("a==' ", "")
    with pytest.raises(QuerySyntaxError) as caught:
        parse_filter("temp>1", "temp")
    assert caught.value.reason.startswith("in mq, an mq path needs an attribute and a metadata")
    assert caught.value.expression == "temp"
    assert caught.value.column == 1


@pytest.mark.parametrize("mq", ["temp", "!temp", "temp==1", "'a.b'>2"])
def test_mq_needs_attribute_and_metadata(mq: str) -> None:
    with pytest.raises(QuerySyntaxError, match="needs an attribute and a metadata name"):
        parse_statements(mq, metadata=True)
    assert parse_statements(mq)  # fine as q


@pytest.mark.parametrize(
    ("q", "column"), [("n~=(", 4), ("n~=a(?=b)", 4), ("a;n~='(' ", 7), ("n~=x\\1", 4)]
)
def test_bad_regex_raises_invalid_regex_with_column(q: str, column: int) -> None:
    with pytest.raises(InvalidRegex, match=rf"\(column {column}\)"):
        parse_statements(q)


def test_bad_regex_through_parse_filter_names_the_expression() -> None:
    with pytest.raises(InvalidRegex, match=r"^in mq, .*column 6"):
        parse_filter("", "a.b~=[")


def test_non_string_input_is_a_syntax_error() -> None:
    with pytest.raises(QuerySyntaxError, match="must be a string"):
        parse_statements(5)  # type: ignore[arg-type]


# -- limits -----------------------------------------------------------------------------------


def test_length_limit() -> None:
    longest = "a" * MAX_EXPRESSION_LENGTH
    assert one(longest).path == (longest,)
    with pytest.raises(QuerySyntaxError, match="at most 4096") as caught:
        parse_statements(longest + "a")
    assert caught.value.column == MAX_EXPRESSION_LENGTH + 1


def test_statement_limit() -> None:
    assert len(parse_statements(";".join(["a"] * MAX_STATEMENTS))) == MAX_STATEMENTS
    with pytest.raises(QuerySyntaxError, match="more than 64 statements") as caught:
        parse_statements(";".join(["a"] * (MAX_STATEMENTS + 1)))
    assert caught.value.column == 2 * MAX_STATEMENTS + 1


def test_list_limit() -> None:
    items = [str(i) for i in range(MAX_LIST_ITEMS)]
    assert len(one("t==" + ",".join(items)).values) == MAX_LIST_ITEMS
    with pytest.raises(QuerySyntaxError, match="at most 256 items") as caught:
        parse_statements("t==" + ",".join([*items, "x"]))
    assert caught.value.column == len("t==" + ",".join(items)) + 2


def test_results_are_cached_per_text() -> None:
    assert parse_filter("temp>1", "a.b") is parse_filter("temp>1", "a.b")
    assert parse_statements("x==1,2") is parse_statements("x==1,2")


# -- rendering --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("q", "rendered"),
    [
        ("temp", "temp"),
        ("! temp", "!temp"),
        ("t : 5", "t==5"),
        ("t==1, 2", "t==1,2"),
        ("n=='20'", "n=='20'"),
        ("n==Plaza", "n==Plaza"),
        ("n=='a,b',c", "n=='a,b',c"),
        ("n=='a.'..b", "n=='a.'..b"),
        ("'a.b'.c<=2020-01-01", "'a.b'.c<=2020-01-01"),
        ("n~=' x;y'", "n~=' x;y'"),
        ("n~=a'b'c", "n~=a'b'c"),
        ("n=^' '", "n=^' '"),
        ("a!b", "'a!b'"),
        ("x==New York", "x=='New York'"),
    ],
)
def test_render_examples(q: str, rendered: str) -> None:
    statements = parse_statements(q)
    assert render_statements(statements) == rendered
    assert _without_columns(parse_statements(rendered)) == _without_columns(statements)


def test_render_rejects_what_the_language_cannot_express() -> None:
    with pytest.raises(ValueError, match="quote"):
        render_statements((Statement(("a'b",), Op.EXISTS),))
    with pytest.raises(ValueError, match="cannot be written"):
        render_statements((Statement(("a",), Op.MATCH, pattern="'x'"),))


def _without_columns(statements: tuple[Statement, ...]) -> tuple[Statement, ...]:
    return tuple(dataclasses.replace(s, column=1) for s in statements)


def _at_rendered_columns(statements: tuple[Statement, ...]) -> tuple[Statement, ...]:
    """The statements with the columns they have in ``render_statements`` output."""
    placed = []
    column = 1
    for statement in statements:
        placed.append(dataclasses.replace(statement, column=column))
        column += len(render_statements((statement,))) + 1
    return tuple(placed)


def _compiles(pattern: str) -> bool:
    try:
        compile_pattern(pattern)
    except InvalidRegex:
        return False
    return pattern.strip() != ""


# A path token may be any text without a quote; these characters stress the quoting rules.
_TOKEN_CHARS = string.ascii_letters[:6] + string.digits[:3] + '.,;:=!~<>()" _-^$*é\t'
_VALUE_CHARS = string.ascii_letters[:6] + string.digits[:4] + '.,;:=!~<>()" _-+^$*é'

tokens = st.text(_TOKEN_CHARS, min_size=1, max_size=6)
numbers = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.integers(-(10**30), 10**30).map(str),
    st.sampled_from([".5", "+1", "1.", "1E3", "-0", "2020", "00"]),
).map(lambda t: Literal(Kind.NUMBER, float(t), t))
_OFFSETS = ["", "Z", "+00:00", "+05:30", "-08:00"]
dates = st.builds(
    lambda epoch, offset, date_only: (
        datetime.fromtimestamp(epoch, UTC).date().isoformat()
        if date_only
        else datetime.fromtimestamp(epoch, UTC).replace(tzinfo=None).isoformat() + offset
    ),
    st.floats(-1e10, 1e11).map(lambda x: round(x, 3)),
    st.sampled_from(_OFFSETS),
    st.booleans(),
).map(lambda t: Literal(Kind.DATE, parse_iso8601(t), t))
strings = st.text(_VALUE_CHARS, max_size=8).map(text_)
literals = st.one_of(
    numbers,
    dates,
    strings,
    st.sampled_from(
        [
            Literal(Kind.BOOL, True, "true"),
            Literal(Kind.BOOL, False, "false"),
            Literal(Kind.NULL, None, "null"),
        ]
    ),
)
patterns = st.one_of(
    st.sampled_from(["^Pla", "a(b|c)+$", "x;y", " lead", "trail ", "a'b'c", "'a'.'b'", "=x"]),
    st.text("ab.*^$|;, ", min_size=1, max_size=8).filter(_compiles),
)


_OPS = list(Op)
_ORDERED = st.one_of(numbers, dates, strings)
_NUMERIC = st.one_of(numbers, dates)
_RANGES = st.one_of(st.tuples(_NUMERIC, _NUMERIC), st.tuples(strings, strings)).map(
    lambda ends: Range(*ends)
)
_VALUE_LISTS = st.lists(literals, min_size=1, max_size=4).map(tuple)
_Q_PATHS = st.lists(tokens, min_size=1, max_size=3).map(tuple)
_MQ_PATHS = st.lists(tokens, min_size=2, max_size=3).map(tuple)


@st.composite
def statements(draw: st.DrawFn, metadata: bool) -> Statement:
    path = draw(_MQ_PATHS if metadata else _Q_PATHS)
    op = draw(st.sampled_from(_OPS))
    if op in (Op.EXISTS, Op.NOT_EXISTS):
        return Statement(path, op)
    if op is Op.MATCH:
        return Statement(path, op, pattern=draw(patterns))
    if op in (Op.PREFIX, Op.SUFFIX, Op.CONTAINS):
        return Statement(path, op, values=(draw(strings),))
    if op in (Op.LT, Op.LE, Op.GT, Op.GE):
        return Statement(path, op, values=(draw(_ORDERED),))
    if draw(st.booleans()):
        return Statement(path, op, range=draw(_RANGES))
    return Statement(path, op, values=draw(_VALUE_LISTS))


filters = st.builds(
    Filter,
    q=st.lists(statements(False), max_size=4).map(tuple),
    mq=st.lists(statements(True), max_size=3).map(tuple),
)


@settings(max_examples=2000, deadline=None)
@given(filters)
def test_render_then_parse_gives_the_same_filter(f: Filter) -> None:
    q, mq = render_filter(f)
    expected = Filter(q=_at_rendered_columns(f.q), mq=_at_rendered_columns(f.mq))
    assert parse_filter(q, mq) == expected


@settings(max_examples=300, deadline=None)
@given(filters)
def test_rendering_is_stable(f: Filter) -> None:
    q, mq = render_filter(f)
    assert render_filter(parse_filter(q, mq)) == (q, mq)


# -- the fast path for plain statements gives what the general parser gives -------------------

_PLAIN_VALUES = st.sampled_from(
    ["20", "-1.5", "1e3", "2020-01-01", "2020-01-01T00:00:00Z", "true", "null", "abc", "a b",
     "'x,y'", "1..5", "a..b", "1,2,3", "x,y", "'q'", "1..", "..2", "=5", ">3", "1.2.3", ""]
)  # fmt: skip


@settings(max_examples=500)
@given(
    name=st.sampled_from(["temp", "a_1", "NO2", "9", "x.y", "'a.b'"]),
    sign=st.sampled_from(["==", "!=", "<", "<=", ">", ">=", ":", "=^", "~=", "==="]),
    value=_PLAIN_VALUES,
)
def test_simple_statements_parse_as_the_general_parser_does(
    name: str, sign: str, value: str
) -> None:
    text = f"{name}{sign}{value}"
    parser = _Parser(text, False)

    def outcome(read: Callable[[int, int], Statement | None]) -> object:
        try:
            return read(0, len(text))
        except InvalidInput as exc:
            return (type(exc), str(exc))

    simple = outcome(parser.simple)
    assert simple is None or simple == outcome(parser.general)
    if (
        name.isidentifier()
        and sign in ("==", "!=", "<", "<=", ">", ">=", ":")
        and value[:1] not in "=>"
    ):
        assert simple is not None  # the fast path does take the plain statements
