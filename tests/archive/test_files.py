"""The archive's files (broker.archive.files): one per tenant, day and type of a batch, the
fixed schema, read back by what they hold; a batch deleted; a root of another archive
refused. And the bad input of the archive's commands (no processes needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from broker import cli
from broker.archive.files import (
    MARKER,
    arrow_schema,
    claim,
    file_name,
    remove_batch,
    summary,
    write_batch,
)
from broker.errors import InvalidInput
from broker.store.changelog import ArchiveRow


def _row(tenant: str, entity_type: str, sequence: int, day: str = "2024-05-01") -> ArchiveRow:
    entity = {"id": "E", "type": entity_type, "tenant": tenant, "servicePath": "/"}
    return ArchiveRow(
        tenant, day, "/", "E", entity_type, 1_714_521_600_000_000 + sequence, 7, sequence,
        "entityChange", ["t"], [], ["t"], json.dumps(entity), 1_714_521_600_000_000,
    )  # fmt: skip


def test_a_batch_is_one_file_per_tenant_day_and_type_with_the_schema(tmp_path: Path) -> None:
    rows = [
        _row("", "Room", 3),
        _row("", "Room", 1),
        _row("", "Car", 2),
        _row("a/b", "Room", 4),  # quoted in its directory
        _row("", "Room", 5, day="2024-05-02"),
    ]
    name = file_name(1, "abc")
    written = write_batch(tmp_path, rows, name)
    assert sorted(str(d.relative_to(tmp_path)) for d in written) == [
        "tenant=_/day=2024-05-01/type=Car",
        "tenant=_/day=2024-05-01/type=Room",
        "tenant=_/day=2024-05-02/type=Room",
        "tenant=a%2Fb/day=2024-05-01/type=Room",
    ]
    table = pq.read_table(tmp_path / "tenant=_/day=2024-05-01/type=Room" / name)
    assert table.schema == arrow_schema()
    assert table.column("sequence").to_pylist() == [1, 3]  # by time
    assert not list(tmp_path.rglob(".*.tmp"))
    write_batch(tmp_path, [_row("", "Room", 9)], file_name(2, "abc"))
    assert [(d.tenant, d.day, d.files, d.rows) for d in summary(tmp_path)] == [
        ("_", "2024-05-01", 3, 4),
        ("_", "2024-05-02", 1, 1),
        ("a%2Fb", "2024-05-01", 1, 1),
    ]
    assert remove_batch(written, name) == 4  # a batch that did not complete
    assert [(d.tenant, d.day, d.files, d.rows) for d in summary(tmp_path)] == [
        ("_", "2024-05-01", 1, 1)
    ]


def test_a_root_is_one_archives_only(tmp_path: Path) -> None:
    claim(tmp_path / "root", "abc", "silbo")
    claim(tmp_path / "root", "abc", "silbo")  # again: the same archive
    assert json.loads((tmp_path / "root" / MARKER).read_text())["id"] == "abc"
    with pytest.raises(InvalidInput, match="holds the archive 'abc' of cluster 'silbo'"):
        claim(tmp_path / "root", "def", "other")
    (tmp_path / "file").write_text("")
    with pytest.raises(InvalidInput, match="--archive"):
        claim(tmp_path / "file" / "root", "abc", "silbo")


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["run", "archiver", "--zk", "127.0.0.1:1"], "the archiver needs --archive PATH"),
        (["run", "context-store", "--zk", "127.0.0.1:1", "--store-dir", "x", "--archive", "yes"],
         "--archive of a context store is on or off"),
        (["run", "matcher", "--zk", "127.0.0.1:1", "--archive", "/a"],
         "--archive is for context stores (on|off) and the archiver (PATH), not a matcher"),
        (["run", "archiver", "--zk", "127.0.0.1:1", "--archive", "/a", "--archive-rows", "0"],
         "--archive-rows must be at least 1"),
        (["replay", "--updates", "u.jsonl", "--subscriptions", "s.json", "--out", "o.jsonl",
          "--tenant", "t"], "--tenant goes with --archive"),
        (["replay", "--archive", "{tmp}/missing", "--subscriptions", "s.json", "--out",
          "{tmp}/o.jsonl"], "missing: no such directory"),
        (["replay", "--archive", "{tmp}", "--subscriptions", "s.json", "--out", "{tmp}/o.jsonl"],
         f"not an archive (no {MARKER})"),
        (["replay", "--archive", "{tmp}", "--subscriptions", "s.json", "--out", "{tmp}/o.jsonl",
          "--initial-state", "i.jsonl"], "--initial-state goes with --updates"),
    ],
)  # fmt: skip
def test_the_archives_commands_refuse_bad_input(
    argv: list[str], said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main([a.replace("{tmp}", str(tmp_path)) for a in argv]) == 2
    assert said in capsys.readouterr().err
