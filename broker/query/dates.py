"""ISO 8601 dates as filters and attributes compare them: epoch seconds."""

from __future__ import annotations

from datetime import UTC, datetime

__all__ = ["parse_iso8601"]


def parse_iso8601(text: str) -> float | None:
    """Return the epoch seconds of an ISO 8601 date or date-time, or None if it is not one.

    A date-time without an offset is taken as UTC (as Orion does). ``Z`` is accepted.
    """
    if len(text) < 10 or not text[:4].isdigit() or text[4] != "-":
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()
