"""Registrations and forwarding against a real front: an IoT-agent-like context provider of
our own (NGSI v2 ``op/query`` / ``op/update`` and NGSIv1 ``queryContext`` /
``updateContext``, recording what it gets) registers a device's lazy attribute and command;
reads merge the provider's attribute, writes of the command reach the provider, the
registration's ``forwardingInformation`` counts them; bad bodies are 400s; tenants keep
apart; registrations survive a restart of the cluster (they live in ZooKeeper).
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from aiohttp import web
from filip.clients.ngsi_v2 import ContextBrokerClient
from filip.models.base import FiwareHeader
from filip.models.ngsi_v2.base import EntityPattern
from filip.models.ngsi_v2.context import ContextEntity
from filip.models.ngsi_v2.registrations import DataProvided, Registration
from filip.models.ngsi_v2.registrations import Provider as FilipProvider

from ngsi.conftest import Front, free_port, tenant

DEVICE = "Device"


@dataclass(frozen=True, slots=True)
class Got:
    """One request the provider got."""

    path: str
    headers: dict[str, str]
    body: Any


class Provider:
    """An IoT-agent-like context provider on loopback, in a thread: answers queries of its
    lazy attributes (``values``: {(entity id, attribute): value}), takes every update, and
    records each request. Stopped, it refuses connections."""

    def __init__(self) -> None:
        self.port = free_port()
        self.values: dict[tuple[str, str], Any] = {}
        self.got: list[Got] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._runner: web.AppRunner | None = None
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)

    def url(self, prefix: str = "") -> str:
        """The provider's base URL (what a registration names)."""
        return f"http://127.0.0.1:{self.port}{prefix}"

    def stop(self) -> None:
        """Stop listening."""
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
            self._runner = None

    def close(self) -> None:
        """Stop listening and end the thread."""
        self.stop()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def of(self, suffix: str) -> list[Got]:
        """The requests got on paths ending with ``suffix``."""
        return [g for g in self.got if g.path.endswith(suffix)]

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_post("/{prefix:.*}op/query", self._v2_query)
        app.router.add_post("/{prefix:.*}op/update", self._v2_update)
        app.router.add_post("/{prefix:.*}queryContext", self._legacy_query)
        app.router.add_post("/{prefix:.*}updateContext", self._legacy_update)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def _record(self, request: web.Request) -> Any:
        body = await request.json()
        self.got.append(Got(request.path, dict(request.headers), body))
        return body

    async def _v2_query(self, request: web.Request) -> web.Response:
        body = await self._record(request)
        answer = []
        for entity in body["entities"]:
            found = {
                name: {"type": "Number", "value": value, "metadata": {}}
                for (entity_id, name), value in self.values.items()
                if entity_id == entity["id"] and name in body.get("attrs", [name])
            }
            if found:
                answer.append({"id": entity["id"], "type": entity.get("type", DEVICE), **found})
        return web.json_response(answer)

    async def _v2_update(self, request: web.Request) -> web.Response:
        await self._record(request)
        return web.Response(status=204)

    async def _legacy_query(self, request: web.Request) -> web.Response:
        body = await self._record(request)
        responses = []
        for entity in body["entities"]:
            attributes = [
                {"name": name, "type": "Number", "value": value}
                for (entity_id, name), value in self.values.items()
                if entity_id == entity["id"] and name in (body.get("attributes") or [name])
            ]
            element = {**entity, "attributes": attributes}
            status = {"code": "200", "reasonPhrase": "OK"}
            responses.append({"contextElement": element, "statusCode": status})
        return web.json_response({"contextResponses": responses})

    async def _legacy_update(self, request: web.Request) -> web.Response:
        body = await self._record(request)
        responses = [
            {"contextElement": element, "statusCode": {"code": "200", "reasonPhrase": "OK"}}
            for element in body["contextElements"]
        ]
        return web.json_response({"contextResponses": responses})


@pytest.fixture
def provider() -> Iterator[Provider]:
    server = Provider()
    try:
        yield server
    finally:
        server.close()


def _registration(url: str, device: str, *, legacy: bool) -> dict[str, Any]:
    """What an IoT agent registers for a device: a lazy attribute and a command."""
    return {
        "description": "device lazy attributes and commands",
        "dataProvided": {
            "entities": [{"id": device, "type": DEVICE}],
            "attrs": ["humidity", "reboot"],
        },
        "provider": {"http": {"url": url}, "legacyForwarding": legacy},
    }


def _register(front: Front, headers: dict[str, str], body: dict[str, Any]) -> str:
    created = front.call("POST", "/v2/registrations", body, headers=headers)
    assert created.status == 201, created
    location = created.header("Location") or ""
    assert location.startswith("/v2/registrations/"), location
    return location.rsplit("/", 1)[1]


