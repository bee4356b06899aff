"""Automatic scaling on real processes: a saturated layer is scaled out, a standby takes over.

One cluster with two controllers (``silbo up --autoscale``'s ``silbo autoscaler`` processes,
observing every 0.5 s), its access point capped at 100 items/s (``--max-rate``) and offered
about 250 updates a second, with short windows and at most 2 access points set through
``silbo admin autoscale set``:

- the leader scales the access points out, 1 -> 2, recorded with its reason and outcome;
- the leader is killed (SIGKILL) and a decision it recorded is left in flight: the standby
  leads once the killed one's session ends and carries that decision out (2 -> 3, the
  maximum raised to 3 meanwhile); the killed one started again (as the supervisor does)
  stands by;
- pre-warming and its cancellation, as the leader carries them out, start an idle exit
  point (registered, outside the configuration) and stop it again; a scale-out of the
  context stores (their own protocol) adds a store;
- ``silbo admin autoscale`` refuses bad knobs (exit 2, the problem named) and shows the
  leader and the decisions; ``silbo admin status`` shows the autoscaler line.
"""

from __future__ import annotations

import argparse
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import StartCluster

from broker.autoscale import Decision, Kind
from broker.autoscale.controller import LiveCluster
from broker.autoscale.state import AutoscaleState
from broker.client import Client
from broker.commands.admin import run_autoscale
from broker.coordination.client import connect
from broker.coordination.configuration import ClusterConfiguration
from broker.coordination.membership import members
from broker.model.update import ContextUpdate
from integration.conftest import cluster_status, wait_until

CAP = 100.0  # items a second an access point takes in
OFFERED = 250.0  # updates a second


def _offered(stop: threading.Event) -> Iterator[ContextUpdate]:
    started = time.monotonic()
    n = 0
    while not stop.is_set():
        ahead = started + n / OFFERED - time.monotonic()
        if ahead > 0:
            time.sleep(ahead)
        yield ContextUpdate.of(f"Room{n % 50}", {"temperature": 20}, entity_type="Room")
        n += 1


def _admin(cluster: Any, action: str, *settings: str, json: bool = False) -> int:
    args = argparse.Namespace(
        action=action,
        settings=list(settings),
        zk=cluster.zk_address,
        cluster=cluster.spec.cluster,
        state_dir=None,
        json=json,
        last=10,
    )
    status: int = run_autoscale(args)
    return status


