"""Where the aggregation groups are defined: in ZooKeeper, read by every context store.

Layout (under the cluster's chroot)::

    /aggregations/<tenant>~<id>   persistent; JSON:
        {"tenant", "servicePath", "document", "version", "since", "created", "modified",
         "previous": {"servicePath", "document", "version", "since"} | null}

``document`` is the definition as the API took it (broker.store.aggregation checks it);
``since`` the pane boundary from which this version applies, :data:`SETTLE` seconds or more
after it was written, so that every store knows it by then; ``previous`` is the version it
replaced, which keeps applying to the panes before ``since``. A front writes
(:class:`AggregationStore`: create, replace, remove, read, list); every context store
follows them through one :class:`DefinitionsWatch`, told the whole set on each change; a
tool (``silbo backfill``) reads them once (:func:`kept_aggregations`): the mechanics are
broker.coordination.documents', shared with the alert rules.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from kazoo.client import KazooClient

from broker.coordination.documents import Documents, DocumentsWatch, Kind, kept_documents
from broker.coordination.errors import CorruptCoordinationData

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

AGGREGATIONS: Final = "/aggregations"
NO_AGGREGATION: Final = "The requested aggregation has not been found. Check id"
SETTLE: Final = 1.0  # seconds a definition takes at least to apply (every store reads it)


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


KIND: Final[Kind[Stored]] = Kind(
    AGGREGATIONS,
    "aggregation",
    NO_AGGREGATION,
    _decode,
    _encode,
    lambda stored: (stored.created, _id_of(stored.current)),
)


class AggregationStore:
    """A front's handle on the definitions in ZooKeeper (see the module doc)."""

    def __init__(self, client: KazooClient, loop: asyncio.AbstractEventLoop) -> None:
        self._documents = Documents(KIND, client, loop)

    async def create(self, kept: Kept) -> None:
        """Keep a new definition (AlreadyExists if the tenant has one of its id)."""
        now = time.time()
        await self._documents.create(kept.tenant, _id_of(kept), Stored(kept, None, now, now))

    async def replace(self, kept: Kept) -> Stored:
        """Keep a new version of a definition (NotFound if there is none); its previous
        version is the one it replaces (compare-and-set)."""

        def changed(old: Stored) -> Stored:
            version = old.current.version + 1
            new = Kept(kept.tenant, kept.service_path, kept.document, version, kept.since)
            return Stored(new, old.current, old.created, time.time())

        return await self._documents.change(kept.tenant, _id_of(kept), changed)

    async def remove(self, tenant: str, aggregation_id: str) -> None:
        """Forget a definition (NotFound if there is none)."""
        await self._documents.remove(tenant, aggregation_id)

    async def read(self, tenant: str, aggregation_id: str) -> Stored:
        """One definition (NotFound if there is none)."""
        return await self._documents.read(tenant, aggregation_id)

    async def listed(self, tenant: str) -> list[Stored]:
        """The tenant's definitions, oldest first."""
        return await self._documents.listed(tenant)


Definitions = dict[str, Stored]  # znode name -> what it holds


def kept_aggregations(client: KazooClient) -> tuple[Definitions, dict[str, str]]:
    """Every definition kept, by znode name, and why the ones that are not readable are not
    (left out, as the stores leave them): a synchronous read for tools (``silbo backfill
    --state-dir``)."""
    return kept_documents(KIND, client)


class DefinitionsWatch(DocumentsWatch[Stored]):
    """Every definition, followed (broker.coordination.documents.DocumentsWatch): a store
    is told the whole set, once all were read at start, then after every change."""

    def __init__(
        self,
        client: KazooClient,
        loop: asyncio.AbstractEventLoop,
        changed: Callable[[Definitions], None],
    ) -> None:
        super().__init__(KIND, client, loop, changed)


def _id_of(kept: Kept) -> str:
    return str(kept.document.get("id", ""))
