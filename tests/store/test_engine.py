"""The context store's storage engines (LMDB and RocksDB alike), their keys, and group commit."""

from __future__ import annotations

import asyncio
import tempfile
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import examples

from broker.errors import InvalidIdentifier, SilboError
from broker.store.engine import (
    DEFAULT_ENGINE,
    ENGINES,
    Engine,
    GroupCommitter,
    KeyTooLong,
    StorageError,
    StorageLocked,
    StorageOpenError,
    entity_key,
    key_prefix,
    open_engine,
    split_entity_key,
)

both = pytest.mark.parametrize("kind", ENGINES)


def _key(entity_id: str, path: str = "/a", entity_type: str = "T") -> bytes:
    return entity_key("t", path, entity_type, entity_id)


# -- one engine ------------------------------------------------------------------------------


@both
def test_put_get_delete(kind: str, tmp_path: Path) -> None:
    engine = open_engine(kind, tmp_path, durable=False)
    assert engine.kind == kind
    engine.commit([(_key("1"), b"one"), (_key("2"), b"two")], [])
    assert engine.get(_key("1")) == b"one"
    assert engine.get(_key("3")) is None
    engine.commit([(_key("1"), b"uno")], [_key("2"), _key("never")])
    assert engine.get_many([_key("2"), _key("1"), _key("3")]) == [None, b"uno", None]
    assert engine.get_many([]) == []
    assert engine.count() == 1
    engine.commit([], [])  # an empty commit is allowed and changes nothing
    assert engine.count() == 1
    engine.close()


@both
def test_a_key_both_put_and_deleted_in_one_commit_is_deleted(kind: str, tmp_path: Path) -> None:
    engine = open_engine(kind, tmp_path, durable=False)
    engine.commit([(b"k", b"v")], [b"k"])
    assert engine.get(b"k") is None
    engine.close()


@both
def test_a_commit_whose_input_fails_changes_nothing(kind: str, tmp_path: Path) -> None:
    engine = open_engine(kind, tmp_path, durable=False)
    engine.commit([(b"a", b"0")], [])

    def puts() -> Iterator[tuple[bytes, bytes]]:
        yield b"a", b"1"
        yield b"b", b"1"
        raise RuntimeError("the producer failed")

    with pytest.raises(RuntimeError):
        engine.commit(puts(), [b"a"])
    assert engine.get_many([b"a", b"b"]) == [b"0", None]
    engine.close()


@both
def test_readers_see_whole_commits_only(kind: str, tmp_path: Path) -> None:
    """A commit of 300 keys is atomic: no read or scan sees some of them changed."""
    engine = open_engine(kind, tmp_path, durable=False)
    keys = [_key(f"{i:04d}") for i in range(300)]
    engine.commit([(k, b"0") for k in keys], [])
    done = threading.Event()

    def writer() -> None:
        for version in range(1, 60):
            engine.commit([(k, str(version).encode()) for k in keys], [])
        done.set()

    thread = threading.Thread(target=writer)
    thread.start()
    seen = 0
    while not done.is_set() or seen < 5:
        assert len(set(engine.get_many(keys))) == 1
        assert len({value for _, value in engine.scan(key_prefix("t"))}) == 1
        seen += 1
    thread.join()
    assert engine.get(keys[0]) == b"59"
    engine.close()


@both
def test_data_survives_close_and_reopen(kind: str, tmp_path: Path) -> None:
    engine = open_engine(kind, tmp_path)
    engine.commit([(_key(str(i)), b"x" * i) for i in range(100)], [_key("7")])
    engine.close()
    engine.close()  # idempotent
    again = open_engine(kind, tmp_path)
    assert again.count() == 99
    assert again.get(_key("42")) == b"x" * 42
    assert again.get(_key("7")) is None
    again.close()


@both
def test_a_second_open_of_the_directory_is_refused_until_closed(kind: str, tmp_path: Path) -> None:
    engine = open_engine(kind, tmp_path, durable=False)
    with pytest.raises(StorageLocked, match="in use") as caught:
        open_engine(kind, tmp_path, durable=False)
    assert isinstance(caught.value, StorageOpenError)
    assert isinstance(caught.value, SilboError)
    assert engine.get(b"k") is None  # the refused opener did not disturb the open engine
    engine.close()
    open_engine(kind, tmp_path, durable=False).close()


