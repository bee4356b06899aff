"""Orion's geographical queries: ``georel``, ``geometry`` and ``coords`` on an entity's location.

Pure functions, no I/O. :func:`parse_geo` reads the three parameters of a query
(``GET /v2/entities``, ``POST /v2/op/query``'s ``expression``) or of a subscription's
``subject.condition.expression`` into a :class:`GeoFilter`; :func:`first_location` finds an
entity's location among its attributes; :meth:`GeoFilter.matches` tells whether a location
is in the relation asked. Sources: Orion's ``doc/manuals/orion-api.md`` ("api" below:
Geographical Queries, Geospatial properties of entities) and its code ("code":
``Scope::fill``, ``Georel::parse``, ``Geometry::parse``, ``getEntities.cpp``).

The parameters (api: Geographical Queries):

- ``georel``: ``near`` with ``maxDistance:M`` and/or ``minDistance:M`` (meters), or one of
  ``coveredBy``, ``intersects``, ``equals``, ``disjoint``;
- ``geometry``: ``point``, ``line``, ``polygon`` (at least 4 points, the last one the first)
  or ``box`` (two opposite corners);
- ``coords``: ``lat,lon;lat,lon...``, latitude first, as the NGSI v2 simple location
  format writes a point.

The three go together (a missing one is 400, as each problem below, with Orion's
description after "Invalid query: "); ``near`` takes a point only, ``coveredBy`` a polygon
or a box only (code: MongoDB cannot answer the others). Silbo's checks beyond Orion's, where
Orion hands MongoDB a query it then refuses: latitudes in [-90, 90], longitudes in
[-180, 180], distances not negative, a polygon whose edges do not cross.

An entity's location (api: Geospatial properties of entities) is its first attribute of a
geo type that has no ``ignoreType: true`` metadata, as Orion keeps one location per entity:

- ``geo:point``: ``"lat, lon"``; ``geo:line``: an array of at least two such strings;
  ``geo:box``: two of them (opposite corners); ``geo:polygon``: at least four, closed;
- ``geo:json``: a GeoJSON geometry (coordinates ``[lon, lat]``, as GeoJSON writes them), or a
  Feature, or a FeatureCollection of one Feature.

A location that does not read as one (a bad string, coordinates out of range, a polygon
whose edges cross) is none: the entity is left out of every geographical query, as an
entity without a location is (Orion refuses such an attribute when it is written; Silbo's
store keeps it, so the query skips it).

How the relations are computed (documented choices):

- ``near`` measures on the sphere: the haversine distance in meters, with MongoDB's earth
  radius (:data:`EARTH_RADIUS_M`, the one its ``$near`` uses), from the reference point to
  the location; for a line or an area, to its nearest point found on the lon/lat plane
  (exact for a point location, within a fraction of a percent for the small shapes a
  location usually is; 0 when the area covers the reference point). Both bounds include
  their value (``maxDistance:M`` takes an entity at M meters).
- ``coveredBy``, ``intersects``, ``equals``, ``disjoint`` are planar on (lon, lat), as
  MongoDB's legacy coordinate geometry and as its ``$geoWithin`` / ``$geoIntersects`` are
  for areas small against the earth (MongoDB follows great circles for GeoJSON edges: a
  long edge bends away from the straight lon/lat segment Silbo uses). ``coveredBy``
  includes the boundary; ``equals`` is topological (the same points, whatever the order of
  the vertices), where Orion compares the stored coordinates exactly.

Speed: the reference shape is prepared once per filter (shapely's prepared geometries: an
index of its edges), and each location's bounding box is checked against the reference's
before the exact test, so a scan of entities far away costs a few comparisons each. There is
no spatial index of entities: a query scans the entities its other criteria leave. Many
filters against one location (the front's geographical subscriptions) go through
:class:`broker.store.geo_index.GeoIndex`, which files them by :attr:`GeoFilter.reach`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from shapely.errors import ShapelyError
from shapely.geometry import LineString, Point, Polygon, box, shape
from shapely.geometry.base import BaseGeometry
from shapely.ops import nearest_points
from shapely.prepared import PreparedGeometry, prep

from broker.errors import InvalidGeoQuery

__all__ = [
    "EARTH_RADIUS_M",
    "GEOMETRIES",
    "GEORELS",
    "LOCATION_TYPES",
    "GeoFilter",
    "Location",
    "first_location",
    "haversine",
    "location_of",
    "parse_geo",
]

EARTH_RADIUS_M = 6_378_100.0  # MongoDB's kRadiusOfEarthInMeters, the radius of its $near
NEAR = "near"
COVERED_BY = "coveredBy"
INTERSECTS = "intersects"
EQUALS = "equals"
DISJOINT = "disjoint"
GEORELS = (NEAR, COVERED_BY, INTERSECTS, EQUALS, DISJOINT)
POINT = "point"
LINE = "line"
POLYGON = "polygon"
BOX = "box"
GEOMETRIES = (POINT, LINE, POLYGON, BOX)
LOCATION_TYPES = frozenset({"geo:point", "geo:line", "geo:box", "geo:polygon", "geo:json"})
IGNORE_TYPE = "ignoreType"  # metadata: true makes a geo-typed attribute no location

_MAX_DISTANCE = "maxDistance:"
_MIN_DISTANCE = "minDistance:"
_INVALID = "Invalid query: "
# a decimal number as Orion's str2double takes it (no "nan", "inf", hex or '_')
_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_MARGIN = 1e-9  # degrees added around a distance's bounding box (rounding)

Coordinates = tuple[float, float]  # (lat, lon), as NGSI v2 writes a point
Bounds = tuple[float, float, float, float]  # min lon, min lat, max lon, max lat


# -- locations ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Location:
    """An entity's location: its shape on the (lon, lat) plane, its bounding box, and for a
    point its (lat, lon), which ``near`` measures from without shapely."""

    geometry: BaseGeometry
    bounds: Bounds
    point: Coordinates | None = None


def first_location(attributes: Iterable[tuple[Any, Any, Any]]) -> Location | None:
    """The location of an entity from its attributes' (type, value, metadata), in order:
    the first of a geo type not marked ``ignoreType`` (module doc), or None. ``metadata``
    maps names to ``{"type", "value"}`` objects or to bare values."""
    for type_, value, metadata in attributes:
        if type_ in LOCATION_TYPES and not _ignored(metadata):
            return location_of(type_, value)
    return None


def location_of(type_: str, value: Any) -> Location | None:
    """The location an attribute of a geo type holds (None if it holds none: module doc)."""
    try:
        geometry = _geometry_of(type_, value)
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, ShapelyError):
        return None
    if geometry is None or geometry.is_empty or not _on_earth(geometry):
        return None
    if not geometry.is_valid:
        return None
    point = (geometry.y, geometry.x) if isinstance(geometry, Point) else None
    return Location(geometry, _bounds(geometry), point)


def _ignored(metadata: Any) -> bool:
    if not isinstance(metadata, Mapping):
        return False
    item = metadata.get(IGNORE_TYPE)
    value = item.get("value") if isinstance(item, Mapping) else item
    return value is True


def _geometry_of(type_: str, value: Any) -> BaseGeometry | None:
    if type_ == "geo:json":
        return _geojson(value)
    if type_ == "geo:point":
        return _point(_text_point(value)) if isinstance(value, str) else None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        return None
    points = [_text_point(v) for v in value]
    if any(p is None for p in points):
        return None
    return _shape_of(
        {"geo:line": LINE, "geo:box": BOX, "geo:polygon": POLYGON}[type_],
        [p for p in points if p is not None],
    )


def _geojson(value: Any) -> BaseGeometry | None:
    if not isinstance(value, dict):
        return None
    if value.get("type") == "FeatureCollection":
        features = value.get("features")
        if not isinstance(features, list) or len(features) != 1:
            return None
        value = features[0]
    if isinstance(value, dict) and value.get("type") == "Feature":
        value = value.get("geometry")
    if not isinstance(value, dict):
        return None
    geometry: BaseGeometry = shape(value)
    return geometry


def _text_point(text: str) -> Coordinates | None:
    """``"lat, lon"`` (None if it is not two decimal numbers)."""
    parts = text.split(",")
    if len(parts) != 2:
        return None
    lat, lon = (part.strip() for part in parts)
    if not _NUMBER.fullmatch(lat) or not _NUMBER.fullmatch(lon):
        return None
    return float(lat), float(lon)


def _shape_of(geometry: str, points: list[Coordinates]) -> BaseGeometry | None:
    """The shape of a ``geometry`` over (lat, lon) points; None if they cannot make one."""
    if geometry == POINT:
        return _point(points[0]) if len(points) == 1 else None
    if geometry == LINE:
        return LineString([(lon, lat) for lat, lon in points]) if len(points) >= 2 else None
    if geometry == BOX:
        if len(points) != 2:
            return None
        (lat1, lon1), (lat2, lon2) = points
        if lat1 == lat2 or lon1 == lon2:
            return None
        return box(min(lon1, lon2), min(lat1, lat2), max(lon1, lon2), max(lat1, lat2))
    if len(points) < 4 or points[0] != points[-1]:
        return None
    return Polygon([(lon, lat) for lat, lon in points])


def _point(coordinates: Coordinates | None) -> BaseGeometry | None:
    if coordinates is None:
        return None
    lat, lon = coordinates
    return Point(lon, lat)


def _on_earth(geometry: BaseGeometry) -> bool:
    min_lon, min_lat, max_lon, max_lat = geometry.bounds
    return bool(-180 <= min_lon <= max_lon <= 180 and -90 <= min_lat <= max_lat <= 90)


def _bounds(geometry: BaseGeometry) -> Bounds:
    min_lon, min_lat, max_lon, max_lat = geometry.bounds
    return float(min_lon), float(min_lat), float(max_lon), float(max_lat)


# -- distances ----------------------------------------------------------------------------------


def haversine(lat1: float, lon1: float, lat2: float, lon2: float) -> float:
    """The great-circle distance in meters between two (lat, lon) points in degrees, on a
    sphere of :data:`EARTH_RADIUS_M`."""
    phi1, phi2 = math.radians(lat1), math.radians(lat2)
    dphi = phi2 - phi1
    dlambda = math.radians(lon2 - lon1)
    a = math.sin(dphi / 2) ** 2 + math.cos(phi1) * math.cos(phi2) * math.sin(dlambda / 2) ** 2
    return 2 * EARTH_RADIUS_M * math.asin(min(1.0, math.sqrt(a)))


def _circle_bounds(lat: float, lon: float, meters: float) -> Bounds | None:
    """A (lon, lat) box holding every point within ``meters`` of (lat, lon) on the sphere;
    None where it would cross a pole or the antimeridian (no pre-check there).

    Latitudes: a point ``d`` away differs by at most d / R radians. Longitudes: by at most
    asin(sin(d / R) / cos(lat)) (the tangent of the circle to a meridian)."""
    angle = meters / EARTH_RADIUS_M
    dlat = math.degrees(angle) + _MARGIN
    if abs(lat) + dlat >= 90 or angle >= math.pi / 2:
        return None
    ratio = math.sin(angle) / math.cos(math.radians(lat))
    if ratio >= 1:
        return None
    dlon = math.degrees(math.asin(ratio)) + _MARGIN
    if lon - dlon < -180 or lon + dlon > 180:
        return None
    return lon - dlon, lat - dlat, lon + dlon, lat + dlat


def _overlap(a: Bounds, b: Bounds) -> bool:
    return a[0] <= b[2] and b[0] <= a[2] and a[1] <= b[3] and b[1] <= a[3]


# -- the filter ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GeoFilter:
    """A parsed geographical query (module doc): the relation, the reference geometry's
    kind and its (lat, lon) points, and for ``near`` its bounds in meters. The texts it was
    read from travel with the query; the shape is made again where it is read."""

    georel: str
    geometry: str
    points: tuple[Coordinates, ...]
    max_distance: float | None = None
    min_distance: float | None = None
    shape: BaseGeometry = field(init=False, repr=False, compare=False)
    _prepared: PreparedGeometry = field(init=False, repr=False, compare=False)
    _bounds: Bounds | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        reference = _shape_of(self.geometry, list(self.points))
        if reference is None:  # parse_geo checks every case first
            raise InvalidGeoQuery(f"{_INVALID}invalid area-type")
        object.__setattr__(self, "shape", reference)
        object.__setattr__(self, "_prepared", prep(reference))
        if self.georel == NEAR:
            lat, lon = self.points[0]
            limit = self.max_distance
            bounds = None if limit is None else _circle_bounds(lat, lon, limit)
        else:
            bounds = _bounds(reference)
        object.__setattr__(self, "_bounds", bounds)

    @property
    def near(self) -> bool:
        """Whether the filter is a ``near`` one (its results can be ordered by distance)."""
        return self.georel == NEAR

    @property
    def reach(self) -> Bounds | None:
        """A (lon, lat) box that every location the filter takes overlaps (None if there is
        none: ``disjoint``, ``near`` without ``maxDistance``, a circle over a pole or the
        antimeridian); what a spatial index of filters (broker.store.geo_index) files it by."""
        return None if self.georel == DISJOINT else self._bounds

    def matches(self, location: Location | None) -> bool:
        """Tell whether a location is in the filter's relation (no location: never)."""
        if location is None:
            return False
        if self.georel == NEAR:
            return self._near(location)
        overlaps = self._bounds is None or _overlap(self._bounds, location.bounds)
        if self.georel == DISJOINT:
            return not overlaps or self._prepared.disjoint(location.geometry)
        if not overlaps:
            return False
        if self.georel == INTERSECTS:
            return bool(self._prepared.intersects(location.geometry))
        if self.georel == COVERED_BY:
            return bool(self._prepared.covers(location.geometry))
        return bool(self.shape.equals(location.geometry))

    def distance(self, location: Location) -> float:
        """Meters from a ``near`` filter's point to the location (module doc)."""
        lat, lon = self.points[0]
        if location.point is not None:
            return haversine(lat, lon, *location.point)
        if location.geometry.intersects(self.shape):
            return 0.0
        nearest, _reference = nearest_points(location.geometry, self.shape)
        return haversine(lat, lon, nearest.y, nearest.x)

    def _near(self, location: Location) -> bool:
        if (
            location.point is None
            and self._bounds is not None
            and not _overlap(self._bounds, location.bounds)
        ):
            return False
        meters = self.distance(location)
        if self.max_distance is not None and meters > self.max_distance:
            return False
        return self.min_distance is None or meters >= self.min_distance


