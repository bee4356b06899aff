"""``silbo get`` / ``silbo query`` and the client's reads, against a real cluster.

Entities are written through the NGSI v2 front (the context store applies them) and read
back through the gRPC client API of the connection point: the same answers as the front's
``GET``, a table or JSON on the command line, typed errors for what the user can fix.
"""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from conftest import StartCluster
from ngsi.conftest import fronts_of

from broker.cli import build_parser
from broker.client import Client
from broker.commands import read
from broker.errors import InvalidInput, NotFound


def _run(argv: list[str]) -> tuple[int, str]:
    args = build_parser().parse_args(argv)
    out = io.StringIO()
    status = args.handler(args, out) if args.handler in (read.run_get, read.run_query) else 1
    return status, out.getvalue()


def test_reads_through_the_client_and_the_command_line(
    start_cluster: StartCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = start_cluster(matchers=1, http_port=0)  # any port: cluster.json names it
    [front] = fronts_of(cluster)
    described = json.loads((cluster.state_dir / "cluster.json").read_text())
    assert described["http_endpoints"] == [f"{front.host}:{front.port}"] and front.port
    headers = {"Fiware-Service": "acme", "Fiware-ServicePath": "/madrid"}
    for i in range(5):
        body: dict[str, Any] = {
            "id": f"Room{i}",
            "type": "Room",
            "temperature": {"type": "Number", "value": 20 + i},
            "name": {"type": "Text", "value": f"room {i}"},
        }
        assert front.call("POST", "/v2/entities", body, headers=headers).status == 201
    grpc = cluster.endpoints[0]
    with Client(grpc) as client:
        entity = client.get_entity("Room3", tenant="acme")
        assert entity["temperature"] == {"type": "Number", "value": 23, "metadata": {}}
        hot, count = client.query(tenant="acme", q="temperature>21", orderBy="!temperature")
        assert [e["id"] for e in hot] == ["Room4", "Room3", "Room2"] and count == 3
        values, _ = client.query(tenant="acme", options="keyValues", limit="1", attrs="name")
        assert values == [{"id": "Room0", "type": "Room", "name": "room 0"}]
        nowhere, none = client.query(tenant="acme", service_path="/barcelona")
        assert (nowhere, none) == ([], 0)
        with pytest.raises(NotFound):
            client.get_entity("Room9", tenant="acme")
        with pytest.raises(InvalidInput, match="limit"):
            client.query(tenant="acme", limit="5000")
        with pytest.raises(InvalidInput):
            client.query(tenant="acme", q="temperature>>")
    status, out = _run(["get", "Room1", "--tenant", "acme", "--connect", grpc])
    assert status == 0
    lines = out.splitlines()
    assert lines[0].split() == ["id", "type", "temperature", "name"]
    assert lines[2].split()[:3] == ["Room1", "Room", "21"]
    status, out = _run(["get", "Room1", "--tenant", "acme", "--json", "--connect", grpc])
    assert status == 0 and json.loads(out)["name"]["value"] == "room 1"
    args = ["query", "--tenant", "acme", "--q", "temperature<22", "--connect", grpc]
    status, out = _run(args)
    assert status == 0 and out.splitlines()[-1] == "2 of 2 entities"
    status, out = _run(["query", "--tenant", "acme", "--limit", "2", "--json", "--connect", grpc])
    assert status == 0 and [e["id"] for e in json.loads(out)] == ["Room0", "Room1"]
    status, _out = _run(["get", "Nope", "--tenant", "acme", "--connect", grpc])
    assert status == 2
    assert "silbo get: error: The requested entity has not been found" in capsys.readouterr().err
    status, _out = _run(["query", "--q", "a==", "--connect", grpc])
    assert status == 2 and "silbo query: error:" in capsys.readouterr().err


def test_the_table_lines_up_every_attribute() -> None:
    rendered = read.table(
        [
            {"id": "A", "type": "T", "x": {"type": "Number", "value": 1}},
            {"id": "B", "type": "T", "y": {"type": "Text", "value": "a" * 60}},
        ]
    )
    header, rule, first, second = rendered.splitlines()
    assert header.split() == ["id", "type", "x", "y"]
    assert set(rule.replace(" ", "")) == {"-"}
    assert first.split() == ["A", "T", "1"]
    assert second.split()[-1].endswith("...") and len(second.split()[-1]) == 40
