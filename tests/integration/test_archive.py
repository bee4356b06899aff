"""The archive with real processes (docs/archive.md): every acknowledged write is one row,
none lost, none twice, through a kill -9 of the archiver between a batch's files and its
cursors and a kill -9 of a store (its partitions fail over), both restarted by ``silbo
up``'s supervisor; ``silbo archive status`` says so; and what it refuses.
"""

from __future__ import annotations

import io
import json
import os
import signal
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from ngsi.conftest import Front, free_port

from broker import cli
from broker.archive.files import MARKER
from broker.cluster import ClusterSpec, LocalCluster
from broker.cluster.supervisor import CHECK_INTERVAL, Supervisor
from broker.commands.archive import archive_status
from broker.coordination.embedded import EmbeddedZooKeeper
from broker.roles.archiver import FAULT_ENV
from broker.runtime.options import Role

pytestmark = pytest.mark.slow

WAIT = 60.0


class _Supervised:
    """A cluster with archive, its supervisor checking in a thread (as ``silbo up``)."""

    def __init__(self, cluster: LocalCluster, root: Path) -> None:
        self.cluster = cluster
        self.root = root
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
        described = json.loads((self.cluster.state_dir / "cluster.json").read_text())
        (entry,) = [
            p
            for p in described["processes"]
            if p["role"] == role.value and p["log"].endswith(f"-{number}.log")
        ]
        return int(entry["pid"])


@pytest.fixture(scope="module")
def archived(
    zookeeper: EmbeddedZooKeeper, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[_Supervised, Front]]:
    """2 stores (2 replicas), an HTTP front, an archiver whose first batch is killed."""
    base = tmp_path_factory.mktemp("archive")
    os.environ[FAULT_ENV] = str(base / "fault")  # read by the archiver only
    spec = ClusterSpec(
        zk=zookeeper.address,
        cluster=f"ar-{uuid.uuid4().hex[:8]}",
        grpc_port=0,
        http_port=free_port(),
        matchers=1,
        context_stores=2,
        replicas=2,
        state_dir=base / "state",
        archive=str(base / "archive"),
        archive_interval=0.2,
    )
    cluster = LocalCluster(spec)
    try:
        described = cluster.start()
        del os.environ[FAULT_ENV]
        front = Front(described["http_endpoints"][0], cluster)
        front.wait_serving()
        supervised = _Supervised(cluster, base / "archive")
        try:
            yield supervised, front
        finally:
            supervised.close()
    finally:
        os.environ.pop(FAULT_ENV, None)
        cluster.stop()


def _write(front: Front, i: int, written: Counter[tuple[str, int]]) -> None:
    entity_id = f"E{i % 40}"
    body = {"id": entity_id, "type": "T", "v": {"type": "Number", "value": i}}
    answer = front.call("POST", "/v2/entities?options=upsert", body)
    assert answer.status in (201, 204), answer
    written[(entity_id, i)] += 1


def _rows(root: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for path in sorted(root.glob("tenant=*/day=*/type=*/*.parquet")):
        rows += pq.read_table(path).to_pylist()
    return rows


def _caught_up(supervised: _Supervised, count: int) -> dict[str, Any]:
    cluster = supervised.cluster
    deadline = time.monotonic() + WAIT
    while True:
        status = archive_status(cluster.zk_address, cluster.spec.cluster)
        if status["rows"] >= count and status["waiting"]["changes"] == 0:
            return status
        assert time.monotonic() < deadline, f"the archive does not catch up: {status}"
        time.sleep(0.2)


def test_every_acknowledged_write_is_archived_once_through_kills_of_archiver_and_store(
    archived: tuple[_Supervised, Front], capsys: pytest.CaptureFixture[str]
) -> None:
    supervised, front = archived
    written: Counter[tuple[str, int]] = Counter()
    for i in range(60):
        _write(front, i, written)
    fault = Path(os.path.dirname(supervised.root)) / "fault"
    deadline = time.monotonic() + WAIT
    while not fault.exists():  # the first batch wrote its files, then was killed
        assert time.monotonic() < deadline, "the archiver's fault did not fire"
        time.sleep(0.1)
    for i in range(60, 90):  # while the supervisor restarts the archiver
        _write(front, i, written)
    os.kill(supervised.pid(Role.CONTEXT_STORE, 1), signal.SIGKILL)  # its partitions fail over
    for i in range(90, 150):
        _write(front, i, written)
    status = _caught_up(supervised, len(written))
    rows = _rows(supervised.root)
    keys = Counter((r["partition"], r["sequence"]) for r in rows)
    assert max(keys.values()) == 1, "a change archived twice"
    assert Counter((r["entity_id"], json.loads(r["entity"])["v"]["value"]) for r in rows) == written
    for entity in {r["entity_id"] for r in rows}:  # an entity's order: by time, by sequence
        mine = sorted(
            (r["time"], r["sequence"], r["alteration"]) for r in rows if r["entity_id"] == entity
        )
        assert [s for _t, s, _a in mine] == sorted(s for _t, s, _a in mine)
        assert mine[0][2] == "entityCreate"
    assert (
        "did not complete" in (supervised.cluster.state_dir / "logs" / "archiver-1.log").read_text()
    )
    said = supervised.said.getvalue()  # both restarted by the supervisor
    assert "archiver (pid" in said and "context-store (pid" in said
    assert status["archiver"]["running"] and status["archiver"]["pending"] is None
    assert status["rows"] == len(written) and status["days"][0]["tenant"] == "_"
    state_dir = str(supervised.cluster.state_dir)
    assert cli.main(["archive", "status", "--state-dir", state_dir, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["rows"] == len(written) and shown["waiting"]["changes"] == 0
    assert cli.main(["archive", "status", "--state-dir", state_dir]) == 0
    assert f"{len(written)} changes archived" in capsys.readouterr().out


def test_archive_status_of_a_cluster_without_archive_and_a_path_that_is_not_one(
    archived: tuple[_Supervised, Front],
    zookeeper: EmbeddedZooKeeper,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    supervised, _front = archived
    other = f"none-{uuid.uuid4().hex[:8]}"
    assert cli.main(["archive", "status", "--zk", zookeeper.address, "--cluster", other]) == 2
    assert f"cluster {other} has no archive" in capsys.readouterr().err
    assert cli.main(["archive", "status", "--state-dir", str(tmp_path)]) == 2
    assert "no cluster described" in capsys.readouterr().err
    state_dir = str(supervised.cluster.state_dir)
    missing = str(tmp_path / "missing")
    assert cli.main(["archive", "status", "--state-dir", state_dir, "--archive", missing]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert (supervised.root / MARKER).is_file()
