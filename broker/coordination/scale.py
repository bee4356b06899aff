"""The scale protocol's znodes: the plan of a running scale, and its participants' reports.

Layout (under the cluster's chroot)::

    /scale                      persistent while a scale runs; JSON: the plan
        {"id": "...", "layer": "matchers", "old": <configuration>, "new": <configuration>,
         "connection_points": [], "started": 1763750000.5}
    /scale/owner                ephemeral, created with /scale: the coordinator's session; data:
                                the plan id (a plan without its owner is stale: its coordinator
                                died)
    /scale/ready/<matcher>      each matcher of the new configuration once it holds its parts;
                                JSON {"moved": n, "bytes": b} received
    /scale/done/<matcher>       each matcher of the old configuration once every access point
                                has switched on its channel (it dropped what moved away)
    /scale/drained/<exit point> (exit-point scales) each exit point of the old configuration
                                once it delivered every batch of the old epoch
    /scale/moved/<connection point>  (access-point and connection-point scales) each
                                connection point once it moved its traffic where the plan
                                wants it

Only one scale at a time: :func:`begin` creates ``/scale`` or fails with ScaleInProgress.

What participants follow (:func:`read_state`, ``ScaleState.followed``): the plan while its
owner lives. A plan whose owner is gone is stale; participants still follow it when the
configuration has reached its epoch (the coordinator died after the switch: they finish the
scale on their own) and otherwise treat it as ended, rolled back. A stale plan stays until
the next :func:`begin` removes it.

Calls that take a ``timeout`` give up after that many seconds (ZooKeeperUnavailable); without
one, a call made while the connection is down waits for it to come back.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError, NotEmptyError
from kazoo.protocol.states import WatchedEvent

from broker.coordination.configuration import CONFIG, Configuration, VersionedConfiguration
from broker.coordination.errors import (
    ConfigurationConflict,
    CoordinationError,
    CorruptCoordinationData,
    ZooKeeperUnavailable,
    translated,
)

__all__ = [
    "OWNER",
    "SCALE",
    "ScaleInProgress",
    "ScaleOwnerGone",
    "ScalePlan",
    "ScaleState",
    "begin",
    "finish",
    "read_plan",
    "read_state",
    "report",
    "reports",
    "state_of",
    "switch",
]

Watcher = Callable[[WatchedEvent], None]

SCALE = "/scale"
OWNER = f"{SCALE}/owner"
_STAGES = ("ready", "done", "drained", "moved")
REPORT_PATIENCE = 30.0  # seconds a report is tried again while ZooKeeper does not answer
REPORT_RETRY = 0.2  # seconds between tries


class ScaleInProgress(CoordinationError):
    """Another scale is running; one runs at a time."""


class ScaleOwnerGone(CoordinationError):
    """The plan's owner znode is gone: the coordinator's session ended."""


@dataclass(frozen=True, slots=True)
class ScalePlan:
    """A scale of one layer from one configuration to the next (epoch + 1).

    A connection-point scale leaves the configuration as it is (``new`` is ``old``) and names
    the connection points that stay in ``connection_points``.
    """

    id: str
    old: Configuration
    new: Configuration
    started: float
    layer: str = "matchers"
    connection_points: tuple[str, ...] = ()

    @classmethod
    def of(
        cls,
        old: Configuration,
        new: Configuration,
        *,
        layer: str = "matchers",
        connection_points: tuple[str, ...] = (),
    ) -> ScalePlan:
        """A new plan with a fresh id."""
        return cls(uuid.uuid4().hex[:12], old, new, time.time(), layer, connection_points)

    def encode(self) -> bytes:
        """The /scale znode's JSON data."""
        return json.dumps(
            {
                "id": self.id,
                "layer": self.layer,
                "old": json.loads(self.old.encode()),
                "new": json.loads(self.new.encode()),
                "connection_points": list(self.connection_points),
                "started": self.started,
            }
        ).encode()

    @classmethod
    def decode(cls, data: bytes) -> ScalePlan:
        """The plan in ``data``; CorruptCoordinationData if unreadable."""
        try:
            body = json.loads(data)
            return cls(
                str(body["id"]),
                Configuration.decode(json.dumps(body["old"]).encode()),
                Configuration.decode(json.dumps(body["new"]).encode()),
                float(body["started"]),
                str(body.get("layer", "matchers")),
                tuple(str(n) for n in body.get("connection_points", [])),
            )
        except (ValueError, TypeError, KeyError) as exc:
            raise CorruptCoordinationData(f"the scale plan is unreadable: {exc}") from exc


