"""Which context stores hold which partition, which are in sync, and where each one is.

Layout (under the cluster's chroot)::

    /store-layout         persistent; JSON data:
        {"version": 1, "partitions": 256, "replicas": 2, "stores": ["store-1", "store-2"]}
        during a scale of the store layer, also "previous": the stores before it
    /store-scale          ephemeral, while a scale of the store layer runs (its owner)
    /store-sync/<id>      persistent, empty: that store holds every acknowledged write of
                          its partitions (it is *in sync*)
    /stores/<id>          ephemeral, while that store's process lives; JSON data:
        {"address": "10.0.0.7:7011", "member": "context-store-...-0000000007",
         "state": "serving" | "recovering", "layout": 3, "missing": [17, 40],
         "copied": [keys, bytes]}

A store's id is stable across its restarts: it names the storage directory the store keeps
its entities in (``silbo up`` gives slot ``n`` the id ``store-n`` and the directory
``STATE_DIR/stores/store-n``; the directory records its id, so a store never opens another's
data). Partition ``p``'s *holders* are the first ``replicas`` owners the matchers'
rendezvous selector ranks for ``p`` among the layout's stores (all of them if there are
fewer): a layout change moves only the partitions of the stores that came or went.

A partition's *primary* is its first holder, in rank order, that is serving, in sync and
does not *miss* it (:meth:`StoreView.primary`): it applies the partition's writes and
answers its reads, and makes each write durable on every other live holder before it answers
(broker.roles.context_store). The in-sync set is what makes a failover lose nothing: a
primary that cannot make a write durable on a holder removes that holder from the set (and
its registration: the holder's process stops) before it answers, so a store in the set has
every acknowledged write of its partitions, and a store out of it copies them from the
primary before it serves again (*recovering*). It is Kafka's in-sync replica rule.

A scale of the store layer (broker.roles.store_scaling) writes a *transition* layout: the new
store list, the old one kept as ``previous``. A partition's holders are then its new holders,
in rank order, followed by its old holders that are not new ones; a new holder that was not
an old one (it *arrives*) misses the partition until its registration says otherwise for
that layout version: ``"layout"`` names the version the registration speaks of and
``"missing"`` what the store has not copied yet. A registration of an older version misses
every partition that arrives to it (a store learns of the transition after ZooKeeper does),
and a recovering store misses everything. Once no new holder misses anything the final
layout is written (no ``previous``), or, when the scale fails, the old one again (a
*rollback*, as a new version); in both, stores drop the partitions they no longer hold.

The layout and the in-sync set are written first by ``silbo up`` before it starts the
stores, or by the first store of a cluster that has none (``silbo run context-store``).
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError, NoNodeError
from kazoo.recipe.watchers import ChildrenWatch, DataWatch

from broker.coordination.errors import CorruptCoordinationData, translated
from broker.errors import InvalidIdentifier, InvalidInput
from broker.partition.selector import RendezvousSelector
from broker.store.entities import PARTITIONS

__all__ = [
    "LAYOUT",
    "RECOVERING",
    "SCALE",
    "SERVING",
    "STORES",
    "SYNC",
    "LayoutWatch",
    "Registration",
    "StoreLayout",
    "StoreView",
    "check_store_id",
    "create_store_layout",
    "fence_store",
    "join_in_sync",
    "read_store_layout",
    "register_store",
    "set_store_state",
]

LAYOUT: Final = "/store-layout"
STORES: Final = "/stores"
SYNC: Final = "/store-sync"
SCALE: Final = "/store-scale"
SERVING: Final = "serving"
RECOVERING: Final = "recovering"
_ID: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def check_store_id(store_id: str) -> str:
    """``store_id`` if it is a usable id (letters, digits, ``_.-``; at most 64), else
    InvalidIdentifier."""
    if not _ID.match(store_id):
        raise InvalidIdentifier(
            f"a store id is 1 to 64 letters, digits, '_', '.' or '-' (starting with a letter "
            f"or digit), not {store_id!r}"
        )
    return store_id


@dataclass(frozen=True, slots=True)
class StoreLayout:
    """The stores of the cluster, and so each partition's holders (see the module doc);
    ``previous`` (not empty) makes it a transition from those stores to ``stores``."""

    version: int
    stores: tuple[str, ...]
    partitions: int = PARTITIONS
    replicas: int = 1
    previous: tuple[str, ...] = ()
    _holders: tuple[tuple[str, ...], ...] = field(init=False, repr=False, compare=False)
    _arriving: tuple[frozenset[str], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.partitions != PARTITIONS:
            raise InvalidInput(
                f"a store layout of {self.partitions} partitions; this release uses {PARTITIONS}"
            )
        for store in (*self.stores, *self.previous):
            check_store_id(store)
        new = _ranked(self.stores, self.replicas, self.partitions)
        if not self.previous:
            object.__setattr__(self, "_holders", new)
            object.__setattr__(self, "_arriving", (frozenset(),) * self.partitions)
            return
        old = _ranked(self.previous, self.replicas, self.partitions)
        holders = tuple(
            n + tuple(s for s in o if s not in n) for n, o in zip(new, old, strict=True)
        )
        arriving = tuple(frozenset(n) - frozenset(o) for n, o in zip(new, old, strict=True))
        object.__setattr__(self, "_holders", holders)
        object.__setattr__(self, "_arriving", arriving)

    def holders(self, partition: int) -> tuple[str, ...]:
        """The stores that hold ``partition``, in rank order (in a transition: the new
        holders, then the old ones that are not new)."""
        return self._holders[partition]

    def holder(self, partition: int) -> str:
        """The first-ranked store of ``partition``."""
        return self._holders[partition][0]

    def partitions_of(self, store: str) -> list[int]:
        """The partitions ``store`` holds (none if it is not in the layout)."""
        return [p for p, holders in enumerate(self._holders) if store in holders]

    def arriving(self, partition: int) -> frozenset[str]:
        """The holders of ``partition`` that must copy it (a transition's new holders that
        were not old ones; none outside a transition)."""
        return self._arriving[partition]

    def arriving_of(self, store: str) -> list[int]:
        """The partitions ``store`` must copy in this transition."""
        return [p for p, arriving in enumerate(self._arriving) if store in arriving]

    def moves(self) -> int:
        """How many copies of partitions this transition makes."""
        return sum(len(arriving) for arriving in self._arriving)

    def transition(self, stores: Sequence[str]) -> StoreLayout:
        """The next version: a transition from this layout's stores to ``stores``."""
        if self.previous:
            raise InvalidInput(f"store layout {self.version} is a transition already")
        return StoreLayout(
            self.version + 1, tuple(stores), self.partitions, self.replicas, self.stores
        )

    def settled(self) -> StoreLayout:
        """The next version: this transition's new stores alone (the scale completed)."""
        return StoreLayout(self.version + 1, self.stores, self.partitions, self.replicas)

    def rolled_back(self) -> StoreLayout:
        """The next version: this transition's old stores again (the scale failed)."""
        stores = self.previous or self.stores
        return StoreLayout(self.version + 1, stores, self.partitions, self.replicas)

    def encode(self) -> bytes:
        """The znode's JSON data."""
        body: dict[str, Any] = {
            "version": self.version,
            "partitions": self.partitions,
            "replicas": self.replicas,
            "stores": self.stores,
        }
        if self.previous:
            body["previous"] = self.previous
        return json.dumps(body, sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes) -> StoreLayout:
        """The layout a znode holds; CorruptCoordinationData if it is not one."""
        try:
            body: Any = json.loads(data)
            return cls(
                int(body["version"]),
                tuple(body["stores"]),
                int(body["partitions"]),
                int(body.get("replicas", 1)),
                tuple(body.get("previous") or ()),
            )
        except (ValueError, TypeError, KeyError, InvalidInput) as exc:
            raise CorruptCoordinationData(f"{LAYOUT} is unreadable: {exc}") from exc


