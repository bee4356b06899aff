"""The state pass of ``silbo replay`` (spark_matcher.history), without Spark: updates applied
in order to their entities as the context store applies them."""

from __future__ import annotations

import json
from typing import Any

from spark_matcher.history import STEP, Clock, steps

START = 1_700_000_000.0


def _rows(*lines: dict[str, Any], initial: tuple[dict[str, Any], ...] = ()) -> list[Any]:
    """Rows as Spark hands them to a task: sorted by entity, initial entities first."""
    rows = [(line["id"], True, n, json.dumps(line)) for n, line in enumerate(initial)]
    rows += [(line["id"], False, n, json.dumps(line)) for n, line in enumerate(lines)]
    return sorted(rows, key=lambda r: (r[0], not r[1], r[2]))


def _run(*lines: dict[str, Any], initial: tuple[dict[str, Any], ...] = ()) -> list[Any]:
    run = steps(Clock(START), "u.jsonl", "i.jsonl")
    return sorted(run(_rows(*lines, initial=initial)), key=lambda r: r[0])


def _entity(row: Any) -> dict[str, Any]:
    text: dict[str, Any] = json.loads(row[2])
    return text


def test_each_update_is_applied_to_what_the_earlier_ones_left() -> None:
    rows = _run(
        {"id": "E", "a": {"value": 1}},
        {"id": "F", "type": "T", "b": {"value": "x"}},
        {"id": "E", "b": {"value": "y"}},
        {"id": "E", "a": {"value": 1.0}, "b": {"value": "y"}},  # 1 == 1.0: nothing changed
        {"id": "E", "a": {"value": 1, "metadata": {"unit": {"value": "m"}}}},
    )
    assert [r[0] for r in rows] == [0, 1, 2, 3, 4]
    assert [(r[3], r[4], r[5], r[6]) for r in rows] == [
        ("entityCreate", ["a"], [], ["a"]),
        ("entityCreate", ["b"], [], ["b"]),
        ("entityChange", ["b"], [], ["b"]),
        ("entityUpdate", [], [], ["a", "b"]),
        ("entityChange", [], ["a"], ["a"]),  # metadata alone
    ]
    third = _entity(rows[2])
    assert third == {
        "id": "E",
        "type": "Thing",
        "tenant": "",
        "servicePath": "/",
        "a": {"type": "Number", "value": 1, "metadata": {}},
        "b": {"type": "Text", "value": "y", "metadata": {}},
    }
    assert _entity(rows[4])["a"]["metadata"] == {"unit": {"type": "Text", "value": "m"}}
    assert all(r[7] is None and r[8] is None for r in rows)


def test_entities_are_told_apart_by_tenant_path_id_and_type() -> None:
    rows = _run(
        {"id": "E", "a": {"value": 1}},
        {"id": "E", "tenant": "t2", "a": {"value": 1}},
        {"id": "E", "servicePath": "/p", "a": {"value": 1}},
        {"id": "E", "type": "Other", "a": {"value": 1}},
        {"id": "E", "a": {"value": 1}},
    )
    assert [r[3] for r in rows] == ["entityCreate"] * 4 + ["entityUpdate"]
    assert _entity(rows[1])["tenant"] == "t2" and _entity(rows[2])["servicePath"] == "/p"


def test_times_are_given_or_a_millisecond_apart_from_the_start() -> None:
    rows = _run(
        {"id": "E", "a": {"value": 1}},
        {"id": "E", "a": {"value": 2}, "time": 1_800_000_000},
        {"id": "E", "a": {"value": 3}, "time": "2030-01-01T00:00:01.500Z"},
        {"id": "E", "a": {"value": 4}},
    )
    assert [r[1] for r in rows] == [START, 1.8e9, 1893456001.5, START + 3 * STEP]
    assert "time" not in _entity(rows[1])


def test_a_bad_line_is_a_problem_naming_its_file_line_and_field() -> None:
    rows = _run(
        {"id": "E", "a": {"value": 1}, "time": "yesterday"},
        {"id": "E", "a": {"value": 1}, "time": True},
        {"id": "E", "a": 5},
        {"id": "E", "a": {"value": 1}},
    )
    problems = [r[8] for r in rows]
    assert problems[0] == (
        "u.jsonl: line 1: time: 'yesterday' is neither epoch seconds nor an ISO 8601 date"
    )
    assert problems[1].startswith("u.jsonl: line 2: time: ")
    assert problems[2].startswith("u.jsonl: line 3: a: ")
    assert problems[3] is None and rows[3][3] == "entityCreate"  # the bad ones applied nothing
    bad_json = steps(Clock(START), "u.jsonl", "i.jsonl")([("E", False, 6, "{")])
    assert next(iter(bad_json))[8].startswith("u.jsonl: line 7: not JSON: ")


def test_initial_entities_are_there_before_the_first_update() -> None:
    initial = (
        {"id": "E", "a": {"value": 1}, "b": {"value": "x"}},
        {"id": "G", "a": {"value": 7}, "time": "bad"},
    )
    rows = _run({"id": "E", "a": {"value": 1}}, {"id": "E", "a": {"value": 2}}, initial=initial)
    assert [(r[0], r[3]) for r in rows[:2]] == [(0, "entityUpdate"), (1, "entityChange")]
    assert _entity(rows[1])["b"]["value"] == "x"  # q on b matches though the update lacks it
    [problem] = [r for r in rows if r[8] is not None]  # the initial entity's, in its file
    assert problem[8].startswith("i.jsonl: line 2: time: ")


def test_an_entity_past_its_expiry_is_gone_and_made_again() -> None:
    expires = {"type": "DateTime", "value": "2030-01-01T00:00:00.000Z"}
    rows = _run(
        {"id": "E", "a": {"value": 1}, "dateExpires": expires, "time": 1.8e9},
        {"id": "E", "a": {"value": 1}, "time": 1.8e9 + 1},
        {"id": "E", "a": {"value": 1}, "time": 1.9e9},  # after 2030-01-01
    )
    assert [r[3] for r in rows] == ["entityCreate", "entityUpdate", "entityCreate"]
    assert "dateExpires" not in _entity(rows[2])


def test_geographical_attributes_are_located() -> None:
    rows = _run(
        {"id": "E", "loc": {"type": "geo:point", "value": "40.4,-3.7"}, "a": {"value": 1}},
        {"id": "F", "a": {"value": 1}},
    )
    assert json.loads(rows[0][7]) == [["geo:point", "40.4,-3.7", {}]]
    assert rows[1][7] is None
