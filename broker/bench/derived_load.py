"""The load of ``silbo bench derived``: Theodolite's UC2 and UC4 as Silbo context, the
publishers that feed them, and the subscriber that times their derived output.

- :class:`Workload`: the sensors, the entities made before the run (each sensor's parent
  attribute, the hierarchy's floors and buildings), and the aggregation group
  (``POST /v2/x/aggregations``) of one use case:

  - **UC2, downsampling**: every sensor's ``power`` folded into tumbling windows of
    ``window`` seconds (count, sum, min, max, avg), written as the sensor's own derived entity
    ``SensorStats:<i>`` (the sensor's ``refStats``): one derived entity per sensor and window,
    Theodolite's per-key windowed statistics.
  - **UC4, hierarchical aggregation**: sensors -> floors (``refFloor``, :data:`FANOUT` 10 per
    floor) -> buildings (a floor's ``refBuilding``, 5 floors each) -> campuses (a building's
    ``refCampus``, 4 each): one group of three levels, every sensor value counted once at
    each level (count, sum, avg).

- :func:`drive_publisher`: one publisher process (gRPC, ``Client(store=True)``: each update
  upserted in the context store and published, as an NGSI write is). It takes :class:`Step`
  commands from a queue and runs each open-loop: ``rate`` updates a second of its share of
  the sensors (round robin, one ``power`` value each), what is due sent every ``tick``, and
  hands back per update its sensor and value, and per batch when it was sent and
  acknowledged. A cluster that takes less than is offered holds the publisher back (the
  client's window of batches in flight): it falls behind the rate, which the bench sees.
- :class:`Subscriber`: one gRPC subscription per derived type (their count and sum
  attributes); every notification recorded with when it arrived and the window it is of.

Times are wall-clock seconds (``time.time()``), shared by the processes of the machine.
"""

from __future__ import annotations

import math
import multiprocessing
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from broker.client import Client
from broker.errors import SilboError
from broker.ngsi.entity import from_wire
from broker.store.aggregation import AGGREGATE_METADATA, Definition, parse_definition
from broker.wire import client_pb2 as pb

__all__ = [
    "ATTRIBUTE",
    "FANOUT",
    "SENSOR_TYPE",
    "TICK",
    "Connect",
    "Published",
    "PublisherJob",
    "Publishers",
    "Step",
    "Subscriber",
    "Workload",
    "drive_publisher",
    "power_of",
]

SENSOR_TYPE: Final = "Sensor"
ATTRIBUTE: Final = "power"  # W, as Theodolite's ActivePowerRecord
FANOUT: Final = (10, 5, 4)  # UC4: sensors per floor, floors per building, buildings per campus
UC4_LEVELS: Final = (("refFloor", "Floor"), ("refBuilding", "Building"), ("refCampus", "Campus"))
UC2_LEVEL: Final = ("refStats", "SensorStats")
TICK: Final = 0.01  # seconds between a publisher's sends (the default)
VARIANTS: Final = 7  # values a sensor cycles through (consecutive ones differ)
PUBLISH_TIMEOUT: Final = 60.0  # seconds a batch may wait for its acknowledgement
_CATCH_UP: Final = 0.05  # seconds of updates still published once a step's time is up
_CREATE_BATCH: Final = 500  # entities per op/update when the workload is made


