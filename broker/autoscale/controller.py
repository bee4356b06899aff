"""The autoscaling controller: the decision model (broker.autoscale.model) run on a cluster.

Every ``interval`` seconds the leading controller

1. reads ``/autoscale/enabled`` and ``/autoscale/policy`` (broker.autoscale.state): off, it
   does nothing (and forgets what it measured: turned on again, it measures afresh);
2. asks every serving member of the matchers, exit points, access points and connection
   points for its ``Admin.Status``, in parallel, each within a deadline
   (:func:`broker.cluster.operations.ask_all`), and builds an :class:`Observation`
   (:class:`Observer`): per layer its size (the processes the configuration has serve it;
   every live one for the connection points), one sample per process that answered (busy
   fraction and rates over the time since the last answer, from its totals; the process's
   own 5-second figures the first time) and its arrival rate (the items its processes took
   in);
3. feeds it to the model's :class:`Controller`, and carries out each decision, recording it
   in ZooKeeper first (outcome null: in flight) and its outcome after
   (:meth:`Autoscaler.tick`). How (:class:`LiveCluster`):

   - ``scale-out`` / ``scale-in``: the scale protocol to the new size
     (:func:`broker.cluster.operations.scale_to`, as ``silbo admin scale`` does): idle
     registered processes (pre-warmed ones) are taken first; for a cluster of ``silbo up``
     missing ones are started and leaving ones stopped;
   - ``prewarm``: processes are started that register but serve nothing until a scale-out
     takes them in (a cluster of ``silbo up`` only; connection points serve as soon as they
     run, so theirs is skipped);
   - ``cancel-prewarm``: those idle processes are stopped.

   The context stores are observed and scaled too, with their own scale protocol
   (:func:`broker.cluster.operations.resize_store_layer`, as ``silbo admin scale
   context-stores``: partitions of entities move); they are not pre-warmed (a store added
   takes its partitions when the scale runs).

One controller acts: each controller process contends in a ZooKeeper election
(``/autoscale/leader``, :func:`contend`); the others stand by, and the first of them leads
once the leader's session ends (a killed leader: after its session timeout,
``SESSION_TIMEOUT``). A new leader first finishes the decisions its predecessor recorded
and did not finish (:meth:`Autoscaler.resume`): each is carried out again (every action is
"make the layer so": done already, it does nothing) if it is younger than
``RESUME_WITHIN``, else recorded as abandoned; then it measures a whole metrics window
before deciding anything itself.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TextIO

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException
from kazoo.protocol.states import KazooState

from broker.autoscale.model import Controller, Decision, Kind, LayerSample, LayerView, Observation
from broker.autoscale.policy import Policy
from broker.autoscale.state import LEADER
from broker.cluster.operations import (
    ROLES,
    ask_all,
    idle_members,
    prewarm,
    resize_store_layer,
    retire_idle,
    scale_to,
)
from broker.coordination.configuration import ClusterConfiguration
from broker.coordination.coordinator import serving
from broker.coordination.membership import members
from broker.errors import SilboError
from broker.roles.store_scaling import registrations
from broker.store.layout import read_store_layout
from broker.wire import internal_pb2 as wire

__all__ = [
    "RESUME_WITHIN",
    "SESSION_TIMEOUT",
    "Autoscaler",
    "ClusterLook",
    "LiveCluster",
    "Observer",
    "contend",
]

_log = logging.getLogger(__name__)

SESSION_TIMEOUT = 4.0  # seconds: a killed leader's standby leads after about that long
RESUME_WITHIN = 120.0  # seconds: an unfinished decision older than that is abandoned
SCALE_TIMEOUT = 60.0
STORE_LAYER = "context-stores"  # the layer scaled with its own protocol (not in ROLES)


@dataclass(frozen=True, slots=True)
class ClusterLook:
    """The cluster at one instant: each layer's serving processes, and the statuses of
    those that answered, by member name."""

    layers: Mapping[str, Sequence[str]]
    statuses: Mapping[str, wire.ProcessStatus]


class Cluster(Protocol):
    """What the controller sees of a cluster and does to it (:class:`LiveCluster`)."""

    def look(self) -> ClusterLook | None:
        """The cluster now (None: not formed yet)."""

    def carry_out(self, kind: Kind, layer: str, before: int, after: int) -> str:
        """Do what a decision asks; its outcome in words (``completed: ...``, ``rolled
        back: ...``, ``skipped: ...``). SilboError when it could not be begun."""


class State(Protocol):
    """The ZooKeeper side (broker.autoscale.state.AutoscaleState)."""

    def enabled(self) -> bool:
        """Whether the controller may act."""

    def policy(self) -> Policy:
        """The policy kept."""

    def record(self, decision: Decision, leader: str) -> str:
        """Write a decision in flight; its id."""

    def finish(self, path: str, outcome: str) -> None:
        """Write a decision's outcome."""

    def in_flight(self) -> list[dict[str, Any]]:
        """Decisions recorded and not finished."""