@both
def test_a_directory_of_the_other_kind_or_a_file_is_refused(kind: str, tmp_path: Path) -> None:
    other = next(k for k in ENGINES if k != kind)
    open_engine(other, tmp_path / "store", durable=False).close()
    with pytest.raises(StorageOpenError, match=f"holds a {other} store"):
        open_engine(kind, tmp_path / "store")
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(StorageOpenError, match="cannot open"):
        open_engine(kind, tmp_path / "file")
    open_engine(other, tmp_path / "store", durable=False).close()  # the refusal freed the lock


@both
def test_a_closed_engine_raises_storage_error(kind: str, tmp_path: Path) -> None:
    engine = open_engine(kind, tmp_path, durable=False)
    engine.close()
    with pytest.raises(StorageError, match="closed"):
        engine.get(b"k")
    with pytest.raises(StorageError, match="closed"):
        engine.commit([(b"k", b"v")], [])


@both
def test_long_keys(kind: str, tmp_path: Path) -> None:
    """LMDB takes keys up to 511 bytes (the longest NGSI key is about 1,100); RocksDB any."""
    engine = open_engine(kind, tmp_path, durable=False)
    engine.commit([(b"k" * 511, b"v")], [])
    assert engine.get(b"k" * 511) == b"v"
    long = entity_key("t" * 50, "/" + "p" * 500, "T" * 256, "i" * 256)
    if engine.max_key_size is None:
        engine.commit([(long, b"v")], [])
        assert engine.get(long) == b"v"
        assert list(engine.scan(long)) == [(long, b"v")]
    else:
        with pytest.raises(KeyTooLong):
            engine.commit([(b"a", b"v"), (long, b"v")], [])
        assert engine.get(long) is None
        assert engine.get(b"a") is None
        assert list(engine.scan(long)) == []
    assert list(engine.scan(b"k", start_after=long)) == [(b"k" * 511, b"v")]
    # a bound longer than LMDB's keys: the scan seeks below it and skips up to it
    engine.commit([(b"k" * 300 + b"z", b"w")], [])
    assert list(engine.scan(b"k", start_after=b"k" * 600)) == [(b"k" * 300 + b"z", b"w")]
    engine.close()


def test_unknown_kind_and_the_default(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown storage engine"):
        open_engine("berkeleydb", tmp_path)
    engine = open_engine(None, tmp_path)
    assert engine.kind == DEFAULT_ENGINE
    engine.close()


# -- ordered scans against a model -----------------------------------------------------------

_KEYS = st.one_of(
    st.sampled_from([b"a", b"ab", b"a\x00", b"a\x00b", b"a\xff", b"b", b"\xff", b"\xff\xff"]),
    st.binary(min_size=1, max_size=3),
)
_COMMITS = st.lists(
    st.tuples(
        st.lists(st.tuples(_KEYS, st.binary(max_size=8)), max_size=8),
        st.lists(_KEYS, max_size=4),
    ),
    min_size=1,
    max_size=6,
)
_BOUNDS = st.one_of(st.none(), _KEYS, st.binary(max_size=3))


@both
@settings(max_examples=examples(60))
@given(commits=_COMMITS, prefixes=st.lists(st.binary(max_size=2), min_size=1, max_size=4),
       start_after=_BOUNDS)  # fmt: skip
def test_scans_match_a_sorted_dict(
    kind: str,
    commits: list[tuple[list[tuple[bytes, bytes]], list[bytes]]],
    prefixes: list[bytes],
    start_after: bytes | None,
) -> None:
    model: dict[bytes, bytes] = {}
    with tempfile.TemporaryDirectory() as directory:
        engine = open_engine(kind, Path(directory), durable=False)
        for puts, deletes in commits:
            engine.commit(puts, deletes)
            model.update(puts)
            for key in deletes:
                model.pop(key, None)
        assert engine.count() == len(model)
        for prefix in [*prefixes, *(k[:1] for k in model)]:
            expected = sorted(
                (k, v)
                for k, v in model.items()
                if k.startswith(prefix) and (start_after is None or k > start_after)
            )
            assert list(engine.scan(prefix, start_after)) == expected
            assert list(engine.scan(prefix)) == sorted(
                (k, v) for k, v in model.items() if k.startswith(prefix)
            )
            before = start_after  # the same bounds, the other way
            backwards = sorted(
                ((k, v) for k, v in model.items() if k.startswith(prefix)), reverse=True
            )
            assert list(engine.scan_back(prefix)) == backwards
            assert list(engine.scan_back(prefix, before)) == [
                (k, v) for k, v in backwards if before is None or k < before
            ]
        assert engine.get_many(list(model)) == list(model.values())
        engine.close()


# -- keys --------------------------------------------------------------------------------------

_IDENT = st.text(
    alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E) | st.sampled_from("éñ€😀"),
    max_size=4,
)
_TUPLES = st.tuples(_IDENT, _IDENT, _IDENT, _IDENT)


