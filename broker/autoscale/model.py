"""The decision model of automatic scaling: load figures in, scale decisions out, no I/O.

How much (DS2, OSDI 2018). A process's *true rate* is what it would process if it never
waited: items processed / time spent busy. A layer's *target rate* is the rate it must serve:
for the first layer of the pipeline (and the context stores) its measured arrival rate; for
the others, the target rate of the layer feeding it times that layer's selectivity (items out
/ items in). So every layer is sized from the source rate at once, including those behind a
bottleneck that see little of the load yet. A layer needs
``ceil(target rate / (true rate per process * target utilisation))`` processes, and its
*utilisation* is ``target rate / (true rate per process * processes)``: above 1 it cannot
keep up.

The pipeline's items are one unit, the update: every layer counts the updates it takes in
and hands on (a connection point's notification deliveries are busy time, not items; a
matcher hands on every update it matched, whatever the matches), so selectivities are rates
of the same thing. A layer of :data:`BROADCAST` (the matchers: each matches every update
against its share of the subscriptions) counts each item once for the layer, so its true
rate per process times its processes is its capacity, as for the others.

What DS2 cannot see here: Silbo's publishers wait for room in their publish window when the
broker takes less than they are offered, so the rate measured at the source is what the
bottleneck serves, not the demand. The connection points count the updates of the batches a
client had to hold back (``LayerSample.held_back``). While at least half of the source's
updates are held back (in any observation of the window) and no layer queues (a utilisation
measured above ``SEEN`` shows the demand), a layer near its capacity (above the alarming
threshold) that must grow grows to at least ``held_back_growth`` times its size; and a
utilisation is never taken below the busy fraction (served / capacity). So a x4 step is met
in two decisions: x2 blind, then the DS2 size once the demand shows (Kubernetes' HPA scales
up by 100% a period by default for the same reason).

When (seed 004, Mudassar et al. 2019, after Zhai and Xu's bottleneck detection). Three
thresholds on the utilisation: above *alarming*, the processes a scale-out would add are
started and warmed (a ``prewarm`` decision); above *scale-out*, the layer grows to what it
needs; below *scale-in* for a whole stabilisation window, it shrinks to the most it needed
during that window. A prewarm that load no longer justifies (back below the target
utilisation for a stabilisation window: the gap keeps a noisy load from prewarming and
cancelling in turn) is cancelled. A layer that is not short is never grown, and no layer is
scaled before a whole metrics window of it was seen.

Each layer is a small state machine, stepped by :meth:`Controller.observe`::

    STEADY    --utilisation >= alarming, need > size-->  PREWARMED   (prewarm)
    STEADY    --utilisation >= scale-out, need > size--> STEADY      (scale-out)
    PREWARMED --utilisation >= scale-out, need > size--> STEADY      (scale-out)
    PREWARMED --below target for stabilisation_s-->      STEADY      (cancel-prewarm)
    STEADY    --below scale-in for stabilisation_s,
                the most needed meanwhile < size-->      STEADY      (scale-in)

A scale-out or scale-in starts the layer's cooldown (no decision for ``cooldown_s``: the
processes join and the figures settle). A prewarm does not: the scale-out it prepares must not
wait. Figures are averaged over the metrics window, so noise shorter than it is smoothed and
noise longer than it meets the gap between thresholds and the stabilisation window.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections import deque
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from broker.autoscale.policy import LAYERS, Policy

__all__ = [
    "PIPELINE",
    "Controller",
    "Decision",
    "Kind",
    "LayerSample",
    "LayerView",
    "Load",
    "Observation",
    "oscillations",
]

# layer -> the layer that feeds it; the other layers (connection points, context stores) are
# fed from outside, and sized from their own arrival rate
PIPELINE: Mapping[str, str] = {
    "access-points": "connection-points",
    "matchers": "access-points",
    "exit-points": "matchers",
}
# Layers whose every process takes in every item: each matcher matches every update against
# its share of the subscriptions. Their items are counted once for the layer (the processes'
# sum / their number), so that, as on the other layers, k processes serve k times one's
# true rate.
BROADCAST: Collection[str] = frozenset({"matchers"})
# a utilisation measured above this shows the demand (it queues, in an open system): it is
# sized from it, not grown blind
SEEN = 1.05
# the share of the source's updates held back by their publishers above which the demand is
# taken as unseen
HELD = 0.5
# processes' worth of busy time below which no true rate is measured: too little work to time
MIN_BUSY = 0.02


@dataclass(frozen=True, slots=True)
class LayerSample:
    """What one process of a layer reports about its last measuring interval."""

    busy: float  # fraction of the interval spent working, 0 to 1
    items_in: float  # items taken in and processed, per second
    items_out: float  # items sent on downstream, per second
    queue_depth: int = 0  # items waiting at the end of the interval
    queue_age_s: float = 0.0  # how long the oldest waiting item had waited
    held_back: float = 0.0  # share of the items in whose publishers had waited for room


@dataclass(frozen=True, slots=True)
class LayerView:
    """One layer at one instant: its size, the rate arriving at it, its processes' samples."""

    processes: int
    input_rate: float  # items arriving at the layer per second (served or queued)
    samples: Sequence[LayerSample]


