"""The cluster's configuration: its epoch, its matchers and their selector, in one znode.

Layout (under the cluster's chroot)::

    /config     persistent; JSON data:
        {"epoch": 3, "matchers": ["m1", "m2"],
         "selector": {"kind": "rendezvous", "version": 1, "owners": ["m1", "m2"],
                      "replicas": 2},
         "exit_points": ["ep1"], "access_points": ["ap1"], "failed": []}

``exit_points`` and ``access_points`` name the processes of those layers that serve in this
epoch (an empty list, as in configurations written before they existed: every live one).
``failed`` names the members a repair removed because they died (broker.coordination.repair),
the last ``FAILED_KEPT`` of them, carried from epoch to epoch: whoever waits for a member's
part of the work (an exit point for a matcher's partial result) stops waiting for these.

Every change is a compare-and-set on the znode's version: a writer reads the configuration
(getting its version), computes the next one, and writes it only if the version is still the
one it read. Two writers therefore never interleave: the second gets ConfigurationConflict,
reads again and decides anew. Epochs strictly increase with every write.

The znode's states::

    ABSENT --create()--> PRESENT(epoch e, version 0) --replace()--> PRESENT(epoch > e, version+1)

A write whose reply is lost to a connection drop raises ZooKeeperUnavailable: it may or may
not have been applied, so the caller reads again (and finds its epoch there, or not).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError
from kazoo.protocol.states import ZnodeStat
from kazoo.recipe.watchers import DataWatch

from broker.coordination.errors import (
    ConfigurationConflict,
    CorruptCoordinationData,
    InvalidConfiguration,
    translated,
)
from broker.errors import InvalidInput
from broker.partition.selector import RendezvousSelector

__all__ = [
    "CONFIG",
    "DEFAULT_REPLICAS",
    "ClusterConfiguration",
    "Configuration",
    "ConfigurationWatch",
    "VersionedConfiguration",
]

CONFIG = "/config"
FAILED_KEPT = 256  # the most recent failed members a configuration remembers
DEFAULT_REPLICAS = 2  # matchers holding each subscription (silbo up --replicas)

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Configuration:
    """One configuration of the cluster: an epoch, the matchers and who owns what, and the
    exit points and access points that serve in it (empty: every live one).

    InvalidConfiguration unless the epoch is a non-negative integer, each list holds
    distinct non-empty names, and the selector's owners are exactly the matchers.
    """

    epoch: int
    matchers: tuple[str, ...]
    selector: RendezvousSelector
    exit_points: tuple[str, ...] = ()
    access_points: tuple[str, ...] = ()
    failed: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.epoch, int) or isinstance(self.epoch, bool) or self.epoch < 0:
            raise InvalidConfiguration(f"epoch must be a non-negative integer, not {self.epoch!r}")
        for label in ("matchers", "exit_points", "access_points", "failed"):
            names = tuple(getattr(self, label))
            if not all(isinstance(n, str) and n for n in names) or len(set(names)) != len(names):
                raise InvalidConfiguration(f"{label} must be distinct non-empty names: {names!r}")
            object.__setattr__(self, label, names)
        if set(self.selector.owners) != set(self.matchers):
            raise InvalidConfiguration(
                f"the selector's owners {list(self.selector.owners)} are not the matchers "
                f"{list(self.matchers)}"
            )
        serving = {*self.matchers, *self.exit_points, *self.access_points}
        if serving.intersection(self.failed):
            raise InvalidConfiguration(
                f"failed members serve: {sorted(serving.intersection(self.failed))}"
            )

    @classmethod
    def of(
        cls,
        epoch: int,
        matchers: Sequence[str],
        *,
        exit_points: Sequence[str] = (),
        access_points: Sequence[str] = (),
        replicas: int = 1,
    ) -> Configuration:
        """The configuration at ``epoch`` with a rendezvous selector over ``matchers`` that
        keeps each subscription on ``replicas`` of them."""
        return cls(
            epoch,
            tuple(matchers),
            _selector(matchers, replicas),
            tuple(exit_points),
            tuple(access_points),
        )

    @property
    def replicas(self) -> int:
        """How many matchers are configured to hold each subscription."""
        return self.selector.replicas

    def next(
        self,
        matchers: Sequence[str] | None = None,
        selector: RendezvousSelector | None = None,
        *,
        exit_points: Sequence[str] | None = None,
        access_points: Sequence[str] | None = None,
        failed: Sequence[str] = (),
    ) -> Configuration:
        """The configuration one epoch later, with what is given changed (default selector:
        rendezvous over the matchers, kept when the matchers are); ``failed`` adds members
        that died to the ones remembered."""
        if matchers is None:
            matchers, selector = self.matchers, selector or self.selector
        remembered = [n for n in self.failed if n not in failed] + list(failed)
        return Configuration(
            self.epoch + 1,
            tuple(matchers),
            selector if selector is not None else _selector(matchers, self.replicas),
            tuple(self.exit_points if exit_points is None else exit_points),
            tuple(self.access_points if access_points is None else access_points),
            tuple(remembered[-FAILED_KEPT:]),
        )

    def encode(self) -> bytes:
        """The znode's JSON data."""
        body = {
            "epoch": self.epoch,
            "matchers": list(self.matchers),
            "selector": self.selector.to_dict(),
            "exit_points": list(self.exit_points),
            "access_points": list(self.access_points),
            "failed": list(self.failed),
        }
        return json.dumps(body, sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes) -> Configuration:
        """The configuration stored in ``data``; CorruptCoordinationData if unreadable."""
        try:
            body = json.loads(data)
            lists = {}
            for label in ("matchers", "exit_points", "access_points", "failed"):
                names = body["matchers"] if label == "matchers" else body.get(label, [])
                if not isinstance(names, list):
                    raise TypeError(f"{label} is not a list")
                lists[label] = tuple(names)
            return cls(
                body["epoch"],
                lists["matchers"],
                RendezvousSelector.from_dict(body["selector"]),
                lists["exit_points"],
                lists["access_points"],
                lists["failed"],
            )
        except (ValueError, TypeError, KeyError, InvalidInput) as exc:
            raise CorruptCoordinationData(f"the configuration znode is unreadable: {exc}") from exc


