"""Entity and types queries on stored documents (broker/store/query.py, parameters.py,
rendering.py, entity_types.py): parsing as Orion answers, matching, order, paging, shapes,
the wire, and a property test: select + merge over any split of the documents into parts
gives what a brute-force model computes directly."""

from __future__ import annotations

import functools
import tracemalloc
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import examples

from broker.errors import (
    AmbiguousEntity,
    InvalidGeoQuery,
    InvalidIdentifier,
    InvalidInput,
    InvalidRegex,
    NotFound,
    QuerySyntaxError,
    SerializationError,
    SilboError,
    mapping_for,
)
from broker.store.entity_types import (
    TypesPart,
    TypesQuery,
    TypeSummary,
    merge_types,
    types_part,
)
from broker.store.parameters import (
    parse_entity_get,
    parse_entity_query,
    parse_query_body,
    parse_scopes,
    parse_types_query,
)
from broker.store.query import (
    EntityQuery,
    Format,
    Order,
    Page,
    Part,
    Selector,
    matches,
    merge,
    one,
    select,
    sort_key,
)
from broker.store.rendering import (
    render,
    render_attribute,
    render_page,
    render_type,
    render_types,
)
from broker.store.semantics import Document, iso8601

NOW = 1_000.0


def attr(value: Any, type_: str | None = None, **metadata: Any) -> dict[str, Any]:
    """A stored attribute (type inferred as Number or Text unless given)."""
    inferred = type_ or ("Text" if isinstance(value, str) else "Number")
    meta = {k: {"type": "Number", "value": v} for k, v in metadata.items()}
    return {"type": inferred, "value": value, "metadata": meta}


def doc(
    entity_id: str,
    entity_type: str = "Room",
    path: str = "/",
    created: float = 1.0,
    tenant: str = "",
    expires: float | None = None,
    **attributes: dict[str, Any],
) -> Document:
    """A stored document created at ``created`` and modified a second later."""
    dates = {name: (created, created + 1) for name in attributes}
    return Document(
        entity_id, entity_type, path, tenant, attributes, created, created + 1, expires, dates
    )


def query(params: Mapping[str, str] | None = None, path: str | None = None) -> EntityQuery:
    return parse_entity_query(params or {}, "", path)


def ids(page: Page | Part) -> list[str]:
    return [d.id for d in page.documents]


def run(documents: list[Document], q: EntityQuery) -> Page:
    return merge([select(documents, q, NOW)], q)


# -- parsing ----------------------------------------------------------------------------------


def test_a_query_without_parameters_takes_every_entity_of_every_path() -> None:
    q = query()
    assert (q.scopes, q.selectors, q.limit, q.offset, q.count) == (("/#",), (), 20, 0, False)
    assert (q.attrs, q.metadata, q.order_by, q.format) == (None, None, (), Format.NORMALIZED)
    assert q.entity_ids is None


@pytest.mark.parametrize(
    ("header", "scopes"),
    [
        (None, ("/#",)),
        ("", ("/#",)),
        ("/", ("/",)),
        ("/a/", ("/a",)),
        ("/a/#, /b", ("/a/#", "/b")),
        ("/a,/a", ("/a",)),
    ],
)
def test_service_paths_of_a_query(header: str | None, scopes: tuple[str, ...]) -> None:
    assert parse_scopes(header) == scopes


@pytest.mark.parametrize("header", [",".join(f"/p{i}" for i in range(11)), "a", "/a/#/b", "/a b"])
def test_bad_service_paths_are_bad_requests(header: str) -> None:
    with pytest.raises(InvalidInput):
        parse_scopes(header)


def test_ids_and_types_give_every_pair_as_selectors() -> None:
    q = query({"id": "a,b", "type": "T,U"})
    assert {(s.id, s.type) for s in q.selectors} == {
        ("a", "T"),
        ("a", "U"),
        ("b", "T"),
        ("b", "U"),
    }
    assert q.entity_ids == frozenset({"a", "b"})
    assert query({"idPattern": "^a", "type": "T"}).selectors == (Selector(None, "^a", "T"),)
    assert query({"typePattern": "R"}).selectors == (Selector(None, None, None, "R"),)
    assert query({"idPattern": "^a"}).entity_ids is None


