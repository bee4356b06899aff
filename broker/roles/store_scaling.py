"""The coordinator of a scale of the context store layer (``silbo admin scale context-stores``).

    outcome = scale_stores(client, ["store-1", "store-2", "store-3"], timeout=60)

Steps (broker.store.layout has the rules the stores follow):

1. own ``/store-scale`` (ephemeral: one scale at a time, a second is refused with
   ScaleInProgress); a transition a dead coordinator left is rolled back first;
2. write the *transition* layout: the new store list, the old one as ``previous``. Each
   partition's holders are its new holders then its old ones, and the new holders that were
   not old ones miss it: they copy it from its primary (an old holder) while its writes go
   on, and clear it from their registration;
3. once every partition's new holders are live, in sync and miss nothing, write the
   *settled* layout (the new stores alone): old holders drop the partitions they left, and
   stores scaled in leave the in-sync set (the command stops them): *completed*.

A scale that does not settle within ``timeout``, or whose added store dies, is *rolled
back*: the old layout is written again (a new version), and the new holders drop their
copies. Before each layout write, the stores that it takes the primary role of partitions
from are asked to yield them (they stop writing them, their writes in flight end), so that
no partition ever has two primaries writing.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, Final

import grpc
from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError, NoNodeError

from broker.coordination.errors import ConfigurationConflict, translated
from broker.coordination.scale import ScaleInProgress
from broker.errors import InvalidInput
from broker.runtime.token import call_metadata
from broker.store.layout import (
    LAYOUT,
    SCALE,
    STORES,
    SYNC,
    LayoutWatch,
    Registration,
    StoreLayout,
    StoreView,
    read_store_layout,
)
from broker.store.wire import pack
from broker.wire import internal_pb2 as wire
from broker.wire import internal_pb2_grpc as wire_grpc

__all__ = [
    "NoStoreLayer",
    "StoreScaleOutcome",
    "check_store_count",
    "registrations",
    "scale_stores",
    "store_status",
]

YIELD_TIMEOUT: Final = 5.0  # seconds a store may take to yield partitions
SEEN_TIMEOUT: Final = 10.0  # seconds for this process's view to show a layout it wrote


class NoStoreLayer(InvalidInput):
    """The cluster has no context store layer (no store layout)."""


@dataclass
class StoreScaleOutcome:
    """What ``silbo admin scale context-stores`` reports (``--json`` gives these keys)."""

    outcome: str  # completed | rolled back
    duration_s: float
    moved_partitions: int  # partition copies made (a partition to each new holder)
    moved_keys: int
    moved_bytes: int
    layout: int  # the store layout's version at the end
    message: str = ""

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of ``silbo admin scale context-stores --json``."""
        return asdict(self)


def check_store_count(layout: StoreLayout | None, count: int) -> StoreLayout:
    """``layout`` if the store layer can be scaled to ``count`` stores, else InvalidInput
    (NoStoreLayer if there is no store layer)."""
    if layout is None:
        raise NoStoreLayer("the cluster has no context store layer (no store layout)")
    if count < 1:
        raise InvalidInput("a store layer needs at least one context store")
    if count < layout.replicas:
        raise InvalidInput(
            f"the store layer keeps {layout.replicas} replicas of each partition: it needs "
            f"at least {layout.replicas} context stores, not {count}"
        )
    return layout


def registrations(client: KazooClient) -> dict[str, Registration]:
    """The live stores' registrations."""
    found = {}
    with translated("read the stores' registrations"):
        try:
            children = client.get_children(STORES)
        except NoNodeError:
            return {}
        for child in children:
            with contextlib.suppress(NoNodeError, ValueError, KeyError, TypeError):
                found[child] = Registration.decode(client.get(f"{STORES}/{child}")[0])
    return found


def store_status(client: KazooClient) -> dict[str, Any] | None:
    """The store layer as ``silbo admin status`` shows it (None: there is none)."""
    layout = read_store_layout(client)
    if layout is None:
        return None
    with translated("read the in-sync set"):
        in_sync = set(client.get_children(SYNC)) if client.exists(SYNC) else set()
        scaling = client.exists(SCALE) is not None
    found = registrations(client)
    view = StoreView(layout, found, frozenset(in_sync))
    stores = {}
    for store in sorted(set(layout.stores) | set(layout.previous) | set(found)):
        held = layout.partitions_of(store)
        registration = found.get(store)
        stores[store] = {
            "state": registration.state if registration else "not live",
            "in_sync": store in in_sync,
            "partitions": len(held),
            "missing": sum(1 for p in held if view.misses(store, p)) if registration else len(held),
            "primary_of": sum(1 for p in held if view.primary(p) == store),
        }
    return {
        "layout": layout.version,
        "replicas": layout.replicas,
        "transition": list(layout.previous) if layout.previous else None,
        "scaling": scaling,
        "stores": stores,
    }


