"""Forming a cluster: wait for its processes to register, then write its first configuration.

A cluster exists once ``/config`` does. ``silbo up`` forms its cluster this way, and so does
``silbo admin init`` for processes started one by one (compose/). Later changes to the matcher
set go through the scale protocol, never through here.
"""

from __future__ import annotations

import time

from kazoo.client import KazooClient

from broker.coordination.configuration import (
    DEFAULT_REPLICAS,
    ClusterConfiguration,
    Configuration,
)
from broker.coordination.errors import ConfigurationConflict, CoordinationError
from broker.coordination.membership import Member, members
from broker.errors import InvalidInput

__all__ = ["AlreadyFormed", "FormationTimeout", "form", "wait_for_members"]


class FormationTimeout(CoordinationError):
    """The processes a cluster needs did not all register in time."""


class AlreadyFormed(CoordinationError):
    """The cluster already has a configuration, with other matchers than asked for."""


def wait_for_members(
    client: KazooClient, counts: dict[str, int], *, timeout: float
) -> dict[str, list[Member]]:
    """Wait until each role has at least its count of members; the first ones of each role."""
    deadline = time.monotonic() + timeout
    while True:
        found = {role: members(client, role) for role in counts}
        if all(len(found[role]) >= n for role, n in counts.items()):
            return {role: found[role][: counts[role]] for role in counts}
        if time.monotonic() >= deadline:
            missing = ", ".join(
                f"{role} {len(found[role])}/{n}"
                for role, n in counts.items()
                if len(found[role]) < n
            )
            raise FormationTimeout(
                f"not every process registered within {timeout:.0f} s: {missing}"
            )
        time.sleep(0.1)


def form(
    client: KazooClient, matchers: int, *, timeout: float, replicas: int = DEFAULT_REPLICAS
) -> Configuration:
    """The cluster's configuration at epoch 1 over its first ``matchers`` matchers, and the
    exit points and access points registered by then (at least one of each).

    Waits for them to register; exit points and access points that register later serve
    once a scale of their layer takes them in. If the cluster was already formed with that
    many matchers, returns its configuration (forming is idempotent); otherwise
    AlreadyFormed.
    """
    if matchers < 1:
        raise InvalidInput(f"a cluster needs at least one matcher, not {matchers}")
    store = ClusterConfiguration(client)
    existing = store.read()
    if existing is None:
        wait_for_members(
            client, {"matcher": matchers, "exit-point": 1, "access-point": 1}, timeout=timeout
        )
        found = {role: members(client, role) for role in ("matcher", "exit-point", "access-point")}
        first = Configuration.of(
            1,
            [m.name for m in found["matcher"][:matchers]],
            exit_points=[m.name for m in found["exit-point"]],
            access_points=[m.name for m in found["access-point"]],
            replicas=replicas,
        )
        try:
            return store.create(first).configuration
        except ConfigurationConflict:
            existing = store.read()
    assert existing is not None
    if len(existing.configuration.matchers) != matchers:
        raise AlreadyFormed(
            f"the cluster is already formed with {len(existing.configuration.matchers)} "
            f"matchers (epoch {existing.epoch}); change it with the scale command"
        )
    return existing.configuration
