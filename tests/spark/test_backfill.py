"""``silbo backfill`` against the live stores on the same input (issue 20's differential
proof), on the session's Spark, one backfill for the module:

- history: a seeded random run of upserts and deletes (numbers, numeric texts, texts,
  DateTimes, values that are not aggregated; writes at one microsecond, across minutes,
  hours, days and months) applied by the store's own write path (broker.store.entities,
  in memory, history on); every slot of every level the backfill writes is the store's,
  exactly (floats too: the same samples summed in the same order), and none is missing;
- aggregation: two store processes' aggregators (broker.store.aggregation_runtime, driven
  as tests/store/test_aggregation.py drives them, reports lost on the way) run a 2-level
  hierarchy (sensors -> buildings -> campuses, a building moved while running) with a
  tumbling and a sliding group, over writes applied by the store (readings repeated,
  sensors deleted, other attributes), their derived writes applied back through it; every
  window the backfill writes is the one written live, attributes and metadata alike, and
  none is missing.

Both runs are archived as the archiver writes (a test helper following the archive's
schema, spark_matcher.archive), some changes twice (an archiver delivers at least once).
Then a range's slots (the history task in process), the groups of a cluster (ZooKeeper),
and bad input: the errors and exit status 2 of the command.
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import zlib
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from broker.cli import build_parser
from broker.commands.backfill import cluster_versions, read_versions
from broker.coordination.aggregations import AGGREGATIONS, Kept, Stored
from broker.coordination.client import connect
from broker.coordination.embedded import EmbeddedZooKeeper
from broker.store.aggregation import FUNCTIONS
from broker.store.aggregation_runtime import Aggregator, DerivedWrite, Version
from broker.store.entities import Entities, MemoryEngine, partition_of
from broker.store.history import HistoryOptions
from broker.store.history_fold import LEVELS, micros
from broker.store.history_query import HistoryQuery
from broker.store.semantics import Applied, Mode
from broker.store.wire import Intent
from spark_matcher.archive import archive_day
from spark_matcher.backfill import history_slots

T0 = 1_714_607_990.0  # 2024-05-01T23:59:50Z: the aggregation run crosses a day
SEED = 20
CAMPUS = "campus"  # the aggregation run's tenant (the history run's is the default one)

# -- the archive, as the archiver writes it -----------------------------------------------

ARCHIVE = pa.schema(
    [
        ("service_path", pa.string()),
        ("entity_id", pa.string()),
        ("entity_type", pa.string()),
        ("time", pa.int64()),
        ("partition", pa.int32()),
        ("sequence", pa.int64()),
        ("alteration", pa.string()),
        ("changed", pa.list_(pa.string())),
        ("meta_changed", pa.list_(pa.string())),
        ("requested", pa.list_(pa.string())),
        ("entity", pa.string()),
        ("date_created", pa.int64()),
    ]
)


@dataclass
class Archived:
    """A store applying writes at given times (the store's own path, in memory), and the
    archive rows of the changes it applied: one per change, with its partition's sequence."""

    history: bool = False
    rows: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # (tenant, row)
    sequences: dict[int, int] = field(default_factory=lambda: defaultdict(int))

    def __post_init__(self) -> None:
        forever = "raw=forever,minute=forever,hour=forever,day=forever"
        options = HistoryOptions.parse(forever) if self.history else None
        self.entities = Entities(MemoryEngine(), history=options)

    def write(self, intents: Sequence[Intent], now: float) -> list[Applied]:
        results = self.entities.apply_now(intents, now)
        for applied in results:
            if applied.change is not None:  # one that changed nothing too (entityUpdate)
                self.rows.append(self._row(applied, now))
        return results

    def _row(self, applied: Applied, now: float) -> tuple[str, dict[str, Any]]:
        assert applied.change is not None
        entity = applied.document or applied.before
        assert entity is not None
        partition = partition_of(entity.tenant, entity.id)
        self.sequences[partition] += 1
        change = applied.change
        # the write's time: its new dateModified (a delete, one that changed nothing: now)
        moment = micros(max(now, applied.document.date_modified if applied.document else now))
        text = {
            "id": entity.id,
            "type": entity.type,
            "tenant": entity.tenant,
            "servicePath": entity.service_path,
            **entity.attributes,
        }
        return entity.tenant, {
            "service_path": entity.service_path,
            "entity_id": entity.id,
            "entity_type": entity.type,
            "time": moment,
            "partition": partition,
            "sequence": self.sequences[partition],
            "alteration": change.alteration.value,
            "changed": sorted(change.changed),
            "meta_changed": sorted(change.meta_changed),
            "requested": sorted(change.requested),
            "entity": json.dumps(text, ensure_ascii=False),
            "date_created": micros(entity.date_created),
        }


def write_archive(
    root: Path, rows: Iterable[tuple[str, dict[str, Any]]], rng: random.Random
) -> None:
    """Write the rows under ROOT/tenant=/day=/type=/, a file a directory (rows out of
    order), and a few rows again in another (delivered twice)."""
    by_directory: dict[Path, tuple[list[dict[str, Any]], list[dict[str, Any]]]] = {}
    for tenant, row in rows:
        directory = (
            root
            / f"tenant={quote(tenant, safe='') or '_'}"
            / f"day={archive_day(row['time'])}"
            / f"type={quote(row['entity_type'], safe='')}"
        )
        held, again = by_directory.setdefault(directory, ([], []))
        held.append(row)
        if rng.random() < 0.03:
            again.append(row)
    for directory, files in by_directory.items():
        directory.mkdir(parents=True)
        for number, part in enumerate(files):
            if part:
                rng.shuffle(part)
                table = pa.Table.from_pylist(part, schema=ARCHIVE)
                pq.write_table(table, directory / f"part-{number}.parquet")


# -- (a) history: a random run through the store's write path -----------------------------

TYPES = {"n": "Number", "s": "Text", "d": "DateTime", "b": "Boolean"}
POOLS: dict[str, list[Any]] = {
    "n": [2.5, -3.0, 7.25, 1e6, 3, 17, "12.5", 0.1, 1 / 3, None, True, {"a": 1}],
    "s": ["on", "off", "a.b$", " ", "21"],
    "d": ["2024-01-01T00:00:00Z", "2024-01-02T00:00:00Z"],
    "b": [True, False],
}
# the moments between two batches: a microsecond, seconds, minutes, hours, now and then a day
STEPS = {0.0: 10, 0.0004: 5, 0.3: 20, 1.0: 20, 59.0: 15, 61.0: 10, 3599.0: 12, 86400.0: 2}
ENTITY_ORDER = ("tenant", "service_path", "entity_id", "entity_type", "time", "sequence")
HISTORY_ENTITIES = [("E1", "Room", "/"), ("E2", "Room", "/"), ("H1", "Hall:A", "/a/b")]


def history_run(rng: random.Random) -> Archived:
    store = Archived(history=True)
    now = T0 - 5 * 86400  # into May: a month's days are merged
    for _ in range(300):
        now += rng.choices(list(STEPS), weights=list(STEPS.values()))[0]
        batch = []
        for _ in range(rng.choice([1, 1, 1, 2, 3])):  # a batch: one microsecond
            entity_id, kind, path = rng.choice(HISTORY_ENTITIES)
            if rng.random() < 0.04:
                batch.append(Intent(Mode.DELETE_ENTITY, entity_id, kind, path))
                continue
            names = rng.sample(sorted(POOLS), rng.randint(1, 3))
            attributes = {
                n: {"type": TYPES[n], "value": rng.choice(POOLS[n]), "metadata": {}} for n in names
            }
            batch.append(Intent(Mode.UPSERT, entity_id, kind, path, "", attributes))
        store.write(batch, now)
    return store


# -- (b) aggregation: two stores' aggregators, their derived writes stored back -------------

STORES = ("s1", "s2")
TICK = 0.05
SENSORS = [f"S{i}" for i in range(6)]
BUILDINGS = {"B0": "C0", "B1": "C0", "B2": "C1"}
MOVED_AT = T0 + 3.52  # B1 moves to C1 (mid-slide: not at a window's end)
GROUPS = [
    {"id": "tumbling", "window": {"type": "tumbling", "size": "2s"}},
    {"id": "sliding", "window": {"type": "sliding", "size": "3s", "slide": "1s"}},
]


def group_bodies() -> list[dict[str, Any]]:
    """The two groups as a definitions file holds them (tenant and scope beside)."""
    return [
        {
            **group,
            "entities": {"type": "Sensor", "q": "temperature<35"},
            "groupBy": [
                {"attribute": "refBuilding", "type": "Building"},
                {"attribute": "refCampus", "type": "Campus"},
            ],
            "attributes": ["temperature"],
            "functions": list(FUNCTIONS),
            "tenant": CAMPUS,
            "servicePath": "/#",
        }
        for group in GROUPS
    ]


@dataclass
class Live:
    """What the live stores wrote: each derived write, by group (the attributes' size)."""

    store: Archived
    derived: list[tuple[str, DerivedWrite]]


def aggregation_run(rng: random.Random, definitions: Path) -> Live:
    versions = [Version(v.definition, 1, T0) for v in read_versions(definitions)]
    store = Archived()
    aggregators = {name: Aggregator(name, index + 1) for index, name in enumerate(STORES)}
    for aggregator in aggregators.values():
        aggregator.define(versions)

    def owner(_tenant: str, entity_id: str) -> str:
        return STORES[zlib.crc32(entity_id.encode()) % 2]

    def write(intent: Intent, now: float) -> None:
        for applied in store.write([intent], now):  # observed at its primary, once durable
            if applied.document is not None:
                aggregators[owner("", applied.document.id)].observe([applied], now)

    def upsert(entity_id: str, kind: str, attributes: dict[str, Any], now: float) -> Intent:
        shaped = {
            n: v if isinstance(v, dict) else {"type": "Number", "value": v, "metadata": {}}
            for n, v in attributes.items()
        }
        return Intent(Mode.UPSERT, entity_id, kind, "/", CAMPUS, shaped)

    derived: list[tuple[str, DerivedWrite]] = []
    last: dict[str, dict[str, Any]] = {}  # each sensor's last reading
    for building, campus in BUILDINGS.items():
        relation = {"type": "Relationship", "value": campus, "metadata": {}}
        write(upsert(building, "Building", {"refCampus": relation}, T0), T0)
    now = T0
    for step in range(1, 260):
        now = round(T0 + step * TICK, 6)
        if abs(now - MOVED_AT) < TICK / 2:
            moved = {"refCampus": {"type": "Relationship", "value": "C1", "metadata": {}}}
            write(upsert("B1", "Building", moved, now), now)
        for _ in range(rng.randrange(3) if step < 200 else 0):
            sensor = rng.choice(SENSORS)
            if rng.random() < 0.05:
                write(Intent(Mode.DELETE_ENTITY, sensor, "Sensor", "/", CAMPUS), now)
                continue
            if sensor in last and rng.random() < 0.15:  # the same reading again: it counts
                write(upsert(sensor, "Sensor", last[sensor], now), now)  # (entityUpdate)
                continue
            parent = rng.choice(sorted(BUILDINGS))
            reading: dict[str, Any] = {
                "refBuilding": {"type": "Relationship", "value": parent, "metadata": {}}
            }
            if rng.random() < 0.9:
                reading["temperature"] = rng.randrange(-80, 160) / 4  # sums exact in any order
            else:
                reading["humidity"] = rng.randrange(100)
            write(upsert(sensor, "Sensor", reading, now), now)
            last[sensor] = reading
        for aggregator in aggregators.values():
            aggregator.close(now)
        for aggregator in aggregators.values():
            for target, (report, sent) in aggregator.reports(owner, STORES).items():
                fate = rng.random()
                if fate < 0.15:
                    continue  # the report is lost
                answer = aggregators[target].receive(report)
                if fate > 0.3:  # else the answer is lost
                    aggregator.answered(target, answer, sent)
        for name, aggregator in aggregators.items():
            owns = functools.partial(lambda store, _t, i: owner("", i) == store, name)
            writes, settled = aggregator.due(STORES, owns)
            for one in writes:
                label = next(iter(one.attributes)).rsplit("_", 1)[1]
                derived.append(("tumbling" if label == "2s" else "sliding", one))
                write(upsert(one.entity_id, one.entity_type, one.attributes, now), now)
            aggregator.written(settled)
    return Live(store, derived)


# -- the backfill, once -------------------------------------------------------------------


@dataclass
class Backfilled:
    """The live runs, and what the backfill wrote (its exit status, its tables' rows)."""

    history_store: Archived
    live: Live
    status: int
    history: list[dict[str, Any]]
    windows: list[dict[str, Any]]


def silbo(capsys: pytest.CaptureFixture[str], *words: str) -> tuple[int, str, str]:
    args = build_parser(["backfill"]).parse_args(["backfill", *words])
    status = args.handler(args)
    out, err = capsys.readouterr()
    return status, out, err


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Archived, Live]:
    """Both runs, archived; the definitions file."""
    rng = random.Random(SEED)
    where = tmp_path_factory.mktemp("backfill")
    definitions = where / "groups.json"
    definitions.write_text(json.dumps(group_bodies()))
    history_store = history_run(rng)
    live = aggregation_run(rng, definitions)
    write_archive(where / "archive", [*history_store.rows, *live.store.rows], rng)
    return where, definitions, history_store, live


