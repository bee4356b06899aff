"""The store layout's transitions (a scale of the store layer): holders, arrivals, primaries."""

from __future__ import annotations

import pytest

from broker.errors import InvalidInput
from broker.roles.store_scaling import NoStoreLayer, check_store_count
from broker.store.layout import RECOVERING, Registration, StoreLayout, StoreView

OLD = StoreLayout(1, ("store-1", "store-2"), replicas=2)


def _view(layout: StoreLayout, **registrations: Registration) -> StoreView:
    return StoreView(layout, registrations, frozenset(registrations))


@pytest.mark.parametrize("stores", [("store-1", "store-2", "store-3"), ("store-1",)])
def test_a_transition_holds_each_partition_on_its_new_then_its_old_holders(
    stores: tuple[str, ...],
) -> None:
    moving = OLD.transition(stores)
    new = StoreLayout(2, stores, replicas=2)
    assert moving.version == 2 and moving.previous == OLD.stores
    for p in range(moving.partitions):
        expected = new.holders(p) + tuple(s for s in OLD.holders(p) if s not in new.holders(p))
        assert moving.holders(p) == expected
        assert moving.arriving(p) == set(new.holders(p)) - set(OLD.holders(p))
    assert moving.moves() == sum(len(moving.arriving(p)) for p in range(moving.partitions))
    assert moving.settled() == StoreLayout(3, stores, replicas=2)
    assert moving.rolled_back() == StoreLayout(3, OLD.stores, replicas=2)
    assert StoreLayout.decode(moving.encode()) == moving


def test_a_scale_out_moves_only_partitions_to_the_new_store() -> None:
    moving = OLD.transition(("store-1", "store-2", "store-3"))
    arriving = {s for p in range(moving.partitions) for s in moving.arriving(p)}
    assert arriving == {"store-3"}
    assert 0 < len(moving.arriving_of("store-3")) < moving.partitions
    assert OLD.arriving_of("store-1") == []


def test_an_arriving_store_misses_its_partitions_until_it_registers_them_copied() -> None:
    moving = OLD.transition(("store-1", "store-2", "store-3"))
    p = moving.arriving_of("store-3")[0]
    before = Registration("a:3", layout=1)  # registered for the old layout: misses
    view = _view(moving, **{"store-1": Registration("a:1"), "store-2": Registration("a:2")})
    view = StoreView(moving, {**view.registrations, "store-3": before}, view.in_sync | {"store-3"})
    assert view.misses("store-3", p) and view.primary(p) != "store-3"
    assert view.primary(p) in OLD.holders(p)
    assert not view.settled()
    copying = Registration("a:3", layout=2, missing=frozenset([p]))
    view = StoreView(moving, {**view.registrations, "store-3": copying}, view.in_sync)
    assert view.misses("store-3", p)
    done = Registration("a:3", layout=2)
    view = StoreView(moving, {**view.registrations, "store-3": done}, view.in_sync)
    assert not view.misses("store-3", p) and view.settled()
    assert view.primary(p) == moving.holder(p)


def test_a_recovering_or_dead_store_is_never_a_primary() -> None:
    view = _view(OLD, **{"store-1": Registration("a:1", state=RECOVERING)})
    assert {view.primary(p) for p in range(OLD.partitions)} == {None}  # store-2 is not live


def test_the_store_count_is_checked() -> None:
    with pytest.raises(NoStoreLayer):
        check_store_count(None, 2)
    with pytest.raises(InvalidInput, match="at least one"):
        check_store_count(OLD, 0)
    with pytest.raises(InvalidInput, match="2 replicas"):
        check_store_count(OLD, 1)
    assert check_store_count(OLD, 3) is OLD
    with pytest.raises(InvalidInput, match="transition already"):
        OLD.transition(("store-1", "store-3")).transition(("store-1",))
