"""The coordinator of a matcher scale: from the current configuration to one over new matchers.

    outcome = scale_matchers(client, ["m1", "m2", "m3"], timeout=60)

Steps (docs/protocol.md has the whole protocol, per participant):

1. publish the plan (``/scale``: old and new configuration, epoch + 1); one scale at a
   time, a second is *rejected*;
2. the access points send a start marker in-band to every old matcher and hold new
   (un)subscriptions; each old matcher, once it has every access point's marker, sends what
   moves to its new owners; each new owner reports *ready* when it has every part;
3. when every matcher of the new configuration is ready, write the new configuration
   (compare-and-set): the access points switch, sending a switch marker in-band first, and
   release what they held; updates were never held back (no matching pause);
4. when every old matcher reports *done* (each access point's switch marker arrived, what
   moved away is dropped), remove the plan: *completed*.

If the new matchers are not all ready within ``timeout`` (one died, a part was lost), the
plan is removed without touching the configuration: *rolled back*; the participants undo
what they did (received parts are dropped, held subscriptions released to the old owners).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from kazoo.client import KazooClient

from broker.coordination.configuration import ClusterConfiguration
from broker.coordination.errors import CoordinationError
from broker.coordination.scale import ScaleInProgress, ScalePlan, begin, finish, reports

__all__ = ["ScaleOutcome", "scale_matchers"]


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


def scale_matchers(
    client: KazooClient, matchers: Sequence[str], *, timeout: float = 60.0
) -> ScaleOutcome:
    """Run the scale protocol to a configuration over ``matchers`` (registered already)."""
    started = time.monotonic()
    store = ClusterConfiguration(client)
    current = store.read()
    if current is None:
        return ScaleOutcome("rejected", 0.0, 0, 0, 0.0, 0, "the cluster is not formed")
    old = current.configuration
    if list(matchers) == list(old.matchers):
        return ScaleOutcome("rejected", 0.0, 0, 0, 0.0, old.epoch, "nothing to change")
    new = old.next(list(matchers))
    plan = ScalePlan.of(old, new)
    try:
        begin(client, plan)
    except ScaleInProgress as exc:
        return ScaleOutcome("rejected", 0.0, 0, 0, 0.0, old.epoch, str(exc))
    try:
        ready = _wait_for(client, "ready", set(new.matchers), started + timeout)
        if ready is None:
            missing = set(new.matchers) - set(reports(client, "ready"))
            return ScaleOutcome(
                "rolled back",
                round(time.monotonic() - started, 3),
                0,
                0,
                0.0,
                old.epoch,
                f"not ready within {timeout:g} s: {sorted(missing)}",
            )
        store.replace(current, new)
        done = _wait_for(client, "done", set(old.matchers), started + timeout)
        message = "" if done is not None else "the old matchers did not all report done"
        return ScaleOutcome(
            "completed",
            round(time.monotonic() - started, 3),
            int(sum(r.get("moved", 0) for r in ready.values())),
            int(sum(r.get("bytes", 0) for r in ready.values())),
            0.0,  # access points never hold updates back in this protocol
            new.epoch,
            message,
        )
    except CoordinationError as exc:
        return ScaleOutcome(
            "rolled back", round(time.monotonic() - started, 3), 0, 0, 0.0, old.epoch, str(exc)
        )
    finally:
        finish(client)


def _wait_for(
    client: KazooClient, stage: str, names: set[str], deadline: float
) -> dict[str, dict[str, float]] | None:
    while True:
        found = reports(client, stage)
        if names <= set(found):
            return found
        if time.monotonic() > deadline:
            return None
        time.sleep(0.02)
