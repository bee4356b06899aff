"""Helpers of the integration tests: recording subscribers, concurrent publishers, the oracle.

The tests drive real processes (``start_cluster`` in ``tests/conftest.py``) through
:class:`broker.client.Client` and check what arrives against the reference matcher:

- :class:`Recorder` is a subscribing client that records every notification it receives
  (raw ``NotificationBatch`` es in arrival order, or the per-subscription queues of the
  ordinary :class:`~broker.client.SubscriptionHandle` path);
- :func:`publish_concurrently` publishes several streams of updates from as many clients at
  once, each ending with an *end marker*; a recorder that has every publisher's marker has
  everything those publishers sent before it (notifications keep each publisher's order),
  which is how the tests know delivery is over without sleeping for it;
- :class:`Supervised` supervises a cluster in a thread as ``silbo up`` does (restarts
  what dies);
- :func:`assert_exact_delivery` compares a recorder's notifications with what
  :func:`broker.matching.reference.subscription_matches` says it should get: exactly once
  each, in per-publisher order, with the entity that was published.

Imported by the test modules as ``from integration.conftest import ...``.
"""

from __future__ import annotations

import io
import itertools
import json
import queue
import threading
import time
import zlib
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import pytest
from kazoo.client import KazooClient

from broker.client import Client, SubscriptionHandle
from broker.cluster import LocalCluster
from broker.cluster.supervisor import CHECK_INTERVAL, Supervisor
from broker.commands.admin import gather_status
from broker.matching.reference import subscription_matches
from broker.model.subscription import EntitySelector, Subscription
from broker.model.update import ContextUpdate
from broker.runtime.options import Role
from broker.wire import client_pb2 as pb
from broker.wire.convert import entity_from_update

__all__ = [
    "DELIVERY_DEADLINE",
    "MARKER_TENANT",
    "MARKER_TYPE",
    "Delivery",
    "Published",
    "Received",
    "Recorder",
    "SteadyPublisher",
    "Supervised",
    "assert_exact_delivery",
    "cluster_status",
    "end_marker",
    "expected_deliveries",
    "marker_subscription",
    "publish_concurrently",
    "subscriptions_held",
    "wait_until",
    "zk_of",
]

DELIVERY_DEADLINE = 30.0  # seconds for everything published to arrive
MARKER_TENANT = "endmarkers"  # no workload subscription or update uses this tenant
MARKER_TYPE = "EndMarker"


class Delivery(NamedTuple):
    """One notification's identity: which subscription, which publisher's which update."""

    subscription_id: str
    publisher: str
    sequence: int


class Received(NamedTuple):
    """One notification as a recorder received it."""

    subscription_id: str
    publisher: str
    sequence: int
    entity: pb.Entity

    @property
    def key(self) -> Delivery:
        """The notification's identity."""
        return Delivery(self.subscription_id, self.publisher, self.sequence)


@dataclass(frozen=True, slots=True)
class Published:
    """What one publisher published: ``updates[i]`` has sequence ``i + 1``."""

    publisher: str
    updates: list[ContextUpdate]


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``condition`` until it holds; AssertionError naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:.0f} s: {what}")
        time.sleep(0.05)


def marker_subscription(subscription_id: str) -> Subscription:
    """A subscription to the end markers (and to nothing else)."""
    return Subscription(
        id=subscription_id,
        entities=(EntitySelector(id_pattern=".*", type=MARKER_TYPE),),
        tenant=MARKER_TENANT,
    )


def end_marker(index: int, count: int) -> ContextUpdate:
    """The last update of publisher ``index``, after its ``count`` others."""
    return ContextUpdate.of(
        f"end-{index}", {"published": count}, entity_type=MARKER_TYPE, tenant=MARKER_TENANT
    )


