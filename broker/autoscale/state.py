"""What automatic scaling keeps in ZooKeeper, under the cluster's chroot::

    /autoscale/enabled      "on" | "off" (missing: on; silbo admin autoscale on|off)
    /autoscale/policy       JSON of Policy.settings() (missing: the defaults)
    /autoscale/leader       kazoo's election recipe: one ephemeral znode per controller
                            process, the first one leads, the others stand by
    /autoscale/decisions/d-<sequence>
                            one persistent znode per decision, the last KEEP kept; JSON:
        {"t": 1764204000.5, "layer": "access-points", "from": 1, "to": 2,
         "kind": "scale-out", "reason": "access-points: input 100/s ...",
         "leader": "host:4242", "outcome": null, "finished": null}

A decision is written with ``"outcome": null`` *before* it is carried out, and its outcome
(and the time, ``finished``) after: a decision whose outcome is null after its leader died
was in flight, and the next leader carries it out again (broker.autoscale.controller).
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Iterable
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from broker.autoscale.model import Decision
from broker.autoscale.policy import Policy
from broker.coordination.errors import translated
from broker.errors import InvalidInput

__all__ = ["DECISIONS", "ENABLED", "KEEP", "LEADER", "POLICY", "AutoscaleState"]

_log = logging.getLogger(__name__)

ROOT = "/autoscale"
ENABLED = f"{ROOT}/enabled"
POLICY = f"{ROOT}/policy"
LEADER = f"{ROOT}/leader"
DECISIONS = f"{ROOT}/decisions"
KEEP = 200  # decisions kept, the latest


class AutoscaleState:
    """Reads and writes ``/autoscale`` (module docstring); ZooKeeper failures are raised as
    coordination errors (a SilboError)."""

    def __init__(self, client: KazooClient) -> None:
        self._client = client

    def enabled(self) -> bool:
        """Whether the controller may act (missing: yes)."""
        with translated("read whether autoscaling is on"):
            try:
                data, _stat = self._client.get(ENABLED)
            except NoNodeError:
                return True
        return bool(data.strip() != b"off")

    def set_enabled(self, on: bool) -> None:
        """Turn automatic scaling on or off."""
        value = b"on" if on else b"off"
        with translated("turn autoscaling on or off"):
            try:
                self._client.set(ENABLED, value)
            except NoNodeError:
                self._client.create(ENABLED, value, makepath=True)

    def policy(self) -> Policy:
        """The policy kept (the defaults if none is, or if what is kept cannot be read)."""
        with translated("read the autoscaling policy"):
            try:
                data, _stat = self._client.get(POLICY)
            except NoNodeError:
                return Policy()
        try:
            return _policy_of(data)
        except (ValueError, TypeError, AttributeError, InvalidInput) as exc:
            _log.warning("unreadable %s (%s): using the default policy", POLICY, exc)
            return Policy()

    def update_policy(self, assignments: Iterable[str]) -> Policy:
        """Apply ``KEY=VALUE`` settings to the kept policy (compare-and-set); the result.
        InvalidInput (every problem named) leaves it as it was."""
        assignments = list(assignments)
        while True:
            with translated("update the autoscaling policy"):
                try:
                    data, stat = self._client.get(POLICY)
                    version = stat.version
                except NoNodeError:
                    data, version = b"", -1
            try:
                current = _policy_of(data) if data else Policy()
            except (ValueError, TypeError, AttributeError, InvalidInput):
                current = Policy()
            policy = current.updated(assignments)
            encoded = json.dumps(policy.settings(), sort_keys=True).encode()
            with translated("update the autoscaling policy"):
                try:
                    if version < 0:
                        self._client.create(POLICY, encoded, makepath=True)
                    else:
                        self._client.set(POLICY, encoded, version=version)
                    return policy
                except (BadVersionError, NodeExistsError):
                    continue  # someone else changed it meanwhile: apply ours to theirs

    def contenders(self) -> list[str]:
        """The controller processes, the leader first (their identifiers)."""
        with translated("read the autoscaling controllers"):
            if self._client.exists(LEADER) is None:  # contenders() would create it
                return []
            return list(self._client.Election(LEADER).contenders())

    def record(self, decision: Decision, leader: str) -> str:
        """Write a decision, in flight (no outcome yet); its znode path. The oldest beyond
        KEEP are deleted."""
        entry = decision.to_dict() | {
            "t": time.time(),
            "leader": leader,
            "outcome": None,
            "finished": None,
        }
        with translated("record an autoscaling decision"):
            path: str = self._client.create(
                f"{DECISIONS}/d-", json.dumps(entry).encode(), sequence=True, makepath=True
            )
            names = sorted(self._client.get_children(DECISIONS))
            for name in names[: max(0, len(names) - KEEP)]:
                with contextlib.suppress(NoNodeError):
                    self._client.delete(f"{DECISIONS}/{name}")
        return path

    def finish(self, path: str, outcome: str) -> None:
        """Write the outcome of the decision at ``path``."""
        with translated("record the outcome of an autoscaling decision"):
            try:
                data, stat = self._client.get(path)
            except NoNodeError:
                return  # trimmed away meanwhile
            entry = json.loads(data) | {"outcome": outcome, "finished": time.time()}
            self._client.set(path, json.dumps(entry).encode(), version=stat.version)

    def decisions(self, last: int = KEEP) -> list[dict[str, Any]]:
        """The last ``last`` decisions, oldest first, each with its znode's ``id``."""
        found = []
        with translated("read the autoscaling decisions"):
            try:
                names = sorted(self._client.get_children(DECISIONS))
            except NoNodeError:
                return []
            for name in names[-last:] if last > 0 else []:
                try:
                    data, _stat = self._client.get(f"{DECISIONS}/{name}")
                except NoNodeError:
                    continue
                try:
                    entry = json.loads(data)
                except ValueError:
                    continue
                if isinstance(entry, dict):
                    found.append({"id": f"{DECISIONS}/{name}", **entry})
        return found

    def in_flight(self) -> list[dict[str, Any]]:
        """The decisions recorded and not finished (their leader died meanwhile)."""
        return [d for d in self.decisions() if d.get("outcome") is None]


def _policy_of(data: bytes) -> Policy:
    settings = json.loads(data)
    return Policy().updated(f"{key}={value}" for key, value in dict(settings).items())
