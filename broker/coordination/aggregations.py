"""Where the aggregation groups are defined: in ZooKeeper, read by every context store.

Layout (under the cluster's chroot)::

    /aggregations/<tenant>~<id>   persistent; JSON:
        {"tenant", "servicePath", "document", "version", "since", "created", "modified",
         "previous": {"servicePath", "document", "version", "since"} | null}

``document`` is the definition as the API took it (broker.store.aggregation checks it);
``since`` the pane boundary from which this version applies, :data:`SETTLE` seconds or more
after it was written, so that every store knows it by then; ``previous`` is the version it
replaced, which keeps applying to the panes before ``since``. A front writes
(:class:`AggregationStore`: create, replace, remove, read, list, with kazoo's asynchronous
calls awaited on its loop); every context store follows them through one
:class:`DefinitionsWatch` (a kazoo TreeCache), told the whole set on each change; a tool
(``silbo backfill``) reads them once (:func:`kept_aggregations`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError
from kazoo.recipe.cache import TreeCache, TreeEvent

from broker.coordination.errors import CorruptCoordinationData, translated
from broker.coordination.http_subscriptions import awaited
from broker.errors import AlreadyExists, NotFound

__all__ = [
    "AGGREGATIONS",
    "NO_AGGREGATION",
    "SETTLE",
    "AggregationStore",
    "DefinitionsWatch",
    "Kept",
    "kept_aggregations",
    "since_for",
]

_log = logging.getLogger(__name__)

AGGREGATIONS: Final = "/aggregations"
NO_AGGREGATION: Final = "The requested aggregation has not been found. Check id"
SETTLE: Final = 1.0  # seconds a definition takes at least to apply (every store reads it)
CALL_TIMEOUT: Final = 10.0


@dataclass(frozen=True, slots=True)
class Kept:
    """One version of a definition as kept."""

    tenant: str
    service_path: str
    document: dict[str, Any]
    version: int
    since: float


@dataclass(frozen=True, slots=True)
class Stored:
    """One aggregation as kept: its current version, the one before, and when it was
    created and last changed."""

    current: Kept
    previous: Kept | None
    created: float
    modified: float

    def to_json(self) -> dict[str, Any]:
        return {
            "tenant": self.current.tenant,
            "servicePath": self.current.service_path,
            "document": self.current.document,
            "version": self.current.version,
            "since": self.current.since,
            "created": self.created,
            "modified": self.modified,
            "previous": None
            if self.previous is None
            else {
                "servicePath": self.previous.service_path,
                "document": self.previous.document,
                "version": self.previous.version,
                "since": self.previous.since,
            },
        }


def since_for(slide: float, now: float | None = None) -> float:
    """The first pane boundary (panes of ``slide`` seconds) at least SETTLE from now."""
    moment = time.time() if now is None else now
    return math.ceil((moment + SETTLE) / slide) * slide


def _node(tenant: str, aggregation_id: str) -> str:
    return f"{AGGREGATIONS}/{tenant}~{aggregation_id}"


def _decode(path: str, data: bytes) -> Stored:
    try:
        body = json.loads(data)
        tenant = str(body["tenant"])
        current = Kept(
            tenant,
            str(body["servicePath"]),
            dict(body["document"]),
            int(body["version"]),
            float(body["since"]),
        )
        before = body.get("previous")
        previous = (
            None
            if before is None
            else Kept(
                tenant,
                str(before["servicePath"]),
                dict(before["document"]),
                int(before["version"]),
                float(before["since"]),
            )
        )
        return Stored(current, previous, float(body["created"]), float(body["modified"]))
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptCoordinationData(f"{path} is no aggregation: {exc!r}") from exc


def _encode(stored: Stored) -> bytes:
    return json.dumps(stored.to_json(), separators=(",", ":")).encode()


class AggregationStore:
    """A front's handle on the definitions in ZooKeeper (see the module doc)."""

    def __init__(self, client: KazooClient, loop: asyncio.AbstractEventLoop) -> None:
        self._client = client
        self._loop = loop

    async def create(self, kept: Kept) -> None:
        """Keep a new definition (AlreadyExists if the tenant has one of its id)."""
        now = time.time()
        stored = Stored(kept, None, now, now)
        with translated("keep the aggregation"):
            await self._call(self._client.ensure_path_async(AGGREGATIONS))
            try:
                await self._call(
                    self._client.create_async(_node(kept.tenant, _id_of(kept)), _encode(stored))
                )
            except NodeExistsError:
                raise AlreadyExists(f"an aggregation {_id_of(kept)!r} exists already") from None

    async def replace(self, kept: Kept) -> Stored:
        """Keep a new version of a definition (NotFound if there is none); its previous
        version is the one it replaces (compare-and-set)."""
        path = _node(kept.tenant, _id_of(kept))
        with translated("keep the changed aggregation"):
            while True:
                try:
                    data, stat = await self._call(self._client.get_async(path))
                except NoNodeError:
                    raise NotFound(NO_AGGREGATION) from None
                old = _decode(path, bytes(data))
                new = Kept(
                    kept.tenant,
                    kept.service_path,
                    kept.document,
                    old.current.version + 1,
                    kept.since,
                )
                stored = Stored(new, old.current, old.created, time.time())
                try:
                    await self._call(self._client.set_async(path, _encode(stored), stat.version))
                    return stored
                except NoNodeError:
                    raise NotFound(NO_AGGREGATION) from None
                except BadVersionError:
                    continue  # changed meanwhile: again, over that change

    async def remove(self, tenant: str, aggregation_id: str) -> None:
        """Forget a definition (NotFound if there is none)."""
        with translated("forget the aggregation"):
            try:
                await self._call(self._client.delete_async(_node(tenant, aggregation_id)))
            except NoNodeError:
                raise NotFound(NO_AGGREGATION) from None

    async def read(self, tenant: str, aggregation_id: str) -> Stored:
        """One definition (NotFound if there is none)."""
        path = _node(tenant, aggregation_id)
        with translated("read the aggregation"):
            try:
                data, _stat = await self._call(self._client.get_async(path))
            except NoNodeError:
                raise NotFound(NO_AGGREGATION) from None
        return _decode(path, bytes(data))

    async def listed(self, tenant: str) -> list[Stored]:
        """The tenant's definitions, oldest first."""
        prefix = f"{tenant}~"
        found = []
        with translated("list the aggregations"):
            try:
                names = await self._call(self._client.get_children_async(AGGREGATIONS))
            except NoNodeError:
                return []
            for name in sorted(n for n in names if n.startswith(prefix)):
                try:
                    data, _stat = await self._call(self._client.get_async(f"{AGGREGATIONS}/{name}"))
                except NoNodeError:
                    continue
                found.append(_decode(f"{AGGREGATIONS}/{name}", bytes(data)))
        found.sort(key=lambda s: (s.created, _id_of(s.current)))
        return found

    async def _call(self, result: Any) -> Any:
        return await awaited(self._loop, result, CALL_TIMEOUT)


