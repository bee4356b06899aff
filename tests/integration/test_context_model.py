"""The context store against a model of Orion's write semantics (issue 17): a Hypothesis state
machine sends random writes through either of two HTTP fronts of one cluster (2 fronts, 2
context stores, 1 matcher, started once for the module) and checks every answer's status,
and what both fronts read, against a dict of entities written here.

The model is this file's own reading of Orion (/work/shared/spec/ngsi-v2.md section 2 and
the docstring of broker/store/semantics.py, which cites Orion's code), not a call of
broker.store.semantics:

- POST /v2/entities: 201, 422 Unprocessable if (id, type) exists; ``options=upsert``: 204,
  created or updated-or-appended. POST .../attrs: updated-or-appended (204);
  ``options=append``: 422 Unprocessable if every attribute exists, PartialUpdate if some do
  (the others appended). PATCH .../attrs: existing attributes only, 422 Unprocessable if none
  exists, PartialUpdate if some do not (the others applied). PUT .../attrs/{a} and
  .../attrs/{a}/value, DELETE .../attrs/{a}: 404 if the attribute is absent. Every write
  naming an entity: 404 NotFound if no entity, 409 TooManyResults if the id without
  ``?type=`` names several (Orion issues 1260, 1320, 1346, 1387).
- An update merges the request's metadata into the attribute's (``overrideMetadata``
  replaces them); PUT .../value keeps the type and the metadata; appended attributes take
  the request's metadata.
- POST /v2/op/update: each entity's write as above (append: create or update-or-append;
  appendStrict: create or strict append; update: PATCH; delete: its attributes, or the
  entity if none is listed), then Orion's update coverage (mongoUpdateContext.cpp): all
  succeeded 204; some succeeded (or in part) and some failed, 422 PartialUpdate; none
  succeeded, 422 Unprocessable if an entity failed on its attributes, else 404 NotFound.

The aggregation groups are checked on the same cluster (docs/aggregation.md): sensors ->
buildings -> campuses on the two stores, a building moved to another campus while running,
each window's derived values against a direct computation, and the definitions' errors.
So are the alert rules (docs/alerts.md): their routes and CLI, an alert over a campus's
derived average, and a series of values whose raises and clears reach a subscription
exactly once each through a kill -9 of the room's primary store (the last test: it starts
the store again, which recovers while the module ends).

Values stay simple: numbers for ``a`` and ``b`` (type Number), short strings for ``s``
(Text), and now and then one metadata item. Builtin dates are not compared. Each example
runs on a tenant of its own, so the examples share the cluster without sharing state.
"""

from __future__ import annotations

import json
import math
import os
import signal
import time
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)
from ngsi.conftest import Answer, Front, Receiver, started_fronts, tenant

from broker.cli import build_parser
from broker.coordination.embedded import EmbeddedZooKeeper
from broker.runtime.options import Role
from broker.store.entities import partition_of

pytestmark = pytest.mark.slow

IDS = ("E1", "E2", "E3")
TYPES = ("T1", "T2")
NUMBERS = ("a", "b")
NAMES = ("a", "b", "s")
METADATA = (
    {"src": {"type": "Text", "value": "p"}},
    {"src": {"type": "Text", "value": "q"}},
    {"acc": {"type": "Number", "value": 1}},
)

Attribute = dict[str, Any]  # {"type", "value", "metadata"}
Entity = dict[str, Attribute]
Key = tuple[str, str]  # (id, type)

# Orion's update coverage of one entity of a batch (mongoUpdateContext.cpp)
SUCCESS, PARTIAL, ATTRS_FAIL, NOT_FOUND = "success", "partial", "attrsFail", "notFound"


@pytest.fixture(scope="module")
def fronts(
    zookeeper: EmbeddedZooKeeper, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Front, Front]]:
    """One cluster for the module: 2 HTTP fronts, 2 context stores, 1 matcher."""
    with started_fronts(
        zookeeper, tmp_path_factory, "cm", connection_points=2, context_stores=2, matchers=1
    ) as (a, b):
        yield a, b


# -- strategies ---------------------------------------------------------------------------------


def _value(name: str) -> st.SearchStrategy[Any]:
    if name in NUMBERS:
        return st.integers(-3, 3) | st.sampled_from([0.5, 2.5])
    return st.sampled_from(["x", "y", "zz"])


@st.composite
def _attribute(draw: st.DrawFn, name: str) -> Attribute:
    """A request attribute, normalized; metadata now and then."""
    attribute: Attribute = {"type": "Number" if name in NUMBERS else "Text"}
    attribute["value"] = draw(_value(name))
    metadata = draw(st.sampled_from([None, None, None, *METADATA]))
    if metadata is not None:
        attribute["metadata"] = metadata
    return attribute


@st.composite
def _attributes(draw: st.DrawFn, min_size: int = 1) -> dict[str, Attribute]:
    names = draw(st.lists(st.sampled_from(NAMES), min_size=min_size, max_size=3, unique=True))
    return {name: draw(_attribute(name)) for name in names}


