"""Bitsets as Python integers."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from broker.matching.bitset import decode_many, from_mask, from_positions, positions


@given(st.sets(st.integers(min_value=0, max_value=5000)))
def test_positions_round_trip(chosen: set[int]) -> None:
    bits = from_positions(sorted(chosen), 5001)
    assert bits == sum(1 << p for p in chosen)
    assert positions(bits) == sorted(chosen)


def test_large_sets_use_the_vector_path() -> None:
    rng = np.random.default_rng(7)
    mask = rng.random(100_000) < 0.01
    bits = from_mask(mask)
    assert positions(bits) == np.flatnonzero(mask).tolist()


def test_empty() -> None:
    assert positions(0) == []
    assert from_mask(np.zeros(10, dtype=np.bool_)) == 0
    assert from_positions([], 10) == 0


@given(st.lists(st.sets(st.integers(min_value=0, max_value=700)), max_size=12))
def test_decode_many_equals_one_by_one(chosen: list[set[int]]) -> None:
    sets = [from_positions(sorted(c), 701) for c in chosen]
    found, bounds = decode_many(sets, 701)
    assert len(bounds) == len(sets) + 1
    for i, bits in enumerate(sets):
        assert sorted(found[bounds[i] : bounds[i + 1]].tolist()) == positions(bits)
