"""Aggregation groups: what a definition says, and how one applied write folds into it.

Pure functions and values, no I/O (docs/aggregation.md has the whole design): a
:class:`Definition` is what ``POST /v2/x/aggregations`` keeps (:func:`parse_definition`
checks it); :func:`contributions` turns one applied write into the :class:`Partial` each of
its values adds to a *pane* (a slice of time as long as the window's slide) of a group
key; :func:`window_attributes` renders the merged panes of one window as the derived
entity's attributes. ``broker.store.aggregation_runtime`` keeps the panes of one store
process and closes them.

Levels: ``groupBy`` is one level or a list of them (a hierarchy). Level 0 takes the
selected entities' own attributes and groups them by the value of its attribute (e.g.
``refBuilding``): that value is the id of the derived entity, of the level's type
(``Building``). Level ``i`` takes the entities of level ``i - 1``'s type, the derived
attributes they were written, and groups them by its own attribute (``refCampus``) into
entities of its type (``Campus``). A derived attribute carries its window's
:class:`Partial` in its ``aggregate`` metadata (and, for a sliding window, its last pane's),
so a level above merges partials, never results: a campus average is the average of every
sensor value under it, not an average of averages. The same holds for any group whose
selected attributes are derived ones (a group of derived entities defined apart).

Windows: tumbling (``size``) or sliding (``size`` and ``slide``, the size a whole multiple
of the slide, at most :data:`MAX_PANES` panes). Time is cut into panes of ``slide`` seconds
from the epoch; a window is the ``size / slide`` panes before its end, so a sliding window is
exact: its panes are merged, nothing is subtracted. A value counts in the pane of the time
its write at level 0 (:func:`event_time`: when the store applied it, which is the entity's
new ``dateModified`` if the write changed it, in whole microseconds, as the archive keeps
it), or of its window's pane (levels above). So the live stores and a backfill from the
archive (``silbo backfill``) put every value in the same pane.

Which values count: a write's attributes that the request named (so an update repeating a
value counts it again, as a reading) whose value is a number (not a boolean); any other
value is skipped. A write that deletes counts nothing.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from broker.errors import InvalidInput, SilboError
from broker.model.change import Alteration, Change
from broker.model.identifiers import DEFAULT_SCOPE, check_identifier, check_scope
from broker.store.history_fold import micros
from broker.store.query import EntityQuery, Selector, matches
from broker.store.semantics import Document, iso8601

__all__ = [
    "AGGREGATE_METADATA",
    "FUNCTIONS",
    "ID",
    "MAX_PANES",
    "Contribution",
    "Definition",
    "Level",
    "Partial",
    "Window",
    "contributions",
    "derived_pane",
    "event_time",
    "merge_all",
    "parse_definition",
    "parse_duration",
    "parse_selection",
    "window_attributes",
]

FUNCTIONS: Final = ("count", "sum", "min", "max", "avg", "last")
AGGREGATE_METADATA: Final = "aggregate"  # a derived attribute's partial (module doc)
MAX_PANES: Final = 60  # panes in one sliding window
MIN_SLIDE: Final = 1.0  # seconds: the shortest pane
MAX_SIZE: Final = 86_400.0  # seconds: the longest window
MAX_LEVELS: Final = 8
MAX_ATTRIBUTES: Final = 32
ID: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")  # a definition's id
MAX_TEXT: Final = 1024  # characters of a description, an idPattern, a q
_DURATION: Final = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNITS: Final = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86_400.0}
_FIELDS: Final = frozenset(
    {"id", "description", "entities", "groupBy", "attributes", "functions", "window"}
)


class _Bad(InvalidInput):
    """A definition that cannot be kept (400 BadRequest, with what to fix)."""


@dataclass(frozen=True, slots=True)
class Partial:
    """What some values fold into: their count, sum, least, greatest, and the last one
    (by time; ``last_at`` its time). Merging two is exact and order-free."""

    count: int = 0
    total: float = 0
    low: float = math.inf
    high: float = -math.inf
    last: float = 0
    last_at: float = -math.inf

    @classmethod
    def of(cls, value: float, at: float) -> Partial:
        """The partial of one value, taken at ``at``."""
        return cls(1, value, value, value, value, at)

    def merged(self, other: Partial) -> Partial:
        """Both together (the later ``last`` wins; at one time, the greater value)."""
        if not other.count:
            return self
        if not self.count:
            return other
        later = (other.last_at, other.last) > (self.last_at, self.last)
        return Partial(
            self.count + other.count,
            self.total + other.total,
            min(self.low, other.low),
            max(self.high, other.high),
            other.last if later else self.last,
            other.last_at if later else self.last_at,
        )

    def result(self, function: str) -> float:
        """The value of ``function`` (one of FUNCTIONS) over what was folded."""
        if function == "count":
            return self.count
        if function == "sum":
            return self.total
        if function == "min":
            return self.low
        if function == "max":
            return self.high
        if function == "avg":
            return self.total / self.count
        return self.last

    def to_wire(self) -> list[Any]:
        """The partial as a msgpack-able list (what :meth:`from_wire` reads)."""
        return [self.count, self.total, self.low, self.high, self.last, self.last_at]

    @classmethod
    def from_wire(cls, data: Any) -> Partial:
        count, total, low, high, last, last_at = data
        return cls(int(count), total, low, high, last, last_at)

    def to_json(self) -> dict[str, Any]:
        """The partial as the ``aggregate`` metadata shows it."""
        return {
            "count": self.count,
            "sum": self.total,
            "min": self.low,
            "max": self.high,
            "last": self.last,
            "lastAt": self.last_at,
        }

    @classmethod
    def from_json(cls, data: Any) -> Partial | None:
        """The partial an ``aggregate`` metadata holds (None: it holds none)."""
        if not isinstance(data, Mapping):
            return None
        try:
            numbers = [data[k] for k in ("count", "sum", "min", "max", "last", "lastAt")]
        except KeyError:
            return None
        if not all(_number(n) for n in numbers) or int(numbers[0]) != numbers[0]:
            return None
        if numbers[0] <= 0:
            return None
        count, total, low, high, last, last_at = numbers
        return cls(int(count), total, low, high, last, last_at)


@dataclass(frozen=True, slots=True)
class Window:
    """Tumbling (``slide == size``) or sliding windows, in seconds (module doc)."""

    size: float
    slide: float

    @property
    def sliding(self) -> bool:
        return self.slide != self.size

    @property
    def label(self) -> str:
        """The size as derived attribute names show it: ``5m``, ``1s``, ``90s``, ``2h``."""
        return _label(self.size)

    def pane(self, at: float) -> float:
        """The start of the pane holding time ``at``."""
        return math.floor(at / self.slide) * self.slide

    def ends_with(self, pane: float) -> list[float]:
        """The ends of the windows the pane starting at ``pane`` is in, in order."""
        count = round(self.size / self.slide)
        return [pane + self.slide * (i + 1) for i in range(count)]

    def panes_before(self, end: float) -> list[float]:
        """The starts of the panes of the window ending at ``end``, in order."""
        count = round(self.size / self.slide)
        return [end - self.slide * (count - i) for i in range(count)]

    def to_json(self) -> dict[str, Any]:
        if self.sliding:
            return {"type": "sliding", "size": _label(self.size), "slide": _label(self.slide)}
        return {"type": "tumbling", "size": _label(self.size)}


@dataclass(frozen=True, slots=True)
class Level:
    """One level of a group's hierarchy: the attribute whose value names the group, and the
    type of the entities the groups are written as."""

    attribute: str
    type: str


@dataclass(frozen=True, slots=True)
class Definition:
    """One aggregation group, as checked (see :func:`parse_definition`)."""

    id: str
    tenant: str
    scope: str
    levels: tuple[Level, ...]
    attributes: tuple[str, ...]
    functions: tuple[str, ...]
    window: Window
    entity_type: str | None = None
    id_pattern: str | None = None
    q: str = ""
    description: str = ""
    _queries: tuple[EntityQuery, ...] = field(default=(), repr=False, compare=False)

    def __post_init__(self) -> None:
        first = EntityQuery(
            self.tenant,
            (self.scope,),
            (Selector(id_pattern=self.id_pattern, type=self.entity_type),),
            q=self.q,
        )
        above = tuple(
            EntityQuery(self.tenant, (self.scope,), (Selector(type=level.type),))
            for level in self.levels[:-1]
        )
        object.__setattr__(self, "_queries", (first, *above))

    def derived_name(self, attribute: str, function: str) -> str:
        """The name of the derived attribute of ``function`` over ``attribute``."""
        return f"{attribute}_{function}_{self.window.label}"

    def inputs(self, level: int) -> dict[str, str]:
        """What level ``level`` reads of its entities: attribute name -> the attribute its
        values count for (level 0: the attributes themselves; above: each one's first
        derived attribute, whose ``aggregate`` metadata is read)."""
        if level == 0:
            return {a: a for a in self.attributes}
        return {self.derived_name(a, self.functions[0]): a for a in self.attributes}

    def selects(self, level: int, document: Document, now: float) -> bool:
        """Tell whether level ``level`` takes ``document``."""
        return matches(document, self._queries[level], now)

    def to_json(self) -> dict[str, Any]:
        """The definition as the API shows it."""
        entities: dict[str, Any] = {}
        if self.entity_type is not None:
            entities["type"] = self.entity_type
        if self.id_pattern is not None:
            entities["idPattern"] = self.id_pattern
        if self.q:
            entities["q"] = self.q
        body: dict[str, Any] = {"id": self.id}
        if self.description:
            body["description"] = self.description
        body.update(
            {
                "entities": entities,
                "groupBy": [{"attribute": v.attribute, "type": v.type} for v in self.levels],
                "attributes": list(self.attributes),
                "functions": list(self.functions),
                "window": self.window.to_json(),
            }
        )
        return body


@dataclass(frozen=True, slots=True)
class Contribution:
    """What one write adds to one pane of one group key at one level."""

    level: int
    service_path: str
    key: str  # the derived entity's id
    pane: float  # the pane's start
    attribute: str  # the attribute the value counts for (level 0's name)
    partial: Partial
    child: str = ""  # above level 0: the entity whose window it is


# -- checking a definition ------------------------------------------------------------------


def parse_definition(body: Any, tenant: str, scope: str | None) -> Definition:
    """The definition a request body describes, for ``tenant`` and service path ``scope``
    (None: every one); InvalidInput (400) naming every problem found, first the first."""
    problems: list[str] = []
    if not isinstance(body, dict):
        raise _Bad("an aggregation is a JSON object")
    unknown = sorted(set(body) - _FIELDS)
    if unknown:
        problems.append(f"unknown fields {unknown} (known: {sorted(_FIELDS)})")
    name = body.get("id")
    if not isinstance(name, str) or not ID.fullmatch(name):
        problems.append(f"id must be 1 to 64 of A-Z a-z 0-9 _ -, not {name!r}")
    description = body.get("description", "")
    if not isinstance(description, str) or len(description) > MAX_TEXT:
        problems.append(f"description must be a text of at most {MAX_TEXT} characters")
    entity_type, id_pattern, q = parse_selection(body.get("entities", {}), problems)
    levels = _levels(body.get("groupBy"), problems)
    attributes = _names(body.get("attributes"), "attributes", MAX_ATTRIBUTES, problems)
    functions = _names(body.get("functions"), "functions", len(FUNCTIONS), problems)
    wrong = [f for f in functions if f not in FUNCTIONS]
    if wrong:
        problems.append(f"unknown functions {wrong} (known: {', '.join(FUNCTIONS)})")
    window = _window(body.get("window"), problems)
    keys = {level.attribute for level in levels}
    if keys & set(attributes):
        problems.append(f"attributes {sorted(keys & set(attributes))} also group: drop them")
    types = [level.type for level in levels]
    if len(set(types)) != len(types) or (entity_type is not None and entity_type in types):
        problems.append("each groupBy level needs a type of its own, not the entities' type")
    if problems:
        raise _Bad("; ".join(problems))
    assert isinstance(name, str) and window is not None
    try:
        definition = Definition(
            name,
            tenant,
            check_scope(scope) if scope is not None else DEFAULT_SCOPE,
            levels,
            attributes,
            functions,
            window,
            entity_type,
            id_pattern,
            q,
            description,
        )
        for attribute in attributes:
            for function in functions:
                check_identifier(definition.derived_name(attribute, function), "derived name")
    except SilboError as exc:
        raise _Bad(f"entities (idPattern, q) or a derived attribute's name: {exc}") from exc
    return definition


def parse_selection(given: Any, problems: list[str]) -> tuple[str | None, str | None, str]:
    """The type, idPattern and q of an ``entities`` object (None, None, "": any entity);
    what is wrong with it added to ``problems``."""
    if not isinstance(given, dict):
        problems.append("entities must be an object: {type, idPattern, q}")
        return None, None, ""
    unknown = sorted(set(given) - {"type", "idPattern", "q"})
    if unknown:
        problems.append(f"unknown entities fields {unknown} (known: type, idPattern, q)")
    entity_type, id_pattern, q = given.get("type"), given.get("idPattern"), given.get("q", "")
    for value, what in ((entity_type, "type"), (id_pattern, "idPattern")):
        if value is not None and (not isinstance(value, str) or not 0 < len(value) <= MAX_TEXT):
            problems.append(f"entities.{what} must be a text of 1 to {MAX_TEXT} characters")
    if not isinstance(q, str) or len(q) > MAX_TEXT:
        problems.append(f"entities.q must be a text (NGSI q) of at most {MAX_TEXT} characters")
        q = ""
    return (
        entity_type if isinstance(entity_type, str) and entity_type else None,
        id_pattern if isinstance(id_pattern, str) and id_pattern else None,
        q,
    )


def _levels(given: Any, problems: list[str]) -> tuple[Level, ...]:
    items = [given] if isinstance(given, dict) else given
    if not isinstance(items, list) or not items or len(items) > MAX_LEVELS:
        problems.append(
            f"groupBy must be {{attribute, type}} or a list of 1 to {MAX_LEVELS} of them "
            "(a hierarchy: e.g. refBuilding -> Building, then refCampus -> Campus)"
        )
        return ()
    levels = []
    for index, item in enumerate(items):
        attribute = item.get("attribute") if isinstance(item, dict) else None
        entity_type = item.get("type") if isinstance(item, dict) else None
        if not isinstance(item, dict) or set(item) - {"attribute", "type"}:
            problems.append(f"groupBy[{index}] must be {{attribute, type}}")
        elif not _identifier(attribute) or not _identifier(entity_type):
            problems.append(
                f"groupBy[{index}] needs attribute (whose value names the group) and type "
                "(of the entities the groups become), both identifiers"
            )
        else:
            levels.append(Level(str(attribute), str(entity_type)))
    return tuple(levels)


def _names(given: Any, what: str, most: int, problems: list[str]) -> tuple[str, ...]:
    if (
        not isinstance(given, list)
        or not given
        or len(given) > most
        or not all(_identifier(n) for n in given)
        or len(set(given)) != len(given)
    ):
        problems.append(f"{what} must be a list of 1 to {most} different names")
        return ()
    return tuple(given)


def _window(given: Any, problems: list[str]) -> Window | None:
    if not isinstance(given, dict) or set(given) - {"type", "size", "slide"}:
        problems.append('window must be {"type": "tumbling"|"sliding", "size", "slide"}')
        return None
    kind = given.get("type", "tumbling")
    try:
        size = parse_duration(given.get("size"), "window.size")
        if kind == "tumbling":
            if "slide" in given:
                raise _Bad("a tumbling window has no slide")
            slide = size
        elif kind == "sliding":
            slide = parse_duration(given.get("slide"), "window.slide")
        else:
            raise _Bad(f"window.type must be tumbling or sliding, not {kind!r}")
    except InvalidInput as exc:
        problems.append(str(exc))
        return None
    panes = size / slide
    if slide < MIN_SLIDE or size > MAX_SIZE:
        problems.append(f"windows slide by {MIN_SLIDE:g} s at least and last 1 d at most")
    elif abs(panes - round(panes)) > 1e-9 or not 1 <= round(panes) <= MAX_PANES:
        problems.append(
            f"window.size must be a whole multiple (1 to {MAX_PANES}) of window.slide "
            f"(here {size:g} s and {slide:g} s)"
        )
    else:
        return Window(size, slide)
    return None


def parse_duration(given: Any, what: str) -> float:
    """Seconds from a number of seconds or a text such as ``5m``, ``1s``, ``2h``, ``500ms``."""
    if _number(given) and given > 0:
        return float(given)
    if isinstance(given, str):
        found = _DURATION.fullmatch(given.strip())
        if found and float(found.group(1)) > 0:
            return float(found.group(1)) * _UNITS[found.group(2)]
    raise _Bad(f"{what} must be seconds or a duration such as 1s, 5m, 1h, not {given!r}")


# -- folding --------------------------------------------------------------------------------


def event_time(document: Document, now: float) -> float:
    """The time (epoch s) a write the store applied at ``now`` counts at: ``now``, or its
    entity's ``dateModified`` if later (dates never go back: a write that changed the entity
    made it its ``dateModified``), in whole microseconds (broker.store.history_fold.micros),
    as the archive's ``time`` holds it."""
    return micros(max(now, document.date_modified)) / 1_000_000


