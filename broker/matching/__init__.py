"""Matching: the indexed engine and the reference matcher it is tested against."""

from __future__ import annotations

from broker.matching.engine import Engine
from broker.matching.reference import ReferenceMatcher, subscription_matches

__all__ = ["Engine", "ReferenceMatcher", "subscription_matches"]
