"""The knobs of automatic scaling, their defaults, and their ``KEY=VALUE`` form.

A :class:`Policy` is frozen; :meth:`Policy.updated` applies ``KEY=VALUE`` settings (as
``silbo admin autoscale set`` will receive them) and checks the result, reporting every
problem at once in one :class:`~broker.errors.InvalidInput`. :meth:`Policy.settings` gives
the same keys back, to store and to show. The keys (docs/autoscaling.md explains each)::

    target-utilisation=0.7   alarming=0.8   scale-out=0.9   scale-in=0.5
    held-back-growth=2
    metrics-window-s=10      stabilisation-s=300      cooldown-s=15
    LAYER.min=1              LAYER.max=16             (LAYER one of LAYERS)

The thresholds are utilisations (fractions, 0 to 1) ordered
``0 < scale-in < target-utilisation < alarming <= scale-out <= 1``: a layer sized at the
target sits between the scale-in and the alarming thresholds, so neither fires again after a
decision (``alarming = scale-out`` turns pre-warming off). A layer that must grow while its
publishers are held back (they wait for room in their publish window, so what they are
offered is not seen) grows to at least ``held-back-growth`` times its size (a factor, 1 or
more; 1 turns it off).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from broker.errors import InvalidInput

__all__ = ["LAYERS", "Policy"]

# every layer the controller can scale, upstream first (the names of silbo admin scale)
LAYERS = ("connection-points", "access-points", "matchers", "exit-points", "context-stores")

_FRACTIONS = {
    "target-utilisation": "target_utilisation",
    "alarming": "alarming",
    "scale-out": "scale_out",
    "scale-in": "scale_in",
}
_FACTORS = {"held-back-growth": "held_back_growth"}
_SECONDS = {
    "metrics-window-s": "metrics_window_s",
    "stabilisation-s": "stabilisation_s",
    "cooldown-s": "cooldown_s",
}
MIN_PROCESSES = 1
MAX_PROCESSES = 16


def _bounds(value: int) -> Mapping[str, int]:
    return MappingProxyType(dict.fromkeys(LAYERS, value))


@dataclass(frozen=True, slots=True)
class Policy:
    """When and how far the controller scales each layer (defaults in the module docstring)."""

    target_utilisation: float = 0.7  # a layer is sized to be this busy
    alarming: float = 0.8  # above it, processes are pre-warmed (seed 004's alarming_threshold)
    scale_out: float = 0.9  # above it, the layer grows (seed 004's scale_out_threshold)
    scale_in: float = 0.5  # below it for stabilisation_s, the layer gives capacity back
    held_back_growth: float = 2.0  # a layer growing blind grows at least this many times
    metrics_window_s: float = 10.0  # the figures are averaged over this many seconds
    stabilisation_s: float = 300.0  # a need must stay low this long before a scale-in
    cooldown_s: float = 15.0  # no decision on a layer this long after it was scaled
    minimum: Mapping[str, int] = field(default_factory=lambda: _bounds(MIN_PROCESSES))
    maximum: Mapping[str, int] = field(default_factory=lambda: _bounds(MAX_PROCESSES))

    def updated(self, assignments: Iterable[str]) -> Policy:
        """This policy with ``KEY=VALUE`` settings applied; raises InvalidInput listing every
        problem (unknown key, bad number, thresholds out of order, min above max)."""
        changes: dict[str, float] = {}
        minimum, maximum = dict(self.minimum), dict(self.maximum)
        problems: list[str] = []
        for assignment in assignments:
            key, sep, text = assignment.partition("=")
            key, text = key.strip(), text.strip()
            if not sep or not key:
                problems.append(f"{assignment!r} is not KEY=VALUE")
            elif key in _FRACTIONS:
                changes[_FRACTIONS[key]] = _number(key, text, problems, "fraction")
            elif key in _SECONDS:
                changes[_SECONDS[key]] = _number(key, text, problems, "seconds")
            elif key in _FACTORS:
                changes[_FACTORS[key]] = _number(key, text, problems, "factor")
            elif key.endswith((".min", ".max")) and key[:-4] in LAYERS:
                bounds = minimum if key.endswith(".min") else maximum
                bounds[key[:-4]] = _count(key, text, problems, bounds[key[:-4]])
            else:
                problems.append(f"unknown key {key!r} (known: {', '.join(_keys())})")
        if problems:
            raise InvalidInput("; ".join(problems))
        policy = replace(
            self,
            minimum=MappingProxyType(minimum),
            maximum=MappingProxyType(maximum),
            **changes,
        )
        policy.check()
        return policy

    def check(self) -> None:
        """Raise InvalidInput listing every inconsistency of the knobs, if any."""
        problems = []
        order = (self.scale_in, self.target_utilisation, self.alarming, self.scale_out)
        if not (0 < order[0] < order[1] < order[2] <= order[3] <= 1):
            problems.append(
                "thresholds must be ordered 0 < scale-in < target-utilisation < alarming "
                f"<= scale-out <= 1 (now {self.scale_in:g} < {self.target_utilisation:g} < "
                f"{self.alarming:g} <= {self.scale_out:g})"
            )
        if self.held_back_growth < 1:
            problems.append(
                f"held-back-growth must be a factor of 1 or more (now {self.held_back_growth:g})"
            )
        if self.metrics_window_s <= 0:
            problems.append("metrics-window-s must be above 0")
        if self.stabilisation_s < self.metrics_window_s:
            problems.append(
                f"stabilisation-s ({self.stabilisation_s:g}) must be at least metrics-window-s "
                f"({self.metrics_window_s:g})"
            )
        for layer in LAYERS:
            low, high = self.minimum[layer], self.maximum[layer]
            if low < MIN_PROCESSES:
                problems.append(f"{layer}.min must be at least {MIN_PROCESSES}")
            if high < low:
                problems.append(f"{layer}.max ({high}) is below {layer}.min ({low})")
        if problems:
            raise InvalidInput("; ".join(problems))

    def settings(self) -> dict[str, str]:
        """Every knob as ``KEY -> VALUE`` text, the form :meth:`updated` reads."""
        named = _FRACTIONS | _FACTORS | _SECONDS
        shown = {key: f"{getattr(self, name):g}" for key, name in named.items()}
        for layer in LAYERS:
            shown[f"{layer}.min"] = str(self.minimum[layer])
            shown[f"{layer}.max"] = str(self.maximum[layer])
        return shown

    def clamp(self, layer: str, processes: int) -> int:
        """``processes`` brought within the layer's min and max."""
        return max(self.minimum[layer], min(self.maximum[layer], processes))


def _keys() -> list[str]:
    return [*_FRACTIONS, *_FACTORS, *_SECONDS, "LAYER.min", "LAYER.max"]


_WANTED = {
    "fraction": "a fraction from 0 to 1, e.g. 0.7",
    "seconds": "seconds, 0 or more",
    "factor": "a factor of 1 or more, e.g. 2",
}


def _number(key: str, text: str, problems: list[str], kind: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    low, high = {"fraction": (0, 1), "seconds": (0, math.inf), "factor": (1, math.inf)}[kind]
    if not (math.isfinite(value) and low <= value <= high):
        problems.append(f"{key} must be {_WANTED[kind]} (got {text!r})")
    return value


def _count(key: str, text: str, problems: list[str], current: int) -> int:
    try:
        return int(text)
    except ValueError:
        problems.append(f"{key} must be a whole number of processes (got {text!r})")
        return current
