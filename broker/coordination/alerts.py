"""Where the alert rules are defined: in ZooKeeper, read by every context store.

Layout (under the cluster's chroot)::

    /alerts/<tenant>~<id>   persistent; JSON:
        {"tenant", "servicePath", "document", "version", "created", "modified"}

``document`` is the rule as the API took it (broker.store.alerting checks it); ``version``
counts its changes from 1. A front writes (:class:`AlertStore`: create, replace, remove,
read, list, with kazoo's asynchronous calls awaited on its loop); every context store
follows them through one :class:`RulesWatch` (a kazoo TreeCache), told the whole set on
each change, and evaluates a changed rule from the next write it applies (there is no
window to settle, unlike an aggregation group's: broker.coordination.aggregations).
"""

from __future__ import annotations

import asyncio
import json
import logging
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

__all__ = ["ALERTS", "NO_ALERT", "AlertStore", "KeptRule", "RulesWatch"]

_log = logging.getLogger(__name__)

ALERTS: Final = "/alerts"
NO_ALERT: Final = "The requested alert rule has not been found. Check id"
CALL_TIMEOUT: Final = 10.0


@dataclass(frozen=True, slots=True)
class KeptRule:
    """One rule as kept: its tenant, service path, document and version, and when it was
    created and last changed (epoch seconds)."""

    tenant: str
    service_path: str
    document: dict[str, Any]
    version: int = 1
    created: float = 0.0
    modified: float = 0.0

    @property
    def id(self) -> str:
        return str(self.document.get("id", ""))

    def to_json(self) -> dict[str, Any]:
        return {
            "tenant": self.tenant,
            "servicePath": self.service_path,
            "document": self.document,
            "version": self.version,
            "created": self.created,
            "modified": self.modified,
        }


def _node(tenant: str, rule_id: str) -> str:
    return f"{ALERTS}/{tenant}~{rule_id}"


def _decode(path: str, data: bytes) -> KeptRule:
    try:
        body = json.loads(data)
        return KeptRule(
            str(body["tenant"]),
            str(body["servicePath"]),
            dict(body["document"]),
            int(body["version"]),
            float(body["created"]),
            float(body["modified"]),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptCoordinationData(f"{path} is no alert rule: {exc!r}") from exc


def _encode(kept: KeptRule) -> bytes:
    return json.dumps(kept.to_json(), separators=(",", ":")).encode()


class AlertStore:
    """A front's handle on the rules in ZooKeeper (see the module doc)."""

    def __init__(self, client: KazooClient, loop: asyncio.AbstractEventLoop) -> None:
        self._client = client
        self._loop = loop

    async def create(self, tenant: str, service_path: str, document: dict[str, Any]) -> None:
        """Keep a new rule (AlreadyExists if the tenant has one of its id)."""
        now = time.time()
        kept = KeptRule(tenant, service_path, document, 1, now, now)
        with translated("keep the alert rule"):
            await self._call(self._client.ensure_path_async(ALERTS))
            try:
                await self._call(self._client.create_async(_node(tenant, kept.id), _encode(kept)))
            except NodeExistsError:
                raise AlreadyExists(f"an alert rule {kept.id!r} exists already") from None

    async def replace(self, tenant: str, service_path: str, document: dict[str, Any]) -> KeptRule:
        """Keep a new version of a rule (NotFound if there is none), compare-and-set."""
        path = _node(tenant, str(document.get("id", "")))
        with translated("keep the changed alert rule"):
            while True:
                try:
                    data, stat = await self._call(self._client.get_async(path))
                except NoNodeError:
                    raise NotFound(NO_ALERT) from None
                old = _decode(path, bytes(data))
                new = KeptRule(
                    tenant, service_path, document, old.version + 1, old.created, time.time()
                )
                try:
                    await self._call(self._client.set_async(path, _encode(new), stat.version))
                    return new
                except NoNodeError:
                    raise NotFound(NO_ALERT) from None
                except BadVersionError:
                    continue  # changed meanwhile: again, over that change

    async def remove(self, tenant: str, rule_id: str) -> None:
        """Forget a rule (NotFound if there is none)."""
        with translated("forget the alert rule"):
            try:
                await self._call(self._client.delete_async(_node(tenant, rule_id)))
            except NoNodeError:
                raise NotFound(NO_ALERT) from None

    async def read(self, tenant: str, rule_id: str) -> KeptRule:
        """One rule (NotFound if there is none)."""
        path = _node(tenant, rule_id)
        with translated("read the alert rule"):
            try:
                data, _stat = await self._call(self._client.get_async(path))
            except NoNodeError:
                raise NotFound(NO_ALERT) from None
        return _decode(path, bytes(data))

    async def listed(self, tenant: str) -> list[KeptRule]:
        """The tenant's rules, oldest first."""
        prefix = f"{tenant}~"
        found = []
        with translated("list the alert rules"):
            try:
                names = await self._call(self._client.get_children_async(ALERTS))
            except NoNodeError:
                return []
            for name in sorted(n for n in names if n.startswith(prefix)):
                try:
                    data, _stat = await self._call(self._client.get_async(f"{ALERTS}/{name}"))
                except NoNodeError:
                    continue
                found.append(_decode(f"{ALERTS}/{name}", bytes(data)))
        found.sort(key=lambda kept: (kept.created, kept.id))
        return found

    async def _call(self, result: Any) -> Any:
        return await awaited(self._loop, result, CALL_TIMEOUT)


Rules = dict[str, KeptRule]  # znode name -> what it holds
Changed = Callable[[Rules], None]  # told on the loop, with every rule


class RulesWatch:
    """Every rule, followed (a TreeCache); ``changed`` is told the whole set, on the loop,
    once all were read at start, then after every change."""

    def __init__(
        self, client: KazooClient, loop: asyncio.AbstractEventLoop, changed: Changed
    ) -> None:
        self._loop = loop
        self._changed = changed
        self._known: Rules = {}
        self._initialized = False
        client.ensure_path(ALERTS)
        self._cache = TreeCache(client, ALERTS)
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
        if parent != ALERTS or not name:
            return
        if kind == TreeEvent.NODE_REMOVED:
            self._known.pop(name, None)
        else:
            try:
                self._known[name] = _decode(path, event.event_data.data or b"")
            except CorruptCoordinationData as exc:
                _log.error("alert rule %s is not used: %s", name, exc)
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