def _key_values(attributes: dict[str, Attribute]) -> dict[str, Attribute]:
    """The same attributes as keyValues send them: no metadata, types inferred (Number and
    Text, as the normalized ones are)."""
    return {n: {"type": a["type"], "value": a["value"]} for n, a in attributes.items()}


FRONT = st.integers(0, 1)
ENTITY_ID = st.sampled_from(IDS)
ENTITY_TYPE = st.sampled_from(TYPES)


# -- the model ----------------------------------------------------------------------------------


def _stored(request: Attribute) -> Attribute:
    """A new attribute: the request's, metadata as given."""
    return {
        "type": request["type"],
        "value": request["value"],
        "metadata": dict(request.get("metadata") or {}),
    }


def _merged(old: Attribute, request: Attribute, override: bool = False) -> Attribute:
    """An existing attribute updated: metadata merged (or replaced with overrideMetadata)."""
    asked = dict(request.get("metadata") or {})
    metadata = asked if override else {**old["metadata"], **asked}
    return {"type": request["type"], "value": request["value"], "metadata": metadata}


class Expected:
    """What the model expects a write to answer: a status and, for errors, Orion's name."""

    def __init__(self, status: int, error: str | None = None) -> None:
        self.status = status
        self.error = error

    def check(self, answer: Answer, request: str) -> None:
        """Fail with the request if ``answer`` is not the expected one."""
        got_error = answer.body.get("error") if isinstance(answer.body, dict) else None
        assert (answer.status, got_error) == (self.status, self.error), (
            f"{request}: expected {self.status} {self.error}, got {answer.status} {answer.body}"
        )


OK_201, OK_204 = Expected(201), Expected(204)
UNPROCESSABLE = Expected(422, "Unprocessable")
PARTIAL_UPDATE = Expected(422, "PartialUpdate")
ENTITY_NOT_FOUND = Expected(404, "NotFound")
TOO_MANY = Expected(409, "TooManyResults")