Definitions = dict[str, Stored]  # znode name -> what it holds


def kept_aggregations(client: KazooClient) -> tuple[Definitions, dict[str, str]]:
    """Every definition kept, by znode name, and why the ones that are not readable are not
    (left out, as the stores leave them): a synchronous read for tools (``silbo backfill
    --state-dir``)."""
    found: Definitions = {}
    unreadable: dict[str, str] = {}
    with translated("read the aggregations"):
        try:
            names = sorted(client.get_children(AGGREGATIONS))
        except NoNodeError:
            return found, unreadable
        for name in names:
            try:
                data, _stat = client.get(f"{AGGREGATIONS}/{name}")
                found[name] = _decode(f"{AGGREGATIONS}/{name}", bytes(data))
            except NoNodeError:
                continue  # removed meanwhile
            except CorruptCoordinationData as exc:
                unreadable[name] = str(exc)
    return found, unreadable


Changed = Callable[[Definitions], None]  # told on the loop, with every definition


class DefinitionsWatch:
    """Every definition, followed (a TreeCache); ``changed`` is told the whole set, on the
    loop, once all were read at start (never a part of them: a store drops the state of a
    group it is not told of), then after every change."""

    def __init__(
        self, client: KazooClient, loop: asyncio.AbstractEventLoop, changed: Changed
    ) -> None:
        self._loop = loop
        self._changed = changed
        self._known: Definitions = {}
        self._initialized = False
        client.ensure_path(AGGREGATIONS)
        self._cache = TreeCache(client, AGGREGATIONS)
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
        if parent != AGGREGATIONS or not name:
            return
        if kind == TreeEvent.NODE_REMOVED:
            self._known.pop(name, None)
        else:
            try:
                self._known[name] = _decode(path, event.event_data.data or b"")
            except CorruptCoordinationData as exc:
                _log.error("aggregation %s is not used: %s", name, exc)
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


def _id_of(kept: Kept) -> str:
    return str(kept.document.get("id", ""))