@dataclass(frozen=True, slots=True)
class Workload:
    """One use case's sensors, hierarchy and aggregation group (module doc)."""

    uc: int  # 2 or 4
    sensors: int
    window: int  # seconds, the tumbling window's size
    tenant: str

    @property
    def levels(self) -> tuple[tuple[str, str], ...]:
        """(parent attribute, derived type) of each level of the group."""
        return (UC2_LEVEL,) if self.uc == 2 else UC4_LEVELS

    @property
    def types(self) -> tuple[str, ...]:
        """The derived entities' type of each level."""
        return tuple(kind for _attribute, kind in self.levels)

    def group(self) -> dict[str, Any]:
        """The aggregation group's definition (the body of ``POST /v2/x/aggregations``)."""
        functions = (
            ["count", "sum", "min", "max", "avg"] if self.uc == 2 else ["count", "sum", "avg"]
        )
        return {
            "id": f"uc{self.uc}",
            "description": f"silbo bench derived: Theodolite UC{self.uc}",
            "entities": {"type": SENSOR_TYPE},
            "groupBy": [{"attribute": a, "type": t} for a, t in self.levels],
            "attributes": [ATTRIBUTE],
            "functions": functions,
            "window": {"type": "tumbling", "size": f"{self.window}s"},
        }

    def definition(self) -> Definition:
        """The group as the stores read it (its derived attributes' names)."""
        return parse_definition(self.group(), self.tenant, None)

    def keys(self, level: int) -> npt.NDArray[np.int64]:
        """Per sensor, the number of its group at ``level`` (the derived entity's id's)."""
        numbers = np.arange(self.sensors, dtype=np.int64)
        if self.uc == 2:
            return numbers
        for fanout in FANOUT[: level + 1]:
            numbers = numbers // fanout
        return numbers

    def entity_id(self, level: int, number: int) -> str:
        """The id of group ``number``'s derived entity at ``level``."""
        return f"{self.types[level]}:{number}"

    def groups(self, level: int) -> int:
        """How many groups ``level`` has."""
        return int(self.keys(level).max()) + 1 if self.sensors else 0

    def entities(self) -> list[list[dict[str, Any]]]:
        """The entities to make before the run, in batches: the sensors (a first ``power``
        and their parent) and, for UC4, the floors and buildings with theirs."""
        made: list[dict[str, Any]] = []
        attribute, _kind = self.levels[0]
        parents = self.keys(0)
        for i in range(self.sensors):
            made.append(
                {
                    "id": sensor_id(i),
                    "type": SENSOR_TYPE,
                    ATTRIBUTE: {"type": "Number", "value": 0},
                    attribute: {
                        "type": "Relationship",
                        "value": self.entity_id(0, int(parents[i])),
                    },
                }
            )
        for level in range(1, len(self.levels)):
            attribute, _kind = self.levels[level]
            below, above = self.keys(level - 1), self.keys(level)
            pairs = sorted({(int(b), int(a)) for b, a in zip(below, above, strict=True)})
            made += [
                {
                    "id": self.entity_id(level - 1, child),
                    "type": self.types[level - 1],
                    attribute: {"type": "Relationship", "value": self.entity_id(level, parent)},
                }
                for child, parent in pairs
            ]
        return [made[k : k + _CREATE_BATCH] for k in range(0, len(made), _CREATE_BATCH)]


def sensor_id(i: int) -> str:
    """Sensor ``i``'s entity id."""
    return f"{SENSOR_TYPE}:{i}"


def power_of(sensor: int, turn: int) -> int:
    """The value sensor ``sensor`` publishes on its ``turn``-th update (whole watts, so that
    every sum is exact): one of VARIANTS, never the one before."""
    return (sensor * 37 + (turn % VARIANTS) * 613) % 5000


# -- the publishers -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PublisherJob:
    """Publisher ``number`` of ``publishers``: it publishes the sensors ``i`` with
    ``i % publishers == number``."""

    number: int
    publishers: int
    batch: int  # updates per publish batch at most
    in_flight: int  # batches in flight at most (the client's window)
    tick: float = TICK  # seconds between sends


@dataclass(frozen=True, slots=True)
class Connect:
    """Publish through the connection points ``endpoints`` from now on (a new cluster;
    none: publish nowhere, the cluster stops)."""

    endpoints: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Step:
    """One run of a publisher: ``rate`` updates a second (its share) to the ``sensors``
    sensors of ``tenant``, from ``start_at`` for ``seconds``."""

    tenant: str
    sensors: int
    rate: float
    start_at: float
    seconds: float


@dataclass(slots=True)
class Published:
    """What one publisher published in one step: per update its sensor and value, per batch
    its first update, size, when it was sent and acknowledged (NaN: refused), and how many
    updates the connection point accepted."""

    sensor: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, np.int64))
    value: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, np.int64))
    first: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, np.int64))
    count: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, np.int64))
    sent: npt.NDArray[np.float64] = field(default_factory=lambda: np.zeros(0))
    acked: npt.NDArray[np.float64] = field(default_factory=lambda: np.zeros(0))
    accepted: int = 0
    errors: list[str] = field(default_factory=list)

    @staticmethod
    def joined(parts: list[Published]) -> Published:
        """Several publishers' records as one (updates renumbered)."""
        out = Published()
        offset = 0
        firsts = []
        for part in parts:
            firsts.append(part.first + offset)
            offset += len(part.sensor)
        if parts:
            out.sensor = np.concatenate([p.sensor for p in parts])
            out.value = np.concatenate([p.value for p in parts])
            out.first = np.concatenate(firsts)
            out.count = np.concatenate([p.count for p in parts])
            out.sent = np.concatenate([p.sent for p in parts])
            out.acked = np.concatenate([p.acked for p in parts])
        out.accepted = sum(p.accepted for p in parts)
        out.errors = [e for p in parts for e in p.errors]
        return out

    def per_update(self) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """Each update's batch's send and acknowledgement times."""
        return np.repeat(self.sent, self.count), np.repeat(self.acked, self.count)


