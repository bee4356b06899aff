"""The embedded, durable key-value storage under a context store process (issue 17).

A store process keeps its entities in one directory of its state directory, through an
:class:`Engine`: point reads, ordered prefix scans, and atomic durable commits. Two kinds
are built, and ``silbo bench storage`` measures both on W-IoT entities (docs/benchmarks.md,
where the choice of :data:`DEFAULT_ENGINE` is argued):

- ``rocksdb``: RocksDB through ``rocksdict`` (raw bytes). A commit is one ``WriteBatch``
  written with ``sync``: appended to the write-ahead log, which is fsync'd.
- ``lmdb``: an LMDB environment (``data.mdb``, ``lock.mdb``). A commit is one write
  transaction, synced (the data pages, then the meta page). Keys are at most 511 bytes.

Both are safe to share between threads: reads run beside one commit at a time, and every
scan reads one snapshot. The directory holds an ``ENGINE`` file naming its kind and a
``silbo-store.lock`` file, held with ``flock`` while an engine is open, so a second opener,
in this process or another, fails with :class:`StorageLocked` instead of corrupting it.

Keys (:func:`entity_key`): ``e`` NUL tenant NUL service path NUL type NUL id, UTF-8. NUL
sorts below every other byte and cannot occur in an identifier, so keys sort as the
(tenant, service path, type, id) tuples do, and :func:`key_prefix` of a tenant (of a path,
of a type) is one contiguous range. Other kinds of key (indexes, partition metadata) will
start with other bytes.

Group commit (:class:`GroupCommitter`): writers ``await write(puts, deletes)``; while one
commit runs (in a thread of its own), the writes that arrive are gathered into the next,
so many writes share one fsync, and each writer resumes once its write is durable.

Errors, under broker.errors' root (they wrap foreign libraries, so they live here, as
broker.coordination.errors does)::

    SilboError
    ├── StorageError            the storage failed: I/O, disk full, corruption, closed
    │   └── StorageOpenError    the directory cannot be opened as a store
    │       └── StorageLocked   another engine (this process or another) holds it
    └── InvalidInput
        └── KeyTooLong          a key longer than the engine takes (LMDB: 511 bytes)
"""

from __future__ import annotations

import asyncio
import fcntl
import os
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Protocol, cast

import lmdb
import rocksdict

from broker.errors import InvalidIdentifier, InvalidInput, SilboError

__all__ = [
    "DEFAULT_ENGINE",
    "ENGINES",
    "Engine",
    "GroupCommitter",
    "KeyTooLong",
    "LmdbEngine",
    "RocksdbEngine",
    "StorageError",
    "StorageLocked",
    "StorageOpenError",
    "entity_key",
    "key_prefix",
    "open_engine",
    "split_entity_key",
]

ENGINES: Final = ("rocksdb", "lmdb")
# Chosen by `silbo bench storage` on W-IoT entities: see docs/benchmarks.md (issue 17).
DEFAULT_ENGINE: Final = "rocksdb"

ENTITY_SPACE: Final = b"e"
_SEP: Final = b"\x00"
_LOCK_FILE: Final = "silbo-store.lock"
_KIND_FILE: Final = "ENGINE"
# Address space reserved for LMDB's map (the file grows only as it fills); doubled if full.
_LMDB_MAP_SIZE: Final = 1 << 36
WRITE_BUFFER: Final = 16 << 20  # bytes of one RocksDB memtable


class StorageError(SilboError):
    """The embedded storage failed (I/O error, full disk, corruption, or already closed)."""


class StorageOpenError(StorageError):
    """A directory cannot be opened as a store (permissions, not a directory, another kind)."""


class StorageLocked(StorageOpenError):
    """The store directory is held by another open engine, in this process or another."""


class KeyTooLong(InvalidInput):
    """A key is longer than the storage engine accepts (LMDB: 511 bytes)."""


