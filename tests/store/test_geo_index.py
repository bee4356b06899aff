"""The spatial index of geographical filters (broker.store.geo_index): exactly the filters
the one-by-one check takes, for random filters and locations."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.store.geo import GeoFilter, Location, location_of, parse_geo
from broker.store.geo_index import GeoIndex

# Coordinates on a coarse grid around (0, 0), so that edges and corners meet often (the
# boundaries are where a box test could drop a filter the exact test takes).
GRID = st.integers(-8, 8).map(lambda n: n / 4)
METERS = st.sampled_from([1.0, 27_829.6, 27_830.0, 55_660.0, 111_319.0, 200_000.0])


def _coords(points: list[tuple[float, float]]) -> str:
    return ";".join(f"{lat!r},{lon!r}" for lat, lon in points)


@st.composite
def filters(draw: st.DrawFn) -> GeoFilter:
    kind = draw(st.sampled_from(["near", "near-min", "near-both", "box", "polygon", "line"]))
    lat, lon = draw(GRID), draw(GRID)
    if kind.startswith("near"):
        low, high = sorted((draw(METERS), draw(METERS)))
        georel = {
            "near": f"near;maxDistance:{high!r}",
            "near-min": f"near;minDistance:{low!r}",
            "near-both": f"near;maxDistance:{high!r};minDistance:{low!r}",
        }[kind]
        parsed = parse_geo(georel, "point", _coords([(lat, lon)]))
    else:
        other = (lat + draw(st.integers(1, 4)) / 4, lon + draw(st.integers(1, 4)) / 4)
        relations = ["intersects", "disjoint", "equals"]
        if kind == "box":
            relations.append("coveredBy")
            parsed = parse_geo(
                draw(st.sampled_from(relations)), "box", _coords([(lat, lon), other])
            )
        elif kind == "polygon":
            relations.append("coveredBy")
            ring = [(lat, lon), (other[0], lon), other, (lat, lon)]  # a triangle
            parsed = parse_geo(draw(st.sampled_from(relations)), "polygon", _coords(ring))
        else:
            parsed = parse_geo(
                draw(st.sampled_from(relations)), "line", _coords([(lat, lon), other])
            )
    assert parsed is not None
    return parsed


@st.composite
def locations(draw: st.DrawFn) -> Location | None:
    kind = draw(st.sampled_from(["point", "point", "box", "line", "none"]))
    lat, lon = draw(GRID), draw(GRID)
    if kind == "none":
        return None
    if kind == "point":
        return location_of("geo:point", f"{lat!r}, {lon!r}")
    other = f"{lat + draw(st.integers(1, 3)) / 4!r}, {lon + draw(st.integers(1, 3)) / 4!r}"
    return location_of(f"geo:{kind}", [f"{lat!r}, {lon!r}", other])


@settings(max_examples=200, deadline=None)
@given(st.lists(filters(), max_size=25), st.lists(locations(), max_size=8))
def test_the_index_takes_exactly_what_the_one_by_one_check_takes(
    chosen: list[GeoFilter], places: list[Location | None]
) -> None:
    where, taken = GeoIndex(chosen).matching(places)
    expected = [
        (i, f)
        for i, place in enumerate(places)
        for f, geo in enumerate(chosen)
        if geo.matches(place)
    ]
    assert list(zip(where.tolist(), taken.tolist(), strict=True)) == expected


def test_an_empty_index_and_no_location() -> None:
    where, taken = GeoIndex([]).matching([location_of("geo:point", "0, 0"), None])
    assert len(where) == len(taken) == 0
    near = parse_geo("near;maxDistance:10", "point", "0,0")
    assert near is not None
    where, taken = GeoIndex([near]).matching([None])
    assert len(where) == len(taken) == 0
