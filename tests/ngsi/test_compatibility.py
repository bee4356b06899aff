"""docs/ngsi.md's compatibility table against the OpenAPI description (docs/openapi.yaml).

The table ("Compatibility with Orion", columns ``Orion feature | Silbo``) has one row per
operation of the description, named ``METHOD path`` as the description writes it, and rows
for Orion's features that are not routes. These tests keep it from drifting from the code:
an operation added to the description (which ``test_openapi`` holds to the routes served)
without a row, a row of an operation the description no longer has, a second row of one
operation, and an answer that is not ``works``, ``works, except: <reason>`` or
``no: <reason>`` (the reason at most ``MAX_REASON`` characters) all fail. No process runs.
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

DOCS = Path(__file__).resolve().parents[2] / "docs"
SECTION = "## Compatibility with Orion"
HEADER = ("Orion feature", "Silbo")
MAX_REASON = 160  # characters of a reason
ANSWER = re.compile(r"works|works, except: (?P<except>.+)|no: (?P<no>.+)")
_METHODS = ("GET", "PUT", "POST", "DELETE", "PATCH", "HEAD", "OPTIONS", "TRACE")
# a row that names a request: ``METHOD /path`` (in backticks or not)
_OPERATION = re.compile(rf"({'|'.join(_METHODS)}) (/\S*)")

Row = tuple[str, str]  # (Orion feature, Silbo)
Operation = tuple[str, str]  # (method, path)


def described(document: dict[str, Any]) -> set[Operation]:
    """(method, path) of every operation of an OpenAPI document."""
    return {
        (method.upper(), path)
        for path, operations in document["paths"].items()
        for method in operations
        if method.upper() in _METHODS
    }


def table(text: str) -> list[Row]:
    """The rows of the compatibility table of docs/ngsi.md's text (its first table after
    ``SECTION``, header and separator left out)."""
    start = text.index(SECTION + "\n")
    following = text.find("\n## ", start + len(SECTION))
    lines = text[start : following if following != -1 else len(text)].splitlines()
    body = [line for line in lines if line.startswith("|")]
    rows = []
    for line in body:
        cells = [cell.strip() for cell in line.strip()[1:-1].split("|")]
        assert len(cells) == 2, f"not two cells: {line}"
        rows.append((cells[0], cells[1]))
    assert rows[0] == HEADER, f"the header is {rows[0]}, not {HEADER}"
    assert set(rows[1][0] + rows[1][1]) <= {"-", ":"}, f"no separator row: {rows[1]}"
    return rows[2:]


def operation(feature: str) -> Operation | None:
    """The operation a row names (``GET /v2/entities``), or None for another feature."""
    match = _OPERATION.fullmatch(feature.replace("`", ""))
    return (match[1], match[2]) if match else None


def problems(rows: list[Row], operations: set[Operation]) -> list[str]:
    """What is wrong with the table, given the description's operations."""
    found = []
    named = Counter(op for feature, _ in rows if (op := operation(feature)) is not None)
    for method, path in sorted(operations - set(named)):
        found.append(f"no row for {method} {path}")
    for method, path in sorted(set(named) - operations):
        found.append(f"a row for {method} {path}, which the description does not have")
    for (method, path), count in sorted(named.items()):
        if count > 1:
            found.append(f"{count} rows for {method} {path}")
    for feature, count in sorted(Counter(feature for feature, _ in rows).items()):
        if count > 1:
            found.append(f"{count} rows for {feature}")
    for feature, answer in rows:
        match = ANSWER.fullmatch(answer)
        if match is None:
            found.append(f"{feature}: {answer!r} is not 'works', 'works, except: ' or 'no: '")
            continue
        reason = match["except"] or match["no"] or ""
        if len(reason) > MAX_REASON:
            found.append(f"{feature}: a reason of {len(reason)} characters (> {MAX_REASON})")
    return found


@functools.cache
def _rows() -> list[Row]:
    return table((DOCS / "ngsi.md").read_text())


@functools.cache
def _operations() -> set[Operation]:
    return described(yaml.safe_load((DOCS / "openapi.yaml").read_text()))


def test_the_table_matches_the_description() -> None:
    assert problems(_rows(), _operations()) == []
    assert len(_rows()) > len(_operations())  # Orion's other features have rows too


def test_a_route_without_a_row_is_found() -> None:
    added = _operations() | {("POST", "/v2/entities/{id}/attrs/{attr}/clone")}
    found = problems(_rows(), added)
    assert "no row for POST /v2/entities/{id}/attrs/{attr}/clone" in found


def test_a_row_of_no_route_and_a_second_row_are_found() -> None:
    rows = [*_rows(), ("`GET /v2/things`", "works"), ("`GET /v2`", "no: twice")]
    found = problems(rows, _operations())
    assert "a row for GET /v2/things, which the description does not have" in found
    assert "2 rows for GET /v2" in found
    assert "2 rows for `GET /v2`" in found


def test_answers_of_another_form_are_found() -> None:
    rows = [
        ("a", "works (mostly)"),
        ("b", "no"),
        ("c", "works, except:"),
        ("d", "no: " + "x" * (MAX_REASON + 1)),
        ("e", "partly: it depends"),
    ]
    assert problems(rows, set()) == [
        "a: 'works (mostly)' is not 'works', 'works, except: ' or 'no: '",
        "b: 'no' is not 'works', 'works, except: ' or 'no: '",
        "c: 'works, except:' is not 'works', 'works, except: ' or 'no: '",
        f"d: a reason of {MAX_REASON + 1} characters (> {MAX_REASON})",
        "e: 'partly: it depends' is not 'works', 'works, except: ' or 'no: '",
    ]


def test_operation_rows_are_recognised() -> None:
    assert operation("`GET /v2/entities/{id}`") == ("GET", "/v2/entities/{id}")
    assert operation("PATCH /v2/subscriptions/{sid}") == ("PATCH", "/v2/subscriptions/{sid}")
    assert operation("CORS (`-corsOrigin`, `-corsMaxAge`)") is None
    assert operation("Orion's admin API (`/admin/log`)") is None