# -- parsing ------------------------------------------------------------------------------------


def parse_geo(georel: str | None, geometry: str | None, coords: str | None) -> GeoFilter | None:
    """The filter of a query's ``georel``, ``geometry`` and ``coords`` (None if none is
    given); InvalidGeoQuery (400) for what Orion refuses, and for one given without the
    others."""
    given = {"georel": georel, "geometry": geometry, "coords": coords}
    if all(not v for v in given.values()):
        return None
    for name, other in (("coords", "geometry"), ("geometry", "coords"), ("georel", "geometry")):
        if given[name] and not given[other]:
            raise InvalidGeoQuery(f"{_INVALID}URI param /{name}/ used without /{other}/")
    if not georel:
        raise InvalidGeoQuery(f"{_INVALID}URI param /geometry/ used without /georel/")
    assert geometry is not None and coords is not None
    relation, max_distance, min_distance = _georel(georel)
    kind = _geometry(geometry)
    if kind in (LINE, POINT) and relation == COVERED_BY:
        raise InvalidGeoQuery(f"{_INVALID}{kind} geometry cannot be used with coveredBy georel")
    if kind != POINT and relation == NEAR:
        raise InvalidGeoQuery(f"{_INVALID}georel /near/ used with geometry different than point")
    points = _coords(coords)
    _check_points(kind, points)
    return GeoFilter(relation, kind, points, max_distance, min_distance)


