"""What the workload generators share: seeded random streams, the collector pause, checks.

Each generator draws from its own stream of one seed (the ``*_SUBS`` / ``*_UPDATES``
numbers below), so subscriptions and updates made with one seed are independent. The
numbers are listed together here so that no two generators share one.
"""

from __future__ import annotations

import functools
import gc
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import numpy as np

__all__ = [
    "DENSE_SUBS",
    "DENSE_UPDATES",
    "FLEET_PLACES",
    "FLEET_UPDATES",
    "IOT_SUBS",
    "IOT_UPDATES",
    "TEXT_SUBS",
    "TEXT_UPDATES",
    "check_count",
    "collector_paused",
    "seeded_rng",
]

# Stream numbers: one per generator, so one seed gives independent draws for each.
IOT_SUBS, IOT_UPDATES, DENSE_SUBS, DENSE_UPDATES, TEXT_SUBS, TEXT_UPDATES = range(6)
FLEET_PLACES, FLEET_UPDATES = range(6, 8)

_P = ParamSpec("_P")
_T = TypeVar("_T")


def seeded_rng(seed: int, stream: int) -> np.random.Generator:
    """The numpy generator for ``stream`` of ``seed``: the same pair always draws the same."""
    if seed < 0:
        raise ValueError(f"seed must not be negative, got {seed}")
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(stream,)))


def collector_paused(generate: Callable[_P, _T]) -> Callable[_P, _T]:
    """Run ``generate`` with the cyclic garbage collector paused: building a million acyclic
    objects otherwise triggers collections that rescan all built so far (2-4x slower)."""

    @functools.wraps(generate)
    def paused(*args: _P.args, **kwargs: _P.kwargs) -> _T:
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            return generate(*args, **kwargs)
        finally:
            if was_enabled:
                gc.enable()

    return paused


def check_count(what: str, count: int) -> None:
    """Reject a negative number of subscriptions or updates, naming the argument."""
    if count < 0:
        raise ValueError(f"{what} must not be negative, got {count}")
