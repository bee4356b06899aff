"""``silbo bench derived``: one tiny real run as a user runs it (both use cases, one store, a
low rate: every window written once with the right count), its bad options, and the
oracle, the judgement and the search on made-up records (broker/bench/derived_oracle.py).

The real run is the command in a subprocess: 40 sensors, 1 store, one step of 2 s at 100
updates/s per use case. It checks what the run reports, never how fast it was.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from broker.bench.derived_load import Arrival, Published, Workload, power_of
from broker.bench.derived_oracle import check, complete, judge, search, span, windows_due
from broker.cli import main
from broker.store.aggregation import parse_definition


@pytest.mark.slow  # a local cluster (ZooKeeper, a store, a front) and a publisher: about 15 s
def test_quick_run_writes_every_window_once(tmp_path: Path) -> None:
    plot = tmp_path / "derived.png"
    done = subprocess.run(
        [
            sys.executable, "-m", "broker.cli", "bench", "derived", "--quick",
            "--dir", str(tmp_path), "--json", "--plot", str(plot),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert summary["ok"] and summary["benchmark"] == "derived"
    assert summary["parameters"]["stores"] == [1]
    assert summary["parameters"]["sensors"] == {"2": 40, "4": 40}
    assert [(c["uc"], c["stores"]) for c in summary["cases"]] == [(2, 1), (4, 1)]
    for result in summary["results"]:
        (step,) = result["steps"]
        # whether 100/s is sustained is the machine's (a test does not time: a loaded CI
        # machine fell behind once, 179 batches sent of 200); what was sent is judged exactly
        assert step["rate"] == 100 and step["drained"] and isinstance(step["sustained"], bool)
        # a loaded machine may hold the publisher back at the step's end: what was due then
        # is not sent (seen on CI: 194 of 200), and every update sent is acknowledged
        assert 100 <= step["published"] <= 200 and step["acknowledged"] == step["published"]
        oracle = step["oracle"]
        assert oracle["exact"] and oracle["updates"] == step["published"]
        assert oracle["refused"] == 0
        levels = len(result["types"])
        assert len(oracle["by_level"]) == len(step["latency"]) == levels
        for counts, groups in zip(oracle["by_level"], result["groups"], strict=True):
            # 2 s at 100/s over 40 sensors: every group has values in 2 or 3 windows
            assert 2 * groups <= counts["windows_expected"] <= counts["windows_written"]
            assert counts["windows_written"] <= 3 * groups
            assert counts["notifications"] == counts["windows_written"]  # each once
        for latency in step["latency"]:
            assert 0 < latency["p50_ms"] <= latency["p95_ms"] <= latency["p99_ms"] < 5000
        assert step["latency"][-1]["p50_ms"] >= step["latency"][0]["p50_ms"]  # up the levels
        cores = step["cores"]
        assert len(cores["context-store"]) == 1 and cores["machine"] > 0
        assert {"connection-point", "publishers", "other"} <= set(cores)
        if step["sustained"]:
            assert result["max_sustained_rate"] == 100 and result["at_max"] == step
        else:
            assert result["max_sustained_rate"] is None, result
    assert [r["types"] for r in summary["results"]] == [
        ["SensorStats"],
        ["Floor", "Building", "Campus"],
    ]
    assert summary["machine"]["cores"] >= 1 and "bench derived" in summary["command"]
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "[bench derived]" in done.stderr  # progress
    assert [p.name for p in tmp_path.iterdir()] == ["derived.png"]  # the cluster was removed


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--stores", "1,0"], "expected whole numbers"),
        (["--uc", "3"], "invalid choice"),
        (["--step", "0"], "must be more than 0"),
        (["--sensors", "0"], "must be at least 1"),
    ],
)
def test_bad_options_exit_2(
    options: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["bench", "derived", *options])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_a_precision_out_of_range_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "derived", "--precision", "1.5"]) == 2
    assert "--precision" in capsys.readouterr().err


# -- the workloads -----------------------------------------------------------------------------


def test_uc4_nests_sensors_in_floors_buildings_and_campuses() -> None:
    workload = Workload(4, 1000, 1, "t")
    assert [workload.groups(level) for level in range(3)] == [100, 20, 5]
    floors, buildings, campuses = (workload.keys(level) for level in range(3))
    assert np.bincount(floors).tolist() == [10] * 100
    assert (buildings == floors // 5).all() and (campuses == buildings // 4).all()
    made = [entity for batch in workload.entities() for entity in batch]
    assert len(made) == 1000 + 100 + 20  # sensors, floors (refBuilding), buildings (refCampus)
    floor = next(e for e in made if e["id"] == "Floor:17")
    assert floor["type"] == "Floor" and floor["refBuilding"]["value"] == "Building:3"
    sensor = next(e for e in made if e["id"] == "Sensor:171")
    assert sensor["refFloor"]["value"] == "Floor:17" and "refBuilding" not in sensor
    definition = parse_definition(workload.group(), "t", None)
    assert [level.type for level in definition.levels] == ["Floor", "Building", "Campus"]
    assert definition.derived_name("power", "count") == "power_count_1s"


def test_uc2_gives_every_sensor_its_own_derived_entity() -> None:
    workload = Workload(2, 30, 5, "t")
    assert workload.types == ("SensorStats",) and workload.groups(0) == 30
    made = [entity for batch in workload.entities() for entity in batch]
    assert len(made) == 30 and made[7]["refStats"]["value"] == "SensorStats:7"
    definition = parse_definition(workload.group(), "t", None)
    assert definition.window.size == 5 and "max" in definition.functions


def test_a_sensor_never_publishes_its_last_value_again() -> None:
    for sensor in range(50):
        values = [power_of(sensor, turn) for turn in range(30)]
        assert all(a != b for a, b in itertools.pairwise(values))


# -- the oracle --------------------------------------------------------------------------------

UC4 = Workload(4, 40, 1, "t")  # floors 0-3, buildings 0 (floors 0-3), campus 0


def _published(rows: list[tuple[int, int, float, float]]) -> Published:
    """One batch per row: (sensor, value, sent, acknowledged; NaN: refused)."""
    return Published(
        sensor=np.array([r[0] for r in rows], dtype=np.int64),
        value=np.array([r[1] for r in rows], dtype=np.int64),
        first=np.arange(len(rows), dtype=np.int64),
        count=np.ones(len(rows), dtype=np.int64),
        sent=np.array([r[2] for r in rows]),
        acked=np.array([r[3] for r in rows]),
        accepted=sum(1 for r in rows if r[3] == r[3]),
    )


# sensors 3 and 13 (floors 0 and 1) in the window ending at 101; sensor 3 again in the one
# ending at 102; sensor 25 (floor 2) sent at 101.9, acknowledged at 102.1: in either
PUBLISHED = _published(
    [(3, 10, 100.2, 100.3), (13, 20, 100.5, 100.6), (3, 30, 101.2, 101.3), (25, 5, 101.9, 102.1)]
)


def _arrivals(floor2_end: float = 102.0) -> list[Arrival]:
    """What a correct cluster notifies for PUBLISHED (sensor 25 counted by ``floor2_end``)."""
    out = [
        Arrival(101.3, 0, 0, 101.0, 1, 10.0),
        Arrival(101.3, 0, 1, 101.0, 1, 20.0),
        Arrival(101.4, 1, 0, 101.0, 2, 30.0),
        Arrival(101.5, 2, 0, 101.0, 2, 30.0),
        Arrival(102.3, 0, 0, 102.0, 1, 30.0),
        Arrival(floor2_end + 0.3, 0, 2, floor2_end, 1, 5.0),
    ]
    if floor2_end == 102.0:
        out += [Arrival(102.4, 1, 0, 102.0, 2, 35.0), Arrival(102.5, 2, 0, 102.0, 2, 35.0)]
    else:
        out += [
            Arrival(102.4, 1, 0, 102.0, 1, 30.0),
            Arrival(102.5, 2, 0, 102.0, 1, 30.0),
            Arrival(103.4, 1, 0, 103.0, 1, 5.0),
            Arrival(103.5, 2, 0, 103.0, 1, 5.0),
        ]
    return out


@pytest.mark.parametrize("floor2_end", [102.0, 103.0])
def test_the_oracle_takes_a_correct_run(floor2_end: float) -> None:
    arrivals = [*_arrivals(floor2_end), Arrival(90.0, 0, 0, 90.0, 4, 1.0)]  # another step's
    oracle = check(UC4, PUBLISHED, arrivals)
    assert oracle.exact, oracle
    assert oracle.updates == 4 and oracle.notifications == len(arrivals) - 1
    # certain: floors 0, 1 and 0 again, building and campus at 101 and 102 (sensor 3)
    assert [level["windows_expected"] for level in oracle.by_level] == [3, 2, 2]
    assert windows_due(UC4, PUBLISHED) == {
        (0, 0, 101.0), (0, 1, 101.0), (0, 0, 102.0), (1, 0, 101.0), (1, 0, 102.0),
        (2, 0, 101.0), (2, 0, 102.0),
    }  # fmt: skip


def test_the_drain_waits_for_windows_known_only_by_their_count() -> None:
    # sensor 25's window (floor 2) holds no certain update: the count says it is missing
    assert span(UC4, PUBLISHED) == (101.0, 103.0)
    assert complete(UC4, PUBLISHED, _arrivals())
    arrivals = [a for a in _arrivals() if (a.level, a.number) != (0, 2)]
    assert not complete(UC4, PUBLISHED, arrivals)
    arrivals = [a for a in _arrivals() if (a.level, a.end) != (2, 102.0)]  # a certain one
    assert not complete(UC4, PUBLISHED, arrivals)


def test_the_oracle_finds_a_lost_window() -> None:
    arrivals = [a for a in _arrivals() if (a.level, a.number, a.end) != (0, 1, 101.0)]
    oracle = check(UC4, PUBLISHED, arrivals)
    assert not oracle.exact
    assert (oracle.lost_windows, oracle.lost_values, oracle.duplicated) == (1, 1, 0)


def test_the_oracle_finds_a_duplicate_and_a_correction() -> None:
    arrivals = [*_arrivals(), Arrival(101.6, 2, 0, 101.0, 2, 30.0)]
    oracle = check(UC4, PUBLISHED, arrivals)
    assert (oracle.duplicated, oracle.corrections, oracle.exact) == (1, 0, False)
    corrected = [*_arrivals(), Arrival(101.6, 1, 0, 101.0, 3, 40.0)]
    oracle = check(UC4, PUBLISHED, corrected)
    assert (oracle.duplicated, oracle.corrections) == (1, 1)
    assert oracle.wrong_counts == 1 and oracle.extra_values == 1  # the last one counts


def test_the_oracle_finds_wrong_counts_sums_and_phantom_windows() -> None:
    arrivals = _arrivals()
    arrivals[2] = Arrival(101.4, 1, 0, 101.0, 2, 31.0)  # building 0's sum off by one
    assert check(UC4, PUBLISHED, arrivals).wrong_sums == 1
    arrivals = [*_arrivals(), Arrival(101.3, 0, 3, 101.0, 1, 7.0)]  # floor 3 had nothing
    oracle = check(UC4, PUBLISHED, arrivals)
    assert oracle.unexpected == 1 and not oracle.exact


def test_a_refused_update_may_be_counted_or_not() -> None:
    refused = _published([(3, 10, 100.2, 100.3), (13, 20, 100.5, float("nan"))])
    without = [Arrival(101.3, level, 0, 101.0, 1, 10.0) for level in range(3)]
    assert check(UC4, refused, without).exact
    counted = [
        Arrival(101.3, 0, 0, 101.0, 1, 10.0),
        Arrival(101.3, 0, 1, 101.0, 1, 20.0),
        Arrival(101.4, 1, 0, 101.0, 2, 30.0),
        Arrival(101.5, 2, 0, 101.0, 2, 30.0),
    ]
    oracle = check(UC4, refused, counted)
    assert oracle.exact and oracle.refused == 1


# -- sustained or not --------------------------------------------------------------------------


def _steady(
    rate: int, seconds: float, delay: float, lag: float, growth: float = 0.0
) -> tuple[Published, list[Arrival]]:
    """A step from t=1000: ``rate`` updates a second (one a batch), each acknowledged after
    ``delay`` (growing by ``growth`` seconds a second); every window notified ``lag`` s
    after its end."""
    n = int(rate * seconds)
    sent = 1000 + np.arange(n) / rate
    acked = sent + delay + growth * (sent - 1000)
    published = Published(
        sensor=np.arange(n, dtype=np.int64) % 40,
        value=np.ones(n, dtype=np.int64),
        first=np.arange(n, dtype=np.int64),
        count=np.ones(n, dtype=np.int64),
        sent=sent,
        acked=acked,
        accepted=n,
    )
    arrivals = [
        Arrival(end + lag, 0, 0, end, 1, 1.0) for end in np.arange(1001.0, 1000 + seconds + 2)
    ]
    return published, arrivals


def test_a_steady_step_is_sustained() -> None:
    published, arrivals = _steady(400, 10, 0.02, 0.3)
    verdict = judge(UC4, published, arrivals, 400, 1000.0, 10.0, drained=True)
    assert verdict.sustained, verdict.why
    assert abs(verdict.input_trend) < 0.01 and abs(verdict.output_trend_s_per_s) < 0.01
    assert verdict.achieved_per_s == pytest.approx(400, rel=0.01)


def test_a_growing_backlog_or_lag_is_not_sustained() -> None:
    published, arrivals = _steady(400, 10, 0.02, 0.3, growth=0.3)  # acknowledgements late
    verdict = judge(UC4, published, arrivals, 400, 1000.0, 10.0, drained=True)
    assert not verdict.sustained and "input backlog grew" in verdict.why
    published, _ = _steady(400, 10, 0.02, 0.3)
    lagging = [Arrival(a.end + 0.3 + 0.5 * (a.end - 1001), 0, 0, a.end, 1, 1.0) for a in arrivals]
    verdict = judge(UC4, published, lagging, 400, 1000.0, 10.0, drained=True)
    assert not verdict.sustained and "output lag grew" in verdict.why
    verdict = judge(UC4, published, arrivals, 400, 1000.0, 10.0, drained=False)
    assert not verdict.sustained and "missing after the drain" in verdict.why


# -- the search --------------------------------------------------------------------------------


@pytest.mark.parametrize("capacity", [50, 999, 1000, 3300, 7000, 150_000])
def test_the_search_finds_the_highest_sustained_rate(capacity: int) -> None:
    best, tried = search(
        lambda rate: rate <= capacity, 1000, highest=100_000, lowest=10, precision=0.1, steps=20
    )
    assert best is not None and best <= capacity
    if capacity <= 100_000:
        assert best >= capacity / 1.1 - 1 or best == capacity
        assert any(rate > best and not ok for rate, ok in tried)
    assert len(tried) <= 12


def test_the_search_stops_after_its_steps_or_below_its_lowest() -> None:
    best, tried = search(
        lambda rate: rate <= 3000, 1000, highest=10**6, lowest=10, precision=0.01, steps=4
    )
    assert best == 3000 and len(tried) == 4  # 1000, 2000, 4000, 3000
    best, tried = search(
        lambda rate: False, 1000, highest=10**6, lowest=100, precision=0.1, steps=20
    )
    assert best is None and [rate for rate, _ in tried] == [1000, 500, 250, 125]


# -- --merge -----------------------------------------------------------------------------------


def _result(uc: int, stores: int, rate: int | None) -> dict[str, object]:
    step = {
        "rate": rate,
        "sustained": rate is not None,
        "drained": True,
        "oracle": {"exact": True},
        "latency": [
            {"type": "SensorStats", "p50_ms": rate or 0, "p95_ms": 1, "p99_ms": 2, "max_ms": 3}
        ],
    }
    return {"uc": uc, "stores": stores, "repeat": 0, "max_sustained_rate": rate,
            "at_max": step if rate else None, "steps": [step]}  # fmt: skip


def test_merge_reports_earlier_runs_together(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    parameters = {"ucs": [2], "stores": [1, 2], "sensors": {"2": 100}, "window_s": 1,
                  "step_s": 10, "repeat": 1}  # fmt: skip
    runs = [[_result(2, 1, 3000), _result(2, 2, 1000)], [_result(2, 1, 5000), _result(2, 2, None)]]
    paths = []
    for n, results in enumerate(runs):
        paths.append(tmp_path / f"run{n}.json")
        paths[-1].write_text(json.dumps({"parameters": parameters, "results": results}))
    assert main(["bench", "derived", "--merge", *map(str, paths), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["parameters"]["repeat"] == 2
    assert [r["repeat"] for r in summary["results"]] == [0, 0, 1, 1]
    one, two = summary["cases"]
    assert (one["max_sustained_rate"], one["runs"]) == (4000, [3000, 5000])
    assert (two["max_sustained_rate"], two["runs"]) == (1000, [1000, None])
    assert one["latency"][0]["p50_ms"] == 4000  # the median of the runs at their highest
