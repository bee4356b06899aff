"""A matcher that hands large batches to Spark delivers exactly what the engine would.

One real cluster (one matcher started with ``--spark-offload``, which starts its own local
SparkSession), W-IoT subscriptions on three subscribers, publishers sending batches large
enough to go to Spark: every expected notification arrives exactly once and in order, also
after the subscriptions change between two rounds (the tables are rebuilt), and after
the matcher's Spark driver is killed (the engine takes the batches back: none lost).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from conftest import StartCluster

from broker.bench.workloads.iot import iot_subscriptions, iot_updates
from integration.conftest import (
    Recorder,
    assert_exact_delivery,
    publish_concurrently,
    wait_until,
)

_THRESHOLD = 40
_DEADLINE = 300.0  # a batch on Spark takes seconds on a busy machine


def _log(state_dir: Path) -> str:
    return (state_dir / "logs" / "matcher-1.log").read_text(errors="replace")


def _spark_drivers(cluster_name: str) -> list[int]:
    """The pids of the Spark driver JVMs started by the matchers of cluster ``cluster_name``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            command = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            parent = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1]
            parent_command = Path(f"/proc/{parent}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"org.apache.spark.deploy.SparkSubmit" in command and (
            b"matcher" in parent_command and cluster_name.encode() in parent_command
        ):
            found.append(int(entry))
    return found


def test_batches_matched_on_spark_are_delivered_exactly_once_in_order(
    start_cluster: StartCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SILBO_SPARK_DRIVER_MEMORY", "1g")
    monkeypatch.delenv("PYSPARK_SUBMIT_ARGS", raising=False)
    cluster = start_cluster(matchers=1, spark_offload=_THRESHOLD)
    wait_until(lambda: "Spark is ready" in _log(cluster.state_dir), 180, "Spark in the matcher")
    subscriptions = iot_subscriptions(240, seed=5, stations=40)
    updates = iot_updates(1800, seed=6, stations=40)
    recorders = [Recorder(cluster.endpoints, "r0")]
    try:
        recorders[0].subscribe(subscriptions[:120])
        first = publish_concurrently(
            cluster.endpoints, [updates[:600]], prefix="round1", batch_size=200
        )
        recorders[0].wait_for_markers((p.publisher for p in first), timeout=_DEADLINE)
        assert_exact_delivery(recorders[0], first)
        # the subscriptions change: the next batches must see the new ones (tables rebuilt)
        recorders.append(Recorder(cluster.endpoints, "r1"))
        recorders[1].subscribe(subscriptions[120:])
        second = publish_concurrently(
            cluster.endpoints, [updates[600:1200]], prefix="round2", batch_size=200
        )
        counts = []
        for recorder, rounds in zip(recorders, ([*first, *second], second), strict=True):
            recorder.wait_for_markers((p.publisher for p in second), timeout=_DEADLINE)
            counts.append(assert_exact_delivery(recorder, rounds))
        before = _log(cluster.state_dir)
        assert before.count("on Spark in") >= 2, f"no batch went to Spark:\n{before[-3000:]}"
        assert "Spark failed" not in before
        # Spark dies: the batches fall back on the engine, nothing is lost
        drivers = _spark_drivers(cluster.spec.cluster)
        assert drivers, "the matcher's Spark driver was not found"
        for pid in drivers:
            os.kill(pid, signal.SIGKILL)
        third = publish_concurrently(
            cluster.endpoints, [updates[1200:]], prefix="round3", batch_size=200
        )
        for recorder, rounds in zip(
            recorders, ([*first, *second, *third], [*second, *third]), strict=True
        ):
            recorder.wait_for_markers((p.publisher for p in third), timeout=_DEADLINE)
            counts.append(assert_exact_delivery(recorder, rounds))
    finally:
        for recorder in recorders:
            recorder.close()
    log = _log(cluster.state_dir)
    assert "Spark failed on a batch" in log, log[-3000:]
    assert min(counts) > 50
