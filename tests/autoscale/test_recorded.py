"""The decision model on a series recorded from real processes.

``data/x4-step.jsonl.gz`` is what the leading controller of one ``silbo bench autoscale`` run
recorded (``silbo up --autoscale-record``: each round's observation of every process, the
policy in force and the decisions taken): exit points capped at 150 items/s, 100 updates/s,
then x4 at t = 20 s for 60 s, back to 100/s, a x3 spike. Replayed through a new
:class:`Controller`, the model must take the decisions it took live (it is deterministic:
a change to it that decides otherwise on real figures shows here), and they must meet the
issue's bar: the bottleneck only, capacity for the x4 step in at most two scale-outs.

The live decisions were carried out between rounds, so the rounds after a decision show the
layer at its new size: replaying them is the closed loop the controller saw.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

from broker.autoscale import Controller, Kind, Observation, Policy

SERIES = Path(__file__).parent / "data" / "x4-step.jsonl.gz"
CAP = 150.0  # items/s of one exit point in the recorded run
STEP_LOAD = 400.0  # updates/s offered during the x4 step


def _rounds() -> list[dict[str, Any]]:
    with gzip.open(SERIES, "rt") as lines:
        return [json.loads(line) for line in lines if line.strip()]


def test_the_recorded_series_round_trips() -> None:
    for line in _rounds()[:5]:
        observation = Observation.from_dict(line)
        assert Observation.from_dict(json.loads(json.dumps(observation.to_dict()))) == observation


def test_replayed_the_model_decides_what_it_decided_live() -> None:
    rounds = _rounds()
    controller = Controller(Policy().updated(f"{k}={v}" for k, v in rounds[0]["policy"].items()))
    replayed, live = [], []
    for line in rounds:
        controller.policy = Policy().updated(f"{k}={v}" for k, v in line["policy"].items())
        decided = controller.observe(Observation.from_dict(line))
        replayed += [(d.layer, d.kind.value, d.before, d.after) for d in decided]
        live += [(d["layer"], d["kind"], d["from"], d["to"]) for d in line["decisions"]]
    assert replayed == live
    assert live, "the recorded run decided something"
    assert {layer for layer, *_ in live} == {"exit-points"}  # the bottleneck only
    grown = [(before, after) for _, kind, before, after in live if kind == Kind.SCALE_OUT.value]
    sizes = [after for _, after in grown]
    enough = next(i for i, size in enumerate(sizes) if size * CAP >= STEP_LOAD)
    assert enough <= 1, grown  # capacity for the x4 step by the second scale-out
