"""The coordinator of a scale: from the current configuration to the next, one layer changed.

    outcome = scale_matchers(client, ["m1", "m2", "m3"], timeout=60)
    outcome = scale_layer(client, "exit-points", ["ep1", "ep2"])

Steps of a matcher, exit-point or access-point scale (docs/protocol.md has the whole
protocol, per participant; the latter two move no subscription, so their steps 2 and 4 are
quick):

1. publish the plan (``/scale``: old and new configuration, epoch + 1); one scale at a
   time, a second is *rejected*;
2. the access points send a start marker in-band to every old matcher and hold new
   (un)subscriptions; each old matcher, once it has every access point's marker, sends what
   moves to its new owners; each new owner reports *ready* when it has every part;
3. when every matcher of the new configuration is ready, write the new configuration
   (compare-and-set, only while the plan's owner exists): the access points switch,
   sending a switch marker in-band first, and release what they held; updates were never
   held back (no matching pause);
4. when every old matcher reports *done* (each access point's switch marker arrived, what
   moved away is dropped), and in an exit-point scale every old exit point *drained* (it
   delivered every batch of the old epoch), and in an access-point scale every connection
   point *moved* to an access point of the new configuration, remove the plan: *completed*.

A connection-point scale does not change the configuration: the leaving connection points
hand their sessions and publishers over to the staying ones and report *moved*.

Failures. Before the switch (step 3) the scale is *rolled back*: the plan is removed without
touching the configuration and the participants undo what they did (received parts are
dropped, held subscriptions released to the old owners). That happens when the new matchers
are not all ready within ``timeout``, when a matcher of either configuration dies (its part
never comes, or it would own subscriptions while dead), and when the coordinator's
ZooKeeper session ends (its plan's owner znode goes with it; the participants roll back on
their own and the next scale removes the stale plan). After the switch the scale is
*completed* whatever happens: a participant that dies or does not report in time is not
waited for, and one that the coordinator's session outlives finishes on its own; the
message names them. If the switch's answer is lost and the configuration cannot be read
again in time, the outcome is *unknown* (read the epoch with ``silbo admin status``).
Every path returns a ScaleOutcome; no ZooKeeper failure escapes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError
from kazoo.protocol.states import KazooState

from broker.coordination.configuration import (
    CONFIG,
    ClusterConfiguration,
    Configuration,
    VersionedConfiguration,
)
from broker.coordination.errors import (
    ConfigurationConflict,
    CoordinationError,
    ZooKeeperUnavailable,
    translated,
)
from broker.coordination.membership import MEMBERS, members
from broker.coordination.scale import (
    ScaleInProgress,
    ScaleOwnerGone,
    ScalePlan,
    begin,
    finish,
    reports,
    switch,
)
from broker.errors import SilboError

__all__ = ["LAYERS", "ScaleOutcome", "scale_layer", "scale_matchers", "serving"]

WATCH_FALLBACK = 1.0  # seconds between two looks at the reports when no watch fires
CALL_TIMEOUT = 5.0  # seconds one ZooKeeper call may take (the connection may be down)
END_GRACE = 10.0  # seconds past the deadline to learn the switch's fate or remove the plan

LOST_BEFORE = (
    "the coordinator's ZooKeeper session ended before the switch; the participants roll "
    "back on their own and the next scale removes the stale plan"
)
LOST_AFTER = (
    "the coordinator's ZooKeeper session ended after the switch; the participants finish "
    "on their own and the next scale removes the stale plan"
)


@dataclass
class ScaleOutcome:
    """What a scale command reports (``--json`` gives these keys)."""

    outcome: str  # completed | rolled back | rejected | unknown
    duration_s: float
    moved_subscriptions: int
    moved_bytes: int
    no_matching_ms: float  # the longest any update was held back from matching
    epoch: int
    message: str = ""

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of ``silbo admin scale --json``."""
        return asdict(self)


LAYERS = ("matchers", "exit-points", "access-points", "connection-points")
_ROLE = {
    "matchers": "matcher",
    "exit-points": "exit-point",
    "access-points": "access-point",
    "connection-points": "connection-point",
}
_FIELD = {"matchers": "matchers", "exit-points": "exit_points", "access-points": "access_points"}


def scale_matchers(
    client: KazooClient, matchers: Sequence[str], *, timeout: float = 60.0
) -> ScaleOutcome:
    """Run the scale protocol to a configuration over ``matchers`` (registered already)."""
    return scale_layer(client, "matchers", matchers, timeout=timeout)