@settings(max_examples=examples(200))
@given(st.lists(_TUPLES, max_size=30))
def test_entity_keys_sort_like_their_tuples(tuples: list[tuple[str, str, str, str]]) -> None:
    assert sorted(entity_key(*t) for t in tuples) == [entity_key(*t) for t in sorted(tuples)]
    for t in tuples:
        key = entity_key(*t)
        assert split_entity_key(key) == t
        assert key.startswith(key_prefix(t[0]))
        assert key.startswith(key_prefix(t[0], t[1]))
        assert key.startswith(key_prefix(t[0], t[1], t[2]))


@settings(max_examples=examples(200))
@given(_TUPLES, _TUPLES)
def test_a_prefix_covers_exactly_its_own_entities(
    mine: tuple[str, str, str, str], other: tuple[str, str, str, str]
) -> None:
    key = entity_key(*other)
    assert key.startswith(key_prefix(mine[0])) == (other[0] == mine[0])
    assert key.startswith(key_prefix(*mine[:2])) == (other[:2] == mine[:2])
    assert key.startswith(key_prefix(*mine[:3])) == (other[:3] == mine[:3])


def test_identifiers_with_nul_and_bad_prefixes_are_refused() -> None:
    with pytest.raises(InvalidIdentifier):
        entity_key("t", "/", "T", "a\x00b")
    with pytest.raises(ValueError, match="service path"):
        key_prefix("t", entity_type="T")
    with pytest.raises(ValueError, match="not an entity key"):
        split_entity_key(b"x\x00a")


# -- group commit ----------------------------------------------------------------------------


