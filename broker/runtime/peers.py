"""ZooKeeper's view (membership and configuration) carried into a process's event loop.

kazoo calls back on its own threads; these classes hand every change to the asyncio loop
(``call_soon_threadsafe``), so role code reads ``members`` and ``current`` without locks and
is woken by ``changed`` when they move.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from kazoo.client import KazooClient
from kazoo.recipe.watchers import DataWatch

from broker.coordination.configuration import (
    ClusterConfiguration,
    Configuration,
    VersionedConfiguration,
)
from broker.coordination.errors import CorruptCoordinationData
from broker.coordination.membership import Member, watch_members
from broker.coordination.scale import SCALE, ScalePlan

__all__ = ["ConfigurationView", "Peers", "ScaleView"]


class _Watched:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._listeners: list[Callable[[], None]] = []
        self._changed = asyncio.Event()

    def on_change(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` in the loop after every change."""
        self._listeners.append(listener)

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
        for listener in self._listeners:
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
    """The running scale's plan (None when no scale runs), followed in the event loop."""

    def __init__(self, client: KazooClient, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop)
        self.plan: ScalePlan | None = None
        self._stopped = False
        self._watch = DataWatch(client, SCALE, self._from_kazoo)

    def stop(self) -> None:
        """Stop following the plan."""
        self._stopped = True

    def _from_kazoo(self, data: bytes | None, _stat: object) -> bool:
        if self._stopped:
            return False
        plan = None
        if data:
            try:
                plan = ScalePlan.decode(data)
            except CorruptCoordinationData:
                plan = None
        self._loop.call_soon_threadsafe(self._set, plan)
        return True

    def _set(self, plan: ScalePlan | None) -> None:
        self.plan = plan
        self._notify()
