"""W-fleet: vehicles moving about a city, and subscriptions to the circles around its places.

The geographical workload of ``silbo bench ngsi --workload geo``. The city is a box the size
of Madrid (:data:`CITY`, about 21 by 21 km); each of its vehicles (type ``Vehicle``, ids
``urn:ngsi-ld:Vehicle:bus<n>``, one service path per W-IoT district) starts at a random
place and, at each of its readings, moves 20 to 80 m in a random direction (turning back at
the city's edge). A reading carries the vehicle's ``location`` (``geo:json`` Point), the
same coordinates as two numbers (``latitude``, ``longitude``) and its ``speed``.

A subscription watches the circle of ``meters`` around a random place of the city
(:func:`fleet_places`), in one of two ways:

- with a geographical condition (:func:`near_expression`: ``georel near;maxDistance``,
  ``geometry point``, ``coords``), which the front checks;
- without one (:func:`box_subscriptions`): ``q`` ranges on ``latitude`` and ``longitude``
  that hold the circle (the smallest such box: 4/pi of its area), which the matchers check.

:func:`within` is the check's oracle for the first way: which places are within ``meters``
of each point, by the haversine formula on numpy (MongoDB's earth radius, as Orion's
``near``), written here and not taken from :mod:`broker.store.geo`, the code under test.
"""

from __future__ import annotations

import math
import sys

import numpy as np
import numpy.typing as npt

from broker.bench.workloads._common import (
    FLEET_PLACES,
    FLEET_UPDATES,
    check_count,
    collector_paused,
    seeded_rng,
)
from broker.bench.workloads.iot import DISTRICTS
from broker.model.attribute import Attribute
from broker.model.subscription import EntitySelector, Subscription
from broker.model.update import ContextUpdate

__all__ = [
    "CITY",
    "FLEET_ID_PREFIX",
    "FLEET_TYPE",
    "box_subscriptions",
    "fleet_places",
    "fleet_updates",
    "near_expression",
    "vehicle_number",
    "within",
]

FLEET_TYPE = "Vehicle"
FLEET_ID_PREFIX = "urn:ngsi-ld:Vehicle:bus"
CITY = (40.33, -3.83, 40.52, -3.58)  # min lat, min lon, max lat, max lon
EARTH_RADIUS_M = 6_378_100.0  # MongoDB's, as Orion's near measures
_METERS_PER_DEGREE = math.pi * EARTH_RADIUS_M / 180.0  # of latitude
_DECIMALS = 6  # coordinates as written: about 0.1 m


def vehicle_number(entity_id: str) -> int:
    """The number of a fleet vehicle from its id (``...:bus<n>``)."""
    return int(entity_id[len(FLEET_ID_PREFIX) :])


@collector_paused
def fleet_updates(m: int, seed: int, vehicles: int = 1000) -> list[ContextUpdate]:
    """``m`` readings of uniformly chosen vehicles, each moved from its previous place."""
    check_count("m", m)
    if vehicles < 1:
        raise ValueError(f"a fleet needs at least one vehicle, got {vehicles}")
    rng = seeded_rng(seed, FLEET_UPDATES)
    min_lat, min_lon, max_lat, max_lon = CITY
    lat = rng.uniform(min_lat, max_lat, size=vehicles)
    lon = rng.uniform(min_lon, max_lon, size=vehicles)
    which = rng.integers(0, vehicles, size=m).tolist()
    step = rng.uniform(20.0, 80.0, size=m).tolist()  # meters
    heading = rng.uniform(0.0, 2 * math.pi, size=m).tolist()
    number, geojson = sys.intern("Number"), sys.intern("geo:json")
    updates = []
    for k in range(m):
        v = which[k]
        meters_per_lon = _METERS_PER_DEGREE * math.cos(math.radians(lat[v]))
        dlat = step[k] * math.cos(heading[k]) / _METERS_PER_DEGREE
        dlon = step[k] * math.sin(heading[k]) / meters_per_lon
        lat[v] = _bounce(lat[v] + dlat, min_lat, max_lat)
        lon[v] = _bounce(lon[v] + dlon, min_lon, max_lon)
        y, x = round(float(lat[v]), _DECIMALS), round(float(lon[v]), _DECIMALS)
        attributes = {
            "location": Attribute(geojson, {"type": "Point", "coordinates": [x, y]}),
            "latitude": Attribute(number, y),
            "longitude": Attribute(number, x),
            "speed": Attribute(number, round(step[k] * 3.6 / 5.0, 1)),  # a reading every 5 s
        }
        updates.append(
            ContextUpdate(
                f"{FLEET_ID_PREFIX}{v}",
                attributes,
                entity_type=FLEET_TYPE,
                service_path="/" + DISTRICTS[v % len(DISTRICTS)],
                publisher="bench-fleet",
                sequence=k + 1,
            )
        )
    return updates


