"""The configuration znode: compare-and-set, increasing epochs, watches, validation."""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Callable

import pytest
from kazoo.client import KazooClient

from broker.coordination.configuration import (
    ClusterConfiguration,
    Configuration,
    VersionedConfiguration,
)
from broker.coordination.errors import (
    ConfigurationConflict,
    CorruptCoordinationData,
    InvalidConfiguration,
)
from broker.partition.selector import RendezvousSelector


def test_create_then_read(client: KazooClient) -> None:
    config = ClusterConfiguration(client)
    assert config.read() is None
    created = config.create(Configuration.of(1, ["m1", "m2"], exit_points=["e1"], replicas=2))
    assert created == config.read()
    assert created.version == 0 and created.epoch == 1
    assert created.configuration.next(["m1", "m2", "m3"]).replicas == 2  # kept by a scale
    assert json.loads(client.get("/config")[0]) == {
        "epoch": 1,
        "matchers": ["m1", "m2"],
        "selector": {"kind": "rendezvous", "version": 1, "owners": ["m1", "m2"], "replicas": 2},
        "exit_points": ["e1"],
        "access_points": [],
        "failed": [],
    }
    with pytest.raises(ConfigurationConflict, match="already"):
        config.create(Configuration.of(1, ["m3"]))


def test_a_stale_writer_conflicts_and_epochs_increase(
    client: KazooClient, connected: Callable[[], KazooClient]
) -> None:
    mine, theirs = ClusterConfiguration(client), ClusterConfiguration(connected())
    start = mine.create(Configuration.of(1, ["m1"]))
    seen_by_them = theirs.read()
    assert seen_by_them is not None
    advanced = mine.advance(start, ["m1", "m2"])
    assert advanced.epoch == 2 and advanced.version == 1
    with pytest.raises(ConfigurationConflict, match="read it again"):
        theirs.advance(seen_by_them, ["m1", "m3"])
    with pytest.raises(ConfigurationConflict):
        mine.advance(start, ["m1", "m2", "m3"])  # our own stale read conflicts too
    latest = theirs.read()
    assert latest == advanced and latest.configuration.selector.owners == ("m1", "m2")
    assert theirs.advance(latest, ["m2"]).epoch == 3


def test_concurrent_writers_never_interleave(connected: Callable[[], KazooClient]) -> None:
    ClusterConfiguration(connected()).create(Configuration.of(0, ["m0"]))
    writes: list[int] = []
    lock = threading.Lock()

    def writer(name: str) -> None:
        config = ClusterConfiguration(connected())
        for _ in range(10):
            while True:
                current = config.read()
                assert current is not None
                try:
                    done = config.advance(current, [name])
                    break
                except ConfigurationConflict:
                    continue
            with lock:
                writes.append(done.epoch)

    threads = [threading.Thread(target=writer, args=(f"w{i}",)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert sorted(writes) == list(range(1, 21))  # every epoch written once, none lost


def test_the_epoch_must_increase(client: KazooClient) -> None:
    config = ClusterConfiguration(client)
    current = config.create(Configuration.of(5, ["m1"]))
    with pytest.raises(InvalidConfiguration, match="does not follow"):
        config.replace(current, Configuration.of(5, ["m2"]))
    assert config.replace(current, Configuration.of(9, ["m2"])).epoch == 9


@pytest.mark.parametrize(
    "make",
    [
        lambda: Configuration(-1, ("m1",), RendezvousSelector(("m1",))),
        lambda: Configuration(True, ("m1",), RendezvousSelector(("m1",))),
        lambda: Configuration(1, ("m1", "m1"), RendezvousSelector(("m1",))),
        lambda: Configuration(1, ("m1", "m2"), RendezvousSelector(("m1",))),
        lambda: Configuration.of(1, []),
        lambda: Configuration.of(1, [""]),
    ],
    ids=["negative-epoch", "bool-epoch", "duplicates", "selector-mismatch", "empty", "blank"],
)
def test_an_inconsistent_configuration_is_rejected(make: Callable[[], Configuration]) -> None:
    with pytest.raises(InvalidConfiguration):
        make()


def test_the_watch_sees_every_change(
    client: KazooClient, connected: Callable[[], KazooClient]
) -> None:
    seen: queue.Queue[int | None] = queue.Queue()

    def record(current: VersionedConfiguration | None) -> None:
        seen.put(None if current is None else current.epoch)

    watch = ClusterConfiguration(client).watch(record)
    assert seen.get(timeout=5) is None
    writer = ClusterConfiguration(connected())
    current = writer.create(Configuration.of(1, ["m1"]))
    assert seen.get(timeout=5) == 1
    current = writer.advance(current, ["m1", "m2"])
    assert seen.get(timeout=5) == 2
    watch.stop()
    writer.advance(current, ["m2"])
    with pytest.raises(queue.Empty):
        seen.get(timeout=0.3)


@pytest.mark.parametrize(
    "data",
    [
        b"not json",
        b"{}",
        b'{"epoch": 1, "matchers": "m1", "selector": {}}',
        b'{"epoch": 1, "matchers": ["m1"], "selector": {"kind": "ring"}}',
        b'{"epoch": 1, "matchers": ["m1"], '
        b'"selector": {"kind": "rendezvous", "version": 1, "owners": ["m2"]}}',
    ],
)
def test_unreadable_data_is_a_typed_error(client: KazooClient, data: bytes) -> None:
    client.create("/config", data)
    with pytest.raises(CorruptCoordinationData):
        ClusterConfiguration(client).read()


def test_a_configuration_without_layer_lists_reads_as_every_live_one() -> None:
    legacy = (
        b'{"epoch": 2, "matchers": ["m1"], "selector": '
        + json.dumps(RendezvousSelector(("m1",)).to_dict()).encode()
        + b"}"
    )
    configuration = Configuration.decode(legacy)
    assert configuration.exit_points == () and configuration.access_points == ()
    later = configuration.next(exit_points=["e1", "e2"])
    assert later.epoch == 3 and later.matchers == ("m1",)
    assert later.selector == configuration.selector and later.exit_points == ("e1", "e2")
    assert Configuration.decode(later.encode()) == later
    with pytest.raises(InvalidConfiguration, match="exit_points"):
        Configuration.of(1, ["m1"], exit_points=["e1", "e1"])