def test_the_leader_scales_out_and_a_standby_finishes_its_decision_in_flight(
    start_cluster: StartCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = start_cluster(
        matchers=1,
        replicas=1,
        max_rates=(("access-point", CAP),),
        autoscalers=2,
        autoscale_interval=0.5,
    )
    assert _admin(cluster, "set", "bogus=1", "scale-in=2") == 2
    refused = capsys.readouterr().err
    assert "unknown key 'bogus'" in refused and "scale-in must be a fraction" in refused
    assert _admin(cluster, "set") == 2
    short = ["metrics-window-s=2", "stabilisation-s=60", "cooldown-s=2"]
    bounds = ["access-points.max=2", "matchers.max=1", "exit-points.max=1"]
    assert _admin(cluster, "set", *short, *bounds, "connection-points.max=1") == 0
    client = connect(cluster.zk_address, cluster=cluster.spec.cluster, timeout=10.0)
    state = AutoscaleState(client)
    configuration = ClusterConfiguration(client)
    stop = threading.Event()
    try:
        wait_until(lambda: len(state.contenders()) == 2, 10, "both controllers contending")
        leader, standby = state.contenders()
        with Client(cluster.endpoints, timeout=30.0) as publisher:
            publishing = threading.Thread(
                target=lambda: publisher.publish_many(_offered(stop), batch_size=10), daemon=True
            )
            publishing.start()
            try:
                # the leader scales the saturated access points out, and records it
                wait_until(
                    lambda: bool(_finished(state, "scale-out")), 20, "a scale-out carried out"
                )
                (first, *_) = _finished(state, "scale-out")
                assert first["layer"] == "access-points" and first["leader"] == leader
                assert (first["from"], first["to"]) == (1, 2), first
                assert first["outcome"].startswith("completed: access-points 1 -> 2"), first
                assert "utilisation" in first["reason"] and ">= scale-out 90%" in first["reason"]
                assert _access_points(configuration) == 2
                # killed right after recording a decision: it stays in flight
                os.kill(int(leader.rsplit(":", 1)[1]), signal.SIGKILL)
                state.update_policy(["access-points.max=3"])
                grow = Decision(0.0, "access-points", 2, 3, Kind.SCALE_OUT, "test: in flight")
                path = state.record(grow, leader)
                wait_until(lambda: state.contenders()[:1] == [standby], 15, "the standby leads")
                wait_until(lambda: _outcome(state, path) is not None, 20, "the decision finished")
            finally:
                stop.set()
                publishing.join(30.0)
        outcome = _outcome(state, path)
        assert outcome is not None
        assert outcome.startswith(f"resumed by {standby} (leader {leader} stopped): completed"), (
            outcome
        )
        assert _access_points(configuration) == 3
        # what the supervisor does: the killed controller is started again, and stands by
        (said,) = cluster.restart_autoscalers()
        assert f"(pid {leader.rsplit(':', 1)[1]}) exited with -9, restarted as pid" in said, said
        wait_until(lambda: len(state.contenders()) == 2, 20, "the restarted one contends")
        assert state.contenders()[0] == standby
        restarted = state.contenders()[1]
        assert cluster.restart_autoscalers() == []
        # pre-warming starts an idle exit point (registered, not serving); cancelling stops it
        live = LiveCluster(client, cluster.state_dir, ask_timeout=2.0)
        warmed = live.carry_out(Kind.PREWARM, "exit-points", 1, 2)
        assert warmed.startswith("completed: 1 exit-point started, 1 idle"), warmed
        assert len(configuration.read().configuration.exit_points) == 1  # type: ignore[union-attr]
        cancelled = live.carry_out(Kind.CANCEL_PREWARM, "exit-points", 2, 1)
        assert cancelled == "completed: 1 idle exit-point stopped", cancelled
        wait_until(lambda: len(members(client, "exit-point")) == 1, 10, "the idle one gone")
        # the context stores: observed, and scaled with their own protocol (not pre-warmed)
        look = live.look()
        assert look is not None and len(look.layers["context-stores"]) == 1
        (store,) = look.layers["context-stores"]
        assert look.statuses[store].load.window > 0  # its load signals are read
        grown = live.carry_out(Kind.SCALE_OUT, "context-stores", 1, 2)
        assert grown.startswith("completed: context-stores 1 -> 2 in "), grown
        look = live.look()
        assert look is not None and len(look.layers["context-stores"]) == 2
        assert live.carry_out(Kind.PREWARM, "context-stores", 2, 3).startswith("skipped: ")
    finally:
        client.stop()
        client.close()
    capsys.readouterr()
    assert _admin(cluster, "status") == 0
    shown = capsys.readouterr().out
    assert f"on, leader {standby} (1 standby)" in shown
    assert "access-points scale-out 1 -> 2: completed" in shown and "why: access-points" in shown
    assert cluster_status(cluster)["autoscaler"] == {
        "enabled": True,
        "leader": standby,
        "standby": [restarted],
    }
    assert _admin(cluster, "off") == 0
    assert "autoscaling of" in capsys.readouterr().out
    assert cluster_status(cluster)["autoscaler"]["enabled"] is False


def _finished(state: AutoscaleState, kind: str) -> list[dict[str, Any]]:
    return [d for d in state.decisions() if d["kind"] == kind and d["outcome"] is not None]


def _outcome(state: AutoscaleState, path: str) -> str | None:
    found = [d for d in state.decisions() if d["id"] == path]
    return found[0]["outcome"] if found else None


def _access_points(configuration: ClusterConfiguration) -> int:
    current = configuration.read()
    assert current is not None
    return len(current.configuration.access_points)
