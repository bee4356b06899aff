"""Geographical queries (broker.store.geo): parsing as Orion does, locations, relations.

The expected values are worked out by hand (a degree of arc on MongoDB's sphere is
6 378 100 * pi / 180 = 111 318.8 m), not with shapely; the properties hold the filter to
oracles written apart from it (a dot-product distance, a bounds check).
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from broker.errors import InvalidGeoQuery, InvalidInput
from broker.store.geo import (
    EARTH_RADIUS_M,
    GeoFilter,
    Location,
    first_location,
    haversine,
    location_of,
    parse_geo,
)
from broker.store.query import EntityQuery, Order, select, sort_key
from broker.store.semantics import Document

DEGREE = EARTH_RADIUS_M * math.pi / 180  # 111 318.845 m: one degree of arc
SQUARE = "0,0;0,2;2,2;2,0;0,0"  # a polygon of lat/lon points, 2 degrees a side


def geo(georel: str, geometry: str, coords: str) -> GeoFilter:
    parsed = parse_geo(georel, geometry, coords)
    assert parsed is not None
    return parsed


def point(lat: float, lon: float) -> Location:
    found = location_of("geo:point", f"{lat}, {lon}")
    assert found is not None
    return found


def located(type_: str, value: Any) -> Location:
    found = location_of(type_, value)
    assert found is not None, (type_, value)
    return found


# -- distances ----------------------------------------------------------------------------------


def test_haversine_on_known_arcs() -> None:
    assert abs(DEGREE - 111_318.845) < 1e-3
    assert haversine(0, 0, 1, 0) == pytest.approx(DEGREE)  # along a meridian
    assert haversine(0, 0, 0, 1) == pytest.approx(DEGREE)  # along the equator
    assert haversine(0, 0, 0, 180) == pytest.approx(math.pi * EARTH_RADIUS_M)
    assert haversine(60, 0, 60, 1) == pytest.approx(  # a parallel's chord at 60 degrees:
        2 * EARTH_RADIUS_M * math.asin(0.5 * math.sin(math.radians(0.5)))  # shorter than
    )  # half a degree of the equator, by the great circle
    assert haversine(41.39, 2.15, 41.39, 2.15) == 0


def test_near_max_and_min_distance() -> None:
    within_1000 = geo("near;maxDistance:1000", "point", "0,0")
    beyond_1000 = geo("near;minDistance:1000", "point", "0,0")
    ring = geo("near;minDistance:500;maxDistance:1000", "point", "0,0")
    close, far = point(0.005, 0), point(0, 0.01)  # 556.6 m north, 1113.2 m east
    assert (within_1000.matches(close), within_1000.matches(far)) == (True, False)
    assert (beyond_1000.matches(close), beyond_1000.matches(far)) == (False, True)
    assert (ring.matches(close), ring.matches(far), ring.matches(point(0, 0))) == (
        True,
        False,
        False,
    )
    assert within_1000.distance(close) == pytest.approx(0.005 * DEGREE)


def test_near_measures_to_the_nearest_point_of_an_area() -> None:
    square = located("geo:polygon", ["0, 0", "0, 2", "2, 2", "2, 0", "0, 0"])
    assert geo("near;maxDistance:1", "point", "1,1").distance(square) == 0  # inside
    east = geo("near;maxDistance:120000", "point", "1,3")  # one degree east of its edge
    assert east.distance(square) == pytest.approx(DEGREE * math.cos(math.radians(1)), rel=1e-4)
    assert east.matches(square)
    assert not geo("near;maxDistance:100000", "point", "1,3").matches(square)
    far = geo("near;maxDistance:1000", "point", "50,50")  # the bounding boxes settle it
    assert not far.matches(square)


# -- relations ----------------------------------------------------------------------------------


def test_covered_by_a_box_and_a_polygon() -> None:
    box = geo("coveredBy", "box", "1,1;0,0")  # corners in any order
    assert box.matches(point(0.5, 0.5))
    assert box.matches(point(1, 0.5))  # the boundary is covered
    assert not box.matches(point(1.5, 0.5))
    assert not box.matches(point(0.5, 1.5))
    polygon = geo("coveredBy", "polygon", SQUARE)
    assert polygon.matches(located("geo:line", ["0.5, 0.5", "1.5, 1.5"]))
    assert not polygon.matches(located("geo:line", ["0.5, 0.5", "2.5, 1.5"]))
    assert polygon.matches(located("geo:box", ["0.5, 0.5", "1.5, 1.5"]))


def test_a_line_crossing_a_polygon() -> None:
    crossing = located("geo:line", ["-1, 1", "3, 1"])  # south to north through the square
    apart = located("geo:line", ["3, 3", "4, 4"])
    assert geo("intersects", "polygon", SQUARE).matches(crossing)
    assert not geo("coveredBy", "polygon", SQUARE).matches(crossing)
    assert not geo("disjoint", "polygon", SQUARE).matches(crossing)
    assert not geo("intersects", "polygon", SQUARE).matches(apart)
    assert geo("disjoint", "polygon", SQUARE).matches(apart)
    assert geo("intersects", "line", "1,-1;1,3").matches(crossing)  # two lines crossing


def test_equals_and_the_order_of_latitude_and_longitude() -> None:
    """NGSI v2 writes "lat, lon"; GeoJSON [lon, lat]: both name the same point."""
    same = geo("equals", "point", "41.39,2.15")
    assert same.matches(point(41.39, 2.15))
    assert same.matches(located("geo:json", {"type": "Point", "coordinates": [2.15, 41.39]}))
    assert not same.matches(located("geo:json", {"type": "Point", "coordinates": [41.39, 2.15]}))
    box = geo("equals", "box", "0,0;2,2")
    assert box.matches(located("geo:polygon", ["0, 0", "2, 0", "2, 2", "0, 2", "0, 0"]))
    north = geo("coveredBy", "box", "40,0;42,4")  # lat 40..42, lon 0..4
    assert north.matches(located("geo:json", {"type": "Point", "coordinates": [2.15, 41.39]}))
    assert not north.matches(located("geo:json", {"type": "Point", "coordinates": [41.39, 2.15]}))


# -- locations ----------------------------------------------------------------------------------


def test_the_first_geo_attribute_not_ignored_is_the_location() -> None:
    ignored = {"ignoreType": {"type": "Boolean", "value": True}}
    attributes = [
        ("Number", 3, {}),
        ("geo:point", "10, 10", ignored),
        ("geo:point", "1, 2", {}),
        ("geo:point", "5, 5", {}),
    ]
    found = first_location(attributes)
    assert found is not None and found.point == (1.0, 2.0)
    assert first_location([("Text", "1, 2", {})]) is None
    assert first_location([]) is None


@pytest.mark.parametrize(
    ("type_", "value"),
    [
        ("geo:point", "1"),
        ("geo:point", "1, 2, 3"),
        ("geo:point", "north, 2"),
        ("geo:point", "91, 0"),  # latitude past the pole
        ("geo:point", "0, 181"),
        ("geo:point", [1, 2]),
        ("geo:line", ["1, 1"]),
        ("geo:line", "1, 1"),
        ("geo:box", ["1, 1", "1, 2"]),  # not an area
        ("geo:polygon", ["0, 0", "0, 1", "1, 1", "1, 0"]),  # not closed
        ("geo:polygon", ["0, 0", "1, 1", "0, 1", "1, 0", "0, 0"]),  # its edges cross
        ("geo:json", {"type": "Point"}),
        ("geo:json", {"type": "Point", "coordinates": [200, 0]}),
        ("geo:json", {"type": "Circle", "coordinates": [0, 0]}),
        ("geo:json", "0, 0"),
    ],
)
def test_what_is_no_location(type_: str, value: Any) -> None:
    assert location_of(type_, value) is None


def test_geojson_features_and_shapes() -> None:
    feature = {"type": "Feature", "geometry": {"type": "Point", "coordinates": [1, 2]}}
    assert located("geo:json", feature).point == (2, 1)
    assert located("geo:json", {"type": "FeatureCollection", "features": [feature]}).point == (2, 1)
    multi = {"type": "MultiPoint", "coordinates": [[1, 1], [5, 5]]}
    assert geo("intersects", "box", "0,0;2,2").matches(located("geo:json", multi))
    assert not geo("coveredBy", "box", "0,0;2,2").matches(located("geo:json", multi))


def test_no_location_never_matches() -> None:
    for georel, geometry in (("disjoint", "box"), ("near;maxDistance:1e9", "point")):
        coords = "0,0;1,1" if geometry == "box" else "0,0"
        assert not geo(georel, geometry, coords).matches(None)


# -- parsing ------------------------------------------------------------------------------------


def test_parsed_parameters() -> None:
    assert parse_geo(None, None, None) is None
    near = geo("near;maxDistance:1000;minDistance:10", "point", " 41.39 , 2.15 ")
    assert (near.georel, near.geometry, near.points) == ("near", "point", ((41.39, 2.15),))
    assert (near.max_distance, near.min_distance, near.near) == (1000, 10, True)
    assert geo("coveredBy", "polygon", SQUARE + ";").points[-1] == (0, 0)


@pytest.mark.parametrize(
    ("georel", "geometry", "coords", "message"),
    [
        (None, None, "1,2", "URI param /coords/ used without /geometry/"),
        (None, "point", None, "URI param /geometry/ used without /coords/"),
        ("near;maxDistance:1", None, None, "URI param /georel/ used without /geometry/"),
        (None, "point", "1,2", "URI param /geometry/ used without /georel/"),
        ("near", "point", "1,2", "georel /near/ without either minDistance nor maxDistance"),
        ("near;maxDistance:x", "point", "1,2", "invalid number for maxDistance"),
        ("near;maxDistance:-1", "point", "1,2", "maxDistance must be a number of meters"),
        ("near;maxDistance:1;maxDistance:2", "point", "1,2", "maxDistance present more than"),
        ("near;near", "point", "1,2", "georel type present more than once"),
        ("within", "point", "1,2", "Invalid modifier in georel parameter"),
        ("maxDistance:1", "point", "1,2", "georel without a relation"),
        ("coveredBy;maxDistance:1", "box", "1,2;3,4", "maxDistance erroneously used with"),
        ("near;maxDistance:1", "box", "1,2;3,4", "georel /near/ used with geometry different"),
        ("coveredBy", "point", "1,2", "point geometry cannot be used with coveredBy georel"),
        ("coveredBy", "line", "1,2;3,4", "line geometry cannot be used with coveredBy georel"),
        ("intersects", "circle", "1,2", "error parsing geometry: Invalid selector in geometry"),
        ("intersects", "point;external", "1,2", "error parsing geometry: Invalid selector"),
        ("intersects", "point", ";", "erroneous coordinates for geometry"),
        ("intersects", "point", "1,2,3", "invalid point in URI param /coords/"),
        ("intersects", "point", "1,north", "invalid coordinates"),
        ("intersects", "point", "91,0", "invalid coordinates: latitude 91.0 must be within"),
        ("intersects", "point", "1,2;3,4", "invalid number of coordinates for /point/"),
        ("intersects", "line", "1,2", "invalid number of coordinates for /line/"),
        ("intersects", "box", "1,2", "invalid number of coordinates for /box/"),
        ("intersects", "box", "1,2;1,4", "box coordinates are not defining an actual box"),
        ("intersects", "polygon", "0,0;0,1;0,0", "Too few coordinates for polygon"),
        ("intersects", "polygon", "0,0;0,1;1,1;1,0", "First and last point in polygon not"),
        ("intersects", "polygon", "0,0;1,1;0,1;1,0;0,0", "the polygon's edges cross"),
    ],
)
def test_what_orion_refuses(
    georel: str | None, geometry: str | None, coords: str | None, message: str
) -> None:
    with pytest.raises(InvalidGeoQuery, match=f"^Invalid query: {message}") as caught:
        parse_geo(georel, geometry, coords)
    assert isinstance(caught.value, InvalidInput)  # 400 BadRequest


# -- on documents: the store's query path ---------------------------------------------------------


def _document(entity_id: str, attributes: dict[str, Any], created: float) -> Document:
    return Document(entity_id, "Shop", "/", "", attributes, created, created)


SHOPS = [
    _document("far", {"at": {"type": "geo:point", "value": "0, 0.02", "metadata": {}}}, 1),
    _document("near", {"at": {"type": "geo:point", "value": "0, 0.001", "metadata": {}}}, 2),
    _document("mid", {"at": {"type": "geo:point", "value": "0.005, 0", "metadata": {}}}, 3),
    _document("none", {"name": {"type": "Text", "value": "0, 0", "metadata": {}}}, 4),
]


def test_query_with_geo_filter_and_distance_order_round_trips_the_wire() -> None:
    query = EntityQuery(
        tenant="",
        georel="near;maxDistance:1000",
        geometry="point",
        coords="0,0",
        order_by=(Order("geo:distance"),),
    )
    again = EntityQuery.from_wire(query.to_wire())
    assert again == query and again.geo == query.geo
    part = select(SHOPS, again, now=10)
    assert [d.id for d in part.documents] == ["near", "mid"]  # by distance, not creation
    assert sort_key(part.documents[0], again)[0] == (1, pytest.approx(0.001 * DEGREE))
    descending = EntityQuery(**{**_fields(query), "order_by": (Order("geo:distance", True),)})
    assert [d.id for d in select(SHOPS, descending, now=10).documents] == ["mid", "near"]
    disjoint = EntityQuery(tenant="", georel="disjoint", geometry="box", coords="-1,-1;1,0.01")
    assert [d.id for d in select(SHOPS, disjoint, now=10).documents] == ["far"]  # not "none"


def test_geo_distance_order_needs_a_near_query() -> None:
    with pytest.raises(InvalidGeoQuery, match="geo:distance needs a georel=near"):
        EntityQuery(tenant="", order_by=(Order("geo:distance"),))
    with pytest.raises(InvalidGeoQuery):
        EntityQuery(
            tenant="",
            georel="coveredBy",
            geometry="box",
            coords="0,0;1,1",
            order_by=(Order("geo:distance"),),
        )


def _fields(query: EntityQuery) -> dict[str, Any]:
    names = ("tenant", "scopes", "selectors", "q", "mq", "georel", "geometry", "coords")
    return {name: getattr(query, name) for name in (*names, "order_by", "limit", "offset")}


# -- properties ---------------------------------------------------------------------------------

LATITUDES = st.floats(-80, 80, allow_nan=False)
LONGITUDES = st.floats(-177, 177, allow_nan=False)  # plus at most 3 degrees: on earth


def _oracle_distance(lat1: float, lon1: float, lat2: float, lon2: float) -> float:
    """The great-circle distance by the angle between unit vectors (not haversine)."""

    def unit(lat: float, lon: float) -> tuple[float, float, float]:
        phi, lam = math.radians(lat), math.radians(lon)
        return math.cos(phi) * math.cos(lam), math.cos(phi) * math.sin(lam), math.sin(phi)

    a, b = unit(lat1, lon1), unit(lat2, lon2)
    cross = (
        a[1] * b[2] - a[2] * b[1],
        a[2] * b[0] - a[0] * b[2],
        a[0] * b[1] - a[1] * b[0],
    )
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return EARTH_RADIUS_M * math.atan2(math.hypot(*cross), dot)


@settings(max_examples=300, deadline=None)
@given(
    LATITUDES,
    LONGITUDES,
    st.floats(-3, 3, allow_nan=False),
    st.floats(-3, 3, allow_nan=False),
    st.floats(1, 400_000, allow_nan=False),
)
def test_near_agrees_with_a_distance_oracle(
    lat: float, lon: float, dlat: float, dlon: float, meters: float
) -> None:
    other_lat, other_lon = lat + dlat, lon + dlon
    expected = _oracle_distance(lat, lon, other_lat, other_lon)
    assume(abs(expected - meters) > 1e-3)  # not on the circle, where rounding decides
    within = geo(f"near;maxDistance:{meters!r}", "point", f"{lat!r},{lon!r}")
    beyond = geo(f"near;minDistance:{meters!r}", "point", f"{lat!r},{lon!r}")
    location = point(other_lat, other_lon)
    assert within.matches(location) == (expected <= meters)
    assert beyond.matches(location) == (expected >= meters)
    # a tiny square around the point: the circle's bounding box never drops it wrongly
    square = located(
        "geo:box", [f"{other_lat!r}, {other_lon!r}", f"{other_lat + 1e-7!r}, {other_lon + 1e-7!r}"]
    )
    if expected <= meters:
        assert within.matches(square)


@settings(max_examples=300, deadline=None)
@given(LATITUDES, LONGITUDES, LATITUDES, LONGITUDES, LATITUDES, LONGITUDES)
def test_covered_by_a_box_agrees_with_a_bounds_check(
    lat1: float, lon1: float, lat2: float, lon2: float, lat: float, lon: float
) -> None:
    assume(lat1 != lat2 and lon1 != lon2)
    box = geo("coveredBy", "box", f"{lat1!r},{lon1!r};{lat2!r},{lon2!r}")
    inside = min(lat1, lat2) <= lat <= max(lat1, lat2) and min(lon1, lon2) <= lon <= max(lon1, lon2)
    location = point(lat, lon)
    assert box.matches(location) == inside
    intersects = geo("intersects", "box", f"{lat1!r},{lon1!r};{lat2!r},{lon2!r}")
    disjoint = geo("disjoint", "box", f"{lat1!r},{lon1!r};{lat2!r},{lon2!r}")
    assert intersects.matches(location) == inside  # a point meets a box where it lies in it
    assert disjoint.matches(location) != inside
