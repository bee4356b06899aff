"""Custom notifications without a cluster: httpCustom templates (macros, ``payload``,
``json``, ``ngsi``) compiled, validated and filled; how the delivery worker renders a
templated request; the X-Auth-Token carried with an update; the CORS middleware."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp import ClientSession
from aiohttp.test_utils import TestServer

from broker.cluster.local import ClusterSpec
from broker.errors import InvalidInput
from broker.ngsi.allow import AllowList
from broker.ngsi.change import Alteration, Change, read_change, with_change
from broker.ngsi.delivery import Config, _Custom, _Entity, _Subscription, _target
from broker.ngsi.entity import to_wire
from broker.ngsi.front import FrontOptions, application, delivery_config
from broker.ngsi.routes import add_routes
from broker.ngsi.subscriptions import HttpSubscription, parse_document
from broker.ngsi.templates import (
    Context,
    Macro,
    compile_json,
    compile_ngsi,
    compile_text,
    fill_json,
    fill_ngsi,
    fill_text,
)
from broker.runtime.options import ProcessOptions, Role

ALLOW = AllowList.parse()
URL = "http://localhost:9/n"
ATTRIBUTES: dict[str, dict[str, Any]] = {
    "temperature": {"type": "Number", "value": 21.5, "metadata": {}},
    "name": {"type": "Text", "value": "room one", "metadata": {}},
    "on": {"type": "Boolean", "value": True, "metadata": {}},
    "shape": {"type": "StructuredValue", "value": {"a": [1, 2]}, "metadata": {}},
    "nothing": {"type": "None", "value": None, "metadata": {}},
    "service": {"type": "Text", "value": "an attribute", "metadata": {}},
}
CONTEXT = Context("R1", "Room", "tenant", "/floor", "tok", ATTRIBUTES)


def subscription(custom: dict[str, Any], **notification: Any) -> dict[str, Any]:
    return {
        "subject": {"entities": [{"idPattern": ".*"}]},
        "notification": {"httpCustom": {"url": URL, **custom}, **notification},
    }


# -- macros ---------------------------------------------------------------------------------


def test_text_macros_fill_builtins_and_attributes() -> None:
    text = compile_text(
        "${id}/${type}/${service}${servicePath}/${authToken}: ${temperature} ${name} ${on} "
        "${shape} ${nothing} [${missing}] ${",
        "t",
    )
    assert fill_text(text, CONTEXT) == (
        'R1/Room/tenant/floor/tok: 21.5 room one true {"a":[1,2]} null [] ${'
    )


def test_a_builtin_wins_over_an_attribute_of_its_name() -> None:
    assert fill_text(compile_text("${service}", "t"), CONTEXT) == "tenant"


def test_text_without_macros_compiles_to_itself() -> None:
    assert compile_text("plain", "t") == ("plain",)
    assert compile_text("", "t") == ()


@pytest.mark.parametrize(
    ("macro", "said"),
    [
        ("${temperature|toFixed(1)}", "JEXL transformation"),
        ("${a * 2}", "not a plain name"),
        ("${a+b}", "not a plain name"),
        ("${}", "not a plain name"),
        ("${'x'}", "not a plain name"),
    ],
)
def test_jexl_is_refused_with_a_clear_message(macro: str, said: str) -> None:
    with pytest.raises(InvalidInput, match=said) as caught:
        compile_text(f"x {macro} y", "notification.httpCustom.payload")
    assert "JEXL is not supported" in str(caught.value)
    assert "notification.httpCustom.payload" in str(caught.value)


def test_json_takes_typed_values_for_a_whole_macro_and_text_otherwise() -> None:
    template = compile_json(
        {
            "t": "${temperature}",
            "s": "${shape}",
            "text": "T=${temperature}",
            "missing": "${missing}",
            "list": ["${on}", 3, None, {"deep": "${id}"}],
            "plain": "no macro",
        },
        "json",
    )
    assert template.value["t"] == Macro("temperature")
    assert fill_json(template, CONTEXT) == {
        "t": 21.5,
        "s": {"a": [1, 2]},
        "text": "T=21.5",
        "missing": None,
        "list": [True, 3, None, {"deep": "R1"}],
        "plain": "no macro",
    }
    assert fill_json(compile_json(["${id}"], "json"), CONTEXT) == ["R1"]


@pytest.mark.parametrize("value", ["text", 3, None, True])
def test_json_must_be_an_object_or_an_array(value: Any) -> None:
    with pytest.raises(InvalidInput, match="must be a JSON object or array"):
        compile_json(value, "notification.httpCustom.json")


def test_ngsi_sets_id_type_and_attributes_with_inferred_types() -> None:
    patch = compile_ngsi(
        {
            "id": "${id}-copy",
            "type": "Copy",
            "t": {"value": "${temperature}"},
            "label": {"type": "Text", "value": "at ${servicePath}"},
            "gone": {"value": "${missing}"},
        },
        "ngsi",
    )
    entity_id, entity_type, attributes = fill_ngsi(patch, CONTEXT)
    assert (entity_id, entity_type) == ("R1-copy", "Copy")
    assert attributes == {
        "t": {"type": "Number", "value": 21.5, "metadata": {}},
        "label": {"type": "Text", "value": "at /floor", "metadata": {}},
        "gone": {"type": "None", "value": None, "metadata": {}},
    }
    assert fill_ngsi(compile_ngsi({}, "ngsi"), CONTEXT) == (None, None, {})


@pytest.mark.parametrize(
    ("fragment", "said"),
    [
        ([], "must be a JSON object"),
        ({"id": 3}, "id must be a non-empty string"),
        ({"type": ""}, "type must be a non-empty string"),
        ({"a": 1}, "must be an attribute object"),
        ({"a": {"value": 1, "metadata": {"m": {"value": 1}}}}, "metadata is not allowed"),
        ({"a": {"value": 1, "extra": 1}}, "unrecognized field 'extra'"),
        ({"a": {"type": 3, "value": 1}}, "a.type must be a non-empty string"),
        ({"a b": {"value": 1}}, "is not an attribute name"),
        ({"a": {"value": "${x|f}"}}, "JEXL"),
    ],
)
def test_ngsi_refusals(fragment: Any, said: str) -> None:
    with pytest.raises(InvalidInput, match=said):
        compile_ngsi(fragment, "notification.httpCustom.ngsi")


# -- subscriptions --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("custom", "said"),
    [
        ({"payload": "a", "json": {}}, "only one of payload, json or ngsi"),
        ({"json": {}, "ngsi": {}}, "only one of payload, json or ngsi"),
        ({"payload": 3}, "payload must be a string"),
        ({"json": "x"}, "json must be a JSON object or array"),
        ({"ngsi": []}, "ngsi must be a JSON object"),
        ({"payload": "${a|b}"}, "JEXL is not supported"),
        ({"headers": {"X-A": "${a b}"}}, "headers.X-A: .*JEXL is not supported"),
        ({"qs": {"q": "${a()}"}}, "qs.q: .*JEXL is not supported"),
        ({"url": "http://${host}/n"}, "scheme, host or port"),
        ({"url": "http://localhost:${port}/n"}, "scheme, host or port"),
        ({"url": "http://localhost/${a.b()}"}, "JEXL is not supported"),
    ],
)
def test_bad_custom_subscriptions_are_400(custom: dict[str, Any], said: str) -> None:
    with pytest.raises(InvalidInput, match=said):
        parse_document(subscription(custom), ALLOW)


def test_custom_subscriptions_keep_their_templates_as_given() -> None:
    custom = {
        "url": "http://localhost:9/${id}",
        "qs": {"t": "${type}"},
        "headers": {"X-Id": "${id}"},
        "json": {"v": "${temperature}"},
    }
    parsed = parse_document(subscription(custom), ALLOW)
    assert parsed.channel.body == ("json", {"v": "${temperature}"})
    assert parsed.channel.templated()
    shown = HttpSubscription("s" * 24, "", "/#", parsed).to_json(0.0)
    assert shown["notification"]["httpCustom"] == custom
    plain = parse_document(subscription({"payload": None}), ALLOW)
    assert plain.channel.body == ("payload", None) and not plain.channel.templated()


def headers_of(config: Config) -> dict[str, str]:
    return {k.lower(): v for k, v in config.headers}


def test_delivery_headers_follow_the_body_and_custom_headers_win_but_for_the_format() -> None:
    text = delivery_config(parse_document(subscription({"payload": "hi"}), ALLOW))
    assert headers_of(text)["content-type"] == "text/plain; charset=utf-8"
    assert headers_of(text)["ngsiv2-attrsformat"] == "custom"
    own = {"payload": "x", "headers": {"content-type": "text/csv", "Ngsiv2-AttrsFormat": "no"}}
    overridden = headers_of(delivery_config(parse_document(subscription(own), ALLOW)))
    assert (overridden["content-type"], overridden["ngsiv2-attrsformat"]) == ("text/csv", "custom")
    nothing = headers_of(delivery_config(parse_document(subscription({"payload": None}), ALLOW)))
    assert "content-type" not in nothing
    ngsi = subscription({"ngsi": {}}, attrsFormat="keyValues")
    shaped = headers_of(delivery_config(parse_document(ngsi, ALLOW)))
    assert shaped["content-type"] == "application/json; charset=utf-8"
    assert shaped["ngsiv2-attrsformat"] == "keyValues"
    removed = subscription({"headers": {"Accept": ""}})
    target, _service = _target(delivery_config(parse_document(removed, ALLOW)))
    assert target is not None and b"Accept" not in target.prefix


# -- the worker's rendering -----------------------------------------------------------------


def published(token: str = "tok", tenant: str = "tenant") -> _Entity:
    entity = to_wire("R1", "Room", tenant, "/floor", ATTRIBUTES)
    change = Change(Alteration.CHANGE, frozenset({"temperature"}), correlator="corr")
    return _Entity(with_change(entity, change, None, token).SerializeToString())


def worker_subscription(document: dict[str, Any]) -> _Subscription:
    config = delivery_config(parse_document(document, ALLOW))
    target, service = _target(config)
    own_token = any(k.lower() == "x-auth-token" for k, _v in config.headers)
    wrapper = b'{"subscriptionId":"%s","data":[' % (b"s" * 24)
    return _Subscription(
        "s" * 24, config, 1, target, service, wrapper, _Custom.compile(config), own_token
    )


def rendered(document: dict[str, Any], one: _Entity | None = None) -> tuple[str, bytes]:
    """The request head (up to the worker's own per-request lines) and the body."""
    sub = worker_subscription(document)
    assert sub.custom is not None
    target, _service, body = sub.custom.render(sub, one or published())
    return target.prefix.decode(), body


def test_a_plain_subscription_compiles_to_no_template() -> None:
    plain = {"subject": {"entities": [{"id": "R1"}]}, "notification": {"http": {"url": URL}}}
    assert worker_subscription(plain).custom is None
    assert worker_subscription(subscription({"headers": {"X-A": "b"}})).custom is None


def test_the_worker_fills_url_qs_headers_and_a_text_payload() -> None:
    head, body = rendered(
        subscription(
            {
                "url": "http://localhost:9/rooms/${id}?fixed=1",
                "method": "PUT",
                "qs": {"t": "${temperature}", "who": "${name}"},
                "headers": {"X-Room": "${type}/${id}", "X-Gone": "${missing}"},
                "payload": "The temperature of ${id} is ${temperature} (${missing})",
            }
        )
    )
    assert head.startswith("PUT /rooms/R1?fixed=1&t=21.5&who=room+one HTTP/1.1\r\n")
    assert "X-Room: Room/R1\r\n" in head
    assert "X-Gone" not in head  # filled empty: not sent
    assert "Content-Type: text/plain; charset=utf-8\r\n" in head
    assert body == b"The temperature of R1 is 21.5 ()"


def test_payload_null_sends_no_body_and_json_is_typed() -> None:
    assert rendered(subscription({"payload": None}))[1] == b""
    _head, body = rendered(subscription({"json": {"t": "${temperature}", "a": ["${on}"]}}))
    assert json.loads(body) == {"t": 21.5, "a": [True]}


def test_ngsi_patches_the_notified_entity_in_its_format() -> None:
    document = subscription(
        {"ngsi": {"id": "${id}-x", "extra": {"value": "${temperature}"}}},
        attrs=["temperature"],
        attrsFormat="keyValues",
    )
    _head, body = rendered(document)
    assert json.loads(body) == {
        "subscriptionId": "s" * 24,
        "data": [{"id": "R1-x", "type": "Room", "temperature": 21.5, "extra": 21.5}],
    }
    simplified = subscription({"ngsi": {"type": "T"}}, attrsFormat="simplifiedKeyValues")
    assert json.loads(rendered(simplified)[1])["type"] == "T"


def test_a_filled_header_that_cannot_be_sent_is_a_value_error() -> None:
    sub = worker_subscription(subscription({"headers": {"X-Name": "${name}"}}))
    assert sub.custom is not None
    attributes = {**ATTRIBUTES, "name": {"type": "Text", "value": "a\r\nb", "metadata": {}}}
    entity = to_wire("R1", "Room", "", "/", attributes)
    one = _Entity(with_change(entity, Change(Alteration.CHANGE)).SerializeToString())
    with pytest.raises(ValueError, match="line break"):
        sub.custom.render(sub, one)


def test_the_auth_token_travels_with_the_change_and_heads_the_entity_lines() -> None:
    one = published("secret-1")
    assert one.decode()[1].auth_token == "secret-1"
    service, token, rest = one.header_lines()
    assert token == b"X-Auth-Token: secret-1\r\n"
    assert service == b"Fiware-Service: tenant\r\n"
    assert rest.startswith(b"Fiware-ServicePath: /floor\r\n")
    assert published("").header_lines()[1] == b""
    with_builtins = with_change(
        to_wire("E", "T", "", "/", {}), Change(Alteration.CREATE), ({}, [0.0, 0.0]), "t2"
    )
    again = read_change(with_builtins.SerializeToString())
    assert again.auth_token == "t2" and "dateCreated" in again.attributes
    assert read_change(published("").data).auth_token == ""


def test_a_subscription_naming_x_auth_token_does_not_forward_the_updates() -> None:
    assert worker_subscription(subscription({"headers": {"X-Auth-Token": ""}})).own_token
    assert worker_subscription(subscription({"headers": {"x-auth-token": "${id}"}})).own_token
    assert not worker_subscription(subscription({"payload": "x"})).own_token


def test_configs_cross_the_pipe_whole() -> None:
    config = delivery_config(
        parse_document(
            subscription({"url": "http://localhost/${id}", "qs": {"a": "${b}"}, "ngsi": {}}), ALLOW
        )
    )
    assert Config.from_list(config.to_list()) == config
    assert config.templated and config.qs == (("a", "${b}"),) and config.url.endswith("/${id}")
    old = config.to_list()[:12]  # a config from a release without templates
    assert Config.from_list(old).body is None


# -- CORS -----------------------------------------------------------------------------------


def answers(options: FrontOptions, requests: list[tuple[str, str, dict[str, str]]]) -> list[Any]:
    """(status, headers) of each request to a front's application (its real routes and
    middlewares, no cluster behind: only requests that need none)."""

    async def scenario() -> list[Any]:
        app = application(options)
        front = SimpleNamespace(address="here", port=SimpleNamespace(name="cp"), entities=None)
        add_routes(app, front)  # type: ignore[arg-type]
        server = TestServer(app)
        await server.start_server()
        out = []
        try:
            async with ClientSession() as session:
                for method, path, headers in requests:
                    async with session.request(
                        method, server.make_url(path), headers=headers
                    ) as got:
                        await got.read()
                        out.append((got.status, got.headers))
        finally:
            await server.close()
        return out

    return asyncio.run(scenario())


def test_cors_preflight_and_headers_on_every_answer() -> None:
    origin = {"Origin": "https://app.example.com"}
    preflight, listed, error, stranger, unknown = answers(
        FrontOptions("127.0.0.1:0", cors_origin="https://app.example.com", cors_max_age=600),
        [
            ("OPTIONS", "/v2/subscriptions", origin),
            ("GET", "/version", origin),
            ("GET", "/v2/subscriptions?limit=0", origin),
            ("GET", "/version", {"Origin": "https://evil.example.com"}),
            ("OPTIONS", "/v2/nowhere", origin),
        ],
    )
    status, headers = preflight
    assert status == 200
    assert headers["Access-Control-Allow-Origin"] == "https://app.example.com"
    assert headers["Access-Control-Allow-Methods"] == "GET, POST, OPTIONS"
    assert "X-Auth-Token" in headers["Access-Control-Allow-Headers"]
    assert headers["Access-Control-Max-Age"] == "600"
    for _status, headers in (listed, error):
        assert headers["Access-Control-Allow-Origin"] == "https://app.example.com"
        assert headers["Access-Control-Expose-Headers"] == (
            "Location, Fiware-Total-Count, Fiware-Correlator"
        )
    assert listed[0] == 200 and error[0] == 400  # limit=0: an error answer has them too
    assert "Access-Control-Allow-Origin" not in stranger[1]
    assert unknown[0] == 400 and "Access-Control-Allow-Methods" not in unknown[1]


def test_cors_for_any_origin_and_off_by_default() -> None:
    origin = {"Origin": "http://x.example"}
    [(status, headers)] = answers(
        FrontOptions("127.0.0.1:0", cors_origin="__ALL"),
        [("OPTIONS", "/v2/entities/E1/attrs/a/value", origin)],
    )
    assert status == 200 and headers["Access-Control-Allow-Origin"] == "*"
    assert headers["Access-Control-Allow-Methods"] == "GET, PUT, OPTIONS"
    assert headers["Access-Control-Max-Age"] == "86400"
    [(status, headers)] = answers(FrontOptions("127.0.0.1:0"), [("OPTIONS", "/v2", origin)])
    assert status == 405 and "Access-Control-Allow-Origin" not in headers


def test_cors_options_are_checked() -> None:
    with pytest.raises(InvalidInput, match="--cors-max-age"):
        ClusterSpec(cors_max_age=-1)
    with pytest.raises(InvalidInput, match="--cors-origin"):
        ClusterSpec(cors_origin="a\nb")
    with pytest.raises(InvalidInput, match="--cors-max-age"):
        ProcessOptions(Role.CONNECTION_POINT, zk="h:1", cors_max_age=-5)
    ProcessOptions(Role.CONNECTION_POINT, zk="h:1", cors_origin="__ALL", cors_max_age=0)
