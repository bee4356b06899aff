"""Automatic scaling of every layer (issue 19): the decision model, its knobs, the controller.

:mod:`broker.autoscale.model` turns load figures into scale decisions (DS2's needed
parallelism, seed 004's alarming / scale-out / scale-in thresholds); :mod:`broker.autoscale.policy`
holds the knobs. Both are pure: no I/O, no ZooKeeper, no processes. :mod:`broker.autoscale.
controller` runs the model on a cluster (observations from the members' load signals,
decisions carried out with the scale protocol, one leader elected in ZooKeeper) and
:mod:`broker.autoscale.state` keeps the switch, the policy and the decisions in ZooKeeper
(docs/autoscaling.md).
"""

from broker.autoscale.model import (
    PIPELINE,
    Controller,
    Decision,
    Kind,
    LayerSample,
    LayerView,
    Load,
    Observation,
    oscillations,
)
from broker.autoscale.policy import LAYERS, Policy

__all__ = [
    "LAYERS",
    "PIPELINE",
    "Controller",
    "Decision",
    "Kind",
    "LayerSample",
    "LayerView",
    "Load",
    "Observation",
    "Policy",
    "oscillations",
]
