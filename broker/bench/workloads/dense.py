"""W-dense: the academic matching workload (REIN, TAMA, OpIndex).

Events carry 20 numeric attributes over ``[0, 1e6)``; each subscription holds ``k`` range
predicates of width ``w`` on distinct attributes, optionally Zipf-skewed.
"""

from __future__ import annotations

import sys

import numpy as np

from broker.bench.workloads._common import (
    DENSE_SUBS,
    DENSE_UPDATES,
    check_count,
    collector_paused,
    seeded_rng,
)
from broker.model.attribute import Attribute
from broker.model.subscription import EntitySelector, Subscription
from broker.model.update import ContextUpdate

__all__ = ["DENSE_ATTRIBUTES", "DENSE_DOMAIN", "dense_subscriptions", "dense_updates"]

DENSE_ATTRIBUTES = tuple(sys.intern(f"a{j}") for j in range(20))
DENSE_DOMAIN = 1_000_000


def _dense_attribute_weights(attrs: int, skew: float) -> np.ndarray:
    weights = 1.0 / np.arange(1, attrs + 1, dtype=float) ** skew
    return np.asarray(weights / weights.sum())


def _skewed_unit(rng: np.random.Generator, shape: tuple[int, ...], skew: float) -> np.ndarray:
    """Uniform [0, 1) draws, or with ``skew`` > 0 ones bunched toward 0 (``u ** (1 + skew)``)."""
    draws = rng.random(shape)
    return np.asarray(draws if skew == 0.0 else draws ** (1.0 + skew))


@collector_paused
def dense_subscriptions(
    n: int,
    seed: int,
    attrs: int = 20,
    k: int = 10,
    width: float = 0.5,
    skew: float = 0.0,
) -> list[Subscription]:
    """``n`` W-dense subscriptions, ids ``dense-<i>``: ``k`` ranges on distinct attributes.

    Each range ``aX==lo..hi`` is ``width * 1e6`` wide, with ``lo`` uniform in
    ``[0, (1 - width) * 1e6]`` (integers), so it lies inside the domain; a uniform value
    falls in it with probability ``width``, and an event matches ``width ** k`` of the
    subscriptions (1/1024 for the defaults). With ``skew`` > 0, attributes are chosen with
    Zipf weights ``1 / rank ** skew`` and range positions bunch toward 0 like the values
    of :func:`dense_updates` with the same skew.
    """
    check_count("n", n)
    if not 1 <= k <= attrs <= len(DENSE_ATTRIBUTES):
        raise ValueError(
            f"need 1 <= k <= attrs <= {len(DENSE_ATTRIBUTES)}, got k={k} attrs={attrs}"
        )
    if not 0.0 < width <= 1.0:
        raise ValueError(f"width must be in (0, 1], got {width}")
    rng = seeded_rng(seed, DENSE_SUBS)
    span = round(width * DENSE_DOMAIN)
    keys = rng.random((n, attrs))
    if skew > 0.0:  # Efraimidis-Spirakis: weighted sampling without replacement
        keys = np.log(keys) / _dense_attribute_weights(attrs, skew)
    chosen = np.sort(np.argsort(-keys, axis=1)[:, :k], axis=1).tolist()
    lows = np.floor(_skewed_unit(rng, (n, k), skew) * (DENSE_DOMAIN - span + 1)).astype(np.int64)
    lows_list = lows.tolist()
    everything = (EntitySelector(id_pattern=".*"),)
    subscriptions = []
    for i in range(n):
        q = ";".join(
            f"{DENSE_ATTRIBUTES[a]}=={lo}..{lo + span}"
            for a, lo in zip(chosen[i], lows_list[i], strict=True)
        )
        subscriptions.append(
            Subscription(id=f"dense-{i}", entities=everything, q=q, subscriber="bench")
        )
    return subscriptions


@collector_paused
def dense_updates(m: int, seed: int, attrs: int = 20, skew: float = 0.0) -> list[ContextUpdate]:
    """``m`` W-dense events: entity ``urn:ngsi-ld:Event:<k>`` carrying all ``attrs`` values.

    Values are uniform in [0, 1e6) (with ``skew`` > 0: ``1e6 * u ** (1 + skew)``).
    """
    check_count("m", m)
    rng = seeded_rng(seed, DENSE_UPDATES)
    values = (_skewed_unit(rng, (m, attrs), skew) * DENSE_DOMAIN).tolist()
    number = sys.intern("Number")
    names = DENSE_ATTRIBUTES[:attrs]
    return [
        ContextUpdate(
            f"urn:ngsi-ld:Event:{k}",
            {name: Attribute(number, v) for name, v in zip(names, values[k], strict=True)},
            entity_type="Event",
            publisher="bench-dense",
            sequence=k + 1,
        )
        for k in range(m)
    ]
