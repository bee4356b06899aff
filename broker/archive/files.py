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

``ROOT`` is a local directory or any URI pyarrow's file systems open (``s3://bucket/prefix``,
...: broker.archive.location), and the paths here are that file system's. A file is written
whole or not at all (:func:`write_batch`): locally as ``.<name>.tmp`` in its directory (a
name Spark and :func:`summary` skip, as every name starting with ``.`` or ``_``), flushed
and fsync'd, renamed to its name, and the directory fsync'd; on an object store as one
upload of the whole object; the archiver records its cursors only after that
(broker.roles.archiver).

``pyarrow`` is imported where used (the ``archive`` extra): importing this module needs none.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any, Final
from urllib.parse import quote

from broker.archive.location import ArchiveRoot
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
_LEVELS: Final = ("tenant=", "day=", "type=")  # the directories above a file
_READERS: Final = 16  # footers read at once by summary()
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


def group_directory(root: ArchiveRoot, tenant: str, day: str, entity_type: str) -> str:
    """The directory of one tenant's changes of one day and entity type."""
    return root.join(
        f"tenant={quote(tenant or DEFAULT_TENANT, safe='')}",
        f"day={day}",
        f"type={quote(entity_type, safe='')}",
    )


def file_name(batch: int, archive_id: str, token: str = "") -> str:
    """The name of a batch's file in each directory it writes (``token``: the try's)."""
    return f"part-{batch:010d}-{archive_id}{'-' + token if token else ''}.parquet"


def marker_of(root: ArchiveRoot) -> dict[str, Any] | None:
    """What the root's marker says (None: no marker, or not one this module wrote).
    InvalidInput if it cannot be read."""
    try:
        data = root.read(root.join(MARKER))
    except OSError as exc:
        raise InvalidInput(f"--archive {root.uri}: {exc.strerror or exc}") from None
    try:
        found = json.loads(data) if data is not None else None
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


def claim(root: ArchiveRoot, archive_id: str, cluster: str) -> None:
    """Make ``root`` the archive ``archive_id``: created with its marker, or already it.
    InvalidInput if it holds another archive, or cannot be made."""
    root.make()
    found = marker_of(root)
    if found is not None:
        if found.get("id") != archive_id:
            raise InvalidInput(
                f"--archive {root.uri} holds the archive {found.get('id')!r} of cluster "
                f"{found.get('cluster')!r}, not this cluster's ({archive_id!r}): give a new "
                "path, or move that archive away"
            )
        return
    data = json.dumps({"id": archive_id, "cluster": cluster}).encode()
    try:
        root.write(root.join(MARKER), lambda out: out.write(data))
    except OSError as exc:
        raise InvalidInput(f"--archive {root.uri}: {exc.strerror or exc}") from None


def write_batch(root: ArchiveRoot, rows: Sequence[ArchiveRow], name: str) -> list[str]:
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
        root.make_directory(directory)
        root.write(
            posixpath.join(directory, name), partial(pq.write_table, table, compression="zstd")
        )
        written.append(directory)
    root.settle(written)  # new directories are durable entries of their parents
    return written


def remove_batch(root: ArchiveRoot, directories: Iterable[str], name: str) -> int:
    """Delete the files (and temporary files) ``name`` of a batch that did not complete
    from these directories of :func:`group_directory`, taken under ``root`` (they may name
    the root the archive was moved from); how many went."""
    return sum(
        root.remove(root.join(*directory.rsplit("/", 3)[-3:]), (name, f".{name}.tmp"))
        for directory in directories
    )


def summary(root: ArchiveRoot) -> list[DaySummary]:
    """Files and rows per tenant and day that has files (from their footers, read in
    parallel: an object store answers each after a round trip), sorted. A file deleted
    while it is read (a batch that did not complete, undone) is not counted."""
    parquet = []
    for relative in root.files():
        parts = relative.split("/")
        if len(parts) != 4 or not all(
            part.startswith(prefix) for part, prefix in zip(parts, _LEVELS, strict=False)
        ):
            continue
        if parts[3].endswith(".parquet") and parts[3][:1] not in "._":
            parquet.append(((parts[0][7:], parts[1][4:]), root.join(relative)))
    found: dict[tuple[str, str], list[int]] = {}
    with ThreadPoolExecutor(max_workers=_READERS) as pool:
        footers = pool.map(partial(_footer_rows, root), [path for _key, path in parquet])
        for (key, _path), rows in zip(parquet, footers, strict=True):
            if rows is not None:
                counts = found.setdefault(key, [0, 0])
                counts[0] += 1
                counts[1] += rows
    return [DaySummary(t, d, files, rows) for (t, d), (files, rows) in sorted(found.items())]


def _footer_rows(root: ArchiveRoot, path: str) -> int | None:
    """The rows of a file, from its footer (None: the file is gone)."""
    import pyarrow.parquet as pq

    try:
        return int(pq.read_metadata(path, filesystem=root.filesystem).num_rows)
    except (OSError, ValueError):  # pyarrow's errors: ArrowIOError, ArrowInvalid
        if not root.is_file(path):
            return None  # deleted meanwhile: a batch that did not complete, undone
    # replaced meanwhile (the batch written again): read whole this time
    return int(pq.read_metadata(path, filesystem=root.filesystem).num_rows)


def _groups(root: ArchiveRoot, rows: Iterable[ArchiveRow]) -> dict[str, list[ArchiveRow]]:
    groups: dict[str, list[ArchiveRow]] = {}
    for row in rows:
        directory = group_directory(root, row.tenant, row.day, row.entity_type)
        groups.setdefault(directory, []).append(row)
    return groups