def contributions(
    definition: Definition,
    document: Document | None,
    change: Change | None,
    at: float,
) -> list[Contribution]:
    """What one applied write (its entity now and its change, at ``at``: its
    :func:`event_time`) adds to the definition's panes, at every level that takes it."""
    if document is None or change is None or change.alteration is Alteration.DELETE:
        return []
    found: list[Contribution] = []
    for level, grouping in enumerate(definition.levels):
        inputs = definition.inputs(level)
        named = [n for n in change.requested if n in inputs]
        if not named or not definition.selects(level, document, at):
            continue
        key = document.attributes.get(grouping.attribute, {}).get("value")
        if not isinstance(key, str) or not _identifier(key):
            continue
        for name in named:
            attribute = document.attributes.get(name)
            if attribute is None:
                continue
            if level == 0:
                value = attribute["value"]
                if _number(value):
                    pane = definition.window.pane(at)
                    part = Partial.of(value, at)
                    found.append(Contribution(0, document.service_path, key, pane, name, part))
                continue
            derived = derived_pane(attribute)
            if derived is not None:
                pane, part = derived
                pane = definition.window.pane(pane)
                found.append(
                    Contribution(
                        level, document.service_path, key, pane, inputs[name], part, document.id
                    )
                )
    return found


def derived_pane(attribute: Mapping[str, Any]) -> tuple[float, Partial] | None:
    """The pane start and partial a derived attribute carries for a level above (its last
    pane's, for a sliding window; None: it carries none)."""
    meta = attribute.get("metadata", {}).get(AGGREGATE_METADATA)
    if not isinstance(meta, Mapping) or not isinstance(meta.get("value"), Mapping):
        return None
    value = meta["value"]
    pane = value.get("pane", value)
    start = pane.get("start") if isinstance(pane, Mapping) else None
    partial = Partial.from_json(pane)
    if partial is None or not _number(start):
        return None
    assert start is not None
    return float(start), partial