class _Recording:
    """An engine that records each commit's size, can hold commits and can fail one."""

    def __init__(self, inner: Engine, fail_commit: int | None = None) -> None:
        self.inner = inner
        self.kind = inner.kind
        self.max_key_size = inner.max_key_size
        self.sizes: list[int] = []
        self.started = threading.Event()
        self.gate = threading.Event()
        self.gate.set()
        self.fail_commit = fail_commit

    def commit(self, puts: Iterable[tuple[bytes, bytes]], deletes: Iterable[bytes]) -> None:
        items, gone = list(puts), list(deletes)
        self.sizes.append(len(items) + len(gone))
        self.started.set()
        assert self.gate.wait(10)
        if len(self.sizes) == self.fail_commit:
            raise StorageError("the disk is full")
        self.inner.commit(items, gone)

    def get(self, key: bytes) -> bytes | None:
        return self.inner.get(key)

    def get_many(self, keys: Iterable[bytes]) -> list[bytes | None]:
        return self.inner.get_many(keys)

    def scan(
        self, prefix: bytes, start_after: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        return self.inner.scan(prefix, start_after)

    def scan_back(
        self, prefix: bytes, before: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        return self.inner.scan_back(prefix, before)

    def count(self) -> int:
        return self.inner.count()

    def close(self) -> None:
        self.inner.close()


async def _until_started(engine: _Recording) -> None:
    assert await asyncio.get_running_loop().run_in_executor(None, engine.started.wait, 10)
    engine.started.clear()


@both
def test_concurrent_writers_are_durable_in_shared_commits(kind: str, tmp_path: Path) -> None:
    engine = _Recording(open_engine(kind, tmp_path))

    async def scenario() -> None:
        committer = GroupCommitter(engine)

        async def writer(w: int) -> None:
            for n in range(5):
                await committer.write([(_key(f"{w}-{n}"), b"v")])
                assert engine.get(_key(f"{w}-{n}")) == b"v"  # durable once acknowledged

        await asyncio.gather(*(writer(w) for w in range(20)))
        await committer.close()
        assert committer.writes == 100 and committer.failed == 0

    asyncio.run(scenario())
    assert sum(engine.sizes) == 100
    assert all(size >= 2 for size in engine.sizes), engine.sizes
    assert len(engine.sizes) <= 10
    engine.close()
    reopened = open_engine(kind, tmp_path)
    assert reopened.count() == 100
    reopened.close()


@both
def test_a_failed_commit_fails_exactly_the_writers_of_its_group(kind: str, tmp_path: Path) -> None:
    engine = _Recording(open_engine(kind, tmp_path, durable=False), fail_commit=2)
    engine.gate.clear()

    async def scenario() -> dict[str, BaseException | None]:
        committer = GroupCommitter(engine)
        first = asyncio.create_task(committer.write([(b"a", b"1")]))
        await _until_started(engine)  # "a" is being committed alone, held at the gate
        group = [asyncio.create_task(committer.write([(k, b"1")])) for k in (b"b", b"c", b"d")]
        await asyncio.sleep(0.01)  # b, c and d wait for the next commit
        engine.gate.set()
        results = await asyncio.gather(first, *group, return_exceptions=True)
        await committer.write([(b"e", b"1")])  # the committer goes on after a failure
        await committer.close()
        assert committer.failed == 3 and committer.writes == 2
        return dict(zip("abcd", results, strict=True))

    results = asyncio.run(scenario())
    assert results["a"] is None
    for name in "bcd":
        assert isinstance(results[name], StorageError), results
    assert engine.sizes == [1, 3, 1]
    assert engine.get_many([b"a", b"b", b"c", b"d", b"e"]) == [b"1", None, None, None, b"1"]
    engine.close()


@both
def test_later_writes_of_a_group_win_and_the_queue_is_bounded(kind: str, tmp_path: Path) -> None:
    engine = _Recording(open_engine(kind, tmp_path, durable=False))
    engine.gate.clear()

    async def scenario() -> None:
        committer = GroupCommitter(engine, max_pending=3)
        held = asyncio.create_task(committer.write([(b"x", b"0")]))
        await _until_started(engine)
        steps = [
            committer.write([(b"k", b"1"), (b"j", b"1")]),
            committer.write([], [b"k"]),
            committer.write([(b"j", b"2")]),
            committer.write([(b"m", b"1")]),
            committer.write([(b"m", b"2")]),
        ]
        tasks = []
        for step in steps:  # in order: each queued (or waiting for room) before the next
            tasks.append(asyncio.create_task(step))
            await asyncio.sleep(0)
        assert committer._queue.qsize() == 3  # the last two wait for room
        engine.gate.set()
        await asyncio.gather(held, *tasks)
        await committer.close()
        with pytest.raises(StorageError, match="closed"):
            await committer.write([(b"z", b"1")])

    asyncio.run(scenario())
    assert engine.get_many([b"k", b"j", b"m"]) == [None, b"2", b"2"]
    assert engine.sizes[0] == 1 and sum(engine.sizes) < 8
    engine.close()


@both
def test_a_key_too_long_fails_its_own_write_only(kind: str, tmp_path: Path) -> None:
    engine = open_engine(kind, tmp_path, durable=False)

    async def scenario() -> list[BaseException | None]:
        committer = GroupCommitter(engine)
        results = await asyncio.gather(
            committer.write([(b"a", b"1")]),
            committer.write([(b"k" * 600, b"1")]),
            committer.write([(b"b", b"1")]),
            return_exceptions=True,
        )
        await committer.close()
        return list(results)

    results = asyncio.run(scenario())
    assert results[0] is None and results[2] is None
    if engine.max_key_size is None:
        assert results[1] is None
    else:
        assert isinstance(results[1], KeyTooLong)
    assert engine.get_many([b"a", b"b"]) == [b"1", b"1"]
    engine.close()