def serving(client: KazooClient, configuration: Configuration, layer: str) -> list[str]:
    """The processes of ``layer`` that serve in ``configuration`` (live ones for a layer the
    configuration does not list, as connection points, or lists as empty)."""
    named = getattr(configuration, _FIELD[layer]) if layer in _FIELD else ()
    if named:
        return list(named)
    return [m.name for m in members(client, _ROLE[layer])]


def scale_layer(
    client: KazooClient, layer: str, names: Sequence[str], *, timeout: float = 60.0
) -> ScaleOutcome:
    """Run the scale protocol of ``layer`` so that ``names`` (registered already) serve."""
    started = time.monotonic()
    try:
        prepared = _prepare(client, layer, list(names), started)
    except SilboError as exc:  # ZooKeeper, or an impossible configuration
        return ScaleOutcome("rejected", _since(started), 0, 0, 0.0, 0, f"not begun: {exc}")
    if isinstance(prepared, ScaleOutcome):
        return prepared
    return _Coordinator(client, *prepared, started=started, deadline=started + timeout).run()


def _prepare(
    client: KazooClient, layer: str, names: list[str], started: float
) -> ScaleOutcome | tuple[VersionedConfiguration, ScalePlan, list[str]]:
    """The plan (with the configuration it starts from and the layer's serving processes),
    or the outcome of a scale that needs none."""
    current = ClusterConfiguration(client).read()
    if current is None:
        return ScaleOutcome("rejected", 0.0, 0, 0, 0.0, 0, "the cluster is not formed")
    old = current.configuration
    before = serving(client, old, layer)
    if layer == "connection-points" and not set(before) - set(names):
        # New connection points serve once registered (every live one does): nothing moves.
        unknown = sorted(set(names) - set(before))
        if unknown:
            return ScaleOutcome(
                "rejected", 0.0, 0, 0, 0.0, old.epoch, f"not registered: {', '.join(unknown)}"
            )
        return ScaleOutcome("completed", _since(started), 0, 0, 0.0, old.epoch)
    if names == before:
        return ScaleOutcome("rejected", 0.0, 0, 0, 0.0, old.epoch, "nothing to change")
    if layer == "connection-points":
        plan = ScalePlan.of(old, old, layer=layer, connection_points=tuple(names))
    elif layer == "matchers":
        plan = ScalePlan.of(old, old.next(names))
    elif layer == "exit-points":
        plan = ScalePlan.of(old, old.next(exit_points=names), layer=layer)
    else:
        plan = ScalePlan.of(old, old.next(access_points=names), layer=layer)
    return current, plan, before


def _since(started: float) -> float:
    return round(time.monotonic() - started, 3)


class _Session:
    """Whether the ZooKeeper session that began the scale (and owns its plan) still lives.

    kazoo reports LOST when the session expires or the client is stopped, then reconnects
    with a new session: from then on this coordinator owns nothing and must write nothing.
    """

    def __init__(self, client: KazooClient) -> None:
        self._client = client
        known = client.client_id
        self._id: int | None = known[0] if known else None
        self._lost = threading.Event()
        client.add_listener(self._listen)

    def close(self) -> None:
        """Stop following the session."""
        self._client.remove_listener(self._listen)

    @property
    def alive(self) -> bool:
        """Not known to be gone (while disconnected it may still live on the server)."""
        if self._lost.is_set():
            return False
        known = self._client.client_id
        if known is not None and self._id is None:
            self._id = known[0]  # it was disconnected when the scale began
        return known is None or known[0] == self._id

    def _listen(self, state: KazooState) -> None:  # kazoo's connection thread: no calls
        if state == KazooState.LOST:
            self._lost.set()


@dataclass
class _Waited:
    """The end of a wait for reports: who reported (by name), who never did before the
    deadline, who died first, and whether the coordinator's session ended first."""

    found: dict[str, dict[str, float]] = field(default_factory=dict)
    late: list[str] = field(default_factory=list)
    dead: list[str] = field(default_factory=list)
    lost: bool = False