class ContextModel(RuleBasedStateMachine):
    """Random writes through two fronts against the model (module doc)."""

    fronts: ClassVar[tuple[Front, Front]]

    def __init__(self) -> None:
        super().__init__()
        self.entities: dict[Key, Entity] = {}
        self.headers: dict[str, str] = {}
        self.log: list[str] = []  # the requests so far, for a failure's message

    @initialize()
    def a_tenant_of_its_own(self) -> None:
        self.headers = {"Fiware-Service": tenant()}

    # -- helpers --------------------------------------------------------------------------------

    def _call(
        self, front: int, method: str, path: str, body: Any = None, **kwargs: Any
    ) -> tuple[Answer, str]:
        sent = body if body is not None else kwargs.get("raw")
        request = f"{method} {path} via front {front} {json.dumps(sent, default=str)}"
        self.log.append(request)
        answer = self.fronts[front].call(method, path, body, headers=self.headers, **kwargs)
        return answer, "\n".join(self.log[-12:])

    def _resolve(self, entity_id: str, entity_type: str | None) -> Key | Expected:
        """The entity a request names by id (and type), or the error Orion answers."""
        if entity_type is not None:
            key = (entity_id, entity_type)
            return key if key in self.entities else ENTITY_NOT_FOUND
        keys = [k for k in self.entities if k[0] == entity_id]
        if not keys:
            return ENTITY_NOT_FOUND
        return keys[0] if len(keys) == 1 else TOO_MANY

    def _named(self, data: st.DataObject, *, typed: bool = False) -> tuple[str, str | None]:
        """An entity to write to or read: mostly one the model holds (so that most writes
        reach an entity), with or without its type; now and then any."""
        existing = sorted(self.entities)
        if existing and data.draw(st.integers(0, 3)) > 0:
            entity_id, entity_type = data.draw(st.sampled_from(existing))
        else:
            entity_id, entity_type = data.draw(ENTITY_ID), data.draw(ENTITY_TYPE)
        if typed or data.draw(st.booleans()):
            return entity_id, entity_type
        return entity_id, None

    @staticmethod
    def _path(entity_id: str, entity_type: str | None, tail: str = "", **options: str) -> str:
        query = {"type": entity_type, **options} if entity_type else dict(options)
        text = "&".join(f"{k}={v}" for k, v in query.items())
        return f"/v2/entities/{entity_id}{tail}" + (f"?{text}" if text else "")

    def _upsert_into(self, entity: Entity, attributes: dict[str, Attribute]) -> None:
        for name, request in attributes.items():
            old = entity.get(name)
            entity[name] = _stored(request) if old is None else _merged(old, request)

    # -- writes ---------------------------------------------------------------------------------

    @rule(
        front=FRONT,
        entity_id=ENTITY_ID,
        entity_type=ENTITY_TYPE,
        attributes=_attributes(min_size=0),
        upsert=st.booleans(),
        key_values=st.booleans(),
    )
    def create(
        self,
        front: int,
        entity_id: str,
        entity_type: str,
        attributes: dict[str, Attribute],
        upsert: bool,
        key_values: bool,
    ) -> None:
        if key_values:
            attributes = _key_values(attributes)
            body: dict[str, Any] = {n: a["value"] for n, a in attributes.items()}
        else:
            body = dict(attributes)
        options = [o for o, on in (("upsert", upsert), ("keyValues", key_values)) if on]
        path = "/v2/entities" + (f"?options={','.join(options)}" if options else "")
        entity = {"id": entity_id, "type": entity_type, **body}
        answer, log = self._call(front, "POST", path, entity)
        key = (entity_id, entity_type)
        if key in self.entities and not upsert:
            expected = UNPROCESSABLE
        else:
            expected = OK_204 if upsert else OK_201
            self._upsert_into(self.entities.setdefault(key, {}), attributes)
        expected.check(answer, log)

    @rule(front=FRONT, data=st.data(), attributes=_attributes(), strict=st.booleans())
    def append(
        self, front: int, data: st.DataObject, attributes: dict[str, Attribute], strict: bool
    ) -> None:
        entity_id, entity_type = self._named(data)
        options = {"options": "append"} if strict else {}
        path = self._path(entity_id, entity_type, "/attrs", **options)
        answer, log = self._call(front, "POST", path, attributes)
        self._expect_append(entity_id, entity_type, attributes, strict).check(answer, log)

    def _expect_append(
        self,
        entity_id: str,
        entity_type: str | None,
        attributes: dict[str, Attribute],
        strict: bool,
    ) -> Expected:
        key = self._resolve(entity_id, entity_type)
        if isinstance(key, Expected):
            return key
        entity = self.entities[key]
        if not strict:
            self._upsert_into(entity, attributes)
            return OK_204
        absent = {n: a for n, a in attributes.items() if n not in entity}
        entity.update((n, _stored(a)) for n, a in absent.items())
        if len(absent) == len(attributes):
            return OK_204
        return PARTIAL_UPDATE if absent else UNPROCESSABLE

    @rule(
        front=FRONT,
        data=st.data(),
        attributes=_attributes(),
        override=st.sampled_from([False, False, True]),
    )
    def update(
        self, front: int, data: st.DataObject, attributes: dict[str, Attribute], override: bool
    ) -> None:
        entity_id, entity_type = self._named(data)
        options = {"options": "overrideMetadata"} if override else {}
        path = self._path(entity_id, entity_type, "/attrs", **options)
        answer, log = self._call(front, "PATCH", path, attributes)
        self._expect_update(entity_id, entity_type, attributes, override).check(answer, log)

    def _expect_update(
        self,
        entity_id: str,
        entity_type: str | None,
        attributes: dict[str, Attribute],
        override: bool,
    ) -> Expected:
        key = self._resolve(entity_id, entity_type)
        if isinstance(key, Expected):
            return key
        entity = self.entities[key]
        present = {n: a for n, a in attributes.items() if n in entity}
        for name, request in present.items():
            entity[name] = _merged(entity[name], request, override)
        if len(present) == len(attributes):
            return OK_204
        return PARTIAL_UPDATE if present else UNPROCESSABLE

    @rule(front=FRONT, data=st.data(), name=st.sampled_from(NAMES))
    def replace_attribute(self, front: int, data: st.DataObject, name: str) -> None:
        entity_id, entity_type = self._named(data)
        attribute = data.draw(_attribute(name))
        path = self._path(entity_id, entity_type, f"/attrs/{name}")
        answer, log = self._call(front, "PUT", path, attribute)
        found = self._attribute_of(entity_id, entity_type, name)
        if isinstance(found, Expected):
            found.check(answer, log)
            return
        entity = self.entities[found]
        entity[name] = _merged(entity[name], attribute)
        OK_204.check(answer, log)

    @rule(
        front=FRONT,
        data=st.data(),
        name=st.sampled_from(NAMES),
        value=st.integers(-3, 3) | st.sampled_from([0.5, 2.5]),
    )
    def replace_value(self, front: int, data: st.DataObject, name: str, value: float) -> None:
        entity_id, entity_type = self._named(data)
        path = self._path(entity_id, entity_type, f"/attrs/{name}/value")
        raw = json.dumps(value).encode()
        answer, log = self._call(front, "PUT", path, raw=raw, content_type="text/plain")
        found = self._attribute_of(entity_id, entity_type, name)
        if isinstance(found, Expected):
            found.check(answer, log)
            return
        entity = self.entities[found]
        entity[name] = {**entity[name], "value": value}  # type and metadata kept
        OK_204.check(answer, log)

    @rule(front=FRONT, data=st.data(), name=st.sampled_from(NAMES))
    def delete_attribute(self, front: int, data: st.DataObject, name: str) -> None:
        entity_id, entity_type = self._named(data)
        path = self._path(entity_id, entity_type, f"/attrs/{name}")
        answer, log = self._call(front, "DELETE", path)
        found = self._attribute_of(entity_id, entity_type, name)
        if isinstance(found, Expected):
            found.check(answer, log)
            return
        del self.entities[found][name]
        OK_204.check(answer, log)

    def _attribute_of(self, entity_id: str, entity_type: str | None, name: str) -> Key | Expected:
        """The entity of a request naming one of its attributes, or the error: 404 if the
        entity has no such attribute."""
        key = self._resolve(entity_id, entity_type)
        if not isinstance(key, Expected) and name not in self.entities[key]:
            return ENTITY_NOT_FOUND
        return key

    @rule(front=FRONT, data=st.data())
    def delete_entity(self, front: int, data: st.DataObject) -> None:
        entity_id, entity_type = self._named(data)
        answer, log = self._call(front, "DELETE", self._path(entity_id, entity_type))
        key = self._resolve(entity_id, entity_type)
        if isinstance(key, Expected):
            key.check(answer, log)
            return
        del self.entities[key]
        OK_204.check(answer, log)

    @rule(
        front=FRONT,
        action=st.sampled_from(["append", "appendStrict", "update", "delete"]),
        data=st.data(),
        size=st.integers(1, 3),
    )
    def batch(self, front: int, action: str, data: st.DataObject, size: int) -> None:
        entries = []
        for _ in range(size):
            entity_id, entity_type = self._named(data, typed=True)
            assert entity_type is not None
            entries.append((entity_id, entity_type, data.draw(_attributes(min_size=0))))
        body = {
            "actionType": action,
            "entities": [{"id": i, "type": t, **attributes} for i, t, attributes in entries],
        }
        answer, log = self._call(front, "POST", "/v2/op/update", body)
        coverage = [self._batch_one(action, *entry) for entry in entries]
        expected = self._covered(coverage)
        expected.check(answer, log)

    def _batch_one(
        self, action: str, entity_id: str, entity_type: str, attributes: dict[str, Attribute]
    ) -> str:
        """Apply one entity of a batch to the model; Orion's coverage of it."""
        key = (entity_id, entity_type)
        entity = self.entities.get(key)
        if entity is None:
            if action in ("update", "delete"):
                return NOT_FOUND
            self.entities[key] = {n: _stored(a) for n, a in attributes.items()}
            return SUCCESS
        present = [n for n in attributes if n in entity]
        absent = [n for n in attributes if n not in entity]
        if action == "append":
            self._upsert_into(entity, attributes)
            return SUCCESS
        if action == "appendStrict":
            entity.update((n, _stored(attributes[n])) for n in absent)
            return PARTIAL if present and absent else ATTRS_FAIL if present else SUCCESS
        if action == "update":
            for name in present:
                entity[name] = _merged(entity[name], attributes[name])
            return PARTIAL if present and absent else ATTRS_FAIL if absent else SUCCESS
        if not attributes:  # delete, the whole entity
            del self.entities[key]
            return SUCCESS
        for name in present:
            del entity[name]
        # none of the attributes: the entity's 404, as DELETE .../attrs/{a} answers
        return PARTIAL if present and absent else NOT_FOUND if absent else SUCCESS

    @staticmethod
    def _covered(coverage: list[str]) -> Expected:
        """Orion's answer to a batch from its entities' coverage (mongoUpdateContext.cpp)."""
        total = coverage[0]
        for one in coverage[1:]:
            if total == NOT_FOUND and one != NOT_FOUND:
                total = ATTRS_FAIL if one == ATTRS_FAIL else PARTIAL
            elif (total == SUCCESS and one != SUCCESS) or (
                total == ATTRS_FAIL and one not in (ATTRS_FAIL, NOT_FOUND)
            ):
                total = PARTIAL
        return {
            SUCCESS: OK_204,
            PARTIAL: PARTIAL_UPDATE,
            ATTRS_FAIL: UNPROCESSABLE,
            NOT_FOUND: ENTITY_NOT_FOUND,
        }[total]

    # -- reads ----------------------------------------------------------------------------------

    def _rendered(self, key: Key) -> dict[str, Any]:
        return {"id": key[0], "type": key[1], **self.entities[key]}

    def _recent(self) -> str:
        return "\n".join(self.log[-12:])

    @invariant()
    def both_fronts_list_the_model(self) -> None:
        if not self.headers:
            return
        expected = [self._rendered(k) for k in sorted(self.entities)]
        for number, front in enumerate(self.fronts):
            answer = front.call("GET", "/v2/entities?limit=1000", headers=self.headers)
            assert answer.status == 200, answer
            got = sorted(answer.body, key=lambda e: (e["id"], e["type"]))
            assert got == expected, f"front {number} lists, after:\n{self._recent()}"

    @rule(data=st.data())
    def both_fronts_get_one(self, data: st.DataObject) -> None:
        entity_id, entity_type = self._named(data)
        key = self._resolve(entity_id, entity_type)
        path = self._path(entity_id, entity_type)
        for number, front in enumerate(self.fronts):
            answer = front.call("GET", path, headers=self.headers)
            where = f"GET {path} via front {number}, after:\n{self._recent()}"
            if isinstance(key, Expected):
                key.check(answer, where)
            else:
                assert (answer.status, answer.body) == (200, self._rendered(key)), where

    @rule(front=FRONT)
    def types(self, front: int) -> None:
        summary: dict[str, dict[str, Any]] = {}
        for (_id, entity_type), entity in self.entities.items():
            one = summary.setdefault(entity_type, {"attrs": {}, "count": 0})
            one["count"] += 1
            for name, attribute in entity.items():
                one["attrs"].setdefault(name, set()).add(attribute["type"])
        expected = [
            {
                "type": t,
                "attrs": {n: {"types": sorted(s)} for n, s in sorted(summary[t]["attrs"].items())},
                "count": summary[t]["count"],
            }
            for t in sorted(summary)
        ]
        answer = self.fronts[front].call("GET", "/v2/types", headers=self.headers)
        assert (answer.status, answer.body) == (200, expected), self._recent()


