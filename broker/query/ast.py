"""The parsed form of a filter: NGSI v2 ``q`` / ``mq`` plus the SilboPS string operators.

A filter is a conjunction (``;``) of statements. Each statement names a *path* and an
operator with its right-hand side:

=========================  ==============  ==========================================
source                     ``Op``          right-hand side
=========================  ==============  ==========================================
``temp``                   EXISTS          (none)
``!temp``                  NOT_EXISTS      (none)
``temp==20`` / ``temp:20`` EQ              ``values`` (one or a list) or ``range``
``temp!=20``               NE              ``values`` (one or a list) or ``range``
``temp<20`` ``<=`` ``>``   LT LE GT GE     ``values`` (exactly one)
``name~=^Pla``             MATCH           ``pattern`` (a regex, searched anywhere)
``name=^Pla``              PREFIX          ``values`` (one STRING)
``name=$za``               SUFFIX          ``values`` (one STRING)
``name=*laz``              CONTAINS        ``values`` (one STRING)
=========================  ==============  ==========================================

Paths: in ``q`` the first element is the attribute name and the rest walk into a compound
(object) value; in ``mq`` the first is the attribute, the second the metadata name, and the
rest walk into the metadata value. Single quotes make a dotted token one element:
``'a.b'.c`` is ``("a.b", "c")``.

Right-hand values are typed as Orion types them (ngsi-v2.md section 4): a quoted ``'...'`` is
STRING; else a valid double is NUMBER; else an ISO 8601 date is DATE (its value is the epoch
seconds); else ``true``/``false`` is BOOL; ``null`` is NULL; anything else is STRING. The
string operators (PREFIX, SUFFIX, CONTAINS) always take their right-hand side as STRING.

Evaluation (see :mod:`broker.query.evaluate`) compares a statement with the *match value* of
the attribute (``Attribute.match_value``: DateTime attributes are epoch numbers). NUMBER and
DATE literals both compare numerically against numbers (never bools); STRING literals against
strings (code-point order, the same as Orion's byte-wise strcmp on UTF-8). A missing attribute,
a missing path or a type mismatch gives no match, for every operator but NOT_EXISTS.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["Filter", "Kind", "Literal", "Op", "Range", "Statement"]


class Op(enum.Enum):
    """A statement's operator."""

    EXISTS = "exists"
    NOT_EXISTS = "!"
    EQ = "=="
    NE = "!="
    LT = "<"
    LE = "<="
    GT = ">"
    GE = ">="
    MATCH = "~="
    PREFIX = "=^"
    SUFFIX = "=$"
    CONTAINS = "=*"


class Kind(enum.Enum):
    """The type of a right-hand literal."""

    NUMBER = "number"
    DATE = "date"
    STRING = "string"
    BOOL = "bool"
    NULL = "null"

    @property
    def numeric(self) -> bool:
        """NUMBER and DATE compare as numbers."""
        return self is Kind.NUMBER or self is Kind.DATE


@dataclass(frozen=True, slots=True)
class Literal:
    """A typed right-hand value. ``value`` is float for NUMBER/DATE, str, bool or None."""

    kind: Kind
    value: float | str | bool | None
    text: str  # as written (without the quotes), for messages and rendering


@dataclass(frozen=True, slots=True)
class Range:
    """An inclusive range ``low..high``; both ends of one kind (numeric, or STRING)."""

    low: Literal
    high: Literal


@dataclass(frozen=True, slots=True)
class Statement:
    """One condition of a filter. Exactly the fields its ``op`` needs are set."""

    path: tuple[str, ...]
    op: Op
    values: tuple[Literal, ...] = ()
    range: Range | None = None
    pattern: str | None = None
    column: int = 1  # 1-based position of the statement in its source, for messages

    @property
    def attribute(self) -> str:
        """The attribute the statement is about."""
        return self.path[0]


@dataclass(frozen=True, slots=True)
class Filter:
    """A parsed filter: every ``q`` statement and every ``mq`` statement must hold."""

    q: tuple[Statement, ...] = ()
    mq: tuple[Statement, ...] = ()

    @property
    def empty(self) -> bool:
        """True when the filter accepts every update."""
        return not self.q and not self.mq
