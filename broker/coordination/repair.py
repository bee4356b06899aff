"""Repair: a configuration that names a dead member is replaced by one without it.

A member is dead when its znode under ``/members/<role>`` is gone: its ZooKeeper session
ended (kill -9, a hang past the session timeout), it left, or a supervisor that saw its
process exit deleted the znode at once (:func:`declare_dead`). Every broker process runs a
:class:`Repairer`; one at a time is elected (kazoo ``Election`` on ``/repair/election``)
and watches the members and the configuration. When the configuration names a matcher, exit
point or access point that is not a member, it writes the next epoch without it
(:func:`repair_once`, a compare-and-set), adding it to ``failed`` so that whoever waited
for its part stops waiting (docs/failures.md):

- an exit point completes the batches of the epochs it served with the partial results of
  the live matchers, and drops the incomplete batches of a dead access point;
- connection points place again, under the new selector, the subscriptions the dead
  matcher held (they keep each subscription they placed);
- access points route under the new epoch to the live matchers; connection points move to a
  live access point; publishers hash over the live exit points.

Scales and repairs do not interleave: while a scale plan is followed (its coordinator is
alive, or it switched) the repairer waits for it to end. A coordinator whose participant
died rolls back before its switch, or completes without it after (broker.coordination.
scaling), so the wait is bounded by the scale's own timeout. A layer left without any live
member is not repaired (there is nothing to route to): ``failed`` is only written with at
least one matcher left; exit point and access point lists left empty mean "every live one".
"""

from __future__ import annotations

import contextlib
import logging
import threading
from dataclasses import dataclass

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError
from kazoo.recipe.watchers import ChildrenWatch, DataWatch

from broker.coordination.configuration import CONFIG, ClusterConfiguration, Configuration
from broker.coordination.errors import ConfigurationConflict, CoordinationError, translated
from broker.coordination.membership import MEMBERS
from broker.coordination.scale import SCALE, read_state

__all__ = ["ELECTION", "Repair", "Repairer", "declare_dead", "repair_once"]

_log = logging.getLogger(__name__)

ELECTION = "/repair/election"
_ROLES = ("matcher", "exit-point", "access-point")
_ATTEMPTS = 5  # compare-and-set attempts before waiting for the next change


@dataclass(frozen=True, slots=True)
class Repair:
    """What one repair did: the epoch written and the members it removed."""

    epoch: int
    removed: tuple[str, ...]


def repair_once(client: KazooClient) -> Repair | None:
    """Replace a configuration naming dead members with the next epoch without them.

    None when there is nothing to repair, when a scale is being followed (it ends first), or
    when no matcher would be left. ConfigurationConflict when another writer won every
    attempt; ZooKeeper errors as CoordinationError.
    """
    for _ in range(_ATTEMPTS):
        current = ClusterConfiguration(client).read()
        if current is None:
            return None
        configuration = current.configuration
        live = {role: set(_children(client, f"{MEMBERS}/{role}")) for role in _ROLES}
        dead = _dead(configuration, live)
        if not dead:
            return None
        if read_state(client).followed is not None:
            _log.info("members %s are dead; repairing once the scale ends", dead)
            return None
        matchers = [m for m in configuration.matchers if m in live["matcher"]]
        if not matchers:
            _log.error("every matcher of epoch %d is dead: nothing to repair", current.epoch)
            return None
        new = configuration.next(
            matchers if len(matchers) != len(configuration.matchers) else None,
            exit_points=[n for n in configuration.exit_points if n in live["exit-point"]],
            access_points=[n for n in configuration.access_points if n in live["access-point"]],
            failed=dead,
        )
        try:
            ClusterConfiguration(client).replace(current, new)
        except ConfigurationConflict:
            continue
        _log.warning("repaired: epoch %d without the dead %s", new.epoch, ", ".join(dead))
        return Repair(new.epoch, tuple(dead))
    raise ConfigurationConflict(f"the configuration kept changing over {_ATTEMPTS} repairs")


def declare_dead(client: KazooClient, role: str, name: str) -> bool:
    """Delete a member's znode now (its process is known to have exited); False if gone.

    Its session would end only after the session timeout; a repair follows at once instead.
    """
    with translated(f"remove the dead {role} {name}"):
        try:
            client.delete(f"{MEMBERS}/{role}/{name}")
        except NoNodeError:
            return False
    return True


def _dead(configuration: Configuration, live: dict[str, set[str]]) -> list[str]:
    named = (
        [(n, "matcher") for n in configuration.matchers]
        + [(n, "exit-point") for n in configuration.exit_points]
        + [(n, "access-point") for n in configuration.access_points]
    )
    return [name for name, role in named if name not in live[role]]


def _children(client: KazooClient, path: str) -> list[str]:
    with translated(f"list {path}"):
        try:
            found: list[str] = client.get_children(path)
        except NoNodeError:
            return []
    return found


class Repairer:
    """Takes part in the election of the repairer; while elected, repairs on every change.

    ``start`` runs the election in a daemon thread; ``stop`` leaves it. The elected one
    watches ``/members/<role>`` of the three configured layers, ``/config`` and ``/scale``
    (kazoo watches: no polling) and calls :func:`repair_once` after each change.
    """

    def __init__(self, client: KazooClient, identifier: str) -> None:
        self._client = client
        self._identifier = identifier
        self._election = client.Election(ELECTION, identifier)
        self._changed = threading.Event()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self.repairs: list[Repair] = []
        self.leading = False  # elected now

    def leader(self) -> str | None:
        """The identifier of the elected repairer (None if nobody is, or ZooKeeper is away)."""
        try:
            contenders: list[str] = self._election.contenders()
        except Exception:  # any ZooKeeper trouble: nobody known
            return None
        return contenders[0] if contenders else None

    def start(self) -> None:
        """Stand for election (in the background)."""
        self._thread = threading.Thread(target=self._run, name="repairer", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Leave the election; a repair under way finishes first."""
        self._stopped.set()
        self._changed.set()
        with contextlib.suppress(Exception):  # best effort: our session ends with us anyway
            self._election.cancel()

    def _run(self) -> None:
        while not self._stopped.is_set():
            try:
                self._election.run(self._lead)
            except Exception:  # the connection dropped: stand again once it is back
                _log.info("repairer election interrupted; standing again", exc_info=True)
                self._stopped.wait(1.0)

    def _lead(self) -> None:
        _log.info("%s is the repairer", self._identifier)
        self.leading = True
        try:
            self._repair_while_elected()
        finally:
            self.leading = False

    def _repair_while_elected(self) -> None:
        for role in _ROLES:
            self._client.ensure_path(f"{MEMBERS}/{role}")  # a ChildrenWatch needs the znode
        watches: list[object] = [
            ChildrenWatch(self._client, f"{MEMBERS}/{role}", self._poke, allow_session_lost=True)
            for role in _ROLES
        ]
        watches += [DataWatch(self._client, path, self._poke_data) for path in (CONFIG, SCALE)]
        while not self._stopped.is_set():
            self._changed.wait()
            self._changed.clear()
            if self._stopped.is_set():
                break
            try:
                done = repair_once(self._client)
            except CoordinationError as exc:
                _log.warning("repair failed (%s); trying again", exc)
                self._stopped.wait(0.5)
                self._changed.set()
                continue
            if done is not None:
                self.repairs.append(done)
        del watches  # they stop calling back once _stopped is set

    def _poke(self, _children: list[str]) -> bool:
        self._changed.set()
        return not self._stopped.is_set()

    def _poke_data(self, _data: bytes | None, _stat: object) -> bool:
        self._changed.set()
        return not self._stopped.is_set()
