"""The NGSI v2 front against its OpenAPI description (docs/openapi.yaml).

The description lists exactly the routes :func:`broker.ngsi.routes.add_routes` serves (so the
two cannot drift apart), and every request schemathesis makes of it, sent to a real front,
gets a documented answer: no 5xx but the documented 501 NotImplemented, and the documented
status codes, content types, headers and bodies, each within ``REQUEST_TIMEOUT``. Two runs:

- per operation, Hypothesis draws ``APIOperation.as_strategy`` cases (generated requests that
  fit the description and that break it, and its documented examples) and shrinks a failure
  to its smallest request;
- ``schemathesis run`` (the CLI) adds its coverage phase: for every constraint of every
  operation, the values at its edges and the values that break it, one at a time.

A failure prints the request that caused it (``curl``). Schemathesis's own
``@schema.parametrize()`` is not used: under pytest 9.2 it gives every operation's test the
same node id, which pytest-xdist then runs once and reports once.
"""

from __future__ import annotations

import functools
import json
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import schemathesis
import yaml
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from strategies import examples

from broker.coordination.embedded import EmbeddedZooKeeper
from broker.ngsi.front import NgsiFront
from broker.ngsi.routes import add_routes
from ngsi.conftest import Front, started_front

DESCRIPTION = Path(__file__).resolve().parents[2] / "docs" / "openapi.yaml"
SERVED = Path("broker") / "ngsi" / "openapi.json"
REQUEST_TIMEOUT = 30.0  # seconds: an answer that takes longer is a hang
# 501 is the documented answer of what Silbo does not serve; status_code_conformance checks
# that it comes only where it is documented
CONFIG = '[checks.not_a_server_error]\nexpected-statuses = ["2xx", "3xx", "4xx", "501"]\n'
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]
# what the path parameters name when a case names something that exists (see ``known``)
ENTITY = {"id": "Room1", "type": "Room", "temperature": {"type": "Number", "value": 21.5}}
SUBSCRIPTION = {  # of no entity the cases make: a notification per case would pile up
    "subject": {"entities": [{"id": "Subscribed", "type": "Nothing"}]},
    "notification": {"http": {"url": "http://127.0.0.1:9/notify"}},
}
REGISTRATION = {  # of an entity the cases do not make, at a port nothing listens on
    "dataProvided": {"entities": [{"id": "Registered", "type": "Nothing"}], "attrs": ["lazy"]},
    "provider": {"http": {"url": "http://127.0.0.1:9"}},
}
_METHODS = frozenset({"get", "put", "post", "delete", "patch", "head", "options", "trace"})

Operation = schemathesis.APIOperation[Any, Any, Any, Any]
Case = schemathesis.Case[Any]


@functools.cache
def _schema() -> schemathesis.BaseSchema:
    config = schemathesis.Config.from_dict(tomllib.loads(CONFIG))
    return schemathesis.openapi.from_path(DESCRIPTION, config=config)


def _described() -> list[tuple[str, str]]:
    """(method, path) of every operation of the description."""
    document: dict[str, Any] = yaml.safe_load(DESCRIPTION.read_text())
    return sorted(
        (method.upper(), path)
        for path, operations in document["paths"].items()
        for method in operations
        if method in _METHODS
    )


OPERATIONS = _described()


def _served() -> set[tuple[str, str]]:
    """(method, path) of every route, each path also served with one trailing '/'."""
    app = web.Application()
    add_routes(app, cast(NgsiFront, None))  # the front is only used when a request comes
    routes = set()
    for route in app.router.routes():
        assert route.resource is not None
        routes.add((route.method, route.resource.canonical))
    bare = {(method, path) for method, path in routes if not path.endswith("/")}
    assert routes == bare | {(method, path + "/") for method, path in bare}
    return bare


def _cases(operation: Operation, known: dict[str, str]) -> st.SearchStrategy[Case]:
    """The operation's documented examples, and generated cases that fit the description and
    that break it, their path parameters drawn or naming what exists."""
    names = re.findall(r"{(\w+)}", operation.path)
    named = {name: known[name] for name in names if name in known}
    return st.one_of(
        *operation.get_strategies_from_examples(),
        *(
            operation.as_strategy(mode, path_parameters=parameters)
            for mode in GenerationMode
            for parameters in ([None, named] if named else [None])
        ),
    )


@pytest.fixture(scope="module")
def front(
    zookeeper: EmbeddedZooKeeper, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Front]:
    """The module's cluster, its context store recording history (so that the history
    operations answer rows and points, not only empty pages)."""
    with started_front(zookeeper, tmp_path_factory, "openapi", store_history=True) as served:
        yield served


@pytest.fixture
def known(front: Front) -> dict[str, str]:
    """Path parameters that name something of the default tenant: the example entity and its
    attribute (upserted), a new subscription and a new registration."""
    assert front.call("POST", "/v2/entities?options=upsert", ENTITY).status == 204
    created = front.call("POST", "/v2/subscriptions", SUBSCRIPTION)
    assert created.status == 201, created
    sid = (created.header("Location") or "").rsplit("/", 1)[-1]
    registered = front.call("POST", "/v2/registrations", REGISTRATION)
    assert registered.status == 201, registered
    rid = (registered.header("Location") or "").rsplit("/", 1)[-1]
    return {"id": str(ENTITY["id"]), "attr": "temperature", "sid": sid, "rid": rid}


def test_the_description_is_valid_openapi() -> None:
    _schema().validate()


def test_the_served_json_is_the_description() -> None:
    """broker/ngsi/openapi.json (what GET /v2/openapi.json serves) is docs/openapi.yaml
    (run scripts/gen_openapi_json.py after changing the description)."""
    served = json.loads((Path(__file__).resolve().parents[2] / SERVED).read_text())
    assert served == yaml.safe_load(DESCRIPTION.read_text()), "run scripts/gen_openapi_json.py"


def test_the_description_lists_exactly_the_routes_served() -> None:
    described, served = set(_described()), _served()
    assert described - served == set(), "described, not served"
    assert served - described == set(), "served, not described"


@pytest.mark.slow
@pytest.mark.xdist_group("openapi")  # one front for every operation, not one per worker
@pytest.mark.parametrize(("method", "path"), OPERATIONS, ids=[f"{m} {p}" for m, p in OPERATIONS])
def test_every_answer_is_documented(
    front: Front, known: dict[str, str], method: str, path: str
) -> None:
    base_url = f"http://{front.host}:{front.port}"

    @settings(
        max_examples=examples(40),
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    @given(_cases(_schema()[path][method], known))
    def answered(case: Case) -> None:
        case.call_and_validate(base_url=base_url, checks=CHECKS, timeout=REQUEST_TIMEOUT)

    answered()


@pytest.mark.slow
@pytest.mark.xdist_group("openapi")
def test_every_edge_of_the_description_is_answered(front: Front, tmp_path: Path) -> None:
    """The CLI's examples and coverage phases (deterministic) against the module's front."""
    config = tmp_path / "schemathesis.toml"
    config.write_text(CONFIG)
    command = [
        *(sys.executable, "-m", "schemathesis.cli", "--config-file", str(config), "--no-color"),
        *("run", str(DESCRIPTION), "--url", f"http://{front.host}:{front.port}"),
        *("--phases", "examples,coverage", "--workers", "1"),
        *("--checks", ",".join(check.__name__ for check in CHECKS)),
        *("--request-timeout", str(REQUEST_TIMEOUT)),
    ]
    run = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-20_000:] + run.stderr[-5_000:]
