"""Tenant-scoped documents kept in ZooKeeper: one znode each, written by the fronts, followed
by every context store (the aggregation groups and the alert rules: one kind each).

Layout (under the cluster's chroot): ``<root>/<tenant>~<id>``, persistent, the record's JSON
(its kind says how it reads and writes: :class:`Kind`). A front writes through a
:class:`Documents` (create, change by compare-and-set, remove, read, list: kazoo's
asynchronous calls awaited on its loop); a store follows every record of a kind through one
:class:`DocumentsWatch` (a kazoo TreeCache), told the whole set on each change; a tool reads
them once (:func:`kept_documents`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Generic, TypeVar

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError
from kazoo.recipe.cache import TreeCache, TreeEvent

from broker.coordination.errors import CorruptCoordinationData, translated
from broker.coordination.http_subscriptions import awaited
from broker.errors import AlreadyExists, NotFound

__all__ = ["CALL_TIMEOUT", "Documents", "DocumentsWatch", "Kind", "kept_documents"]

_log = logging.getLogger(__name__)

CALL_TIMEOUT: Final = 10.0

R = TypeVar("R")


@dataclass(frozen=True)
class Kind(Generic[R]):
    """One kind of record: where it lives, what it is called, how it reads and writes.

    ``decode(path, data)`` raises CorruptCoordinationData for data that is not one;
    ``order`` sorts a tenant's list (oldest first)."""

    root: str
    noun: str  # "aggregation", "alert rule": in messages
    missing: str  # NotFound's message
    decode: Callable[[str, bytes], R]
    encode: Callable[[R], bytes]
    order: Callable[[R], Any]

    def node(self, tenant: str, record_id: str) -> str:
        """The znode of a tenant's record."""
        return f"{self.root}/{tenant}~{record_id}"


class Documents(Generic[R]):
    """A front's handle on the records of one kind (see the module doc)."""

    def __init__(self, kind: Kind[R], client: KazooClient, loop: asyncio.AbstractEventLoop) -> None:
        self.kind = kind
        self._client = client
        self._loop = loop

    async def create(self, tenant: str, record_id: str, record: R) -> None:
        """Keep a new record (AlreadyExists if the tenant has one of its id)."""
        kind = self.kind
        with translated(f"keep the {kind.noun}"):
            await self._call(self._client.ensure_path_async(kind.root))
            try:
                node = kind.node(tenant, record_id)
                await self._call(self._client.create_async(node, kind.encode(record)))
            except NodeExistsError:
                raise AlreadyExists(f"{kind.noun} {record_id!r} exists already") from None

    async def change(self, tenant: str, record_id: str, changed: Callable[[R], R]) -> R:
        """Keep ``changed(old)`` in place of the record (NotFound if there is none), by
        compare-and-set: a change made meanwhile is changed again."""
        kind = self.kind
        path = kind.node(tenant, record_id)
        with translated(f"keep the changed {kind.noun}"):
            while True:
                try:
                    data, stat = await self._call(self._client.get_async(path))
                except NoNodeError:
                    raise NotFound(kind.missing) from None
                new = changed(kind.decode(path, bytes(data)))
                try:
                    await self._call(self._client.set_async(path, kind.encode(new), stat.version))
                    return new
                except NoNodeError:
                    raise NotFound(kind.missing) from None
                except BadVersionError:
                    continue  # changed meanwhile: again, over that change

    async def remove(self, tenant: str, record_id: str) -> None:
        """Forget a record (NotFound if there is none)."""
        kind = self.kind
        with translated(f"forget the {kind.noun}"):
            try:
                await self._call(self._client.delete_async(kind.node(tenant, record_id)))
            except NoNodeError:
                raise NotFound(kind.missing) from None

    async def read(self, tenant: str, record_id: str) -> R:
        """One record (NotFound if there is none)."""
        kind = self.kind
        path = kind.node(tenant, record_id)
        with translated(f"read the {kind.noun}"):
            try:
                data, _stat = await self._call(self._client.get_async(path))
            except NoNodeError:
                raise NotFound(kind.missing) from None
        return kind.decode(path, bytes(data))

    async def listed(self, tenant: str) -> list[R]:
        """The tenant's records, in the kind's order."""
        kind = self.kind
        prefix = f"{tenant}~"
        found = []
        with translated(f"list the {kind.noun}s"):
            try:
                names = await self._call(self._client.get_children_async(kind.root))
            except NoNodeError:
                return []
            for name in sorted(n for n in names if n.startswith(prefix)):
                path = f"{kind.root}/{name}"
                try:
                    data, _stat = await self._call(self._client.get_async(path))
                except NoNodeError:
                    continue
                found.append(kind.decode(path, bytes(data)))
        found.sort(key=kind.order)
        return found

    async def _call(self, result: Any) -> Any:
        return await awaited(self._loop, result, CALL_TIMEOUT)


def kept_documents(kind: Kind[R], client: KazooClient) -> tuple[dict[str, R], dict[str, str]]:
    """Every record of ``kind``, by znode name, and why the ones that are not readable are
    not (left out, as the stores leave them): a synchronous read for tools."""
    found: dict[str, R] = {}
    unreadable: dict[str, str] = {}
    with translated(f"read the {kind.noun}s"):
        try:
            names = sorted(client.get_children(kind.root))
        except NoNodeError:
            return found, unreadable
        for name in names:
            try:
                data, _stat = client.get(f"{kind.root}/{name}")
                found[name] = kind.decode(f"{kind.root}/{name}", bytes(data))
            except NoNodeError:
                continue  # removed meanwhile
            except CorruptCoordinationData as exc:
                unreadable[name] = str(exc)
    return found, unreadable


class DocumentsWatch(Generic[R]):
    """Every record of a kind, followed (a TreeCache); ``changed`` is told the whole set (by
    znode name), on the loop, once all were read at start (never a part of them: a store
    drops the state of a record it is not told of), then after every change. A record that
    is not readable is left out (logged)."""

    def __init__(
        self,
        kind: Kind[R],
        client: KazooClient,
        loop: asyncio.AbstractEventLoop,
        changed: Callable[[dict[str, R]], None],
    ) -> None:
        self._kind = kind
        self._loop = loop
        self._changed = changed
        self._known: dict[str, R] = {}
        self._initialized = False
        client.ensure_path(kind.root)
        self._cache = TreeCache(client, kind.root)
        self._cache.listen(self._event)
        self._cache.start()

    def stop(self) -> None:
        """Stop watching."""
        self._cache.close()

    def _event(self, event: TreeEvent) -> None:  # kazoo's thread
        kind = event.event_type
        if kind == TreeEvent.INITIALIZED:
            self._initialized = True
            self._tell()
            return
        if kind not in (TreeEvent.NODE_ADDED, TreeEvent.NODE_UPDATED, TreeEvent.NODE_REMOVED):
            return
        path = event.event_data.path
        parent, _slash, name = path.rpartition("/")
        if parent != self._kind.root or not name:
            return
        if kind == TreeEvent.NODE_REMOVED:
            self._known.pop(name, None)
        else:
            try:
                self._known[name] = self._kind.decode(path, event.event_data.data or b"")
            except CorruptCoordinationData as exc:
                _log.error("%s %s is not used: %s", self._kind.noun, name, exc)
                self._known.pop(name, None)
        self._tell()

    def _tell(self) -> None:
        if not self._initialized:
            return
        known = dict(self._known)
        try:
            self._loop.call_soon_threadsafe(self._changed, known)
        except RuntimeError:  # the loop closed: the process is ending
            return
