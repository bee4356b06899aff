"""Which context store holds which partition, and where each store is (ZooKeeper).

Layout (under the cluster's chroot)::

    /store-layout         persistent; JSON data:
        {"version": 1, "partitions": 256, "stores": ["store-0", "store-1"]}
    /stores/<store id>    ephemeral, while that store serves; JSON data:
        {"address": "10.0.0.7:7011", "member": "context-store-...-0000000007"}

A store's id is stable across its restarts: it names the storage directory the store keeps
its entities in (``silbo up`` gives slot ``n`` the id ``store-n`` and the directory
``STATE_DIR/stores/store-n``; the directory records its id, so a store never opens another's
data). Partition ``p``'s holder is the owner the matchers' rendezvous selector gives for
``p`` among the layout's stores: a layout change moves only the partitions of the stores
that came or went.

The layout is written once, by ``silbo up`` before it starts the stores, or by the first
store of a cluster that has none (``silbo run context-store``); its version grows with
every change (a scale of the store layer: docs/context-store.md). A front routes by the
layout it last read and the live ``/stores`` entries: a partition whose holder is not
live (dead, restarting) cannot be read or written until it is back (the front waits, then
refuses with 503: docs/failures.md).
"""

from __future__ import annotations

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
    "STORES",
    "LayoutWatch",
    "StoreLayout",
    "check_store_id",
    "create_store_layout",
    "read_store_layout",
    "register_store",
]

LAYOUT: Final = "/store-layout"
STORES: Final = "/stores"
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
    """The stores of the cluster, and so each partition's holder (see the module doc)."""

    version: int
    stores: tuple[str, ...]
    partitions: int = PARTITIONS
    _holders: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.partitions != PARTITIONS:
            raise InvalidInput(
                f"a store layout of {self.partitions} partitions; this release uses {PARTITIONS}"
            )
        for store in self.stores:
            check_store_id(store)
        selector = RendezvousSelector(tuple(self.stores))  # InvalidInput: empty, duplicates
        holders = tuple(selector.owner_of(str(p)) for p in range(self.partitions))
        object.__setattr__(self, "_holders", holders)

    def holder(self, partition: int) -> str:
        """The store that holds ``partition``."""
        return self._holders[partition]

    def partitions_of(self, store: str) -> list[int]:
        """The partitions ``store`` holds (none if it is not in the layout)."""
        return [p for p, holder in enumerate(self._holders) if holder == store]

    def encode(self) -> bytes:
        """The znode's JSON data."""
        body = {"version": self.version, "partitions": self.partitions, "stores": self.stores}
        return json.dumps(body, sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes) -> StoreLayout:
        """The layout a znode holds; CorruptCoordinationData if it is not one."""
        try:
            body: Any = json.loads(data)
            return cls(int(body["version"]), tuple(body["stores"]), int(body["partitions"]))
        except (ValueError, TypeError, KeyError, InvalidInput) as exc:
            raise CorruptCoordinationData(f"{LAYOUT} is unreadable: {exc}") from exc


def read_store_layout(client: KazooClient) -> StoreLayout | None:
    """The cluster's store layout, or None if it has none (no store layer)."""
    with translated("read the store layout"):
        try:
            data, _stat = client.retry(client.get, LAYOUT)
        except NoNodeError:
            return None
    return StoreLayout.decode(data)


def create_store_layout(client: KazooClient, stores: Sequence[str]) -> StoreLayout:
    """Write the first layout (version 1) of ``stores``; the existing one if there is one."""
    layout = StoreLayout(1, tuple(stores))
    with translated("write the store layout"):
        try:
            client.retry(client.create, LAYOUT, layout.encode(), makepath=True)
            return layout
        except NodeExistsError:
            pass
    existing = read_store_layout(client)
    assert existing is not None, "the layout cannot go once written"
    return existing


def register_store(client: KazooClient, store_id: str, address: str, member: str) -> str:
    """Announce that ``store_id`` serves at ``address`` (an ephemeral znode of this session).

    InvalidInput if a live process already serves that store id (two processes given one id
    with two directories): the second must not serve.
    """
    path = f"{STORES}/{check_store_id(store_id)}"
    body = json.dumps({"address": address, "member": member}, sort_keys=True).encode()
    with translated("announce the store"):
        try:
            client.retry(client.create, path, body, ephemeral=True, makepath=True)
        except NodeExistsError:
            raise InvalidInput(
                f"store {store_id!r} is already served by another live process"
            ) from None
    return path


class LayoutWatch:
    """The layout and the live stores' addresses, kept current from ZooKeeper's watches.

    ``on_change`` (kazoo's thread) is called after every change, with nothing: read
    :attr:`layout` and :attr:`addresses`.
    """

    def __init__(self, client: KazooClient, on_change: Callable[[], None] | None = None) -> None:
        self._client = client
        self._on_change = on_change
        self.layout: StoreLayout | None = None
        self.addresses: dict[str, str] = {}  # live store id: its address
        self._stopped = False
        client.ensure_path(STORES)
        self._data = DataWatch(client, LAYOUT, self._layout_changed)
        self._children = ChildrenWatch(client, STORES, self._stores_changed)

    def stop(self) -> None:
        """Stop following changes."""
        self._stopped = True

    def _layout_changed(self, data: bytes | None, _stat: object) -> bool | None:
        if self._stopped:
            return False
        if data is not None:
            try:
                self.layout = StoreLayout.decode(data)
            except CorruptCoordinationData:
                return None  # keep the last readable one
        self._changed()
        return None

    def _stores_changed(self, children: list[str]) -> bool | None:
        if self._stopped:
            return False
        addresses = {}
        for child in children:
            try:
                data, _stat = self._client.get(f"{STORES}/{child}")
                addresses[child] = str(json.loads(data)["address"])
            except (NoNodeError, ValueError, KeyError, TypeError):
                continue  # gone meanwhile, or unreadable: not routable
        self.addresses = addresses
        self._changed()
        return None

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change()
