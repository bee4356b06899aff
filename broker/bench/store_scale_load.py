"""The load of ``silbo bench store-scale``: a writer and a reader, each a process, and the oracle.

- :func:`drive_writer`: writes at a fixed rate through a :class:`StoreClient` (the fronts'
  way to the stores: routed to each partition's primary of the time, sent again to the next
  one, refused after ``STORE_WAIT``). Every write is an append of W-IoT entity
  ``seq % written`` with ``n: {"$inc": 1}`` and ``v: seq``, so that the oracle knows what
  each acknowledged write left: ``n`` counts the acknowledged writes of the entity, ``v`` is
  its last one. The writes due in one tick go as one ``apply`` (one ``Apply`` per store);
  fewer than ``written`` writes are ever in flight, so two writes of one entity never are.
- :func:`drive_reader`: GETs of random loaded entities through the HTTP front at a fixed
  rate, one at a time: each one's time, latency and status.
- :func:`read_back`: the written entities read back through a StoreClient (queries naming
  their ids), and how many entities the tenant holds.

Both drivers say they are ready (connected) on the ``ready`` queue, start once ``go`` is
set, run until ``stop`` is, and hand back plain arrays on the ``out`` queue (they cross a
process boundary); times are wall-clock seconds (``time.time()``), shared by the processes.
"""

from __future__ import annotations

import asyncio
import http.client
import multiprocessing.synchronize
import time
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import quote

import numpy as np

from broker.bench.storage import iot_entity_id, iot_service_path
from broker.bench.workloads.iot import IOT_TYPE
from broker.coordination.client import connect
from broker.errors import Unavailable
from broker.roles.store_client import StoreClient
from broker.store.query import EntityQuery, Selector
from broker.store.reading import StoreReader
from broker.store.semantics import Attributes, Mode
from broker.store.wire import Intent

__all__ = [
    "FAILED",
    "OK",
    "REFUSED",
    "ReaderJob",
    "Signals",
    "WriterJob",
    "drive_reader",
    "drive_writer",
    "read_back",
    "write_of",
]

OK: Final = 0  # a call's outcome: every write acknowledged
REFUSED: Final = 1  # the store client gave up (503 through a front): not acknowledged
FAILED: Final = 2  # another error: not acknowledged
TICK: Final = 0.01  # seconds between the writer's calls
READ_TIMEOUT: Final = 30.0
_READ_BATCH: Final = 500  # ids per read-back query


@dataclass(frozen=True, slots=True)
class WriterJob:
    """Writes at ``rate`` per second to entities ``0 .. written - 1`` of ``tenant``."""

    zk: str
    cluster: str
    tenant: str
    written: int
    rate: float


@dataclass(frozen=True, slots=True)
class Signals:
    """How the bench and its drivers agree: ``ready`` (a queue each driver puts its name on
    once connected), ``go`` (start now), ``stop``, and ``out`` (the records)."""

    ready: Any
    go: multiprocessing.synchronize.Event
    stop: multiprocessing.synchronize.Event
    out: Any


@dataclass(frozen=True, slots=True)
class ReaderJob:
    """GETs of random entities ``0 .. entities - 1`` through the front at ``base``."""

    base: str
    tenant: str
    entities: int
    rate: float
    seed: int


def write_of(tenant: str, seq: int, written: int) -> Intent:
    """Write ``seq``: an append to entity ``seq % written`` of ``n += 1`` and ``v = seq``."""
    i = seq % written
    attributes: dict[str, Any] = {
        "n": {"type": "Number", "value": {"$inc": 1}, "metadata": {}},
        "v": {"type": "Number", "value": seq, "metadata": {}},
    }
    return Intent(Mode.APPEND, iot_entity_id(i), IOT_TYPE, iot_service_path(i), tenant, attributes)


def drive_writer(
    job: WriterJob, signals: Signals
) -> None:  # pragma: no cover - runs in a process of its own; the bench's test drives it
    """Run the writer from ``go`` until ``stop``; put its calls on ``out``: per call its
    send time, latency, first write and count, and outcome (OK, REFUSED, FAILED), and the
    writes the stores answered with an error."""
    signals.out.put(asyncio.run(_write(job, signals)))


