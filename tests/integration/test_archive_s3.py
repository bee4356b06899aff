"""The archive on a real S3 protocol server (moto's: ``s3_server`` in tests/conftest.py): a
cluster whose archiver writes to ``s3://BUCKET/archive`` (docs/archive.md, "Where the
archive lives") is killed between a batch's objects and its cursors and restarted by the
supervisor: every acknowledged write is one row, none lost, none twice; ``silbo archive
status`` reads the bucket. (tests/integration/test_archive.py does the same on a local
directory, with a store killed too.)
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from conftest import S3Server
from ngsi.conftest import Front, fronts_of

from broker import cli
from broker.archive.files import MARKER
from broker.archive.location import ArchiveRoot, open_root
from broker.cluster import ClusterSpec, LocalCluster
from broker.commands.archive import archive_status
from broker.coordination.embedded import EmbeddedZooKeeper
from broker.roles.archiver import FAULT_ENV
from integration.conftest import Supervised

pytestmark = pytest.mark.slow

WAIT = 60.0


@pytest.fixture(scope="module")
def on_s3(
    zookeeper: EmbeddedZooKeeper, s3_server: S3Server, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Supervised, Front, ArchiveRoot]]:
    """1 store, an HTTP front, an archiver writing to S3 whose first batch is killed."""
    base = tmp_path_factory.mktemp("archive-s3")
    root = open_root(s3_server.uri(f"{s3_server.bucket()}/archive"))
    os.environ[FAULT_ENV] = str(base / "fault")  # read by the archiver only
    spec = ClusterSpec(
        zk=zookeeper.address,
        cluster=f"s3-{uuid.uuid4().hex[:8]}",
        grpc_port=0,
        http_port=0,
        matchers=1,
        context_stores=1,
        replicas=1,
        state_dir=base / "state",
        archive=root.uri,
        archive_interval=0.2,
    )
    cluster = LocalCluster(spec)
    try:
        cluster.start()
        del os.environ[FAULT_ENV]
        [front] = fronts_of(cluster)
        supervised = Supervised(cluster)
        try:
            yield supervised, front, root
        finally:
            supervised.close()
    finally:
        os.environ.pop(FAULT_ENV, None)
        cluster.stop()


def _write(front: Front, first: int, written: Counter[tuple[str, int]]) -> None:
    """Ten writes in one batch request (each its own change), acknowledged."""
    values = range(first, first + 10)
    entities = [
        {"id": f"E{i % 20}", "type": "T", "v": {"type": "Number", "value": i}} for i in values
    ]
    answer = front.call("POST", "/v2/op/update", {"actionType": "append", "entities": entities})
    assert answer.status == 204, answer
    written.update((f"E{i % 20}", i) for i in values)


def _rows(root: ArchiveRoot) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for name in root.files():
        if name.endswith(".parquet"):
            rows += pq.read_table(root.join(name), filesystem=root.filesystem).to_pylist()
    return rows


def test_every_acknowledged_write_is_one_row_on_s3_through_a_kill_of_the_archiver(
    on_s3: tuple[Supervised, Front, ArchiveRoot], capsys: pytest.CaptureFixture[str]
) -> None:
    supervised, front, root = on_s3
    cluster = supervised.cluster
    written: Counter[tuple[str, int]] = Counter()
    for first in range(0, 40, 10):
        _write(front, first, written)
    fault = Path(cluster.state_dir).parent / "fault"
    deadline = time.monotonic() + WAIT
    while not fault.exists():  # the first batch uploaded its objects, then was killed
        assert time.monotonic() < deadline, "the archiver's fault did not fire"
        time.sleep(0.1)
    for first in range(40, 60, 10):  # while the supervisor restarts the archiver
        _write(front, first, written)
    deadline = time.monotonic() + WAIT
    while True:
        status = archive_status(cluster.zk_address, cluster.spec.cluster)
        caught_up = status["rows"] >= len(written) and status["waiting"]["changes"] == 0
        if caught_up and status["archiver"]["pending"] is None:  # its last batch ended too
            break
        assert time.monotonic() < deadline, f"the archive does not catch up: {status}"
        time.sleep(0.2)
    rows = _rows(root)
    assert max(Counter((r["partition"], r["sequence"]) for r in rows).values()) == 1
    assert Counter((r["entity_id"], json.loads(r["entity"])["v"]["value"]) for r in rows) == written
    log = (cluster.state_dir / "logs" / "archiver-1.log").read_text()
    undone = re.search(r"batch 1 did not complete: its (\d+) files deleted", log)
    assert undone and int(undone[1]) >= 1, "the killed batch's objects were not deleted"
    assert "archiver (pid" in supervised.said.getvalue()
    assert root.read(root.join(MARKER)) is not None and status["root"] == root.uri
    assert status["rows"] == len(written) and status["archiver"]["pending"] is None
    state_dir = str(cluster.state_dir)
    assert cli.main(["archive", "status", "--state-dir", state_dir, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["files"], shown["rows"]) == (status["files"], len(written))
    missing = root.uri.replace("/archive?", "/elsewhere?")
    assert cli.main(["archive", "status", "--state-dir", state_dir, "--archive", missing]) == 2
    assert f"the archive directory {missing} does not exist" in capsys.readouterr().err