@dataclass(slots=True)
class _Totals:
    t: float
    busy_seconds: float
    items_in: int
    items_out: int
    items_held: int


@dataclass(slots=True)
class Observer:
    """Turns what the processes report into the model's observations (module docstring)."""

    _last: dict[str, _Totals] = field(default_factory=dict)

    def observation(self, t: float, look: ClusterLook) -> Observation:
        """The observation at ``t`` (seconds, increasing) of ``look``."""
        layers = {}
        last, self._last = self._last, {}
        for layer, names in look.layers.items():
            samples = []
            for name in names:
                status = look.statuses.get(name)
                if status is not None:
                    samples.append(self._sample(t, name, status.load, last.get(name)))
            layers[layer] = LayerView(
                processes=len(names),
                input_rate=sum(s.items_in for s in samples),
                samples=samples,
            )
        return Observation(t, layers)

    def _sample(self, t: float, name: str, load: wire.Load, before: _Totals | None) -> LayerSample:
        now = _Totals(t, load.busy_seconds, load.items_in, load.items_out, load.items_held)
        self._last[name] = now
        elapsed = t - before.t if before is not None else 0.0
        if (
            before is None
            or elapsed <= 0
            or now.busy_seconds < before.busy_seconds
            or now.items_in < before.items_in
            or now.items_out < before.items_out
            or now.items_held < before.items_held
        ):  # first seen, or restarted (its totals began again): its own recent figures
            return LayerSample(
                busy=load.busy_fraction,
                items_in=load.input_rate,
                items_out=load.output_rate,
                queue_depth=load.queue_depth,
                queue_age_s=load.queue_age,
                held_back=load.held_fraction,
            )
        taken = now.items_in - before.items_in
        return LayerSample(
            busy=min(1.0, (now.busy_seconds - before.busy_seconds) / elapsed),
            items_in=taken / elapsed,
            items_out=(now.items_out - before.items_out) / elapsed,
            queue_depth=load.queue_depth,
            queue_age_s=load.queue_age,
            held_back=min(1.0, (now.items_held - before.items_held) / taken) if taken else 0.0,
        )