class Recorder:
    """A subscribing client that records every notification it receives.

    ``raw=True`` records whole NotificationBatches as they arrive (``Client(on_batch=...)``),
    so the order across all of the session's subscriptions is kept; ``raw=False`` uses the
    ordinary per-subscription queues (``SubscriptionHandle.get``), whose order is kept per
    subscription only. Every recorder holds one subscription to the end markers.
    """

    def __init__(self, endpoints: Sequence[str], name: str, *, raw: bool = True) -> None:
        self.name = name
        self.raw = raw
        self.client = Client(endpoints, on_batch=self._on_batch if raw else None)
        self.subscriptions: dict[str, Subscription] = {}
        self.handles: dict[str, SubscriptionHandle] = {}
        self._received: list[Received] = []
        self._markers: set[str] = set()  # publishers whose end marker arrived
        self._changed = threading.Condition()
        self.subscribe([marker_subscription(f"{name}-end")])

    def subscribe(self, subscriptions: Sequence[Subscription]) -> list[SubscriptionHandle]:
        """Subscribe to all of them (they are what this recorder expects to match)."""
        handles = self.client.subscribe_many(subscriptions)
        for subscription, handle in zip(subscriptions, handles, strict=True):
            assert handle.id == subscription.id
            self.subscriptions[subscription.id] = subscription
            self.handles[subscription.id] = handle
        return handles

    def unsubscribe(self, subscription_id: str) -> None:
        """Unsubscribe; the subscription is no longer expected to match."""
        self.client.unsubscribe(subscription_id)
        del self.subscriptions[subscription_id]
        del self.handles[subscription_id]

    def received(self) -> list[Received]:
        """Everything received so far (arrival order; per subscription when not raw)."""
        with self._changed:
            self._drain()
            return list(self._received)

    def wait_for_markers(
        self, publishers: Iterable[str], timeout: float = DELIVERY_DEADLINE
    ) -> None:
        """Wait until every publisher's end marker has arrived."""
        wanted = set(publishers)
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                self._drain()
                if wanted <= self._markers:
                    self._drain()  # what a queue got before the marker queue got the marker
                    return
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(
                        f"{self.name}: no end marker from {sorted(wanted - self._markers)} "
                        f"within {timeout:.0f} s ({len(self._received)} notifications received)"
                    )
                self._changed.wait(min(remaining, 0.05))

    def close(self) -> None:
        """Close the client (its subscriptions end)."""
        self.client.close()

    def _on_batch(self, batch: pb.NotificationBatch, handles: dict[int, str]) -> None:
        indexes = np.frombuffer(batch.entity_index, dtype="<u4").tolist()
        handle_column = np.frombuffer(batch.handles, dtype="<u8").tolist()
        with self._changed:
            for index, handle in zip(indexes, handle_column, strict=True):
                subscription_id = handles.get(handle, f"<unknown handle {handle:#x}>")
                entity = batch.entities[index]
                self._record(
                    Received(
                        subscription_id, batch.publishers[index], batch.sequences[index], entity
                    )
                )
            self._changed.notify_all()

    def _drain(self) -> None:
        if self.raw:
            return
        for subscription_id, handle in list(self.handles.items()):
            while True:
                try:
                    notification = handle.get(timeout=0)
                except (queue.Empty, StopIteration):
                    break
                update = notification.update
                assert notification.subscription_id == subscription_id
                self._record(
                    Received(
                        subscription_id,
                        update.publisher,
                        update.sequence,
                        entity_from_update(update),
                    )
                )

    def _record(self, received: Received) -> None:
        self._received.append(received)
        if received.entity.tenant == MARKER_TENANT:
            self._markers.add(received.publisher)


@pytest.fixture
def zk_of() -> Iterator[list[KazooClient]]:
    """ZooKeeper clients a test opens (append them); closed after it."""
    clients: list[KazooClient] = []
    yield clients
    for client in clients:
        client.stop()
        client.close()


class SteadyPublisher(threading.Thread):
    """Publishes its updates in small batches at a steady pace, then its end marker.

    :meth:`stop` ends it early (after the batch in flight): a test that must overlap a scale
    gives it more updates than it needs and stops it once the scale is over.
    """

    def __init__(
        self,
        endpoints: Sequence[str],
        name: str,
        updates: list[ContextUpdate],
        *,
        batch: int = 10,
        pace: float = 0.02,
    ) -> None:
        super().__init__(daemon=True)
        self.endpoints = list(endpoints)
        self.name = name
        self.updates = updates
        self.batch = batch
        self.pace = pace
        self.published = Published(name, [])
        self.error: BaseException | None = None
        self._stopping = threading.Event()

    def run(self) -> None:
        sent = 0
        try:
            with Client(self.endpoints, publisher=self.name) as client:
                for start in range(0, len(self.updates), self.batch):
                    if self._stopping.is_set():
                        break
                    chunk = self.updates[start : start + self.batch]
                    client.publish_many(chunk, batch_size=self.batch)
                    sent = start + len(chunk)
                    time.sleep(self.pace)
                marker = end_marker(zlib.crc32(self.name.encode()), sent)
                client.publish(marker)
                self.published = Published(self.name, [*self.updates[:sent], marker])
        except BaseException as exc:
            self.error = exc

    def stop(self) -> None:
        """Publish no further batch; the end marker follows what was sent."""
        self._stopping.set()

    def finish(self) -> Published:
        """Wait for the end; what was published (raises what publishing raised)."""
        self.join(DELIVERY_DEADLINE * 2)
        assert not self.is_alive(), f"{self.name} did not finish"
        if self.error is not None:
            raise self.error
        return self.published


def publish_concurrently(
    endpoints: Sequence[str],
    streams: Sequence[Sequence[ContextUpdate]],
    *,
    prefix: str = "pub",
    batch_size: int = 50,
) -> list[Published]:
    """Publish each stream from its own client, all at once, each ending with its end marker.

    Returns what each publisher published (its end marker last); the first publishing
    error is raised once every thread has finished.
    """
    published = [
        Published(f"{prefix}-{i}", [*stream, end_marker(i, len(stream))])
        for i, stream in enumerate(streams)
    ]
    start = threading.Barrier(len(published))
    errors: list[BaseException] = []

    def publish(which: Published) -> None:
        try:
            with Client(endpoints, publisher=which.publisher) as client:
                start.wait(timeout=DELIVERY_DEADLINE)
                accepted = client.publish_many(which.updates, batch_size=batch_size)
                assert accepted == len(which.updates), f"{which.publisher}: {accepted} accepted"
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=publish, args=(p,), daemon=True) for p in published]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(DELIVERY_DEADLINE)
    assert not any(t.is_alive() for t in threads), "a publisher did not finish"
    if errors:
        raise errors[0]
    return published