def test_writes_through_two_fronts_follow_the_model(fronts: tuple[Front, Front]) -> None:
    ContextModel.fronts = fronts
    run_state_machine_as_test(
        ContextModel,
        settings=settings(
            max_examples=10,
            stateful_step_count=20,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )


def test_a_batch_that_applies_nothing_answers_as_orion(fronts: tuple[Front, Front]) -> None:
    # Orion's update coverage: a missing entity, then one whose attributes do not exist:
    # UC_ENTITY_NOT_FOUND then UC_FULL_ATTRS_FAIL is UC_FULL_ATTRS_FAIL, 422 Unprocessable
    # (mongoUpdateContext.cpp); the other order is 422 in Silbo too
    front = fronts[0]
    headers = {"Fiware-Service": tenant()}
    entity = {"id": "E1", "type": "T1", "a": {"type": "Number", "value": 1}}
    assert front.call("POST", "/v2/entities", entity, headers=headers).status == 201
    missing = {"id": "E9", "type": "T1", "a": {"type": "Number", "value": 2}}
    absent = {"id": "E1", "type": "T1", "b": {"type": "Number", "value": 2}}
    batch = {"actionType": "update", "entities": [missing, absent]}
    answer = front.call("POST", "/v2/op/update", batch, headers=headers)
    assert (answer.status, answer.body["error"]) == (422, "Unprocessable"), answer


# -- aggregation groups (broker/store/aggregation*.py, docs/aggregation.md) ---------------------

SENSORS = {"S1": "B1", "S2": "B1", "S3": "B2", "S4": "B2"}
AGGREGATION = {
    "id": "campus-temperature",
    "entities": {"type": "Sensor"},
    "groupBy": [
        {"attribute": "refBuilding", "type": "Building"},
        {"attribute": "refCampus", "type": "Campus"},
    ],
    "attributes": ["temperature"],
    "functions": ["count", "sum", "max", "avg"],
    "window": {"type": "tumbling", "size": "1s"},
}


def _in_one_window(
    front: Front, headers: dict[str, str], rounds: Sequence[Mapping[str, float]]
) -> float:
    """Send each round of sensor values as one batch, all inside one 1-second window (the
    store counts a value in the window of the time it applies it); that window's end."""
    while not 0.05 < time.time() % 1 < 0.4:
        time.sleep(0.02)
    start = time.time()
    for values in rounds:
        batch = {
            "actionType": "append",
            "entities": [
                {
                    "id": sensor,
                    "type": "Sensor",
                    "temperature": {"type": "Number", "value": value},
                    "refBuilding": {"type": "Relationship", "value": SENSORS[sensor]},
                }
                for sensor, value in values.items()
            ],
        }
        assert front.call("POST", "/v2/op/update", batch, headers=headers).status == 204
    assert math.floor(time.time()) == math.floor(start), "the batches spanned two windows"
    return math.floor(start) + 1.0


def _window_of(front: Front, headers: dict[str, str], entity: str, kind: str, end: float) -> Any:
    """The derived attributes of ``entity`` once they are those of the window ending at
    ``end``."""
    deadline = time.monotonic() + 15
    while True:
        answer = front.call("GET", f"/v2/entities/{entity}?type={kind}", headers=headers)
        if answer.status == 200 and "temperature_avg_1s" in answer.body:
            meta = answer.body["temperature_avg_1s"]["metadata"]["aggregate"]["value"]
            if meta["end"] >= end:
                assert meta["end"] == end, (entity, meta, end)
                return answer.body
        assert time.monotonic() < deadline, f"no window ending at {end} on {entity}: {answer}"
        time.sleep(0.1)


def _expect(body: Any, values: list[float]) -> None:
    got = {f: body[f"temperature_{f}_1s"]["value"] for f in ("count", "sum", "max", "avg")}
    want = {"count": len(values), "sum": sum(values), "max": max(values)}
    assert {f: got[f] for f in want} == want, (got, values)
    assert got["avg"] == pytest.approx(sum(values) / len(values))


def test_hierarchical_aggregation_follows_a_runtime_change_of_hierarchy(
    fronts: tuple[Front, Front],
) -> None:
    # sensors -> buildings -> campuses, on 2 stores; B2 moves from campus C1 to C2 while
    # running: windows after the move count it in C2, nothing is lost; a subscription on
    # the derived C2 is notified; every value checked against a direct computation; an
    # alert rule over the campuses' derived average raises and clears C1's alert
    front, other = fronts
    headers = {"Fiware-Service": tenant()}
    warm = {
        "id": "warm",
        "entities": {"type": "Campus"},
        "attribute": "temperature_avg_1s",
        "condition": {"above": 20},
    }
    assert other.call("POST", "/v2/x/alerts", warm, headers=headers).status == 201
    alerts = _alert_receiver(front, headers)
    for building in ("B1", "B2"):
        entity = {"id": building, "type": "Building", "refCampus": {"value": "C1"}}
        assert front.call("POST", "/v2/entities", entity, headers=headers).status == 201
    receiver = Receiver()
    try:
        subscription = {
            "subject": {"entities": [{"id": "C2", "type": "Campus"}]},
            "notification": {"http": {"url": receiver.url()}, "attrs": ["temperature_sum_1s"]},
        }
        made = front.call("POST", "/v2/subscriptions", subscription, headers=headers)
        assert made.status == 201, made
        made = other.call("POST", "/v2/x/aggregations", AGGREGATION, headers=headers)
        assert made.status == 201, made
        since = other.call("GET", "/v2/x/aggregations/campus-temperature", headers=headers)
        while time.time() < datetime.fromisoformat(since.body["since"]).timestamp():
            time.sleep(0.05)

        first = [{"S1": 10, "S2": 20, "S3": 30, "S4": 40}, {"S1": 11, "S3": 35}]
        end = _in_one_window(front, headers, first)
        _expect(_window_of(front, headers, "B1", "Building", end), [10, 20, 11])
        _expect(_window_of(front, headers, "B2", "Building", end), [30, 40, 35])
        _expect(_window_of(other, headers, "C1", "Campus", end), [10, 20, 11, 30, 40, 35])

        moved = {"refCampus": {"type": "Relationship", "value": "C2"}}
        patched = front.call("PATCH", "/v2/entities/B2/attrs", moved, headers=headers)
        assert patched.status == 204
        second = [{"S1": 5, "S3": 7, "S4": 9}, {"S2": 6, "S4": 8}]
        end = _in_one_window(other, headers, second)
        _expect(_window_of(front, headers, "B1", "Building", end), [5, 6])
        _expect(_window_of(front, headers, "C1", "Campus", end), [5, 6])
        _expect(_window_of(other, headers, "C2", "Campus", end), [7, 9, 8])
        notified = receiver.wait_for(1)[0].body["data"][0]
        assert notified["id"] == "C2" and notified["temperature_sum_1s"]["value"] == 24
        raised, cleared = _transitions(alerts, 2)
        assert raised[:3] == ("Alert:warm:C1", "raised", 1)
        assert raised[3] == pytest.approx(146 / 6)
        assert cleared == ("Alert:warm:C1", "cleared", 2, 5.5)
    finally:
        receiver.close()
        alerts.close()


def test_bad_aggregations_are_refused_with_what_to_fix(fronts: tuple[Front, Front]) -> None:
    front = fronts[0]
    headers = {"Fiware-Service": tenant()}
    path = "/v2/x/aggregations"
    bad = {**AGGREGATION, "functions": ["median"], "window": {"size": "1x"}}
    answer = front.call("POST", path, bad, headers=headers)
    assert answer.status == 400 and answer.body["error"] == "BadRequest", answer
    assert "median" in answer.body["description"] and "1x" in answer.body["description"]
    assert front.call("POST", path, AGGREGATION, headers=headers).status == 201
    again = front.call("POST", path, AGGREGATION, headers=headers)
    assert (again.status, again.body["error"]) == (422, "Unprocessable"), again
    missing = front.call("GET", f"{path}/nothing", headers=headers)
    assert (missing.status, missing.body["error"]) == (404, "NotFound"), missing
    changed = {**AGGREGATION, "functions": ["min"]}
    del changed["id"]  # the URL's
    assert front.call("PUT", f"{path}/nothing", changed, headers=headers).status == 404
    renamed = front.call(
        "PUT", f"{path}/campus-temperature", {**changed, "id": "x"}, headers=headers
    )
    assert renamed.status == 400 and "not the URL's" in renamed.body["description"], renamed
    assert front.call("PUT", f"{path}/campus-temperature", changed, headers=headers).status == 204
    shown = front.call("GET", f"{path}/campus-temperature", headers=headers).body
    assert (shown["functions"], shown["version"]) == (["min"], 2), shown
    listed = front.call("GET", path, headers=headers).body
    assert [a["id"] for a in listed] == ["campus-temperature"]
    assert front.call("DELETE", f"{path}/campus-temperature", headers=headers).status == 204
    assert front.call("GET", path, headers=headers).body == []


def test_silbo_aggregate_defines_groups_through_a_front(
    fronts: tuple[Front, Front], capsys: pytest.CaptureFixture[str]
) -> None:
    front = f"http://{fronts[1].host}:{fronts[1].port}"
    where = ["--tenant", tenant(), "--front", front]

    def silbo(*words: str) -> tuple[int, str, str]:
        args = build_parser(["aggregate", *words]).parse_args(["aggregate", *words, *where])
        status = args.handler(args)
        out, err = capsys.readouterr()
        return status, out, err

    flags = ["--id", "rooms", "--type", "Sensor", "--group-by", "refRoom:Room,refFloor:Floor"]
    flags += ["--attributes", "temperature", "--functions", "avg,max", "--window", "10s"]
    assert silbo("add", *flags)[0] == 0
    status, out, _err = silbo("list")
    line = "rooms  refRoom:Room -> refFloor:Floor  avg,max(temperature)  10s  v1\n"
    assert (status, out) == (0, line)
    status, out, _err = silbo("show", "rooms")
    floor = {"attribute": "refFloor", "type": "Floor"}
    assert status == 0 and json.loads(out)["groupBy"][1] == floor
    status, _out, err = silbo("add", *flags)
    assert status == 2 and "422 Unprocessable" in err, err
    status, _out, err = silbo("change", "rooms", *flags[2:-1], "10x")
    assert status == 2 and "400 BadRequest" in err and "10x" in err, err
    assert silbo("delete", "rooms")[0] == 0
    status, _out, err = silbo("show", "rooms")
    assert status == 2 and "404 NotFound" in err, err


# -- alert rules (broker/store/alerting.py, alert_log.py, docs/alerts.md) -----------------------

HOT = {
    "id": "hot",
    "entities": {"type": "Room"},
    "attribute": "temperature",
    "condition": {"above": 30, "clearBelow": 28},
    "severity": "critical",
}


def _alert_receiver(front: Front, headers: dict[str, str]) -> Receiver:
    """A receiver subscribed to every Alert entity of the tenant (status and number)."""
    receiver = Receiver()
    subscription = {
        "subject": {"entities": [{"idPattern": ".*", "type": "Alert"}]},
        "notification": {
            "http": {"url": receiver.url()},
            "attrs": ["status", "transition", "value", "refEntity"],
        },
    }
    made = front.call("POST", "/v2/subscriptions", subscription, headers=headers)
    assert made.status == 201, made
    return receiver


def _transitions(receiver: Receiver, count: int) -> list[tuple[str, str, int, float]]:
    """The first ``count`` alert notifications: (alert id, status, number, value)."""
    return [
        (data["id"], data["status"]["value"], data["transition"]["value"], data["value"]["value"])
        for note in receiver.wait_for(count)
        for data in note.body["data"]
    ]


def _store_view(cluster: Any) -> Any:
    from broker.coordination.client import connect
    from broker.store.layout import LayoutWatch

    client = connect(cluster.zk_address, cluster=cluster.spec.cluster, timeout=10.0)
    try:
        return LayoutWatch(client).view
    finally:
        client.stop()
        client.close()


def test_alert_rules_are_refused_with_what_to_fix_and_kept(fronts: tuple[Front, Front]) -> None:
    front, other = fronts
    headers = {"Fiware-Service": tenant()}
    path = "/v2/x/alerts"
    bad = {**HOT, "condition": {"above": "warm", "for": "1x"}, "alert": {"id": "A:{id}"}}
    answer = front.call("POST", path, bad, headers=headers)
    assert (answer.status, answer.body["error"]) == (400, "BadRequest"), answer
    for part in ("condition.above", "'1x'", "must name {rule} and {id}"):
        assert part in answer.body["description"], answer
    made = front.call("POST", path, HOT, headers=headers)
    assert (made.status, made.header("Location")) == (201, f"{path}/hot"), made
    again = other.call("POST", path, HOT, headers=headers)
    assert (again.status, again.body["error"]) == (422, "Unprocessable"), again
    for missing in (f"{path}/nothing", f"{path}/a%20b"):
        answer = other.call("GET", missing, headers=headers)
        assert (answer.status, answer.body["error"]) == (404, "NotFound"), answer
    changed = {**HOT, "condition": {"below": 5, "clearAbove": 7, "for": "10s"}}
    del changed["id"]  # the URL's
    assert other.call("PUT", f"{path}/nothing", changed, headers=headers).status == 404
    renamed = other.call("PUT", f"{path}/hot", {**changed, "id": "cold"}, headers=headers)
    assert renamed.status == 400 and "not the URL's" in renamed.body["description"], renamed
    assert other.call("PUT", f"{path}/hot", changed, headers=headers).status == 204
    shown = front.call("GET", f"{path}/hot", headers=headers).body
    assert shown["condition"] == {"below": 5, "clearAbove": 7, "for": 10.0}, shown
    assert (shown["version"], shown["servicePath"], shown["severity"]) == (2, "/#", "critical")
    listed = front.call("GET", path, headers={**headers, "Fiware-ServicePath": "/#"}).body
    assert [rule["id"] for rule in listed] == ["hot"]
    assert front.call("GET", path, headers={**headers, "Fiware-ServicePath": "/x"}).body == []
    assert front.call("DELETE", f"{path}/hot", headers=headers).status == 204
    assert front.call("DELETE", f"{path}/hot", headers=headers).status == 404
    assert front.call("GET", path, headers=headers).body == []


def test_silbo_alert_defines_rules_through_a_front(
    fronts: tuple[Front, Front], capsys: pytest.CaptureFixture[str]
) -> None:
    front = f"http://{fronts[0].host}:{fronts[0].port}"
    where = ["--tenant", tenant(), "--front", front]

    def silbo(*words: str) -> tuple[int, str, str]:
        args = build_parser(["alert", *words]).parse_args(["alert", *words, *where])
        status = args.handler(args)
        out, err = capsys.readouterr()
        return status, out, err

    flags = ["--id", "dry", "--type", "Plant", "--attribute", "moisture", "--below", "20"]
    assert silbo("add", *flags, "--clear-above", "25", "--for", "1m")[0] == 0
    status, out, _err = silbo("list")
    assert (status, out) == (0, "dry  Plant  moisture below 20 clearAbove 25 for 60  warning  v1\n")
    status, out, _err = silbo("show", "dry")
    assert status == 0 and json.loads(out)["alert"] == {"type": "Alert", "id": "Alert:{rule}:{id}"}
    status, _out, err = silbo("add", *flags)
    assert status == 2 and "422 Unprocessable" in err, err
    status, _out, err = silbo("change", "dry", *flags[2:], "--clear-above", "10")
    assert status == 2 and "400 BadRequest" in err and "clearAbove" in err, err
    assert silbo("change", "dry", *flags[2:], "--severity", "minor")[0] == 0
    assert json.loads(silbo("show", "dry")[1])["severity"] == "minor"
    assert silbo("delete", "dry")[0] == 0
    status, _out, err = silbo("show", "dry")
    assert status == 2 and "404 NotFound" in err, err


def test_an_alert_is_published_once_per_transition_through_a_kill_of_its_store(
    fronts: tuple[Front, Front],
) -> None:
    # a rule with hysteresis over a room's temperature, a subscription on the Alert
    # entities, a series of values through both fronts; right after the write that clears
    # the alert a first time, the primary store of the room's partition is killed (-9): the
    # other store takes over with the state and the transitions not yet published (they
    # were in the writes' commits); every transition arrives exactly once, in order
    front, other = fronts
    headers = {"Fiware-Service": tenant()}
    receiver = _alert_receiver(front, headers)
    cluster = front.cluster
    assert cluster is not None
    try:
        assert other.call("POST", "/v2/x/alerts", HOT, headers=headers).status == 201
        series = [25, 31, 33, 29, 27, 29, 35, 20, 31]
        expected = [
            ("Alert:hot:R1", "raised", 1, 31),
            ("Alert:hot:R1", "cleared", 2, 27),
            ("Alert:hot:R1", "raised", 3, 35),
            ("Alert:hot:R1", "cleared", 4, 20),
            ("Alert:hot:R1", "raised", 5, 31),
        ]
        primary = _store_view(cluster).primary(partition_of(headers["Fiware-Service"], "R1"))
        killed = ""
        for index, value in enumerate(series):
            room = {"id": "R1", "type": "Room", "temperature": {"type": "Number", "value": value}}
            via = fronts[index % 2]
            answer = via.call("POST", "/v2/entities?options=upsert", room, headers=headers)
            assert answer.status in (201, 204), answer
            if value == 27:
                killed = _kill_store_process(cluster, primary)
        assert killed
        assert _transitions(receiver, len(expected)) == expected
        time.sleep(1.0)  # a transition published twice would come within a publish round
        assert len(receiver.received()) == len(expected), _transitions(receiver, 6)
        alert = front.call("GET", "/v2/entities/Alert:hot:R1", headers=headers).body
        assert alert["refEntity"]["value"] == "R1" and alert["severity"]["value"] == "critical"
        assert {"raisedAt", "clearedAt"} <= set(alert)
    finally:
        receiver.close()
        _restore_stores(cluster)


def _kill_store_process(cluster: Any, store_id: str) -> str:
    """Kill -9 the process of ``store_id`` (``store-N``); its number."""
    number = store_id.rsplit("-", 1)[1]
    (process,) = [
        p
        for p in cluster.description["processes"]
        if p["role"] == Role.CONTEXT_STORE.value and p["log"].endswith(f"-{number}.log")
    ]
    os.kill(process["pid"], signal.SIGKILL)
    return number


def _restore_stores(cluster: Any) -> None:
    """Start a killed store again, for the module's next tests (it recovers meanwhile:
    what it missed is copied from the other, which serves on)."""
    for entry in cluster.description["processes"]:
        child = cluster.child(entry["pid"])
        if entry["role"] == Role.CONTEXT_STORE.value and child is not None and child.poll():
            cluster.replace(Role.CONTEXT_STORE, int(entry["log"].rsplit("-", 1)[1][:-4]))
