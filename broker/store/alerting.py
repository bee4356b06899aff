"""Alert rules: what a rule says, the hysteresis one (rule, entity) follows, what it publishes.

Pure functions and values, no I/O (docs/alerts.md has the whole design): a :class:`Rule` is
what ``POST /v2/x/alerts`` keeps (:func:`parse_rule` checks it, naming every problem at
once); :func:`step` moves the :class:`AlertState` of one (rule, entity) on by one value and
says whether that was a :class:`Transition`; :func:`alert_attributes` renders a transition
as the attributes of the alert entity, which the store publishes like any context
(broker.store.alert_log keeps the states and the transitions to publish).

The states of one (rule, entity), for a rule ``above: A`` with ``clearBelow: C`` (C <= A;
``below: B`` with ``clearAbove: C``, C >= B, is its mirror image):

- CLEARED (where every pair starts): a value greater than A raises the alert, at once
  without ``for``. With ``for: F`` it is *pending* from the first such value (``pending``
  keeps its time) and raises at the first value still greater than A at least F seconds
  after it; a value not greater than A ends the pending (the condition must hold
  throughout, as far as the values written show: a value is only known when it is written).
- RAISED: a value less than C clears the alert; any other value keeps it raised. Between C
  and A (the hysteresis band) nothing changes either way, so a value wavering around one
  threshold does not flap. Without ``clearBelow``, C is A: a value of exactly A changes
  nothing, a value below it clears.

Every raise and every clear is a transition, numbered from 1 per (rule, entity): the
number the alert entity carries (``transition``), by which a store tells whether a
transition it is not sure it published is already there (docs/alerts.md, Guarantees). A
value that changes no state is no transition: an alert is published once per raise and
once per clear, never on every value while raised.

Which values count: the rule's attribute, when a write names it (so an update repeating a
value counts it again, which matters for ``for``), its value a number (not a boolean);
other values change nothing. An entity of the rule's own alert type is never taken (an
alert rule over its own alerts would raise alerts of alerts without end).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final, TypeGuard

from broker.errors import InvalidInput, SilboError
from broker.model.identifiers import DEFAULT_SCOPE, check_identifier, check_scope
from broker.store.aggregation import ID, MAX_TEXT, parse_duration, parse_selection
from broker.store.query import EntityQuery, Selector, matches
from broker.store.semantics import Attributes, Document, iso8601

__all__ = [
    "DEFAULT_ALERT_ID",
    "DEFAULT_ALERT_TYPE",
    "DEFAULT_SEVERITY",
    "ID",
    "MAX_HOLD",
    "AlertState",
    "Condition",
    "Rule",
    "Transition",
    "alert_attributes",
    "is_number",
    "number_of",
    "parse_rule",
    "step",
]

DEFAULT_ALERT_TYPE: Final = "Alert"
DEFAULT_ALERT_ID: Final = "Alert:{rule}:{id}"
DEFAULT_SEVERITY: Final = "warning"
MAX_HOLD: Final = 86_400.0  # seconds: the longest ``for``
RAISED: Final = "raised"
CLEARED: Final = "cleared"
_PLACES: Final = ("rule", "id", "type")  # what an alert id template may name
_PLACE: Final = re.compile(r"\{([^{}]*)\}")
_FIELDS: Final = frozenset(
    {"id", "description", "entities", "attribute", "condition", "severity", "alert"}
)
_CONDITION: Final = frozenset({"above", "below", "clearBelow", "clearAbove", "for"})


class _Bad(InvalidInput):
    """A rule that cannot be kept (400 BadRequest, with what to fix)."""


@dataclass(frozen=True, slots=True)
class Condition:
    """When a rule raises and clears (module doc): ``above`` (a value greater than
    ``threshold`` raises, one less than ``clear`` clears) or not (below: the mirror);
    ``hold`` the seconds of ``for`` (0: at once)."""

    above: bool
    threshold: float
    clear: float
    hold: float = 0.0

    def raises(self, value: float) -> bool:
        """Tell whether ``value`` is past the raise threshold."""
        return value > self.threshold if self.above else value < self.threshold

    def clears(self, value: float) -> bool:
        """Tell whether ``value`` is past the clear threshold (back across it)."""
        return value < self.clear if self.above else value > self.clear

    def to_json(self) -> dict[str, Any]:
        raise_name, clear_name = ("above", "clearBelow") if self.above else ("below", "clearAbove")
        body: dict[str, Any] = {raise_name: self.threshold, clear_name: self.clear}
        if self.hold:
            body["for"] = self.hold
        return body


@dataclass(frozen=True, slots=True)
class AlertState:
    """Where one (rule, entity) is: raised or not, since when its raise condition holds
    (``pending``, with ``for``; None: it does not), and how many transitions it made."""

    raised: bool = False
    pending: float | None = None
    transitions: int = 0

    def to_wire(self) -> list[Any]:
        """The state as a msgpack-able list (what :meth:`from_wire` reads)."""
        return [self.raised, self.pending, self.transitions]

    @classmethod
    def from_wire(cls, data: Any) -> AlertState:
        raised, pending, transitions = data
        return cls(bool(raised), None if pending is None else float(pending), int(transitions))


@dataclass(frozen=True, slots=True)
class Transition:
    """One raise or clear: its number (from 1 per rule and entity), the value that made it,
    the threshold it crossed, and when (the time the store applied the write)."""

    number: int
    raised: bool
    value: float
    threshold: float
    at: float


@dataclass(frozen=True, slots=True)
class Rule:
    """One alert rule, as checked (see :func:`parse_rule`)."""

    id: str
    tenant: str
    scope: str
    attribute: str
    condition: Condition
    severity: str = DEFAULT_SEVERITY
    alert_type: str = DEFAULT_ALERT_TYPE
    alert_id: str = DEFAULT_ALERT_ID  # a template: {rule}, {id}, {type}
    entity_type: str | None = None
    id_pattern: str | None = None
    q: str = ""
    description: str = ""
    _query: EntityQuery | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        selector = Selector(id_pattern=self.id_pattern, type=self.entity_type)
        query = EntityQuery(self.tenant, (self.scope,), (selector,), q=self.q)
        object.__setattr__(self, "_query", query)

    def selects(self, document: Document, now: float) -> bool:
        """Tell whether the rule takes ``document`` (never one of its own alert type)."""
        assert self._query is not None
        return document.type != self.alert_type and matches(document, self._query, now)

    def alert_id_of(self, entity_id: str, entity_type: str) -> str | None:
        """The id of the alert entity of one source entity (None: the template makes no
        identifier of it, too long say: that entity raises nothing)."""
        places = {"rule": self.id, "id": entity_id, "type": entity_type}
        made = _PLACE.sub(lambda found: places[found.group(1)], self.alert_id)
        try:
            return check_identifier(made, "alert id")
        except SilboError:
            return None

    def to_json(self) -> dict[str, Any]:
        """The rule as the API shows it."""
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
                "attribute": self.attribute,
                "condition": self.condition.to_json(),
                "severity": self.severity,
                "alert": {"type": self.alert_type, "id": self.alert_id},
            }
        )
        return body


# -- the state machine ----------------------------------------------------------------------


def step(
    condition: Condition, state: AlertState, value: float, at: float
) -> tuple[AlertState, Transition | None]:
    """The state after ``value`` (written at ``at``), and the transition it made, if any
    (the module doc has the states)."""
    if state.raised:
        if not condition.clears(value):
            return state, None
        number = state.transitions + 1
        return AlertState(False, None, number), Transition(
            number, False, value, condition.clear, at
        )
    if not condition.raises(value):
        return (state if state.pending is None else replace(state, pending=None)), None
    since = at if state.pending is None else state.pending
    if at - since < condition.hold:
        return replace(state, pending=since), None
    number = state.transitions + 1
    return AlertState(True, None, number), Transition(number, True, value, condition.threshold, at)


def alert_attributes(rule: Rule, document: Document, transition: Transition) -> Attributes:
    """The attributes one transition writes on the alert entity (an upsert: the others
    stay, so a cleared alert still shows when it was raised)."""
    status = RAISED if transition.raised else CLEARED
    entity_type = {"entityType": {"type": "Text", "value": document.type}}
    stamp = "raisedAt" if transition.raised else "clearedAt"
    return {
        "status": _attribute("Text", status),
        "severity": _attribute("Text", rule.severity),
        "rule": _attribute("Text", rule.id),
        "attribute": _attribute("Text", rule.attribute),
        "value": _attribute("Number", transition.value),
        "threshold": _attribute("Number", transition.threshold),
        "refEntity": _attribute("Relationship", document.id, entity_type),
        "transition": _attribute("Number", transition.number),
        stamp: _attribute("DateTime", iso8601(transition.at)),
    }


def _attribute(kind: str, value: Any, metadata: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"type": kind, "value": value, "metadata": metadata or {}}


def number_of(attributes: Mapping[str, Any]) -> int:
    """The transition number an alert entity (its attributes as read) carries; 0: none."""
    found = attributes.get("transition")
    value = found.get("value") if isinstance(found, Mapping) else found
    return int(value) if is_number(value) else 0


# -- checking a rule ------------------------------------------------------------------------


def parse_rule(body: Any, tenant: str, scope: str | None) -> Rule:
    """The rule a request body describes, for ``tenant`` and service path ``scope`` (None:
    every one); InvalidInput (400) naming every problem found."""
    if not isinstance(body, dict):
        raise _Bad("an alert rule is a JSON object")
    problems: list[str] = []
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
    attribute = body.get("attribute")
    if not _identifier(attribute):
        problems.append(f"attribute must name the attribute watched, not {attribute!r}")
    condition = _condition(body.get("condition"), problems)
    severity = body.get("severity", DEFAULT_SEVERITY)
    if not isinstance(severity, str) or not ID.fullmatch(severity):
        problems.append(f"severity must be 1 to 64 of A-Z a-z 0-9 _ -, not {severity!r}")
    alert_type, alert_id = _alert(body.get("alert", {}), problems)
    if entity_type is not None and entity_type == alert_type:
        problems.append(f"the entities' type {entity_type!r} is the alerts' own: name another")
    if problems:
        raise _Bad("; ".join(problems))
    assert isinstance(name, str) and isinstance(attribute, str) and condition is not None
    try:
        return Rule(
            name,
            tenant,
            check_scope(scope) if scope is not None else DEFAULT_SCOPE,
            attribute,
            condition,
            str(severity),
            alert_type,
            alert_id,
            entity_type,
            id_pattern,
            q,
            description,
        )
    except SilboError as exc:
        raise _Bad(f"entities (idPattern, q): {exc}") from exc


def _condition(given: Any, problems: list[str]) -> Condition | None:
    if not isinstance(given, dict):
        problems.append(
            'condition must be an object: {"above": N} or {"below": N}, optionally with '
            '"clearBelow" / "clearAbove" and "for"'
        )
        return None
    fields: dict[str, Any] = given
    found = len(problems)
    unknown = sorted(set(given) - _CONDITION)
    if unknown:
        problems.append(f"unknown condition fields {unknown} (known: {sorted(_CONDITION)})")
    for name in sorted(_CONDITION - {"for"}):
        if name in given and not is_number(given[name]):
            problems.append(f"condition.{name} must be a number, not {given[name]!r}")
    above, below = given.get("above"), given.get("below")
    if (above is None) == (below is None):
        problems.append("condition needs one of above (raise over it) and below (under it)")
    if above is not None and "clearAbove" in given:
        problems.append("condition.clearAbove goes with below; with above, give clearBelow")
    if below is not None and "clearBelow" in given:
        problems.append("condition.clearBelow goes with above; with below, give clearAbove")
    hold = 0.0
    if "for" in given and given["for"] not in (0, "0"):
        try:
            hold = parse_duration(given["for"], "condition.for")
        except InvalidInput as exc:
            problems.append(str(exc))
        if hold > MAX_HOLD:
            problems.append("condition.for is 1 d at most")
    if len(problems) > found:
        return None
    threshold = above if above is not None else below
    assert threshold is not None  # one of the two (checked above)
    clear_name = "clearBelow" if above is not None else "clearAbove"
    given_clear = fields.get(clear_name)
    clear: float = threshold if given_clear is None else given_clear
    if (clear > threshold) if above is not None else (clear < threshold):
        side = "over above" if above is not None else "under below"
        problems.append(f"condition.{clear_name} ({clear}) must not be {side} ({threshold})")
        return None
    return Condition(above is not None, threshold, clear, hold)


def _alert(given: Any, problems: list[str]) -> tuple[str, str]:
    """The alert entity's type and id template."""
    if not isinstance(given, dict) or set(given) - {"type", "id"}:
        problems.append('alert must be an object: {"type": T, "id": "Alert:{rule}:{id}"}')
        return DEFAULT_ALERT_TYPE, DEFAULT_ALERT_ID
    alert_type = given.get("type", DEFAULT_ALERT_TYPE)
    if not _identifier(alert_type):
        problems.append(f"alert.type must be an entity type (an identifier), not {alert_type!r}")
        alert_type = DEFAULT_ALERT_TYPE
    template = given.get("id", DEFAULT_ALERT_ID)
    if not isinstance(template, str):
        problems.append(f"alert.id must be a text, not {template!r}")
        return str(alert_type), DEFAULT_ALERT_ID
    named = _PLACE.findall(template)
    wrong = sorted(set(named) - set(_PLACES))
    if wrong:
        problems.append(f"alert.id names {wrong}: it may name {{rule}}, {{id}} and {{type}}")
    elif "rule" not in named or "id" not in named:
        problems.append(
            "alert.id must name {rule} and {id} (one alert entity per rule and entity), "
            f"not {template!r}"
        )
    elif not _identifier(_PLACE.sub("x", template)) or set("{}") & set(_PLACE.sub("", template)):
        problems.append(f"alert.id must make an identifier, {template!r} does not")
    return str(alert_type), template


def is_number(value: Any) -> TypeGuard[float]:
    """Tell whether ``value`` is a number a rule compares (finite, not a boolean)."""
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
