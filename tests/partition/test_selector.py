"""The rendezvous selector: movement on scaling, balance, determinism, storage form."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.errors import InvalidInput, SerializationError
from broker.partition.selector import RendezvousSelector, id_hashes, moved

IDS = [f"sub-{i}" for i in range(20_000)]


def owners(n: int) -> tuple[str, ...]:
    return tuple(f"m{i}" for i in range(n))


# Computed once and pinned: if the hash or the mixing changes, processes of two builds would
# disagree on owners, so this must break.
PINNED_OWNERS = owners(5)
PINNED_TABLE = [
    ("s0", "m1"),
    ("s1", "m2"),
    ("s2", "m3"),
    ("s3", "m4"),
    ("s4", "m0"),
    ("s5", "m0"),
    ("s6", "m2"),
    ("s7", "m1"),
    ("sub-42", "m4"),
    ("urn:ngsi:Sub:7", "m2"),
    ("a", "m3"),
    ("x-y_z.1", "m3"),
    ("5f3c2a", "m3"),
    ("s999", "m3"),
    ("Room1", "m3"),
    ("ñandú", "m3"),
]
PINNED_HASHES = [
    ("s0", 0x7BB85BDA056005E7),
    ("sub-42", 0x146324CEB78FB279),
    ("ñandú", 0xE85C4349A53D5614),
]


@pytest.mark.parametrize("n", range(1, 9))
def test_adding_an_owner_moves_about_its_share_and_only_to_it(n: int) -> None:
    old, new = RendezvousSelector(owners(n)), RendezvousSelector(owners(n + 1))
    before, after = old.owners_of(IDS), new.owners_of(IDS)
    changed = [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a != b]
    share = len(changed) / len(IDS)
    assert 0.7 / (n + 1) <= share <= 1.3 / (n + 1)
    assert {after[i] for i in changed} == {f"m{n}"}
    assert moved(old, new, IDS) == [IDS[i] for i in changed]


@pytest.mark.parametrize("n", range(1, 9))
def test_removing_an_owner_moves_only_its_ids(n: int) -> None:
    old, new = RendezvousSelector(owners(n + 1)), RendezvousSelector(owners(n))
    before, after = old.owners_of(IDS), new.owners_of(IDS)
    changed = {i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a != b}
    assert changed == {i for i, owner in enumerate(before) if owner == f"m{n}"}
    assert moved(old, new, IDS) == [IDS[i] for i in sorted(changed)]


def test_removing_a_middle_owner_moves_only_its_ids() -> None:
    old = RendezvousSelector(owners(5))
    new = RendezvousSelector(("m0", "m1", "m3", "m4"))
    before, after = old.owners_of(IDS), new.owners_of(IDS)
    for a, b in zip(before, after, strict=True):
        assert a == b or a == "m2"


@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_balance_within_15_percent_of_the_mean(n: int) -> None:
    counts = Counter(RendezvousSelector(owners(n)).owners_of(IDS))
    mean = len(IDS) / n
    assert set(counts) == set(owners(n))
    for count in counts.values():
        assert abs(count - mean) <= 0.15 * mean


def test_pinned_owners_and_hashes() -> None:
    selector = RendezvousSelector(PINNED_OWNERS)
    assert [(i, selector.owner_of(i)) for i, _ in PINNED_TABLE] == PINNED_TABLE
    ids = [i for i, _ in PINNED_TABLE]
    assert selector.owners_of(ids) == [owner for _, owner in PINNED_TABLE]
    hashes = id_hashes([i for i, _ in PINNED_HASHES])
    assert [int(h) for h in hashes] == [h for _, h in PINNED_HASHES]


def test_same_answers_in_another_process() -> None:
    # A fresh interpreter has another str hash seed: nothing may depend on hash().
    code = (
        "from broker.partition.selector import RendezvousSelector as R;"
        f"print(','.join(R({PINNED_OWNERS!r}).owners_of({IDS[:500]!r})))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONHASHSEED": "12345"},
    )
    expected = RendezvousSelector(PINNED_OWNERS).owners_of(IDS[:500])
    assert result.stdout.strip().split(",") == expected


@pytest.mark.parametrize("n", [1, 2, 3, 8])
def test_owners_of_equals_owner_of(n: int) -> None:
    selector = RendezvousSelector(owners(n))
    sample = IDS[:3000]
    assert selector.owners_of(sample) == [selector.owner_of(i) for i in sample]


@given(
    st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=6, unique=True),
    st.lists(st.text(max_size=40), max_size=30),
)
def test_owners_of_equals_owner_of_for_any_names(names: list[str], ids: list[str]) -> None:
    selector = RendezvousSelector(tuple(names))
    assert selector.owners_of(ids) == [selector.owner_of(i) for i in ids]


def test_empty_input() -> None:
    selector = RendezvousSelector(owners(3))
    assert selector.owners_of([]) == []
    assert moved(selector, RendezvousSelector(owners(4)), []) == []
    assert id_hashes([]).dtype == np.uint64


def test_owner_order_does_not_matter() -> None:
    a = RendezvousSelector(("m2", "m0", "m1"))
    b = RendezvousSelector(("m0", "m1", "m2"))
    assert a == b
    assert hash(a) == hash(b)
    assert a.owners == ("m0", "m1", "m2")
    assert a.owners_of(IDS[:1000]) == b.owners_of(IDS[:1000])
    assert a != RendezvousSelector(owners(4))


@pytest.mark.parametrize(
    "bad",
    [(), ("m0", "m0"), ("m0", "m1", "m0"), ("m0", ""), ("m0", 3), ["m0"]],
    ids=["empty", "duplicate", "duplicate-later", "empty-name", "not-a-string", "list"],
)
def test_invalid_owners(bad: object) -> None:
    with pytest.raises(InvalidInput):
        RendezvousSelector(bad)  # type: ignore[arg-type]


def test_dict_round_trip_through_json() -> None:
    selector = RendezvousSelector(owners(4), 2)
    stored = json.dumps(selector.to_dict())
    assert json.loads(stored) == {
        "kind": "rendezvous",
        "version": 1,
        "owners": list(owners(4)),
        "replicas": 2,
    }
    assert RendezvousSelector.from_dict(json.loads(stored)) == selector


def test_a_selector_stored_before_replicas_reads_as_one_replica() -> None:
    stored = {"kind": "rendezvous", "version": 1, "owners": ["m0", "m1"]}
    assert RendezvousSelector.from_dict(stored).replicas == 1


@pytest.mark.parametrize(
    "data",
    [
        {"kind": "ring", "version": 1, "owners": ["m0"]},
        {"kind": "rendezvous", "version": 2, "owners": ["m0"]},
        {"version": 1, "owners": ["m0"]},
        {"kind": "rendezvous", "version": 1},
        {"kind": "rendezvous", "version": 1, "owners": "m0"},
        {"kind": "rendezvous", "version": 1, "owners": []},
        {"kind": "rendezvous", "version": 1, "owners": ["m0", "m0"]},
        {"kind": "rendezvous", "version": 1, "owners": [1]},
        {"kind": "rendezvous", "version": 1, "owners": ["m0"], "replicas": 0},
        {"kind": "rendezvous", "version": 1, "owners": ["m0"], "replicas": "2"},
        ["rendezvous"],
    ],
)
def test_from_dict_rejects_malformed(data: object) -> None:
    with pytest.raises(SerializationError):
        RendezvousSelector.from_dict(data)  # type: ignore[arg-type]


# -- replicas: preference lists ----------------------------------------------------------


@pytest.mark.parametrize(("n", "r"), [(1, 2), (2, 2), (3, 2), (5, 3), (8, 2), (4, 1)])
def test_a_preference_list_is_the_heaviest_owners_headed_by_the_owner(n: int, r: int) -> None:
    selector = RendezvousSelector(owners(n), r)
    ids = IDS[:2000]
    holders = selector.holders_of(ids)
    assert selector.width == min(n, r)
    for subscription_id, row, owner in zip(ids, holders, selector.owners_of(ids), strict=True):
        assert len(set(row)) == len(row) == min(n, r)
        assert row[0] == owner
        # the list is exactly the min(n, r) owners of highest weight, best first
        by_weight = sorted(owners(n), key=lambda o: _weight(subscription_id, o), reverse=True)
        assert list(row) == by_weight[: len(row)]


def _weight(subscription_id: str, owner: str) -> int:
    """The weight as the module doc defines it, computed apart from the selector."""
    key = int.from_bytes(id_hashes([subscription_id]).tobytes(), "little")
    owner_key = int.from_bytes(
        hashlib.blake2b(owner.encode(), digest_size=8, person=b"silbo-owner").digest(), "little"
    )
    z = key ^ owner_key
    mask = (1 << 64) - 1
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    return z ^ (z >> 31)


@given(st.integers(2, 7), st.integers(2, 3), st.data())
def test_removing_an_owner_keeps_every_survivor_on_its_lists(
    n: int, r: int, data: st.DataObject
) -> None:
    gone = data.draw(st.sampled_from(owners(n)))
    old = RendezvousSelector(owners(n), r)
    new = RendezvousSelector(tuple(o for o in owners(n) if o != gone), r)
    ids = IDS[:500]
    for before, after in zip(old.holders_of(ids), new.holders_of(ids), strict=True):
        survivors = [o for o in before if o != gone]
        assert list(after[: len(survivors)]) == survivors  # nothing moves but the gap
        if gone not in before:
            assert after == before


def test_each_owner_holds_about_r_over_n_of_the_ids() -> None:
    selector = RendezvousSelector(owners(5), 2)
    counts = Counter(o for row in selector.holders_of(IDS) for o in row)
    for owner in owners(5):
        assert 0.85 * 2 / 5 <= counts[owner] / len(IDS) <= 1.15 * 2 / 5


@pytest.mark.parametrize("bad", [0, -1, True, 1.5])
def test_invalid_replicas(bad: object) -> None:
    with pytest.raises(InvalidInput):
        RendezvousSelector(owners(2), bad)  # type: ignore[arg-type]