def _ranked(stores: Sequence[str], replicas: int, partitions: int) -> tuple[tuple[str, ...], ...]:
    """Each partition's first ``replicas`` stores by the rendezvous selector's rank."""
    width = min(replicas, len(stores)) if stores else 1
    # InvalidInput: no stores, duplicates, replicas below 1
    selector = RendezvousSelector(tuple(stores), replicas=max(width, replicas, 1))
    ranked = selector.holders_of([str(p) for p in range(partitions)])
    return tuple(tuple(r[:width]) for r in ranked)


@dataclass(frozen=True, slots=True)
class Registration:
    """What a live store announces (module doc): where it serves, its state, and for which
    layout version the partitions it still misses are listed."""

    address: str
    member: str = ""
    state: str = SERVING
    layout: int = 0
    missing: frozenset[int] = frozenset()
    copied: tuple[int, int] = (0, 0)  # keys and bytes copied for that layout version

    def encode(self) -> bytes:
        """The znode's JSON data."""
        body = {
            "address": self.address,
            "member": self.member,
            "state": self.state,
            "layout": self.layout,
            "missing": sorted(self.missing),
            "copied": list(self.copied),
        }
        return json.dumps(body, sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes) -> Registration:
        """The registration a znode holds (ValueError, KeyError or TypeError if none)."""
        body = json.loads(data)
        keys, size = body.get("copied") or (0, 0)
        return cls(
            str(body["address"]),
            str(body.get("member", "")),
            str(body.get("state", SERVING)),
            int(body.get("layout", 0)),
            frozenset(int(p) for p in body.get("missing") or ()),
            (int(keys), int(size)),
        )


