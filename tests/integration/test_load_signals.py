"""Load signals on real processes: a matcher capped with --max-rate is busy at its cap.

One cluster, its matcher started with ``--max-rate 200`` (``silbo up --max-rate
matcher=200``) and two exit points, offered about 400 updates a second by two publishers
(one per exit point): the matcher reports busy near 1 and a
true rate near 200, while the uncapped processes carrying the same 200 updates a second
(the access point held back by the matcher's full link among them) report busy well below 1.
Every layer counts updates (the connection point not its notifications too, the matcher not
its matches; each exit point only the batches it gathers): each layer reports the same input
rate. ``silbo admin status`` shows it all, as JSON
and as text.
"""

from __future__ import annotations

import argparse
import contextlib
import threading
import time
import urllib.request
from collections.abc import Iterator

import pytest
from conftest import StartCluster

from broker.bench.autoscale import publisher_names
from broker.client import Client
from broker.commands.admin import run_status
from broker.model.update import ContextUpdate
from integration.conftest import cluster_status

CAP = 200.0
OFFERED = 400.0  # updates a second
LOADED_FOR = 6.5  # seconds: more than the 5 s window the rates are averaged over


def _offered(stop: threading.Event, rate: float, prefix: str) -> Iterator[ContextUpdate]:
    """Updates at ``rate`` a second until ``stop`` (a full publish window slows it down)."""
    started = time.monotonic()
    n = 0
    while not stop.is_set():
        ahead = started + n / rate - time.monotonic()
        if ahead > 0:
            time.sleep(ahead)
        hot = n % 2 == 0  # notifications flow to the end, to the connection point
        yield ContextUpdate.of(
            f"{prefix}{n}", {"temperature": 30 if hot else 20}, entity_type="Room"
        )
        n += 1


def test_a_capped_matcher_is_busy_at_its_cap_and_the_others_are_not(
    start_cluster: StartCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = start_cluster(matchers=1, exit_points=2, replicas=1, max_rates=(("matcher", CAP),))
    stop = threading.Event()
    with contextlib.ExitStack() as clients:
        client, *publishers = (
            clients.enter_context(Client(cluster.endpoints, timeout=30.0, publisher=name, window=4))
            for name in [None, *publisher_names(2)]
        )
        client.subscribe(type="Room", q="temperature>25", subscription_id="hot")
        threads = [
            threading.Thread(
                target=publisher.publish_many,
                args=(_offered(stop, OFFERED / 2, f"Room{i}-"),),
                kwargs={"batch_size": 20},
                daemon=True,
            )
            for i, publisher in enumerate(publishers)
        ]
        for thread in threads:
            thread.start()
        try:
            time.sleep(LOADED_FOR)
            status = cluster_status(cluster)
            args = argparse.Namespace(
                zk=cluster.zk_address,
                cluster=cluster.spec.cluster,
                state_dir=None,
                json=False,
                interval=0.0,
            )
            assert run_status(args) == 0
            scraped = _scrape(status, "matcher")
        finally:
            stop.set()
            for thread in threads:
                thread.join(30.0)
    load: dict[str, dict[str, float]] = {}
    for process in status["processes"]:  # a layer's rates summed, its other figures the last
        assert process["reachable"], process
        figures = load.setdefault(process["role"], {})
        for key, value in process["load"].items():
            figures[key] = figures.get(key, 0) + value if key.endswith("_rate") else value
    matcher = load["matcher"]
    assert matcher["max_rate"] == CAP
    assert matcher["busy_fraction"] > 0.85, matcher
    assert CAP * 0.75 <= matcher["true_rate"] <= CAP * 1.25, matcher
    assert CAP * 0.75 <= matcher["input_rate"] <= CAP * 1.25, matcher
    for role in ("access-point", "exit-point", "connection-point"):
        assert load[role]["max_rate"] == 0, load[role]
        assert load[role]["busy_fraction"] < 0.5, (role, load[role])
    # offered twice what is served: the publishers wait for room in their window, and say so
    assert load["connection-point"]["held_fraction"] > 0.5, load["connection-point"]
    assert load["matcher"]["held_fraction"] == 0.0
    for role in ("connection-point", "access-point", "matcher", "exit-point"):
        # updates in and out on every layer, whatever the notifications
        for rate in ("input_rate", "output_rate"):
            assert CAP * 0.75 <= load[role][rate] <= CAP * 1.25, (role, rate, load[role])
    assert {"queue_depth", "queue_age_s", "busy_seconds", "items_in"} <= set(matcher)
    assert float(scraped["silbo_busy_fraction"]) > 0.85, scraped
    assert float(scraped["silbo_max_rate"]) == CAP
    assert float(scraped["silbo_true_rate"]) > 0
    shown = capsys.readouterr().out
    assert "busy" in shown and f"max {CAP:g}/s" in shown and "true " in shown


def _scrape(status: dict[str, object], role: str) -> dict[str, str]:
    """The unlabelled samples of the Prometheus endpoint of the process of ``role``."""
    processes = status["processes"]
    assert isinstance(processes, list)
    address = next(p["metrics"] for p in processes if p["role"] == role)
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    return dict(
        line.split(" ", 1) for line in text.splitlines() if line and not line.startswith("#")
    )