class Autoscaler:
    """One controller's work while it leads: :meth:`resume`, then :meth:`tick` each interval."""

    def __init__(
        self,
        cluster: Cluster,
        state: State,
        *,
        identity: str,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        record: TextIO | None = None,
    ) -> None:
        """``record``: where each round's observation, policy and decisions go, one JSON
        object a line (``silbo autoscaler --record``: a series to replay through the model)."""
        self._cluster = cluster
        self._state = state
        self._record = record
        self.identity = identity
        self._clock = clock
        self._wall = wall
        self._controller: Controller | None = None
        self._observer = Observer()
        self._resumed = False

    def new_term(self) -> None:
        """Leading again (or for the first time): resume what is in flight first, and
        measure afresh."""
        self._controller, self._observer, self._resumed = None, Observer(), False

    def tick(self) -> list[Decision]:
        """One round: observe, decide, carry out and record; the decisions taken."""
        if not self._state.enabled():
            self._controller, self._observer = None, Observer()
            return []
        if not self._resumed:
            self.resume()
        policy = self._state.policy()
        if self._controller is None:
            self._controller = Controller(policy)
        self._controller.policy = policy  # set knobs apply from this round on
        look = self._cluster.look()
        if look is None:
            return []
        observation = self._observer.observation(self._clock(), look)
        decisions = self._controller.observe(observation)
        if self._record is not None:
            line = {
                **observation.to_dict(),
                "policy": policy.settings(),
                "decisions": [d.to_dict() for d in decisions],
            }
            self._record.write(json.dumps(line) + "\n")
            self._record.flush()
        for decision in decisions:
            what = f"{decision.kind.value} {decision.layer} {decision.before} -> {decision.after}"
            _log.info("decided %s: %s", what, decision.reason)
            path = self._state.record(decision, self.identity)
            outcome = self._carry_out(
                decision.kind, decision.layer, decision.before, decision.after
            )
            self._state.finish(path, outcome)
            _log.info("%s %s: %s", decision.kind.value, decision.layer, outcome)
        return decisions

    def resume(self) -> None:
        """Finish the decisions a previous leader recorded and did not finish (module doc)."""
        for entry in self._state.in_flight():
            leader = entry.get("leader", "?")
            age = self._wall() - float(entry.get("t") or 0.0)
            try:
                kind = Kind(entry["kind"])
                layer, before, after = str(entry["layer"]), int(entry["from"]), int(entry["to"])
            except (KeyError, ValueError, TypeError):
                self._state.finish(entry["id"], f"abandoned by {self.identity}: unreadable")
                continue
            if age > RESUME_WITHIN:
                outcome = (
                    f"abandoned by {self.identity}: its leader {leader} stopped {age:.0f} s ago "
                    "before recording an outcome; the load is judged afresh"
                )
            else:
                done = self._carry_out(kind, layer, before, after)
                outcome = f"resumed by {self.identity} (leader {leader} stopped): {done}"
            self._state.finish(entry["id"], outcome)
            _log.info("%s %s recorded by %s: %s", kind.value, layer, leader, outcome)
        self._resumed = True

    def _carry_out(self, kind: Kind, layer: str, before: int, after: int) -> str:
        try:
            return self._cluster.carry_out(kind, layer, before, after)
        except SilboError as exc:
            return f"failed: {exc}"
        except Exception as exc:  # recorded as failed, not left in flight for the next leader
            _log.exception("carrying out %s of %s failed", kind.value, layer)
            return f"failed: {type(exc).__name__}: {exc}"


