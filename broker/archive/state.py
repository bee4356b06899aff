"""The archiver's state in ZooKeeper: its cursors, and the batch it is writing.

One persistent znode under the cluster's chroot, JSON::

    /archive   {"id": "3f2a9c1b7d4e", "cluster": "silbo", "root": "/abs/archive",
                "batch": 41, "cursors": {"17": 1715000000123456, ...},
                "pending": {"batch": 42, "directories": ["/abs/archive/tenant=_/..."]} | null,
                "batched": 1715000000.5, "rows": 120000}

``root``: where the archive is (broker.archive.location: an absolute path, or a URI such
as ``s3://bucket/prefix``); ``directories`` are paths of its file system (``bucket/prefix/
tenant=_/...`` on S3). ``cursors``: per partition, the sequence of the last change archived
(none: nothing yet).
``pending``: the batch being written: its files may exist, whole or not, in those
directories, and its changes are not counted as archived. The archiver's protocol
(broker.roles.archiver) is

1. write ``pending`` (the batch number and the directories its files go to);
2. write the files (each whole and durable: broker.archive.files; on an object store, one
   upload each);
3. write the cursors past the batch's changes, ``batch`` its number and ``pending`` null,
   in one write;
4. trim the stores' changelogs up to the cursors.

Every write is a compare-and-set on the znode's version (:class:`ArchiveConflict` when it
lost: another archiver wrote meanwhile). A crash before 3 leaves ``pending``: the next
archiver deletes that batch's files first (a batch that was never archived, whole or not),
then takes the same changes again from the cursors, so what is archived holds each change
once. A crash after 3 leaves nothing to undo (a trim not done is done by the next batch).
"""

from __future__ import annotations

import contextlib
import json
import secrets
import time
from dataclasses import dataclass, field, replace
from typing import Any, Final

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from broker.coordination.errors import (
    CoordinationError,
    CorruptCoordinationData,
    translated,
)

__all__ = ["ARCHIVE", "ArchiveConflict", "ArchiveState", "Pending", "create_state", "read_state"]

ARCHIVE: Final = "/archive"


class ArchiveConflict(CoordinationError):
    """The archive's state changed since it was read (another archiver wrote it)."""


@dataclass(frozen=True, slots=True)
class Pending:
    """A batch being written: its number, the directories of its files, and this try's
    token (in its files' names: a try of an archiver that hung, then woke after another
    took its batch over, writes files of other names, which repeat rows, never replace
    the other's)."""

    batch: int
    directories: tuple[str, ...]
    token: str = ""


@dataclass(frozen=True, slots=True)
class ArchiveState:
    """The archive of one cluster (module doc); ``version``: the znode's, for the next
    compare-and-set."""

    id: str
    cluster: str
    root: str
    batch: int = 0
    cursors: dict[int, int] = field(default_factory=dict)
    pending: Pending | None = None
    batched: float = 0.0  # when the last batch was archived (epoch s; 0: never)
    rows: int = 0
    version: int = -1

    def encode(self) -> bytes:
        """The znode's JSON data."""
        pending = self.pending
        body: dict[str, Any] = {
            "id": self.id,
            "cluster": self.cluster,
            "root": self.root,
            "batch": self.batch,
            "cursors": {str(p): s for p, s in sorted(self.cursors.items())},
            "pending": (
                {
                    "batch": pending.batch,
                    "directories": list(pending.directories),
                    "token": pending.token,
                }
                if pending is not None
                else None
            ),
            "batched": self.batched,
            "rows": self.rows,
        }
        return json.dumps(body, sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes, version: int) -> ArchiveState:
        """The state a znode holds; CorruptCoordinationData if it is not one."""
        try:
            body = json.loads(data)
            pending = body.get("pending")
            return cls(
                str(body["id"]),
                str(body.get("cluster", "")),
                str(body["root"]),
                int(body.get("batch", 0)),
                {int(p): int(s) for p, s in (body.get("cursors") or {}).items()},
                Pending(
                    int(pending["batch"]),
                    tuple(map(str, pending["directories"])),
                    str(pending.get("token", "")),
                )
                if pending
                else None,
                float(body.get("batched", 0.0)),
                int(body.get("rows", 0)),
                version,
            )
        except (ValueError, TypeError, KeyError) as exc:
            raise CorruptCoordinationData(f"{ARCHIVE} is unreadable: {exc}") from exc

    def begun(self, pending: Pending) -> ArchiveState:
        """This state with a batch being written (step 1)."""
        return replace(self, pending=pending)

    def archived(self, upto: dict[int, int], rows: int) -> ArchiveState:
        """This state once the pending batch is written (step 3): cursors past ``upto``."""
        assert self.pending is not None, "no batch is being written"
        return replace(
            self,
            batch=self.pending.batch,
            cursors={**self.cursors, **upto},
            pending=None,
            batched=time.time(),
            rows=self.rows + rows,
        )

    def abandoned(self) -> ArchiveState:
        """This state without its pending batch (its files deleted)."""
        return replace(self, pending=None)

    def write(self, client: KazooClient) -> ArchiveState:
        """Compare-and-set this state over the version it was read at; the state with its
        new version. ArchiveConflict if another writer came first."""
        with translated("write the archive's state"):
            try:
                stat = client.retry(client.set, ARCHIVE, self.encode(), version=self.version)
            except (BadVersionError, NoNodeError):
                raise ArchiveConflict(
                    f"{ARCHIVE} changed since it was read (another archiver runs?)"
                ) from None
        return replace(self, version=stat.version)


def read_state(client: KazooClient) -> ArchiveState | None:
    """The cluster's archive state (None: it has no archive yet)."""
    with translated("read the archive's state"):
        try:
            data, stat = client.retry(client.get, ARCHIVE)
        except NoNodeError:
            return None
    return ArchiveState.decode(data, stat.version)


def create_state(client: KazooClient, root: str, cluster: str) -> ArchiveState:
    """The cluster's archive state, made (a fresh id, nothing archived) if it has none."""
    fresh = ArchiveState(secrets.token_hex(6), cluster, root)
    with translated("create the archive's state"), contextlib.suppress(NodeExistsError):
        client.retry(client.create, ARCHIVE, fresh.encode(), makepath=True)
    found = read_state(client)
    assert found is not None, "the archive's state cannot go once written"
    return found