class _Coordinator:
    """One scale from publishing its plan to removing it (the module doc has the steps)."""

    def __init__(
        self,
        client: KazooClient,
        current: VersionedConfiguration,
        plan: ScalePlan,
        before: list[str],
        *,
        started: float,
        deadline: float,
    ) -> None:
        self.client = client
        self.current = current
        self.plan = plan
        self.before = before  # the layer's serving processes in the old configuration
        self.started = started
        self.deadline = deadline
        self.session = _Session(client)
        self.switched = False
        self.told_lost = False  # a message already says the session ended
        self.unreachable = ""  # the last ZooKeeper failure while waiting
        self._changed = threading.Event()  # a watched report or membership changed

    def run(self) -> ScaleOutcome:
        """Publish the plan, drive it to its end, remove it; the outcome."""
        try:
            try:
                begin(self.client, self.plan)
            except ScaleInProgress as exc:
                return self._outcome("rejected", str(exc))
            except CoordinationError as exc:  # it may have been published all the same
                return self._outcome("rolled back", self._end(f"could not begin: {exc}"))
            try:
                kind, message, moved, size = self._steps()
            except CoordinationError as exc:  # e.g. unreadable reports
                kind = "completed" if self.switched else "rolled back"
                message, moved, size = str(exc), 0, 0
            held = self._held_ms()
            return self._outcome(kind, self._end(message), moved=moved, size=size, held=held)
        finally:
            self.session.close()

    def _steps(self) -> tuple[str, str, int, int]:
        """Steps 2 to 4: (outcome, message, subscriptions and bytes moved)."""
        plan = self.plan
        if plan.layer == "connection-points":
            leaving = [n for n in self.before if n not in plan.connection_points]
            handed = self._wait("moved", leaving, "connection-point")
            # Stale, the plan is still followed (nothing to switch): they finish without us.
            return "completed", self._after([handed], "moved their sessions"), 0, 0
        matchers = sorted(set(plan.old.matchers) | set(plan.new.matchers))
        ready = self._wait("ready", plan.new.matchers, "matcher", fatal=matchers)
        if ready.lost:
            return "rolled back", self._lost(LOST_BEFORE), 0, 0
        if ready.dead:
            gone = ", ".join(ready.dead)
            return "rolled back", f"matcher {gone} went away before the switch", 0, 0
        if ready.late:
            return "rolled back", f"not ready within the timeout: {ready.late}{self._why()}", 0, 0
        switched, why = self._switch()
        if switched is None:
            return "unknown", why, 0, 0
        if not switched:
            return "rolled back", why, 0, 0
        self.switched = True
        after = [self._wait("done", plan.old.matchers, "matcher")]
        if plan.layer == "exit-points":
            after.append(self._wait("drained", self.before, "exit-point"))
        if plan.layer == "access-points":
            everyone = self._live("connection-point") or set()
            after.append(self._wait("moved", sorted(everyone), "connection-point"))
        moved = int(sum(r.get("moved", 0) for r in ready.found.values()))
        size = int(sum(r.get("bytes", 0) for r in ready.found.values()))
        return "completed", self._after(after, "reported"), moved, size

    def _switch(self) -> tuple[bool | None, str]:
        """Step 3: (True, "") once written; (False, why) if certainly not; (None, why) if
        the answer was lost and the configuration could not be read again in time."""
        if not self.session.alive:
            return False, self._lost(LOST_BEFORE)
        new = self.plan.new
        try:
            switch(self.client, self.current, new, timeout=self._call_timeout())
            return True, ""
        except ScaleOwnerGone:
            return False, self._lost(LOST_BEFORE)
        except ConfigurationConflict as exc:
            return False, f"{exc} (another writer changed it during the scale)"
        except ZooKeeperUnavailable as exc:
            lost = str(exc)
        # The write may or may not have been applied: a read answered after it tells (the
        # session's requests are answered in order, and an expired session wrote nothing).
        until = max(self.deadline, time.monotonic()) + END_GRACE
        while time.monotonic() < until:
            written = self._written(new, until)
            if written is not None:
                return written, "" if written else f"{lost}; the configuration was not written"
            time.sleep(0.1)
        return None, (
            f"{lost}; whether the configuration of epoch {new.epoch} was written is unknown "
            "(ZooKeeper unreachable): read the epoch with silbo admin status"
        )

    def _written(self, new: Configuration, until: float) -> bool | None:
        """Whether ``new`` is the configuration now; None if ZooKeeper does not answer."""
        if not self.client.connected:
            return None
        try:
            with translated("read the cluster configuration"):
                data, _stat = self.client.get_async(CONFIG).get(timeout=self._call_timeout(until))
        except (CoordinationError, NoNodeError):
            return None
        return Configuration.decode(data) == new

    def _wait(
        self, stage: str, names: Sequence[str], role: str, *, fatal: Sequence[str] = ()
    ) -> _Waited:
        """Wait until each of ``names`` reports ``stage``. One that dies is not waited for;
        if one of ``fatal`` (of role ``role``) dies, the wait ends at once."""
        wanted = set(names)
        while True:
            if not self.session.alive:
                return _Waited(lost=True)
            self._changed.clear()  # the reads below watch what they read
            found = self._reports(stage)
            live = self._live(role) if found is not None else None
            if found is not None and live is not None:
                gone = sorted(set(fatal) - live)
                if gone:
                    return _Waited(found, dead=gone)
                missing = wanted - set(found)
                dead = sorted(missing - live)
                if not missing - set(dead):
                    return _Waited(found, dead=dead)
            if time.monotonic() > self.deadline:
                known = found or {}
                return _Waited(known, late=sorted(wanted - set(known)))
            self._changed.wait(min(WATCH_FALLBACK, max(0.0, self.deadline - time.monotonic())))

    def _on_change(self, _event: object) -> None:
        """A kazoo watcher (on the reports and the members read): look again now."""
        self._changed.set()

    def _reports(self, stage: str) -> dict[str, dict[str, float]] | None:
        """The reports of ``stage`` so far; None while ZooKeeper does not answer."""
        if not self.client.connected:
            return None  # a call now would wait for the connection: ask again later
        try:
            return reports(self.client, stage, timeout=self._call_timeout(), watch=self._on_change)
        except ZooKeeperUnavailable as exc:
            self.unreachable = str(exc)
            return None

    def _live(self, role: str) -> set[str] | None:
        """The registered processes of ``role``; None while ZooKeeper does not answer."""
        if not self.client.connected:
            return None
        try:
            with translated(f"list the {role}s"):
                try:
                    children = self.client.get_children_async(
                        f"{MEMBERS}/{role}", watch=self._on_change
                    )
                    return set(children.get(timeout=self._call_timeout()))
                except NoNodeError:
                    return set()
        except ZooKeeperUnavailable as exc:
            self.unreachable = str(exc)
            return None

    def _held_ms(self) -> float:
        """The longest a connection point held publishes back (access-point scales)."""
        if self.plan.layer != "access-points" or not self.client.connected:
            return 0.0
        try:
            moved = reports(self.client, "moved", timeout=self._call_timeout())
        except CoordinationError:
            return 0.0
        return float(max((r.get("held_ms", 0.0) for r in moved.values()), default=0.0))

    def _end(self, message: str) -> str:
        """Remove the plan if this coordinator still owns it; ``message``, with why not if
        it could not (then the participants, or the next scale, take care of it)."""
        if not self.session.alive:
            return message if self.told_lost else _join(message, _STALE)
        until = max(self.deadline, time.monotonic()) + END_GRACE
        while True:
            try:
                finish(self.client, self.plan.id, timeout=self._call_timeout(until))
                return message
            except CoordinationError as exc:
                if not self.session.alive:
                    return _join(message, _STALE)
                if time.monotonic() >= until:
                    return _join(message, f"the plan could not be removed ({exc}); {_LINGERS}")
                time.sleep(0.1)

    def _lost(self, message: str) -> str:
        self.told_lost = True
        return message

    def _after(self, waits: list[_Waited], what: str) -> str:
        """What to tell about the participants the waits after the switch did not hear from."""
        parts = []
        if any(w.lost for w in waits):
            parts.append(self._lost(LOST_AFTER))
        dead = sorted({n for w in waits for n in w.dead})
        if dead:
            parts.append(f"{', '.join(dead)} went away during the scale (not waited for)")
        late = sorted({n for w in waits for n in w.late})
        if late:
            parts.append(f"{', '.join(late)} never {what} (timed out){self._why()}")
        return "; ".join(parts)

    def _call_timeout(self, until: float | None = None) -> float:
        remaining = (until or self.deadline) - time.monotonic()
        return max(0.5, min(CALL_TIMEOUT, remaining))

    def _why(self) -> str:
        return f" (ZooKeeper: {self.unreachable})" if self.unreachable else ""

    def _outcome(
        self, kind: str, message: str, *, moved: int = 0, size: int = 0, held: float = 0.0
    ) -> ScaleOutcome:
        epoch = self.plan.new.epoch if kind == "completed" else self.plan.old.epoch
        return ScaleOutcome(kind, _since(self.started), moved, size, held, epoch, message)


_STALE = (
    "the coordinator's ZooKeeper session ended: the stale plan stays until the next scale "
    "removes it"
)
_LINGERS = "it goes when this client's session ends, or with the next scale"


def _join(*parts: str) -> str:
    return "; ".join(p for p in parts if p)
