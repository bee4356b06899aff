"""MongoDB's update operators on one attribute value, as Orion applies them.

Pure functions, no I/O, called by :mod:`broker.store.semantics` for an attribute whose value is
an object whose first key is ``$inc $mul $min $max $push $addToSet $pull $pullAll $set $unset``
(:func:`operator_of`). Sources: Orion's ``doc/manuals/orion-api.md`` (4.x, "api" below; Update
operators for attribute values) and its code (``src/lib/mongoBackend``, "code").

- On an existing attribute (:func:`operated`) MongoDB's semantics apply; what MongoDB refuses
  is Orion's 500 InternalServerError (:class:`OperatorError`, a 400 here; nothing of the write
  applies): ``$inc``/``$mul`` of a non-number or by one;
  ``$push``/``$addToSet``/``$pull``/``$pullAll`` on a non-array (``$pullAll`` by a
  non-array); ``$set`` of an object into a non-object; ``$set`` and ``$unset`` of one key.
  ``$min``/``$max`` compare in BSON order (null < numbers < strings < objects < arrays <
  booleans; DateTime attributes as dates). ``$set`` of a non-object is a plain update;
  ``$unset`` of a non-object, or on a non-object, changes nothing. ``$push`` takes
  ``$each``, ``$position``, ``$slice``; ``$addToSet`` takes ``$each``.
- On an attribute missing from an existing entity (:func:`operated` of :data:`MISSING`,
  MongoDB on a missing field): ``$inc``, ``$min``, ``$max`` give the operand, ``$mul`` 0,
  ``$push``/``$addToSet`` an array, ``$set`` the object; ``$pull``, ``$pullAll``, ``$unset``
  create nothing (:data:`DROP`).
- In a create or a replace (:func:`started`; api: Usage in create or replace entity
  operations; code: ``ContextAttribute::calculateOperator``) numbers start from 0 (``$inc`` n
  -> n, ``$mul`` -> 0, ``$min`` n -> min(0, n), ``$max`` -> max(0, n)), dates from the epoch,
  ``$push`` and ``$addToSet`` from ``[]``, ``$set`` from ``{}``; ``$pull``, ``$pullAll``,
  ``$unset`` create nothing.

Values compare as Orion and MongoDB do (:func:`same`: numbers as doubles, 1 == 1.0, true is no
number, objects deeply; ``$min``/``$max``: BSON's order of types, then of values).

Where Orion's documentation and code disagree, or this could not be confirmed:

- creation-time operators: the old user manual (``user/update_operators.md``) stores them
  literally; the api and the code compute them (followed). Where the code builds odd values
  (``$push``/``$addToSet`` with ``$each``: an array of the operator's parts; ``$set`` of a
  non-object: no value) MongoDB's result on a missing field is used; a non-number ``$inc``,
  ``$min`` or ``$max`` gives 0, as in the code.
- the api's example of ``$set`` with ``$unset`` shows ``{"Y": 20}`` where MongoDB (followed)
  gives ``{"Y": 20, "Z": 30}``; the user manual's ``$unset`` example shows ``{"Y": 20}`` for
  ``{"Y": 2}``.
- ``$pull``/``$pullAll``/``$unset`` appended to an existing entity: the code leaves an
  attribute with no value; here it is not created, as in a create.
- whether Orion's compound equality is key-order sensitive; whether ``$pull`` by an object
  (a MongoDB query) matches as MongoDB does (here: by equality); ``$push`` ``$sort``.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from typing import Any

from broker.errors import InvalidUpdate
from broker.model.attribute import DATE_TYPES, parse_iso8601

__all__ = ["DROP", "MISSING", "OperatorError", "operated", "operator_of", "same", "started"]

_EPOCH = "1970-01-01T00:00:00.000Z"
_LARGEST = sys.float_info.max
_OPERATORS = frozenset(
    {"$inc", "$mul", "$min", "$max", "$push", "$addToSet", "$pull", "$pullAll", "$set", "$unset"}
)


class OperatorError(InvalidUpdate):
    """An update operator cannot apply to the stored value (MongoDB refuses it; nothing of
    the write applies). Orion answers 500 InternalServerError; Silbo answers 400 BadRequest,
    as for any request the client can fix: a 5xx says the broker failed."""


class _Missing:
    """The value of an attribute that does not exist (MongoDB's missing field)."""


MISSING = _Missing()  # the stored value of an attribute that does not exist
DROP = _Missing()  # an operator result meaning "no attribute"


def operator_of(value: Any) -> str | None:
    """The update operator a value holds (its first key, as Orion reads it), if any."""
    if type(value) is dict and value:
        first = next(iter(value))
        if first in _OPERATORS:
            return str(first)
    return None


def started(op: str, operand: Any, type_: str) -> Any:
    """The value an operator gives an attribute of a created or replaced entity (Orion's
    calculateOperator; ``DROP``: no attribute)."""
    if op in ("$unset", "$pull", "$pullAll"):
        return DROP
    if op == "$set":
        return dict(operand) if type(operand) is dict else operand
    if op in ("$push", "$addToSet"):
        return _MONGO[op](operand, MISSING, type_)  # from [] as MongoDB does
    if op == "$mul":
        return 0
    if op == "$inc":
        return operand if _is_number(operand) else 0
    epoch = parse_iso8601(operand) if isinstance(operand, str) else None
    if type_ in DATE_TYPES and epoch is not None:
        chosen = min(0.0, epoch) if op == "$min" else max(0.0, epoch)
        return operand if chosen == epoch else _EPOCH
    number = operand if _is_number(operand) else 0
    return min(0, number) if op == "$min" else max(0, number)


def operated(op: str, value: dict[str, Any], old: Any, type_: str) -> Any:
    """The value MongoDB leaves when it applies the operator object ``value`` to the stored
    value ``old`` (``MISSING``: none stored; ``DROP``: no attribute)."""
    if op in ("$set", "$unset"):
        return _set_unset(value, old)
    return _MONGO[op](value[op], old, type_)


def _inc(operand: Any, old: Any, type_: str) -> Any:
    if not _is_number(operand):
        raise OperatorError(f"Cannot increment with non-numeric argument: {operand!r}")
    if old is MISSING:
        return operand
    if not _is_number(old):
        raise OperatorError(f"Cannot apply $inc to a value of non-numeric type {_kind(old)}")
    return _finite(old + operand)


def _mul(operand: Any, old: Any, type_: str) -> Any:
    if not _is_number(operand):
        raise OperatorError(f"Cannot multiply with non-numeric argument: {operand!r}")
    if old is MISSING:
        return 0.0 if isinstance(operand, float) else 0
    if not _is_number(old):
        raise OperatorError(f"Cannot apply $mul to a value of non-numeric type {_kind(old)}")
    return _finite(old * operand)


def _min(operand: Any, old: Any, type_: str) -> Any:
    return operand if old is MISSING or _compare(operand, old, type_) < 0 else old


def _max(operand: Any, old: Any, type_: str) -> Any:
    return operand if old is MISSING or _compare(operand, old, type_) > 0 else old


def _push(operand: Any, old: Any, type_: str) -> Any:
    items = _each(operand, ("$position", "$slice"))
    base = _array(old, "$push")
    modifiers = operand if type(operand) is dict and "$each" in operand else {}
    position, size = modifiers.get("$position"), modifiers.get("$slice")
    if (position is not None and type(position) is not int) or (
        size is not None and type(size) is not int
    ):
        raise OperatorError("$position and $slice must be integers")
    at = len(base) if position is None else position if position >= 0 else len(base) + position
    result = [*base[: max(0, at)], *items, *base[max(0, at) :]]
    if size is not None:
        result = result[:size] if size >= 0 else result[size:]
    return result


def _add_to_set(operand: Any, old: Any, type_: str) -> Any:
    result = _array(old, "$addToSet")
    for item in _each(operand):
        if not any(same(item, present) for present in result):
            result.append(item)
    return result


def _pull(operand: Any, old: Any, type_: str) -> Any:
    if old is MISSING:
        return DROP
    return [item for item in _array(old, "$pull") if not same(item, operand)]


def _pull_all(operand: Any, old: Any, type_: str) -> Any:
    if type(operand) is not list:
        raise OperatorError(f"$pullAll requires an array argument, not {_kind(operand)}")
    if old is MISSING:
        return DROP
    return [item for item in _array(old, "$pullAll") if not any(same(item, x) for x in operand)]


_MONGO: dict[str, Callable[[Any, Any, str], Any]] = {
    "$inc": _inc,
    "$mul": _mul,
    "$min": _min,
    "$max": _max,
    "$push": _push,
    "$addToSet": _add_to_set,
    "$pull": _pull,
    "$pullAll": _pull_all,
}


def _set_unset(value: dict[str, Any], old: Any) -> Any:
    """``$set`` and ``$unset`` (alone or together) on the stored value."""
    result = old
    if "$set" in value:
        keys = value["$set"]
        if type(keys) is not dict:
            result = keys  # a plain update (api: "the same effect than a regular update")
        elif old is MISSING:
            result = dict(keys)
        elif type(old) is dict:
            result = {**old, **keys}
        else:
            raise OperatorError(f"Cannot create a field in a value of type {_kind(old)}")
        unset = value.get("$unset")
        if type(keys) is dict and type(unset) is dict and keys.keys() & unset.keys():
            raise OperatorError("Updating a key with $set and $unset at once is a conflict")
    unset = value.get("$unset")
    if type(unset) is dict and type(result) is dict:
        result = {k: v for k, v in result.items() if k not in unset}
    return DROP if result is MISSING else result


def _each(operand: Any, modifiers: tuple[str, ...] = ()) -> list[Any]:
    """The items an ``$push`` / ``$addToSet`` operand adds (``{"$each": [...]}`` or one)."""
    if type(operand) is not dict or "$each" not in operand:
        return [operand]
    items = operand["$each"]
    if type(items) is not list:
        raise OperatorError(f"The argument to $each must be an array, not {_kind(items)}")
    unknown = set(operand) - {"$each", *modifiers}
    if unknown:
        raise OperatorError(f"Unsupported modifier {sorted(unknown)[0]} after $each")
    return list(items)


def _array(old: Any, op: str) -> list[Any]:
    if old is MISSING:
        return []
    if type(old) is not list:
        raise OperatorError(f"Cannot apply {op} to a value of non-array type {_kind(old)}")
    return list(old)


def _finite(number: Any) -> Any:
    if (isinstance(number, float) and not math.isfinite(number)) or abs(number) > _LARGEST:
        raise OperatorError("The result of the operator is not a finite number")
    return number


# -- JSON values as MongoDB compares them -----------------------------------------------------


def _is_number(value: Any) -> bool:
    return type(value) is int or type(value) is float


def _kind(value: Any) -> str:
    names = {bool: "bool", int: "number", float: "number", str: "string", list: "array"}
    return "null" if value is None else names.get(type(value), "object")


def same(a: Any, b: Any) -> bool:
    """JSON equality as Orion compares values: numbers as doubles, booleans apart."""
    if _is_number(a) and _is_number(b):
        return bool(a == b)
    if type(a) is not type(b):
        return False
    if type(a) is list:
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if type(a) is dict:
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return bool(a == b)


def _rank(value: Any) -> int:
    """BSON's comparison order of types: null, numbers, strings, objects, arrays, booleans."""
    if value is None:
        return 1
    if _is_number(value):
        return 2
    return {str: 3, dict: 4, list: 5, bool: 8}[type(value)]


def _compare(a: Any, b: Any, type_: str) -> int:
    """-1, 0, 1 as MongoDB orders two values (DateTime attributes as dates)."""
    if type_ in DATE_TYPES and isinstance(a, str) and isinstance(b, str):
        da, db = parse_iso8601(a), parse_iso8601(b)
        if da is not None and db is not None:
            return _order(da, db)
    ra, rb = _rank(a), _rank(b)
    if ra != rb or ra == 1:
        return _order(ra, rb)
    if ra in (2, 8):
        return _order(a, b)
    if ra == 3:
        return _order(a.encode(), b.encode())
    # objects and arrays: element by element (type, then name, then value), shorter first
    pairs_a = list(a.items()) if ra == 4 else [(str(i), x) for i, x in enumerate(a)]
    pairs_b = list(b.items()) if ra == 4 else [(str(i), x) for i, x in enumerate(b)]
    for (ka, va), (kb, vb) in zip(pairs_a, pairs_b, strict=False):
        order = (
            _order(_rank(va), _rank(vb)) or _order(ka.encode(), kb.encode()) or _compare(va, vb, "")
        )
        if order:
            return order
    return _order(len(pairs_a), len(pairs_b))


def _order(x: Any, y: Any) -> int:
    return int(x > y) - int(x < y)