def begin(client: KazooClient, plan: ScalePlan) -> None:
    """Publish the plan; ScaleInProgress if a live scale exists (a stale one is removed).

    The plan and its report directories appear in one transaction: a participant that sees
    the plan can always report.
    """
    with translated("begin a scale"):
        if client.exists(SCALE) is not None:
            if client.exists(f"{SCALE}/owner") is not None:
                raise ScaleInProgress(
                    "another scale is running; wait for it to end (one scale at a time)"
                )
            client.delete(SCALE, recursive=True)  # its coordinator died: stale
        transaction = client.transaction()
        transaction.create(SCALE, plan.encode())
        for stage in _STAGES:
            transaction.create(f"{SCALE}/{stage}")
        transaction.create(OWNER, plan.id.encode(), ephemeral=True)
        results = transaction.commit()
        failures = [r for r in results if isinstance(r, Exception)]
        if failures:
            if isinstance(failures[0], NodeExistsError):
                raise ScaleInProgress("another scale began at the same moment; try again")
            raise failures[0]


def read_plan(client: KazooClient) -> ScalePlan | None:
    """The running scale's plan, or None."""
    with translated("read the scale plan"):
        try:
            data, _stat = client.get(SCALE)
        except NoNodeError:
            return None
    return ScalePlan.decode(data)


@dataclass(frozen=True, slots=True)
class ScaleState:
    """``/scale`` as read: the plan (None: no scale), whether its coordinator's session lives
    (its owner znode names it) and, for a plan whose owner is gone, whether the
    configuration had reached its epoch."""

    plan: ScalePlan | None
    owned: bool = False
    switched: bool = False

    @property
    def followed(self) -> ScalePlan | None:
        """The plan participants follow: while its owner lives, or after the switch."""
        if self.plan is None or not (self.owned or self.switched):
            return None
        return self.plan

    @property
    def stale(self) -> bool:
        """A plan is there but its coordinator died."""
        return self.plan is not None and not self.owned


def read_state(
    client: KazooClient, *, timeout: float | None = None, watch: Watcher | None = None
) -> ScaleState:
    """Read ``/scale``, then (:func:`state_of`) what decides whether it is followed."""
    with translated("read the scale plan"):
        try:
            data, _stat = _wait(client.get_async(SCALE), timeout)
        except NoNodeError:
            data = None
    return state_of(client, data, timeout=timeout, watch=watch)


def state_of(
    client: KazooClient,
    data: bytes | None,
    *,
    timeout: float | None = None,
    watch: Watcher | None = None,
) -> ScaleState:
    """The state of the plan whose data (None: no plan) was just read: its owner is read
    after it (begin creates both at once, so an owner missing then means a dead
    coordinator), and the configuration only for a plan without owner.

    ``watch`` is set on the owner by the same read when it exists: it is called once the
    owner goes (however soon: a watch set later could miss it).
    """
    if data is None:
        return ScaleState(None)
    plan = ScalePlan.decode(data)
    with translated("read the scale plan's owner"):
        try:
            owner, _stat = _wait(client.get_async(OWNER, watch=watch), timeout)
        except NoNodeError:
            owner = b""
        if owner == plan.id.encode():
            return ScaleState(plan, owned=True)
        try:
            config, _stat = _wait(client.get_async(CONFIG), timeout)
        except NoNodeError:
            config = None
    switched = config is not None and Configuration.decode(config).epoch >= plan.new.epoch
    return ScaleState(plan, switched=switched)