def fleet_places(n: int, seed: int) -> list[tuple[float, float]]:
    """``n`` (lat, lon) places drawn uniformly in the city."""
    check_count("n", n)
    rng = seeded_rng(seed, FLEET_PLACES)
    min_lat, min_lon, max_lat, max_lon = CITY
    lat = np.round(rng.uniform(min_lat, max_lat, size=n), _DECIMALS).tolist()
    lon = np.round(rng.uniform(min_lon, max_lon, size=n), _DECIMALS).tolist()
    return list(zip(lat, lon, strict=True))


def near_expression(place: tuple[float, float], meters: float) -> dict[str, str]:
    """A subscription's ``expression`` for the circle of ``meters`` around ``place``."""
    return {
        "georel": f"near;maxDistance:{meters:g}",
        "geometry": "point",
        "coords": f"{place[0]},{place[1]}",
    }


def box_subscriptions(places: list[tuple[float, float]], meters: float) -> list[Subscription]:
    """Per place, a subscription to every vehicle in the box that holds its circle, as
    ``q`` ranges on ``latitude`` and ``longitude`` (ids ``fleet-<i>``)."""
    selectors = (EntitySelector(id_pattern=".*", type=FLEET_TYPE),)
    dlat = meters / _METERS_PER_DEGREE
    subscriptions = []
    for i, (lat, lon) in enumerate(places):
        dlon = dlat / math.cos(math.radians(lat))
        q = (
            f"latitude=={lat - dlat:.{_DECIMALS}f}..{lat + dlat:.{_DECIMALS}f};"
            f"longitude=={lon - dlon:.{_DECIMALS}f}..{lon + dlon:.{_DECIMALS}f}"
        )
        subscriptions.append(
            Subscription(id=f"fleet-{i}", entities=selectors, q=q, description="box")
        )
    return subscriptions


def within(
    places: list[tuple[float, float]], meters: float, points: list[tuple[float, float]]
) -> list[npt.NDArray[np.int64]]:
    """Per (lat, lon) point, the positions of the places at most ``meters`` away from it
    (haversine on a sphere of :data:`EARTH_RADIUS_M`)."""
    if not places:
        return [np.zeros(0, dtype=np.int64) for _ in points]
    where = np.radians(np.array(places, dtype=np.float64))
    order = np.argsort(where[:, 0], kind="stable")
    phi, lam = where[order, 0], where[order, 1]
    band = meters / EARTH_RADIUS_M + 1e-9  # a place farther in latitude alone is farther
    out = []
    for lat, lon in points:
        p, q = math.radians(lat), math.radians(lon)
        lo, hi = np.searchsorted(phi, [p - band, p + band + 1e-12])
        a = (
            np.sin((phi[lo:hi] - p) / 2) ** 2
            + math.cos(p) * np.cos(phi[lo:hi]) * np.sin((lam[lo:hi] - q) / 2) ** 2
        )
        distance = 2 * EARTH_RADIUS_M * np.arcsin(np.minimum(1.0, np.sqrt(a)))
        out.append(np.sort(order[lo:hi][distance <= meters]).astype(np.int64))
    return out


def _bounce(value: float, low: float, high: float) -> float:
    """``value`` folded back into [low, high] (a vehicle turns back at the edge)."""
    if value < low:
        return 2 * low - value
    if value > high:
        return 2 * high - value
    return value
