"""ZooKeeper's view (membership and configuration) carried into a process's event loop.

kazoo calls back on its own threads; these classes hand every change to the asyncio loop
(``call_soon_threadsafe``), so role code reads ``members`` and ``current`` without locks and
is woken by ``changed`` when they move.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

from kazoo.client import KazooClient
from kazoo.protocol.states import KazooState, WatchedEvent
from kazoo.recipe.watchers import DataWatch

from broker.coordination.configuration import (
    ClusterConfiguration,
    Configuration,
    VersionedConfiguration,
)
from broker.coordination.errors import CoordinationError, CorruptCoordinationData
from broker.coordination.membership import Member, watch_members
from broker.coordination.scale import SCALE, ScalePlan, ScaleState, read_state, state_of

__all__ = ["ConfigurationView", "Peers", "ScaleView"]


class _Watched:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._listeners: list[Callable[[], None]] = []
        self._changed = asyncio.Event()

    def on_change(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` in the loop after every change."""
        self._listeners.append(listener)

    def off_change(self, listener: Callable[[], None]) -> None:
        """Stop calling ``listener`` (given to :meth:`on_change`)."""
        self._listeners.remove(listener)

    async def wait_until(self, condition: Callable[[], bool], timeout: float) -> bool:
        """Wait until ``condition()`` holds; False if ``timeout`` seconds pass first."""
        deadline = self._loop.time() + timeout
        while not condition():
            remaining = deadline - self._loop.time()
            if remaining <= 0:
                return False
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), remaining)
            except TimeoutError:
                return condition()
        return True

    def _notify(self) -> None:
        self._changed.set()
        for listener in list(self._listeners):
            listener()


class Peers(_Watched):
    """The live members of one role, by registration order."""

    def __init__(self, client: KazooClient, role: str, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop)
        self.role = role
        self.members: list[Member] = []
        self.by_name: dict[str, Member] = {}
        self.by_sequence: dict[int, Member] = {}
        self._watch = watch_members(client, role, self._from_kazoo)

    def stop(self) -> None:
        """Stop following the members."""
        self._watch.stop()

    def _from_kazoo(self, members: list[Member]) -> None:
        self._loop.call_soon_threadsafe(self._set, members)

    def _set(self, members: list[Member]) -> None:
        self.members = members
        self.by_name = {m.name: m for m in members}
        self.by_sequence = {m.sequence: m for m in members}
        self._notify()


class ConfigurationView(_Watched):
    """The cluster's current configuration, and every one seen since start (by epoch)."""

    def __init__(self, client: KazooClient, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop)
        self.current: Configuration | None = None
        self.history: dict[int, Configuration] = {}
        self._watch = ClusterConfiguration(client).watch(self._from_kazoo)

    def stop(self) -> None:
        """Stop following the configuration."""
        self._watch.stop()

    def _from_kazoo(self, versioned: VersionedConfiguration | None) -> None:
        configuration = versioned.configuration if versioned is not None else None
        self._loop.call_soon_threadsafe(self._set, configuration)

    def _set(self, configuration: Configuration | None) -> None:
        if configuration is not None:
            self.history[configuration.epoch] = configuration
        self.current = configuration
        self._notify()


class ScaleView(_Watched):
    """The plan participants follow (None when no scale runs), followed in the event loop.

    A plan is followed while its coordinator's session lives (``/scale/owner``). When the
    owner goes (the coordinator died, or its session expired) the plan is stale: still
    followed if the configuration had reached its epoch (the switch happened: participants
    finish the scale on their own), otherwise over, as if removed (rolled back). Listeners
    are called when the followed plan changes; ``ended`` is then the plan that stopped being
    followed (None when a plan is followed).

    The decision is taken on kazoo's thread from ZooKeeper itself (``state_of``: the plan,
    then its owner, then, for a plan without owner, the configuration), not from a
    configuration view that may lag. The owner is watched by the very read that finds it:
    a coordinator dying right after publishing its plan is seen (a watch set by a later
    read would find no owner to watch and miss it).
    """

    def __init__(self, client: KazooClient, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop)
        self.plan: ScalePlan | None = None
        self.ended: ScalePlan | None = None
        self._client = client
        self._stopped = False
        self._lock = threading.Lock()
        self._followed: ScalePlan | None = None  # kazoo's side: the plan last handed over
        client.add_listener(self._connection)
        self._watch = DataWatch(client, SCALE, self._plan_changed)

    def stop(self) -> None:
        """Stop following the plan."""
        self._stopped = True
        self._client.remove_listener(self._connection)

    def _connection(self, state: KazooState) -> None:  # kazoo's connection thread: no calls
        if state == KazooState.CONNECTED and not self._stopped:
            self._client.handler.spawn(self._refresh)

    def _plan_changed(self, data: bytes | None, _stat: object) -> bool:
        if self._stopped:
            return False
        self._refresh(lambda: state_of(self._client, data, watch=self._owner_changed))
        return True

    def _owner_changed(self, _event: WatchedEvent) -> None:
        if not self._stopped:
            self._refresh()

    def _refresh(self, read: Callable[[], ScaleState] | None = None) -> None:
        """Decide anew (``read``: from /scale's data as a watch just read it)."""
        with self._lock:
            if self._stopped:
                return
            try:
                state = read() if read else read_state(self._client, watch=self._owner_changed)
                followed = state.followed
            except CorruptCoordinationData:
                followed = None
            except CoordinationError:
                return  # the connection dropped: the next CONNECTED reads again
            before = self._followed
            if (before.id if before else None) == (followed.id if followed else None):
                return
            self._followed = followed
            self._loop.call_soon_threadsafe(self._set, followed, before)

    def _set(self, plan: ScalePlan | None, before: ScalePlan | None) -> None:
        self.plan = plan
        self.ended = before if plan is None else None
        self._notify()