@dataclass(frozen=True, slots=True)
class StoreView:
    """One process's view of the store layer: the layout, the live stores' registrations
    and the in-sync set, as last read from ZooKeeper."""

    layout: StoreLayout | None = None
    registrations: dict[str, Registration] = field(default_factory=dict)  # of live stores
    in_sync: frozenset[str] = frozenset()

    @property
    def addresses(self) -> dict[str, str]:
        """The live stores' addresses."""
        return {store: r.address for store, r in self.registrations.items()}

    @property
    def states(self) -> dict[str, str]:
        """The live stores' states (serving / recovering)."""
        return {store: r.state for store, r in self.registrations.items()}

    def misses(self, store: str, partition: int) -> bool:
        """Whether live ``store`` lacks acknowledged writes of ``partition`` it holds: it
        recovers, or the partition arrives to it and it has not said it copied it (module
        doc)."""
        registration = self.registrations.get(store)
        if registration is None or registration.state != SERVING:
            return True
        if self.layout is None or store not in self.layout.arriving(partition):
            return False
        return registration.layout != self.layout.version or partition in registration.missing

    def primary(self, partition: int) -> str | None:
        """The primary of ``partition`` (module doc), or None if no holder can serve it."""
        if self.layout is None:
            return None
        for store in self.layout.holders(partition):
            if store in self.in_sync and not self.misses(store, partition):
                return store
        return None

    def backups(self, partition: int, primary: str) -> list[str]:
        """The live holders of ``partition`` other than ``primary`` (those a write of it is
        made durable on before it is answered)."""
        if self.layout is None:
            return []
        return [
            s for s in self.layout.holders(partition) if s != primary and s in self.registrations
        ]

    def settled(self) -> bool:
        """Whether every partition's new holders are live, in sync and miss nothing (a
        transition may end)."""
        layout = self.layout
        if layout is None:
            return False
        width = min(layout.replicas, len(layout.stores))  # the new holders come first
        return all(
            s in self.in_sync and not self.misses(s, p)
            for p in range(layout.partitions)
            for s in layout.holders(p)[:width]
        )


def read_store_layout(client: KazooClient) -> StoreLayout | None:
    """The cluster's store layout, or None if it has none (no store layer)."""
    with translated("read the store layout"):
        try:
            data, _stat = client.retry(client.get, LAYOUT)
        except NoNodeError:
            return None
    return StoreLayout.decode(data)


def create_store_layout(
    client: KazooClient, stores: Sequence[str], replicas: int = 1
) -> StoreLayout:
    """Write the first layout (version 1) of ``stores``, every store in sync (they are all
    empty); the existing layout if there is one."""
    layout = StoreLayout(1, tuple(stores), replicas=replicas)
    with translated("write the store layout"):
        transaction = client.transaction()
        transaction.create(LAYOUT, layout.encode())
        client.ensure_path(SYNC)
        for store in stores:
            transaction.create(f"{SYNC}/{store}", b"")
        results = transaction.commit()
        if not any(isinstance(r, Exception) for r in results):
            return layout
        if not any(isinstance(r, NodeExistsError) for r in results):
            raise next(r for r in results if isinstance(r, Exception))
    existing = read_store_layout(client)
    assert existing is not None, "the layout cannot go once written"
    return existing


def register_store(client: KazooClient, store_id: str, registration: Registration) -> str:
    """Announce that ``store_id`` lives at the registration's address (an ephemeral znode of
    this session).

    InvalidInput if a live process already serves that store id (two processes given one id
    with two directories): the second must not serve.
    """
    path = f"{STORES}/{check_store_id(store_id)}"
    with translated("announce the store"):
        try:
            client.retry(client.create, path, registration.encode(), ephemeral=True, makepath=True)
        except NodeExistsError:
            raise InvalidInput(
                f"store {store_id!r} is already served by another live process"
            ) from None
    return path


def set_store_state(client: KazooClient, store_id: str, registration: Registration) -> None:
    """Change this store's announced state (serving once it recovered, the partitions it
    still misses)."""
    with translated("announce the store's state"):
        client.retry(client.set, f"{STORES}/{store_id}", registration.encode())


