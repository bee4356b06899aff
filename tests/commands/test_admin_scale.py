"""``silbo admin scale matchers N`` on a cluster of ``silbo up``: it starts and retires matchers."""

from __future__ import annotations

import json
import os

import pytest
from conftest import StartCluster

from broker.cli import main
from broker.client import Client
from broker.cluster.local import read_cluster
from broker.model.update import ContextUpdate


def _matchers(state_dir: object) -> list[dict[str, object]]:
    description = read_cluster(state_dir)  # type: ignore[arg-type]
    assert description is not None
    return [p for p in description["processes"] if p["role"] == "matcher"]


def test_scale_out_and_in_through_the_command(
    start_cluster: StartCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = start_cluster(matchers=2)
    state = str(cluster.state_dir)
    with Client(cluster.endpoints) as client:
        subscriptions = [client.subscribe(id=f"Room{i}") for i in range(30)]
        assert main(["admin", "scale", "matchers", "3", "--state-dir", state, "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["outcome"] == "completed" and out["epoch"] == 2
        assert 0 < out["moved_subscriptions"] < 30 and out["no_matching_ms"] == 0
        assert set(out) >= {"duration_s", "moved_bytes"}
        added = _matchers(state)[-1]
        assert len(_matchers(state)) == 3

        client.publish(ContextUpdate.of("Room7", {"t": 1}))
        assert subscriptions[7].get(timeout=10).update.entity_id == "Room7"

        assert main(["admin", "scale", "matchers", "2", "--state-dir", state]) == 0
        assert capsys.readouterr().out.startswith("completed: matchers 3 -> 2")
        assert len(_matchers(state)) == 2
        assert not os.path.exists(f"/proc/{added['pid']}") or _zombie(int(str(added["pid"])))
        client.publish(ContextUpdate.of("Room9", {"t": 2}))
        assert subscriptions[9].get(timeout=10).update.entity_id == "Room9"


def _zombie(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split(")", 1)[1].split()[0] == "Z"


def test_a_cluster_needs_a_matcher(
    start_cluster: StartCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = start_cluster(matchers=1)
    assert main(["admin", "scale", "matchers", "0", "--state-dir", str(cluster.state_dir)]) == 2
    assert "at least one matcher" in capsys.readouterr().err


def _role(state_dir: object, role: str) -> list[dict[str, object]]:
    description = read_cluster(state_dir)  # type: ignore[arg-type]
    assert description is not None
    return [p for p in description["processes"] if p["role"] == role]


@pytest.mark.parametrize(
    ("layer", "role"),
    [
        ("exit-points", "exit-point"),
        ("access-points", "access-point"),
        ("connection-points", "connection-point"),
    ],
)
def test_every_layer_scales_out_and_in_through_the_command(
    start_cluster: StartCluster, capsys: pytest.CaptureFixture[str], layer: str, role: str
) -> None:
    cluster = start_cluster(matchers=1, grpc_port=0)
    state = str(cluster.state_dir)
    with Client(cluster.endpoints) as client:
        room = client.subscribe(id="Room1")
        assert main(["admin", "scale", layer, "2", "--state-dir", state, "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["outcome"] == "completed", out
        assert out["moved_subscriptions"] == 0
        assert len(_role(state, role)) == 2
        described = read_cluster(state)  # type: ignore[arg-type]
        assert described is not None
        assert len(described["endpoints"]) == (2 if role == "connection-point" else 1)
        client.publish(ContextUpdate.of("Room1", {"t": 1}))
        assert room.get(timeout=10).update.sequence == 1

        assert main(["admin", "scale", layer, "1", "--state-dir", state]) == 0
        assert capsys.readouterr().out.startswith(f"completed: {layer} 2 -> 1")
        assert len(_role(state, role)) == 1
        client.publish(ContextUpdate.of("Room1", {"t": 2}))
        assert room.get(timeout=10).update.sequence == 2


def test_scaling_to_the_same_size_is_rejected(
    start_cluster: StartCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = start_cluster(matchers=1)
    state = str(cluster.state_dir)
    assert main(["admin", "scale", "exit-points", "1", "--state-dir", state, "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["outcome"] == "rejected" and "nothing to change" in out["message"]


def test_a_connection_point_a_scale_adds_is_started_as_up_started_the_others(
    start_cluster: StartCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    from broker.processes import command_line

    cluster = start_cluster(matchers=1, grpc_port=0, http_port=0, log_level="WARNING")
    state = str(cluster.state_dir)
    assert main(["admin", "scale", "connection-points", "2", "--state-dir", state]) == 0
    capsys.readouterr()
    first, added = (command_line(int(str(p["pid"]))) for p in _role(state, "connection-point"))
    for command in (first, added):  # the NGSI front and the log level, as up gave them
        assert "--http-listen 127.0.0.1:0" in command and "--log-level WARNING" in command
