"""``silbo bench storage``: a quick run measures both engines and reports sane figures; bad
options exit 2 before anything starts; the W-IoT entities are the documented shape."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import msgpack
import pytest

from broker.bench.storage import WRITE_BATCHES, iot_entities, iot_entity_key
from broker.cli import main
from broker.store.engine import ENGINES, split_entity_key


@pytest.mark.slow  # two engine processes, about 10 s
def test_quick_run_reports_both_engines(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable, "-m", "broker.cli", "bench", "storage", "--quick",
            "--entities", "5000", "--duration", "0.3", "--writers", "1,4",
            "--dir", str(tmp_path), "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert summary["entities"] == 5000 and summary["runs"] == 1
    assert set(summary["medians"]) == set(ENGINES) == set(summary["all_runs"])
    assert summary["default_engine"] in ENGINES
    assert summary["machine"]["cores"] >= 1
    assert set(summary["ratios"]) >= {"get_p99", "scan_s", "entities_per_s_batch_1_writers_4"}
    for report in summary["medians"].values():
        assert report["entities"] == 5000
        assert 300 < report["value_bytes"] < 800
        assert report["load_entities_per_s"] > 0 and report["gets_per_s"] > 0
        assert 0 < report["get_p50_us"] <= report["get_p99_us"]
        assert report["scan_entities"] == 5000 and report["scan_s"] > 0
        assert report["disk_bytes"] > 5000 * 100
        assert report["rss_loaded_bytes"] >= report["rss_anon_loaded_bytes"] > 0
        cells = [(w["batch"], w["writers"]) for w in report["writes"]]
        assert cells == [(b, w) for b in WRITE_BATCHES for w in (1, 4)]
        for writes in report["writes"]:
            assert writes["entities_per_s"] > 0 and writes["commits"] > 0
            # one writer has no one to share a commit with; four share each one
            if writes["writers"] == 1:
                assert writes["writes_per_commit"] == 1
            else:
                assert writes["writes_per_commit"] > 1
            assert 0 < writes["ack_p50_ms"] <= writes["ack_p99_ms"]
    assert "[bench storage]" in done.stderr  # progress
    assert not list(tmp_path.iterdir())  # the stores were removed


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--engines", "lmdb,sqlite", "expected distinct engines"),
        ("--engines", "lmdb,lmdb", "expected distinct engines"),
        ("--duration", "0", "must be more than 0"),
        ("--entities", "0", "must be at least 1"),
        ("--writers", "1,0", "expected whole numbers"),
    ],
)
def test_bad_options_exit_2(
    option: str, value: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["bench", "storage", option, value])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_entities_are_w_iot_documents() -> None:
    pairs = iot_entities(40, 3, seed=1)
    assert [k for k, _ in pairs] == [iot_entity_key(i) for i in (40, 41, 42)]
    tenant, path, entity_type, entity_id = split_entity_key(pairs[0][0])
    assert (tenant, entity_type) == ("madrid", "AirQualityObserved")
    assert path.startswith("/") and entity_id == "urn:ngsi-ld:AirQualityObserved:280790000040"
    document = msgpack.unpackb(pairs[0][1])
    assert document["id"] == entity_id
    assert len(document["attrs"]) == 10
    for attribute in document["attrs"].values():
        assert set(attribute) == {"type", "value", "metadata"}
    assert document["attrs"]["NO2"]["type"] == "Number"
    assert document["dateModified"] >= document["dateCreated"]
    assert iot_entities(40, 3, seed=1) == pairs  # deterministic
