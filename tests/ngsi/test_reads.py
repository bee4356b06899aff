"""The read routes of the NGSI v2 API (broker/ngsi/reads.py) in a small aiohttp app with the
front's own checks middleware, over a LocalReader of hand-made documents: each endpoint and
option, and bad input answered as Orion's ``{"error", "description"}``."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from broker.ngsi.reads import TOTAL_COUNT, LocalReader, Reads
from broker.ngsi.request import checks
from broker.store.semantics import Document, iso8601

NOW = 1_000.0


def attr(value: Any, type_: str = "Number", **metadata: Any) -> dict[str, Any]:
    meta = {k: {"type": "Text", "value": v} for k, v in metadata.items()}
    return {"type": type_, "value": value, "metadata": meta}


def doc(
    entity_id: str,
    entity_type: str,
    created: float,
    path: str = "/",
    tenant: str = "",
    **attributes: dict[str, Any],
) -> Document:
    return Document(entity_id, entity_type, path, tenant, attributes, created, created + 1)


DOCUMENTS = [
    doc(
        "R1",
        "Room",
        1.0,
        temperature=attr(21, unit="C"),
        name=attr("hall", "Text"),
        address=attr({"city": "Madrid"}, "StructuredValue"),
        tags=attr(["a", "b"], "StructuredValue"),
    ),
    doc("R2", "Room", 2.0, path="/east", temperature=attr(25), name=attr("hall", "Text")),
    doc("C1", "Car", 3.0, speed=attr(80)),
    doc("twin", "Room", 4.0),
    doc("twin", "Car", 5.0),
    doc("T1", "Room", 6.0, tenant="other", temperature=attr(0)),
]


@dataclass
class Answer:
    status: int
    headers: Mapping[str, str]
    text: str

    @property
    def json(self) -> Any:
        return json.loads(self.text)


def call(
    method: str,
    path: str,
    *,
    headers: Mapping[str, str] | None = None,
    body: Any = None,
    documents: list[Document] = DOCUMENTS,
) -> Answer:
    """One request to an app serving the read routes over ``documents``."""

    async def scenario() -> Answer:
        app = web.Application(middlewares=[checks])
        app.add_routes(Reads(LocalReader(lambda: documents, clock=lambda: NOW)).routes())
        async with TestClient(TestServer(app)) as client:
            data = None if body is None else json.dumps(body)
            sent = dict(headers or {})
            if data is not None:
                sent.setdefault("Content-Type", "application/json")
            async with client.request(method, path, data=data, headers=sent) as got:
                return Answer(got.status, dict(got.headers), await got.text())

    return asyncio.run(scenario())


def ids(answer: Answer) -> list[str]:
    assert answer.status == 200, answer.text
    return [e["id"] for e in answer.json]


# -- GET /v2/entities -------------------------------------------------------------------------


def test_list_entities_in_creation_order_with_count() -> None:
    answer = call("GET", "/v2/entities?options=count&limit=2&offset=1")
    assert ids(answer) == ["R2", "C1"]
    assert answer.headers[TOTAL_COUNT] == "5"
    assert answer.headers["Content-Type"].startswith("application/json")
    assert TOTAL_COUNT not in call("GET", "/v2/entities").headers
    assert ids(call("GET", "/v2/entities/")) == ["R1", "R2", "C1", "twin", "twin"]


def test_list_entities_filters() -> None:
    assert ids(call("GET", "/v2/entities?type=Car")) == ["C1", "twin"]
    assert ids(call("GET", "/v2/entities?id=R1,R2&type=Room")) == ["R1", "R2"]
    assert ids(call("GET", "/v2/entities?idPattern=^R")) == ["R1", "R2"]
    assert ids(call("GET", "/v2/entities?q=temperature>22")) == ["R2"]
    assert ids(call("GET", "/v2/entities?mq=temperature.unit==C")) == ["R1"]
    assert ids(call("GET", "/v2/entities?orderBy=!temperature&limit=2")) == ["R2", "R1"]
    assert ids(call("GET", "/v2/entities", headers={"Fiware-ServicePath": "/east"})) == ["R2"]
    assert ids(call("GET", "/v2/entities", headers={"Fiware-Service": "other"})) == ["T1"]


def test_list_entities_formats() -> None:
    query = "/v2/entities?id=R1&attrs=name,temperature"
    assert call("GET", query).json == [
        {
            "id": "R1",
            "type": "Room",
            "name": {"type": "Text", "value": "hall", "metadata": {}},
            "temperature": {
                "type": "Number",
                "value": 21,
                "metadata": {"unit": {"type": "Text", "value": "C"}},
            },
        }
    ]
    assert call("GET", query + "&options=keyValues").json == [
        {"id": "R1", "type": "Room", "name": "hall", "temperature": 21}
    ]
    assert call("GET", query + "&options=values").json == [["hall", 21]]
    assert call("GET", "/v2/entities?type=Room&attrs=name&options=unique").json == [
        ["hall"],
        ["hall"],
        [],
    ]
    dated = call("GET", "/v2/entities?id=C1&options=keyValues&attrs=dateCreated,*").json
    assert dated == [{"id": "C1", "type": "Car", "speed": 80, "dateCreated": iso8601(3.0)}]


def test_options_may_name_the_normalized_format() -> None:
    # Orion's OPT_NORMALIZED; filip sends options=count,normalized (and options=normalized on
    # GET /v2/entities/{id} and .../attrs) with every read: it was refused with 400
    query = "/v2/entities?id=R1&attrs=name"
    assert call("GET", query + "&options=count,normalized").json == call("GET", query).json
    one = "/v2/entities/R1?type=Room"
    assert call("GET", one + "&options=normalized").json == call("GET", one).json
    attrs = "/v2/entities/R1/attrs?type=Room&options=normalized"
    assert call("GET", attrs).json == call("GET", "/v2/entities/R1/attrs?type=Room").json
    query_body = {"entities": [{"id": "R1"}], "attrs": ["name"]}
    answer = call("POST", "/v2/op/query?options=normalized,count", body=query_body)
    assert answer.status == 200 and answer.json == call("GET", query).json


@pytest.mark.parametrize(
    ("query", "description"),
    [
        ("limit=0", "Bad pagination limit: /0/ [a value of ZERO is unacceptable]"),
        ("limit=1001", "Bad pagination limit: /1001/ [max: 1000]"),
        ("offset=-1", "Bad pagination offset: /-1/ [must be a decimal number]"),
        ("id=a&idPattern=a", "Incompatible parameters: id, IdPattern"),
        ("options=sideways", "Invalid value for URL parameter /options/: sideways"),
        ("q=temperature%3E%3E1", None),
        ("idPattern=(", None),
        ("type=", "Empty right-hand-side for URI param /type/"),
    ],
)
def test_bad_list_queries_are_bad_requests(query: str, description: str | None) -> None:
    answer = call("GET", f"/v2/entities?{query}")
    assert answer.status == 400, answer.text
    assert answer.json["error"] == "BadRequest"
    if description is not None:
        assert answer.json["description"] == description


def test_bad_service_paths_and_geo_queries() -> None:
    answer = call("GET", "/v2/entities", headers={"Fiware-ServicePath": "east"})
    assert (answer.status, answer.json["error"]) == (400, "BadRequest")
    answer = call("GET", "/v2/entities?georel=near&geometry=point&coords=1,2")
    assert (answer.status, answer.json["error"]) == (400, "BadRequest")
    assert answer.json["description"] == (
        "Invalid query: georel /near/ without either minDistance nor maxDistance"
    )


# -- POST /v2/op/query ------------------------------------------------------------------------


def test_op_query() -> None:
    body = {
        "entities": [{"idPattern": "^R", "type": "Room"}, {"id": "C1"}],
        "attrs": ["temperature", "speed"],
        "expression": {"q": "temperature<30"},
    }
    answer = call("POST", "/v2/op/query?options=count,keyValues&orderBy=!id", body=body)
    assert answer.status == 200, answer.text
    assert answer.json == [
        {"id": "R2", "type": "Room", "temperature": 25},
        {"id": "R1", "type": "Room", "temperature": 21},
    ]
    assert answer.headers[TOTAL_COUNT] == "2"
    assert ids(call("POST", "/v2/op/query?limit=1", body={})) == ["R1"]


@pytest.mark.parametrize(
    ("body", "status", "error"),
    [
        ({"entities": [{"type": "Room"}]}, 400, "BadRequest"),
        ({"bogus": 1}, 400, "BadRequest"),
        ([1], 400, "BadRequest"),
        ({"expression": {"georel": "near"}}, 400, "BadRequest"),
    ],
)
def test_bad_op_queries(body: Any, status: int, error: str) -> None:
    answer = call("POST", "/v2/op/query", body=body)
    assert (answer.status, answer.json["error"]) == (status, error)


def test_op_query_needs_a_json_body() -> None:
    async def scenario() -> tuple[int, Any]:
        app = web.Application(middlewares=[checks])
        app.add_routes(Reads(LocalReader(lambda: DOCUMENTS)).routes())
        async with (
            TestClient(TestServer(app)) as client,
            client.post(
                "/v2/op/query", data="{", headers={"Content-Type": "application/json"}
            ) as got,
        ):
            return got.status, await got.json()

    status, body = asyncio.run(scenario())
    assert (status, body["error"]) == (400, "ParseError")


# -- one entity -------------------------------------------------------------------------------


def test_get_one_entity_and_its_attributes() -> None:
    assert call("GET", "/v2/entities/C1").json == {
        "id": "C1",
        "type": "Car",
        "speed": {"type": "Number", "value": 80, "metadata": {}},
    }
    assert call("GET", "/v2/entities/C1/attrs?options=keyValues").json == {"speed": 80}
    assert call("GET", "/v2/entities/R1/attrs?attrs=name,temperature&options=values").json == [
        "hall",
        21,
    ]
    assert call("GET", "/v2/entities/twin?type=Car&options=keyValues").json == {
        "id": "twin",
        "type": "Car",
    }
    got = call("GET", "/v2/entities/R2", headers={"Fiware-ServicePath": "/east"})
    assert got.json["id"] == "R2"


def test_one_entity_missing_or_ambiguous() -> None:
    missing = call("GET", "/v2/entities/nope")
    assert (missing.status, missing.json) == (
        404,
        {
            "error": "NotFound",
            "description": "The requested entity has not been found. Check type and id",
        },
    )
    assert call("GET", "/v2/entities/R2", headers={"Fiware-ServicePath": "/"}).status == 404
    ambiguous = call("GET", "/v2/entities/twin/attrs")
    assert (ambiguous.status, ambiguous.json) == (
        409,
        {
            "error": "TooManyResults",
            "description": "More than one matching entity. Please refine your query",
        },
    )
    bad = call("GET", "/v2/entities/R1?options=count")
    assert (bad.status, bad.json["error"]) == (400, "BadRequest")


def test_get_one_attribute() -> None:
    answer = call("GET", "/v2/entities/R1/attrs/temperature?metadata=dateCreated")
    assert answer.json == {
        "type": "Number",
        "value": 21,
        "metadata": {"dateCreated": {"type": "DateTime", "value": iso8601(1.0)}},
    }
    for name in ("nope", "dateCreated"):
        missing = call("GET", f"/v2/entities/R1/attrs/{name}")
        assert (missing.status, missing.json["description"]) == (
            404,
            "The entity does not have such an attribute",
        )


# -- attribute values -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("attribute", "accept", "content_type", "text"),
    [
        ("address", None, "application/json", '{"city":"Madrid"}'),
        ("address", "*/*", "application/json", '{"city":"Madrid"}'),
        ("tags", "text/plain, application/json", "text/plain", '["a","b"]'),
        ("tags", "application/json", "application/json", '["a","b"]'),
        ("name", None, "text/plain", '"hall"'),
        ("name", "text/plain", "text/plain", '"hall"'),
        ("temperature", "text/*", "text/plain", "21"),
    ],
)
def test_attribute_values_as_json_or_text(
    attribute: str, accept: str | None, content_type: str, text: str
) -> None:
    headers = {"Accept": accept} if accept else None
    answer = call("GET", f"/v2/entities/R1/attrs/{attribute}/value", headers=headers)
    assert answer.status == 200, answer.text
    assert answer.headers["Content-Type"].startswith(content_type)
    assert answer.text == text


def test_a_plain_value_needs_text_in_accept() -> None:
    answer = call("GET", "/v2/entities/R1/attrs/name/value", headers={"Accept": "application/json"})
    assert answer.status == 406
    assert answer.json == {
        "error": "NotAcceptable",
        "description": "accepted MIME types: text/plain",
    }
    missing = call("GET", "/v2/entities/R1/attrs/nope/value")
    assert missing.status == 404


# -- types ------------------------------------------------------------------------------------


def test_list_types() -> None:
    answer = call("GET", "/v2/types?options=count")
    assert answer.headers[TOTAL_COUNT] == "2"
    assert answer.json == [
        {"type": "Car", "attrs": {"speed": {"types": ["Number"]}}, "count": 2},
        {
            "type": "Room",
            "attrs": {
                "address": {"types": ["StructuredValue"]},
                "name": {"types": ["Text"]},
                "tags": {"types": ["StructuredValue"]},
                "temperature": {"types": ["Number"]},
            },
            "count": 3,
        },
    ]
    assert call("GET", "/v2/types?options=values&limit=1&offset=1").json == ["Room"]
    east = call("GET", "/v2/types?options=values", headers={"Fiware-ServicePath": "/east"})
    assert east.json == ["Room"]
    assert call("GET", "/v2/types?limit=0").status == 400


def test_get_one_type() -> None:
    assert call("GET", "/v2/types/Car").json == {
        "attrs": {"speed": {"types": ["Number"]}},
        "count": 2,
    }
    missing = call("GET", "/v2/types/Boat")
    assert (missing.status, missing.json) == (
        404,
        {"error": "NotFound", "description": "Entity type not found"},
    )
