"""Test-session set-up: Hypothesis profiles, and a summary of how often generated data matched.

Profiles (choose with ``HYPOTHESIS_PROFILE``, default ``ci``):

- ``ci``: the full budget, no deadline (matching a large batch takes a while), random seeds;
- ``dev``: a fifth of the examples, for quick local runs.

Tests scale their own ``max_examples`` by the profile with :func:`strategies.examples`.
"""

from __future__ import annotations

import os
import sys

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    max_examples=100,
    deadline=None,
    derandomize=False,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "dev",
    parent=settings.get_profile("ci"),
    max_examples=20,
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Report, per property test, how often the generated updates found a match."""
    # Looked up rather than imported: only tests that use the strategies load the model.
    strategies = sys.modules.get("strategies")
    stats: dict[str, list[int]] = getattr(strategies, "MATCH_STATS", {})
    if not stats:
        return
    terminalreporter.section("generated data: match rates")
    for test, (updates, non_empty, pairs, matched) in sorted(stats.items()):
        terminalreporter.write_line(
            f"{test}: {updates} updates, {non_empty / max(1, updates):.0%} with a match, "
            f"{matched / max(1, updates):.1f} matches each; "
            f"{matched / max(1, pairs):.0%} of same-tenant pairs match"
        )