def join_in_sync(client: KazooClient, store_id: str) -> None:
    """Add ``store_id`` to the in-sync set (idempotent; only :func:`fence_store` removes)."""
    with translated("join the in-sync set"), contextlib.suppress(NodeExistsError):
        client.retry(client.create, f"{SYNC}/{store_id}", b"", makepath=True)


def fence_store(client: KazooClient, me: str, victim: str) -> bool:
    """Take ``victim`` out of the in-sync set and delete its registration (its process
    stops), if ``me`` is still in sync: one transaction, so of two stores that fence each
    other only the first does. True once ``victim`` is fenced; False if ``me`` is not in
    sync (it must stop acting as a primary)."""
    with translated("fence a store"):
        for _attempt in range(5):
            transaction = client.transaction()
            transaction.check(f"{SYNC}/{me}", -1)
            for path in (f"{SYNC}/{victim}", f"{STORES}/{victim}"):
                if client.exists(path):
                    transaction.delete(path)
            results = transaction.commit()
            failed = [r for r in results if isinstance(r, Exception)]
            if not failed:
                return True
            if isinstance(results[0], NoNodeError):
                return False  # we are out of sync ourselves
        return False  # the victim's znodes kept changing: it is being fenced anyway


class LayoutWatch:
    """The store layer as ZooKeeper's watches keep it: :attr:`view` (a :class:`StoreView`,
    replaced whole at each change). ``on_change`` (kazoo's thread) is called after each."""

    def __init__(self, client: KazooClient, on_change: Callable[[], None] | None = None) -> None:
        self._client = client
        self._on_change = on_change
        self.view = StoreView()
        self._stopped = False
        self._watched: set[str] = set()
        client.ensure_path(STORES)
        client.ensure_path(SYNC)
        self._data = DataWatch(client, LAYOUT, self._layout_changed)
        self._sync = ChildrenWatch(client, SYNC, self._sync_changed)
        self._children = ChildrenWatch(client, STORES, self._stores_changed, send_event=True)

    @property
    def layout(self) -> StoreLayout | None:
        """The layout last read."""
        return self.view.layout

    @property
    def addresses(self) -> dict[str, str]:
        """The live stores' addresses."""
        return self.view.addresses

    def registration(self, store: str) -> Registration | None:
        """What live ``store`` announces."""
        return self.view.registrations.get(store)

    def stop(self) -> None:
        """Stop following changes."""
        self._stopped = True

    def _layout_changed(self, data: bytes | None, _stat: object) -> bool | None:
        if self._stopped:
            return False
        if data is not None:
            try:
                layout = StoreLayout.decode(data)
            except CorruptCoordinationData:
                return None  # keep the last readable one
            self._replace(layout=layout)
        return None

    def _sync_changed(self, children: list[str]) -> bool | None:
        if self._stopped:
            return False
        self._replace(in_sync=frozenset(children))
        return None

    def _stores_changed(self, children: list[str], _event: object = None) -> bool | None:
        if self._stopped:
            return False
        for child in set(children) - self._watched:  # a store's state changes in its data
            self._watched.add(child)
            DataWatch(self._client, f"{STORES}/{child}", self._store_changed(child))
        self._reread(children)
        return None

    def _store_changed(self, child: str) -> Callable[[bytes | None, object], bool | None]:
        def changed(data: bytes | None, _stat: object) -> bool | None:
            if self._stopped:
                return False
            if data is None:
                self._watched.discard(child)
                try:  # the znode went; if it is back already, watch the new one
                    self._stores_changed(self._client.get_children(STORES))
                except NoNodeError:
                    self._reread(None)
                return False
            self._reread(None)
            return None

        return changed

    def _reread(self, children: list[str] | None) -> None:
        try:
            names = children if children is not None else self._client.get_children(STORES)
        except NoNodeError:
            names = []
        registrations = {}
        for child in names:
            try:
                data, _stat = self._client.get(f"{STORES}/{child}")
                registrations[child] = Registration.decode(data)
            except (NoNodeError, ValueError, KeyError, TypeError):
                continue  # gone meanwhile, or unreadable: not routable
        self._replace(registrations=registrations)

    def _replace(self, **changes: Any) -> None:
        view = self.view
        self.view = StoreView(
            changes.get("layout", view.layout),
            changes.get("registrations", view.registrations),
            changes.get("in_sync", view.in_sync),
        )
        if self._on_change is not None:
            self._on_change()
