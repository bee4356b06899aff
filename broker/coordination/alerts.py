"""Where the alert rules are defined: in ZooKeeper, read by every context store.

Layout (under the cluster's chroot)::

    /alerts/<tenant>~<id>   persistent; JSON:
        {"tenant", "servicePath", "document", "version", "created", "modified"}

``document`` is the rule as the API took it (broker.store.alerting checks it); ``version``
counts its changes from 1. A front writes (:class:`AlertStore`: create, replace, remove,
read, list); every context store follows them through one :class:`RulesWatch`, told the
whole set on each change (the mechanics are broker.coordination.documents', shared with the
aggregation groups), and evaluates a changed rule from the next write it applies (there is no
window to settle, unlike an aggregation group's: broker.coordination.aggregations).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from kazoo.client import KazooClient

from broker.coordination.documents import Documents, DocumentsWatch, Kind
from broker.coordination.errors import CorruptCoordinationData

__all__ = ["ALERTS", "NO_ALERT", "AlertStore", "KeptRule", "RulesWatch"]

ALERTS: Final = "/alerts"
NO_ALERT: Final = "The requested alert rule has not been found. Check id"


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


KIND: Final[Kind[KeptRule]] = Kind(
    ALERTS, "alert rule", NO_ALERT, _decode, _encode, lambda kept: (kept.created, kept.id)
)


class AlertStore:
    """A front's handle on the rules in ZooKeeper (see the module doc)."""

    def __init__(self, client: KazooClient, loop: asyncio.AbstractEventLoop) -> None:
        self._documents = Documents(KIND, client, loop)

    async def create(self, tenant: str, service_path: str, document: dict[str, Any]) -> None:
        """Keep a new rule (AlreadyExists if the tenant has one of its id)."""
        now = time.time()
        kept = KeptRule(tenant, service_path, document, 1, now, now)
        await self._documents.create(tenant, kept.id, kept)

    async def replace(self, tenant: str, service_path: str, document: dict[str, Any]) -> KeptRule:
        """Keep a new version of a rule (NotFound if there is none), compare-and-set."""

        def changed(old: KeptRule) -> KeptRule:
            return KeptRule(
                tenant, service_path, document, old.version + 1, old.created, time.time()
            )

        return await self._documents.change(tenant, str(document.get("id", "")), changed)

    async def remove(self, tenant: str, rule_id: str) -> None:
        """Forget a rule (NotFound if there is none)."""
        await self._documents.remove(tenant, rule_id)

    async def read(self, tenant: str, rule_id: str) -> KeptRule:
        """One rule (NotFound if there is none)."""
        return await self._documents.read(tenant, rule_id)

    async def listed(self, tenant: str) -> list[KeptRule]:
        """The tenant's rules, oldest first."""
        return await self._documents.listed(tenant)


Rules = dict[str, KeptRule]  # znode name -> what it holds


class RulesWatch(DocumentsWatch[KeptRule]):
    """Every rule, followed (broker.coordination.documents.DocumentsWatch): a store is told
    the whole set, once all were read at start, then after every change."""

    def __init__(
        self,
        client: KazooClient,
        loop: asyncio.AbstractEventLoop,
        changed: Callable[[Rules], None],
    ) -> None:
        super().__init__(KIND, client, loop, changed)
