"""The archive's Parquet files: where each change goes, how a file is written, what they hold.

Layout (the row schema is fixed: docs/archive.md)::

    ROOT/_silbo_archive.json                  {"id": ..., "cluster": ...}: whose archive
    ROOT/tenant=<tenant or _>/day=<YYYY-MM-DD>/type=<entity type>/part-<batch>-<id>.parquet

Hive-style directories, values percent-quoted (``urllib.parse.quote(value, safe="")``), so
that Spark's partition discovery reads ``tenant``, ``day`` and ``type`` back as columns;
``_`` is the default tenant; the day is the UTC day of the change's time. Each batch of the
archiver writes one file per (tenant, day, type) it has changes of, named after the batch
number and the archive's id (so a file of a batch is known by name, and two archives never
share one), rows sorted by time, partition, sequence.

A file is written whole or not at all: as ``.<name>.tmp`` in its directory (a name Spark
and :func:`summary` skip, as every name starting with ``.`` or ``_``), flushed and fsync'd,
renamed to its name, and the directory fsync'd (:func:`write_batch`); the archiver records
its cursors only after that (broker.roles.archiver).

``pyarrow`` is imported where used (the ``archive`` extra): importing this module needs none.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final
from urllib.parse import quote

from broker.errors import InvalidInput
from broker.store.changelog import ArchiveRow

__all__ = [
    "COLUMNS",
    "DEFAULT_TENANT",
    "MARKER",
    "DaySummary",
    "claim",
    "file_name",
    "group_directory",
    "marker_of",
    "remove_batch",
    "summary",
    "write_batch",
]

MARKER: Final = "_silbo_archive.json"
DEFAULT_TENANT: Final = "_"  # the directory of the default tenant ("")
# the columns of a file, in order, with their Arrow types (docs/archive.md)
COLUMNS: Final = (
    ("service_path", "string"),
    ("entity_id", "string"),
    ("entity_type", "string"),
    ("time", "int64"),
    ("partition", "int32"),
    ("sequence", "int64"),
    ("alteration", "string"),
    ("changed", "list<string>"),
    ("meta_changed", "list<string>"),
    ("requested", "list<string>"),
    ("entity", "string"),
    ("date_created", "int64"),
)


@dataclass(frozen=True, slots=True)
class DaySummary:
    """What the archive holds for one tenant and day."""

    tenant: str  # as its directory names it (``_``: the default tenant)
    day: str
    files: int
    rows: int


def arrow_schema() -> Any:
    """The Arrow schema of a file (:data:`COLUMNS`)."""
    import pyarrow as pa

    types = {
        "string": pa.string(),
        "int64": pa.int64(),
        "int32": pa.int32(),
        "list<string>": pa.list_(pa.string()),
    }
    return pa.schema([(name, types[kind]) for name, kind in COLUMNS])


def group_directory(root: Path, tenant: str, day: str, entity_type: str) -> Path:
    """The directory of one tenant's changes of one day and entity type."""
    return (
        root
        / f"tenant={quote(tenant or DEFAULT_TENANT, safe='')}"
        / f"day={day}"
        / f"type={quote(entity_type, safe='')}"
    )


def file_name(batch: int, archive_id: str) -> str:
    """The name of a batch's file in each directory it writes."""
    return f"part-{batch:010d}-{archive_id}.parquet"


def marker_of(root: Path) -> dict[str, Any] | None:
    """What the root's marker says (None: no marker, or not one this module wrote)."""
    try:
        found = json.loads((root / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def claim(root: Path, archive_id: str, cluster: str) -> None:
    """Make ``root`` the archive ``archive_id``: created with its marker, or already it.
    InvalidInput if it holds another archive, or cannot be made."""
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InvalidInput(f"--archive {root}: {exc.strerror or exc}") from None
    found = marker_of(root)
    if found is not None:
        if found.get("id") != archive_id:
            raise InvalidInput(
                f"--archive {root} holds the archive {found.get('id')!r} of cluster "
                f"{found.get('cluster')!r}, not this cluster's ({archive_id!r}): give a new path, "
                "or move that archive away"
            )
        return
    _write_whole(root / MARKER, json.dumps({"id": archive_id, "cluster": cluster}).encode())


def write_batch(root: Path, rows: Sequence[ArchiveRow], name: str) -> list[Path]:
    """Write ``rows`` as one file ``name`` per (tenant, day, type), each whole (module
    doc); the directories written, once every file is durable."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = arrow_schema()
    written = []
    for directory, group in sorted(_groups(root, rows).items()):
        group.sort(key=lambda r: (r.time, r.partition, r.sequence))
        table = pa.Table.from_pydict(
            {column: [getattr(r, column) for r in group] for column, _kind in COLUMNS},
            schema=schema,
        )
        directory.mkdir(parents=True, exist_ok=True)
        tmp = directory / f".{name}.tmp"
        with open(tmp, "wb") as out:
            pq.write_table(table, out, compression="zstd")
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, directory / name)
        _sync_directory(directory)
        written.append(directory)
    for parent in {p for d in written for p in (d.parent, d.parent.parent)}:
        _sync_directory(parent)  # new directories are durable entries of their parents
    _sync_directory(root)
    return written


def remove_batch(directories: Iterable[Path], name: str) -> int:
    """Delete the files (and temporary files) ``name`` of a batch that did not complete
    from these directories; how many went."""
    gone = 0
    for directory in directories:
        for path in (directory / name, directory / f".{name}.tmp"):
            try:
                path.unlink()
                gone += 1
            except FileNotFoundError:
                continue
        if directory.is_dir():
            _sync_directory(directory)
    return gone


def summary(root: Path) -> list[DaySummary]:
    """Files and rows per tenant and day that has files (from their footers), sorted."""
    import pyarrow.parquet as pq

    found: dict[tuple[str, str], list[int]] = {}
    for tenant_dir in _entries(root, "tenant="):
        for day_dir in _entries(tenant_dir, "day="):
            counts = found.setdefault((tenant_dir.name[7:], day_dir.name[4:]), [0, 0])
            for type_dir in _entries(day_dir, "type="):
                for path in type_dir.iterdir():
                    if path.suffix == ".parquet" and path.name[:1] not in "._":
                        counts[0] += 1
                        counts[1] += pq.read_metadata(path).num_rows
    return [
        DaySummary(t, d, files, rows) for (t, d), (files, rows) in sorted(found.items()) if files
    ]


def _entries(directory: Path, prefix: str) -> list[Path]:
    try:
        return sorted(p for p in directory.iterdir() if p.is_dir() and p.name.startswith(prefix))
    except FileNotFoundError:
        return []


def _groups(root: Path, rows: Iterable[ArchiveRow]) -> dict[Path, list[ArchiveRow]]:
    groups: dict[Path, list[ArchiveRow]] = {}
    for row in rows:
        directory = group_directory(root, row.tenant, row.day, row.entity_type)
        groups.setdefault(directory, []).append(row)
    return groups


def _write_whole(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)
    _sync_directory(path.parent)


def _sync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
