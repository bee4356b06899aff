"""The options of the front's CORS (``--cors-origin``, ``--cors-max-age``) and their checks,
apart from the middleware (broker.ngsi.cors), so that the process options of every role can
check them without importing aiohttp."""

from __future__ import annotations

__all__ = ["ALL_ORIGINS", "DEFAULT_MAX_AGE", "cors_problems"]

ALL_ORIGINS = "__ALL"  # Orion's value of -corsOrigin for any origin
DEFAULT_MAX_AGE = 86_400  # seconds a browser may keep a preflight's answer (Orion's default)


def cors_problems(origin: str, max_age: int) -> list[str]:
    """What is wrong with ``--cors-origin`` and ``--cors-max-age`` (nothing: an empty list).
    An origin goes out as a header value as given: one line of printable ASCII."""
    problems = []
    if origin and not (origin.isascii() and origin.isprintable() and origin.strip() == origin):
        problems.append(
            f"--cors-origin {origin!r} must be an origin (scheme://host[:port]) or __ALL"
        )
    if isinstance(max_age, bool) or not isinstance(max_age, int) or max_age < 0:
        problems.append(
            f"--cors-max-age must be a whole number of seconds, 0 or more, not {max_age}"
        )
    return problems