@dataclass(frozen=True, slots=True)
class VersionedConfiguration:
    """A configuration as read, with the znode version a compare-and-set must match."""

    configuration: Configuration
    version: int

    @property
    def epoch(self) -> int:
        """The configuration's epoch."""
        return self.configuration.epoch


ConfigurationCallback = Callable[[VersionedConfiguration | None], None]


class ClusterConfiguration:
    """Reads, creates and compare-and-sets the cluster's configuration znode."""

    def __init__(self, client: KazooClient, path: str = CONFIG) -> None:
        self._client = client
        self._path = path

    @property
    def path(self) -> str:
        """The znode's path, relative to the cluster's chroot."""
        return self._path

    def read(self) -> VersionedConfiguration | None:
        """The current configuration, or None before one was created."""
        with translated("read the cluster configuration"):
            try:
                data, stat = self._client.retry(self._client.get, self._path)
            except NoNodeError:
                return None
        return VersionedConfiguration(Configuration.decode(data), stat.version)

    def create(self, initial: Configuration) -> VersionedConfiguration:
        """Store the first configuration; ConfigurationConflict if one already exists."""
        with translated("create the cluster configuration"):
            try:
                self._client.create(self._path, initial.encode(), makepath=True)
            except NodeExistsError as exc:
                raise ConfigurationConflict(
                    "the cluster already has a configuration; read it and replace it instead"
                ) from exc
        return VersionedConfiguration(initial, 0)

    def replace(
        self, current: VersionedConfiguration, new: Configuration
    ) -> VersionedConfiguration:
        """Store ``new`` if the znode is still at ``current``'s version.

        ConfigurationConflict if another writer got there first; InvalidConfiguration if
        ``new``'s epoch does not exceed ``current``'s.
        """
        if new.epoch <= current.epoch:
            raise InvalidConfiguration(
                f"epoch {new.epoch} does not follow the current epoch {current.epoch}"
            )
        # Not retried: after a lost reply a retry would conflict with our own write.
        with translated(f"write the cluster configuration of epoch {new.epoch}"):
            try:
                stat = self._client.set(self._path, new.encode(), version=current.version)
            except (BadVersionError, NoNodeError) as exc:
                raise ConfigurationConflict(
                    f"the cluster configuration changed since epoch {current.epoch} "
                    f"(version {current.version}) was read; read it again"
                ) from exc
        return VersionedConfiguration(new, stat.version)

    def advance(
        self,
        current: VersionedConfiguration,
        matchers: Sequence[str],
        selector: RendezvousSelector | None = None,
    ) -> VersionedConfiguration:
        """Replace ``current`` with the next epoch over ``matchers`` (see :meth:`replace`)."""
        return self.replace(current, current.configuration.next(matchers, selector))

    def watch(self, callback: ConfigurationCallback) -> ConfigurationWatch:
        """Call ``callback`` with the configuration now and after every change."""
        return ConfigurationWatch(self._client, self._path, callback)


class ConfigurationWatch:
    """Calls back with the current configuration (None while absent) until stopped.

    The first call happens in the caller's thread, later ones in kazoo's callback thread.
    Unreadable data is logged and not passed on. After a lost session kazoo re-reads the
    znode and calls back again if it changed meanwhile.
    """

    def __init__(self, client: KazooClient, path: str, callback: ConfigurationCallback) -> None:
        self._callback = callback
        self._stopped = False
        with translated("watch the cluster configuration"):
            self._watch = DataWatch(client, path, self._changed)

    def stop(self) -> None:
        """Stop calling back (takes effect at the next change at the latest)."""
        self._stopped = True

    def _changed(self, data: bytes | None, stat: ZnodeStat | None) -> bool:
        if self._stopped:
            return False
        if data is None or stat is None:
            self._callback(None)
            return True
        try:
            current = VersionedConfiguration(Configuration.decode(data), stat.version)
        except CorruptCoordinationData:
            _log.exception("ignoring an unreadable cluster configuration")
            return True
        self._callback(current)
        return not self._stopped


def _selector(matchers: Sequence[str], replicas: int) -> RendezvousSelector:
    try:
        return RendezvousSelector(tuple(matchers), replicas)
    except InvalidInput as exc:
        raise InvalidConfiguration(f"no selector over matchers {list(matchers)!r}: {exc}") from exc