def switch(
    client: KazooClient,
    current: VersionedConfiguration,
    new: Configuration,
    *,
    timeout: float | None = None,
) -> None:
    """Compare-and-set the configuration to ``new``, only while the plan's owner exists.

    ConfigurationConflict if the configuration changed since ``current`` was read,
    ScaleOwnerGone if the owner is gone (the coordinator's session ended), ZooKeeperUnavailable
    if the answer was lost (read the configuration to learn whether it was written).
    """
    with translated(f"write the cluster configuration of epoch {new.epoch}"):
        transaction = client.transaction()
        transaction.check(OWNER, 0)  # the owner is never written: version 0 while it exists
        transaction.set_data(CONFIG, new.encode(), current.version)
        results = _wait(transaction.commit_async(), timeout)
    owner, config = results
    if isinstance(owner, NoNodeError):
        raise ScaleOwnerGone("the scale's owner is gone: the coordinator's session ended")
    if isinstance(config, (BadVersionError, NoNodeError)):
        raise ConfigurationConflict(
            f"the cluster configuration changed since epoch {current.epoch} was read"
        )
    for result in results:
        if isinstance(result, Exception):
            raise CoordinationError(f"the switch to epoch {new.epoch} failed: {result!r}")


def report(
    client: KazooClient,
    stage: str,
    name: str,
    body: Mapping[str, float],
    *,
    patience: float = REPORT_PATIENCE,
) -> None:
    """A participant reports a stage (``ready``, ``done``, ...) of the running scale.

    A report is the only word the coordinator waits for: one lost to a ZooKeeper restart
    would hold the scale (and every repair and scale after it) until its timeout. So a write
    that meets no ZooKeeper is tried again for ``patience`` seconds (a write that was applied
    before its answer was lost finds its znode there); ZooKeeperUnavailable after that.
    """
    deadline = time.monotonic() + patience
    while True:
        try:
            with translated(f"report {stage} for {name}"):
                try:
                    client.create(f"{SCALE}/{stage}/{name}", json.dumps(body).encode())
                except NodeExistsError:
                    pass
                except NoNodeError:
                    pass  # the scale ended (rolled back) meanwhile
            return
        except ZooKeeperUnavailable:
            if time.monotonic() > deadline:
                raise
            time.sleep(REPORT_RETRY)


def reports(
    client: KazooClient,
    stage: str,
    *,
    timeout: float | None = None,
    watch: Callable[[Any], None] | None = None,
) -> dict[str, dict[str, float]]:
    """The reports of a stage so far, by participant; ``watch`` (a kazoo watcher) is told
    once when the reports change after this read."""
    found: dict[str, dict[str, float]] = {}
    with translated(f"read the {stage} reports"):
        try:
            names = _wait(client.get_children_async(f"{SCALE}/{stage}", watch=watch), timeout)
        except NoNodeError:
            return found
        for name in names:
            try:
                data, _stat = _wait(client.get_async(f"{SCALE}/{stage}/{name}"), timeout)
            except NoNodeError:
                continue
            try:
                found[name] = json.loads(data) if data else {}
            except ValueError as exc:
                raise CorruptCoordinationData(f"the {stage} report of {name}: {exc}") from exc
    return found


def finish(
    client: KazooClient, plan_id: str | None = None, *, timeout: float | None = None
) -> bool:
    """Remove the scale's znodes in one transaction (it completed or was rolled back).

    With ``plan_id``, only that plan's: False if another plan is there (it is left alone).
    """
    for _attempt in range(5):
        with translated("end the scale"):
            try:
                data, _stat = _wait(client.get_async(SCALE), timeout)
            except NoNodeError:
                return True
            if plan_id is not None and ScalePlan.decode(data).id != plan_id:
                return False
            transaction = client.transaction()
            for child in _wait(client.get_children_async(SCALE), timeout):
                path = f"{SCALE}/{child}"
                with contextlib.suppress(NoNodeError):
                    for leaf in _wait(client.get_children_async(path), timeout):
                        transaction.delete(f"{path}/{leaf}")
                transaction.delete(path)
            transaction.delete(SCALE)
            results = _wait(transaction.commit_async(), timeout)
        if not any(isinstance(r, Exception) for r in results):
            return True
        if not any(isinstance(r, (NotEmptyError, NoNodeError)) for r in results):
            raise CoordinationError(f"could not end the scale: {results!r}")
        # a report arrived (or went) meanwhile: list again
    raise CoordinationError("could not end the scale: its reports kept changing")


def _wait(result: Any, timeout: float | None) -> Any:
    """The value of one of kazoo's asynchronous results (its exception raised), waiting at
    most ``timeout`` seconds (kazoo's timeout exception, which translated() maps)."""
    return result.get(timeout=timeout)
