"""``silbo replay`` against the live broker: the same partial upserts published to a real
cluster (front, matchers, context store) and replayed on the session's Spark give the same
notifications, no extra, no missing (issue 20's held-out workload); and so does the replay of
the changes the cluster's archive recorded of them (``silbo replay --archive``,
docs/archive.md). The cluster keeps its attributes' history too (``--history on``):
``silbo backfill --history`` from its archive gives every minute slot the live stores
answer through the STH API, exactly (issue 20's "live history vs. Spark backfill").

The subscriptions are drawn at random (seeded): condition attributes, alteration types
(entityCreate, entityChange, entityUpdate), ``q`` on attributes few updates carry,
``notifyOnMetadataChange``, a geographical condition, some oneshot, some inactive, some
throttled for an hour (far from the updates' milliseconds: the first match notifies, no
later one), some expired and some expiring in decades. The updates are upserts of one or
two attributes of a few entities, with values drawn from two or three, so many change
nothing. Each update has its own Fiware-Correlator, which its notifications carry back.
"""

from __future__ import annotations

import itertools
import json
import random
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from ngsi.conftest import Front, Receiver, started_front, tenant

from broker import cli
from broker.commands.archive import archive_status
from broker.coordination.embedded import EmbeddedZooKeeper
from broker.store.history_fold import Level, offset, origin
from broker.store.semantics import iso8601

SEED = 20
UPDATES = 300
SUBSCRIPTIONS = 40
ENTITIES = (("E0", "Room"), ("E1", "Room"), ("E2", "Room"), ("E3", "Room"), ("C1", "Car"))
PLACES = ("40.4168,-3.7038", "41.3874,2.1686")  # Madrid, Barcelona
WAIT = 30.0


def _attribute(draw: random.Random, name: str) -> dict[str, Any]:
    if name == "a":
        return {"type": "Number", "value": draw.choice((0, 1, 2))}
    if name == "b":
        return {"type": "Text", "value": draw.choice(("x", "y"))}
    if name == "c":  # a unit in metadata: a change of metadata alone
        unit = {"type": "Text", "value": draw.choice(("m", "cm"))}
        return {"type": "Number", "value": draw.choice((0, 1)), "metadata": {"unit": unit}}
    return {"type": "geo:point", "value": draw.choice(PLACES)}


def _updates(draw: random.Random) -> list[tuple[str, str, dict[str, Any]]]:
    """(id, type, attributes) of partial upserts; ``d`` is rare (a ``q`` on it)."""
    names = ("a", "a", "b", "b", "c", "loc", "d")
    found = []
    for _ in range(UPDATES):
        entity_id, entity_type = draw.choice(ENTITIES)
        chosen = sorted({draw.choice(names) for _ in range(draw.choice((1, 1, 2)))})
        attributes = {
            n: {"type": "Number", "value": draw.choice((1, 2))} if n == "d" else _attribute(draw, n)
            for n in chosen
        }
        found.append((entity_id, entity_type, attributes))
    return found


def _subscription(draw: random.Random, url: str) -> dict[str, Any]:
    selector = draw.choice(
        (
            {"idPattern": ".*"},
            {"id": "E1", "type": "Room"},
            {"idPattern": "^E[0-2]$"},
            {"idPattern": ".*", "type": "Car"},
        )
    )
    condition: dict[str, Any] = {}
    attrs = draw.choice(([], [], ["a"], ["b", "c"], ["c"], ["loc"], ["d"]))
    if attrs:
        condition["attrs"] = attrs
    if draw.random() < 0.6:
        kinds = ("entityCreate", "entityChange", "entityUpdate")
        condition["alterationTypes"] = draw.sample(kinds, draw.randint(1, 3))
    if draw.random() < 0.3:
        condition["notifyOnMetadataChange"] = False
    expression: dict[str, str] = {}
    q = draw.choice(("", "", "a>0", "b==x", "c", "!c", "a==1;b==y", "d==2"))
    if q:
        expression["q"] = q
    if draw.random() < 0.1:
        expression.update(georel="near;maxDistance:20000", geometry="point", coords=PLACES[0])
    if expression:
        condition["expression"] = expression
    document: dict[str, Any] = {
        "subject": {"entities": [selector], **({"condition": condition} if condition else {})},
        "notification": {"http": {"url": url}, "onlyChangedAttrs": draw.random() < 0.2},
        "status": draw.choice(("active", "active", "active", "oneshot", "oneshot", "inactive")),
    }
    if draw.random() < 0.3:
        document["throttling"] = 3600
    expiry = draw.random()
    if expiry < 0.15:
        document["expires"] = "2001-01-01T00:00:00.000Z"
    elif expiry < 0.3:
        document["expires"] = "2099-01-01T00:00:00.000Z"
    return document


