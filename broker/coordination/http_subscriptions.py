"""Where the NGSI v2 fronts keep their subscriptions: in ZooKeeper, off the data path, so that
every front sees them and they outlive the connection point that took them.

Layout (under the cluster's chroot)::

    /ngsi/subscriptions/<id>   persistent; {"tenant", "scope", "document", "created"}:
                               written when the subscription is created or PATCHed
    /ngsi/status/<id>          persistent; the delivery status (status, timesSent,
                               lastNotification, lastSuccess...): created with the definition,
                               written by its owner from time to time (``--status-flush``, in
                               transactions of STATUS_BATCH) and when the owner stops
    /ngsi/owners/<id>          ephemeral; {"front": member name}: the front that delivers it
    /ngsi/fronts/<name>        ephemeral; {"http": "host:port"}: a front serving now

The owner znode belongs to the owning connection point's ZooKeeper session, so a connection
point that dies (or stops) leaves its subscriptions *orphaned* once its session ends, and its
``/ngsi/fronts`` entry goes at the same moment. Every front watches ``/ngsi/fronts``; on a
change it lists the orphans and adopts those whose rendezvous choice among the live fronts
(:func:`heir`) is itself, by creating the owner znode (one front wins a race; the loser
leaves it). Only the writes of one subscription's life and the status flushes reach
ZooKeeper: never a notification.

Calls are kazoo's asynchronous ones, awaited on the caller's event loop; kazoo's exceptions
become coordination errors (:func:`broker.coordination.errors.translated`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError, RolledBackError
from kazoo.protocol.states import KazooState
from kazoo.recipe.watchers import ChildrenWatch

from broker.coordination.errors import CorruptCoordinationData, ZooKeeperUnavailable, translated

__all__ = [
    "FRONTS",
    "OWNERS",
    "STATUS",
    "SUBSCRIPTIONS",
    "Registry",
    "Stored",
    "heir",
    "kept_definitions",
    "release_dead_front",
]

_log = logging.getLogger(__name__)

SUBSCRIPTIONS = "/ngsi/subscriptions"
STATUS = "/ngsi/status"
OWNERS = "/ngsi/owners"
FRONTS = "/ngsi/fronts"
CALL_TIMEOUT = 10.0  # seconds one ZooKeeper call may take
PIPELINE = 256  # calls in flight when writing many znodes
STATUS_BATCH = 500  # statuses written in one transaction (~300 bytes each, far under 1 MB)


@dataclass(frozen=True, slots=True)
class Stored:
    """One subscription as kept: its definition and its last saved status ({} if none)."""

    id: str
    tenant: str
    scope: str
    document: dict[str, Any]
    created: float
    status: dict[str, Any]


def heir(subscription_id: str, fronts: Iterable[str]) -> str | None:
    """The front that adopts an orphan: the highest rendezvous hash of (id, front), so each
    front's orphans spread over the others and every front computes the same choice."""
    best: tuple[int, str] | None = None
    for name in fronts:
        score = zlib.crc32(f"{subscription_id}/{name}".encode())
        if best is None or (score, name) > best:
            best = (score, name)
    return best[1] if best else None


def release_dead_front(client: KazooClient, name: str) -> int:
    """Orphan the subscriptions of the front ``name``, known to be dead (its process exited:
    the supervisor saw it), now rather than when its ZooKeeper session ends: its
    ``/ngsi/owners`` claims and then its ``/ngsi/fronts`` entry are deleted, so the live
    fronts adopt all its subscriptions at once. The number of claims released."""
    released = 0
    with translated(f"release the subscriptions of the dead front {name}"):
        try:
            ids = client.get_children(OWNERS)
        except NoNodeError:
            ids = []
        for subscription_id in ids:
            path = f"{OWNERS}/{subscription_id}"
            try:
                data, stat = client.get(path)
                if json.loads(data).get("front") == name:
                    client.delete(path, version=stat.version)
                    released += 1
            except (NoNodeError, BadVersionError, ValueError):
                continue  # gone or claimed meanwhile, or not ours to judge
        # Last: the live fronts look for orphans when the fronts change, so every claim
        # must be gone by then (deleted first, a scan found some and the rest waited for
        # the next change or the periodic rescan: seconds without an owner).
        with contextlib.suppress(NoNodeError):
            client.delete(f"{FRONTS}/{name}")
    return released


