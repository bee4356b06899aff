"""``silbo replay`` end to end, in-process on the session's Spark: W-IoT updates and
subscriptions (rendered as Orion lists them) replayed, compared with the same passes in
plain Python around the reference matcher (the updates applied in order to their
entities, the matches decided as the front decides); both output formats,
Parquet input, initial entities, bad input, and the subscriptions of a real cluster. The
live broker is held to the same result in test_replay_live.py (the join method matches as
the engine does: test_matching.py)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from conftest import StartCluster

import spark_matcher.source
from broker import cli
from broker.bench.workloads.iot import iot_subscriptions, iot_updates
from broker.client import Client
from broker.commands.replay import read_subscriptions
from broker.coordination.configuration import Configuration
from broker.matching.reference import ReferenceMatcher
from broker.model.subscription import Subscription
from broker.model.update import ContextUpdate
from broker.ngsi.allow import AllowList
from broker.ngsi.subscriptions import HttpSubscription, parse_document
from broker.partition.parts import unpack_part
from broker.partition.selector import RendezvousSelector
from broker.roles.matcher_dump import PART_SIZE, owned_parts
from spark_matcher.decisions import FrontSubscription, decided
from spark_matcher.entities import InputError, update_from_json, update_to_json, write_updates
from spark_matcher.history import Clock, steps

SEED = 11


def ngsi(subscription: Subscription) -> dict[str, Any]:
    """The subscription as GET /v2/subscriptions shows it, with its tenant and scope."""
    selectors = [
        {
            key: value
            for key, value in (
                ("id", s.id),
                ("idPattern", s.id_pattern),
                ("type", s.type),
                ("typePattern", s.type_pattern),
            )
            if value is not None
        }
        for s in subscription.entities
    ]
    subject: dict[str, Any] = {"entities": selectors}
    expression = {k: v for k, v in (("q", subscription.q), ("mq", subscription.mq)) if v}
    if expression:
        subject["condition"] = {"expression": expression}
    notification = {"http": {"url": "http://receiver.example.com/notify"}}
    parsed = parse_document(
        {"subject": subject, "notification": notification}, AllowList.parse(["*"])
    )
    shown = HttpSubscription(
        subscription.id, subscription.tenant, subscription.service_path, parsed
    ).to_json(time.time())
    return {**shown, "tenant": subscription.tenant, "servicePath": subscription.service_path}


@pytest.fixture(scope="module")
def workload() -> tuple[list[ContextUpdate], list[Subscription]]:
    return iot_updates(400, SEED, stations=40), iot_subscriptions(300, SEED, stations=40)


def expected(
    updates: list[ContextUpdate],
    subscriptions: list[Subscription],
    fronts: list[FrontSubscription] | None = None,
    initial: Sequence[ContextUpdate] = (),
) -> list[list[Any]]:
    """The notifications of a replay, worked out in Python: the state pass, the reference
    matcher on the entities published, the decision pass (``fronts``: the subscriptions'
    documents; by default, those of ``subscriptions`` as :func:`ngsi` renders them)."""
    if fronts is None:
        fronts = [_front(s) for s in subscriptions]
    rows = [(_key(u), True, n, json.dumps(update_to_json(u))) for n, u in enumerate(initial)]
    rows += [(_key(u), False, n, json.dumps(update_to_json(u))) for n, u in enumerate(updates)]
    rows.sort(key=lambda r: (r[0], not r[1], r[2]))
    stepped = {row[0]: row for row in steps(Clock(time.time()), "u", "i")(rows)}
    published = [n for n in sorted(stepped) if stepped[n][2] is not None]
    entities = [update_from_json(json.loads(stepped[n][2])) for n in published]
    found = ReferenceMatcher(subscriptions).match_batch(entities)
    pairs = sorted((s, n) for n, ids in zip(published, found, strict=True) for s in ids)
    decisions = [(s, n, stepped[n][1], *stepped[n][3:8]) for s, n in pairs]
    held = {f.id: f for f in fronts}
    return sorted([n, s] for n, s in decided(lambda: held)(decisions))


def _key(update: ContextUpdate) -> str:
    return repr((update.tenant, update.service_path, update.entity_id, update.entity_type))


def _front(subscription: Subscription) -> FrontSubscription:
    document = ngsi(subscription)
    body = {k: v for k, v in document.items() if k not in ("tenant", "servicePath")}
    return FrontSubscription(subscription.id, subscription.tenant, subscription.service_path, body)


def write_inputs(
    tmp_path: Path, workload: tuple[list[ContextUpdate], list[Subscription]]
) -> tuple[Path, Path]:
    updates, subscriptions = workload
    updates_file, subscriptions_file = tmp_path / "updates.jsonl", tmp_path / "subs.json"
    write_updates(updates, updates_file)
    subscriptions_file.write_text(json.dumps([ngsi(s) for s in subscriptions]))
    return updates_file, subscriptions_file


def replay(capsys: pytest.CaptureFixture[str], *arguments: str) -> tuple[int, str, str]:
    status = cli.main(["replay", *arguments])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_jsonl_output_is_the_python_replays_sorted(
    spark: Any,
    tmp_path: Path,
    workload: tuple[list[ContextUpdate], list[Subscription]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    updates_file, subscriptions_file = write_inputs(tmp_path, workload)
    out = tmp_path / "matches.jsonl"
    status, stdout, stderr = replay(
        capsys, "--updates", str(updates_file), "--subscriptions", str(subscriptions_file),
        "--out", str(out), "--partitions", "2",
    )  # fmt: skip
    assert status == 0, stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    want = expected(*workload)
    assert want, "the workload should match something"
    assert [[r["update"], r["subscription"]] for r in rows] == want
    assert set(rows[0]) == {"update", "subscription"}
    assert f"400 updates, 300 subscriptions: {len(want)} notifications" in stdout
    assert "planning 300 subscriptions in 2 partitions" in stderr


def test_parquet_input_and_output_and_initial_entities(
    spark: Any,
    tmp_path: Path,
    workload: tuple[list[ContextUpdate], list[Subscription]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    updates_file, subscriptions_file = write_inputs(tmp_path, workload)
    parquet_updates = tmp_path / "updates.parquet"
    spark.read.json(str(updates_file)).coalesce(1).write.parquet(str(parquet_updates))
    initial = iot_updates(60, SEED + 1, stations=40)
    initial_file = tmp_path / "initial.jsonl"
    write_updates(initial, initial_file)
    out = tmp_path / "matches.parquet"
    status, _, stderr = replay(
        capsys, "--updates", str(parquet_updates), "--subscriptions", str(subscriptions_file),
        "--initial-state", str(initial_file), "--out", str(out),
    )  # fmt: skip
    assert status == 0, stderr
    written = spark.read.parquet(str(out))
    assert written.columns == ["update", "subscription"]
    want = expected(*workload, initial=initial)
    assert sorted([r[0], r[1]] for r in written.collect()) == want
    assert want != expected(*workload), "the initial entities should change something"


def test_subscriptions_take_their_tenant_and_scope(tmp_path: Path) -> None:
    subscription = Subscription(
        "s1", iot_subscriptions(1, SEED)[0].entities, tenant="t1", service_path="/a/#", q="x>1"
    )
    path = tmp_path / "subs.json"
    document = ngsi(subscription)
    path.write_text(json.dumps([document]))
    [front] = read_subscriptions(path)
    assert (front.id, front.tenant, front.scope) == ("s1", "t1", "/a/#")
    read = front.matched()
    assert (read.id, read.tenant, read.service_path, read.q) == ("s1", "t1", "/a/#", "x>1")
    assert read.entities == subscription.entities
    del document["tenant"], document["servicePath"]
    path.write_text(json.dumps([document]))
    [default] = read_subscriptions(path)
    assert (default.tenant, default.scope) == ("", "/#")


def _bad_subscriptions(tmp_path: Path, documents: Any) -> str:
    path = tmp_path / "subs.json"
    path.write_text(json.dumps(documents))
    with pytest.raises(InputError) as caught:
        read_subscriptions(path)
    return str(caught.value)


def test_bad_subscriptions_name_the_index_and_the_field(tmp_path: Path) -> None:
    good = ngsi(iot_subscriptions(1, SEED)[0])
    no_entities = {**good, "id": "x", "subject": {"condition": good["subject"]["condition"]}}
    message = _bad_subscriptions(tmp_path, [good, no_entities])
    assert message == f"{tmp_path / 'subs.json'}: subscription 1: subject.entities: is missing"
    bad_q = {**good, "subject": {**good["subject"], "condition": {"expression": {"q": "a>>"}}}}
    assert "subscription 0: subject.condition.expression.q: " in _bad_subscriptions(
        tmp_path, [bad_q]
    )
    assert "subscription 0: id: " in _bad_subscriptions(tmp_path, [{"subject": {}}])
    assert "subscription 1: id: subscription id 'iot-0' is repeated" in _bad_subscriptions(
        tmp_path, [good, good]
    )
    assert "subscription 0: servicePath: " in _bad_subscriptions(
        tmp_path, [{**good, "servicePath": "no-slash"}]
    )
    assert "subscriptions must be a JSON array" in _bad_subscriptions(tmp_path, {"a": 1})


def test_bad_input_is_one_line_and_exit_2(
    spark: Any,
    tmp_path: Path,
    workload: tuple[list[ContextUpdate], list[Subscription]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    updates_file, subscriptions_file = write_inputs(tmp_path, workload)
    lines = updates_file.read_text().splitlines()
    broken = tmp_path / "broken.jsonl"
    broken.write_text("\n".join([*lines[:2], '{"id": "x", "t": ', *lines[2:5]]) + "\n")
    out = str(tmp_path / "m.jsonl")
    subs = ["--subscriptions", str(subscriptions_file)]
    status, _, stderr = replay(capsys, "--updates", str(broken), *subs, "--out", out)
    assert status == 2
    assert stderr.splitlines()[-1].startswith(f"silbo replay: error: {broken}: line 3: ")
    assert "Traceback" not in stderr

    bad_time = tmp_path / "bad_time.jsonl"
    bad_time.write_text("\n".join([*lines[:3], '{"id": "x", "time": "noon"}']) + "\n")
    status, _, stderr = replay(capsys, "--updates", str(bad_time), *subs, "--out", out)
    assert (status, stderr.splitlines()[-1]) == (
        2,
        f"silbo replay: error: {bad_time}: line 4: time: 'noon' is neither epoch seconds "
        "nor an ISO 8601 date",
    )  # read in the state pass
    bad_time.write_text("\n".join([*lines[:1], '{"id": "x", "time": true}']) + "\n")
    status, _, stderr = replay(capsys, "--updates", str(bad_time), *subs, "--out", out)
    assert (status, stderr.splitlines()[-1]) == (
        2,
        f"silbo replay: error: {bad_time}: line 2: time: True is neither epoch seconds "
        "nor an ISO 8601 date",
    )  # checked natively

    bad_field = tmp_path / "bad_field.jsonl"
    bad_field.write_text("\n".join([*lines[:1], '{"id": "x", "servicePath": "nope"}']) + "\n")
    status, _, stderr = replay(capsys, "--updates", str(bad_field), *subs, "--out", out)
    assert status == 2
    assert f"{bad_field}: line 2: servicePath: " in stderr.splitlines()[-1]

    missing = tmp_path / "missing.jsonl"
    status, _, stderr = replay(capsys, "--updates", str(missing), *subs, "--out", out)
    assert (status, stderr.splitlines()[-1]) == (
        2,
        f"silbo replay: error: {missing}: no such file",
    )
    status, _, stderr = replay(
        capsys, "--updates", str(updates_file), "--subscriptions", str(missing), "--out", out
    )
    assert status == 2 and f"{missing}: No such file or directory" in stderr
    status, _, stderr = replay(
        capsys, "--updates", str(updates_file), *subs, "--out", str(tmp_path / "m.csv")
    )
    assert status == 2 and "must end in .parquet or .jsonl" in stderr


def test_a_matcher_lists_what_it_owns_in_parts() -> None:
    subscriptions = iot_subscriptions(PART_SIZE + 10, SEED)
    selector = RendezvousSelector(("m1", "m2"))
    configuration = Configuration(3, ("m1", "m2"), selector)
    holder = ReferenceMatcher(subscriptions)

    async def listed(name: str, configuration: Configuration | None) -> list[Any]:
        return [part async for part in owned_parts(holder, name, configuration)]

    for name in ("m1", "m2"):
        parts = asyncio.run(listed(name, configuration))
        assert {(p.sender, p.epoch, p.plan) for p in parts} == {(name, 3, "")}
        ids = [s.id for p in parts for s in unpack_part(p.data, name).subscriptions]
        assert ids == [s.id for s in subscriptions if selector.owner_of(s.id) == name]
        assert len(parts) == -(-len(ids) // PART_SIZE)
    assert asyncio.run(listed("m3", configuration)) == []
    assert asyncio.run(listed("m1", None)) == []
    holder = ReferenceMatcher()
    [empty] = asyncio.run(listed("m1", Configuration(4, ("m1",), RendezvousSelector(("m1",)))))
    assert (empty.epoch, unpack_part(empty.data, "m1").subscriptions) == (4, [])


def test_state_dir_replays_what_a_running_cluster_holds(
    spark: Any,
    start_cluster: StartCluster,
    tmp_path: Path,
    workload: tuple[list[ContextUpdate], list[Subscription]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    updates, subscriptions = workload
    updates_file = tmp_path / "updates.jsonl"
    write_updates(updates, updates_file)
    cluster = start_cluster(matchers=2)
    out = tmp_path / "matches.jsonl"
    with Client.from_state_dir(cluster.state_dir) as client:
        held = client.subscribe_many(subscriptions)
        assert sorted(h.id for h in held) == sorted(s.id for s in subscriptions)
        status, stdout, stderr = replay(
            capsys, "--updates", str(updates_file), "--state-dir", str(cluster.state_dir),
            "--out", str(out),
        )  # fmt: skip
    assert status == 0, stderr
    assert "in 2 partitions" in stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    want = expected(updates, subscriptions, fronts=[])  # a gRPC client's: every match
    assert [[r["update"], r["subscription"]] for r in rows] == want
    assert "300 subscriptions" in stdout


def test_state_dir_without_a_cluster_is_exit_2(
    tmp_path: Path,
    workload: tuple[list[ContextUpdate], list[Subscription]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    updates_file, _ = write_inputs(tmp_path, workload)
    status, _, stderr = replay(
        capsys, "--updates", str(updates_file), "--state-dir", str(tmp_path / "none"),
        "--out", str(tmp_path / "m.jsonl"),
    )  # fmt: skip
    assert status == 2 and "no cluster described in" in stderr


def test_a_spark_failure_is_its_cause_and_exit_1(
    spark: Any,
    tmp_path: Path,
    workload: tuple[list[ContextUpdate], list[Subscription]],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    updates_file, subscriptions_file = write_inputs(tmp_path, workload)

    def failing(session: Any, path: Any) -> Any:
        return session.range(3).selectExpr(
            "id AS update", "CAST(raise_error('disk on fire') AS STRING) AS text"
        )

    monkeypatch.setattr(spark_matcher.source, "read_lines", failing)
    status, _, stderr = replay(
        capsys, "--updates", str(updates_file), "--subscriptions", str(subscriptions_file),
        "--out", str(tmp_path / "m.jsonl"),
    )  # fmt: skip
    assert status == 1
    last = stderr.splitlines()[-1]
    assert last.startswith("silbo replay: Spark failed: ") and "disk on fire" in last
    assert "Traceback" not in stderr
