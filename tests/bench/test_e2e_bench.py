"""``silbo bench e2e``: a short comparison of 1 and 2 replicas runs whole, delivers exactly,
and reports both medians and their ratio; bad options exit 2 before anything starts."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from broker.bench.e2e import expected_pairs, stored_pool
from broker.cli import main
from broker.model.update import ContextUpdate

pytestmark = pytest.mark.slow


def test_replicas_1_and_2_compared_in_one_run_deliver_exactly() -> None:
    done = subprocess.run(
        [
            sys.executable, "-m", "broker.cli", "bench", "e2e", "--subscriptions", "300",
            "--rate", "400", "--duration", "3", "--warmup", "1", "--batch", "50",
            "--replicas", "1,2", "--json",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert set(summary["by_replicas"]) == {"1", "2"}
    for count, report in summary["by_replicas"].items():
        assert report["replicas"] == int(count)
        assert report["expected"] == report["deliveries"] > 100
        assert report["lost"] == report["duplicated"] == report["unexpected"] == 0
        assert report["out_of_order"] == 0
    one, two = summary["by_replicas"]["1"], summary["by_replicas"]["2"]
    assert summary["throughput_ratio"] == round(two["updates_per_s"] / one["updates_per_s"], 3)


@pytest.mark.parametrize("replicas", ["0", "two", "1,,2"])
def test_bad_replicas_exit_2(replicas: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "e2e", "--replicas", replicas]) == 2
    assert "--replicas must be a positive integer" in capsys.readouterr().err


def test_the_store_oracle_merges_each_entity_and_repeats_its_second_pass() -> None:
    pool = [
        ContextUpdate.of("A", {"t": 1}),
        ContextUpdate.of("B", {"t": 2}),
        ContextUpdate.of("A", {"h": 3}),
    ]
    stored = stored_pool(pool)
    assert [dict((n, a.value) for n, a in u.attributes.items()) for u in stored] == [
        {"t": 1}, {"t": 2}, {"t": 1, "h": 3},  # the first pass: A has no h yet
        {"t": 1, "h": 3}, {"t": 2}, {"t": 1, "h": 3},  # the second pass, repeated for ever
    ]  # fmt: skip
    per_update = [np.array([i], dtype=np.int64) for i in range(len(stored))]
    pairs = expected_pairs(per_update, published=10, period=len(pool))
    # sequence s carries stored update s - 1 for two passes, then the second pass again
    assert [int(p) % (1 << 24) for p in pairs] == [0, 1, 2, 3, 4, 5, 3, 4, 5, 3]


def test_store_with_a_running_cluster_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "e2e", "--store", "--state-dir", "/nonexistent"]) == 2
    assert "--store needs a cluster of its own" in capsys.readouterr().err
