"""``silbo bench scale``: its arguments, the record of one scale, and one short real run.

The real run is the command as a user runs it (a subprocess), on tiny sizes, against the
test session's ZooKeeper: 2,000 W-IoT subscriptions, matchers 1 -> 2 -> 1, a few seconds
per phase. It checks what the run reports, never how fast it was.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from broker.bench.scale import ScaleRecord
from broker.cli import main
from broker.coordination.coordinator import ScaleOutcome
from broker.coordination.embedded import EmbeddedZooKeeper

# these tests start processes (ZooKeeper, silbo, a cluster)
pytestmark = pytest.mark.slow

SUBSCRIPTIONS = 2000

Run = tuple[subprocess.CompletedProcess[str], Path]  # the finished command, its --out


@pytest.mark.parametrize(
    ("steps", "message"),
    [
        ("2", "at least two matcher counts"),
        ("2,0", "at least two matcher counts, each at least 1"),
        ("2,2,4", "consecutive counts must differ"),
        ("2,four", "not a comma-separated list"),
    ],
)
def test_bad_steps_exit_2_before_anything_starts(
    steps: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "scale", "--steps", steps]) == 2
    assert message in capsys.readouterr().err


def test_a_scale_record_reports_its_times_from_the_first_publish() -> None:
    outcome = ScaleOutcome("completed", 0.25, 1000, 128_000, 0.0, 2)
    record = ScaleRecord(2, 4, outcome, 100.0, 101.5, 101.75, 102.0)
    report = record.report(origin=80.0)
    assert report["from"] == 2 and report["to"] == 4
    assert report["outcome"] == "completed" and report["epoch"] == 2
    assert report["moved_subscriptions"] == 1000 and report["moved_bytes"] == 128_000
    assert (report["began_s"], report["protocol_began_s"], report["ended_s"]) == (20, 21.5, 22)
    assert report["processes_s"] == 1.75  # starting new processes, stopping leaving ones
    assert record.window(80.0).protocol_ended == 21.75
    assert record.summary_line().startswith("2->4: completed in 0.25 s, 1,000 subscriptions")


def _short_run(zookeeper: EmbeddedZooKeeper, out: Path) -> Run:
    done = subprocess.run(
        [
            sys.executable, "-m", "broker.cli", "bench", "scale",
            "--subscriptions", str(SUBSCRIPTIONS), "--steps", "1,2,1", "--phase", "3",
            "--rate", "200", "--batch", "20", "--zk", zookeeper.address, "--replicas", "1",
            "--out", str(out), "--state-dir", str(out / "state"), "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )  # fmt: skip
    return done, out


def test_a_short_run_scales_out_and_in_and_delivers_exactly(
    zookeeper: EmbeddedZooKeeper, tmp_path: Path
) -> None:
    # one run, checked three ways (a fixture shared by three tests ran once per xdist worker)
    done, out = _short_run(zookeeper, tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    summary = json.loads(done.stdout)
    check = summary["verification"]
    assert check["ok"] and check["drained"]
    assert check["expected"] == check["delivered"] > 1000
    assert check["lost"] == check["duplicated"] == check["unexpected"] == 0
    assert check["out_of_order"] == 0
    assert [(s["from"], s["to"], s["outcome"]) for s in summary["scales"]] == [
        (1, 2, "completed"),
        (2, 1, "completed"),
    ]
    assert [s["epoch"] for s in summary["scales"]] == [2, 3]
    for scale in summary["scales"]:
        # one copy each (--replicas 1): about half of them change owner between one matcher
        # and two, not all
        assert SUBSCRIPTIONS * 0.3 < scale["moved_subscriptions"] < SUBSCRIPTIONS * 0.7
        assert scale["moved_bytes"] > scale["moved_subscriptions"]
        assert scale["began_s"] <= scale["protocol_began_s"] <= scale["protocol_ended_s"]
        assert scale["protocol_ended_s"] <= scale["ended_s"]
    assert summary["ok"] is True
    _check_shape(done, out)
    assert (out / "scale.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # the time line


def _check_shape(done: subprocess.CompletedProcess[str], out: Path) -> None:
    """The summary has the documented shape (scale.json and stdout alike)."""
    summary = json.loads((out / "scale.json").read_text())
    assert summary == json.loads(done.stdout)
    assert set(summary) == {
        "benchmark", "command", "commit", "machine", "workload", "series", "scales",
        "verification", "ok",
    }  # fmt: skip
    assert summary["command"].startswith("silbo bench scale --subscriptions 2000")
    assert summary["workload"]["steps"] == [1, 2, 1]
    assert summary["machine"]["cores"] >= 1
    series = summary["series"]
    keys = {"t", "offered_per_s", "updates_per_s", "p50_ms", "p99_ms", "matchers"}
    assert set(series) == keys
    assert len({len(column) for column in series.values()}) == 1
    assert len(series["t"]) >= 9  # three phases of 3 s
    assert sum(series["offered_per_s"]) <= summary["verification"]["published"]
    assert set(series["matchers"]) == {1.0, 2.0}
    per_scale = {
        "from", "to", "outcome", "duration_s", "moved_subscriptions", "moved_bytes",
        "no_matching_ms", "epoch", "message", "began_s", "protocol_began_s",
        "protocol_ended_s", "ended_s", "processes_s", "before_per_s", "during_per_s",
        "operation_per_s", "after_per_s", "ratio", "longest_gap_ms", "gap_before_ms",
    }  # fmt: skip
    for scale in summary["scales"]:
        assert set(scale) == per_scale