def window_attributes(
    definition: Definition,
    end: float,
    panes: Mapping[float, Mapping[str, Partial]],
) -> dict[str, dict[str, Any]]:
    """The derived attributes of the window ending at ``end``, from its panes' partials
    (pane start -> attribute -> partial): one per attribute with values and function."""
    window = definition.window
    start = end - window.size
    out: dict[str, dict[str, Any]] = {}
    for attribute in definition.attributes:
        merged = Partial()
        for pane in window.panes_before(end):
            merged = merged.merged(panes.get(pane, {}).get(attribute, Partial()))
        if not merged.count:
            continue
        aggregate = {**merged.to_json(), "start": start, "end": end}
        if window.sliding:
            last = end - window.slide
            pane_partial = panes.get(last, {}).get(attribute, Partial())
            aggregate["pane"] = {**pane_partial.to_json(), "start": last}
        metadata = {
            "windowStart": {"type": "DateTime", "value": iso8601(start)},
            "windowEnd": {"type": "DateTime", "value": iso8601(end)},
            AGGREGATE_METADATA: {"type": "StructuredValue", "value": aggregate},
        }
        for function in definition.functions:
            out[definition.derived_name(attribute, function)] = {
                "type": "Number",
                "value": merged.result(function),
                "metadata": metadata,
            }
    return out


def merge_all(partials: Iterable[Partial]) -> Partial:
    """Every partial together."""
    merged = Partial()
    for partial in partials:
        merged = merged.merged(partial)
    return merged


# -- helpers --------------------------------------------------------------------------------


def _number(value: Any) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and abs(value) < 2**53
    )


def _identifier(value: Any) -> bool:
    try:
        check_identifier(value, "name")
    except SilboError:
        return False
    return True


def _label(seconds: float) -> str:
    for unit, length in (("d", 86_400), ("h", 3600), ("m", 60)):
        if seconds >= length and seconds % length == 0:
            return f"{int(seconds // length)}{unit}"
    if seconds == int(seconds):
        return f"{int(seconds)}s"
    return f"{round(seconds * 1000)}ms"
