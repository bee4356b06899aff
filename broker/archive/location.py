"""Where an archive lives: a local directory, or any URI pyarrow's file systems open.

``--archive`` names a local path (``/data/archive``; a relative one is made absolute) or a
URI that ``pyarrow.fs.FileSystem.from_uri`` opens: ``file:///data/archive`` (the same as the
path), ``s3://bucket/prefix``, ``gs://bucket/prefix``, ``hdfs://host:port/path``, ... An
:class:`ArchiveRoot` writes each file there whole or not at all, in the way its kind of
store allows (docs/archive.md, "Where the archive lives"):

- :attr:`Kind.LOCAL` (a path, a ``file://`` URI): ``.<name>.tmp`` written, flushed and
  fsync'd, renamed over the name, the directory fsync'd (os and pathlib);
- :attr:`Kind.OBJECT_STORE` (S3 and what speaks its protocol, Google Cloud Storage, Azure
  Blob Storage): one upload of the whole object, the pyarrow output stream closed. The
  object appears whole when the upload completes, never in part (an upload cut short,
  multipart or not, leaves no object), and once it has completed it is durable and every
  reader sees it (these stores are strongly consistent). There is no rename and nothing to
  fsync;
- :attr:`Kind.RENAMING` (any other file system: HDFS, ...): ``.<name>.tmp`` written and
  closed, then moved over the name (a rename, atomic on HDFS).

S3's settings come from the URI's query (pyarrow's: ``?region=R``,
``?endpoint_override=HOST:PORT&scheme=http``, ...) or from the environment the AWS SDK
reads (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``,
``AWS_PROFILE``, ``AWS_REGION``, ``AWS_ENDPOINT_URL_S3``...). A URI carrying a password is
refused: the URI is kept in ZooKeeper and in cluster.json, and shown by ``ps``.

``pyarrow`` is imported where used (the ``archive`` extra): :func:`location` needs none.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Final
from urllib.parse import unquote, urlsplit

from broker.errors import InvalidInput

__all__ = ["ArchiveRoot", "Kind", "location", "open_root"]

# pyarrow's FileSystem.type_name of the stores whose upload of an object is atomic
OBJECT_STORES: Final = frozenset({"s3", "gcs", "abfs"})


class Kind(Enum):
    """How a file is made to appear whole (module doc)."""

    LOCAL = "local"
    OBJECT_STORE = "object store"
    RENAMING = "file system"


def location(where: str) -> str:
    """``--archive`` as it is kept (the archive's state, cluster.json, the archiver's
    argument): a local path, or a ``file://`` URI's path, absolute and resolved; any other URI
    as given. InvalidInput for a URI with a password or a ``file://`` URI of another host."""
    if "://" not in where:
        return str(Path(where).resolve())
    parts = urlsplit(where)
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise InvalidInput(f"--archive {where}: a file:// URI names this host's files")
        return str(Path(unquote(parts.path)).resolve())
    if parts.password is not None:
        raise InvalidInput(
            f"--archive {parts.scheme}://...: give the credentials in the environment "
            "(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY for S3: docs/archive.md), not in the "
            "URI, which is kept in ZooKeeper and cluster.json"
        )
    return where


