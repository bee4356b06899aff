"""``silbo bench chaos`` as a user runs it: a short run with a matcher killed in the middle of
a scale, a killed ZooKeeper and a killed context store, its JSON, and its PNG: nothing lost,
duplicated or unexpected, for the gRPC subscriber and the HTTP subscriptions, and no entity
write lost, applied twice or missing an increment."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def test_a_short_chaos_run_reports_each_fault_and_loses_nothing_twice(tmp_path: Path) -> None:
    plot = tmp_path / "chaos.png"
    command = [sys.executable, "-m", "broker.cli", "bench", "chaos", "--count", "3"]
    command += ["--interval", "3", "--rate", "100", "--subscriptions", "30"]
    command += ["--faults", "scale-kill,zookeeper,context-store", "--json", "--plot", str(plot)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=400, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads(done.stdout)
    shown = {k: v for k, v in summary.items() if k != "delivered_per_second"}
    assert [f["fault"] for f in summary["faults"]] == ["scale-kill", "zookeeper", "context-store"]
    for fault in summary["faults"]:
        assert fault["detection_s"] is not None and fault["recovery_s"] is not None, shown
    scale = summary["faults"][0]
    assert scale["scale_out"] in ("completed", "rolled back"), shown
    assert scale["scale_back"] == "completed", shown  # a scale right after a failure completes
    assert summary["acknowledged"] == summary["published"] > 0, shown
    assert summary["delivered"] == summary["expected"] > 0, shown
    assert summary["lost"] == summary["duplicated"] == summary["unexpected"] == 0, shown
    http = summary["http"]
    assert http["subscriptions"] == 11 and http["delivered"] == http["expected"] > 0, shown
    assert http["lost"] == http["duplicated"] == http["unexpected"] == 0, shown
    store = summary["store"]
    assert summary["faults"][2]["registered_s"] is not None, shown
    assert store["read"] == store["entities"] == 200 and store["acknowledged"] > 0, shown
    assert store["store_lost"] == store["store_double"] == store["store_short"] == 0, shown
    assert plot.stat().st_size > 10_000


def test_bad_options_are_exit_2() -> None:
    command = [sys.executable, "-m", "broker.cli", "bench", "chaos", "--faults", "disk"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and "unknown faults ['disk']" in done.stderr
