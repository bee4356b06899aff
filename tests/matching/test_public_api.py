"""The public names of broker.matching are pinned: changing them is a decision."""

from __future__ import annotations

import broker.matching


def test_public_names() -> None:
    assert broker.matching.__all__ == ["Engine", "ReferenceMatcher", "subscription_matches"]
    for name in broker.matching.__all__:
        assert getattr(broker.matching, name) is not None
