"""Updates as JSON lines: written and read back, and bad lines named precisely."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from strategies import updates

from broker.model.update import ContextUpdate
from spark_matcher.entities import InputError, update_from_json, update_to_json


@given(updates())
def test_an_update_survives_its_json_form(update: ContextUpdate) -> None:
    text = json.dumps(update_to_json(update))
    back = update_from_json(json.loads(text), strict=False)
    assert (back.entity_id, back.entity_type, back.tenant, back.service_path) == (
        update.entity_id,
        update.entity_type,
        update.tenant,
        update.service_path,
    )
    assert back.attributes == update.attributes


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ([1], "", "JSON object"),
        ({"type": "T"}, "id", "missing"),
        ({"id": "a b"}, "id", "whitespace"),
        ({"id": "a", "type": 3}, "type", "must be a string"),
        ({"id": "a", "tenant": "Upper"}, "tenant", "lowercase"),
        ({"id": "a", "servicePath": "rel"}, "servicePath", "absolute"),
        ({"id": "a", "x": 3}, "x", "JSON object"),
        ({"id": "a", "x": {"value": 1, "unit": "C"}}, "x", "unrecognized"),
        ({"id": "a", "x": {"type": "DateTime", "value": "yesterday"}}, "x", "ISO 8601"),
        ({"id": "a", "x": {"value": "<script>"}}, "x", "Invalid characters"),
        ({"id": "a", "x": {"value": 1, "metadata": {"m": 3}}}, "x", "JSON object"),
    ],
)
def test_a_bad_update_names_its_line_and_field(body: object, field: str, words: str) -> None:
    with pytest.raises(InputError) as caught:
        update_from_json(body, source="in.jsonl", line=7)
    assert caught.value.field == field
    assert words in caught.value.reason
    assert str(caught.value).startswith("in.jsonl: line 7: ")


def test_text_unrestricted_values_may_hold_any_character() -> None:
    body = {"id": "a", "x": {"type": "TextUnrestricted", "value": "<b>=(x);'\""}}
    assert update_from_json(body).attributes["x"].value == "<b>=(x);'\""
