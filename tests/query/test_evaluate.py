"""Evaluating filters: typing, paths, arrays, metadata, missing values and mismatches."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.model.attribute import Attribute, Metadata
from broker.query.evaluate import filter_matches, statement_matches
from broker.query.parser import parse_filter, parse_statements

JAN_2020 = 1577836800  # 2020-01-01T00:00:00Z


def attrs(**values: Any) -> dict[str, Attribute]:
    """Attributes holding the values, typed as Orion infers (Attribute stays as given)."""
    return {k: v if isinstance(v, Attribute) else Attribute.of(v) for k, v in values.items()}


def holds(q: str, attributes: dict[str, Attribute], mq: str = "") -> bool:
    return filter_matches(parse_filter(q, mq), attributes)


# One attribute 'x' per case: (q, value of x, expected)
CASES: list[tuple[str, Any, bool]] = [
    # numbers
    ("x==20", 20, True),
    ("x==20", 20.0, True),
    ("x==20.0", 20, True),
    ("x==20", 21, False),
    ("x:20", 20, True),
    ("x==-0", 0.0, True),
    ("x==1e3", 1000, True),
    ("x!=20", 21, True),
    ("x!=20", 20, False),
    ("x<20", 19.5, True),
    ("x<20", 20, False),
    ("x<=20", 20, True),
    ("x<=20", 20.5, False),
    ("x>20", 20.5, True),
    ("x>20", 20, False),
    ("x>=20", 20, True),
    ("x>=20", 19, False),
    ("x>-5", -4, True),
    ("x>=0", 10**20, True),
    # lists and ranges
    ("x==1,2,3", 2, True),
    ("x==1,2,3", 4, False),
    ("x!=1,2,3", 4, True),
    ("x!=1,2,3", 3, False),
    ("x==1..5", 1, True),
    ("x==1..5", 5, True),
    ("x==1..5", 3.3, True),
    ("x==1..5", 5.01, False),
    ("x==1..5", 0, False),
    ("x==5..1", 3, False),  # backwards range: empty
    ("x!=1..5", 6, True),
    ("x!=1..5", 3, False),
    ("x!=5..1", 3, True),
    ("x==20,abc", "abc", True),  # mixed list: each item compares with its own type
    ("x==20,abc", 20, True),
    ("x==20,abc", "20", False),
    ("x!=20,abc", "xyz", True),
    ("x!=20,abc", True, False),  # comparable with no item
    ("x==true,null", None, True),
    # strings
    ("x==Plaza", "Plaza", True),
    ("x==Plaza", "plaza", False),
    ("x=='20'", "20", True),
    ("x=='20'", 20, False),
    ("x==20", "20", False),
    ("x=='true'", "true", True),
    ("x=='true'", True, False),
    ("x=='a b'", "a b", True),
    ("x==New York", "New York", True),
    ("x!=Plaza", "Pla", True),
    ("x!=Plaza", "Plaza", False),
    ("x<b", "a", True),
    ("x<b", "b", False),
    ("x<b", "B", True),  # code-point order, as strcmp
    ("x>=b", "b", True),
    ("x>=b", "ba", True),
    ("x<=b", "ba", False),
    ("x>Z", "a", True),
    ("x<é", "z", True),
    ("x==a..c", "b", True),
    ("x==a..c", "c", True),
    ("x==a..c", "ca", False),
    ("x!=a..c", "d", True),
    ("x=='1'..'5'", "3", True),
    ("x=='1'..'5'", 3, False),
    # string operators
    ("x=^Pla", "Plaza", True),
    ("x=^Pla", "plaza", False),
    ("x=^Plaza", "Pla", False),
    ("x=$za", "Plaza", True),
    ("x=$za", "zaP", False),
    ("x=*la", "Plaza", True),
    ("x=*lz", "Plaza", False),
    ("x=^''", "", True),
    ("x=^20", 20, False),  # the value is a number: no string test applies
    ("x=^20", "2021", True),
    ("x=*'a;b'", "xa;by", True),
    # regex
    ("x~=^Pla", "Plaza", True),
    ("x~=za$", "Plaza", True),
    ("x~=la", "Plaza", True),  # a search, not a full match
    ("x~=^la", "Plaza", False),
    ("x~=[0-9]", "a1", True),
    ("x~=[0-9]", 1, False),
    ("x~='a;b'", "xa;b", True),
    ("x~=.*", None, False),
    # bools and null
    ("x==true", True, True),
    ("x==true", False, False),
    ("x==false", False, True),
    ("x==true", 1, False),  # 1 is not true
    ("x==1", True, False),  # and true is not 1
    ("x==0", False, False),
    ("x>0", True, False),
    ("x<1", False, False),
    ("x==1..5", True, False),
    ("x!=true", False, True),
    ("x!=true", True, False),
    ("x!=true", 5, False),  # a mismatch fails, != included
    ("x!=1", True, False),
    ("x==null", None, True),
    ("x==null", 0, False),
    ("x==null", "null", False),
    ("x!=null", 0, True),  # present and not null
    ("x!=null", {"a": 1}, True),
    ("x!=null", None, False),
    ("x==5", None, False),
    ("x!=5", None, False),
    # type mismatches
    ("x!=20", "abc", False),
    ("x!=abc", 20, False),
    ("x<20", "10", False),
    ("x>=20", "abc", False),  # >= is not "not <" on a mismatch
    ("x<=abc", 5, False),
    ("x==20", {"a": 20}, False),
    ("x!=20", {"a": 20}, False),
    # arrays: "contains"
    ("x==20", [1, 20, 3], True),
    ("x==20", [1, 2], False),
    ("x==20", [], False),
    ("x==abc", [20, "abc"], True),
    ("x==1,2", [5, 2], True),
    ("x==1..5", [0, 3, 9], True),
    ("x==1..5", [0, 9], False),  # one element must be inside, not one above and one below
    ("x!=20", [1, 2], True),
    ("x!=20", [1, 20], False),
    ("x!=20", [], True),
    ("x!=20", ["a"], True),
    ("x!=1..5", [0, 9], True),
    ("x!=1..5", [0, 3], False),
    ("x>10", [1, 20], True),
    ("x>10", [1, 2], False),
    ("x<=1", ["a", 1], True),
    ("x~=^Pla", [1, "Plaza"], True),
    ("x~=^Pla", ["plaza"], False),
    ("x=^ab", ["xab", "abc"], True),
    ("x==true", [False, True], True),
    ("x==null", [1, None], True),
    ("x!=null", [1, None], False),
    ("x==20", [[20]], False),  # one level deep only
    ("x==1", [{"a": 1}], False),
    # existence
    ("x", 0, True),
    ("x", None, True),
    ("x", [], True),
    ("!x", 0, False),
]


@pytest.mark.parametrize(("q", "value", "expected"), CASES)
def test_cases(q: str, value: Any, expected: bool) -> None:
    assert holds(q, attrs(x=value)) is expected


@pytest.mark.parametrize(
    "q",
    ["y==1", "y!=1", "y<1", "y<=1", "y>1", "y>=1", "y~=.*", "y=^a", "y=$a", "y=*a", "y"],
)
def test_missing_attribute_fails_every_operator_but_not_exists(q: str) -> None:
    assert holds(q, attrs(x=1)) is False
    assert holds("!y", attrs(x=1)) is True


# -- dates ------------------------------------------------------------------------------------


def dated(value: str | None) -> Attribute:
    return Attribute("DateTime", value)


@pytest.mark.parametrize(
    ("q", "value", "expected"),
    [
        ("d==2020-01-01T00:00:00Z", "2020-01-01T00:00:00Z", True),
        ("d==2020-01-01", "2020-01-01T00:00:00Z", True),
        ("d==2020-01-01T01:00:00+01:00", "2020-01-01T00:00:00Z", True),
        ("d>2020-01-01", "2020-01-01T00:00:01Z", True),
        ("d>2020-01-01", "2020-01-01T00:00:00Z", False),
        ("d>=2020-01-01", "2020-01-01T00:00:00Z", True),
        ("d<2019-12-31T23:59:59Z", "2020-01-01", False),
        ("d==2019-01-01..2021-01-01", "2020-06-01T12:00:00Z", True),
        ("d!=2019-01-01..2021-01-01", "2022-06-01T12:00:00Z", True),
        ("d==2019-01-01,2020-01-01", "2020-01-01", True),
        # numbers and dates compare alike: a DateTime attribute is epoch seconds
        (f"d=={JAN_2020}", "2020-01-01T00:00:00Z", True),
        (f"d>{JAN_2020 - 1}", "2020-01-01T00:00:00Z", True),
        (f"d==0..{JAN_2020}", "2020-01-01T00:00:00Z", True),
        ("d=='2020-01-01T00:00:00Z'", "2020-01-01T00:00:00Z", False),  # a string literal
        ("d~=^2020", "2020-01-01T00:00:00Z", False),  # the value is a number
        ("d==2020-01-01", None, False),
        ("d==null", None, True),
    ],
)
def test_dates_compare_as_dates(q: str, value: str | None, expected: bool) -> None:
    assert holds(q, {"d": dated(value)}) is expected


def test_date_literal_against_plain_values() -> None:
    assert holds("d==2020-01-01", attrs(d=JAN_2020)) is True  # a number: compared
    assert holds("d>2020-01-01", attrs(d=JAN_2020 + 0.5)) is True
    assert holds("d==2020-01-01", attrs(d="2020-01-01")) is False  # Text: a string, no match
    assert holds("d==2020-01-01", {"d": Attribute("ISO8601", "2020-01-01")}) is True


# -- paths ------------------------------------------------------------------------------------

LOC = {"x": {"y": 3, "s": "Pla", "n": None, "l": [1, 2]}, "a.b": {"c": True}}


@pytest.mark.parametrize(
    ("q", "expected"),
    [
        ("loc.x.y==3", True),
        ("loc.x.y>2", True),
        ("loc.x.y==4", False),
        ("loc.x.s=^P", True),
        ("loc.x.n==null", True),
        ("loc.x.l==2", True),
        ("loc.'a.b'.c==true", True),
        ("loc.a.b.c==true", False),
        ("loc.x", True),
        ("loc.x.y", True),
        ("loc.x.n", True),
        ("loc.x.z", False),
        ("!loc.x.z", True),
        ("!loc.x.y", False),
        ("loc.x.y.z", False),  # walking into a number
        ("!loc.x.y.z", True),
        ("loc.x.l.0", False),  # paths walk into objects only
        ("loc.x.z!=1", False),
        ("loc==3", False),  # an object equals no literal
        ("!nothing.x", True),  # the attribute itself missing
        ("nothing.x!=1", False),
    ],
)
def test_paths_walk_into_objects(q: str, expected: bool) -> None:
    assert holds(q, attrs(loc=LOC)) is expected


def test_a_dotted_attribute_name_needs_quotes() -> None:
    attributes = attrs(**{"a.b": 5})
    assert holds("'a.b'==5", attributes) is True
    assert holds("a.b==5", attributes) is False


# -- metadata ---------------------------------------------------------------------------------


def temp_with_metadata() -> dict[str, Attribute]:
    metadata = {
        "unit": Metadata("Text", "C"),
        "accuracy": Metadata("Number", 0.5),
        "ts": Metadata("DateTime", "2020-01-01T00:00:00Z"),
        "info": Metadata("StructuredValue", {"x": {"y": 1}}),
    }
    return {"temp": Attribute("Number", 20, metadata), "name": Attribute.of("Pla")}


@pytest.mark.parametrize(
    ("mq", "expected"),
    [
        ("temp.unit==C", True),
        ("temp.unit==F", False),
        ("temp.unit", True),
        ("!temp.unit", False),
        ("temp.other", False),
        ("!temp.other", True),
        ("!missing.unit", True),  # no attribute, so no metadata
        ("missing.unit==C", False),
        ("name.unit", False),
        ("temp.accuracy<1", True),
        ("temp.accuracy==0.5", True),
        ("temp.ts==2020-01-01", True),  # DateTime metadata compare as dates
        (f"temp.ts=={JAN_2020}", True),
        ("temp.info.x.y==1", True),
        ("temp.info.x.z==1", False),
        ("!temp.info.x.z", True),
        ("temp.unit==20", False),
        ("temp.unit~=^C$", True),
    ],
)
def test_metadata(mq: str, expected: bool) -> None:
    assert holds("", temp_with_metadata(), mq) is expected


def test_q_and_mq_are_anded() -> None:
    attributes = temp_with_metadata()
    assert holds("temp>10", attributes, "temp.unit==C") is True
    assert holds("temp>30", attributes, "temp.unit==C") is False
    assert holds("temp>10", attributes, "temp.unit==F") is False
    assert holds("temp>10;name==Pla", attributes) is True
    assert holds("temp>10;name==X", attributes) is False


def test_statement_matches_reads_the_value_or_metadata() -> None:
    attributes = temp_with_metadata()
    (statement,) = parse_statements("temp.unit==C")
    assert statement_matches(statement, attributes, metadata=True) is True
    assert statement_matches(statement, attributes) is False  # temp is 20, no 'unit' key


def test_the_empty_filter_matches_everything() -> None:
    assert holds("", {}) is True
    assert holds("", attrs(x=1)) is True


# -- properties -------------------------------------------------------------------------------

scalars = st.one_of(
    st.integers(-5, 5),
    st.floats(-5, 5, allow_nan=False),
    st.sampled_from(["", "a", "b", "ab", "5", "B"]),
    st.booleans(),
    st.none(),
)
literals = st.sampled_from(["-1", "0", "2.5", "5", "a", "ab", "'5'", "B", "true", "null"])
orderable = st.sampled_from(["-1", "0", "2.5", "5", "a", "ab", "'5'", "B"])


NUMERIC_LITERALS = ("-1", "0", "2.5", "5")


def comparable(value: Any, literal: str) -> bool:
    """The typing rule, restated: which values a literal can be compared with."""
    if literal == "null":
        return True
    if literal == "true":
        return isinstance(value, bool)
    if literal in NUMERIC_LITERALS:
        return isinstance(value, int | float) and not isinstance(value, bool)
    return isinstance(value, str)


@settings(max_examples=400, deadline=None)
@given(scalars, literals)
def test_ne_is_eq_negated_on_comparable_values(value: Any, literal: str) -> None:
    attributes = attrs(x=value)
    eq, ne = holds(f"x=={literal}", attributes), holds(f"x!={literal}", attributes)
    assert not (eq and ne)
    assert (eq or ne) is comparable(value, literal)


@settings(max_examples=400, deadline=None)
@given(scalars, orderable)
def test_orderings_agree_with_each_other(value: Any, literal: str) -> None:
    attributes = attrs(x=value)
    lt, le, gt, ge, eq = (
        holds(f"x{op}{literal}", attributes) for op in ("<", "<=", ">", ">=", "==")
    )
    assert le == (lt or eq)
    assert ge == (gt or eq)
    assert not (lt and ge)
    assert (lt or ge) is comparable(value, literal)
    low = "-1e300" if literal in NUMERIC_LITERALS else "''"
    assert le == holds(f"x=={low}..{literal}", attributes)


@settings(max_examples=300, deadline=None)
@given(scalars, st.sampled_from(["==5", "!=5", "<2", ">=a", "~=a", "=^a", "==1,a", "==0..3"]))
def test_a_one_element_array_is_its_element_except_for_ne(value: Any, tail: str) -> None:
    single, wrapped = holds("x" + tail, attrs(x=value)), holds("x" + tail, attrs(x=[value]))
    if tail.startswith("!="):
        assert wrapped == (not holds("x==5", attrs(x=value)))
    else:
        assert single == wrapped