def drive_publisher(
    job: PublisherJob, commands: Any, results: Any
) -> None:  # pragma: no cover - runs in a process of its own; the bench's test drives it
    """Run publisher ``job`` until a None command: on :class:`Connect` a client of those
    connection points ("connected" on ``results``), on each :class:`Step` the step run and
    its :class:`Published` on ``results``. Says "ready" first."""
    results.put("ready")
    client: Client | None = None
    turns: dict[str, int] = {}  # tenant -> updates published so far (the sensors' turns)
    try:
        while (command := commands.get()) is not None:
            if isinstance(command, Connect):
                if client is not None:
                    client.close()
                    client = None
                if not command.endpoints:  # disconnect: the cluster stops
                    results.put("connected")
                    continue
                client = Client(
                    list(command.endpoints), publisher=f"bench-derived-{job.number}",
                    store=True, window=job.in_flight, timeout=PUBLISH_TIMEOUT,
                )  # fmt: skip
                turns = {}
                results.put("connected")
                continue
            assert client is not None, "a step before a Connect"
            done = _publish(client, job, command, turns.get(command.tenant, 0))
            turns[command.tenant] = turns.get(command.tenant, 0) + len(done.sensor)
            results.put(done)
    finally:
        if client is not None:
            client.close()


def _publish(client: Client, job: PublisherJob, step: Step, turn: int) -> Published:
    own = np.arange(job.number, step.sensors, job.publishers, dtype=np.int64)
    if not len(own) or step.rate <= 0:
        return Published()
    pool = [
        [_entity(step.tenant, int(i), power_of(int(i), v)) for v in range(VARIANTS)] for i in own
    ]
    sensors: list[int] = []
    values: list[int] = []
    batches: list[tuple[int, int, float]] = []  # first update, count, sent
    acks: list[float] = []
    futures: list[Future[int]] = []
    errors: list[str] = []
    time.sleep(max(0.0, step.start_at - time.time()))
    began = time.monotonic()
    published = 0
    total = int(step.seconds * step.rate)
    while True:
        elapsed = time.monotonic() - began
        due = min(int(elapsed * step.rate), total) - published
        ended = elapsed >= step.seconds
        if ended and due > step.rate * _CATCH_UP:  # held back: the rest is not published
            break
        while due > 0 and not errors:
            size = min(due, job.batch)
            entities = []
            for k in range(published, published + size):
                n = turn + k
                slot = n % len(own)
                variant = (n // len(own)) % VARIANTS
                entities.append(pool[slot][variant])
                sensors.append(int(own[slot]))
                values.append(power_of(int(own[slot]), variant))
            acks.append(math.nan)
            batches.append((published, size, time.time()))
            try:
                future = client._send_batch(entities)
            except SilboError as exc:  # the window stayed full past the timeout
                errors.append(str(exc))
                break
            future.add_done_callback(_acknowledged(acks, len(acks) - 1))
            futures.append(future)
            published += size
            due -= size
        if ended or errors:
            break
        time.sleep(job.tick)
    accepted = 0
    for index, future in enumerate(futures):
        try:
            accepted += future.result(timeout=PUBLISH_TIMEOUT)
        except (SilboError, TimeoutError) as exc:
            errors.append(str(exc))
            continue
        if math.isnan(acks[index]):  # its callback has not run yet: a later time is safe
            acks[index] = time.time()
    batches = batches[: len(futures)]
    table = np.array(batches, dtype=np.float64).reshape(-1, 3)
    return Published(
        sensor=np.array(sensors[:published], dtype=np.int64),
        value=np.array(values[:published], dtype=np.int64),
        first=table[:, 0].astype(np.int64),
        count=table[:, 1].astype(np.int64),
        sent=table[:, 2],
        acked=np.array(acks[: len(futures)], dtype=np.float64),
        accepted=accepted,
        errors=errors[:5],
    )


def _acknowledged(acks: list[float], index: int) -> Any:
    """A future's callback: record when the batch was acknowledged (NaN if refused)."""

    def record(future: Future[int]) -> None:
        if future.exception() is None:
            acks[index] = time.time()

    return record


def _entity(tenant: str, i: int, value: int) -> pb.Entity:
    entity = pb.Entity(id=sensor_id(i), type=SENSOR_TYPE, tenant=tenant, service_path="/")
    wire = entity.attributes.add(name=ATTRIBUTE, type="Number")
    wire.value.integer = value
    return entity


class Publishers:
    """``count`` publisher processes, started once (they import while a cluster starts),
    connected to each cluster in turn and given its steps."""

    def __init__(self, count: int, batch: int, in_flight: int, tick: float = TICK) -> None:
        context = multiprocessing.get_context("spawn")
        self._commands = [context.Queue() for _ in range(count)]
        self._results = [context.Queue() for _ in range(count)]
        self._processes = [
            context.Process(
                target=drive_publisher,
                args=(
                    PublisherJob(n, count, batch, in_flight, tick),
                    self._commands[n],
                    self._results[n],
                ),
                daemon=True,
                name=f"bench-derived-publisher-{n}",
            )
            for n in range(count)
        ]
        for process in self._processes:
            process.start()
        self._started = False

    def connect(self, endpoints: list[str]) -> None:
        """Publish to the cluster of these connection points from now on."""
        for commands in self._commands:
            commands.put(Connect(tuple(endpoints)))
        expected = ["ready", "connected"] if not self._started else ["connected"]
        for results in self._results:
            for answer in expected:
                if results.get(timeout=120) != answer:
                    raise RuntimeError(f"a publisher did not say {answer!r}")
        self._started = True

    def disconnect(self) -> None:
        """Close the publishers' clients (before their cluster stops)."""
        self.connect([])

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._processes if p.pid is not None]

    def run(
        self, tenant: str, sensors: int, rate: float, start_at: float, seconds: float
    ) -> Published:
        """Every publisher's part of one step (``rate`` in all); what they published."""
        share = rate / len(self._processes)
        for commands in self._commands:
            commands.put(Step(tenant, sensors, share, start_at, seconds))
        timeout = seconds + PUBLISH_TIMEOUT + max(0.0, start_at - time.time()) + 30
        parts: list[Published] = []
        for results in self._results:
            try:
                parts.append(results.get(timeout=timeout))
            except queue.Empty:
                raise RuntimeError("a publisher did not report its step") from None
        return Published.joined(parts)

    def close(self) -> None:
        for commands in self._commands:
            commands.put(None)
        for process in self._processes:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()


