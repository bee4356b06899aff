"""Which of many geographical filters each location is in, without testing every filter.

The front holds one :class:`~broker.store.geo.GeoFilter` per geographical subscription
(``near`` circles around places, areas to watch...), and each entity the matchers matched
for them must be checked against all of them. :class:`GeoIndex` files the filters by their
:attr:`~broker.store.geo.GeoFilter.reach` (the box every location a filter takes overlaps)
in a shapely ``STRtree``; a location is tested exactly (:meth:`GeoFilter.matches`) only
against the filters whose box its own bounding box overlaps, and against those that have no
box (``disjoint``, ``near`` with only ``minDistance``), which every location is tested
against. The answer is exactly the one-by-one check's (tests/store/test_geo_index.py, a
property test): the boxes only leave out filters that could not take the location.

Built once for a set of filters (the front makes it again when its subscriptions change);
pure, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import shapely
from shapely import STRtree

from broker.store.geo import GeoFilter, Location

__all__ = ["GeoIndex"]


class GeoIndex:
    """Filters filed by their boxes (module doc); positions are those in ``filters``."""

    def __init__(self, filters: Sequence[GeoFilter]) -> None:
        self._filters = list(filters)
        reaches = [f.reach for f in self._filters]
        boxed = [i for i, reach in enumerate(reaches) if reach is not None]
        self._everywhere = [i for i, reach in enumerate(reaches) if reach is None]
        self._boxed = np.array(boxed, dtype=np.int64)
        corners = np.array([reaches[i] for i in boxed], dtype=np.float64).reshape(-1, 4)
        boxes = shapely.box(corners[:, 0], corners[:, 1], corners[:, 2], corners[:, 3])
        self._tree = STRtree(boxes)

    def __len__(self) -> int:
        return len(self._filters)

    def matching(
        self, locations: Sequence[Location | None]
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """Every (location, filter) pair, by positions, whose filter takes the location: two
        arrays, ordered by location and then by filter (no location: no filter)."""
        where = [i for i, location in enumerate(locations) if location is not None]
        pairs: list[tuple[int, int]] = []
        if where:
            geometries = [locations[i].geometry for i in where]  # type: ignore[union-attr]
            found = self._tree.query(geometries) if len(self._boxed) else np.zeros((2, 0))
            candidates: list[list[int]] = [list(self._everywhere) for _ in where]
            for k, box in zip(found[0].tolist(), found[1].tolist(), strict=True):
                candidates[k].append(int(self._boxed[box]))
            filters = self._filters
            for k, chosen in enumerate(candidates):
                location = locations[where[k]]
                pairs += [(where[k], f) for f in sorted(chosen) if filters[f].matches(location)]
        if not pairs:
            empty = np.zeros(0, dtype=np.int64)
            return empty, empty.copy()
        both = np.array(pairs, dtype=np.int64)
        return both[:, 0], both[:, 1]
