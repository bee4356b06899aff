"""The ``silbo`` command line: the benchmark's JSON, the demo, and argument errors.

The commands run as subprocesses (``python -m broker.cli``), as a user runs them, on small
workloads; argument errors are also checked in-process through ``main``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import broker
from broker import cli
from broker.cli import main

# these tests start processes (ZooKeeper, silbo, a cluster)
pytestmark = pytest.mark.slow

_TIMEOUT = 120


def _silbo(*arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "broker.cli", *arguments],
        capture_output=True,
        text=True,
        timeout=_TIMEOUT,
        check=False,
    )


@pytest.fixture(scope="module")
def iot_report() -> dict[str, Any]:
    done = _silbo(
        "bench", "match", "--workload", "iot", "--subscriptions", "500",
        "--updates", "200", "--runs", "1", "--baseline", "50", "--batch", "50",
        "--churn", "20", "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def test_bench_match_json_has_the_figures(iot_report: dict[str, Any]) -> None:
    for key in ("events_per_s", "ms_per_event", "build_s", "bytes_per_subscription"):
        assert isinstance(iot_report[key], int | float), key
        assert iot_report[key] > 0, key
    assert iot_report["workload"] == "iot"
    assert iot_report["engine"] == "indexed"
    assert (iot_report["subscriptions"], iot_report["updates"], iot_report["runs"]) == (500, 200, 1)
    assert iot_report["ms_per_event"] == pytest.approx(1000 / iot_report["events_per_s"])
    assert 0 < iot_report["matches_per_event"] < 10  # ~0.4% of 500 subscriptions
    assert iot_report["memory_method"] == "tracemalloc"
    assert iot_report["command"].startswith("silbo bench match --workload iot")


def test_bench_match_compares_with_the_reference_in_the_same_run(
    iot_report: dict[str, Any],
) -> None:
    assert iot_report["baseline_updates"] == 50
    assert iot_report["baseline_mismatches"] == 0
    assert iot_report["speedup"] > 1
    assert iot_report["baseline_events_per_s"] > 0
    assert iot_report["events_per_s_ids"] > 0
    assert iot_report["subscription_object_bytes"] > 0


def test_bench_match_measures_matching_while_subscriptions_change(
    iot_report: dict[str, Any],
) -> None:
    assert iot_report["churn"] == 20
    assert iot_report["churn_events_per_s"] > 0
    assert iot_report["churn_changes_per_s"] > 0


def test_bench_match_json_names_the_machine(iot_report: dict[str, Any]) -> None:
    machine = iot_report["machine"]
    assert machine["cores"] >= 1
    assert machine["python"].count(".") == 2
    assert machine["cpu_model"]


def test_bench_match_prints_a_table_and_progress() -> None:
    done = _silbo(
        "bench", "match", "--workload", "dense", "-n", "200", "-m", "50", "-r", "2",
        "--engine", "reference", "--memory", "rss",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "events/s (median)" in done.stdout
    assert "(rss)" in done.stdout
    assert "[bench match] generating" in done.stderr


def test_version() -> None:
    done = _silbo("--version")
    assert done.returncode == 0
    assert done.stdout == f"silbo {broker.__version__}\n"


def test_demo_runs_small_and_agrees() -> None:
    done = _silbo("demo-engine", "--subscriptions", "400", "--updates", "300", "--verify", "50")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "verified: 50 updates" in done.stdout
    assert "0 mismatches" in done.stdout


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ([], "required: COMMAND"),
        (["bench"], "required: BENCHMARK"),
        (["bench", "match", "--subscriptions", "10"], "required: --workload"),
        (["bench", "match", "--workload", "nope", "-n", "10"], "invalid choice: 'nope'"),
        (["bench", "match", "--workload", "iot", "-n", "0"], "must be at least 1"),
        (["bench", "match", "--workload", "iot", "-n", "ten"], "expected a whole number"),
        (["bench", "match", "--workload", "iot", "-n", "5", "--engine", "x"], "invalid choice"),
        (["bench", "match", "--workload", "iot", "-n", "5", "--seed", "-1"], "at least 0"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
    ],
)
def test_bad_arguments_exit_2_with_a_clear_message(
    arguments: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(arguments)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_bad_arguments_fail_the_process_too() -> None:
    done = _silbo("bench", "match", "--workload", "nope", "--subscriptions", "10")
    assert done.returncode == 2
    assert "usage: silbo bench match" in done.stderr


def _scale_lines(logs: Path) -> str:
    """What the cluster's processes logged about scales (a failed demo's likely story)."""
    lines = []
    for log in sorted(logs.glob("*.log")):
        lines += [f"{log.stem}: {line}" for line in log.read_text().splitlines() if "scale" in line]
    return "\n".join(["", "scale lines of the processes' logs:", *lines[-200:]])


def test_the_cluster_demo_runs_short_and_verifies(tmp_path: Path) -> None:
    done = _silbo(
        "demo",
        "--duration",
        "3",
        "--subscriptions",
        "200",
        "--rate",
        "120",
        "--state-dir",
        str(tmp_path / "demo"),
        "--log-level",
        "INFO",
    )
    assert done.returncode == 0, done.stdout + done.stderr + _scale_lines(tmp_path / "demo/logs")
    assert "verification summary" in done.stdout
    assert "every notification delivered exactly once, in order" in done.stdout
    lines = {
        line.split("  ")[1].strip(): line.rsplit(" ", 1)[-1]
        for line in done.stdout.splitlines()
        if line.startswith("  ") and line.strip()[0].isalpha() and "result" not in line
    }
    assert int(lines["updates published"].replace(",", "")) > 100
    assert lines["lost"] == "0" and lines["duplicated"] == "0"


def test_the_listed_help_is_each_commands_own() -> None:
    """cli.py lists commands without importing them: its one-liners must say what the
    commands' own parsers say."""
    from broker.commands import backfill, down, replay, up

    listed = {name: text for name, text, _where in cli._COMMANDS}
    assert listed["up"] == up.HELP and listed["down"] == down.HELP
    assert listed["replay"] == replay.HELP and listed["backfill"] == backfill.HELP


def test_a_broker_process_does_not_import_the_benchmarks() -> None:
    code = (
        "import sys; from broker.cli import build_parser; "
        "build_parser(['run', 'matcher']); "
        "print(sorted(m for m in sys.modules if m.startswith(('broker.bench', 'broker.demo'))))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