@pytest.fixture(scope="module")
def backfilled(
    spark: Any,
    archive: tuple[Path, Path, Archived, Live],
    tmp_path_factory: pytest.TempPathFactory,
) -> Backfilled:
    where, definitions, history_store, live = archive
    out = where / "out"
    args = build_parser(["backfill"]).parse_args(
        [
            *("backfill", "--archive", str(where / "archive"), "--output", str(out)),
            *("--history", "--aggregations", str(definitions)),
        ]
    )
    status = args.handler(args)
    history = [r.asDict() for r in spark.read.parquet(str(out / "history")).collect()]
    windows = [r.asDict() for r in spark.read.parquet(str(out / "aggregations")).collect()]
    return Backfilled(history_store, live, status, history, windows)


def test_the_history_levels_are_the_stores(backfilled: Backfilled) -> None:
    assert backfilled.status == 0
    got: dict[tuple[Any, ...], list[list[Any]]] = defaultdict(list)
    for row in backfilled.history:
        if row["tenant"] == "":
            key = (row["service_path"], row["entity_id"], row["entity_type"], row["attribute"])
            slot = [row["samples"], row["sum"], row["sum2"], row["min"], row["max"]]
            got[(*key, row["level"])].append([row["start"], [*slot, json.loads(row["occur"])]])
    entities = backfilled.history_store.entities
    expected: dict[tuple[Any, ...], list[list[Any]]] = {}
    names = {(r["service_path"], r["entity_id"], r["entity_type"], n)
             for _t, r in backfilled.history_store.rows for n in r["changed"]}  # fmt: skip
    for path, entity_id, kind, name in names:
        for level in LEVELS:
            query = HistoryQuery("", path, entity_id, kind, name, level=level)
            slots = entities.read_history(query)
            if slots:
                expected[(path, entity_id, kind, name, level.value)] = slots
    assert len(expected) >= 30 and sum(len(s) for s in expected.values()) > 500
    assert {k: sorted(v) for k, v in got.items()} == expected


