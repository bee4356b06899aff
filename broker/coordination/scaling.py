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
   (compare-and-set): the access points switch, sending a switch marker in-band first, and
   release what they held; updates were never held back (no matching pause);
4. when every old matcher reports *done* (each access point's switch marker arrived, what
   moved away is dropped), and in an exit-point scale every old exit point *drained* (it
   delivered every batch of the old epoch), and in an access-point scale every connection
   point *moved* to an access point of the new configuration, remove the plan: *completed*.

A connection-point scale does not change the configuration: the leaving connection points
hand their sessions and publishers over to the staying ones and report *moved*.

If the new matchers are not all ready within ``timeout``, or a matcher of either
configuration dies before the switch, the plan is removed without touching the
configuration: *rolled back*; the participants undo what they did (received parts are
dropped, held subscriptions released to the old owners).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from kazoo.client import KazooClient

from broker.coordination.configuration import ClusterConfiguration, Configuration
from broker.coordination.errors import CoordinationError
from broker.coordination.membership import members
from broker.coordination.scale import ScaleInProgress, ScalePlan, begin, finish, reports

__all__ = ["LAYERS", "ScaleOutcome", "scale_layer", "scale_matchers", "serving"]


@dataclass
class ScaleOutcome:
    """What a scale command reports (``--json`` gives these keys)."""

    outcome: str  # completed | rolled back | rejected
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
    deadline = started + timeout
    store = ClusterConfiguration(client)
    current = store.read()
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
        return ScaleOutcome("completed", round(time.monotonic() - started, 3), 0, 0, 0.0, old.epoch)
    if list(names) == before:
        return ScaleOutcome("rejected", 0.0, 0, 0, 0.0, old.epoch, "nothing to change")
    if layer == "connection-points":
        new = old
        plan = ScalePlan.of(old, old, layer=layer, connection_points=tuple(names))
    elif layer == "matchers":
        new = old.next(list(names))
        plan = ScalePlan.of(old, new)
    elif layer == "exit-points":
        new = old.next(exit_points=list(names))
        plan = ScalePlan.of(old, new, layer=layer)
    else:
        new = old.next(access_points=list(names))
        plan = ScalePlan.of(old, new, layer=layer)
    try:
        begin(client, plan)
    except ScaleInProgress as exc:
        return ScaleOutcome("rejected", 0.0, 0, 0, 0.0, old.epoch, str(exc))

    def outcome(kind: str, message: str = "", *, moved: int = 0, size: int = 0) -> ScaleOutcome:
        epoch = new.epoch if kind == "completed" else old.epoch
        held = max((r.get("held_ms", 0.0) for r in reports(client, "moved").values()), default=0)
        return ScaleOutcome(
            kind, round(time.monotonic() - started, 3), moved, size, held, epoch, message
        )

    try:
        if layer == "connection-points":
            leaving = [n for n in before if n not in names]
            late = _wait_for(client, "moved", leaving, deadline, _ROLE[layer])
            return outcome("completed", _late(late, "moved their sessions"))
        ready = _wait_for(client, "ready", new.matchers, deadline, "matcher", dead_fail=True)
        if isinstance(ready, str):
            return outcome("rolled back", ready)
        store.replace(current, new)
        late = _wait_for(client, "done", old.matchers, deadline, "matcher")
        if layer == "exit-points":
            late += _wait_for(client, "drained", before, deadline, _ROLE[layer])
        if layer == "access-points":
            everyone = [m.name for m in members(client, "connection-point")]
            late += _wait_for(client, "moved", everyone, deadline, "connection-point")
        moved = int(sum(r.get("moved", 0) for r in ready.values()))
        size = int(sum(r.get("bytes", 0) for r in ready.values()))
        return outcome("completed", _late(late, "reported"), moved=moved, size=size)
    except CoordinationError as exc:
        return outcome("rolled back", str(exc))
    finally:
        finish(client)


def _late(late: list[str], what: str) -> str:
    return f"{', '.join(sorted(late))} never {what} (timed out)" if late else ""


def _wait_for(
    client: KazooClient,
    stage: str,
    names: Sequence[str],
    deadline: float,
    role: str,
    *,
    dead_fail: bool = False,
) -> Any:
    """Wait for every one of ``names`` to report ``stage``.

    A participant whose member znode disappears (it died) is not waited for: with
    ``dead_fail`` that fails the wait (a message string is returned), otherwise it is
    skipped. Returns the reports by name (``dead_fail``) or the names that never reported
    before ``deadline``.
    """
    wanted = set(names)
    while True:
        found = reports(client, stage)
        missing = wanted - set(found)
        if missing:
            live = {m.name for m in members(client, role)}
            dead = missing - live
            if dead and dead_fail:
                return f"{role} {', '.join(sorted(dead))} went away during the scale"
            missing -= dead
        if not missing:
            return found if dead_fail else []
        if time.monotonic() > deadline:
            if dead_fail:
                return f"not ready within the timeout: {sorted(missing)}"
            return sorted(missing)
        time.sleep(0.02)