def _device(front: Front, headers: dict[str, str]) -> str:
    """A device entity with one active attribute."""
    device = f"dev-{uuid.uuid4().hex[:8]}"
    body = {"id": device, "type": DEVICE, "temperature": {"type": "Number", "value": 20}}
    assert front.call("POST", "/v2/entities", body, headers=headers).status == 201
    return device


# -- the registrations API ----------------------------------------------------------------------


BAD = [
    ([], "not a JSON object"),
    ({}, "empty payload"),
    ({"provider": {"http": {"url": "http://127.0.0.1:1"}}}, "/dataProvided/ is missing"),
    ({"dataProvided": {}, "provider": {}}, "/dataProvided/ is empty"),
    ({"dataProvided": {"entities": [{"type": "T"}]}}, "one of /id/ and /idPattern/"),
    ({"dataProvided": {"entities": [{"id": "E"}]}}, "the field /provider/ is missing"),
    ({"dataProvided": {"entities": [{"id": "E"}]}, "provider": {}}, "/provider/ empty"),
    ({"dataProvided": {"entities": [{"id": "E"}]}, "provider": {"http": 1}}, "/http/ must be"),
    ({"dataProvided": {"entities": [{"id": "E"}]}, "provider": {"http": {}}}, "field /url/"),
    (
        {"dataProvided": {"entities": [{"id": "E"}]}, "provider": {"http": {"url": "ftp://x"}}},
        "is not an http(s) URL",
    ),
    (
        {
            "dataProvided": {"entities": [{"id": "E"}]},
            "provider": {"http": {"url": "http://127.0.0.1:1"}, "supportedForwardingMode": "x"},
        },
        "invalid value of /supportedForwardingMode/",
    ),
    (
        {
            "dataProvided": {"entities": [{"id": "E"}]},
            "provider": {"http": {"url": "http://127.0.0.1:1"}, "legacyForwarding": "yes"},
        },
        "/legacyForwarding/ must be a boolean",
    ),
    (
        {
            "dataProvided": {"entities": [{"id": "E"}]},
            "provider": {"http": {"url": "http://127.0.0.1:1"}},
            "status": "sleeping",
        },
        "invalid value for /status/",
    ),
    (
        {
            "dataProvided": {"entities": [{"id": "E"}]},
            "provider": {"http": {"url": "http://127.0.0.1:1"}},
            "expires": "tomorrow",
        },
        "/expires/ has an invalid format",
    ),
    (
        {
            "description": "a <script>",
            "dataProvided": {"entities": [{"id": "E"}]},
            "provider": {"http": {"url": "http://127.0.0.1:1"}},
        },
        "forbidden characters in description",
    ),
    (
        {
            "dataProvided": {"entities": [{"idPattern": "("}]},
            "provider": {"http": {"url": "http://127.0.0.1:1"}},
        },
        "",
    ),
]


@pytest.mark.parametrize(("body", "description"), BAD, ids=[d or "pattern" for _b, d in BAD])
def test_a_bad_registration_is_a_400(front: Front, body: Any, description: str) -> None:
    answer = front.call("POST", "/v2/registrations", body, headers={"Fiware-Service": tenant()})
    assert answer.status == 400, answer
    assert answer.body["error"] == "BadRequest"
    assert description in answer.body["description"]


