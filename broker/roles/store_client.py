"""A front's way to the context store layer: writes routed by partition, queries to all.

:class:`StoreClient` (a :class:`~broker.store.client.EntityStore`) routes each write to the
store holding its entity's partition (broker.store.layout), those of one store in one call,
and asks the stores holding a query's partitions for their parts. A partition whose holder
is not serving (dead, restarting, not yet up) is waited for, up to :data:`STORE_WAIT`
seconds, then the request is refused with :class:`~broker.errors.Unavailable` (HTTP 503
with Retry-After, docs/failures.md): a write is never answered before its store has made
it durable, and never silently dropped.

Each write carries an id (broker.store.entities.new_write_id): sent again after a failure
whose outcome is unknown (the call failed after it left), it is applied once and answered
with its first outcome.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Final

import grpc
from kazoo.client import KazooClient

from broker.errors import SilboError, Unavailable
from broker.runtime.link import CHANNEL_OPTIONS
from broker.runtime.token import call_metadata
from broker.store.entities import new_write_id, partition_of
from broker.store.layout import LayoutWatch, StoreLayout
from broker.store.semantics import Applied
from broker.store.wire import Intent, decode_results, encode_writes
from broker.wire import internal_pb2 as wire
from broker.wire import internal_pb2_grpc as wire_grpc

__all__ = ["STORE_WAIT", "StoreClient"]

STORE_WAIT: Final = 5.0  # seconds a request waits for its partition's store to serve
CALL_TIMEOUT: Final = 10.0  # seconds one call to a store may take
_RETRY_PAUSE: Final = 0.1

_log = logging.getLogger(__name__)


class StoreClient:
    """The context store layer, as a front sees it (see the module doc)."""

    def __init__(self, zk: KazooClient, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._changed = asyncio.Event()
        self._watch = LayoutWatch(zk, self._on_change)
        self._channels: dict[str, tuple[str, grpc.aio.Channel]] = {}  # store: (address, ch)
        self._closing: set[asyncio.Future[None]] = set()

    @property
    def layout(self) -> StoreLayout | None:
        """The layout last read (None: the cluster has no store layer)."""
        return self._watch.layout

    async def close(self) -> None:
        """Stop following the layout and close the channels."""
        self._watch.stop()
        for _address, channel in self._channels.values():
            await channel.close()
        self._channels.clear()

    async def apply(self, intents: Sequence[Intent]) -> list[Applied]:
        """Apply the writes, each at its partition's store (those of one store in one call,
        the stores in parallel); Unavailable if a store did not serve within STORE_WAIT."""
        by_store: dict[str, list[int]] = {}
        layout = self._layout()
        intents = [i if i.write_id else replace(i, write_id=new_write_id()) for i in intents]
        for index, intent in enumerate(intents):
            holder = layout.holder(partition_of(intent.tenant, intent.entity_id))
            by_store.setdefault(holder, []).append(index)
        answers = await asyncio.gather(
            *(
                self._call(store, "Apply", encode_writes([intents[i] for i in indexes]))
                for store, indexes in by_store.items()
            )
        )
        results: list[Applied | None] = [None] * len(intents)
        for indexes, answer in zip(by_store.values(), answers, strict=True):
            for index, applied in zip(indexes, decode_results(answer), strict=True):
                results[index] = applied
        return [r for r in results if r is not None]

    async def parts(self, body: bytes, partitions: Iterable[int] | None = None) -> list[bytes]:
        """The answers to a query body of the stores holding ``partitions`` (None: all)."""
        layout = self._layout()
        stores = (
            layout.stores
            if partitions is None
            else tuple(dict.fromkeys(layout.holder(p) for p in sorted(set(partitions))))
        )
        return list(await asyncio.gather(*(self._call(s, "Query", body) for s in stores)))

    # -- helpers ------------------------------------------------------------------------------

    def _layout(self) -> StoreLayout:
        layout = self._watch.layout
        if layout is None:
            raise Unavailable("the cluster has no context store layout")
        return layout

    async def _call(self, store: str, method: str, body: bytes) -> bytes:
        """One call to ``store``, sent again while it is not serving, up to STORE_WAIT."""
        deadline = time.monotonic() + STORE_WAIT
        request = wire.StoreRequest(body=body)
        while True:
            channel = self._channel(store)
            if channel is not None:
                stub = wire_grpc.ContextStoreStub(channel)  # type: ignore[no-untyped-call]
                try:
                    answer: wire.StoreAnswer = await getattr(stub, method)(
                        request, timeout=CALL_TIMEOUT, metadata=call_metadata()
                    )
                    return answer.body
                except grpc.aio.AioRpcError as exc:
                    code = exc.code()
                    if code is grpc.StatusCode.INVALID_ARGUMENT:
                        raise SilboError(
                            f"store {store} refused the request: {exc.details()}"
                        ) from exc
                    if code not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                        raise Unavailable(f"store {store} failed: {exc.details()}") from exc
                    _log.info("store %s did not answer (%s): trying again", store, code.name)
            left = deadline - time.monotonic()
            if left <= 0:
                raise Unavailable(
                    f"the context store holding this entity ({store}) is not serving; try again"
                )
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), min(left, _RETRY_PAUSE * 5))
            await asyncio.sleep(_RETRY_PAUSE)

    def _channel(self, store: str) -> grpc.aio.Channel | None:
        address = self._watch.addresses.get(store)
        if address is None:
            return None
        kept = self._channels.get(store)
        if kept is not None and kept[0] == address:
            return kept[1]
        if kept is not None:  # the store moved: the old channel's calls have failed
            self._closing.add(asyncio.ensure_future(kept[1].close()))
            self._closing = {f for f in self._closing if not f.done()}
        channel = grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
        self._channels[store] = (address, channel)
        return channel

    def _on_change(self) -> None:  # kazoo's thread
        self._loop.call_soon_threadsafe(self._changed.set)