def test_the_windows_are_those_written_live(backfilled: Backfilled) -> None:
    live: dict[tuple[str, str, float], dict[str, Any]] = {}
    for group, write in backfilled.live.derived:
        live[(group, write.entity_id, write.end)] = write.attributes  # the last one counts
    got = {
        (w["aggregation"], w["entity_id"], w["end"]): json.loads(w["attributes"])
        for w in backfilled.windows
    }
    assert len(got) == len(backfilled.windows)  # one row per window
    levels = {(w["aggregation"], w["level"], w["entity_type"]) for w in backfilled.windows}
    assert levels == {
        (group, level, kind)
        for group in ("tumbling", "sliding")
        for level, kind in ((0, "Building"), (1, "Campus"))
    }
    moved = [k for k in got if k[1] == "C1" and k[2] > MOVED_AT]
    assert moved  # B1's windows after the move count under C1
    repeated = [r for _t, r in backfilled.live.store.rows if r["alteration"] == "entityUpdate"]
    assert len(repeated) > 5  # readings repeated, counted at the time they were written
    assert got == live


def test_a_range_keeps_the_slots_wholly_in_it(archive: tuple[Path, Path, Archived, Live]) -> None:
    # the history task, in process: a range's slots are the whole run's within it, those
    # it cuts left out
    rows = sorted(
        ({**row, "tenant": tenant} for tenant, row in archive[2].rows),
        key=lambda r: [r[c] for c in ENTITY_ORDER],
    )
    since, until = T0 - 4 * 86400 + 1800, T0 - 86400
    span = [r for r in rows if since <= r["time"] / 1e6 < until]
    everything = set(history_slots(rows))
    ranged = set(history_slots(span, since, until))
    assert ranged and ranged < everything
    spans = {"second": 1, "minute": 60, "hour": 3600, "day": 86400}
    for slot in everything - ranged:
        level, start = slot[5], slot[6]
        assert start < since or start + spans.get(level, 28 * 86400) > until, slot