@dataclass(frozen=True, slots=True)
class Observation:
    """Every layer's view at time ``t`` (seconds, any origin, increasing)."""

    t: float
    layers: Mapping[str, LayerView]

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of an observation (``silbo autoscaler --record``)."""
        return {
            "t": self.t,
            "layers": {
                name: {
                    "processes": view.processes,
                    "input_rate": view.input_rate,
                    "samples": [dataclasses.astuple(s) for s in view.samples],
                }
                for name, view in self.layers.items()
            },
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Observation:
        """What :meth:`to_dict` wrote."""
        return cls(
            float(data["t"]),
            {
                name: LayerView(
                    int(view["processes"]),
                    float(view["input_rate"]),
                    [LayerSample(*sample) for sample in view["samples"]],
                )
                for name, view in data["layers"].items()
            },
        )


class Kind(enum.Enum):
    """What a decision asks of the layer."""

    PREWARM = "prewarm"  # start and warm the processes a scale-out would add
    SCALE_OUT = "scale-out"  # grow the layer to ``after`` processes
    SCALE_IN = "scale-in"  # shrink the layer to ``after`` processes
    CANCEL_PREWARM = "cancel-prewarm"  # stop the warmed processes; the layer stays as it is


@dataclass(frozen=True, slots=True)
class Decision:
    """One decision of the controller, with a reason that names its figures."""

    t: float
    layer: str
    before: int  # processes of the layer (prewarmed ones counted, for a cancel)
    after: int  # processes it should have (prewarmed ones counted, for a prewarm)
    kind: Kind
    reason: str

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of a decision: ``{t, layer, from, to, kind, reason}``."""
        return {
            "t": self.t,
            "layer": self.layer,
            "from": self.before,
            "to": self.after,
            "kind": self.kind.value,
            "reason": self.reason,
        }


@dataclass(frozen=True, slots=True)
class Load:
    """A layer's figures averaged over the metrics window, and the size they call for."""

    processes: int
    arrival: float  # items/s arriving, as measured
    target_rate: float  # items/s it must serve (DS2: from the source rate)
    fed_by: str | None  # the layer target_rate was derived from, if any
    true_rate: float | None  # items/s one process serves when busy; None until measured
    utilisation: float | None  # target_rate / capacity; None if it cannot be known yet
    needed: int  # processes at the target utilisation, within min and max
    blind: bool  # the publishers are held back and nothing queues: the demand is unseen
    queued: bool  # more arrives at it, or at a layer feeding it, than it serves: it queues
    held: float  # the share of its items whose publishers were held back (from the source)
    queue_depth: float
    queue_age_s: float

    def describe(self, layer: str) -> str:
        """The figures, for a reason: ``matchers: input 4,100/s, true rate 1,350/s ...``."""
        source = f" (from {self.fed_by})" if self.fed_by else ""
        rate = "unmeasured" if self.true_rate is None else f"{self.true_rate:,.0f}/s"
        used = "?" if self.utilisation is None else f"{self.utilisation:.0%}"
        queue = f", queue {self.queue_depth:,.0f}" if self.queue_depth >= 1 else ""
        full = " (publishers held back)" if self.blind else ""
        return (
            f"{layer}: input {self.target_rate:,.0f}/s{source}, true rate {rate} per process, "
            f"utilisation {used}{full}{queue}"
        )


@dataclass(frozen=True, slots=True)
class _Figures:
    """One observation of one layer, summed over its processes."""

    t: float
    processes: int
    arrival: float
    processed: float
    busy: float  # processes' worth
    busy_fraction: float  # the reporting processes' mean busy fraction
    held: float  # share of the items in whose publishers were held back
    out: float
    queue_depth: float
    queue_age_s: float


class _LayerState:
    """What the controller remembers of one layer between observations."""

    def __init__(self) -> None:
        self.window: deque[_Figures] = deque()
        self.processes = 0
        self.true_rate: float | None = None  # the last measured, kept while unmeasurable
        self.selectivity: float | None = None
        self.changed_at = -math.inf  # time of the last scale-out or scale-in
        self.prewarmed: int | None = None  # the size prewarmed for (PREWARMED state)
        self.seen_since = math.inf  # time of the first observation of the layer
        self.calm_since: float | None = None  # since when below the target utilisation
        self.low_since: float | None = None  # since when below scale-in
        self.low_need = 0  # the most needed since low_since (once the window is all after it)