@pytest.mark.parametrize(
    ("params", "error", "message"),
    [
        ({"id": "a", "idPattern": "a"}, InvalidInput, "Incompatible parameters: id, IdPattern"),
        ({"type": "a", "typePattern": "a"}, InvalidInput, "Incompatible parameters: type"),
        ({"limit": "0"}, InvalidInput, r"Bad pagination limit: /0/ \[a value of ZERO"),
        ({"limit": "1001"}, InvalidInput, r"Bad pagination limit: /1001/ \[max: 1000\]"),
        ({"limit": "-1"}, InvalidInput, r"/-1/ \[must be a decimal number\]"),
        ({"limit": "1.5"}, InvalidInput, "must be a decimal number"),
        ({"offset": "x"}, InvalidInput, r"Bad pagination offset: /x/ \[must be a decimal"),
        ({"limit": ""}, InvalidInput, "Empty right-hand-side for URI param /limit/"),
        ({"options": "count,bogus"}, InvalidInput, "/options/: bogus"),
        ({"q": "temp>>1"}, QuerySyntaxError, "in q"),
        ({"mq": "temp"}, QuerySyntaxError, "in mq"),
        ({"idPattern": "(a"}, InvalidRegex, "does not compile"),
        ({"id": "a b"}, InvalidIdentifier, "entity id"),
        ({"attrs": "a,(b)"}, InvalidIdentifier, "attribute name"),
        ({"orderBy": "!"}, InvalidIdentifier, "orderBy"),
        ({"georel": "near", "geometry": "point"}, InvalidGeoQuery, "/geometry/ used without"),
        ({"orderBy": "geo:distance"}, InvalidGeoQuery, "geo:distance needs a georel=near"),
    ],
)
def test_what_orion_refuses(params: dict[str, str], error: type[SilboError], message: str) -> None:
    with pytest.raises(error, match=message) as caught:
        query(params)
    assert mapping_for(caught.value).http_status == 400


def test_limit_offset_order_count_and_format() -> None:
    q = query({"limit": "1000", "offset": "7", "orderBy": "!temp,id", "options": "count,values"})
    assert (q.limit, q.offset, q.window, q.count, q.format) == (1000, 7, 1007, True, Format.VALUES)
    assert q.order_by == (Order("temp", True), Order("id"))
    assert query({"options": "values,keyValues,unique"}).format is Format.KEY_VALUES
    assert query({"options": "unique"}).format is Format.UNIQUE


def test_legacy_date_options_add_the_builtins_to_attrs() -> None:
    assert query({"options": "dateCreated"}).attrs == ("*", "dateCreated")
    assert query({"attrs": "a", "options": "dateModified,dateCreated"}).attrs == (
        "a",
        "dateCreated",
        "dateModified",
    )


