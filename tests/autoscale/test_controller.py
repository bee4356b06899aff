"""The controller around the model, with fakes at its two interfaces (no processes).

A fake cluster answers looks (each process's totals, advanced by the test) and carries out
decisions (it checks each one is recorded in flight before it is done); an in-memory state
stands for ZooKeeper's ``/autoscale``. The ZooKeeper side and the real actions run in
tests/integration/test_autoscale.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from broker.autoscale import Decision, Kind, Policy
from broker.autoscale.controller import Autoscaler, ClusterLook, Observer
from broker.coordination.errors import ZooKeeperUnavailable
from broker.wire import internal_pb2 as wire

FAST = Policy().updated(["metrics-window-s=2", "stabilisation-s=60", "cooldown-s=2"])


def status(
    busy_seconds: float,
    items_in: int,
    items_out: int | None = None,
    *,
    busy: float = 0.0,
    rate: float = 0.0,
    held: int = 0,
) -> wire.ProcessStatus:
    """A process's answer: its totals, and its own recent figures (busy fraction, rate)."""
    return wire.ProcessStatus(
        load=wire.Load(
            busy_seconds=busy_seconds,
            items_in=items_in,
            items_out=items_in if items_out is None else items_out,
            busy_fraction=busy,
            input_rate=rate,
            output_rate=rate,
            items_held=held,
        )
    )


def test_a_sample_is_the_change_of_the_totals_since_the_last_answer() -> None:
    observer = Observer()
    layers = {"access-points": ["ap1", "ap2"], "matchers": ["m1"]}
    first = ClusterLook(
        layers,
        {
            "ap1": status(10.0, 1000, busy=0.9, rate=95.0),
            "ap2": status(1.0, 50, busy=0.1, rate=10.0),
            "m1": status(2.0, 400, 20, busy=0.2, rate=40.0),
            "idle": status(0.0, 0),  # registered, not serving: not observed
        },
    )
    seen = observer.observation(100.0, first)
    assert set(seen.layers) == {"access-points", "matchers"}
    ap = seen.layers["access-points"]
    # first answer: the processes' own recent figures
    assert [(s.busy, s.items_in) for s in ap.samples] == [(0.9, 95.0), (0.1, 10.0)]
    assert ap.processes == 2 and ap.input_rate == pytest.approx(105.0)
    second = ClusterLook(
        layers,
        {
            "ap1": status(12.0, 1200, busy=0.5, rate=1.0),
            # ap2 does not answer: still one of the layer's 2, with no sample
            "m1": status(2.5, 500, 30, held=60),
        },
    )
    seen = observer.observation(102.0, second)
    ap = seen.layers["access-points"]
    assert ap.processes == 2 and len(ap.samples) == 1
    assert ap.samples[0].busy == pytest.approx(1.0)  # 2 busy seconds in 2
    assert ap.samples[0].items_in == pytest.approx(100.0)
    matcher = seen.layers["matchers"].samples[0]
    assert (matcher.busy, matcher.items_in, matcher.items_out) == pytest.approx((0.25, 50, 5))
    assert matcher.held_back == pytest.approx(0.6)  # 60 of the 100 items in held back
    # ap1 restarted (its totals began again): its own recent figures, not a negative rate
    third = ClusterLook(layers, {"ap1": status(0.2, 30, busy=0.3, rate=15.0)})
    sample = observer.observation(104.0, third).layers["access-points"].samples[0]
    assert (sample.busy, sample.items_in) == (0.3, 15.0)


@dataclass
class MemoryState:
    """``/autoscale`` in memory (broker.autoscale.state.AutoscaleState's interface)."""

    on: bool = True
    kept: Policy = FAST
    records: dict[str, dict[str, Any]] = field(default_factory=dict)

    def enabled(self) -> bool:
        return self.on

    def policy(self) -> Policy:
        return self.kept

    def record(self, decision: Decision, leader: str) -> str:
        path = f"d-{len(self.records):04d}"
        entry = decision.to_dict() | {"t": 1000.0, "leader": leader, "outcome": None}
        self.records[path] = {"id": path, **entry}
        return path

    def finish(self, path: str, outcome: str) -> None:
        self.records[path]["outcome"] = outcome

    def in_flight(self) -> list[dict[str, Any]]:
        return [dict(r) for r in self.records.values() if r["outcome"] is None]