class Controller:
    """Turns observations, fed in time order, into scale decisions (module docstring)."""

    def __init__(
        self,
        policy: Policy,
        pipeline: Mapping[str, str] = PIPELINE,
        broadcast: Collection[str] = BROADCAST,
    ) -> None:
        """``pipeline`` maps a layer to the one feeding it; it must have no cycle.
        ``broadcast``: the layers whose every process takes in every item."""
        policy.check()
        self.policy = policy
        self.pipeline = pipeline
        self.broadcast = broadcast
        self.loads: dict[str, Load] = {}  # each layer's load at the last observation
        self._states = {layer: _LayerState() for layer in LAYERS}
        self._last_t = -math.inf

    def observe(self, observation: Observation) -> list[Decision]:
        """Take one observation; return the decisions it leads to (at most one per layer)."""
        if observation.t < self._last_t:
            raise ValueError(f"observation at {observation.t} after one at {self._last_t}")
        unknown = set(observation.layers) - set(LAYERS)
        if unknown:
            raise ValueError(f"unknown layers {sorted(unknown)} (known: {', '.join(LAYERS)})")
        self._last_t = observation.t
        for layer, view in observation.layers.items():
            self._record(layer, observation.t, view)
        # a layer none of whose processes reported within the window is not judged
        present = [layer for layer in observation.layers if self._states[layer].window]
        self.loads = {}
        for layer in present:
            self._load(layer, present)
        decisions = []
        for layer in present:
            decision = self._decide(observation.t, layer, self.loads[layer])
            if decision is not None:
                decisions.append(decision)
        return decisions

    def _record(self, layer: str, t: float, view: LayerView) -> None:
        state = self._states[layer]
        state.seen_since = min(state.seen_since, t)
        while state.window and state.window[0].t <= t - self.policy.metrics_window_s:
            state.window.popleft()
        samples = view.samples
        if not samples:
            return
        share = 1 / len(samples) if layer in self.broadcast else 1.0
        busy = sum(min(1.0, max(0.0, s.busy)) for s in samples)
        taken = sum(s.items_in for s in samples)
        state.window.append(
            _Figures(
                t=t,
                processes=view.processes,
                arrival=view.input_rate * share,
                processed=taken * share,
                busy=busy,
                busy_fraction=busy / len(samples),
                held=sum(s.items_in * s.held_back for s in samples) / taken if taken else 0.0,
                out=sum(s.items_out for s in samples) * share,
                queue_depth=sum(s.queue_depth for s in samples),
                queue_age_s=max((s.queue_age_s for s in samples), default=0.0),
            )
        )

    def _load(self, layer: str, present: Collection[str]) -> Load:
        """The layer's load (its feeder's first, for the target rate), kept in self.loads."""
        if layer in self.loads:
            return self.loads[layer]
        state = self._states[layer]
        count = len(state.window)
        arrival, processed, busy, fraction, out, depth, age = (
            sum(getattr(f, name) for f in state.window) / count
            for name in (
                "arrival",
                "processed",
                "busy",
                "busy_fraction",
                "out",
                "queue_depth",
                "queue_age_s",
            )
        )
        # held back at any time in the window: a scale's refill of the publish windows (sent
        # at once, not held) does not hide that the demand is hidden
        held = max(f.held for f in state.window)
        if busy >= MIN_BUSY and processed > 0:
            state.true_rate = processed / busy
        if processed > 0:
            state.selectivity = out / processed
        target, fed_by, queued_upstream = arrival, None, False
        feeder = self.pipeline.get(layer)
        if feeder is not None and feeder in present:
            upstream = self._load(feeder, present)
            selectivity = self._states[feeder].selectivity
            if selectivity is not None:
                target, fed_by = upstream.target_rate * selectivity, feeder
                queued_upstream, held = upstream.queued, max(held, upstream.held)
        processes = state.window[-1].processes
        utilisation = self._utilisation(target, state.true_rate, processes, busy)
        needed = self._needed(layer, target, state.true_rate, busy)
        # more arriving than served, here or upstream: the target rate shows the demand
        queued = queued_upstream or (utilisation is not None and utilisation >= SEEN)
        if state.true_rate is not None:  # served / capacity: what is offered is no less
            utilisation = max(utilisation or 0.0, fraction)
        blind = (
            held >= HELD
            and not queued
            and utilisation is not None
            and utilisation >= self.policy.alarming
        )
        if blind:
            grown = math.ceil(processes * self.policy.held_back_growth - 1e-9)
            needed = max(needed, self.policy.clamp(layer, grown))
        load = Load(
            processes=processes,
            arrival=arrival,
            target_rate=target,
            fed_by=fed_by,
            true_rate=state.true_rate,
            utilisation=utilisation,
            needed=needed,
            blind=blind,
            queued=queued,
            held=held,
            queue_depth=depth,
            queue_age_s=age,
        )
        self.loads[layer] = load
        return load

    def _utilisation(
        self, target: float, true_rate: float | None, processes: int, busy: float
    ) -> float | None:
        if target <= 0:
            return 0.0
        if true_rate is not None:
            return target / (true_rate * max(processes, 1))
        # never measured: too little work to time is too little to scale for
        return busy / max(processes, 1) if busy < MIN_BUSY else None

    def _needed(self, layer: str, target: float, true_rate: float | None, busy: float) -> int:
        if target <= 0 or true_rate is None:
            wanted = busy / self.policy.target_utilisation  # 0 at no load, or nothing known
        else:
            wanted = target / (true_rate * self.policy.target_utilisation)
        return self.policy.clamp(layer, math.ceil(wanted - 1e-9))

    def _decide(self, t: float, layer: str, load: Load) -> Decision | None:
        state, policy = self._states[layer], self.policy
        used = load.utilisation
        if used is None:
            return None
        if load.processes != state.processes:  # a scale landed (ours or an operator's)
            state.processes, state.low_since = load.processes, None
        if used < policy.scale_in:
            if state.low_since is None:
                state.low_since, state.low_need = t, 0
            if t - state.low_since >= policy.metrics_window_s:  # the fall is out of the window
                state.low_need = max(state.low_need, load.needed)
        else:
            state.low_since, state.low_need = None, 0
        if used < policy.target_utilisation:
            state.calm_since = t if state.calm_since is None else state.calm_since
        else:
            state.calm_since = None
        if t - state.changed_at < policy.cooldown_s:
            return None
        if t - state.seen_since < policy.metrics_window_s:
            return None
        return self._step(t, layer, load, used, state)

    def _step(
        self, t: float, layer: str, load: Load, used: float, state: _LayerState
    ) -> Decision | None:
        policy, size = self.policy, load.processes
        figures = load.describe(layer)
        if used >= policy.scale_out and load.needed > size:
            state.prewarmed, state.changed_at = None, t
            blind = f", x{policy.held_back_growth:g} at least" if load.blind else ""
            reason = (
                f"{figures} >= scale-out {policy.scale_out:.0%}"
                f"{self._sizing(layer, load.needed, size)}{blind}"
            )
            return Decision(t, layer, size, load.needed, Kind.SCALE_OUT, reason)
        if used >= policy.alarming and load.needed > size and state.prewarmed is None:
            state.prewarmed = load.needed
            reason = (
                f"{figures} >= alarming {policy.alarming:.0%} -> prewarm "
                f"{load.needed - size} for {load.needed} ({size} now)"
            )
            return Decision(t, layer, size, load.needed, Kind.PREWARM, reason)
        if state.prewarmed is not None and self._lasted(t, state.calm_since):
            prewarmed, state.prewarmed = state.prewarmed, None
            reason = (
                f"{figures}, below target {policy.target_utilisation:.0%} for "
                f"{policy.stabilisation_s:g} s -> prewarmed processes stopped ({size} stay)"
            )
            return Decision(t, layer, prewarmed, size, Kind.CANCEL_PREWARM, reason)
        if self._lasted(t, state.low_since) and state.low_need < size:
            state.changed_at, target = t, state.low_need
            reason = (
                f"{figures}, below scale-in {policy.scale_in:.0%} for "
                f"{policy.stabilisation_s:g} s{self._sizing(layer, target, size)}"
            )
            return Decision(t, layer, size, target, Kind.SCALE_IN, reason)
        return None

    def _lasted(self, t: float, since: float | None) -> bool:
        return since is not None and t - since >= self.policy.stabilisation_s

    def _sizing(self, layer: str, processes: int, size: int) -> str:
        """`` -> 5 needed at 70% target (3 now)``, and the bound it met, if any."""
        policy = self.policy
        bound = ""
        if processes == policy.maximum[layer]:
            bound = f" (at {layer}.max)"
        elif processes == policy.minimum[layer]:
            bound = f" (at {layer}.min)"
        target = f"{policy.target_utilisation:.0%}"
        return f" -> {processes} needed at {target} target ({size} now){bound}"


def oscillations(decisions: Iterable[Decision], window: float) -> int:
    """Reversals of direction on a layer within ``window`` seconds of the decision before.

    Growing (prewarm, scale-out) then shrinking (scale-in, cancel-prewarm), or the reverse,
    counts once per reversal; decisions are taken in time order per layer.
    """
    last: dict[str, tuple[float, int]] = {}
    reversals = 0
    for decision in sorted(decisions, key=lambda d: d.t):
        way = 1 if decision.kind in (Kind.PREWARM, Kind.SCALE_OUT) else -1
        before = last.get(decision.layer)
        if before is not None and before[1] != way and decision.t - before[0] <= window:
            reversals += 1
        last[decision.layer] = (decision.t, way)
    return reversals
