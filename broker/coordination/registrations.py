"""Where the NGSI v2 fronts keep their registrations (context providers): in ZooKeeper, so
that they outlive the connection points and every front forwards the same way.

Layout (under the cluster's chroot)::

    /ngsi/registrations/<id>   persistent; {"tenant", "servicePath", "document", "created"}:
                               written when the registration is created or PATCHed
    /ngsi/forwarding/<id>      persistent; the forwarding counters (timesSent,
                               lastForwarding, lastSuccess, lastFailure): each front adds what
                               it forwarded since its last flush (compare-and-set, so fronts
                               flushing together add up)

Every front keeps the definitions in memory through one :class:`~kazoo.recipe.cache.TreeCache`
(a watch per znode): a forwarded query or update reads that copy, never ZooKeeper. A
request about one registration (GET, PATCH, DELETE) reads ZooKeeper itself, so it sees what
another front wrote a moment ago.

Calls are kazoo's asynchronous ones, awaited on the caller's event loop; kazoo's exceptions
become coordination errors (:func:`broker.coordination.errors.translated`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NoNodeError
from kazoo.recipe.cache import TreeCache, TreeEvent

from broker.coordination.errors import CorruptCoordinationData, ZooKeeperUnavailable, translated
from broker.coordination.http_subscriptions import awaited
from broker.errors import NotFound

__all__ = ["FORWARDING", "NO_REGISTRATION", "REGISTRATIONS", "Kept", "RegistrationStore"]

_log = logging.getLogger(__name__)

REGISTRATIONS = "/ngsi/registrations"
FORWARDING = "/ngsi/forwarding"
CALL_TIMEOUT = 10.0  # seconds one ZooKeeper call may take
START_TIMEOUT = 30.0  # seconds the cache may take to read every registration at start
NO_REGISTRATION = "The requested registration has not been found. Check id"
CAS_TRIES = 20  # compare-and-set attempts to add counters before giving up this time


@dataclass(frozen=True, slots=True)
class Kept:
    """One registration as kept: its tenant, service path, definition and creation time."""

    id: str
    tenant: str
    service_path: str
    document: dict[str, Any]
    created: float


Changed = Callable[[str, "Kept | None"], None]  # told on the loop: a registration (None: gone)


def _json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def _decode(path: str, data: bytes) -> dict[str, Any]:
    try:
        body = json.loads(data)
    except ValueError as exc:
        raise CorruptCoordinationData(f"{path} holds no JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise CorruptCoordinationData(f"{path} holds no JSON object")
    return body


def _kept(registration_id: str, data: bytes) -> Kept:
    path = f"{REGISTRATIONS}/{registration_id}"
    body = _decode(path, data)
    try:
        return Kept(
            registration_id,
            str(body["tenant"]),
            str(body["servicePath"]),
            dict(body["document"]),
            float(body["created"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptCoordinationData(f"{path} is no registration: {exc!r}") from exc


class RegistrationStore:
    """One front's handle on the registrations in ZooKeeper (see the module doc);
    ``changed`` is told of every registration created, changed or removed by any front."""

    def __init__(self, client: KazooClient, loop: asyncio.AbstractEventLoop) -> None:
        self._client = client
        self._loop = loop
        self._cache: TreeCache | None = None
        self._changed: Changed | None = None
        self._ready = asyncio.Event()

    async def start(self, changed: Changed) -> None:
        """Create the folders and fill the cache (``changed`` told of each registration)."""
        self._changed = changed
        with translated("keep the registrations"):
            for path in (REGISTRATIONS, FORWARDING):
                await self._call(self._client.ensure_path_async(path))
        self._cache = TreeCache(self._client, REGISTRATIONS)
        self._cache.listen(self._event)
        self._cache.start()
        try:
            await asyncio.wait_for(self._ready.wait(), START_TIMEOUT)
        except TimeoutError:
            raise ZooKeeperUnavailable(
                f"the registrations were not read within {START_TIMEOUT:.0f} s"
            ) from None

    def close(self) -> None:
        """Stop watching."""
        if self._cache is not None:
            self._cache.close()
            self._cache = None

    def _event(self, event: TreeEvent) -> None:  # kazoo's thread
        kind = event.event_type
        try:
            if kind == TreeEvent.INITIALIZED:
                self._loop.call_soon_threadsafe(self._ready.set)
                return
            if kind not in (TreeEvent.NODE_ADDED, TreeEvent.NODE_UPDATED, TreeEvent.NODE_REMOVED):
                return
            path = event.event_data.path
            parent, _slash, registration_id = path.rpartition("/")
            if parent != REGISTRATIONS or not registration_id:
                return
            kept = None
            if kind != TreeEvent.NODE_REMOVED:
                try:
                    kept = _kept(registration_id, event.event_data.data or b"")
                except CorruptCoordinationData as exc:
                    _log.error("registration %s is not used: %s", registration_id, exc)
            self._loop.call_soon_threadsafe(self._tell, registration_id, kept)
        except RuntimeError:  # the loop closed: the process is ending
            return

    def _tell(self, registration_id: str, kept: Kept | None) -> None:
        if self._changed is not None:
            self._changed(registration_id, kept)

    # -- one registration -------------------------------------------------------------------

    async def create(self, kept: Kept) -> None:
        """Keep a new registration, with zeroed counters (one transaction)."""
        body = _json(
            {
                "tenant": kept.tenant,
                "servicePath": kept.service_path,
                "document": kept.document,
                "created": kept.created,
            }
        )
        with translated("keep the registration"):
            transaction = self._client.transaction()
            transaction.create(f"{REGISTRATIONS}/{kept.id}", body)
            transaction.create(f"{FORWARDING}/{kept.id}", _json({}))
            results = await self._call(transaction.commit_async())
            failed = [r for r in results if isinstance(r, Exception)]
            if failed:
                raise failed[0]

    async def replace(self, kept: Kept) -> None:
        """Keep a PATCHed definition (NotFound if it was deleted meanwhile)."""
        body = _json(
            {
                "tenant": kept.tenant,
                "servicePath": kept.service_path,
                "document": kept.document,
                "created": kept.created,
            }
        )
        with translated("keep the changed registration"):
            try:
                await self._call(self._client.set_async(f"{REGISTRATIONS}/{kept.id}", body))
            except NoNodeError:
                raise NotFound(NO_REGISTRATION) from None

    async def remove(self, registration_id: str) -> None:
        """Forget a registration and its counters."""
        with translated("forget the registration"):
            for folder in (REGISTRATIONS, FORWARDING):
                with contextlib.suppress(NoNodeError):
                    await self._call(self._client.delete_async(f"{folder}/{registration_id}"))

    async def read(self, registration_id: str) -> Kept | None:
        """A registration as kept now (None if there is none)."""
        with translated("read the registration"):
            data = await self._data(f"{REGISTRATIONS}/{registration_id}")
        return None if data is None else _kept(registration_id, data)

    async def counters(self, registration_id: str) -> dict[str, Any]:
        """A registration's forwarding counters as flushed so far ({} if none)."""
        path = f"{FORWARDING}/{registration_id}"
        with translated("read the forwarding counters"):
            data = await self._data(path)
        return {} if not data else _decode(path, data)

    async def add_counters(self, deltas: Iterable[tuple[str, dict[str, Any]]]) -> None:
        """Add what this front forwarded to each registration's counters: ``timesSent`` is
        added, the times keep the latest (compare-and-set, retried when another front wrote
        in between)."""
        with translated("save the forwarding counters"):
            await asyncio.gather(*(self._add(i, delta) for i, delta in deltas))

    async def _add(self, registration_id: str, delta: dict[str, Any]) -> None:
        path = f"{FORWARDING}/{registration_id}"
        for _ in range(CAS_TRIES):
            try:
                data, stat = await self._call(self._client.get_async(path))
            except NoNodeError:
                return  # deleted meanwhile
            stored = _decode(path, bytes(data)) if data else {}
            merged = dict(stored)
            merged["timesSent"] = int(stored.get("timesSent", 0)) + int(delta.get("timesSent", 0))
            for key in ("lastForwarding", "lastSuccess", "lastFailure"):
                if key in delta:
                    merged[key] = max(float(stored.get(key, 0.0)), float(delta[key]))
            try:
                await self._call(self._client.set_async(path, _json(merged), stat.version))
                return
            except BadVersionError:
                continue
            except NoNodeError:
                return
        _log.warning("the forwarding counters of %s were not saved this time", registration_id)

    # -- plumbing ---------------------------------------------------------------------------

    async def _data(self, path: str) -> bytes | None:
        try:
            data, _stat = await self._call(self._client.get_async(path))
        except NoNodeError:
            return None
        return bytes(data)

    async def _call(self, result: Any) -> Any:
        """Await one of kazoo's asynchronous results on this loop."""
        return await awaited(self._loop, result, CALL_TIMEOUT)
