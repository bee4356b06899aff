"""The NGSI front's JSON codec: orjson, with the json module's answers where orjson refuses."""

from __future__ import annotations

import json
import math

import pytest

from broker.ngsi.request import dumps, loads


@pytest.mark.parametrize(
    "text",
    [
        b'{"id": "Room1", "temperature": {"value": 27.5, "type": "Number"}}',
        b'[1, -2, 3.25, true, false, null, "\\u00e9"]',
        b"123456789012345678901234567890",  # past 64 bits: orjson refuses, json reads it
        b'{"id": "urn:1234567890123456789012", "n": 12345678901234567890.5}',
    ],
)
def test_loads_reads_what_the_json_module_reads(text: bytes) -> None:
    assert loads(text) == json.loads(text)


def test_loads_past_orjsons_depth_limit_is_the_json_modules_recursion_error() -> None:
    with pytest.raises(RecursionError):  # read_json answers it "nested deeper than 64"
        loads(b"[" * 5000 + b"]" * 5000)


def test_loads_keeps_the_json_modules_nan() -> None:
    assert math.isnan(loads(b"NaN"))


def test_loads_refuses_what_is_not_json() -> None:
    with pytest.raises(ValueError):
        loads(b"{'a': 1}")


@pytest.mark.parametrize(
    "value", [{"a": [1, 2.5, None, True, "é"]}, [], 2**70, {1: "non-string key"}, "x"]
)
def test_dumps_round_trips_through_the_json_module(value: object) -> None:
    assert json.loads(dumps(value)) == json.loads(json.dumps(value))