def _create(front: Front, headers: dict[str, str], document: dict[str, Any]) -> str:
    answer = front.call("POST", "/v2/subscriptions", document, headers=headers)
    assert answer.status == 201, answer.body
    location = answer.header("Location")
    assert location is not None
    return location.rsplit("/", 1)[1]


def _listed(front: Front, headers: dict[str, str]) -> list[dict[str, Any]]:
    answer = front.call("GET", "/v2/subscriptions?limit=1000", headers=headers)
    assert answer.status == 200
    listed: list[dict[str, Any]] = answer.body
    return listed


def _live(
    front: Front,
    receiver: Receiver,
    t: str,
    updates: list[tuple[str, str, dict[str, Any]]],
    subscriptions: list[dict[str, Any]],
) -> tuple[Counter[tuple[int, str]], list[float], list[dict[str, Any]]]:
    """The notifications of the updates published live, as (update, subscription); when
    each update was sent; the subscriptions as listed before the first update."""
    headers = {"Fiware-Service": t}
    ids = [_create(front, headers, s) for s in subscriptions]
    listed = [s for s in _listed(front, headers) if s["id"] in ids]
    marker = _create(
        front,
        headers,
        {
            "subject": {"entities": [{"id": "END", "type": "Marker"}]},
            "notification": {"http": {"url": receiver.url("/end")}},
        },
    )
    times = []
    for number, (entity_id, entity_type, attributes) in enumerate(updates):
        times.append(time.time())
        answer = front.call(
            "POST",
            "/v2/entities?options=upsert",
            {"id": entity_id, "type": entity_type, **attributes},
            headers={**headers, "Fiware-Correlator": f"u{number}"},
        )
        assert answer.status == 204, answer.body
    end = {"id": "END", "type": "Marker", "n": {"value": 1}}
    assert front.call("POST", "/v2/entities", end, headers=headers).status == 201
    # The marker's notification is decided after every update's (one publisher, in order);
    # then timesSent says how many notifications were decided in all.
    deadline = time.monotonic() + WAIT
    while not any(n.path == "/end" for n in receiver.received()):
        assert time.monotonic() < deadline, "the end marker was not notified"
        receiver.wait_for(len(receiver.received()) + 1, deadline - time.monotonic())
    sent = sum(s.get("notification", {}).get("timesSent", 0) for s in _listed(front, headers))
    got = receiver.wait_for(sent)
    after = sum(s.get("notification", {}).get("timesSent", 0) for s in _listed(front, headers))
    assert (len(got), after) == (sent, sent), "notifications decided after the end marker"
    pairs: Counter[tuple[int, str]] = Counter()
    for notification in got:
        if notification.body["subscriptionId"] == marker:
            continue
        correlator = notification.headers["Fiware-Correlator"].split(";")[0]
        pairs[(int(correlator.removeprefix("u")), notification.body["subscriptionId"])] += 1
    return pairs, times, listed


def _replayed(capsys: pytest.CaptureFixture[str], out: Path, *arguments: str) -> Counter[Any]:
    status = cli.main(["replay", *arguments, "--out", str(out)])
    assert status == 0, capsys.readouterr().err
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    return Counter((r["update"], r["subscription"]) for r in rows)


def _archived(front: Front, count: int) -> None:
    """Wait until the archive holds ``count`` changes or more, and none waits."""
    assert front.cluster is not None
    cluster = front.cluster
    deadline = time.monotonic() + WAIT
    while True:
        status = archive_status(cluster.zk_address, cluster.spec.cluster)
        if status["rows"] >= count and status["waiting"]["changes"] == 0:
            return
        assert time.monotonic() < deadline, f"the archive does not catch up: {status}"
        time.sleep(0.2)


def _sth_minutes(front: Front, t: str) -> dict[tuple[str, str, str, int], dict[str, Any]]:
    """Every minute slot of the attributes ``a`` (numbers) and ``b`` (texts) of the entities,
    as the live stores answer through the STH API: (entity, attribute, origin, offset) ->
    the point (samples, sum, sum2, min, max or occur)."""
    slots = {}
    for (entity_id, entity_type), attribute in itertools.product(ENTITIES, ("a", "b")):
        path = (
            f"/STH/v1/contextEntities/type/{entity_type}/id/{entity_id}/attributes/{attribute}"
            "?aggrMethod=all&aggrPeriod=minute"
        )
        answer = front.call("GET", path, headers={"Fiware-Service": t})
        assert answer.status == 200, answer.body
        (element,) = answer.body["contextResponses"]
        (values,) = [a["values"] for a in element["contextElement"]["attributes"]]
        for document in values:
            for point in document["points"]:
                key = (entity_id, attribute, document["_id"]["origin"], point["offset"])
                slots[key] = {k: v for k, v in point.items() if k != "offset"}
    return slots