# -- the groups of a cluster ----------------------------------------------------------------


def test_a_clusters_groups_are_its_versions(zookeeper: EmbeddedZooKeeper) -> None:
    body = {k: v for k, v in group_bodies()[0].items() if k not in ("tenant", "servicePath")}
    changed = {**body, "functions": ["max"]}
    old, new = Kept(CAMPUS, "/#", body, 1, 100.0), Kept(CAMPUS, "/#", changed, 2, 160.0)
    stored = Stored(new, old, 90.0, 150.0)
    client = connect(zookeeper.address, cluster="backfill-groups", timeout=10.0)
    try:
        client.ensure_path(AGGREGATIONS)
        client.create(f"{AGGREGATIONS}/{CAMPUS}~tumbling", json.dumps(stored.to_json()).encode())
        client.create(f"{AGGREGATIONS}/other~bad", b"{}")  # not one: left out, as stores do
    finally:
        client.stop()
        client.close()
    args = argparse.Namespace(
        zk=zookeeper.address, cluster="backfill-groups", state_dir=None, tenant=CAMPUS
    )
    versions = cluster_versions(args)
    shown = [(v.number, v.since, v.until, v.definition.functions) for v in versions]
    assert shown == [(2, 160.0, None, ("max",)), (1, 100.0, 160.0, tuple(FUNCTIONS))]


