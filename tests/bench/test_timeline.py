"""The time line of ``silbo bench scale``: per-second bins, the figures around a scale, the PNG."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from matplotlib.image import imread

from broker.bench.timeline import (
    ScaleWindow,
    longest_gap,
    matchers_at,
    plot,
    throughput_around,
    timeline,
    window_rate,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _times(*values: float) -> np.ndarray[Any, np.dtype[np.float64]]:
    return np.array(values, dtype=np.float64)


def test_each_second_counts_what_was_published_and_completed_in_it() -> None:
    published = _times(0.1, 0.2, 0.9, 1.5, 2.2, 2.3)
    completed = _times(0.15, 1.2, 1.3, np.nan, 2.4, 3.1)
    series = timeline(published, completed, 3, [(0.0, 2)])
    assert series["t"] == [0.0, 1.0, 2.0]
    assert series["offered_per_s"] == [3.0, 1.0, 2.0]
    # by completion time; the never-completed update counts nowhere, 3.1 is past the end
    assert series["updates_per_s"] == [1.0, 2.0, 1.0]


def test_latency_is_binned_by_publish_second_and_skips_what_never_completed() -> None:
    published = _times(0.0, 0.9, 1.0, 1.5)
    completed = _times(0.010, 1.050, np.nan, np.nan)  # 10 ms and 150 ms
    series = timeline(published, completed, 2, [(0.0, 1)])
    assert series["p50_ms"][0] == pytest.approx(80.0)
    assert series["p99_ms"][0] == pytest.approx(148.6)
    assert series["p50_ms"][1] is None and series["p99_ms"][1] is None


def test_the_matchers_column_follows_the_configuration_changes() -> None:
    changes = [(0.0, 2), (1.4, 4), (3.2, 2)]
    assert [matchers_at(changes, t) for t in (0.0, 1.39, 1.4, 3.0, 3.2, 9.0)] == [2, 2, 4, 4, 2, 2]
    series = timeline(_times(0.5), _times(0.6), 4, changes)
    assert series["matchers"] == [2.0, 4.0, 4.0, 2.0]  # as configured at each second's end


def test_window_rate_counts_completions_in_a_half_open_window() -> None:
    completed = _times(1.0, 1.5, 2.0, 2.5, np.nan)
    assert window_rate(completed, 1.0, 2.0) == 2.0
    assert window_rate(completed, 1.0, 3.0) == 2.0
    assert window_rate(completed, 2.0, 2.0) == 0.0


def test_longest_gap_includes_the_window_edges() -> None:
    completed = _times(1.2, 1.3, 1.9)
    assert longest_gap(completed, 1.0, 2.0) == pytest.approx(600.0)
    assert longest_gap(completed, 5.0, 6.0) == pytest.approx(1000.0)  # nothing completed


def test_throughput_around_a_scale_compares_before_during_and_after() -> None:
    # 100 updates/s steadily, except that nothing completes in [10.2, 10.6)
    completed = np.arange(0.0, 20.0, 0.01)
    completed = completed[(completed < 10.2) | (completed >= 10.6)]
    series = timeline(completed, completed, 20, [(0.0, 2)])
    window = ScaleWindow(began=9.5, protocol_began=10.0, protocol_ended=10.8, ended=10.8)
    around = throughput_around(window, completed, series["updates_per_s"])
    assert around["before_per_s"] == pytest.approx(100.0, abs=1.0)  # seconds 4 to 8
    # the protocol window is shorter than a second: measured over [10.0, 11.0)
    assert around["during_per_s"] == pytest.approx(60.0, abs=1.0)
    assert around["ratio"] == pytest.approx(0.6, abs=0.02)
    assert around["after_per_s"] == pytest.approx(100.0, abs=1.0)
    assert around["operation_per_s"] == pytest.approx(90 / 1.3, abs=1.0)  # [9.5, 10.8)
    assert around["longest_gap_ms"] == pytest.approx(410.0, abs=1.0)
    assert around["gap_before_ms"] == pytest.approx(10.0, abs=1.0)


def test_a_scale_right_at_the_start_has_no_before_figure() -> None:
    completed = np.arange(0.0, 5.0, 0.01)
    series = timeline(completed, completed, 5, [(0.0, 1)])
    window = ScaleWindow(began=0.5, protocol_began=0.5, protocol_ended=1.5, ended=1.5)
    around = throughput_around(window, completed, series["updates_per_s"])
    assert around["before_per_s"] == 0.0
    assert around["ratio"] is None


def _summary(seconds: int) -> dict[str, Any]:
    t = np.arange(seconds, dtype=np.float64)
    completed = np.arange(0.0, float(seconds), 0.002)
    series = timeline(completed, completed + 0.02, seconds, [(0.0, 2), (5.3, 4)])
    assert series["t"] == list(t)
    scale = {
        "from": 2,
        "to": 4,
        "outcome": "completed",
        "duration_s": 0.35,
        "moved_subscriptions": 50_123,
        "began_s": 4.5,
        "protocol_began_s": 5.0,
        "protocol_ended_s": 5.35,
        "ended_s": 5.35,
    }
    workload = {"subscriptions": 100_000, "steps": [2, 4], "rate": 500}
    return {"series": series, "scales": [scale], "workload": workload}


def test_plot_writes_a_png_of_two_panels(tmp_path: Path) -> None:
    path = tmp_path / "out" / "scale.png"
    plot(_summary(10), path)
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    height, width, _channels = imread(path).shape
    assert width > height > 300


def test_plot_draws_seconds_without_latency(tmp_path: Path) -> None:
    summary = _summary(6)
    summary["series"]["p99_ms"][2] = None
    summary["series"]["p50_ms"][2] = None
    summary["scales"][0]["outcome"] = "rolled back"
    plot(summary, tmp_path / "scale.png")
    assert (tmp_path / "scale.png").read_bytes()[:8] == PNG_SIGNATURE
