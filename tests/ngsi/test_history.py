"""STH-Comet's history API (broker/ngsi/history.py): its answers, shapes and 400s.

Most tests serve the routes in a small aiohttp app with the front's own checks middleware,
over a front's own entities in memory (:class:`LocalEntities`, history on) written at fixed
moments, so every answer can be compared whole with what STH-Comet answers (its
``sthDatabase.js`` / ``sthGetDataHandler.js``, collection per entity, filterOutEmpty). One
test goes through a real cluster (its context store with ``--history on``): writes through
the HTTP front to the store process, then a Grafana panel's ``lastN`` and
``aggrMethod=max&aggrPeriod=minute`` queries.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from broker.coordination.embedded import EmbeddedZooKeeper
from broker.ngsi.history import History
from broker.ngsi.request import checks
from broker.store.client import LocalEntities
from broker.store.history import HistoryOptions
from broker.store.semantics import Mode
from broker.store.wire import Intent
from ngsi.conftest import Front, started_front, tenant

T0 = 1_700_000_000.0  # 2023-11-14T22:13:20Z
TEMPERATURES = [20, 21, 22, 25, 19, 23]  # every 20 s from T0: minutes :13, :14, :15
STATUSES = ["on", "on", "off", "on", "off", "off"]  # a change only when it differs
V1 = "/STH/v1/contextEntities/type/Room/id/Room1/attributes"
V2 = "/STH/v2/entities/Room1/attrs"
OK = {"code": "200", "reasonPhrase": "OK"}
DESCRIPTION = Path(__file__).resolve().parents[2] / "docs" / "openapi.yaml"
V1_OPERATION = "/STH/v1/contextEntities/type/{type}/id/{id}/attributes/{attr}"
V2_OPERATION = "/STH/v2/entities/{id}/attrs/{attr}"


@dataclass
class Answer:
    status: int
    headers: Mapping[str, str]
    text: str

    @property
    def json(self) -> Any:
        return json.loads(self.text)


@functools.cache
def _history() -> LocalEntities:
    local = LocalEntities(history=HistoryOptions())
    for index, (value, status) in enumerate(zip(TEMPERATURES, STATUSES, strict=True)):
        attributes: dict[str, dict[str, Any]] = {
            "temperature": {"type": "Number", "value": value, "metadata": {}},
            "status": {"type": "Text", "value": status, "metadata": {}},
        }
        intent = Intent(Mode.UPSERT, "Room1", "Room", "/", "", attributes)
        local.entities.apply_now([intent], T0 + 20 * index)
    big = {"power": {"type": "Number", "value": 1e200, "metadata": {}}}
    local.entities.apply_now([Intent(Mode.UPSERT, "Big1", "Star", "/", "", big)], T0)
    for mode in ["a.b$", "x"]:
        attributes = {"mode": {"type": "Text", "value": mode, "metadata": {}}}
        local.entities.apply_now([Intent(Mode.UPSERT, "Lamp1", "Lamp", "/", "", attributes)], T0)
    return local


def call(path: str, headers: Mapping[str, str] | None = None) -> Answer:
    """One GET to an app serving the history routes over the history written above."""

    async def scenario() -> Answer:
        app = web.Application(middlewares=[checks])
        app.add_routes(History(_history).routes())
        async with (
            TestClient(TestServer(app)) as client,
            client.get(path, headers=dict(headers or {})) as got,
        ):
            return Answer(got.status, dict(got.headers), await got.text())

    return asyncio.run(scenario())


def _v1(entity_id: str, entity_type: str, attribute: str, values: list[Any]) -> dict[str, Any]:
    element = {
        "attributes": [{"name": attribute, "values": values}],
        "id": entity_id,
        "isPattern": False,
        "type": entity_type,
    }
    return {"contextResponses": [{"contextElement": element, "statusCode": OK}]}


def _row(index: int) -> dict[str, Any]:
    second = 20 + 20 * index  # from 22:13:20
    moment = f"2023-11-14T22:{13 + second // 60:02d}:{second % 60:02d}.000Z"
    return {"recvTime": moment, "attrType": "Number", "attrValue": TEMPERATURES[index]}


def test_last_n_is_the_last_rows_oldest_first_in_the_ngsiv1_wrapper() -> None:
    answer = call(f"{V1}/temperature?lastN=3")
    assert answer.status == 200, answer.text
    assert answer.headers["Content-Type"].startswith("application/json")
    assert answer.json == _v1("Room1", "Room", "temperature", [_row(3), _row(4), _row(5)])
    assert "Fiware-Total-Count" not in answer.headers
    assert "Fiware-Correlator" in answer.headers


def test_pages_count_and_dates_bound_the_raw_rows() -> None:
    paged = call(f"{V1}/temperature?hLimit=2&hOffset=1&count=true")
    assert paged.json == _v1("Room1", "Room", "temperature", [_row(1), _row(2)])
    assert paged.headers["Fiware-Total-Count"] == "6"
    dated = call(
        f"{V1}/temperature?lastN=10&dateFrom=2023-11-14T22:14:00.000Z"
        "&dateTo=2023-11-14T22:14:40.000Z"  # inclusive
    )
    assert dated.json == _v1("Room1", "Room", "temperature", [_row(2), _row(3), _row(4)])
    epoch = call(f"{V1}/temperature?hLimit=1&hOffset=0&dateFrom={int(T0 * 1000) + 1}")
    assert epoch.json == _v1("Room1", "Room", "temperature", [_row(1)])
    every = call(f"{V1}/temperature?lastN=0")  # STH: MongoDB's limit(0), every row
    assert len(every.json["contextResponses"][0]["contextElement"]["attributes"][0]["values"]) == 6


def test_no_history_is_200_with_no_values() -> None:
    for path, headers in [
        ("/STH/v1/contextEntities/type/Room/id/Nobody/attributes/temperature?lastN=3", {}),
        (f"{V1}/temperature?lastN=3", {"Fiware-Service": "elsewhere"}),
        (f"{V1}/temperature?lastN=3", {"Fiware-ServicePath": "/other"}),
        (f"{V1}/temperature?aggrMethod=max&aggrPeriod=hour&dateTo=2020-01-01T00:00:00Z", {}),
    ]:
        answer = call(path, headers)
        assert answer.status == 200, (path, answer.text)
        assert answer.json["contextResponses"][0]["contextElement"]["attributes"][0]["values"] == []


def test_max_per_minute_is_one_document_per_hour_its_points_by_minute() -> None:
    answer = call(f"{V1}/temperature?aggrMethod=max&aggrPeriod=minute")
    origin = {"attrName": "temperature", "origin": "2023-11-14T22:00:00.000Z"}
    document = {
        "_id": {**origin, "resolution": "minute"},
        "points": [
            {"offset": 13, "samples": 2, "max": 21},
            {"offset": 14, "samples": 3, "max": 25},
            {"offset": 15, "samples": 1, "max": 23},
        ],
    }
    assert answer.json == _v1("Room1", "Room", "temperature", [document])
    # dateFrom cuts at its minute (STH trims the first document's points by offset)
    later = call(f"{V1}/temperature?aggrMethod=sum&aggrPeriod=minute&dateFrom=2023-11-14T22:14:59Z")
    points = later.json["contextResponses"][0]["contextElement"]["attributes"][0]["values"]
    assert points[0]["points"] == [
        {"offset": 14, "samples": 3, "sum": 66},
        {"offset": 15, "samples": 1, "sum": 23},
    ]


@pytest.mark.parametrize(
    ("query", "documents"),
    [
        (
            "aggrMethod=all&aggrPeriod=day",
            [
                {
                    "_id": {
                        "attrName": "temperature",
                        "origin": "2023-11-01T00:00:00.000Z",
                        "resolution": "day",
                    },
                    "points": [
                        {
                            "offset": 14,
                            "samples": 6,
                            "sum": 130,
                            "sum2": sum(t * t for t in TEMPERATURES),
                            "min": 19,
                            "max": 25,
                        }
                    ],
                }
            ],
        ),
        (
            "aggrMethod=min&aggrPeriod=month",
            [
                {
                    "_id": {
                        "attrName": "temperature",
                        "origin": "2023-01-01T00:00:00.000Z",
                        "resolution": "month",
                    },
                    "points": [{"offset": 11, "samples": 6, "min": 19}],
                }
            ],
        ),
        (
            "aggrMethod=occur&aggrPeriod=hour",  # a number has no occurrences
            [
                {
                    "_id": {
                        "attrName": "temperature",
                        "origin": "2023-11-14T00:00:00.000Z",
                        "resolution": "hour",
                    },
                    "points": [{"offset": 22, "samples": 6}],
                }
            ],
        ),
    ],
)
def test_each_method_and_period_answers_as_sth(query: str, documents: list[Any]) -> None:
    answer = call(f"{V1}/temperature?{query}")
    assert answer.json == _v1("Room1", "Room", "temperature", documents)


def test_the_second_level_is_one_document_per_minute() -> None:
    answer = call(f"{V1}/temperature?aggrMethod=max&aggrPeriod=second")
    documents = answer.json["contextResponses"][0]["contextElement"]["attributes"][0]["values"]
    assert [d["_id"]["origin"][11:19] for d in documents] == ["22:13:00", "22:14:00", "22:15:00"]
    assert [[p["offset"] for p in d["points"]] for d in documents] == [[20, 40], [0, 20, 40], [0]]
    assert [p["max"] for d in documents for p in d["points"]] == TEMPERATURES


def test_texts_are_counted_their_dots_and_dollars_as_sth_keeps_them() -> None:
    status = call(f"{V1}/status?aggrMethod=occur&aggrPeriod=hour")
    (document,) = status.json["contextResponses"][0]["contextElement"]["attributes"][0]["values"]
    assert document["points"] == [{"offset": 22, "samples": 4, "occur": {"on": 2, "off": 2}}]
    lamp = "/STH/v1/contextEntities/type/Lamp/id/Lamp1/attributes/mode"
    mode = call(f"{lamp}?aggrMethod=occur&aggrPeriod=day")
    (document,) = mode.json["contextResponses"][0]["contextElement"]["attributes"][0]["values"]
    assert document["points"][0]["occur"] == {"a\uff0eb\uff04": 1, "x": 1}


def test_a_sum_past_a_doubles_range_is_null_as_javascript_writes_it() -> None:
    star = "/STH/v1/contextEntities/type/Star/id/Big1/attributes/power"
    answer = call(f"{star}?aggrMethod=all&aggrPeriod=hour")
    (document,) = answer.json["contextResponses"][0]["contextElement"]["attributes"][0]["values"]
    (point,) = document["points"]
    numbers = {"sum": 1e200, "sum2": None, "min": 1e200, "max": 1e200}
    assert point == {"offset": 22, "samples": 1, **numbers}


def test_the_v2_route_answers_a_structured_value() -> None:
    answer = call(f"{V2}/temperature?type=Room&lastN=1")
    assert answer.json == {"type": "StructuredValue", "value": [_row(5)]}
    aggregated = call(f"{V2}/temperature?type=Room&aggrMethod=max&aggrPeriod=hour")
    assert aggregated.json["value"][0]["points"] == [{"offset": 22, "samples": 6, "max": 25}]
    assert call(f"{V2}/temperature/?type=Room&lastN=1").json == answer.json  # trailing '/'


def test_csv_is_a_file_of_the_raw_rows() -> None:
    answer = call(f"{V1}/temperature?filetype=csv&lastN=2")
    assert answer.status == 200
    assert answer.headers["Content-Type"].startswith("text/csv")
    assert answer.headers["Content-Disposition"].startswith("attachment; filename*= utf-8''")
    assert answer.text.splitlines() == [
        "attrName,attrType,attrValue,recvTime",
        "temperature,Number,19,2023-11-14T22:14:40.000Z",
        "temperature,Number,23,2023-11-14T22:15:00.000Z",
    ]
    every = call(f"{V1}/status?filetype=CSV")  # alone, every row
    assert len(every.text.splitlines()) == 1 + 4


_SCHEMA_V1 = {"statusCode": 400, "error": "Bad Request", "message": "Invalid request query input"}
_KEYS = ["lastN", "hLimit", "hOffset", "filetype", "aggrMethod", "aggrPeriod", "count"]


def _handler_v1(message: str) -> dict[str, Any]:
    validation = {"source": "query", "keys": _KEYS}
    return {"statusCode": 400, "error": "Bad Request", "message": message, "validation": validation}


_COMBINATION = (
    "A combination of the following query params is required: lastN, hLimit and hOffset, "
    "filetype, or aggrMethod and aggrPeriod"
)
_PAGE = "hLimit <= lastN <= config.maxPageSize"


@pytest.mark.parametrize(
    ("query", "body"),
    [
        ("lastN=abc", _SCHEMA_V1),
        ("lastN=-1", _SCHEMA_V1),
        ("lastN=2.5", _SCHEMA_V1),
        ("lastN=1&lastN=2", _SCHEMA_V1),
        ("aggrMethod=avg&aggrPeriod=hour", _SCHEMA_V1),
        ("aggrMethod=max&aggrPeriod=week", _SCHEMA_V1),
        ("lastN=1&dateFrom=yesterday", _SCHEMA_V1),
        ("lastN=1&count=maybe", _SCHEMA_V1),
        ("lastN=1&options=count", _SCHEMA_V1),
        ("lastN=1&type=Room", _SCHEMA_V1),
        ("lastN=101", _handler_v1(_PAGE)),
        ("hLimit=101&hOffset=0", _handler_v1(_PAGE)),
        ("lastN=3&hLimit=5&hOffset=0", _handler_v1(_PAGE)),
        ("", _handler_v1(_COMBINATION)),
        ("aggrMethod=max", _handler_v1(_COMBINATION)),
        ("hLimit=3", _handler_v1(_COMBINATION)),
        ("filetype=json", _handler_v1(_COMBINATION)),
    ],
)
def test_bad_parameters_are_sths_400s_on_v1(query: str, body: dict[str, Any]) -> None:
    answer = call(f"{V1}/temperature?{query}")
    assert (answer.status, answer.json) == (400, body)


@pytest.mark.parametrize(
    ("query", "description"),
    [
        ("lastN=1", '"type" is required'),
        ("type=Room&lastN=x", '"lastN" must be a number'),
        ("type=Room&lastN=1.5", '"lastN" must be an integer'),
        ("type=Room&hOffset=-2&hLimit=1", '"hOffset" must be greater than -1'),
        (
            "type=Room&aggrMethod=median&aggrPeriod=hour",
            '"aggrMethod" must be one of [max, min, sum, sum2, occur, all]',
        ),
        (
            "type=Room&aggrMethod=max&aggrPeriod=year",
            '"aggrPeriod" must be one of [month, day, hour, minute, second]',
        ),
        ("type=Room&lastN=1&dateTo=13/13/13", '"dateTo" must be a valid date'),
        ("type=Room&lastN=1&count=2", '"count" must be a boolean'),
        ("type=&lastN=1", '"type" is not allowed to be empty'),
        ("type=Room&lastN=1&q=x", '"q" is not allowed'),
        ("type=Room&lastN=500", _PAGE),
        ("type=Room&aggrPeriod=hour", _COMBINATION),
    ],
)
def test_bad_parameters_are_sths_400s_on_v2(query: str, description: str) -> None:
    answer = call(f"{V2}/temperature?{query}")
    assert (answer.status, answer.json) == (
        400,
        {"error": "BadRequest", "description": description},
    )


@pytest.fixture(scope="module")
def front(
    zookeeper: EmbeddedZooKeeper, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Front]:
    """A cluster whose context store records history, its front serving HTTP."""
    with started_front(zookeeper, tmp_path_factory, "history", store_history=True) as served:
        yield served


def test_a_grafana_style_panel_reads_the_history_through_a_front_and_a_store(
    front: Front,
) -> None:
    """Writes through the HTTP front to its context store process (the module's cluster),
    then what a Grafana STH panel asks: the last values, and the maximum per minute."""
    headers = {"Fiware-Service": tenant(), "Fiware-ServicePath": "/floor1"}
    values = [20.5, 21, 22, 25, 19]
    created = front.call(
        "POST",
        "/v2/entities",
        {"id": "Room1", "type": "Room", "temperature": {"type": "Number", "value": values[0]}},
        headers=headers,
    )
    assert created.status == 201, created
    for value in values[1:]:
        patch = {"temperature": {"type": "Number", "value": value}}
        answer = front.call("PATCH", "/v2/entities/Room1/attrs", patch, headers=headers)
        assert answer.status == 204, answer
    path = "/STH/v1/contextEntities/type/Room/id/Room1/attributes/temperature"
    last = front.call("GET", f"{path}?lastN=3", headers=headers)
    assert last.status == 200, last
    (element,) = [r["contextElement"] for r in last.body["contextResponses"]]
    assert (element["id"], element["type"], element["isPattern"]) == ("Room1", "Room", False)
    rows = element["attributes"][0]["values"]
    assert [(r["attrType"], r["attrValue"]) for r in rows] == [("Number", v) for v in values[2:]]
    assert [r["recvTime"] for r in rows] == sorted(r["recvTime"] for r in rows)
    peaks = front.call("GET", f"{path}?aggrMethod=max&aggrPeriod=minute", headers=headers)
    documents = peaks.body["contextResponses"][0]["contextElement"]["attributes"][0]["values"]
    assert {d["_id"]["resolution"] for d in documents} == {"minute"}
    points = [p for d in documents for p in d["points"]]
    assert sum(p["samples"] for p in points) == len(values)
    assert max(p["max"] for p in points) == 25
    refused = front.call("GET", f"{path}?lastN=abc", headers=headers)
    assert (refused.status, refused.body) == (400, _SCHEMA_V1)


@functools.cache
def _described() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(DESCRIPTION.read_text())
    return document


def _fits(answer: Answer, operation: str) -> None:
    """``answer`` fits what docs/openapi.yaml says ``operation`` answers with its status."""
    document = _described()
    response = document["paths"][operation]["get"]["responses"][str(answer.status)]
    schema = response["content"]["application/json"]["schema"]
    validator = jsonschema.Draft7Validator({**schema, "components": document["components"]})
    validator.validate(answer.json)


@pytest.mark.parametrize(
    "path",
    [
        f"{V1}/temperature?lastN=3",
        f"{V1}/temperature?aggrMethod=all&aggrPeriod=second",
        f"{V1}/status?aggrMethod=all&aggrPeriod=month",
        f"{V1}/temperature?lastN=abc",
        f"{V1}/temperature?aggrMethod=max",
        f"{V2}/temperature?type=Room&hLimit=3&hOffset=0",
        f"{V2}/status?type=Room&aggrMethod=occur&aggrPeriod=day",
        f"{V2}/temperature?lastN=1",
    ],
)
def test_the_answers_fit_the_openapi_description(path: str) -> None:
    operation = V1_OPERATION if path.startswith(V1) else V2_OPERATION
    _fits(call(path), operation)
