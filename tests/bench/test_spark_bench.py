"""``silbo bench spark``: one tiny run through the command's function, and its bad arguments.

The run checks what is reported (keys, matches agreeing on both sides), never how fast.
"""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from broker.bench import spark as bench
from broker.cli import build_parser, main


def _args(*extra: str) -> argparse.Namespace:
    return build_parser().parse_args(
        ["bench", "spark", "--workload", "iot", "-n", "300", "-m", "200", *extra]
    )


@pytest.fixture(scope="module")
def report(spark: Any) -> dict[str, Any]:
    return bench.benchmark(_args("--partitions", "1,2", "--runs", "1"), spark=spark)


def test_a_tiny_run_reports_both_sides_and_they_agree(report: dict[str, Any]) -> None:
    assert {
        "benchmark", "workload", "subscriptions", "updates", "runs", "batch", "seed",
        "master", "partitions", "matches", "matches_agree", "generation_s", "write_s",
        "engine", "spark", "session_s", "warmup_s", "machine", "command",
    } <= set(report)  # fmt: skip
    assert (report["workload"], report["subscriptions"], report["updates"]) == ("iot", 300, 200)
    assert report["partitions"] == [1, 2] and report["matches_agree"] is True
    assert report["matches"] > 0
    engine = report["engine"]
    assert engine["matches"] == report["matches"]
    assert len(engine["runs"]) == 1 and engine["match_s"] > 0 and engine["updates_per_s"] > 0
    assert report["methods"] == ["engine", "join"]
    assert [(s["method"], s["partitions"]) for s in report["spark"]] == [
        ("engine", 1), ("engine", 2), ("join", 1), ("join", 2),
    ]  # fmt: skip
    for side in report["spark"]:
        assert side["matches"] == report["matches"]
        assert side["total_s"] == pytest.approx(side["planning_s"] + side["job_s"])
        assert side["updates_per_s"] > 0 and side["ratio"] > 0 and side["job_ratio"] > 0
        assert [r["matches"] for r in side["runs"]] == [report["matches"]]


def test_a_mismatch_fails_loudly(
    spark: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = bench._engine_pass

    def off_by_one(*args: Any) -> tuple[float, int]:
        seconds, matches = real(*args)
        return seconds, matches + 1

    monkeypatch.setattr(bench, "_engine_pass", off_by_one)
    args = _args("-n", "50", "-m", "20", "--runs", "1", "--methods", "engine", "--quiet")
    assert bench.run(args) == 1  # the process's session: the fixture's
    err = capsys.readouterr().err
    assert "MISMATCH" in err and "Spark found" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--partitions", "0"], "every count must be at least 1"),
        (["--partitions", "1,0"], "every count must be at least 1"),
        (["--partitions", "two"], "expected P[,P2,...]"),
        (["--methods", "engine,fast"], "expected some of engine, join"),
        (["--methods", ""], "expected some of engine, join"),
        (["--workload", "nope"], "invalid choice: 'nope'"),
        (["--runs", "0"], "must be at least 1"),
    ],
)
def test_bad_arguments_exit_2_with_a_clear_message(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["bench", "spark", "--workload", "iot", "-n", "10", "-m", "10", *argv])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_the_function_refuses_bad_arguments_too() -> None:
    with pytest.raises(ValueError, match="unknown workload 'text'"):
        bench.benchmark(argparse.Namespace(**{**vars(_args()), "workload": "text"}))
    with pytest.raises(ValueError, match="at least 1"):
        bench.benchmark(argparse.Namespace(**{**vars(_args()), "partitions": [0]}))
    with pytest.raises(ValueError, match="expected some of engine, join"):
        bench.benchmark(argparse.Namespace(**{**vars(_args()), "methods": ["fast"]}))
    assert bench.parse_partitions("1,2,4") == [1, 2, 4]
    assert bench.parse_methods("join,engine,join") == ["join", "engine"]