async def _write(job: WriterJob, signals: Signals) -> dict[str, Any]:
    zk = connect(job.zk, cluster=job.cluster, timeout=10.0)
    store = StoreClient(zk, asyncio.get_running_loop())
    while store.layout is None:  # the watch's first read
        await asyncio.sleep(0.01)
    signals.ready.put("writer")
    await asyncio.to_thread(signals.go.wait)
    stop = signals.stop
    calls: list[tuple[float, float, int, int, int]] = []
    errors: list[int] = []
    in_flight = 0
    limit = max(1, job.written - 1)  # fewer than `written` in flight: one write per entity

    async def call(first: int, count: int) -> None:
        nonlocal in_flight
        intents = [write_of(job.tenant, s, job.written) for s in range(first, first + count)]
        sent = time.time()
        started = time.perf_counter()
        outcome = OK
        try:
            applied = await store.apply(intents)
            errors.extend(first + k for k, a in enumerate(applied) if a.error is not None)
        except Unavailable:
            outcome = REFUSED
        except Exception:  # counted and reported (FAILED): the run goes on
            outcome = FAILED
        calls.append((sent, time.perf_counter() - started, first, count, outcome))
        in_flight -= count

    tasks: set[asyncio.Task[None]] = set()
    began = time.monotonic()
    seq = 0
    try:
        while not stop.is_set():
            due = int((time.monotonic() - began) * job.rate) - seq
            count = min(due, limit - in_flight)
            if count > 0:
                in_flight += count
                task = asyncio.create_task(call(seq, count))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                seq += count
            await asyncio.sleep(TICK)
        await asyncio.gather(*tasks)
    finally:
        await store.close()
        zk.stop()
        zk.close()
    columns = np.array(calls, dtype=np.float64).reshape(-1, 5)
    return {"calls": columns, "errors": errors, "sent": seq}


def drive_reader(
    job: ReaderJob, signals: Signals
) -> None:  # pragma: no cover - runs in a process of its own; the bench's test drives it
    """GET random entities through the front from ``go`` until ``stop``; put (send time,
    latency, status) of each on ``out`` (status 0: no answer)."""
    rng = np.random.default_rng([job.seed, 9])
    host, port = job.base.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=READ_TIMEOUT)
    rows: list[tuple[float, float, int]] = []
    signals.ready.put("reader")
    signals.go.wait()
    stop = signals.stop
    began = time.monotonic()
    try:
        while not stop.is_set():
            pause = began + len(rows) / job.rate - time.monotonic()
            if pause > 0:
                stop.wait(pause)
                continue
            i = int(rng.integers(0, job.entities))
            path = f"/v2/entities/{quote(iot_entity_id(i), safe='')}?type={IOT_TYPE}"
            headers = {"Fiware-Service": job.tenant, "Fiware-ServicePath": iot_service_path(i)}
            sent = time.time()
            started = time.perf_counter()
            try:
                connection.request("GET", path, headers=headers)
                answer = connection.getresponse()
                answer.read()
                status = answer.status
            except OSError:
                connection.close()  # opened again by the next request
                status = 0
            rows.append((sent, time.perf_counter() - started, status))
    finally:
        connection.close()
    signals.out.put(np.array(rows, dtype=np.float64).reshape(-1, 3))


def read_back(zk_address: str, cluster: str, tenant: str, written: int) -> dict[str, Any]:
    """The entities ``0 .. written - 1`` as the cluster answers them now: ``n`` and ``v`` of
    each (None: not found; ``n`` None: never incremented), and the tenant's entity count."""
    return asyncio.run(_read_back(zk_address, cluster, tenant, written))


async def _read_back(zk_address: str, cluster: str, tenant: str, written: int) -> dict[str, Any]:
    zk = connect(zk_address, cluster=cluster, timeout=10.0)
    store = StoreClient(zk, asyncio.get_running_loop())
    reader = StoreReader(lambda: store)
    found: dict[str, tuple[Any, Any]] = {}
    try:
        for first in range(0, written, _READ_BATCH):
            ids = [iot_entity_id(i) for i in range(first, min(first + _READ_BATCH, written))]
            query = EntityQuery(
                tenant=tenant,
                scopes=("/#",),
                selectors=tuple(Selector(id=e, type=IOT_TYPE) for e in ids),
                limit=len(ids),
            )
            page = await reader.query(query)
            for document in page.documents:
                found[document.id] = (
                    _value(document.attributes, "n"),
                    _value(document.attributes, "v"),
                )
        total = await reader.query(
            EntityQuery(
                tenant=tenant, scopes=("/#",), selectors=(Selector(type=IOT_TYPE),), limit=1,
                count=True,
            )
        )  # fmt: skip
    finally:
        await store.close()
        zk.stop()
        zk.close()
    values = [found.get(iot_entity_id(i)) for i in range(written)]
    return {"values": values, "count": total.count}


def _value(attributes: Attributes, name: str) -> Any:
    attribute = attributes.get(name)
    return None if attribute is None else attribute["value"]