def kept_definitions(client: KazooClient) -> list[Stored]:
    """Every subscription kept, as it was defined (its status left out: ``{}``), in id
    order: a synchronous read for tools (``silbo replay --state-dir``), pipelined."""
    with translated("read the HTTP subscriptions"):
        try:
            ids = sorted(client.get_children(SUBSCRIPTIONS))
        except NoNodeError:
            return []
        found: list[Stored] = []
        for start in range(0, len(ids), PIPELINE):
            chunk = ids[start : start + PIPELINE]
            pending = [client.get_async(f"{SUBSCRIPTIONS}/{i}") for i in chunk]
            for subscription_id, result in zip(chunk, pending, strict=True):
                try:
                    data, _stat = result.get(timeout=CALL_TIMEOUT)
                except NoNodeError:
                    continue  # deleted meanwhile
                path = f"{SUBSCRIPTIONS}/{subscription_id}"
                body = _decode(path, data)
                found.append(
                    Stored(
                        subscription_id,
                        str(body["tenant"]),
                        str(body["scope"]),
                        dict(body["document"]),
                        float(body["created"]),
                        {},
                    )
                )
    return found


def _json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def _definition(stored: Stored) -> bytes:
    return _json(
        {
            "tenant": stored.tenant,
            "scope": stored.scope,
            "document": stored.document,
            "created": stored.created,
        }
    )


