"""Safe regular expressions for idPattern, typePattern and the ``~=`` operator.

Patterns are compiled with RE2 (google-re2), which matches in time linear in the input: a
subscriber cannot stall a matcher with a pathological pattern such as ``(a+)+$``. RE2's syntax
is close to POSIX extended regular expressions, which Orion uses; back-references and
look-arounds, which neither can match in linear time, are rejected. Matching is a *search*
(the pattern may match anywhere), as in Orion; anchor with ``^`` and ``$``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import re2

from broker.errors import InvalidRegex

__all__ = ["MAX_PATTERN_LENGTH", "Pattern", "compile_pattern", "is_match_all", "search_remembered"]

MAX_PATTERN_LENGTH = 1024
_MAX_PROGRAM_SIZE = 1 << 20  # bytes of RE2 program memory per pattern

_OPTIONS = re2.Options()
_OPTIONS.max_mem = _MAX_PROGRAM_SIZE
_OPTIONS.log_errors = False

# A compiled pattern: a callable search(text) -> match-or-None.
Pattern = Any

_MATCH_ALL = frozenset({".*", "^.*", ".*$", "^.*$", "^(.*)$", "(.*)"})


def is_match_all(pattern: str) -> bool:
    """True for patterns that match every string (``.*`` and its anchored spellings)."""
    return pattern in _MATCH_ALL


@functools.lru_cache(maxsize=4096)
def compile_pattern(pattern: str) -> Callable[[str], Any]:
    """Compile ``pattern`` and return its ``search`` method, or raise InvalidRegex."""
    if not isinstance(pattern, str):
        raise InvalidRegex(f"a pattern must be a string, not {type(pattern).__name__}")
    if len(pattern) > MAX_PATTERN_LENGTH:
        raise InvalidRegex(
            f"pattern is {len(pattern)} characters long; at most {MAX_PATTERN_LENGTH}"
        )
    try:
        compiled = re2.compile(pattern, _OPTIONS)
    except Exception as exc:  # re2.error, and plain errors for some inputs
        reason = exc.args[0] if exc.args else exc
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", "replace")
        raise InvalidRegex(f"pattern {pattern!r} does not compile: {reason}") from exc
    search: Callable[[str], Any] = compiled.search
    return search


_REMEMBERED: dict[tuple[str, str], bool] = {}
_REMEMBERED_LIMIT = 1 << 16
_REMEMBERED_VALUE_LENGTH = 256


def search_remembered(pattern: str, value: str) -> bool:
    """Whether ``pattern`` is found in ``value``, remembering the answer for short values.

    Indexes are rebuilt as subscriptions come and go, and the same patterns meet the same
    entity ids and attribute values over and over; one process-wide table of answers keeps
    a rebuilt index from paying for every regex search again.
    """
    if len(value) > _REMEMBERED_VALUE_LENGTH:
        return compile_pattern(pattern)(value) is not None
    key = (pattern, value)
    found = _REMEMBERED.get(key)
    if found is None:
        found = compile_pattern(pattern)(value) is not None
        if len(_REMEMBERED) >= _REMEMBERED_LIMIT:
            _REMEMBERED.clear()
        _REMEMBERED[key] = found
    return found