def _georel(text: str) -> tuple[str, float | None, float | None]:
    """``georel``'s relation and its ``near`` bounds (code: ``Georel::parse``)."""
    relation: str | None = None
    bounds: dict[str, float] = {}
    for item in (i.strip() for i in text.split(";") if i.strip()):
        if item in GEORELS:
            if relation is not None:
                raise InvalidGeoQuery(f"{_INVALID}georel type present more than once")
            relation = item
        elif item.startswith((_MAX_DISTANCE, _MIN_DISTANCE)):
            name = item.split(":", 1)[0]
            if name in bounds:
                raise InvalidGeoQuery(f"{_INVALID}{name} present more than once")
            bounds[name] = _distance(item[len(_MAX_DISTANCE) :], name)
        else:
            raise InvalidGeoQuery(f"{_INVALID}Invalid modifier in georel parameter")
    if relation is None:
        raise InvalidGeoQuery(f"{_INVALID}georel without a relation ({', '.join(GEORELS)})")
    for name in bounds:
        if relation != NEAR:
            raise InvalidGeoQuery(f"{_INVALID}{name} erroneously used with georel /{relation}/")
    if relation == NEAR and not bounds:
        raise InvalidGeoQuery(f"{_INVALID}georel /near/ without either minDistance nor maxDistance")
    return relation, bounds.get("maxDistance"), bounds.get("minDistance")


