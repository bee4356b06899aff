"""The archive's files (broker.archive.files): one per tenant, day and type of a batch, the
fixed schema, read back by what they hold; a batch deleted; a root of another archive
refused; each on the three kinds of root (broker.archive.location): a local directory, a
real S3 protocol server (moto's) and a file system that renames (pyarrow's over a local
directory, as HDFS is taken). And the bad input of the archive's commands (no processes
needed).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path

import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from conftest import S3Server

from broker import cli
from broker.archive.files import (
    MARKER,
    _footer_rows,
    arrow_schema,
    claim,
    file_name,
    marker_of,
    remove_batch,
    summary,
    write_batch,
)
from broker.archive.location import ArchiveRoot, Kind, location, open_root
from broker.archive.state import ArchiveState, Pending
from broker.errors import InvalidInput
from broker.store.changelog import ArchiveRow

Rooted = Callable[[str], ArchiveRoot]  # a new root of one kind, by name


@pytest.fixture(params=[Kind.LOCAL, Kind.OBJECT_STORE, Kind.RENAMING], ids=lambda k: k.name)
def rooted(request: pytest.FixtureRequest, tmp_path: Path) -> Rooted:
    """Roots of one kind: ``rooted("a")`` is a new root named a."""
    kind: Kind = request.param
    if kind is Kind.LOCAL:
        return lambda name: open_root(str(tmp_path / name))
    if kind is Kind.OBJECT_STORE:
        s3: S3Server = request.getfixturevalue("s3_server")
        bucket = s3.bucket()
        return lambda name: open_root(s3.uri(f"{bucket}/{name}"))
    renaming = pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem())
    return lambda name: ArchiveRoot(f"subtree:{name}", Kind.RENAMING, renaming, name)


def _row(tenant: str, entity_type: str, sequence: int, day: str = "2024-05-01") -> ArchiveRow:
    entity = {"id": "E", "type": entity_type, "tenant": tenant, "servicePath": "/"}
    return ArchiveRow(
        tenant, day, "/", "E", entity_type, 1_714_521_600_000_000 + sequence, 7, sequence,
        "entityChange", ["t"], [], ["t"], json.dumps(entity), 1_714_521_600_000_000,
    )  # fmt: skip


def test_a_batch_is_one_file_per_tenant_day_and_type_with_the_schema(rooted: Rooted) -> None:
    root = rooted("archive")
    rows = [
        _row("", "Room", 3),
        _row("", "Room", 1),
        _row("", "Car", 2),
        _row("a/b", "Room", 4),  # quoted in its directory
        _row("", "Room", 5, day="2024-05-02"),
    ]
    name = file_name(1, "abc")
    written = write_batch(root, rows, name)
    assert [d[len(root.path) + 1 :] for d in sorted(written)] == [
        "tenant=_/day=2024-05-01/type=Car",
        "tenant=_/day=2024-05-01/type=Room",
        "tenant=_/day=2024-05-02/type=Room",
        "tenant=a%2Fb/day=2024-05-01/type=Room",
    ]
    room = root.join("tenant=_/day=2024-05-01/type=Room", name)
    table = pq.read_table(room, filesystem=root.filesystem)
    assert table.schema == arrow_schema()
    assert table.column("sequence").to_pylist() == [1, 3]  # by time
    assert not [f for f in root.files() if f.endswith(".tmp")]
    write_batch(root, [_row("", "Room", 9)], file_name(2, "abc"))
    assert [(d.tenant, d.day, d.files, d.rows) for d in summary(root)] == [
        ("_", "2024-05-01", 3, 4),
        ("_", "2024-05-02", 1, 1),
        ("a%2Fb", "2024-05-01", 1, 1),
    ]
    write_batch(root, [_row("", "Room", 7)], name)  # a retry of batch 1 replaces its file
    assert pq.read_table(room, filesystem=root.filesystem).column("sequence").to_pylist() == [7]
    # two tries of one batch (a hung archiver's and its replacement's) never share a name
    assert len({file_name(1, "abc", "t1"), file_name(1, "abc", "t2"), name}) == 3
    moved = [f"/moved/from/{d[len(root.path) + 1 :]}" for d in written]  # the archive moved
    assert remove_batch(root, moved, name) == 4  # a batch that did not complete
    assert remove_batch(root, written, name) == 0
    assert [(d.tenant, d.day, d.files, d.rows) for d in summary(root)] == [
        ("_", "2024-05-01", 1, 1)
    ]
    assert summary(rooted("empty")) == []
    # listed, then deleted before its footer is read (status while a batch is undone)
    assert _footer_rows(root, root.join("tenant=_/day=2024-05-01/type=Room", name)) is None


def test_a_root_is_one_archives_only(rooted: Rooted) -> None:
    root = rooted("root")
    assert marker_of(root) is None
    claim(root, "abc", "silbo")
    claim(root, "abc", "silbo")  # again: the same archive
    assert marker_of(root) == {"id": "abc", "cluster": "silbo"}
    assert root.exists() and root.files() == [MARKER]
    with pytest.raises(InvalidInput, match="holds the archive 'abc' of cluster 'silbo'"):
        claim(root, "def", "other")


def test_a_root_that_cannot_be(tmp_path: Path, s3_server: S3Server) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(InvalidInput, match="--archive"):
        claim(open_root(str(tmp_path / "file" / "root")), "abc", "silbo")
    missing = open_root(s3_server.uri(f"no-{uuid.uuid4().hex[:8]}/archive"))
    assert missing.kind is Kind.OBJECT_STORE and not missing.exists()
    with pytest.raises(InvalidInput, match="there is no bucket 'no-"):
        claim(missing, "abc", "silbo")
    with pytest.raises(InvalidInput, match="Unrecognized filesystem type"):
        open_root("nowhere://x/y")
    with pytest.raises(InvalidInput, match="names no bucket"):
        open_root(s3_server.uri(""))


def test_s3_takes_its_endpoint_and_region_from_the_environment_too(
    s3_server: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket = s3_server.bucket()
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", f"http://{s3_server.endpoint}")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    root = open_root(f"s3://{bucket}/archive")  # as on AWS: no query
    claim(root, "abc", "silbo")
    assert root.exists() and marker_of(open_root(s3_server.uri(f"{bucket}/archive")))


def test_where_an_archive_is_kept(tmp_path: Path) -> None:
    assert location("archive") == str(Path("archive").resolve())
    assert location(f"file://{tmp_path}/a%20b") == location(f"{tmp_path}/a b")
    root = open_root(f"file://localhost{tmp_path}/x")
    assert (root.kind, root.uri, root.path) == (Kind.LOCAL, f"{tmp_path}/x", f"{tmp_path}/x")
    uri = "s3://bucket/prefix?region=eu-west-1"
    assert location(uri) == uri  # kept as given: the query is pyarrow's
    with pytest.raises(InvalidInput, match="this host's files"):
        location("file://elsewhere/x")
    with pytest.raises(InvalidInput, match="credentials in the environment") as refused:
        location("s3://AKIA:hush@bucket/prefix")
    assert "hush" not in str(refused.value)


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["run", "archiver", "--zk", "127.0.0.1:1"], "the archiver needs --archive PATH|URI"),
        (["run", "context-store", "--zk", "127.0.0.1:1", "--store-dir", "x", "--archive", "yes"],
         "--archive of a context store is on or off"),
        (["run", "matcher", "--zk", "127.0.0.1:1", "--archive", "/a"],
         "--archive is for context stores (on|off) and the archiver (PATH|URI), not a matcher"),
        (["run", "archiver", "--zk", "127.0.0.1:1", "--archive", "/a", "--archive-rows", "0"],
         "--archive-rows must be at least 1"),
        (["run", "archiver", "--zk", "127.0.0.1:1", "--archive", "s3://k:hush@b/a"],
         "--archive s3://...: give the credentials in the environment"),
        (["up", "--archive", "s3://k:hush@b/a", "--state-dir", "{tmp}/state"],
         "--archive s3://...: give the credentials in the environment"),
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


def test_a_pending_batch_keeps_its_tries_token_through_zookeepers_json() -> None:
    state = ArchiveState("id1", "c", "/a").begun(Pending(3, ("/a/tenant=_",), "beef"))
    again = ArchiveState.decode(state.encode(), 7)
    assert again.pending == Pending(3, ("/a/tenant=_",), "beef") and again.version == 7
    older = json.loads(state.encode())  # a state written before tokens: the batch's own name
    del older["pending"]["token"]
    assert ArchiveState.decode(json.dumps(older).encode(), 1).pending == Pending(
        3, ("/a/tenant=_",)
    )
