"""``silbo bench store-scale``: one tiny real run as a user runs it, its bad options, and the
oracle's arithmetic.

The real run is the command in a subprocess: 1,500 W-IoT entities, context stores 1 -> 2 ->
1, 150 writes/s, 3 s phases. It checks what the run reports (the shape, every scale
completed, the oracle at zero), never how fast it was.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from broker.bench.store_scale import Series, check, steps_argument
from broker.bench.store_scale_load import OK, REFUSED, write_of
from broker.cli import main
from broker.store.semantics import Mode

ENTITIES = 1500


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str, Path]:
    out = tmp_path_factory.mktemp("bench-store-scale")
    plot = out / "store-scale.png"
    done = subprocess.run(
        [
            sys.executable, "-m", "broker.cli", "bench", "store-scale",
            "--entities", str(ENTITIES), "--steps", "1,2,1", "--rate", "150",
            "--read-rate", "20", "--phase", "3", "--dir", str(out), "--json", "--plot", str(plot),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return json.loads(done.stdout), done.stderr, out


def series_acknowledged(summary: dict[str, Any]) -> int:
    """The writes acknowledged in the run: each keeps an outcome key in its partition."""
    return sum(int(series["acknowledged"]) for series in summary["series"])


@pytest.mark.slow  # a local cluster (ZooKeeper, stores, a front), a store started and stopped
def test_a_tiny_run_scales_out_and_in_and_loses_nothing(
    tiny_run: tuple[dict[str, Any], str, Path],
) -> None:
    summary, stderr, out = tiny_run
    assert summary["ok"] is True
    assert summary["lost"] == summary["doubled"] == summary["stale"] == summary["missing"] == 0
    assert summary["read_errors"] == 0 and summary["refused"] >= 0
    assert [(s["size"], s["from"], s["to"], s["outcome"]) for s in summary["scales"]] == [
        (ENTITIES, 1, 2, "completed"),
        (ENTITIES, 2, 1, "completed"),
    ]
    for scale in summary["scales"]:
        # one copy of each partition: about half of them change store between one and two,
        # with their documents and the outcomes of the writes kept for retries (120 s)
        kept = ENTITIES + series_acknowledged(summary)
        assert 0.3 * ENTITIES < scale["moved_keys"] < 0.7 * kept
        assert scale["moved_bytes"] > scale["moved_keys"] and scale["seconds"] > 0
        assert scale["began_s"] < scale["ended_s"]
        assert {"writes_acknowledged", "writes_refused", "write_p99_ms", "get_p99_ms"} <= set(scale)
    (series,) = summary["series"]
    assert series["size"] == ENTITIES and series["acknowledged"] > 1000
    assert series["writes"]["acknowledged"] == series["acknowledged"]
    assert series["reads"]["reads"] > 50
    assert [count for _at, count in series["stores"]] == [1, 2, 1]
    timeline = series["timeline"]
    assert len({len(column) for column in timeline.values()}) == 1 and len(timeline["t"]) >= 9
    assert set(timeline["stores"]) == {1.0, 2.0}
    assert summary["machine"]["cores"] >= 1 and "bench store-scale" in summary["command"]
    assert (out / "store-scale.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "[bench store-scale]" in stderr  # progress
    assert [p.name for p in out.iterdir()] == ["store-scale.png"]  # the cluster was removed


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--steps", "2"], "at least two store counts"),
        (["--steps", "1,1,2"], "consecutive counts must differ"),
        (["--steps", "1,two"], "not a comma-separated list"),
        (["--steps", "1,2", "--replicas", "2"], "at least --replicas (2)"),
    ],
)
def test_bad_steps_exit_2_before_anything_starts(
    options: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "store-scale", *options]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--entities", "100,0", "expected whole numbers"),
        ("--rate", "0", "must be at least 1"),
        ("--phase", "0", "must be more than 0"),
    ],
)
def test_bad_options_exit_2(
    option: str, value: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["bench", "store-scale", option, value])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_steps_are_store_counts() -> None:
    assert steps_argument("1,2,3,1", 1) == [1, 2, 3, 1]
    assert steps_argument("2,3,2", 2) == [2, 3, 2]


def test_a_write_increments_a_counter_and_records_its_sequence() -> None:
    write = write_of("t", 1007, 1000)
    assert write.mode is Mode.APPEND and write.entity_id.endswith("0000007")
    assert write.attributes["n"]["value"] == {"$inc": 1}
    assert write.attributes["v"]["value"] == 1007


def _series(calls: list[tuple[float, float, int, int, int]], size: int = 10) -> Series:
    series = Series(size)
    series.calls = np.array(calls, dtype=np.float64).reshape(-1, 5)
    return series


def test_the_oracle_counts_lost_doubled_and_stale_writes() -> None:
    # writes 0..5 over 3 entities: entity 0 gets 0 and 3, entity 1 gets 1 and 4, entity 2
    # gets 2 and 5; the call of writes 4 and 5 was refused (applied or not: both allowed)
    series = _series([(0, 0.01, 0, 4, OK), (0, 0.01, 4, 2, REFUSED)])
    exact = {"values": [(2, 3), (1, 1), (2, 5)], "count": 10}
    assert check(series, exact, 3) == {
        "written": 3, "acknowledged": 4, "refused": 2, "write_errors": 0, "lost": 0,
        "doubled": 0, "stale": 0, "missing": 0,
    }  # fmt: skip
    wrong = {"values": [(1, 3), (3, 4), None], "count": 9}
    found = check(series, wrong, 3)
    # entity 0 lost one increment, entity 1 has one more than its 1 acknowledged and 1
    # refused, entity 2 is gone (its 1 acknowledged increment lost), one entity missing
    assert (found["lost"], found["doubled"], found["stale"], found["missing"]) == (2, 1, 0, 1)
    stale = {"values": [(2, 0), (1, 1), (1, 2)], "count": 10}
    assert check(series, stale, 3)["stale"] == 1  # entity 0's v is not its last write (3)