def expected_deliveries(
    subscriptions: Iterable[Subscription], published: Sequence[Published]
) -> Counter[Delivery]:
    """What the reference matcher says these subscriptions get: each delivery once."""
    subscriptions = list(subscriptions)
    expected: Counter[Delivery] = Counter()
    for stream in published:
        for sequence, update in enumerate(stream.updates, start=1):
            for subscription in subscriptions:
                if subscription_matches(subscription, update):
                    expected[Delivery(subscription.id, stream.publisher, sequence)] += 1
    return expected


def _examples(deliveries: Counter[Delivery], limit: int = 5) -> str:
    shown = ", ".join(f"{d} x{n}" for d, n in list(deliveries.items())[:limit])
    return shown + (", ..." if len(deliveries) > limit else "")


def assert_exact_delivery(recorder: Recorder, published: Sequence[Published]) -> int:
    """Assert the recorder got exactly the reference's matches, in order, with their entities.

    Call after :meth:`Recorder.wait_for_markers`; returns the number of notifications.
    """
    received = recorder.received()
    expected = expected_deliveries(recorder.subscriptions.values(), published)
    got = Counter(r.key for r in received)
    missing, extra = expected - got, got - expected
    assert not missing and not extra, (
        f"{recorder.name}: {sum(missing.values())} of {expected.total()} expected notifications "
        f"missing ({_examples(missing)}); {sum(extra.values())} unexpected or duplicated "
        f"({_examples(extra)})"
    )
    # the entity each notification carries is the one that was published
    by_key = {
        (stream.publisher, sequence): update
        for stream in published
        for sequence, update in enumerate(stream.updates, start=1)
    }
    for r in received:
        want = entity_from_update(by_key[r.publisher, r.sequence])
        assert r.entity == want, f"{recorder.name}: {r.key} carries {r.entity}, not {want}"
    # per publisher, sequences increase: per subscription, and across a raw session
    per_subscription: dict[tuple[str, str], list[int]] = defaultdict(list)
    per_session: dict[str, list[int]] = defaultdict(list)
    for r in received:
        per_subscription[r.subscription_id, r.publisher].append(r.sequence)
        per_session[r.publisher].append(r.sequence)
    for (subscription_id, publisher), sequences in per_subscription.items():
        assert all(a < b for a, b in itertools.pairwise(sequences)), (
            f"{recorder.name}: {subscription_id} got {publisher}'s updates out of order: "
            f"{_disorder(sequences)}"
        )
    if recorder.raw:
        for publisher, sequences in per_session.items():
            assert all(a <= b for a, b in itertools.pairwise(sequences)), (
                f"{recorder.name}: the session got {publisher}'s updates out of order: "
                f"{_disorder(sequences)}"
            )
    return len(received)


def _disorder(sequences: list[int]) -> str:
    for i, (a, b) in enumerate(itertools.pairwise(sequences)):
        if b <= a:
            return f"... {sequences[max(0, i - 2) : i + 3]} ..."
    return "in order"


def cluster_status(cluster: LocalCluster) -> dict[str, Any]:
    """``silbo admin status --json``'s object, measured without waiting."""
    return gather_status(cluster.zk_address, cluster.spec.cluster, interval=0)


def subscriptions_held(cluster: LocalCluster) -> dict[str, float]:
    """Subscriptions per role: held by the matchers (each counted once: the copies the
    matchers hold divided by the replicas of the configuration, under ``matcher_copies``),
    open at the connection points."""
    status = cluster_status(cluster)
    held: dict[str, float] = defaultdict(int)
    for process in status["processes"]:
        assert process["reachable"], f"{process['name']} does not answer its Admin service"
        if process["role"] == "context-store":
            continue  # entities, not subscriptions
        held[process["role"]] += int(process.get("subscriptions", 0))
    copies = held["matcher"]
    width = min(status["replicas"] or 1, len(status["matchers"]) or 1)
    held["matcher"] = copies // width if copies % width == 0 else copies / width
    held["matcher_copies"] = copies
    return dict(held)


class Supervised:
    """A cluster's supervisor checking it in a thread, as ``silbo up``'s does (what dies is
    restarted; what it says is in ``said``)."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.said = io.StringIO()
        self._supervisor = Supervisor(cluster, out=self.said, hang_after=0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._check, daemon=True)
        self._thread.start()

    def _check(self) -> None:
        while not self._stop.wait(CHECK_INTERVAL):
            self._supervisor.check()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._supervisor.close()

    def pid(self, role: Role, number: int = 1) -> int:
        """The pid of process ``number`` of a role, as cluster.json has it now."""
        described = json.loads((self.cluster.state_dir / "cluster.json").read_text())
        (entry,) = [
            p
            for p in described["processes"]
            if p["role"] == role.value and p["log"].endswith(f"-{number}.log")
        ]
        return int(entry["pid"])
