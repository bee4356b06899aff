"""``silbo bench ngsi``: its pieces, and one short real run.

The real run is the command as a user runs it (a subprocess), on tiny sizes, against the
test session's ZooKeeper: 300 W-IoT subscriptions, 4 clients, 3 s of publishing. It checks
what the run reports, never how fast it was.
"""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
import sys
import time
from collections import Counter

import numpy as np
import pytest

from broker.bench.ngsi import _compare, _ReceiverProcess, _streams, _subscription_json
from broker.bench.workloads.iot import iot_subscriptions, iot_updates
from broker.cli import main
from broker.coordination.embedded import EmbeddedZooKeeper

# these tests start processes (ZooKeeper, silbo, a cluster)
pytestmark = pytest.mark.slow


@pytest.mark.parametrize("clients", ["0", "22"])
def test_bad_clients_exit_2_before_anything_starts(
    clients: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "ngsi", "--clients", clients]) == 2
    assert "--clients must be 1 to 21" in capsys.readouterr().err


def test_a_w_iot_subscription_becomes_an_ngsi_subscription() -> None:
    by_kind = {s.description: s for s in iot_subscriptions(200, 1)}
    alert = _subscription_json(by_kind["station_alert"], "http://127.0.0.1:1/n/0")
    [entity] = alert["subject"]["entities"]
    assert set(entity) == {"id", "type"}
    assert alert["subject"]["condition"]["expression"]["q"] == by_kind["station_alert"].q
    assert alert["notification"] == {
        "http": {"url": "http://127.0.0.1:1/n/0"},
        "attrsFormat": "normalized",
    }
    assert "throttling" not in alert
    ranged = _subscription_json(by_kind["district_range"], "http://127.0.0.1:1/n/1")
    assert set(ranged["subject"]["entities"][0]) == {"idPattern", "type"}


@pytest.mark.parametrize("batch", [1, 7])
def test_each_station_goes_through_one_client_in_pool_order(batch: int) -> None:
    pool = iot_updates(500, 2)
    streams = _streams(pool, 4, batch)
    owner: dict[str, int] = {}
    order: dict[str, list[int]] = {}
    for number, stream in enumerate(streams):
        for request in stream:
            assert 1 <= len(request.readings) <= batch
            for k in request.readings:
                assert pool[k].service_path == request.service_path
                assert owner.setdefault(pool[k].entity_id, number) == number
                order.setdefault(pool[k].entity_id, []).append(k)
    assert sum(len(v) for v in order.values()) == len(pool)
    assert all(v == sorted(v) for v in order.values())


def test_compare_counts_missing_and_unexpected_as_multisets() -> None:
    expected = np.array([1, 2, 2, 3], dtype=np.int64)
    received = np.array([2, 3, 3, 4], dtype=np.int64)
    assert _compare(expected, received) == (2, 2)  # missing 1 and a 2; extra 3 and 4
    assert _compare(expected, expected) == (0, 0)
    assert _compare(np.zeros(0, dtype=np.int64), received) == (0, 4)


def test_a_short_run_accepts_updates_and_delivers_notifications(
    zookeeper: EmbeddedZooKeeper,
) -> None:
    done = subprocess.run(
        [
            sys.executable, "-m", "broker.cli", "bench", "ngsi",
            "--subscriptions", "300", "--duration", "3", "--clients", "4", "--batch", "5",
            "--drain", "10", "--zk", zookeeper.address, "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert {"machine", "command", "runs", "cpu_us_per_update", "errors"} <= set(summary)
    assert summary["batch"] == 5 and summary["clients"] == 4
    assert summary["updates"] > 0 and summary["updates_per_s"] > 0
    assert summary["requests"] <= summary["updates"] <= 5 * summary["requests"]
    assert summary["errors"] == {}
    assert summary["p99_ms"] >= summary["p50_ms"] > 0
    assert summary["notifications"] > 0 and summary["notified_entities"] > 0
    assert summary["expected"] > 0 and summary["unexpected"] == 0
    assert summary["received"] >= summary["notifications"]  # the keys are read after the counts
    assert "[bench ngsi]" in done.stderr


def test_a_faulty_receiver_takes_only_part_answering_503_or_resetting_the_rest() -> None:
    receiver = _ReceiverProcess(faults=0.5, seed=3)
    try:
        outcomes: Counter[str] = Counter()
        deadline = time.monotonic() + 30
        while True:  # the receiver process starts
            try:
                socket.create_connection(("127.0.0.1", receiver.port), 1).close()
                break
            except OSError:
                assert time.monotonic() < deadline
                time.sleep(0.1)
        for _ in range(60):
            connection = http.client.HTTPConnection("127.0.0.1", receiver.port, timeout=10)
            body = json.dumps({"data": [{"id": "urn:x:280791"}]})  # station 0
            try:
                connection.request("POST", "/n/0", body, {"Fiware-Correlator": "1; cbnotif=1"})
                outcomes[str(connection.getresponse().status)] += 1
            except (ConnectionResetError, http.client.RemoteDisconnected):
                outcomes["reset"] += 1
            finally:
                connection.close()
        connection = http.client.HTTPConnection("127.0.0.1", receiver.port, timeout=10)
        connection.request("GET", "/_counts")
        counts = json.loads(connection.getresponse().read())
        connection.close()
    finally:
        receiver.stop()
    assert set(outcomes) == {"204", "503", "reset"}
    assert abs(outcomes["503"] - outcomes["reset"]) <= 1  # alternately
    assert counts["posts"] == outcomes["204"] and counts["faults"] == 60 - outcomes["204"]
    assert 15 <= outcomes["204"] <= 45


@pytest.mark.parametrize("option", [["--rate", "-1"], ["--receiver-faults", "1"]])
def test_bad_rate_or_faults_exit_2(option: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "ngsi", *option]) == 2
    assert "--rate at least 0, --receiver-faults from 0 to below 1" in capsys.readouterr().err