@dataclass
class FakeCluster:
    """One connection point feeding one access point capped at 100 items/s, saturated."""

    state: MemoryState
    sizes: dict[str, int] = field(default_factory=lambda: {"access-points": 1})
    done: list[tuple[Kind, str, int, int]] = field(default_factory=list)
    fail: bool = False
    _t: float = 0.0

    def look(self) -> ClusterLook:
        self._t += 1.0
        aps = [f"ap{i}" for i in range(self.sizes["access-points"])]
        statuses = {"cp": status(0.1 * self._t, int(100 * self._t))}
        # the first access point takes in all there is, busy all the time
        statuses |= {name: status(0.0, 0) for name in aps}
        statuses["ap0"] = status(self._t, int(100 * self._t))
        return ClusterLook({"connection-points": ["cp"], "access-points": aps}, statuses)

    def carry_out(self, kind: Kind, layer: str, before: int, after: int) -> str:
        in_flight = [(r["kind"], r["layer"], r["to"]) for r in self.state.in_flight()]
        assert (kind.value, layer, after) in in_flight, "carried out before it was recorded"
        if self.fail:
            raise ZooKeeperUnavailable("could not scale: ZooKeeper connection lost")
        self.done.append((kind, layer, before, after))
        self.sizes[layer] = after
        return f"completed: {layer} {before} -> {after}"


def _autoscaler(state: MemoryState, cluster: FakeCluster) -> Autoscaler:
    clock = iter(float(t) for t in range(1000))
    return Autoscaler(
        cluster, state, identity="here:1", clock=lambda: next(clock), wall=lambda: 1010.0
    )


def test_a_saturated_layer_is_scaled_out_recorded_before_and_finished_after() -> None:
    state = MemoryState()
    cluster = FakeCluster(state)
    autoscaler = _autoscaler(state, cluster)
    decisions = [d for _ in range(6) for d in autoscaler.tick()]
    assert [(d.kind, d.layer, d.before, d.after) for d in decisions] == [
        (Kind.SCALE_OUT, "access-points", 1, 2)
    ]
    assert cluster.done == [(Kind.SCALE_OUT, "access-points", 1, 2)]
    (record,) = state.records.values()
    assert record["kind"] == "scale-out" and record["from"] == 1 and record["to"] == 2
    assert record["leader"] == "here:1"
    assert record["outcome"] == "completed: access-points 1 -> 2"
    assert "access-points: input 100/s" in record["reason"]
    assert "utilisation 100%" in record["reason"]


def test_a_failed_action_is_recorded_with_its_cause() -> None:
    state = MemoryState()
    cluster = FakeCluster(state, fail=True)
    autoscaler = _autoscaler(state, cluster)
    for _ in range(6):
        autoscaler.tick()
    outcomes = [r["outcome"] for r in state.records.values()]
    assert outcomes[0] == "failed: could not scale: ZooKeeper connection lost"


def test_turned_off_it_decides_nothing_and_measures_afresh_when_on_again() -> None:
    state = MemoryState(on=False)
    cluster = FakeCluster(state)
    autoscaler = _autoscaler(state, cluster)
    assert [d for _ in range(6) for d in autoscaler.tick()] == []
    assert cluster.done == [] and state.records == {}
    state.on = True
    assert autoscaler.tick() == []  # a whole metrics window is measured first
    assert [d.kind for _ in range(4) for d in autoscaler.tick()] == [Kind.SCALE_OUT]


def test_a_new_leader_finishes_a_decision_in_flight_and_abandons_a_stale_one() -> None:
    state = MemoryState()
    cluster = FakeCluster(state)
    fresh = Decision(0.0, "access-points", 1, 3, Kind.SCALE_OUT, "grow")
    stale = Decision(0.0, "access-points", 3, 1, Kind.SCALE_IN, "shrink")
    state.record(stale, "gone:7")
    state.records["d-0000"]["t"] = 10.0  # 1000 s before the wall clock: too old
    state.record(fresh, "gone:7")
    autoscaler = _autoscaler(state, cluster)
    autoscaler.tick()
    assert cluster.done == [(Kind.SCALE_OUT, "access-points", 1, 3)]
    assert state.records["d-0001"]["outcome"] == (
        "resumed by here:1 (leader gone:7 stopped): completed: access-points 1 -> 3"
    )
    assert state.records["d-0000"]["outcome"].startswith("abandoned by here:1")
    assert state.in_flight() == []