def open_root(where: str) -> ArchiveRoot:
    """The root ``--archive`` names; InvalidInput if it names nothing pyarrow opens (for S3
    without a region, pyarrow asks the bucket's region: the network)."""
    import pyarrow.fs as pafs

    uri = location(where)
    if "://" not in uri:
        return ArchiveRoot(uri, Kind.LOCAL, pafs.LocalFileSystem(), uri)
    try:
        filesystem, path = pafs.FileSystem.from_uri(uri)
    except (ValueError, OSError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        raise InvalidInput(f"--archive {uri}: {exc}") from None
    path = path.rstrip("/")
    if not path:
        raise InvalidInput(f"--archive {uri}: names no bucket or directory")
    if filesystem.type_name == "local":
        return ArchiveRoot(path, Kind.LOCAL, filesystem, path)
    kind = Kind.OBJECT_STORE if filesystem.type_name in OBJECT_STORES else Kind.RENAMING
    return ArchiveRoot(uri, kind, filesystem, path)


@dataclass(frozen=True, slots=True)
class ArchiveRoot:
    """An archive's root and the file system it is on. Paths are the file system's (a
    local path; ``bucket/prefix/...`` on an object store)."""

    uri: str  # as kept (:func:`location`): what messages and the archive's state name
    kind: Kind
    filesystem: Any  # a pyarrow.fs.FileSystem
    path: str  # the root on it

    def join(self, *names: str) -> str:
        """A path under the root."""
        return posixpath.join(self.path, *names)

    def exists(self) -> bool:
        """Whether the root is there (on an object store: objects under its prefix)."""
        import pyarrow.fs as pafs

        return bool(self.filesystem.get_file_info(self.path).type == pafs.FileType.Directory)

    def is_file(self, path: str) -> bool:
        """Whether there is a file at ``path``."""
        import pyarrow.fs as pafs

        return bool(self.filesystem.get_file_info(path).type == pafs.FileType.File)

    def make(self) -> None:
        """Make the root where it can be made (an object store's bucket must exist: a
        prefix needs no making). InvalidInput if it cannot be."""
        import pyarrow.fs as pafs

        try:
            if self.kind is Kind.LOCAL:
                Path(self.path).mkdir(parents=True, exist_ok=True)
            elif self.kind is Kind.RENAMING:
                self.filesystem.create_dir(self.path, recursive=True)
            else:
                bucket = self.path.split("/", 1)[0]
                if self.filesystem.get_file_info(bucket).type == pafs.FileType.NotFound:
                    raise InvalidInput(f"--archive {self.uri}: there is no bucket {bucket!r}")
        except OSError as exc:
            raise InvalidInput(f"--archive {self.uri}: {exc.strerror or exc}") from None

    def read(self, path: str) -> bytes | None:
        """A file's bytes (None: there is none)."""
        try:
            with self.filesystem.open_input_stream(path) as stream:
                return bytes(stream.read())
        except FileNotFoundError:
            return None

    def write(self, path: str, fill: Callable[[Any], object]) -> None:
        """Write the file ``path`` whole or not at all (module doc): ``fill`` writes its bytes
        into the file object it is given."""
        if self.kind is Kind.LOCAL:
            _write_local(Path(path), fill)
        elif self.kind is Kind.OBJECT_STORE:
            self._upload(path, fill)
        else:
            self._write_and_move(path, fill)

    def remove(self, directory: str, names: tuple[str, ...]) -> int:
        """Delete these files of a directory if they are there; how many were."""
        gone = 0
        for name in names:
            try:
                if self.kind is Kind.LOCAL:
                    Path(directory, name).unlink()
                else:
                    self.filesystem.delete_file(posixpath.join(directory, name))
                gone += 1
            except FileNotFoundError:
                continue
        if self.kind is Kind.LOCAL and Path(directory).is_dir():
            sync_directory(Path(directory))
        return gone

    def settle(self, directories: list[str]) -> None:
        """Make the new directories of written files durable (local: their entries in
        their parents and the root's, fsync'd; elsewhere there is nothing to do)."""
        if self.kind is not Kind.LOCAL:
            return
        for parent in {p for d in map(Path, directories) for p in (d.parent, d.parent.parent)}:
            sync_directory(parent)
        sync_directory(Path(self.path))

    def files(self) -> list[str]:
        """Every file under the root, as paths relative to it, sorted."""
        import pyarrow.fs as pafs

        found = self.filesystem.get_file_info(
            pafs.FileSelector(self.path, recursive=True, allow_not_found=True)
        )
        start = len(self.path.rstrip("/")) + 1
        return sorted(f.path[start:] for f in found if f.type == pafs.FileType.File)

    def make_directory(self, directory: str) -> None:
        """Make a directory files are about to be written in (on an object store a file
        needs none)."""
        if self.kind is Kind.LOCAL:
            Path(directory).mkdir(parents=True, exist_ok=True)
        elif self.kind is Kind.RENAMING:
            self.filesystem.create_dir(directory, recursive=True)

    def _upload(self, path: str, fill: Callable[[Any], object]) -> None:
        """One upload of the whole object, its bytes made first (a failure while making
        them uploads nothing)."""
        import pyarrow as pa

        buffer = pa.BufferOutputStream()
        fill(buffer)
        data = buffer.getvalue()
        try:
            with self.filesystem.open_output_stream(path) as stream:
                stream.write(data)
        except OSError:
            # pyarrow completes an upload when its stream is closed, even after a failed
            # write: an object cut short may be there, which no reader should see
            with contextlib.suppress(OSError):
                self.filesystem.delete_file(path)
            raise

    def _write_and_move(self, path: str, fill: Callable[[Any], object]) -> None:
        directory, name = posixpath.split(path)
        tmp = posixpath.join(directory, f".{name}.tmp")
        with self.filesystem.open_output_stream(tmp) as stream:
            fill(stream)
        with contextlib.suppress(FileNotFoundError):  # HDFS does not rename over a file
            self.filesystem.delete_file(path)
        self.filesystem.move(tmp, path)


def _write_local(path: Path, fill: Callable[[Any], object]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as out:
        fill(out)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)
    sync_directory(path.parent)


def sync_directory(directory: Path) -> None:
    """fsync a directory: its entries (a file renamed, created, deleted) are durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
