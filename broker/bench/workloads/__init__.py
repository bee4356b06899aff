"""Deterministic generators for the benchmark workloads of workloads.md.

Three workloads, each a pair of generators ``<name>_subscriptions(n, seed)`` and
``<name>_updates(m, seed)``, registered in :data:`WORKLOADS`:

- **W-IoT** (``iot``): Madrid-like air-quality stations under tenant ``madrid``, one service
  path per district, a mix of per-station alerts, district ranges, type-wide and text filters.
- **W-dense** (``dense``): the academic matching workload (REIN, TAMA, OpIndex): 20 numeric
  attributes, ``k`` range predicates of width ``w`` per subscription.
- **W-text**: prefix / suffix / contains / regex filters on four Text attributes.

The same ``(n, seed)`` always gives the same subscriptions (and ``(m, seed)`` the same
updates): random draws come from numpy generators seeded by ``seed`` and a per-generator
stream number, so subscriptions and updates made with one seed are independent. Everything
that is not random by design (the city's stations, names and districts) is fixed. Thresholds
are drawn on small grids so that the distinct ``q`` texts stay few and the parser's cache
absorbs most of the parsing. docs/workloads.md describes the generators and their measured
selectivity.

Each workload lives in its own module (``iot``, ``dense``, ``text``); ``_common`` holds the
seeded streams, the collector pause and the count checks they share. This package exports
the public names and the registry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from broker.bench.workloads.dense import (
    DENSE_ATTRIBUTES,
    DENSE_DOMAIN,
    dense_subscriptions,
    dense_updates,
)
from broker.bench.workloads.iot import (
    DISTRICTS,
    IOT_TENANT,
    IOT_TYPE,
    POLLUTANTS,
    Pollutant,
    Station,
    iot_subscriptions,
    iot_updates,
    madrid_stations,
)
from broker.bench.workloads.text import (
    TEXT_ATTRIBUTES,
    TEXT_TYPES,
    text_subscriptions,
    text_updates,
)
from broker.model.subscription import Subscription
from broker.model.update import ContextUpdate

__all__ = [
    "DENSE_ATTRIBUTES",
    "DENSE_DOMAIN",
    "DISTRICTS",
    "IOT_TENANT",
    "IOT_TYPE",
    "POLLUTANTS",
    "TEXT_ATTRIBUTES",
    "TEXT_TYPES",
    "WORKLOADS",
    "Pollutant",
    "Station",
    "Workload",
    "dense_subscriptions",
    "dense_updates",
    "iot_subscriptions",
    "iot_updates",
    "madrid_stations",
    "text_subscriptions",
    "text_updates",
]


@dataclass(frozen=True, slots=True)
class Workload:
    """One named workload: how to make its subscriptions and updates, and its defaults."""

    name: str
    title: str
    subscriptions: Callable[[int, int], list[Subscription]]
    updates: Callable[[int, int], list[ContextUpdate]]
    default_updates: int


WORKLOADS: dict[str, Workload] = {
    "iot": Workload("iot", "W-IoT: city air quality", iot_subscriptions, iot_updates, 20_000),
    "dense": Workload(
        "dense",
        "W-dense: 20 numeric attributes, k=10, w=0.5",
        dense_subscriptions,
        dense_updates,
        2_000,
    ),
    "text": Workload("text", "W-text: string operators", text_subscriptions, text_updates, 20_000),
}
