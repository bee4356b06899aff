"""The archive with real processes (docs/archive.md): every acknowledged write is one row,
none lost, none twice, through a kill -9 of the archiver between a batch's files and its
cursors and a kill -9 of a store (its partitions fail over), both restarted by ``silbo
up``'s supervisor; ``silbo archive status`` says so; and what it refuses.
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from ngsi.conftest import Front, fronts_of

from broker import cli
from broker.archive.files import MARKER
from broker.cluster import ClusterSpec, LocalCluster
from broker.commands.archive import archive_status
from broker.coordination.embedded import EmbeddedZooKeeper
from broker.errors import SilboError
from broker.roles.archiver import FAULT_ENV
from broker.runtime.options import Role
from integration.conftest import Supervised

pytestmark = pytest.mark.slow

WAIT = 60.0


@pytest.fixture(scope="module")
def archived(
    zookeeper: EmbeddedZooKeeper, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Supervised, Front]]:
    """2 stores (2 replicas), an HTTP front, an archiver whose first batch is killed."""
    base = tmp_path_factory.mktemp("archive")
    os.environ[FAULT_ENV] = str(base / "fault")  # read by the archiver only
    spec = ClusterSpec(
        zk=zookeeper.address,
        cluster=f"ar-{uuid.uuid4().hex[:8]}",
        grpc_port=0,
        http_port=0,
        matchers=1,
        context_stores=2,
        replicas=2,
        state_dir=base / "state",
        archive=str(base / "archive"),
        archive_interval=0.2,
    )
    cluster = LocalCluster(spec)
    try:
        cluster.start()
        del os.environ[FAULT_ENV]
        [front] = fronts_of(cluster)
        supervised = Supervised(cluster)
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


def _caught_up(supervised: Supervised, count: int) -> dict[str, Any]:
    cluster = supervised.cluster
    deadline = time.monotonic() + WAIT
    while True:
        try:
            status: dict[str, Any] | None = archive_status(cluster.zk_address, cluster.spec.cluster)
        except SilboError:  # a store asked while its partitions move (failover, failback)
            status = None
        waiting = status["waiting"] if status else {}
        if (
            status
            and status["rows"] >= count
            and waiting["changes"] == 0
            and status["archiver"]["pending"] is None
            # every partition counted, by both stores: the killed one is back
            and not waiting["partitions_without_primary"]
            and len(waiting["by_store"]) == 2
        ):
            return status
        assert time.monotonic() < deadline, f"the archive does not catch up: {status}"
        time.sleep(0.2)


def test_every_acknowledged_write_is_archived_once_through_kills_of_archiver_and_store(
    archived: tuple[Supervised, Front], capsys: pytest.CaptureFixture[str]
) -> None:
    supervised, front = archived
    written: Counter[tuple[str, int]] = Counter()
    for i in range(60):
        _write(front, i, written)
    fault = Path(os.path.dirname(Path(supervised.cluster.spec.archive))) / "fault"
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
    rows = _rows(Path(supervised.cluster.spec.archive))
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
    archived: tuple[Supervised, Front],
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
    assert (Path(supervised.cluster.spec.archive) / MARKER).is_file()
