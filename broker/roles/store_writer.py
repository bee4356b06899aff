"""What a context store writes as context itself (the aggregation groups' derived entities,
the alert rules' alert entities): upserts through a connection point, as a gRPC publisher's
with ``store`` set (broker.roles.stored_publish), so that they are stored, then published
with their change, read, notified and aggregated like any other entity.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Final

from kazoo.client import KazooClient

from broker.client import Client
from broker.coordination.membership import members
from broker.errors import SilboError
from broker.wire import client_pb2 as pb

__all__ = ["StoreWriter"]

_CONNECTION_POINT: Final = "connection-point"


class StoreWriter:
    """One store process's client of the connection points, under its own publisher name
    (its sequences its own); connected on first use, again after a failure."""

    def __init__(self, zk: KazooClient, publisher: str, timeout: float) -> None:
        self._zk = zk
        self._publisher = publisher
        self._timeout = timeout
        self._client: Client | None = None

    async def client(self) -> Client:
        """The client (SilboError if no connection point is serving)."""
        if self._client is None:
            found = await asyncio.to_thread(members, self._zk, _CONNECTION_POINT)
            endpoints = [m.endpoint for m in found]
            if not endpoints:
                raise SilboError("no connection point is serving")
            self._client = Client(
                endpoints, publisher=self._publisher, timeout=self._timeout, store=True
            )
        return self._client

    async def write(self, entities: Sequence[pb.Entity]) -> None:
        """Upsert ``entities`` in order, acknowledged (SilboError if not: the client is
        dropped, the next write connects again)."""
        client = await self.client()
        try:
            await asyncio.to_thread(client.publish_many, list(entities))
        except SilboError:
            await self.close()
            raise

    async def close(self) -> None:
        """Close the client (a later write connects again)."""
        client, self._client = self._client, None
        if client is not None:
            await asyncio.to_thread(client.close)