def _distance(text: str, name: str) -> float:
    if not _NUMBER.fullmatch(text.strip()):
        raise InvalidGeoQuery(f"{_INVALID}invalid number for {name}")
    meters = float(text)
    if not math.isfinite(meters) or meters < 0:
        raise InvalidGeoQuery(f"{_INVALID}{name} must be a number of meters, not negative")
    return meters


def _geometry(text: str) -> str:
    """``geometry``'s kind (code: ``Geometry::parse``; its ``radius`` and ``external`` are
    not NGSI v2's and are refused)."""
    items = [i.strip() for i in text.split(";") if i.strip()]
    if not items:
        raise InvalidGeoQuery(f"{_INVALID}error parsing geometry: empty geometry")
    if len(items) > 1:
        raise InvalidGeoQuery(
            f"{_INVALID}error parsing geometry: Invalid selector in geometry specification"
        )
    if items[0] not in GEOMETRIES:
        raise InvalidGeoQuery(
            f"{_INVALID}error parsing geometry: Invalid selector in geometry specification"
            f" (one of {', '.join(GEOMETRIES)})"
        )
    return items[0]


def _coords(text: str) -> tuple[Coordinates, ...]:
    """``coords``: ``lat,lon`` points separated by ``;``."""
    items = [i for i in text.split(";") if i.strip()]
    if not items:
        raise InvalidGeoQuery(f"{_INVALID}erroneous coordinates for geometry")
    points = []
    for item in items:
        parts = item.split(",")
        if len(parts) != 2:
            raise InvalidGeoQuery(f"{_INVALID}invalid point in URI param /coords/")
        point = _text_point(item)
        if point is None:
            raise InvalidGeoQuery(f"{_INVALID}invalid coordinates")
        lat, lon = point
        if not (-90 <= lat <= 90 and -180 <= lon <= 180):
            raise InvalidGeoQuery(
                f"{_INVALID}invalid coordinates: latitude {lat} must be within [-90, 90], "
                f"longitude {lon} within [-180, 180]"
            )
        points.append(point)
    return tuple(points)


def _check_points(kind: str, points: tuple[Coordinates, ...]) -> None:
    """Orion's checks of the points of each geometry (code: ``Scope::fill``)."""
    n = len(points)
    if kind == POINT and n != 1:
        raise InvalidGeoQuery(f"{_INVALID}invalid number of coordinates for /point/")
    if kind == LINE and n < 2:
        raise InvalidGeoQuery(f"{_INVALID}invalid number of coordinates for /line/")
    if kind == BOX:
        if n != 2:
            raise InvalidGeoQuery(f"{_INVALID}invalid number of coordinates for /box/")
        (lat1, lon1), (lat2, lon2) = points
        if lat1 == lat2 or lon1 == lon2:
            raise InvalidGeoQuery(f"{_INVALID}box coordinates are not defining an actual box")
    if kind == POLYGON:
        if n < 4:
            raise InvalidGeoQuery(f"{_INVALID}Too few coordinates for polygon")
        if points[0] != points[-1]:
            raise InvalidGeoQuery(f"{_INVALID}First and last point in polygon not the same")
        if not Polygon([(lon, lat) for lat, lon in points]).is_valid:
            raise InvalidGeoQuery(f"{_INVALID}the polygon's edges cross each other")