def _backfilled_minutes(
    spark: Any, output: Path
) -> dict[tuple[str, str, str, int], dict[str, Any]]:
    """The backfill's minute slots of the same attributes, rendered as the STH API renders
    them (numbers: samples, sum, sum2, min, max; texts: samples, occur)."""
    rows = spark.read.parquet(str(output / "history")).where("level = 'minute'").collect()
    slots = {}
    for row in rows:
        if row["attribute"] not in ("a", "b"):
            continue
        base = origin(Level.MINUTE, row["start"])
        key = (
            row["entity_id"],
            row["attribute"],
            iso8601(base),
            offset(Level.MINUTE, row["start"]),
        )
        occur = json.loads(row["occur"] or "{}")
        point: dict[str, Any] = {"samples": row["samples"]}
        if occur:
            point["occur"] = occur
        else:
            point.update({k: row[k] for k in ("sum", "sum2", "min", "max")})
        slots[key] = point
    return slots


def _same(live: Counter[Any], replayed: Counter[Any], how: str) -> None:
    missing, extra = live - replayed, replayed - live
    assert not missing and not extra, (
        f"{how}: {len(live)} live, {len(replayed)} replayed; missing {sorted(missing)[:5]}, "
        f"extra {sorted(extra)[:5]}"
    )


def test_replay_notifies_exactly_what_the_live_broker_notified(
    spark: Any,
    zookeeper: EmbeddedZooKeeper,
    tmp_path_factory: pytest.TempPathFactory,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    draw = random.Random(SEED)
    t = tenant()
    receiver = Receiver()
    updates = _updates(draw)
    subscriptions = [_subscription(draw, receiver.url()) for _ in range(SUBSCRIPTIONS)]
    updates_file, subscriptions_file = tmp_path / "updates.jsonl", tmp_path / "subs.json"
    archive = tmp_path / "archive"
    try:
        with started_front(
            zookeeper,
            tmp_path_factory,
            "replay",
            archive=str(archive),
            archive_interval=0.2,
            store_history=True,
        ) as front:
            live, times, listed = _live(front, receiver, t, updates, subscriptions)
            assert len(listed) == SUBSCRIPTIONS
            assert len(live) > 100 and max(live.values()) == 1, "a workload that notifies"
            with updates_file.open("w") as written:
                for (entity_id, entity_type, attributes), at in zip(updates, times, strict=True):
                    line = {"id": entity_id, "type": entity_type, "tenant": t, "time": at}
                    written.write(json.dumps({**line, **attributes}) + "\n")
            assert front.cluster is not None
            # the running cluster's subscriptions: the matchers' part and the fronts'
            # documents (with the end marker's, which matches none of the updates)
            state_dir = str(front.cluster.state_dir)
            from_cluster = _replayed(
                capsys, tmp_path / "cluster.jsonl", "--updates", str(updates_file),
                "--state-dir", state_dir,
            )  # fmt: skip
            _archived(front, UPDATES + 1)  # the updates, then the end marker
            from_archive = _replayed(
                capsys, tmp_path / "archive.jsonl", "--archive", str(archive), "--tenant", t,
                "--state-dir", state_dir,
            )  # fmt: skip
            live_slots = _sth_minutes(front, t)
    finally:
        receiver.close()
    backfilled = tmp_path / "backfill"
    status = cli.main(
        ["backfill", "--archive", str(archive), "--output", str(backfilled), "--history",
         "--tenant", t]
    )  # fmt: skip
    assert status == 0, capsys.readouterr().err
    assert len(live_slots) >= 10  # every entity has both, in one minute or more
    assert _backfilled_minutes(spark, backfilled) == live_slots
    _same(live, from_cluster, "--state-dir")
    # the archive's changes in their order: the updates, then the marker (its own pair)
    _same(live, Counter({k: n for k, n in from_archive.items() if k[0] < UPDATES}), "--archive")
    subscriptions_file.write_text(json.dumps([{**s, "tenant": t} for s in listed]))
    from_file = _replayed(
        capsys, tmp_path / "file.jsonl", "--updates", str(updates_file),
        "--subscriptions", str(subscriptions_file),
    )  # fmt: skip
    _same(live, from_file, "--subscriptions")