def _decode(path: str, data: bytes) -> dict[str, Any]:
    try:
        body = json.loads(data)
    except ValueError as exc:
        raise CorruptCoordinationData(f"{path} holds no JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise CorruptCoordinationData(f"{path} holds no JSON object")
    return body


class Registry:
    """One front's handle on the subscriptions in ZooKeeper (see the module doc).

    ``on_fronts`` is called on the event loop with the live fronts ({name: http address})
    whenever they change, and once the session was lost and a new one began (``renewed``
    true): the owner znodes of the lost session are gone, so the front claims its own again.
    """

    def __init__(
        self,
        client: KazooClient,
        loop: asyncio.AbstractEventLoop,
        name: str,
        http: str,
        on_fronts: Callable[[dict[str, str], bool], None],
    ) -> None:
        self._client = client
        self._loop = loop
        self.name = name
        self._http = http
        self._on_fronts = on_fronts
        self.fronts: dict[str, str] = {}
        self._watch: ChildrenWatch | None = None
        self._lost = False
        self._joined = False
        self._tasks: set[asyncio.Task[None]] = set()

    # -- joining and leaving ----------------------------------------------------------------

    async def join(self) -> None:
        """Create the folders, announce this front, and watch the others."""
        with translated("register the HTTP front"):
            for path in (SUBSCRIPTIONS, STATUS, OWNERS, FRONTS):
                await self._call(self._client.ensure_path_async(path))
            await self._announce()
        self._joined = True
        self._client.add_listener(self._state_changed)
        self._watch = ChildrenWatch(self._client, FRONTS, self._fronts_changed)

    async def leave(self) -> None:
        """Stop being a front others see (its subscriptions are still its own)."""
        self._joined = False
        self._client.remove_listener(self._state_changed)
        with translated("unregister the HTTP front"), contextlib.suppress(NoNodeError):
            await self._call(self._client.delete_async(f"{FRONTS}/{self.name}"))

    async def _announce(self) -> None:
        with contextlib.suppress(NodeExistsError):  # ours, from this session
            await self._call(
                self._client.create_async(
                    f"{FRONTS}/{self.name}", _json({"http": self._http}), ephemeral=True
                )
            )

    def _state_changed(self, state: str) -> None:  # kazoo's thread
        if state == KazooState.LOST:
            self._lost = True
        elif state == KazooState.CONNECTED and self._lost:
            self._lost = False
            with contextlib.suppress(RuntimeError):  # a closed loop: the process is ending
                self._loop.call_soon_threadsafe(self._start_renewal)

    def _start_renewal(self) -> None:
        task = self._loop.create_task(self._renew())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _renew(self) -> None:
        if not self._joined:
            return
        try:
            with translated("register the HTTP front again"):
                await self._announce()
        except ZooKeeperUnavailable as exc:
            _log.warning("%s", exc)
        self._on_fronts(dict(self.fronts), True)

    def _fronts_changed(self, names: list[str]) -> bool:  # kazoo's thread
        fronts = {}
        for name in names:
            try:
                data, _stat = self._client.get(f"{FRONTS}/{name}")
                fronts[name] = str(_decode(name, data).get("http", ""))
            except (NoNodeError, CorruptCoordinationData):
                continue
            except Exception as exc:  # a connection drop: the next change reads them again
                _log.warning("could not read the HTTP front %s: %r", name, exc)
        try:
            self._loop.call_soon_threadsafe(self._fronts_seen, fronts)
        except RuntimeError:  # the loop closed: the process is ending
            return False
        return self._joined or self._watch is None

    def _fronts_seen(self, fronts: dict[str, str]) -> None:
        self.fronts = fronts
        self._on_fronts(dict(fronts), False)

    # -- one subscription -------------------------------------------------------------------

    async def create(self, stored: Stored) -> None:
        """Keep a new subscription, owned by this front (one transaction)."""
        definition = _definition(stored)
        with translated("keep the subscription"):
            transaction = self._client.transaction()
            transaction.create(f"{SUBSCRIPTIONS}/{stored.id}", definition)
            transaction.create(f"{STATUS}/{stored.id}", _json(stored.status))
            transaction.create(f"{OWNERS}/{stored.id}", self._owner(), ephemeral=True)
            results = await self._call(transaction.commit_async())
        # the operation that failed has its own error, the others RolledBackError
        failed = [r for r in results if isinstance(r, Exception)]
        failed.sort(key=lambda r: isinstance(r, RolledBackError))
        if failed:
            with translated("keep the subscription"):
                raise failed[0]

    async def replace(self, stored: Stored) -> None:
        """Keep a PATCHed definition."""
        definition = _definition(stored)
        with translated("keep the changed subscription"):
            await self._call(self._client.set_async(f"{SUBSCRIPTIONS}/{stored.id}", definition))

    async def remove(self, subscription_id: str) -> None:
        """Forget a subscription: definition, status and owner, in that order (without its
        definition it is nobody's orphan)."""
        with translated("forget the subscription"):
            for folder in (SUBSCRIPTIONS, STATUS, OWNERS):
                with contextlib.suppress(NoNodeError):
                    await self._call(self._client.delete_async(f"{folder}/{subscription_id}"))

    async def read(self, subscription_id: str) -> Stored | None:
        """A subscription as kept (None if there is none)."""
        with translated("read the subscription"):
            data, status = await asyncio.gather(
                self._data(f"{SUBSCRIPTIONS}/{subscription_id}"),
                self._data(f"{STATUS}/{subscription_id}"),
            )
        if data is None:
            return None
        body = _decode(f"{SUBSCRIPTIONS}/{subscription_id}", data)
        return Stored(
            subscription_id,
            str(body["tenant"]),
            str(body["scope"]),
            dict(body["document"]),
            float(body["created"]),
            _decode(f"{STATUS}/{subscription_id}", status or b"{}"),
        )

    async def exists(self, subscription_id: str) -> bool:
        """Whether a subscription is kept."""
        with translated("look the subscription up"):
            found = await self._call(
                self._client.exists_async(f"{SUBSCRIPTIONS}/{subscription_id}")
            )
        return found is not None

    async def owner(self, subscription_id: str) -> str | None:
        """The front that owns a subscription (None: nobody, or no such subscription)."""
        with translated("read the subscription's owner"):
            data = await self._data(f"{OWNERS}/{subscription_id}")
        if data is None:
            return None
        return str(_decode(f"{OWNERS}/{subscription_id}", data).get("front", ""))

    async def claim(self, subscription_id: str) -> bool:
        """Become a subscription's owner; False if another front is (or it is gone)."""
        with translated("claim the subscription"):
            try:
                await self._call(
                    self._client.create_async(
                        f"{OWNERS}/{subscription_id}", self._owner(), ephemeral=True
                    )
                )
            except NodeExistsError:
                return await self.owner(subscription_id) == self.name
            except NoNodeError:
                return False
        if not await self.exists(subscription_id):
            await self.release([subscription_id])  # deleted meanwhile
            return False
        return True

    # -- many -------------------------------------------------------------------------------

    async def orphans(self) -> list[str]:
        """The subscriptions no front owns."""
        with translated("list the subscriptions"):
            kept = await self._call(self._client.get_children_async(SUBSCRIPTIONS))
        return sorted(set(kept) - await self.owned())

    async def owned(self) -> set[str]:
        """The subscriptions some front owns."""
        with translated("list the subscriptions' owners"):
            return set(await self._call(self._client.get_children_async(OWNERS)))

    async def release(self, ids: Iterable[str]) -> None:
        """Give subscriptions up (their owner znodes deleted; others adopt them)."""
        paths = [f"{OWNERS}/{i}" for i in ids]
        with translated("give the subscriptions up"):
            await self._many(paths, lambda path: self._client.delete_async(path), NoNodeError)

    async def save_status(self, statuses: Iterable[tuple[str, dict[str, Any]]]) -> None:
        """Write the status of subscriptions: STATUS_BATCH to a transaction (one request
        instead of hundreds: 10,000 written one by one took 2 s of the front's CPU); a
        batch that fails (a subscription deleted meanwhile) is written one by one."""
        client = self._client

        async def save(item: tuple[str, dict[str, Any]]) -> None:
            with contextlib.suppress(NoNodeError):  # the subscription is gone
                await self._call(client.set_async(f"{STATUS}/{item[0]}", _json(item[1])))

        with translated("save the subscriptions' status"):
            items = list(statuses)
            for start in range(0, len(items), STATUS_BATCH):
                batch = items[start : start + STATUS_BATCH]
                transaction = client.transaction()
                for subscription_id, record in batch:
                    transaction.set_data(f"{STATUS}/{subscription_id}", _json(record))
                results = await self._call(transaction.commit_async())
                if any(isinstance(r, Exception) for r in results):
                    for piece in range(0, len(batch), PIPELINE):
                        await asyncio.gather(*(save(i) for i in batch[piece : piece + PIPELINE]))

    async def _many(
        self, paths: list[str], call: Callable[[str], Any], ignored: type[Exception]
    ) -> None:
        async def one(path: str) -> None:
            with contextlib.suppress(ignored):
                await self._call(call(path))

        for start in range(0, len(paths), PIPELINE):
            await asyncio.gather(*(one(p) for p in paths[start : start + PIPELINE]))

    # -- plumbing ---------------------------------------------------------------------------

    async def _data(self, path: str) -> bytes | None:
        """A znode's data (None if there is no such znode)."""
        try:
            data, _stat = await self._call(self._client.get_async(path))
        except NoNodeError:
            return None
        return bytes(data)

    def _owner(self) -> bytes:
        return _json({"front": self.name})

    async def _call(self, result: Any) -> Any:
        """Await one of kazoo's asynchronous results on this loop."""
        return await awaited(self._loop, result, CALL_TIMEOUT)


async def awaited(loop: asyncio.AbstractEventLoop, result: Any, timeout: float) -> Any:
    """Await one of kazoo's asynchronous results (``client.get_async(...)``...) on ``loop``:
    its value, or its exception; ZooKeeperUnavailable past ``timeout`` seconds."""
    future: asyncio.Future[Any] = loop.create_future()

    def settle(done: Any) -> None:
        if future.done():
            return
        try:
            future.set_result(done.get_nowait())
        except Exception as exc:
            future.set_exception(exc)

    result.rawlink(lambda done: loop.call_soon_threadsafe(settle, done))
    try:
        return await asyncio.wait_for(future, timeout)
    except TimeoutError:
        raise ZooKeeperUnavailable(f"ZooKeeper did not answer within {timeout:.0f} s") from None
