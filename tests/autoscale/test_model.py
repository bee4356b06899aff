"""The decision model on synthetic load: steps, a ramp, a spike, noise, bounds.

A tiny simulator stands in for the cluster: a pipeline of layers whose processes each serve
at most ``capacity`` items/s; what cannot be served waits in the layer's queue; a process is
``busy`` for the share of its capacity it used. The matchers are a broadcast layer, as in
Silbo: each process takes in every item and does its share of the work on it. Decisions are
applied at once.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import examples

from broker.autoscale import (
    Controller,
    Decision,
    Kind,
    LayerSample,
    LayerView,
    Observation,
    Policy,
    oscillations,
)
from broker.errors import InvalidInput

Profile = Callable[[float], float]  # items/s arriving at time t

STEP_S = 2.0  # seconds between two observations
POLICY = Policy()


@dataclass
class Layer:
    """One simulated layer: processes of a fixed capacity, and a queue."""

    name: str
    capacity: float  # items/s one process serves
    processes: int
    selectivity: float = 1.0  # items out per item in
    broadcast: bool = False  # every process takes in every item (and does 1/processes of it)
    queue: float = 0.0

    def step(self, arrival: float, held_back: float = 0.0) -> tuple[LayerView, float]:
        """Serve ``STEP_S`` seconds of ``arrival`` items/s (``held_back``: the share of them
        whose publishers waited for room); the view and the rate sent on."""
        available = self.queue + arrival * STEP_S
        served = min(available, self.capacity * self.processes * STEP_S)
        self.queue = available - served
        rate = served / STEP_S
        busy = rate / (self.capacity * self.processes)
        age = self.queue / rate if rate else 0.0
        each = 1 if self.broadcast else self.processes  # the processes an item goes to: 1 of
        sample = LayerSample(
            busy=busy,
            items_in=rate / each,
            items_out=rate * self.selectivity / each,
            queue_depth=round(self.queue / each),
            queue_age_s=age,
            held_back=held_back,
        )
        arriving = arrival * self.processes / each
        return LayerView(
            self.processes, arriving, [sample] * self.processes
        ), rate * self.selectivity


@dataclass
class Run:
    """What a simulation did: every decision, and per step (t, load, matchers' capacity)."""

    decisions: list[Decision] = field(default_factory=list)
    capacity: list[tuple[float, float, float]] = field(default_factory=list)

    def on(self, layer: str, *kinds: Kind) -> list[Decision]:
        return [d for d in self.decisions if d.layer == layer and (not kinds or d.kind in kinds)]


def pipeline(matchers: int = 3) -> list[Layer]:
    """Matchers (1,000/s each) are the narrow layer; the others, at their minimum of one
    process, have room for a x4 step of 1,800/s."""
    return [
        Layer("connection-points", 20_000, 1),
        Layer("access-points", 10_000, 1),
        Layer("matchers", 1_000, matchers, broadcast=True),
        Layer("exit-points", 20_000, 1),
    ]


def simulate(
    layers: list[Layer],
    load: Profile,
    duration_s: float,
    policy: Policy = POLICY,
    controller: Controller | None = None,
    *,
    held_back: bool = False,
) -> Run:
    """Drive ``controller`` with the simulated layers under ``load`` (items/s at time t).

    ``held_back``: the publishers wait on their publish window, as Silbo's do: no layer is
    offered more than the narrowest layer serves, and nothing queues."""
    controller = controller or Controller(policy)
    by_name = {layer.name: layer for layer in layers}
    run = Run()
    for step in range(int(duration_s / STEP_S)):
        t = step * STEP_S
        rate, views, held = load(t), {}, 0.0
        if held_back:
            served = min(rate, *(layer.capacity * layer.processes for layer in layers))
            rate, held = served, 1.0 if served < rate else 0.0
        for layer in layers:
            views[layer.name], rate = layer.step(rate, held)
            held = 0.0  # the connection points count it
        for decision in controller.observe(Observation(t, views)):
            run.decisions.append(decision)
            if decision.kind in (Kind.SCALE_OUT, Kind.SCALE_IN):
                by_name[decision.layer].processes = decision.after
        matchers = by_name["matchers"]
        run.capacity.append((t, load(t), matchers.capacity * matchers.processes))
    return run


def step(
    base: float, factor: float, at: float, until: float = math.inf
) -> Callable[[float], float]:
    return lambda t: base * factor if at <= t < until else base


def test_a_x4_step_is_met_in_two_decisions_on_the_bottleneck_only() -> None:
    run = simulate(pipeline(), step(1_800, 4, at=60), duration_s=180)
    scale_outs = run.on("matchers", Kind.SCALE_OUT)
    assert 1 <= len(scale_outs) <= 2
    assert {d.layer for d in run.decisions} == {"matchers"}
    enough = next(t for t, load, capacity in run.capacity if t >= 60 and capacity >= load)
    assert enough - 60 <= 30
    assert scale_outs[-1].after == math.ceil(7_200 / (1_000 * POLICY.target_utilisation))
    assert "matchers: input 7,200/s" in scale_outs[-1].reason
    assert "true rate 1,000/s per process" in scale_outs[-1].reason


def test_a_x4_step_held_back_by_the_bottleneck_is_met_in_two_decisions() -> None:
    # the source shows only what the 3 matchers serve (3,000/s of 7,200/s): saturated, they
    # double blind, then the 6 serve 6,000/s of it, still saturated: DS2 cannot see past it,
    # the doubling can
    run = simulate(pipeline(), step(1_800, 4, at=60), duration_s=180, held_back=True)
    scale_outs = run.on("matchers", Kind.SCALE_OUT)
    assert [d.after for d in scale_outs] == [6, 12]
    assert {d.layer for d in run.decisions} == {"matchers"}
    assert (
        "(publishers held back)" in scale_outs[0].reason and "x2 at least" in scale_outs[0].reason
    )
    enough = next(t for t, load, capacity in run.capacity if t >= 60 and capacity >= load)
    assert enough - 60 <= 30
    # without the doubling DS2 creeps up by its target utilisation at each decision
    creeping = Policy().updated(["held-back-growth=1"])
    run = simulate(pipeline(), step(1_800, 4, at=60), 180, creeping, held_back=True)
    assert len(run.on("matchers", Kind.SCALE_OUT)) > 2


def test_the_prewarm_comes_before_the_scale_out_it_prepares() -> None:
    # 1,800/s on 3 -> 2,550/s: 85% is above alarming, not above scale-out
    run = simulate(pipeline(), step(1_800, 2_550 / 1_800, at=20), duration_s=120)
    assert [d.kind for d in run.decisions] == [Kind.PREWARM]
    assert (run.decisions[0].before, run.decisions[0].after) == (3, 4)
    run = simulate(pipeline(), step(2_550, 3_000 / 2_550, at=40), duration_s=120)
    assert [d.kind for d in run.decisions] == [Kind.PREWARM, Kind.SCALE_OUT]


def test_a_prewarm_no_longer_needed_is_cancelled_after_the_stabilisation_window() -> None:
    run = simulate(pipeline(), step(1_800, 2_550 / 1_800, at=20, until=100), duration_s=500)
    kinds = [(d.kind, d.t) for d in run.decisions]
    assert [k for k, _ in kinds] == [Kind.PREWARM, Kind.CANCEL_PREWARM]
    assert kinds[1][1] - 100 >= POLICY.stabilisation_s
    assert (run.decisions[1].before, run.decisions[1].after) == (4, 3)


def test_a_ramp_is_followed_without_ever_scaling_in() -> None:
    run = simulate(pipeline(2), lambda t: 1_000 + 10 * t, duration_s=600)  # to 7,000/s
    assert run.on("matchers", Kind.SCALE_IN) == []
    assert {d.layer for d in run.decisions} == {"matchers"}
    sizes = [d.after for d in run.on("matchers", Kind.SCALE_OUT)]
    assert sizes == sorted(sizes) and sizes[-1] >= 7_000 / 1_000
    behind = [t for t, load, capacity in run.capacity if capacity < load]
    assert len(behind) * STEP_S <= 30  # seconds the matchers served less than arrived


def test_a_spike_shorter_than_the_stabilisation_window_scales_in_once_after_it() -> None:
    run = simulate(pipeline(), step(1_800, 3, at=60, until=120), duration_s=900)
    scale_ins = run.on("matchers", Kind.SCALE_IN)
    assert len(scale_ins) == 1 and scale_ins[0].t >= 120 + POLICY.stabilisation_s
    assert scale_ins[0].after == 3
    assert oscillations(run.decisions, POLICY.stabilisation_s) == 0


def test_a_step_down_scales_in_after_the_stabilisation_window() -> None:
    run = simulate(pipeline(), step(1_800, 4, at=0, until=200), duration_s=800)
    scale_in = run.on("matchers", Kind.SCALE_IN)
    assert len(scale_in) == 1
    assert 200 + POLICY.stabilisation_s <= scale_in[0].t <= 200 + POLICY.stabilisation_s + 20
    assert scale_in[0].after == math.ceil(1_800 / 700)
    assert "below scale-in 50% for 300 s" in scale_in[0].reason


@settings(max_examples=examples(30))
@given(seed=st.integers(0, 2**32 - 1), level=st.floats(0.3, 0.8))
def test_noisy_steady_load_leaves_the_layers_alone(seed: int, level: float) -> None:
    noise = random.Random(seed)
    base = 4 * 1_000 * level  # 4 matchers this busy on average, +-20% at every step
    run = simulate(pipeline(4), lambda t: base * noise.uniform(0.8, 1.2), duration_s=1_200)
    assert len(run.decisions) <= 2  # at most one per 10 minutes
    assert oscillations(run.decisions, POLICY.stabilisation_s) == 0


def test_processes_stay_within_min_and_max() -> None:
    policy = POLICY.updated(["matchers.max=6", "matchers.min=2"])
    run = simulate(pipeline(), step(1_800, 4, at=20, until=200), duration_s=800, policy=policy)
    scale_outs = run.on("matchers", Kind.SCALE_OUT)
    assert max(d.after for d in run.on("matchers")) == 6
    assert "-> 6 needed at 70% target (5 now) (at matchers.max)" in scale_outs[-1].reason
    idle = simulate(pipeline(), lambda t: 0.0, duration_s=400, policy=policy)
    assert [(d.kind, d.after) for d in idle.on("matchers")] == [(Kind.SCALE_IN, 2)]


def test_a_layer_behind_the_bottleneck_is_sized_from_the_source_rate() -> None:
    # access points saturate at 2 x 1,000/s: the matchers see 2,000/s, not 6,000/s
    layers = pipeline()
    layers[1].capacity, layers[1].processes = 1_000, 2
    run = simulate(layers, step(1_200, 5, at=20), duration_s=80)
    assert {d.kind for d in run.decisions} == {Kind.SCALE_OUT}
    for layer in ("access-points", "matchers"):
        decisions = run.on(layer)
        assert len(decisions) == 2 and decisions[-1].after == math.ceil(6_000 / 700)
    # the matchers were given 9 while at most 4 access points fed them 4,000/s
    assert "input 6,000/s (from access-points)" in run.on("matchers")[-1].reason


def test_no_busy_time_is_no_division_by_zero_and_no_load() -> None:
    controller = Controller(POLICY)
    views = {"matchers": LayerView(3, 50.0, [LayerSample(busy=0.0, items_in=50, items_out=0)])}
    for t in range(0, 400, 2):
        decisions = controller.observe(Observation(float(t), views))
        assert all(d.kind is Kind.SCALE_IN and d.after == 1 for d in decisions)
    assert controller.loads["matchers"].true_rate is None
    assert controller.loads["matchers"].needed == 1


def test_a_layer_whose_processes_do_not_report_is_left_alone() -> None:
    controller = Controller(POLICY)
    silent = {"matchers": LayerView(3, 50.0, [])}
    assert all(controller.observe(Observation(float(t), silent)) == [] for t in range(0, 400, 2))
    assert controller.loads == {}


def test_observations_go_forward_in_time_and_name_known_layers() -> None:
    controller = Controller(POLICY)
    controller.observe(Observation(10.0, {}))
    with pytest.raises(ValueError, match="after one at 10"):
        controller.observe(Observation(5.0, {}))
    with pytest.raises(ValueError, match=r"unknown layers \['brokers'\]"):
        controller.observe(Observation(11.0, {"brokers": LayerView(1, 0.0, [])}))


def test_oscillations_count_reversals_within_the_window() -> None:
    def decision(t: float, kind: Kind, layer: str = "matchers") -> Decision:
        return Decision(t, layer, 1, 2, kind, "")

    decisions = [
        decision(0, Kind.SCALE_OUT),
        decision(100, Kind.SCALE_IN),  # reversal
        decision(150, Kind.SCALE_IN, "exit-points"),
        decision(200, Kind.PREWARM),  # reversal
        decision(900, Kind.CANCEL_PREWARM),  # too late to count
    ]
    assert oscillations(decisions, 300) == 2
    assert decisions[0].to_dict() == {
        "t": 0,
        "layer": "matchers",
        "from": 1,
        "to": 2,
        "kind": "scale-out",
        "reason": "",
    }


def test_the_policy_reads_back_what_it_shows() -> None:
    shown = Policy().settings()
    assert shown["target-utilisation"] == "0.7" and shown["matchers.max"] == "16"
    changed = Policy().updated(["scale-in = 0.4", "matchers.min=2", "cooldown-s=30"])
    assert Policy().updated(f"{k}={v}" for k, v in changed.settings().items()) == changed
    assert (changed.scale_in, changed.minimum["matchers"], changed.cooldown_s) == (0.4, 2, 30.0)


@pytest.mark.parametrize(
    ("assignments", "message"),
    [
        (["target"], "'target' is not KEY=VALUE"),
        (["speed=2"], "unknown key 'speed' (known: target-utilisation, "),
        (["scale-out=high"], "scale-out must be a fraction from 0 to 1, e.g. 0.7 (got 'high')"),
        (["alarming=1.5"], "alarming must be a fraction from 0 to 1"),
        (["cooldown-s=-1"], "cooldown-s must be seconds, 0 or more (got '-1')"),
        (["stabilisation-s=nan"], "stabilisation-s must be seconds"),
        (["brokers.max=3"], "unknown key 'brokers.max'"),
        (["matchers.max=two"], "matchers.max must be a whole number of processes (got 'two')"),
        (["scale-in=0.8"], "thresholds must be ordered 0 < scale-in < target-utilisation"),
        (["alarming=0.95"], "(now 0.5 < 0.7 < 0.95 <= 0.9)"),
        (["matchers.min=0"], "matchers.min must be at least 1"),
        (["exit-points.max=2", "exit-points.min=3"], "exit-points.max (2) is below"),
        (["metrics-window-s=0"], "metrics-window-s must be above 0"),
        (["held-back-growth=0.5"], "held-back-growth must be a factor of 1 or more, e.g. 2"),
        (["metrics-window-s=600"], "stabilisation-s (300) must be at least metrics-window-s"),
    ],
)
def test_bad_knobs_are_refused_with_what_is_wrong(assignments: list[str], message: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        Policy().updated(assignments)
    assert message in str(refused.value)


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(InvalidInput) as refused:
        Policy().updated(["speed=2", "scale-in=x", "matchers.max=y"])
    assert str(refused.value).count(";") == 2