# -- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ({"functions": ["median"]}, "aggregation 0: unknown functions ['median']"),
        ({"tenant": "Bad Tenant"}, "aggregation 0: tenant 'Bad Tenant'"),
        ({"servicePath": "nope"}, "aggregation 0: service path"),
    ],
)
def test_a_bad_definition_is_exit_2_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], given: dict[str, Any], says: str
) -> None:
    definitions = tmp_path / "groups.json"
    definitions.write_text(json.dumps([{**group_bodies()[0], **given}]))
    (tmp_path / "archive").mkdir()
    status, _out, err = silbo(
        capsys, "--archive", str(tmp_path / "archive"), "--output", str(tmp_path / "out"),
        "--aggregations", str(definitions),
    )  # fmt: skip
    assert status == 2 and f"silbo backfill: error: {definitions}: {says}" in err, err


@pytest.mark.parametrize(
    ("words", "says"),
    [
        (["--archive", "{tmp}/nothing", "--history"], "--archive {tmp}/nothing: no such directory"),
        (["--archive", "{tmp}"], "nothing to backfill: give --history"),
        (["--archive", "{tmp}", "--history", "--from", "10", "--to", "5"], "--from must be before"),
        (["--archive", "{tmp}", "--history", "--from", "yesterday"], "--from 'yesterday': neither"),
        (["--archive", "{tmp}", "--aggregations", "{tmp}/none.json"], "none.json: No such file"),
        (["--archive", "{tmp}", "--state-dir", "{tmp}"], "no cluster described in {tmp}"),
        (["--archive", "{tmp}", "--history", "--output", "{tmp}/a/b"], "no directory {tmp}/a"),
    ],
)
def test_bad_input_is_exit_2_with_what_is_wrong(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], words: list[str], says: str
) -> None:
    given = [w.format(tmp=tmp_path) for w in words]
    status, out, err = silbo(capsys, "--output", str(tmp_path / "out"), *given)
    assert status == 2 and out == "", (out, err)
    last = err.splitlines()[-1]
    assert last.startswith("silbo backfill: error: ") and says.format(tmp=tmp_path) in last, err


def test_no_change_in_the_range_is_exit_2(
    spark: Any,
    archive: tuple[Path, Path, Archived, Live],
    capsys: pytest.CaptureFixture[str],
) -> None:
    where = archive[0]
    status, _out, err = silbo(
        capsys, "--archive", str(where / "archive"), "--output", str(where / "none"),
        "--history", "--from", "2030-01-01T00:00:00Z",
    )  # fmt: skip
    says = "no change archived from 2030-01-01T00:00:00Z"
    assert status == 2 and err.endswith(
        f"silbo backfill: error: --archive {where}/archive: {says}\n"
    )