def scale_stores(
    client: KazooClient, stores: Sequence[str], *, timeout: float = 60.0
) -> StoreScaleOutcome:
    """Scale the store layer to ``stores`` (the module doc); the outcome."""
    started = time.monotonic()
    changed = threading.Event()
    with _owned(client):
        watch = LayoutWatch(client, changed.set)
        try:
            layout = check_store_count(watch.layout, len(stores))
            if layout.previous:  # a coordinator died during its transition
                layout = _write(client, watch, layout, layout.rolled_back())
            if tuple(stores) == layout.stores:
                return StoreScaleOutcome("completed", 0.0, 0, 0, 0, layout.version, "no change")
            copied = {s: r.copied for s, r in watch.view.registrations.items()}
            transition = _write(client, watch, layout, layout.transition(stores))
            added = set(stores) - set(layout.stores)
            why = _settle(watch, changed, transition, added, started + timeout)
            if why:
                end = _write(client, watch, transition, transition.rolled_back())
                _leave_sync(client, added)
            else:
                end = _write(client, watch, transition, transition.settled())
                _leave_sync(client, set(layout.stores) - set(stores))
            now = watch.view.registrations
            keys = sum(now[s].copied[0] - copied.get(s, (0, 0))[0] for s in now)
            size = sum(now[s].copied[1] - copied.get(s, (0, 0))[1] for s in now)
            return StoreScaleOutcome(
                "rolled back" if why else "completed",
                round(time.monotonic() - started, 3),
                transition.moves(),
                max(keys, 0),
                max(size, 0),
                end.version,
                why,
            )
        finally:
            watch.stop()


@contextlib.contextmanager
def _owned(client: KazooClient) -> Iterator[None]:
    """Own the store layer's scale for the block (ScaleInProgress if another runs)."""
    with translated("start a scale of the store layer"):
        try:
            client.create(SCALE, b"", ephemeral=True)
        except NodeExistsError:
            raise ScaleInProgress("a scale of the context store layer is running") from None
    try:
        yield
    finally:
        with translated("end a scale of the store layer"), contextlib.suppress(NoNodeError):
            client.delete(SCALE)


def _settle(
    watch: LayoutWatch,
    changed: threading.Event,
    transition: StoreLayout,
    added: set[str],
    deadline: float,
) -> str:
    """Wait until ``transition`` may settle: "" then, else why it must be rolled back."""
    live: set[str] = set()
    while True:
        view = watch.view
        if view.layout == transition and view.settled():
            return ""
        died = sorted(s for s in live if s not in view.registrations)
        if died:
            return f"store {', '.join(died)} died during the scale"
        live |= added & set(view.registrations)
        if time.monotonic() > deadline:
            waiting = sorted(
                s
                for p in range(transition.partitions)
                for s in transition.arriving(p)
                if view.misses(s, p) or s not in view.in_sync
            )
            return f"not settled in time (waiting for {', '.join(sorted(set(waiting)))})"
        changed.clear()
        changed.wait(0.25)


def _write(
    client: KazooClient, watch: LayoutWatch, current: StoreLayout, new: StoreLayout
) -> StoreLayout:
    """Replace ``current`` by ``new`` (compare-and-set), the primaries it moves yielded
    first; return once this process's view shows it."""
    before = replace(watch.view, layout=current)
    after = replace(watch.view, layout=new)
    giving: dict[str, list[int]] = {}
    for partition in range(current.partitions):
        old, primary = before.primary(partition), after.primary(partition)
        if old is not None and primary != old:
            giving.setdefault(old, []).append(partition)
    for store, partitions in giving.items():
        _yield(before.addresses.get(store), partitions)
    with translated("write the store layout"):
        data, stat = client.get(LAYOUT)
        if StoreLayout.decode(data) != current:
            raise ConfigurationConflict("the store layout changed during the scale")
        client.set(LAYOUT, new.encode(), version=stat.version)
    deadline = time.monotonic() + SEEN_TIMEOUT
    while watch.layout != new and time.monotonic() < deadline:
        time.sleep(0.02)
    return new


def _yield(address: str | None, partitions: list[int]) -> None:
    """Ask the store at ``address`` to stop writing these partitions (a dead one does not
    write: nothing to ask)."""
    if address is None:
        return
    with contextlib.suppress(grpc.RpcError), grpc.insecure_channel(address) as channel:
        stub = wire_grpc.ContextStoreStub(channel)  # type: ignore[no-untyped-call]
        stub.Yield(
            wire.StoreRequest(body=pack(["", partitions, 0])),
            timeout=YIELD_TIMEOUT,
            metadata=call_metadata(),
        )


def _leave_sync(client: KazooClient, stores: set[str]) -> None:
    """Take stores that hold nothing any more out of the in-sync set (if one comes back,
    it recovers what it holds then)."""
    for store in stores:
        with translated("leave the in-sync set"), contextlib.suppress(NoNodeError):
            client.delete(f"{SYNC}/{store}")