def test_op_query_body() -> None:
    body = {
        "entities": [{"idPattern": ".*", "type": "Room"}, {"id": "Car1", "typePattern": "^C"}],
        "attrs": ["temperature"],
        "expression": {"q": "temperature>20", "mq": "temperature.accuracy<1"},
        "metadata": ["accuracy"],
    }
    q = parse_query_body(body, {"limit": "5", "orderBy": "id", "options": "count"}, "t", "/a/#")
    assert q.selectors == (Selector(None, ".*", "Room"), Selector("Car1", None, None, "^C"))
    assert (q.q, q.mq, q.attrs, q.metadata) == (
        "temperature>20",
        "temperature.accuracy<1",
        ("temperature",),
        ("accuracy",),
    )
    assert (q.tenant, q.scopes, q.limit, q.count, q.order_by) == (
        "t",
        ("/a/#",),
        5,
        True,
        (Order("id"),),
    )
    assert parse_query_body({}, {}, "", None).selectors == ()


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ([], "must be a JSON object"),
        ({"entities": [{"id": "a"}], "scopes": []}, "Unrecognized field in JSON payload: /scopes/"),
        ({"entities": {}}, "must be a JSON array"),
        ({"entities": [{"type": "T"}]}, "nor /id/ nor /idPattern/ present"),
        ({"entities": [{"id": "a", "idPattern": "a"}]}, "both /id/ and /idPattern/ present"),
        ({"entities": [{"id": "a", "type": "T", "typePattern": "T"}]}, "both /type/"),
        ({"entities": [{"id": "a", "temp": 1}]}, "no attributes allowed"),
        ({"entities": [{"id": 7}]}, "/id/ of an entity must be a string"),
        ({"entities": ["a"]}, "entity is not a JSON object"),
        ({"attrs": "a"}, "/attrs/ must be a JSON array"),
        ({"expression": {"q": 3}}, "/expression/q/ must be a string"),
        ({"expression": {"x": "a"}}, "Unrecognized field in /expression/: /x/"),
    ],
)
def test_bad_op_query_bodies(body: Any, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        parse_query_body(body, {}, "", None)


def test_a_geographical_op_query_needs_its_three_parameters() -> None:
    with pytest.raises(InvalidGeoQuery, match="/georel/ used without /geometry/"):
        parse_query_body({"expression": {"georel": "near"}}, {}, "", None)


def test_one_entity_query() -> None:
    q = parse_entity_get("R1", {"type": "Room", "attrs": "a", "options": "keyValues"}, "", "/a")
    assert q.selectors == (Selector("R1", None, "Room"),)
    assert (q.scopes, q.attrs, q.format, q.limit) == (("/a",), ("a",), Format.KEY_VALUES, 2)
    with pytest.raises(InvalidInput, match="count"):
        parse_entity_get("R1", {"options": "count"}, "", None)


# -- matching ---------------------------------------------------------------------------------


def test_tenant_paths_selectors_and_expiry() -> None:
    documents = [
        doc("a", path="/x"),
        doc("b", path="/x/y"),
        doc("c", path="/x2"),
        doc("d", tenant="other"),
        doc("e", expires=NOW),
        doc("f", expires=NOW + 1),
        doc("g", entity_type="Car"),
    ]
    assert ids(run(documents, query())) == ["a", "b", "c", "f", "g"]
    assert ids(run(documents, query(path="/x/#"))) == ["a", "b"]
    assert ids(run(documents, query(path="/x,/x2"))) == ["a", "c"]
    assert ids(run(documents, query({"type": "Car"}))) == ["g"]
    assert ids(run(documents, query({"idPattern": "[ag]", "typePattern": "^R"}))) == ["a"]
    assert ids(run(documents, query({"id": "e,f"}))) == ["f"]
    assert not matches(documents[3], query(), NOW)


def test_q_and_mq_see_dates_and_builtins() -> None:
    moment = "2024-01-01T00:00:00.000Z"
    documents = [
        doc("a", created=5.0, temp=attr(21, accuracy=0.5), at=attr(moment, "DateTime")),
        doc("b", created=50.0, temp=attr(19, accuracy=2)),
    ]
    assert ids(run(documents, query({"q": "temp>20"}))) == ["a"]
    assert ids(run(documents, query({"q": "at>2023-12-31T00:00:00Z"}))) == ["a"]
    assert ids(run(documents, query({"q": "dateCreated>10"}))) == ["b"]
    assert ids(run(documents, query({"q": "dateModified<10"}))) == ["a"]
    assert ids(run(documents, query({"mq": "temp.accuracy<1"}))) == ["a"]
    assert ids(run(documents, query({"mq": "temp.dateCreated>10"}))) == ["b"]
    assert ids(run(documents, query({"q": "!at"}))) == ["b"]


# -- order and paging -------------------------------------------------------------------------


def test_creation_order_by_default_then_id_type_and_path() -> None:
    documents = [
        doc("b", created=2.0),
        doc("a", created=2.0, entity_type="Z"),
        doc("a", created=2.0, entity_type="A", path="/p"),
        doc("a", created=2.0, entity_type="A"),
        doc("z", created=1.0),
    ]
    page = run(documents, query())
    assert [(d.id, d.type, d.service_path) for d in page.documents] == [
        ("z", "Room", "/"),
        ("a", "A", "/"),
        ("a", "A", "/p"),
        ("a", "Z", "/"),
        ("b", "Room", "/"),
    ]


def test_order_by_an_attribute_as_mongodb_sorts() -> None:
    documents = [
        doc("n", created=1.0, v=attr(None, "None")),
        doc("missing", created=2.0),
        doc("two", created=3.0, v=attr(2)),
        doc("ten", created=4.0, v=attr(10.5)),
        doc("text", created=5.0, v=attr("a")),
        doc("obj", created=6.0, v=attr({"k": 1}, "StructuredValue")),
        doc("arr", created=7.0, v=attr([1], "StructuredValue")),
        doc("bool", created=8.0, v=attr(False, "Boolean")),
    ]
    ascending = ["n", "missing", "two", "ten", "text", "obj", "arr", "bool"]
    assert ids(run(documents, query({"orderBy": "v"}))) == ascending
    # descending: ties (null and missing) keep creation order
    expected = ["bool", "arr", "obj", "text", "ten", "two", "n", "missing"]
    assert ids(run(documents, query({"orderBy": "!v"}))) == expected


def test_order_by_id_type_dates_and_several_fields() -> None:
    documents = [
        doc("b", entity_type="X", created=1.0, t=attr(1)),
        doc("a", entity_type="Y", created=3.0, t=attr(1)),
        doc("c", entity_type="X", created=2.0, t=attr(0)),
    ]
    assert ids(run(documents, query({"orderBy": "id"}))) == ["a", "b", "c"]
    assert ids(run(documents, query({"orderBy": "!type,id"}))) == ["a", "b", "c"]
    assert ids(run(documents, query({"orderBy": "!dateCreated"}))) == ["a", "c", "b"]
    assert ids(run(documents, query({"orderBy": "dateModified"}))) == ["b", "c", "a"]
    assert ids(run(documents, query({"orderBy": "!t,!id"}))) == ["b", "a", "c"]


def test_a_datetime_attribute_orders_by_its_moment() -> None:
    documents = [
        doc("late", created=1.0, at=attr("2024-01-02T00:00:00Z", "DateTime")),
        doc("early", created=2.0, at=attr("2024-01-01T12:00:00+02:00", "DateTime")),
    ]
    assert ids(run(documents, query({"orderBy": "at"}))) == ["early", "late"]


def test_parts_keep_offset_plus_limit_and_count_all() -> None:
    documents = [doc(f"e{i}", created=float(i)) for i in range(10)]
    q = query({"limit": "3", "offset": "2"})
    part = select(documents, q, NOW)
    assert (ids(part), part.count) == (["e0", "e1", "e2", "e3", "e4"], 10)
    evens = select(documents[::2], q, NOW)
    odds = select(documents[1::2], q, NOW)
    page = merge([evens, odds], q)
    assert (ids(page), page.count) == (["e2", "e3", "e4"], 10)
    assert merge([], q) == Page((), 0)


def test_one_entity_found_missing_or_ambiguous() -> None:
    documents = [doc("a", entity_type="T"), doc("a", entity_type="U"), doc("b")]
    assert one(run(documents, parse_entity_get("b", {}, "", None))).id == "b"
    assert one(run(documents, parse_entity_get("a", {"type": "U"}, "", None))).type == "U"
    with pytest.raises(AmbiguousEntity, match="More than one matching entity") as ambiguous:
        one(run(documents, parse_entity_get("a", {}, "", None)))
    assert mapping_for(ambiguous.value).http_status == 409
    assert mapping_for(ambiguous.value).ngsi_error == "TooManyResults"
    with pytest.raises(NotFound, match="The requested entity has not been found"):
        one(run(documents, parse_entity_get("c", {}, "", None)))
    assert one([documents[2]]).id == "b"


# -- rendering --------------------------------------------------------------------------------


ROOM = doc(
    "R1",
    created=10.0,
    temp=attr(21, accuracy=0.5),
    name=attr("hall"),
    other=attr(21),
    dateExpires=attr("2030-01-01T00:00:00.000Z", "DateTime"),
)


def test_normalized_key_values_values_and_unique() -> None:
    assert render(ROOM, query()) == {
        "id": "R1",
        "type": "Room",
        "temp": {
            "type": "Number",
            "value": 21,
            "metadata": {"accuracy": {"type": "Number", "value": 0.5}},
        },
        "name": {"type": "Text", "value": "hall", "metadata": {}},
        "other": {"type": "Number", "value": 21, "metadata": {}},
    }
    assert render(ROOM, query({"options": "keyValues"})) == {
        "id": "R1",
        "type": "Room",
        "temp": 21,
        "name": "hall",
        "other": 21,
    }
    assert render(ROOM, query({"options": "values", "attrs": "name,temp,other"})) == [
        "hall",
        21,
        21,
    ]
    assert render(ROOM, query({"options": "unique", "attrs": "name,temp,other"})) == ["hall", 21]
    assert render(ROOM, query({"options": "keyValues"}), with_id=False) == {
        "temp": 21,
        "name": "hall",
        "other": 21,
    }


def test_attrs_order_star_and_builtins() -> None:
    created, modified = iso8601(10.0), iso8601(11.0)
    kv = {"options": "keyValues"}
    assert render(ROOM, query({**kv, "attrs": "other,nope,temp"})) == {
        "id": "R1",
        "type": "Room",
        "other": 21,
        "temp": 21,
    }
    assert list(render(ROOM, query({**kv, "attrs": "dateModified,*"}))) == [
        "id",
        "type",
        "temp",
        "name",
        "other",
        "dateModified",
    ]
    chosen = render(ROOM, query({**kv, "attrs": "dateCreated,dateExpires,servicePath"}))
    assert chosen == {
        "id": "R1",
        "type": "Room",
        "dateCreated": created,
        "dateExpires": "2030-01-01T00:00:00.000Z",
        "servicePath": "/",
    }
    normalized = render(ROOM, query({"attrs": "dateModified"}))
    assert normalized["dateModified"] == {"type": "DateTime", "value": modified, "metadata": {}}


def test_metadata_filter_and_builtin_metadata() -> None:
    def temp(metadata: str) -> Any:
        return render(ROOM, query({"attrs": "temp", "metadata": metadata}))["temp"]["metadata"]

    assert temp("nope") == {}
    assert temp("dateCreated") == {"dateCreated": {"type": "DateTime", "value": iso8601(10.0)}}
    assert list(temp("*,dateModified")) == ["accuracy", "dateModified"]
    assert list(temp("accuracy")) == ["accuracy"]


def test_one_attribute() -> None:
    q = parse_entity_get("R1", {"metadata": "dateModified"}, "", None)
    assert render_attribute(ROOM, "name", q) == {
        "type": "Text",
        "value": "hall",
        "metadata": {"dateModified": {"type": "DateTime", "value": iso8601(11.0)}},
    }
    for missing in ("nope", "dateCreated"):
        with pytest.raises(NotFound, match="The entity does not have such an attribute"):
            render_attribute(ROOM, missing, q)


def test_render_page_renders_each_entity_in_order() -> None:
    documents = [doc("b", created=2.0, t=attr(1)), doc("a", created=1.0)]
    q = query({"options": "values", "attrs": "t"})
    assert render_page(run(documents, q), q) == [[], [1]]


# -- the wire ---------------------------------------------------------------------------------


def test_queries_and_parts_travel_as_plain_data() -> None:
    q = parse_query_body(
        {"entities": [{"idPattern": "^a", "type": "T"}], "expression": {"q": "t>1"}},
        {"limit": "3", "orderBy": "!t", "options": "count,unique"},
        "tenant",
        "/a/#,/b",
    )
    again = EntityQuery.from_wire(q.to_wire())
    assert again == q and again.filter == q.filter
    part = select([doc("a1", entity_type="T", tenant="tenant", path="/b", t=attr(2))], q, NOW)
    assert Part.from_wire(part.to_wire()) == part
    types = TypesQuery("t", ("/a",), "Room", 5, 1, True, True)
    assert TypesQuery.from_wire(types.to_wire()) == types
    summary = TypesPart({"Room": TypeSummary({"t": frozenset({"Number", "Text"})}, 2)})
    assert TypesPart.from_wire(summary.to_wire()) == summary


@pytest.mark.parametrize(
    "broken",
    [
        None,
        {},
        {"v": 2},
        {**query().to_wire(), "limit": -1},
        {**query().to_wire(), "selectors": [["a b", None, None, None]]},
        {**query().to_wire(), "q": "a>>"},
        {**query().to_wire(), "format": "bogus"},
    ],
)
def test_a_broken_wire_query_is_a_serialization_error(broken: Any) -> None:
    with pytest.raises(SerializationError):
        EntityQuery.from_wire(broken)


def test_broken_wire_parts_and_types() -> None:
    for broken in (None, {"documents": [b"x"], "count": 1}, {"documents": [], "count": "1"}):
        with pytest.raises(SerializationError):
            Part.from_wire(broken)
    for bad in (None, {"v": 1}):
        with pytest.raises(SerializationError):
            TypesQuery.from_wire(bad)
    with pytest.raises(SerializationError):
        TypesPart.from_wire({"Room": [{"t": ["Number"]}, -1]})


# -- types ------------------------------------------------------------------------------------


TYPED = [
    doc("r1", "Room", temp=attr(1), name=attr("a")),
    doc("r2", "Room", path="/b", temp=attr("warm")),
    doc("c1", "Car", speed=attr(3)),
    doc("x", "Zebra", expires=NOW),
    doc("o", "Other", tenant="t2"),
]


def test_types_merged_from_parts_sorted_and_paged() -> None:
    q = parse_types_query({"options": "count"}, "", None)
    parts = [types_part(TYPED[:1], q, NOW), types_part(TYPED[1:], q, NOW)]
    page = merge_types(parts, q)
    assert page.count == 2
    assert render_types(page, q) == [
        {"type": "Car", "attrs": {"speed": {"types": ["Number"]}}, "count": 1},
        {
            "type": "Room",
            "attrs": {"name": {"types": ["Text"]}, "temp": {"types": ["Number", "Text"]}},
            "count": 2,
        },
    ]
    values = parse_types_query({"options": "values", "limit": "1", "offset": "1"}, "", None)
    assert render_types(merge_types(parts, values), values) == ["Room"]
    narrowed = parse_types_query({}, "", "/b")
    assert [n for n, _ in merge_types([types_part(TYPED, narrowed, NOW)], narrowed).types] == [
        "Room"
    ]


def test_one_type() -> None:
    q = parse_types_query({}, "", None, "Room")
    assert render_type(merge_types([types_part(TYPED, q, NOW)], q))["count"] == 2
    gone = parse_types_query({}, "", None, "Zebra")
    with pytest.raises(NotFound, match="Entity type not found"):
        render_type(merge_types([types_part(TYPED, gone, NOW)], gone))
    with pytest.raises(InvalidInput):
        parse_types_query({"options": "keyValues"}, "", None)


# -- property: select + merge over any split is the brute-force answer --------------------------

IDS = ("a", "b", "c", "d", "e")
TYPES = ("Room", "Car")
PATHS = ("/", "/x", "/x/y")
SCOPES = (None, None, "/x/#", "/,/x/y")
TEMPS = (None, -1, 0, 2.5, 7, "hot", True)  # None: no temp attribute


@st.composite
def documents(draw: st.DrawFn) -> list[Document]:
    keys = draw(
        st.lists(
            st.tuples(st.sampled_from(PATHS), st.sampled_from(IDS), st.sampled_from(TYPES)),
            unique=True,
            min_size=3,
            max_size=14,
        )
    )
    out = []
    for path, entity_id, entity_type in keys:
        attributes: dict[str, dict[str, Any]] = {}
        temp = draw(st.sampled_from(TEMPS))
        if temp is not None:
            attributes["temp"] = attr(temp, "Boolean" if isinstance(temp, bool) else None)
        if draw(st.booleans()):
            attributes["name"] = attr(draw(st.sampled_from(("x", "y"))))
        created = float(draw(st.integers(1, 3)))
        expires = draw(st.sampled_from((None, None, None, None, NOW, NOW + 1)))
        tenant = draw(st.sampled_from(("", "", "", "", "", "t")))
        document = Document(
            entity_id, entity_type, path, tenant, attributes, created, created, expires
        )
        out.append(document)
    return out


@st.composite
def queries(draw: st.DrawFn) -> EntityQuery:
    params: dict[str, str] = {}
    if draw(st.integers(0, 3)) == 0:
        params["id"] = ",".join(draw(st.lists(st.sampled_from(IDS), min_size=1, max_size=3)))
    elif draw(st.booleans()):
        params["idPattern"] = draw(st.sampled_from(("^[ab]", "c|d", ".*")))
    if draw(st.integers(0, 3)) == 0:
        params["type"] = draw(st.sampled_from(TYPES))
    q = draw(st.sampled_from(("", "", "temp>1", "temp", "!temp", "name==x", "temp>1;name==y")))
    if q:
        params["q"] = q
    fields = draw(
        st.lists(st.sampled_from(("temp", "!temp", "id", "!id", "name", "!type")), max_size=2)
    )
    if fields:
        params["orderBy"] = ",".join(fields)
    params["limit"] = str(draw(st.integers(1, 6)))
    params["offset"] = str(draw(st.sampled_from((0, 0, 1, 2, 5))))
    return parse_entity_query(params, "", draw(st.sampled_from(SCOPES)))


def _model_selected(document: Document, q: EntityQuery) -> bool:
    """The filter, written out plainly for the generated vocabulary."""
    if document.tenant != "" or (
        document.date_expires is not None and document.date_expires <= NOW
    ):
        return False
    in_scope = False
    for scope in q.scopes:
        if scope == "/#":
            in_scope = True
        elif scope.endswith("/#"):
            base = scope[:-2]
            in_scope |= document.service_path == base or document.service_path.startswith(
                base + "/"
            )
        else:
            in_scope |= document.service_path == scope
    if not in_scope:
        return False
    if q.selectors and not any(_model_selector(s, document) for s in q.selectors):
        return False
    temp = document.attributes.get("temp", {}).get("value", ...)
    name = document.attributes.get("name", {}).get("value", ...)
    number = isinstance(temp, int | float) and not isinstance(temp, bool)
    conditions = {
        "temp>1": number and temp > 1,
        "temp": temp is not ...,
        "!temp": temp is ...,
        "name==x": name == "x",
        "temp>1;name==y": number and temp > 1 and name == "y",
    }
    return q.q == "" or conditions[q.q]


def _model_selector(selector: Selector, document: Document) -> bool:
    import re

    if selector.id is not None and selector.id != document.id:
        return False
    if selector.id_pattern is not None and not re.search(selector.id_pattern, document.id):
        return False
    return selector.type is None or selector.type == document.type


def _model_value(document: Document, field: str) -> tuple[int, Any]:
    if field in ("id", "type"):
        return (2, getattr(document, field))
    value = document.attributes.get(field, {}).get("value")
    if value is None:
        return (0, 0)
    if isinstance(value, bool):
        return (5, value)
    if isinstance(value, int | float):
        return (1, value)
    return (2, value)


def _model_compare(q: EntityQuery, left: Document, right: Document) -> int:
    for order in q.order_by:
        a, b = _model_value(left, order.field), _model_value(right, order.field)
        if a != b:
            sign = -1 if a < b else 1
            return -sign if order.descending else sign
    a_key = (left.date_created, left.id, left.type, left.service_path)
    b_key = (right.date_created, right.id, right.type, right.service_path)
    return -1 if a_key < b_key else (1 if a_key > b_key else 0)


@given(
    documents(),
    queries(),
    st.lists(st.integers(0, 3), min_size=14, max_size=14),
    st.integers(1, 4),
)
@settings(max_examples=examples(300))
def test_select_and_merge_over_parts_equal_the_brute_force_model(
    stored: list[Document], q: EntityQuery, places: list[int], n_parts: int
) -> None:
    split: list[list[Document]] = [[] for _ in range(n_parts)]
    for document, place in zip(stored, places, strict=False):
        split[place % n_parts].append(document)
    page = merge([select(part, q, NOW) for part in split], q)

    chosen = [d for d in stored if _model_selected(d, q)]
    chosen.sort(key=functools.cmp_to_key(functools.partial(_model_compare, q)))
    expected = chosen[q.offset : q.offset + q.limit]
    assert [d.key for d in page.documents] == [d.key for d in expected]
    assert page.count == len(chosen)


@pytest.mark.parametrize("limit", [0, 1, 3])
def test_select_streams_the_documents_and_counts_every_match(limit: int) -> None:
    q = replace(query({"q": "t>=0"}), limit=limit)
    stream = (doc(f"e{i:05d}", created=float(i % 7), t=attr(i)) for i in range(5_000))
    tracemalloc.start()
    try:
        part = select(stream, q, NOW)
        _now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert part.count == 5_000
    expected = sorted(
        (doc(f"e{i:05d}", created=float(i % 7), t=attr(i)) for i in range(5_000)),
        key=lambda d: sort_key(d, q),
    )[:limit]
    assert ids(part) == [d.id for d in expected]
    # only the window is held, not every match (5,000 documents take megabytes)
    assert peak < 1_000_000
