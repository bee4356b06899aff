"""``silbo bench ngsi``: its pieces, and one short real run.

The real runs are the command as a user runs it (a subprocess), on tiny sizes, against the
test session's ZooKeeper: 300 W-IoT subscriptions, 4 clients, 3 s of publishing; and the
geographical workload (200 near circles, then the same as q boxes), 2 s each. They check
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
from broker.bench.workloads.fleet import (
    box_subscriptions,
    fleet_places,
    fleet_updates,
    near_expression,
    within,
)
from broker.bench.workloads.iot import iot_subscriptions, iot_updates
from broker.cli import main
from broker.coordination.embedded import EmbeddedZooKeeper
from broker.matching import Engine

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


@pytest.mark.parametrize(
    "option", [["--rate", "-1"], ["--receiver-faults", "1"], ["--max-distance", "0"]]
)
def test_bad_rate_or_faults_exit_2(option: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "ngsi", *option]) == 2
    assert "--rate at least 0, --receiver-faults from 0 to below 1" in capsys.readouterr().err


def test_the_geo_oracle_measures_on_the_sphere_and_the_boxes_hold_the_circles() -> None:
    """0.0045 degrees of latitude are 500.96 m on a sphere of 6,378,100 m (by hand:
    0.0045 * pi / 180 * 6378100); the box of a 501 m circle takes that point."""
    places = [(40.4, -3.7), (40.5, -3.6)]
    north = (40.4045, -3.7)
    assert [p.tolist() for p in within(places, 501.0, [north])] == [[0]]
    assert [p.tolist() for p in within(places, 500.0, [north])] == [[]]
    assert near_expression(places[0], 501.0) == {
        "georel": "near;maxDistance:501",
        "geometry": "point",
        "coords": "40.4,-3.7",
    }
    engine = Engine(box_subscriptions(places, 501.0))
    [update] = fleet_updates(1, 1, vehicles=1)
    moved = {**update.attributes}
    moved["latitude"] = type(update.attributes["latitude"])("Number", north[0])
    moved["longitude"] = type(update.attributes["longitude"])("Number", north[1])
    assert engine.match(type(update)(update.entity_id, moved, update.entity_type)) == {"fleet-0"}
    assert len(fleet_places(50, 1)) == 50 and len({u.entity_id for u in fleet_updates(200, 1)}) > 1


def test_a_short_geo_run_reports_geo_and_no_geo(zookeeper: EmbeddedZooKeeper) -> None:
    done = subprocess.run(
        [
            sys.executable, "-m", "broker.cli", "bench", "ngsi", "--workload", "geo",
            "--subscriptions", "200", "--max-distance", "1500", "--duration", "2",
            "--clients", "4", "--batch", "5", "--drain", "10", "--zk", zookeeper.address, "--json",
        ],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    summary = json.loads(done.stdout)
    baseline = summary["without_geo"]
    assert (summary["workload"], baseline["workload"]) == ("geo", "no-geo")
    for report in (summary, baseline):
        assert report["updates"] > 0 and report["errors"] == {}
        assert report["notifications"] > 0 and report["p99_ms"] > 0
        assert report["expected"] > 0 and report["unexpected"] == 0
    # a box holds its circle and more: the same readings notify more without geo
    assert baseline["expected"] / baseline["updates"] > summary["expected"] / summary["updates"]
