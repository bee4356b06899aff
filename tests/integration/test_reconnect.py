"""A client whose connection point dies moves to another one and keeps working.

The dead connection point cannot unsubscribe its sessions; the matchers drop what it held
once its member znode goes (its ZooKeeper session ends), so nothing leaks.
"""

from __future__ import annotations

import os
import signal

from conftest import StartCluster

from broker.client import Client
from broker.cluster import LocalCluster
from broker.model.update import ContextUpdate
from integration.conftest import cluster_status, wait_until


def _held_by_matchers(cluster: LocalCluster) -> float:
    """Subscriptions the matchers hold, each counted once (not per replica); a dead process
    of another role may be in the status."""
    status = cluster_status(cluster)
    copies = sum(
        int(p.get("subscriptions", 0)) for p in status["processes"] if p["role"] == "matcher"
    )
    return copies / min(int(status["replicas"]), len(status["matchers"]))


def _room(n: int, temperature: float) -> ContextUpdate:
    return ContextUpdate.of(f"Room{n}", {"temperature": temperature}, entity_type="Room")


def test_a_client_moves_to_the_next_connection_point(start_cluster: StartCluster) -> None:
    cluster = start_cluster(matchers=2, connection_points=2, session_grace=2.0)
    first, second = cluster.endpoints
    pid_of = {p["address"]: p["pid"] for p in cluster.description["processes"]}
    with Client([first, second], timeout=30.0) as client, Client([first]) as bystander:
        hot = client.subscribe(type="Room", q="temperature>25", subscription_id="hot")
        bystander.subscribe(type="Room")  # held through the connection point that will die
        client.publish(_room(1, 30))
        assert hot.get(timeout=10).update.entity_id == "Room1"
        assert _held_by_matchers(cluster) == 2

        os.kill(pid_of[first], signal.SIGKILL)

        # The publish goes through the second connection point (resent if it was in flight),
        # and the subscription is made again there under the same id.
        def delivered_again() -> bool:
            client.publish(_room(2, 31))
            try:
                return hot.get(timeout=1).update.entity_id == "Room2"
            except Exception:
                return False

        wait_until(delivered_again, 30.0, "a notification through the second connection point")
        assert client.target == second
        assert hot.id == "hot"
        # The dead connection point's sessions leak nothing once its znode is gone.
        wait_until(
            lambda: _held_by_matchers(cluster) == 1,
            30.0,
            "the matchers to drop the dead connection point's subscriptions",
        )
