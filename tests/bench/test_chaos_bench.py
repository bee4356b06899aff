"""``silbo bench chaos`` as a user runs it: a short run with one fault of each kind it can
inject quickly (a killed matcher and a killed ZooKeeper), its JSON, and its PNG."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def test_a_short_chaos_run_reports_each_fault_and_loses_nothing_twice(tmp_path: Path) -> None:
    plot = tmp_path / "chaos.png"
    command = [sys.executable, "-m", "broker.cli", "bench", "chaos", "--duration", "14"]
    command += ["--interval", "8", "--rate", "100", "--subscriptions", "30"]
    command += ["--faults", "matcher,zookeeper", "--json", "--plot", str(plot)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=400, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    shown = {k: v for k, v in summary.items() if k != "delivered_per_second"}
    assert [f["fault"] for f in summary["faults"]] == ["matcher", "zookeeper"]
    for fault in summary["faults"]:
        assert fault["detection_s"] is not None and fault["recovery_s"] is not None, shown
    assert summary["duplicated"] == 0 and summary["unexpected"] == 0, shown
    assert summary["acknowledged"] == summary["published"] > 0, shown
    assert summary["delivered"] + summary["lost"] == summary["expected"] > 0, shown
    assert summary["lost"] <= 0.1 * summary["expected"], shown
    assert plot.stat().st_size > 10_000


def test_bad_options_are_exit_2() -> None:
    command = [sys.executable, "-m", "broker.cli", "bench", "chaos", "--faults", "disk"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and "unknown faults ['disk']" in done.stderr