class LiveCluster:
    """A real cluster, through ZooKeeper and the members' Admin services; ``local``: the
    state directory of a ``silbo up`` cluster (processes are started and stopped), None
    for another (only registered processes are used)."""

    def __init__(self, client: KazooClient, local: Path | None, *, ask_timeout: float) -> None:
        self._client = client
        self._local = local
        self._ask_timeout = ask_timeout

    def look(self) -> ClusterLook | None:
        """The cluster now (None: not formed yet)."""
        current = ClusterConfiguration(self._client).read()
        if current is None:
            return None
        layers = {layer: serving(self._client, current.configuration, layer) for layer in ROLES}
        stores = self._stores()
        if stores:
            layers[STORE_LAYER] = stores
        wanted = {name for names in layers.values() for name in names}
        found = [m for m in members(self._client) if m.name in wanted]
        return ClusterLook(layers, ask_all(found, timeout=self._ask_timeout))

    def _stores(self) -> list[str]:
        """The member names of the stores of the store layout (none: no store layer)."""
        layout = read_store_layout(self._client)
        if layout is None:
            return []
        found = registrations(self._client)
        return [found[s].member for s in layout.stores if s in found]

    def _carry_out_stores(self, kind: Kind, after: int) -> str:
        if kind not in (Kind.SCALE_OUT, Kind.SCALE_IN):
            return "skipped: context stores are not pre-warmed (one takes its share as it joins)"
        layout = read_store_layout(self._client)
        if layout is not None and len(layout.stores) == after and not layout.previous:
            return f"completed: {STORE_LAYER} has {after} already"
        outcome, old = resize_store_layer(self._client, self._local, after, SCALE_TIMEOUT)
        message = f" ({outcome.message})" if outcome.message else ""
        return (
            f"{outcome.outcome}: {STORE_LAYER} {old} -> {after} in {outcome.duration_s:.2f} s, "
            f"{outcome.moved_partitions} partitions moved{message}"
        )

    def carry_out(self, kind: Kind, layer: str, before: int, after: int) -> str:
        """Do what a decision asks (module docstring); its outcome in words."""
        if layer == STORE_LAYER:
            return self._carry_out_stores(kind, after)
        role = ROLES[layer].value
        if kind in (Kind.SCALE_OUT, Kind.SCALE_IN):
            current = ClusterConfiguration(self._client).read()
            if current is not None:
                now = len(serving(self._client, current.configuration, layer))
                if now == after:
                    return f"completed: {layer} has {after} already"
            outcome, old = scale_to(self._client, self._local, layer, after, timeout=SCALE_TIMEOUT)
            message = f" ({outcome.message})" if outcome.message else ""
            return (
                f"{outcome.outcome}: {layer} {old} -> {after} in {outcome.duration_s:.2f} s, "
                f"epoch {outcome.epoch}{message}"
            )
        if layer == "connection-points":
            return "skipped: connection points serve as soon as they run (nothing to pre-warm)"
        if self._local is None:
            return (
                f"skipped: not a cluster of silbo up (start or stop {role} processes with "
                f"silbo run {role})"
            )
        if kind is Kind.PREWARM:
            started = prewarm(self._client, self._local, layer, after - before)
            idle = len(idle_members(self._client, layer, self._local))
            return (
                f"completed: {len(started)} {role} started, {idle} idle until a scale-out "
                "takes them in"
            )
        stopped = retire_idle(self._client, self._local, layer, before - after)
        return f"completed: {len(stopped)} idle {role} stopped"


def contend(
    client: KazooClient,
    autoscaler: Autoscaler,
    *,
    interval: float,
    stop: threading.Event,
    on_lead: Callable[[], None] = lambda: None,
) -> None:
    """Contend for the lead until ``stop``; while leading, tick every ``interval`` seconds.

    Leadership ends with the session (LOST: its election znode is gone, so another may lead
    already): the loop then contends again, on the new session, and a new :class:`Autoscaler`
    state is not needed (it resumes what is in flight and measures afresh).
    """
    lost = threading.Event()

    def listen(state: KazooState) -> None:  # kazoo's connection thread: no calls
        if state == KazooState.LOST:
            lost.set()

    client.add_listener(listen)

    def lead() -> None:
        _log.info("%s leads the autoscaling", autoscaler.identity)
        on_lead()
        autoscaler.new_term()
        while not stop.is_set() and not lost.is_set():
            started = time.monotonic()
            if client.state == KazooState.CONNECTED:
                try:
                    autoscaler.tick()
                except SilboError as exc:
                    _log.warning("autoscaling round failed (%s); trying again", exc)
                except Exception:  # a controller must outlive one bad round
                    _log.exception("autoscaling round failed; trying again")
            stop.wait(max(0.0, interval - (time.monotonic() - started)))

    while not stop.is_set():
        lost.clear()
        try:
            client.Election(LEADER, autoscaler.identity).run(lead)
        except (KazooException, SilboError) as exc:
            if stop.is_set():
                break  # the client is being closed under us
            _log.warning("autoscaling election failed (%s); contending again", exc)
            stop.wait(1.0)
