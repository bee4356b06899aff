"""A front's way to the context store layer: writes and reads routed to partitions' primaries.

:class:`StoreClient` (a :class:`~broker.store.client.EntityStore`) sends each write to the
primary of its entity's partition (broker.store.layout: the first serving, in-sync holder
in the front's view), those of one store in one call, and asks each primary for its
partitions' part of a query. A store that does not take a call (dead, restarting, no longer
the primary: the views of the front and the store differ for a moment) is asked again, the
primary of the time, and a partition without one is waited for, up to :data:`STORE_WAIT`
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
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any, Final, TypeVar

import grpc
from kazoo.client import KazooClient

from broker.errors import SilboError, Unavailable
from broker.runtime.link import CHANNEL_OPTIONS
from broker.runtime.token import call_metadata
from broker.store.entities import new_write_id, partition_of
from broker.store.layout import LayoutWatch, StoreLayout
from broker.store.reading import query_body
from broker.store.semantics import Applied
from broker.store.wire import Intent, decode_results, encode_writes
from broker.wire import internal_pb2 as wire
from broker.wire import internal_pb2_grpc as wire_grpc

__all__ = ["STORE_WAIT", "StoreClient"]

_T = TypeVar("_T")


class _NotServed(Exception):
    """A store did not take a call (dead, restarting, not the primary): send it again.
    ``unknown``: the call may have been applied (it timed out or was cut after it left)."""

    def __init__(self, message: str, *, unknown: bool = False) -> None:
        super().__init__(message)
        self.unknown = unknown


STORE_WAIT: Final = 5.0  # seconds a request waits for its partition's store to serve
CALL_TIMEOUT: Final = 10.0  # seconds one call to a store may take
MAX_CALL_WRITES: Final = 256  # writes per Apply call (a store applies a call without pause)
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
        """Apply the writes, each at its partition's primary (those of one store in one call,
        the stores in parallel); Unavailable if a partition had no primary that took its
        writes within STORE_WAIT."""
        intents = [i if i.write_id else replace(i, write_id=new_write_id()) for i in intents]
        partitions = [partition_of(i.tenant, i.entity_id) for i in intents]

        async def call(store: str, indexes: list[int]) -> list[Applied]:
            results: list[Applied] = []
            for start in range(0, len(indexes), MAX_CALL_WRITES):  # in order, one at a time
                chunk = indexes[start : start + MAX_CALL_WRITES]
                body = encode_writes([intents[i] for i in chunk])
                results.extend(decode_results(await self._call(store, "Apply", body)))
            return results

        found = await self._route(list(range(len(intents))), partitions, call)
        return [found[i] for i in range(len(intents))]

    async def parts(self, kind: str, query: Any, partitions: Iterable[int] | None) -> list[bytes]:
        """The answers to a query of the primaries of ``partitions`` (None: all), each
        asked for the partitions it is the primary of."""
        layout = self._layout()
        wanted = sorted(set(range(layout.partitions) if partitions is None else partitions))

        async def call(store: str, indexes: list[int]) -> list[bytes]:
            asked = [wanted[i] for i in indexes]
            return [await self._call(store, "Query", query_body(kind, query, asked))]

        found = await self._route(list(range(len(wanted))), wanted, call, whole=True)
        return list(dict.fromkeys(found.values()))

    async def history(self, partition: int, body: bytes) -> bytes:
        """The answer of ``partition``'s primary to a history query (``History``)."""

        async def call(store: str, indexes: list[int]) -> list[bytes]:
            del indexes  # the one query
            return [await self._call(store, "History", body)]

        found = await self._route([0], [partition], call, whole=True)
        return found[0]

    # -- helpers ------------------------------------------------------------------------------

    def _layout(self) -> StoreLayout:
        layout = self._watch.layout
        if layout is None:
            raise Unavailable("the cluster has no context store layout")
        return layout

    async def _route(
        self,
        items: list[int],
        partitions: Sequence[int],
        call: Callable[[str, list[int]], Awaitable[list[_T]]],
        *,
        whole: bool = False,
    ) -> dict[int, _T]:
        """Send each item to its partition's primary (``call(store, items)``: one result
        per item, or one for them all if ``whole``); items whose store did not take them
        are sent again, to the primary of the time, until STORE_WAIT is over."""
        deadline = time.monotonic() + STORE_WAIT
        found: dict[int, _T] = {}
        left = list(items)
        why = ""
        unknown = False  # the last round left an outcome unknown
        last_chance = True  # past the deadline, one more round to learn such outcomes
        while True:
            view = self._watch.view
            by_store: dict[str, list[int]] = {}
            waiting = []
            for item in left:
                primary = view.primary(partitions[item])
                if primary is None or primary not in view.addresses:
                    waiting.append(item)
                    why = f"partition {partitions[item]} has no serving store"
                else:
                    by_store.setdefault(primary, []).append(item)
            answers = await asyncio.gather(
                *(call(store, group) for store, group in by_store.items()),
                return_exceptions=True,
            )
            left = waiting
            unknown = False
            for (store, group), answer in zip(by_store.items(), answers, strict=True):
                if isinstance(answer, _NotServed):
                    left.extend(group)
                    why = f"store {store}: {answer}"
                    unknown = unknown or answer.unknown
                elif isinstance(answer, BaseException):
                    raise answer
                elif whole:
                    found.update(dict.fromkeys(group, answer[0]))
                else:
                    found.update(zip(group, answer, strict=True))
            if not left:
                return found
            if time.monotonic() >= deadline:
                if not (unknown and last_chance):
                    raise Unavailable(f"the context store is not serving ({why}); try again")
                last_chance = False  # sent again with its write id: its first outcome
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), _RETRY_PAUSE * 5)
            await asyncio.sleep(_RETRY_PAUSE)

    async def _call(self, store: str, method: str, body: bytes) -> bytes:
        """One call to ``store``; _NotServed if it did not take it (dead, not the primary)."""
        channel = self._channel(store)
        if channel is None:
            raise _NotServed("not live")
        stub = wire_grpc.ContextStoreStub(channel)  # type: ignore[no-untyped-call]
        try:
            answer: wire.StoreAnswer = await getattr(stub, method)(
                wire.StoreRequest(body=body), timeout=CALL_TIMEOUT, metadata=call_metadata()
            )
            return answer.body
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
            if code is grpc.StatusCode.INVALID_ARGUMENT:
                raise SilboError(f"store {store} refused the request: {exc.details()}") from exc
            if code in (
                grpc.StatusCode.UNAVAILABLE,
                grpc.StatusCode.DEADLINE_EXCEEDED,
                grpc.StatusCode.FAILED_PRECONDITION,
                grpc.StatusCode.CANCELLED,
            ):
                _log.info("store %s did not take a call (%s): again", store, code.name)
                unknown = code in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)
                raise _NotServed(f"{code.name}: {exc.details()}", unknown=unknown) from exc
            raise Unavailable(f"store {store} failed: {exc.details()}") from exc

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
