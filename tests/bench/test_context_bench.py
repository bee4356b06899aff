"""``silbo bench context``: a quick run over real store processes reports every figure with
sane values; bad options exit 2 before anything starts; the load helpers route by partition."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from broker.bench.context import TARGETS
from broker.bench.context_load import holders, intent
from broker.bench.storage import iot_attributes, iot_entity_id
from broker.bench.workloads.iot import IOT_TYPE
from broker.cli import main
from broker.store.entities import partition_of
from broker.store.layout import StoreLayout
from broker.store.semantics import Mode


@pytest.mark.slow  # a local cluster (ZooKeeper, stores, a front), about 30 s
def test_quick_run_reports_every_figure(tmp_path: Path) -> None:
    plot = tmp_path / "context.png"
    done = subprocess.run(
        [
            sys.executable, "-m", "broker.cli", "bench", "context", "--quick",
            "--stores", "1", "--duration", "0.5", "--reads", "50",
            "--query-entities", "1000", "--query-runs", "1", "--entities", "1500",
            "--dir", str(tmp_path), "--json", "--plot", str(plot),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert summary["parameters"]["stores"] == [1]  # one cluster: CI time (the same code)
    assert summary["machine"]["cores"] >= 1 and "bench context" in summary["command"]
    assert [w["stores"] for w in summary["writes"]] == [1]
    for writes in summary["writes"]:
        assert writes["writes_per_s"] > 0 and writes["errors"] == 0
        assert len(writes["window_writes_per_s"]) == 2
        assert set(writes["by_store_per_s"]) == {f"store-{n + 1}" for n in range(writes["stores"])}
        assert all(rate > 0 for rate in writes["by_store_per_s"].values())
        assert writes["modified_share"] > 0.9  # new values: the writes commit
        assert 0 < writes["call_p50_ms"] <= writes["call_p99_ms"]
        assert writes["cores_stores"] > 0 and writes["writes_per_store_cpu_s"] > 0
    front = summary["front"]
    assert front["writes_per_s"] > 0 and not front["errors"]
    for gets in (front["get_idle"], front["get_half_load"]):
        assert gets["reads"] > 0 and 0 < gets["p50_ms"] <= gets["p99_ms"] <= gets["max_ms"]
    assert front["background_writes_per_s"] > 0
    query = summary["query"]
    assert query["entities"] == 1000 and 0 < query["matching"] < 1000  # about 12% match
    assert query["limit_ms"] > 0 and query["count_ms"] > 0 and query["store_part_ms"] > 0
    memory = summary["memory"]
    assert memory["entities"] == 1500 and memory["scan_matching"] > query["matching"]
    assert memory["rss_loaded_mb"] > memory["rss_anon_loaded_mb"] > 0 and memory["disk_mb"] > 0
    assert set(summary["targets"]) == set(TARGETS)
    assert all(t["measured"] is not None for t in summary["targets"].values())
    assert plot.stat().st_size > 10_000
    assert "[bench context]" in done.stderr  # progress
    assert not [p for p in tmp_path.iterdir() if p != plot]  # the clusters were removed


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--stores", "1,0", "expected whole numbers"),
        ("--duration", "0", "must be more than 0"),
        ("--batch", "0", "must be at least 1"),
        ("--entities", "-1", "must be at least 0"),
    ],
)
def test_bad_options_exit_2(
    option: str, value: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["bench", "context", option, value])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_holders_route_as_the_layout_does() -> None:
    layout = StoreLayout(1, ("store-1", "store-2", "store-3"))
    by_store = holders(layout, "benchw", 600)
    assert sorted(i for entities in by_store.values() for i in entities) == list(range(600))
    for store, entities in by_store.items():
        assert entities  # 600 entities over 256 partitions reach every store
        for i in entities:
            assert layout.holder(partition_of("benchw", iot_entity_id(i))) == store


def test_writes_are_upserts_of_ten_attributes() -> None:
    attributes = iot_attributes(7, 1, seed=1)[0]
    write = intent("benchw", 7, attributes)
    assert write.mode is Mode.UPSERT and write.entity_type == IOT_TYPE
    assert write.tenant == "benchw" and write.service_path.startswith("/")
    assert len(write.attributes) == 10