def test_registrations_are_listed_read_patched_and_deleted_per_tenant(
    front: Front, provider: Provider
) -> None:
    headers = {"Fiware-Service": tenant(), "Fiware-ServicePath": "/floor1"}
    ids = [
        _register(front, headers, _registration(provider.url(), f"d{i}", legacy=False))
        for i in range(3)
    ]
    one = front.call("GET", f"/v2/registrations/{ids[0]}", headers=headers)
    assert one.status == 200, one
    assert one.body == {
        "id": ids[0],
        "description": "device lazy attributes and commands",
        "dataProvided": {
            "entities": [{"id": "d0", "type": DEVICE}],
            "attrs": ["humidity", "reboot"],
        },
        "provider": {
            "http": {"url": provider.url()},
            "supportedForwardingMode": "all",
            "legacyForwarding": False,
        },
        "status": "active",  # no forwardingInformation before the first forwarding
    }
    listed = front.call("GET", "/v2/registrations?limit=2&offset=1&options=count", headers=headers)
    assert listed.status == 200, listed
    assert [r["id"] for r in listed.body] == ids[1:]
    assert listed.header("Fiware-Total-Count") == "3"
    elsewhere = {"Fiware-Service": tenant()}
    assert front.call("GET", "/v2/registrations", headers=elsewhere).body == []
    assert front.call("GET", f"/v2/registrations/{ids[0]}", headers=elsewhere).status == 404
    other_path = {**headers, "Fiware-ServicePath": "/floor2"}
    assert front.call("GET", "/v2/registrations", headers=other_path).body == []

    patch = {"status": "inactive", "expires": "2040-01-01T00:00:00Z"}
    assert front.call("PATCH", f"/v2/registrations/{ids[0]}", patch, headers=headers).status == 204
    patched = front.call("GET", f"/v2/registrations/{ids[0]}", headers=headers).body
    assert (patched["status"], patched["expires"]) == ("inactive", "2040-01-01T00:00:00.000Z")
    bad = front.call("PATCH", f"/v2/registrations/{ids[0]}", {"status": 1}, headers=headers)
    assert bad.status == 400, bad
    for body in ({"id": "x"}, {"colour": "red"}):  # nothing to change; a field it has not
        unknown = front.call("PATCH", f"/v2/registrations/{ids[0]}", body, headers=headers)
        assert unknown.status == 400, unknown

    assert front.call("DELETE", f"/v2/registrations/{ids[0]}", headers=elsewhere).status == 404
    assert front.call("DELETE", f"/v2/registrations/{ids[0]}", headers=headers).status == 204
    gone = front.call("GET", f"/v2/registrations/{ids[0]}", headers=headers)
    assert gone.status == 404 and gone.body["error"] == "NotFound", gone
    assert front.call("DELETE", f"/v2/registrations/{ids[0]}", headers=headers).status == 404
    assert front.call("GET", "/v2/registrations/nothing", headers=headers).status == 404


# -- forwarding ---------------------------------------------------------------------------------


@pytest.mark.parametrize("legacy", [False, True], ids=["ngsiv2", "legacy"])
def test_an_iot_agent_provides_a_lazy_attribute_and_takes_a_command(
    front: Front, provider: Provider, legacy: bool
) -> None:
    service = tenant()
    headers = {"Fiware-Service": service, "Fiware-ServicePath": "/", "X-Auth-Token": "tok"}
    device = _device(front, headers)
    url = provider.url("" if legacy else "/v2")
    rid = _register(front, headers, _registration(url, device, legacy=legacy))
    provider.values[(device, "humidity")] = 55

    got = front.call("GET", f"/v2/entities/{device}?type={DEVICE}", headers=headers)
    assert got.status == 200, got
    assert got.body == {
        "id": device,
        "type": DEVICE,
        "temperature": {"type": "Number", "value": 20, "metadata": {}},
        "humidity": {"type": "Number", "value": 55, "metadata": {}},
    }
    value = front.call("GET", f"/v2/entities/{device}/attrs/humidity/value", headers=headers)
    assert (value.status, value.body) == (200, 55)
    listed = front.call("GET", f"/v2/entities?type={DEVICE}&options=keyValues", headers=headers)
    assert listed.body == [{"id": device, "type": DEVICE, "temperature": 20, "humidity": 55}]
    queried = front.call(
        "POST",
        "/v2/op/query",
        {"entities": [{"id": device}], "attrs": ["humidity"]},
        headers=headers,
    )
    assert queried.body == [
        {"id": device, "type": DEVICE, "humidity": {"type": "Number", "value": 55, "metadata": {}}}
    ]
    skipped = front.call("GET", f"/v2/entities/{device}?options=skipForwarding", headers=headers)
    assert "humidity" not in skipped.body

    queries = provider.of("/queryContext" if legacy else "/v2/op/query")
    assert len(queries) == 4
    if legacy:
        assert queries[0].body == {
            "entities": [{"type": DEVICE, "isPattern": "false", "id": device}],
            "attributes": ["humidity", "reboot"],  # every registered one the query wants
        }
    else:
        assert queries[0].body == {
            "entities": [{"id": device, "type": DEVICE}],
            "attrs": ["humidity", "reboot"],
        }
    sent = queries[0].headers
    assert sent["Fiware-Service"] == service
    assert sent["Fiware-ServicePath"] == "/"
    assert sent["X-Auth-Token"] == "tok"
    assert "; cbfwd=" in sent["Fiware-Correlator"]

    command = {"reboot": {"type": "command", "value": ""}, "temperature": {"value": 21}}
    patched = front.call(
        "PATCH", f"/v2/entities/{device}/attrs?type={DEVICE}", command, headers=headers
    )
    assert patched.status == 204, patched
    updates = provider.of("/updateContext" if legacy else "/v2/op/update")
    assert len(updates) == 1
    if legacy:
        assert updates[0].body == {
            "contextElements": [
                {
                    "type": DEVICE,
                    "isPattern": "false",
                    "id": device,
                    "attributes": [{"name": "reboot", "type": "command", "value": ""}],
                }
            ],
            "updateAction": "UPDATE",
        }
    else:
        assert updates[0].body == {
            "actionType": "update",
            "entities": [
                {"id": device, "type": DEVICE, "reboot": {"type": "command", "value": ""}}
            ],
        }
    local = front.call(
        "GET", f"/v2/entities/{device}?options=keyValues,skipForwarding", headers=headers
    )
    assert local.body == {"id": device, "type": DEVICE, "temperature": 21}  # not the command
    batch = {
        "actionType": "update",
        "entities": [{"id": device, "type": DEVICE, "reboot": {"value": 1}}],
    }
    assert front.call("POST", "/v2/op/update", batch, headers=headers).status == 204
    assert len(provider.of("/updateContext" if legacy else "/v2/op/update")) == 2

    registration = front.call("GET", f"/v2/registrations/{rid}", headers=headers).body
    information = registration["forwardingInformation"]
    assert information["timesSent"] == 6
    assert "lastSuccess" in information and "lastFailure" not in information