# -- the subscriber ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Arrival:
    """One notification of a derived entity: when it arrived, its level, group number,
    window end, and the count and sum it carries."""

    at: float
    level: int
    number: int
    end: float
    count: int
    total: float


class Subscriber:
    """A gRPC subscription per level of ``workload`` on its derived entities; every
    notification kept as an :class:`Arrival`."""

    def __init__(self, endpoints: list[str], workload: Workload) -> None:
        definition = workload.definition()
        self._count = definition.derived_name(ATTRIBUTE, "count")
        self._sum = definition.derived_name(ATTRIBUTE, "sum")
        self._levels = {kind: level for level, kind in enumerate(workload.types)}
        self._lock = threading.Lock()
        self._arrivals: list[Arrival] = []
        self.undecoded = 0
        self._client = Client(endpoints, on_batch=self._on_batch, timeout=60.0)
        for kind in workload.types:
            self._client.subscribe(
                type=kind, tenant=workload.tenant, attrs=[self._count, self._sum],
                description="silbo bench derived",
            )  # fmt: skip

    def arrivals(self, since: int = 0) -> list[Arrival]:
        """Every notification so far, from the ``since``-th on."""
        with self._lock:
            return self._arrivals[since:]

    def count(self) -> int:
        """How many notifications arrived so far."""
        with self._lock:
            return len(self._arrivals)

    def close(self) -> None:
        self._client.close()

    def _on_batch(self, batch: pb.NotificationBatch, _handles: dict[int, str]) -> None:
        now = time.time()
        rows = np.frombuffer(batch.entity_index, dtype="<u4").tolist()
        decoded: dict[int, Arrival | None] = {}
        for row in rows:
            if row not in decoded:
                decoded[row] = self._arrival(batch.entities[row], now)
        with self._lock:
            for row in rows:
                arrival = decoded[row]
                if arrival is None:
                    self.undecoded += 1
                else:
                    self._arrivals.append(arrival)

    def _arrival(self, entity: pb.Entity, now: float) -> Arrival | None:
        level = self._levels.get(entity.type)
        attributes = from_wire(entity)
        count = attributes.get(self._count)
        total = attributes.get(self._sum)
        if level is None or count is None or total is None:
            return None
        window = count["metadata"].get(AGGREGATE_METADATA, {}).get("value", {})
        try:
            number = int(entity.id.rsplit(":", 1)[1])
            return Arrival(
                now, level, number, float(window["end"]), int(count["value"]), float(total["value"])
            )
        except (KeyError, IndexError, TypeError, ValueError):
            return None
