"""A matcher that hands large batches to Spark delivers exactly what the engine would.

One real cluster (one matcher started with ``--spark-offload``, which starts its own local
SparkSession), W-IoT subscriptions on three subscribers, publishers sending batches large
enough to go to Spark: every expected notification arrives exactly once and in order, also
after the subscriptions change between two rounds (the tables are rebuilt).
"""

from __future__ import annotations

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


def test_batches_matched_on_spark_are_delivered_exactly_once_in_order(
    start_cluster: StartCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SILBO_SPARK_DRIVER_MEMORY", "1g")
    monkeypatch.delenv("PYSPARK_SUBMIT_ARGS", raising=False)
    cluster = start_cluster(matchers=1, spark_offload=_THRESHOLD)
    wait_until(lambda: "Spark is ready" in _log(cluster.state_dir), 180, "Spark in the matcher")
    subscriptions = iot_subscriptions(240, seed=5, stations=40)
    updates = iot_updates(1200, seed=6, stations=40)
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
            cluster.endpoints, [updates[600:]], prefix="round2", batch_size=200
        )
        counts = []
        for recorder, rounds in zip(recorders, ([*first, *second], second), strict=True):
            recorder.wait_for_markers((p.publisher for p in second), timeout=_DEADLINE)
            counts.append(assert_exact_delivery(recorder, rounds))
    finally:
        for recorder in recorders:
            recorder.close()
    log = _log(cluster.state_dir)
    offloaded = log.count("on Spark in")
    assert offloaded >= 2, f"no batch went to Spark:\n{log[-3000:]}"
    assert "Spark failed" not in log
    assert min(counts) > 50