class Engine(Protocol):
    """What a store process needs of its embedded storage (one directory, one engine)."""

    kind: str
    max_key_size: int | None  # None: no limit that identifiers can reach

    def get(self, key: bytes) -> bytes | None:
        """The value stored under ``key``, or None."""
        ...

    def get_many(self, keys: Iterable[bytes]) -> list[bytes | None]:
        """The values of ``keys``, in order (None for a missing one), from one snapshot."""
        ...

    def commit(self, puts: Iterable[tuple[bytes, bytes]], deletes: Iterable[bytes]) -> None:
        """Apply ``puts`` then ``deletes`` atomically; return once durable (if the engine is)."""
        ...

    def scan(
        self, prefix: bytes, start_after: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        """The (key, value) pairs whose key starts with ``prefix`` and follows ``start_after``,
        in key order, from one snapshot."""
        ...

    def scan_back(
        self, prefix: bytes, before: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        """The pairs whose key starts with ``prefix`` and precedes ``before``, in reverse key
        order, from one snapshot (the last rows of a history)."""
        ...

    def count(self) -> int:
        """How many keys are stored."""
        ...

    def close(self) -> None:
        """Release the directory (idempotent); every later call raises StorageError."""
        ...


def open_engine(kind: str | None, path: Path | str, *, durable: bool = True) -> Engine:
    """Open (creating it if needed) the store in directory ``path`` with the engine ``kind``
    (None: :data:`DEFAULT_ENGINE`).

    ``durable=False`` skips the fsync of each commit (tests, scratch stores): a crash of
    the machine may then lose the last commits, never corrupt the store.
    """
    kind = DEFAULT_ENGINE if kind is None else kind
    if kind not in ENGINES:
        raise ValueError(f"unknown storage engine {kind!r}; expected one of {', '.join(ENGINES)}")
    directory = Path(path)
    lock = _DirectoryLock.acquire(directory)
    try:
        _claim_kind(directory, kind)
        if kind == "lmdb":
            return LmdbEngine(directory, lock, durable=durable)
        return RocksdbEngine(directory, lock, durable=durable)
    except BaseException:
        lock.release()
        raise


class LmdbEngine:
    """An :class:`Engine` on one LMDB environment (copy-on-write B+tree, memory-mapped)."""

    kind = "lmdb"

    def __init__(self, directory: Path, lock: _DirectoryLock, *, durable: bool) -> None:
        self._lock = lock
        try:
            self._env = lmdb.open(
                str(directory),
                map_size=_LMDB_MAP_SIZE,
                subdir=True,
                readahead=False,  # random point reads; read-ahead only fills the page cache
                sync=durable,
                metasync=durable,
                max_dbs=0,
            )
        except (lmdb.Error, OSError) as exc:
            raise StorageOpenError(f"cannot open the LMDB store in {directory}: {exc}") from exc
        self.max_key_size: int | None = self._env.max_key_size()
        self._closed = False

    def get(self, key: bytes) -> bytes | None:
        """The value stored under ``key``, or None."""
        self._check_open()
        if self.max_key_size is not None and len(key) > self.max_key_size:
            return None
        try:
            with self._env.begin() as txn:
                return txn.get(key)
        except lmdb.Error as exc:
            raise StorageError(f"LMDB read failed: {exc}") from exc

    def get_many(self, keys: Iterable[bytes]) -> list[bytes | None]:
        """The values of ``keys``, in order (None for a missing one), from one snapshot."""
        self._check_open()
        limit = self.max_key_size or 0
        try:
            with self._env.begin() as txn:
                get = txn.get
                return [None if len(key) > limit else get(key) for key in keys]
        except lmdb.Error as exc:
            raise StorageError(f"LMDB read failed: {exc}") from exc

    def commit(self, puts: Iterable[tuple[bytes, bytes]], deletes: Iterable[bytes]) -> None:
        """Apply ``puts`` then ``deletes`` in one write transaction, synced if durable."""
        self._check_open()
        items, gone = list(puts), list(deletes)
        for key, _ in items:
            self._check_key(key)
        while True:
            try:
                with self._env.begin(write=True) as txn:
                    if items:
                        txn.cursor().putmulti(items, dupdata=False, overwrite=True)
                    delete = txn.delete
                    for key in gone:
                        delete(key)
                return
            except lmdb.MapFullError:
                self._grow()
            except lmdb.Error as exc:
                raise StorageError(f"LMDB commit failed: {exc}") from exc

    def scan(
        self, prefix: bytes, start_after: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        """The pairs under ``prefix`` after ``start_after``, in key order, from one snapshot."""
        self._check_open()
        after = start_after if start_after is not None and start_after >= prefix else None
        limit = self.max_key_size or 0
        if len(prefix) > limit:
            return  # no stored key is that long
        try:
            with self._env.begin() as txn, txn.cursor() as cursor:
                # a start_after longer than a key can be: seek below it, skip up to it
                if not cursor.set_range((after or prefix)[:limit]):
                    return
                for key, value in cursor.iternext():
                    if after is not None:
                        if key <= after:
                            continue
                        after = None
                    if not key.startswith(prefix):
                        return
                    yield key, value
        except lmdb.Error as exc:
            raise StorageError(f"LMDB scan failed: {exc}") from exc

    def scan_back(
        self, prefix: bytes, before: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        """The pairs under ``prefix`` before ``before``, in reverse key order, one snapshot."""
        self._check_open()
        limit = self.max_key_size or 0
        if len(prefix) > limit:
            return
        end = _prefix_end(prefix)
        bound = before if before is not None and (end is None or before < end) else end
        try:
            with self._env.begin() as txn, txn.cursor() as cursor:
                placed = cursor.set_range(bound[:limit]) if bound is not None else False
                if not placed and not cursor.last():
                    return
                for key, value in cursor.iterprev():
                    if bound is not None and key >= bound:
                        continue
                    if not key.startswith(prefix):
                        return
                    yield key, value
        except lmdb.Error as exc:
            raise StorageError(f"LMDB scan failed: {exc}") from exc

    def count(self) -> int:
        """How many keys are stored (LMDB keeps the count: no scan)."""
        self._check_open()
        return int(self._env.stat()["entries"])

    def close(self) -> None:
        """Close the environment and release the directory (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._env.close()
        self._lock.release()

    def _check_open(self) -> None:
        if self._closed:
            raise StorageError("the LMDB store is closed")

    def _check_key(self, key: bytes) -> None:
        if self.max_key_size is not None and len(key) > self.max_key_size:
            raise KeyTooLong(
                f"a key of {len(key)} bytes is longer than LMDB takes ({self.max_key_size})"
            )

    def _grow(self) -> None:
        # Only possible while no transaction of this process is open; else the commit fails.
        size = int(self._env.info()["map_size"]) * 2
        try:
            self._env.set_mapsize(size)
        except lmdb.Error as exc:
            raise StorageError(f"the LMDB map is full and cannot grow to {size}: {exc}") from exc


class RocksdbEngine:
    """An :class:`Engine` on one RocksDB database (log-structured: WAL, memtable, SSTs)."""

    kind = "rocksdb"
    max_key_size: int | None = None

    def __init__(self, directory: Path, lock: _DirectoryLock, *, durable: bool) -> None:
        self._lock = lock
        options = rocksdict.Options(raw_mode=True)
        options.create_if_missing(True)
        options.set_max_background_jobs(2)
        # RocksDB's 64 MB memtables (two while one flushes) are anonymous memory: 16 MB keeps
        # a store with 1M entities and its query index under 300 MB (docs/benchmarks.md)
        options.set_write_buffer_size(WRITE_BUFFER)
        try:
            self._db = rocksdict.Rdict(str(directory), options)
        except Exception as exc:  # rocksdict raises bare Exception for RocksDB's Status
            raise StorageOpenError(f"cannot open the RocksDB store in {directory}: {exc}") from exc
        self._write_options = rocksdict.WriteOptions()
        self._write_options.sync = durable
        self._closed = False

    def get(self, key: bytes) -> bytes | None:
        """The value stored under ``key``, or None."""
        self._check_open()
        try:
            value: bytes | None = self._db.get(key)
        except Exception as exc:
            raise StorageError(f"RocksDB read failed: {exc}") from exc
        return value

    def get_many(self, keys: Iterable[bytes]) -> list[bytes | None]:
        """The values of ``keys``, in order (None for a missing one): one multi-get."""
        self._check_open()
        wanted: list[str | int | float | bytes | bool] = list(keys)
        if not wanted:
            return []
        try:
            values = self._db.get(wanted)
        except Exception as exc:
            raise StorageError(f"RocksDB read failed: {exc}") from exc
        return list(values) if values is not None else [None] * len(wanted)

    def commit(self, puts: Iterable[tuple[bytes, bytes]], deletes: Iterable[bytes]) -> None:
        """Apply ``puts`` then ``deletes`` as one write batch, its WAL record synced if durable."""
        self._check_open()
        batch = rocksdict.WriteBatch(raw_mode=True)
        for key, value in puts:
            batch.put(key, value)
        for key in deletes:
            batch.delete(key)
        if batch.is_empty():
            return
        try:
            self._db.write(batch, self._write_options)
        except Exception as exc:
            raise StorageError(f"RocksDB commit failed: {exc}") from exc

    def scan(
        self, prefix: bytes, start_after: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        """The pairs under ``prefix`` after ``start_after``, in key order, from one snapshot."""
        self._check_open()
        read = rocksdict.ReadOptions()
        end = _prefix_end(prefix)
        if end is not None:
            read.set_iterate_upper_bound(end)
        start = prefix if start_after is None or start_after < prefix else start_after
        try:
            # items() steps the iterator in Rust: ~1.4x faster than next()/key()/value() here
            items = cast(
                Iterator[tuple[bytes, bytes]], self._db.items(from_key=start, read_opt=read)
            )
            for key, value in items:
                if key == start_after:  # only the first can be
                    continue
                if not key.startswith(prefix):  # past the upper bound, when there is none
                    return
                yield key, value
        except Exception as exc:
            raise StorageError(f"RocksDB scan failed: {exc}") from exc

    def scan_back(
        self, prefix: bytes, before: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        """The pairs under ``prefix`` before ``before``, in reverse key order, one snapshot."""
        self._check_open()
        end = _prefix_end(prefix)
        bound = before if before is not None and (end is None or before < end) else end
        try:
            items = cast(
                Iterator[tuple[bytes, bytes]],
                self._db.items(backwards=True, from_key=bound, read_opt=rocksdict.ReadOptions()),
            )
            for key, value in items:  # from the last key at or before the bound
                if bound is not None and key >= bound:
                    continue
                if not key.startswith(prefix):
                    return
                yield key, value
        except Exception as exc:
            raise StorageError(f"RocksDB scan failed: {exc}") from exc

    def count(self) -> int:
        """How many keys are stored (RocksDB keeps only an estimate: this counts them)."""
        self._check_open()
        try:
            return sum(1 for _ in self._db.keys(read_opt=None))  # Rdict is not iterable
        except Exception as exc:
            raise StorageError(f"RocksDB scan failed: {exc}") from exc

    def close(self) -> None:
        """Close the database and release the directory (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._db.close()
        self._lock.release()

    def _check_open(self) -> None:
        if self._closed:
            raise StorageError("the RocksDB store is closed")


# -- keys ----------------------------------------------------------------------------------


def entity_key(tenant: str, service_path: str, entity_type: str, entity_id: str) -> bytes:
    """The storage key of one entity: sorts by tenant, then service path, type and id."""
    return _join(ENTITY_SPACE, tenant, service_path, entity_type, entity_id)


def key_prefix(
    tenant: str, service_path: str | None = None, entity_type: str | None = None
) -> bytes:
    """The prefix shared by the keys of a tenant (of a service path in it, of a type there),
    for :meth:`Engine.scan`; it ends with a separator, so ``madrid`` never covers ``madrid2``."""
    if entity_type is not None and service_path is None:
        raise ValueError("a key prefix with an entity type needs its service path")
    parts = [p for p in (tenant, service_path, entity_type) if p is not None]
    return _join(ENTITY_SPACE, *parts) + _SEP


def split_entity_key(key: bytes) -> tuple[str, str, str, str]:
    """(tenant, service path, type, id) of a key made by :func:`entity_key`."""
    parts = key.split(_SEP)
    if len(parts) != 5 or parts[0] != ENTITY_SPACE:
        raise ValueError(f"not an entity key: {key!r}")
    tenant, path, entity_type, entity_id = (p.decode("utf-8") for p in parts[1:])
    return tenant, path, entity_type, entity_id


def _join(space: bytes, *parts: str) -> bytes:
    encoded = [space]
    for part in parts:
        if "\x00" in part:
            raise InvalidIdentifier(f"an identifier holds a NUL character: {part!r}")
        encoded.append(part.encode("utf-8"))
    return _SEP.join(encoded)


def _prefix_end(prefix: bytes) -> bytes | None:
    """The least key above every key starting with ``prefix`` (None: there is none)."""
    trimmed = prefix.rstrip(b"\xff")
    if not trimmed:
        return None
    return trimmed[:-1] + bytes([trimmed[-1] + 1])


# -- the directory ---------------------------------------------------------------------------


class _DirectoryLock:
    """An exclusive ``flock`` on the store directory's lock file, for an engine's lifetime.

    flock locks belong to an open file, so a second open in the same process conflicts
    too (POSIX record locks would not)."""

    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, directory: Path) -> _DirectoryLock:
        try:
            directory.mkdir(parents=True, exist_ok=True)
            fd = os.open(directory / _LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise StorageOpenError(f"cannot open the store directory {directory}: {exc}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            raise StorageLocked(
                f"the store directory {directory} is in use (held by process {holder})"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
        return cls(fd)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the last descriptor drops the flock
            self._fd = None


def _claim_kind(directory: Path, kind: str) -> None:
    """Record the engine kind in a new directory; refuse a directory of another kind."""
    marker = directory / _KIND_FILE
    try:
        if marker.exists():
            found = marker.read_text(encoding="ascii").strip()
            if found != kind:
                raise StorageOpenError(f"{directory} holds a {found} store, not {kind}")
            return
        marker.write_text(kind + "\n", encoding="ascii")
    except OSError as exc:
        raise StorageOpenError(f"cannot open the store directory {directory}: {exc}") from exc


# -- group commit ----------------------------------------------------------------------------


@dataclass(slots=True)
class _Write:
    puts: Sequence[tuple[bytes, bytes]]
    deletes: Sequence[bytes]
    done: asyncio.Future[None] = field(repr=False)

    @property
    def size(self) -> int:
        return len(self.puts) + len(self.deletes)


class GroupCommitter:
    """Writes from many coroutines, made durable together: one engine commit per group.

    One task takes the writes in arrival order. It starts a commit with every write waiting
    (at most ``max_group`` keys; one larger write goes alone) and runs it in a thread of its
    own, so the event loop keeps serving, and the writes that arrive meanwhile form the next
    group. A write's keys are applied in the order the writes arrived (the last value of a
    key wins). Each writer resumes when its group is durable, or with the commit's error:
    a failed commit fails exactly the writes of its group, which are then not applied (the
    commit is atomic), and the next group goes on. At most ``max_pending`` writes wait;
    more writers wait in :meth:`write` (back pressure).

    A writer cancelled while it waits does not withdraw its write: it may still be applied.
    """

    def __init__(self, engine: Engine, *, max_pending: int = 1024, max_group: int = 4096) -> None:
        if max_pending < 1 or max_group < 1:
            raise ValueError("max_pending and max_group must be at least 1")
        self._engine = engine
        self._max_group = max_group
        self._queue: asyncio.Queue[_Write | None] = asyncio.Queue(max_pending)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="silbo-commit")
        self._task: asyncio.Task[None] | None = None
        self._held: _Write | None = None  # taken from the queue, left for the next group
        self._closing = False
        self.commits = 0  # engine commits made (successful or not)
        self.writes = 0  # writes made durable
        self.failed = 0  # writes failed by their commit

    async def write(
        self, puts: Iterable[tuple[bytes, bytes]], deletes: Iterable[bytes] = ()
    ) -> None:
        """Apply ``puts`` and ``deletes`` atomically; return once they are durable.

        Raises the commit's StorageError (or KeyTooLong) if the group holding them failed.
        """
        if self._closing:
            raise StorageError("the group committer is closed")
        loop = asyncio.get_running_loop()
        write = _Write(list(puts), list(deletes), loop.create_future())
        self._check_keys(write)  # here, so that one bad write cannot fail a whole group
        if self._task is None:
            self._task = loop.create_task(self._run(), name="group-commit")
        await self._queue.put(write)
        await write.done

    async def close(self) -> None:
        """Commit every write already queued, then stop (the engine stays open)."""
        self._closing = True
        if self._task is not None:
            await self._queue.put(None)
            await self._task
        self._executor.shutdown(wait=True)

    def _check_keys(self, write: _Write) -> None:
        limit = self._engine.max_key_size
        if limit is None:
            return
        for key in [k for k, _ in write.puts]:
            if len(key) > limit:
                raise KeyTooLong(f"a key of {len(key)} bytes is longer than {limit} bytes")

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        group: list[_Write] = []
        try:
            while True:
                group, stop = await self._gather()
                if group:
                    await self._commit(loop, group)
                    group = []
                if stop:
                    return
        finally:  # cancelled (the loop is closing): no waiting writer is left hanging
            self._fail_waiting(group)

    def _fail_waiting(self, group: list[_Write]) -> None:
        waiting = [*group, *([self._held] if self._held else [])]
        while not self._queue.empty():
            write = self._queue.get_nowait()
            if write is not None:
                waiting.append(write)
        for write in waiting:
            if not write.done.done():
                write.done.set_exception(StorageError("the group committer stopped"))

    async def _gather(self) -> tuple[list[_Write], bool]:
        """The next group: the held-over write or the next to arrive, then all that wait."""
        first = self._held or await self._queue.get()
        self._held = None
        if first is None:
            return [], True
        group, size = [first], first.size
        while not self._queue.empty():
            write = self._queue.get_nowait()
            if write is None:
                return group, True
            if size + write.size > self._max_group:
                self._held = write
                break
            group.append(write)
            size += write.size
        return group, False

    async def _commit(self, loop: asyncio.AbstractEventLoop, group: list[_Write]) -> None:
        merged: dict[bytes, bytes | None] = {}
        for write in group:
            merged.update(write.puts)
            merged.update(dict.fromkeys(write.deletes))
        puts = [(k, v) for k, v in merged.items() if v is not None]
        deletes = [k for k, v in merged.items() if v is None]
        self.commits += 1
        try:
            await loop.run_in_executor(self._executor, self._engine.commit, puts, deletes)
        except Exception as exc:
            self.failed += len(group)
            for write in group:
                if not write.done.done():
                    write.done.set_exception(exc)
            return
        self.writes += len(group)
        for write in group:
            if not write.done.done():
                write.done.set_result(None)
