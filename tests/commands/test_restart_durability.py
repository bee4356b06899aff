"""A cluster started again from its state directory is the cluster it was: its HTTP
subscriptions (with their statuses) and registrations are there and fire, and each layer
has the size it was scaled to; ``silbo down --purge`` starts from nothing (broker.cluster.durable).

Real commands as a user runs them: ``silbo up --detach``, ``silbo admin scale``, ``silbo
down``, each its own process, with an embedded ZooKeeper on the state directory.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from ngsi.conftest import Front, Receiver, free_port

from broker.cluster.durable import clear_previous_run, layout_of, read_layout, write_layout
from broker.commands.up import layer_sizes
from broker.coordination.client import connect
from broker.coordination.embedded import EmbeddedZooKeeper

pytestmark = pytest.mark.slow

SILBO = [sys.executable, "-m", "broker.cli"]


def _silbo(*args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [*SILBO, *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, f"silbo {' '.join(args)}: {done.stdout}\n{done.stderr}"
    return done


def _cluster(state_dir: Path) -> dict[str, Any]:
    found: dict[str, Any] = json.loads((state_dir / "cluster.json").read_text())
    return found


def _roles(state_dir: Path) -> dict[str, int]:
    return layout_of(_cluster(state_dir)["processes"])


def test_subscriptions_and_sizes_survive_down_and_up(tmp_path: Path) -> None:
    state = tmp_path / "state"
    http = free_port()
    up = ["up", "--detach", "--state-dir", str(state), "--grpc-port", "0"]
    up += ["--http-port", str(http), "--log-level", "WARNING"]
    receiver = Receiver()
    try:
        _silbo(*up)
        front = Front(f"127.0.0.1:{http}")
        front.wait_serving()
        created = front.call(
            "POST",
            "/v2/subscriptions",
            {
                "description": "kept",
                "subject": {"entities": [{"idPattern": "^Room"}]},
                "notification": {"http": {"url": receiver.url()}},
            },
        )
        assert created.status == 201, created
        sid = created.headers["Location"].rsplit("/", 1)[1]
        registration = {
            "description": "kept too",
            "dataProvided": {"entities": [{"id": "Lamp1", "type": "Lamp"}], "attrs": ["on"]},
            "provider": {"http": {"url": receiver.url()}},
        }
        registered = front.call("POST", "/v2/registrations", registration)
        assert registered.status == 201, registered
        rid = registered.headers["Location"].rsplit("/", 1)[1]
        assert front.call("POST", "/v2/entities", {"id": "Room1", "t": {"value": 1}}).status == 201
        receiver.wait_for(1)
        _silbo("admin", "scale", "matchers", "3", "--state-dir", str(state))
        assert _roles(state)["matchers"] == 3
        _silbo("down", "--state-dir", str(state))

        _silbo(*up)  # no counts given: the sizes it had
        assert _roles(state) == {
            "matchers": 3,
            "access_points": 1,
            "exit_points": 1,
            "connection_points": 1,
            "context_stores": 2,
        }
        front.wait_serving()
        listed = front.call("GET", f"/v2/subscriptions/{sid}")
        assert listed.status == 200, listed
        assert listed.body["description"] == "kept"
        assert listed.body["notification"]["timesSent"] >= 1  # its status came back too
        kept = front.call("GET", f"/v2/registrations/{rid}")
        assert kept.status == 200, kept
        assert kept.body["description"] == "kept too"
        assert kept.body["dataProvided"]["attrs"] == ["on"]
        # It fires again once a front adopted it (at once: the old owners were cleared).
        deadline = time.monotonic() + 30
        while not any(n.body["data"][0]["t"]["value"] == 2 for n in receiver.received()):
            assert time.monotonic() < deadline, "the kept subscription never fired after up"
            front.call("POST", "/v2/entities?options=upsert", {"id": "Room1", "t": {"value": 2}})
            time.sleep(0.2)

        _silbo("down", "--state-dir", str(state), "--purge")
        assert not (state / "zookeeper" / "data").exists()
        assert read_layout(state) == {}
        _silbo(*up)
        assert _roles(state)["matchers"] == 2
        front.wait_serving()
        assert front.call("GET", f"/v2/subscriptions/{sid}").status == 404
        assert front.call("GET", f"/v2/registrations/{rid}").status == 404
    finally:
        receiver.close()
        subprocess.run([*SILBO, "down", "--state-dir", str(state)], timeout=60, check=False)


def test_an_explicit_count_wins_over_the_kept_one(tmp_path: Path) -> None:
    write_layout(
        tmp_path,
        {"matchers": 4, "access_points": 2, "exit_points": 1, "connection_points": 1},
    )
    parser_args = {
        "state_dir": str(tmp_path),
        "zk": None,
        "matchers": 1,
        "access_points": None,
        "exit_points": None,
        "connection_points": None,
        "context_stores": None,
    }
    kept = {"exit_points": 1, "connection_points": 1, "context_stores": 2}
    sizes = layer_sizes(argparse.Namespace(**parser_args))
    assert sizes == {"matchers": 1, "access_points": 2, **kept}
    # an external ZooKeeper's cluster is not this state directory's to remember
    sizes = layer_sizes(argparse.Namespace(**{**parser_args, "zk": "127.0.0.1:1"}))
    assert sizes == {"matchers": 1, "access_points": 1, **kept}


@pytest.mark.parametrize("text", ["", "[]", "{", '{"matchers": "3"}', '{"matchers": 0}'])
def test_a_layout_file_that_is_not_ours_is_ignored(tmp_path: Path, text: str) -> None:
    (tmp_path / "layout.json").write_text(text)
    assert read_layout(tmp_path) == {}


def test_clear_previous_run_leaves_the_subscriptions(zookeeper: EmbeddedZooKeeper) -> None:
    client = connect(zookeeper.address, cluster=f"clear-{uuid.uuid4().hex[:8]}", timeout=10.0)
    try:
        for path in (
            "/ngsi/subscriptions/a",
            "/ngsi/status/a",
            "/ngsi/owners/a",
            "/ngsi/fronts/cp-1",
            "/members/matcher/matcher-x-0000000001",
            "/scale/ready/m1",
        ):
            client.create(path, b"{}", makepath=True)
        assert clear_previous_run(client) == 4
        assert client.get_children("/ngsi/subscriptions") == ["a"]
        assert client.get_children("/ngsi/status") == ["a"]
        assert client.get_children("/ngsi/owners") == []
        assert client.get_children("/members/matcher") == []
        assert client.exists("/scale") is None
    finally:
        client.stop()
        client.close()