def test_a_provider_that_fails_leaves_the_local_answer(front: Front, provider: Provider) -> None:
    headers = {"Fiware-Service": tenant()}
    device = _device(front, headers)
    rid = _register(front, headers, _registration(provider.url("/v2"), device, legacy=False))
    provider.stop()

    got = front.call("GET", f"/v2/entities/{device}?options=keyValues", headers=headers)
    assert (got.status, got.body) == (200, {"id": device, "type": DEVICE, "temperature": 20})
    command = {"reboot": {"type": "command", "value": ""}}
    refused = front.call("PATCH", f"/v2/entities/{device}/attrs", command, headers=headers)
    assert refused.status == 404 and refused.body["error"] == "NotFound", refused
    both = {**command, "temperature": {"value": 30}}
    partial = front.call("PATCH", f"/v2/entities/{device}/attrs", both, headers=headers)
    assert partial.status == 422 and partial.body["error"] == "PartialUpdate", partial
    nowhere = front.call("GET", "/v2/entities/elsewhere", headers=headers)
    assert nowhere.status == 404

    information = front.call("GET", f"/v2/registrations/{rid}", headers=headers).body[
        "forwardingInformation"
    ]
    assert information["timesSent"] == 3
    assert "lastFailure" in information and "lastSuccess" not in information


def test_an_entity_only_the_provider_holds_is_answered(front: Front, provider: Provider) -> None:
    headers = {"Fiware-Service": tenant()}
    registration = _registration(provider.url("/v2"), "remote", legacy=False)
    registration["dataProvided"]["attrs"] = []  # every attribute
    _register(front, headers, registration)
    provider.values[("remote", "pressure")] = 1013
    got = front.call("GET", "/v2/entities/remote?options=keyValues", headers=headers)
    assert (got.status, got.body) == (200, {"id": "remote", "type": DEVICE, "pressure": 1013})
    other = {"Fiware-Service": tenant()}  # another tenant has no such registration
    assert front.call("GET", "/v2/entities/remote", headers=other).status == 404


def test_filip_registers_a_device_and_reads_its_lazy_attribute(
    front: Front, provider: Provider
) -> None:
    """FIWARE's Python client (filip), unchanged: its registration round trip, and an entity
    read that the front completes from the provider."""
    header = FiwareHeader(service=tenant(), service_path="/")
    with ContextBrokerClient(url=f"http://{front.host}:{front.port}", fiware_header=header) as cb:
        device = f"dev-{uuid.uuid4().hex[:8]}"
        cb.post_entity(
            ContextEntity(id=device, type=DEVICE, temperature={"type": "Number", "value": 20})
        )
        registration = Registration(
            description="a filip device",
            dataProvided=DataProvided(entities=[EntityPattern(id=device)], attrs=["humidity"]),
            provider=FilipProvider(http={"url": provider.url("/v2")}),
        )
        rid = cb.post_registration(registration)
        provider.values[(device, "humidity")] = 61
        [listed] = cb.get_registration_list()
        assert listed.id == rid and listed.description == "a filip device"
        read = cb.get_entity(device)
        assert read.get_attribute("humidity").value == 61
        assert read.get_attribute("temperature").value == 20
        changed = cb.get_registration(rid)
        changed.description = "renamed"
        cb.update_registration(changed)
        assert cb.get_registration(rid).description == "renamed"
        cb.delete_registration(rid)
        assert cb.get_registration_list() == []
