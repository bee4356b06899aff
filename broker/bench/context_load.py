"""The load of ``silbo bench context``: W-IoT writes to context store processes and fronts.

Each driver runs in a process of its own (so that the load it makes is not measured in the
process it loads): :func:`drive_stores` sends ``ContextStore.Apply`` calls straight to the
stores, :func:`drive_front` sends ``POST /v2/op/update`` batches to one HTTP front. Both
start at an agreed wall-clock moment, run a warm-up, then count what completes in each of
the measured windows, and return plain dicts (they cross a process boundary).

:func:`load_entities` is the untimed loader: entities created (upserted) through ``Apply`` in
big batches, routed by partition as a front routes them.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import aiohttp
import grpc

from broker.bench.storage import iot_attributes, iot_entity_id, iot_service_path
from broker.bench.workloads.iot import IOT_TYPE
from broker.coordination.client import connect
from broker.roles.store_scaling import registrations
from broker.runtime.link import CHANNEL_OPTIONS
from broker.store.entities import partition_of
from broker.store.layout import StoreLayout, read_store_layout
from broker.store.semantics import Mode
from broker.store.wire import Intent, encode_writes, unpack
from broker.wire import internal_pb2 as wire
from broker.wire import internal_pb2_grpc as wire_grpc

__all__ = [
    "ATTRIBUTE_POOL",
    "LOAD_BATCH",
    "FrontJob",
    "StoreJob",
    "drive_front",
    "drive_stores",
    "holders",
    "load_entities",
    "store_addresses",
]

# Distinct attribute sets the writers cycle through: a prime, so that an entity's next write
# almost never carries the values of its last one (an unchanged entity is not committed).
ATTRIBUTE_POOL: Final = 997
CALL_TIMEOUT: Final = 600.0  # seconds: a load call or a scan of a million entities
# A store applies a whole Apply call on its event loop (~170 us of CPU per write): calls of
# 2,000 writes, 4 in flight, held it for over 5 s on a loaded machine, and the liveness
# probes declared it dead (fenced). 500 writes, 2 in flight per store, keep it answering.
LOAD_BATCH: Final = 500
_LOAD_IN_FLIGHT: Final = 2


def store_addresses(
    zk_address: str, cluster: str, timeout: float = 30.0
) -> tuple[StoreLayout, dict[str, str]]:
    """A running cluster's store layout and each of its stores' address, once every store
    of the layout has registered (a store registers its id just after its membership)."""
    client = connect(zk_address, cluster=cluster, timeout=10.0)
    try:
        layout = read_store_layout(client)
        if layout is None:
            raise RuntimeError("the cluster has no store layout")
        deadline = time.monotonic() + timeout
        while not set(layout.stores) <= (found := registrations(client)).keys():
            if time.monotonic() > deadline:
                raise RuntimeError(f"the context stores did not register within {timeout:g} s")
            time.sleep(0.05)
        return layout, {store: found[store].address for store in layout.stores}
    finally:
        client.stop()
        client.close()


def holders(layout: StoreLayout, tenant: str, count: int) -> dict[str, list[int]]:
    """The W-IoT entities ``0 .. count - 1`` of ``tenant``, by the store holding each."""
    by_store: dict[str, list[int]] = {store: [] for store in layout.stores}
    for i in range(count):
        by_store[layout.holder(partition_of(tenant, iot_entity_id(i)))].append(i)
    return by_store


def intent(tenant: str, i: int, attributes: dict[str, Any]) -> Intent:
    """An upsert of W-IoT entity ``i`` with these attributes."""
    return Intent(Mode.UPSERT, iot_entity_id(i), IOT_TYPE, iot_service_path(i), tenant, attributes)


def outcomes(body: bytes) -> tuple[int, int]:
    """(modified, errors) of an ``Apply`` answer, without decoding its documents."""
    rows = unpack(body)
    return sum(1 for r in rows if r[5]), sum(1 for r in rows if r[7] is not None)


async def load_entities(
    addresses: dict[str, str],
    layout: StoreLayout,
    tenant: str,
    start: int,
    count: int,
    seed: int,
    say: Callable[[str], None],
    batch: int = LOAD_BATCH,
) -> float:
    """Upsert W-IoT entities ``start .. start + count - 1`` of ``tenant`` through ``Apply``;
    the seconds it took. RuntimeError if a write failed."""
    channels = {
        s: grpc.aio.insecure_channel(a, options=CHANNEL_OPTIONS) for s, a in addresses.items()
    }
    stubs = {s: wire_grpc.ContextStoreStub(c) for s, c in channels.items()}  # type: ignore[no-untyped-call]
    slots = asyncio.Semaphore(_LOAD_IN_FLIGHT * len(addresses))
    failures: list[str] = []

    async def send(store: str, body: bytes) -> None:
        try:
            answer = await stubs[store].Apply(wire.StoreRequest(body=body), timeout=CALL_TIMEOUT)
            _modified, errors = outcomes(answer.body)
            if errors:
                failures.append(f"{errors} writes failed at {store}")
        finally:
            slots.release()

    started = shown = time.monotonic()
    tasks = []
    try:
        for first in range(start, start + count, batch):
            last = min(first + batch, start + count)
            by_store: dict[str, list[Intent]] = {}
            for j, attrs in enumerate(iot_attributes(first, last - first, seed)):
                i = first + j
                store = layout.holder(partition_of(tenant, iot_entity_id(i)))
                by_store.setdefault(store, []).append(intent(tenant, i, attrs))
            for store, intents in by_store.items():
                await slots.acquire()
                tasks.append(asyncio.create_task(send(store, encode_writes(intents))))
            for task in [t for t in tasks if t.done()]:
                task.result()  # a failed call fails the load now
                tasks.remove(task)
            if time.monotonic() - shown > 5:
                shown = time.monotonic()
                rate = (last - start) / (shown - started)
                say(f"{last - start:,}/{count:,} entities loaded ({rate:,.0f}/s)")
            if failures:
                break
        await asyncio.gather(*tasks)
    finally:
        for channel in channels.values():
            await channel.close()
    if failures:
        raise RuntimeError(f"loading the entities: {failures[0]}")
    return time.monotonic() - started


# -- measured windows ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Windows:
    """When to count: ``windows`` windows of ``duration`` seconds after ``start_at + warmup``
    (wall-clock seconds: the drivers are other processes)."""

    start_at: float
    warmup: float
    duration: float
    windows: int

    @property
    def end(self) -> float:
        return self.start_at + self.warmup + self.windows * self.duration

    def index(self, moment: float) -> int | None:
        """The window ``moment`` falls in, or None (warm-up, or after the end)."""
        n = int((moment - self.start_at - self.warmup) // self.duration)
        return n if 0 <= n < self.windows else None


def _new_counts(windows: int, names: Sequence[str]) -> dict[str, list[int]]:
    return {name: [0] * windows for name in names}


# -- ContextStore.Apply, straight to the stores ------------------------------------------------


@dataclass(frozen=True, slots=True)
class StoreJob:
    """What one store driver process does: ``in_flight`` concurrent callers per store, each
    sending batches of ``batch`` upserts of the entities ``entities[store]`` in turn."""

    number: int
    tenant: str
    addresses: dict[str, str]  # store id: address
    entities: dict[str, list[int]]  # store id: the entities this driver writes there
    batch: int
    in_flight: int
    seed: int
    start_at: float
    warmup: float
    duration: float
    windows: int


def drive_stores(job: StoreJob) -> dict[str, Any]:
    """Run one store driver (in a process of its own); what it counted per window."""
    return asyncio.run(_drive_stores(job))


async def _drive_stores(job: StoreJob) -> dict[str, Any]:
    timing = _Windows(job.start_at, job.warmup, job.duration, job.windows)
    pool = iot_attributes(job.number * ATTRIBUTE_POOL, ATTRIBUTE_POOL, job.seed + 1)
    counts = _new_counts(job.windows, [f"writes:{s}" for s in job.addresses])
    counts.update(_new_counts(job.windows, ["calls", "modified", "errors"]))
    latencies: list[float] = []
    channels = [
        grpc.aio.insecure_channel(a, options=CHANNEL_OPTIONS) for a in job.addresses.values()
    ]

    async def caller(store: str, channel: grpc.aio.Channel, offset: int) -> None:
        stub = wire_grpc.ContextStoreStub(channel)  # type: ignore[no-untyped-call]
        entities = job.entities[store]
        cursor = offset
        while time.time() < timing.end:
            intents = []
            for _ in range(job.batch):
                i = entities[cursor % len(entities)]
                intents.append(intent(job.tenant, i, pool[cursor % ATTRIBUTE_POOL]))
                cursor += 1
            request = wire.StoreRequest(body=encode_writes(intents))
            started = time.perf_counter()
            answer = await stub.Apply(request, timeout=CALL_TIMEOUT)
            took = time.perf_counter() - started
            window = timing.index(time.time())
            if window is None:
                continue
            modified, errors = outcomes(answer.body)
            counts[f"writes:{store}"][window] += job.batch
            counts["calls"][window] += 1
            counts["modified"][window] += modified
            counts["errors"][window] += errors
            latencies.append(took)

    await asyncio.sleep(max(0.0, job.start_at - time.time()))
    try:
        await asyncio.gather(
            *(
                caller(store, channel, k * 7919 + job.number * 104_729)
                for store, channel in zip(job.addresses, channels, strict=True)
                for k in range(job.in_flight)
                if job.entities[store]
            )
        )
    finally:
        for channel in channels:
            await channel.close()
    return {"counts": counts, "latencies": latencies}


# -- POST /v2/op/update, through one front -----------------------------------------------------


@dataclass(frozen=True, slots=True)
class FrontJob:
    """What one front driver does: ``concurrency`` clients sending ``op/update`` (append)
    batches of ``batch`` entities of one district each, as fast as answered or ``rate``
    entities/s in all (0: as fast)."""

    base: str
    tenant: str
    entities: int  # the entities 0 .. entities - 1 exist
    batch: int
    concurrency: int
    rate: float
    seed: int
    start_at: float
    warmup: float
    duration: float
    windows: int


def drive_front(job: FrontJob) -> dict[str, Any]:
    """Run one front driver (in a process of its own); what it counted per window."""
    return asyncio.run(_drive_front(job))


async def _drive_front(job: FrontJob) -> dict[str, Any]:
    timing = _Windows(job.start_at, job.warmup, job.duration, job.windows)
    pool = iot_attributes(0, ATTRIBUTE_POOL, job.seed + 2)
    districts: dict[str, list[int]] = {}
    for i in range(job.entities):
        districts.setdefault(iot_service_path(i), []).append(i)
    paths = sorted(districts)
    counts = _new_counts(job.windows, ["requests", "writes", "errors"])
    statuses: dict[str, int] = {}
    latencies: list[float] = []
    interval = job.batch * job.concurrency / job.rate if job.rate > 0 else 0.0

    async def client(http: aiohttp.ClientSession, number: int) -> None:
        cursor, sent = number * 7919, 0
        first = job.start_at + number * interval / job.concurrency
        while time.time() < timing.end:
            if interval:
                pause = first + sent * interval - time.time()
                if pause > 0:
                    await asyncio.sleep(pause)
            path = paths[(number + sent) % len(paths)]
            members = districts[path]
            entities = []
            for _ in range(job.batch):
                i = members[cursor % len(members)]
                entities.append(
                    {"id": iot_entity_id(i), "type": IOT_TYPE, **pool[cursor % ATTRIBUTE_POOL]}
                )
                cursor += 1
            body = json.dumps({"actionType": "append", "entities": entities})
            headers = {
                "Fiware-Service": job.tenant,
                "Fiware-ServicePath": path,
                "Content-Type": "application/json",
            }
            sent += 1
            started = time.perf_counter()
            async with http.post(f"{job.base}/v2/op/update", data=body, headers=headers) as answer:
                await answer.read()
                status = answer.status
            took = time.perf_counter() - started
            window = timing.index(time.time())
            if window is None:
                continue
            counts["requests"][window] += 1
            if status == 204:
                counts["writes"][window] += job.batch
                latencies.append(took)
            else:
                counts["errors"][window] += 1
                statuses[str(status)] = statuses.get(str(status), 0) + 1

    await asyncio.sleep(max(0.0, job.start_at - time.time()))
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        await asyncio.gather(*(client(http, n) for n in range(job.concurrency)))
    return {"counts": counts, "latencies": latencies, "statuses": statuses}
