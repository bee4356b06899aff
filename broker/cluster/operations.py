"""Operations on a running cluster that ``silbo admin`` and the autoscaler share.

- :func:`ask_all`: every member's ``Admin.Status`` (its load signals among them), asked in
  parallel, each within a deadline; a member that does not answer in time is left out;
- :func:`scale_to`: a layer to N processes with the scale protocol. For a cluster of
  ``silbo up`` (``local``: its state directory) missing processes are started first and
  leaving ones stopped after; registered idle ones (outside the configuration: started by
  an operator, or pre-warmed) are taken first, in registration order;
- :func:`resize_store_layer`: the context store layer to N stores (its own scale protocol,
  broker.roles.store_scaling), stores started and stopped likewise;
- :func:`idle_members`, :func:`prewarm`, :func:`retire_idle`: processes that run and are
  registered but do not serve yet, as pre-warming makes them.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
from kazoo.client import KazooClient

from broker.cluster.local import (
    ClusterError,
    add_processes,
    read_cluster,
    registered_slots,
    retire_all_but,
    retire_processes,
)
from broker.coordination.configuration import ClusterConfiguration
from broker.coordination.coordinator import ScaleOutcome, scale_layer, serving
from broker.coordination.membership import Member, members
from broker.coordination.repair import repair_once
from broker.coordination.scale import ScaleInProgress
from broker.errors import InvalidInput, SilboError
from broker.roles.store_scaling import (
    StoreScaleOutcome,
    check_store_count,
    registrations,
    scale_stores,
)
from broker.runtime.options import Role
from broker.runtime.token import call_metadata
from broker.store.layout import SCALE, read_store_layout
from broker.wire import internal_pb2 as wire
from broker.wire import internal_pb2_grpc as wire_grpc

__all__ = [
    "ROLES",
    "ask_all",
    "idle_members",
    "prewarm",
    "resize_store_layer",
    "retire_idle",
    "scale_to",
]

REGISTER_TIMEOUT = 30.0  # seconds for started stores to announce their store ids

# the layers the scale protocol resizes (silbo admin scale's names) and their processes' role
ROLES = {
    "matchers": Role.MATCHER,
    "exit-points": Role.EXIT_POINT,
    "access-points": Role.ACCESS_POINT,
    "connection-points": Role.CONNECTION_POINT,
}


def ask_all(found: Sequence[Member], *, timeout: float = 2.0) -> dict[str, wire.ProcessStatus]:
    """Each member's status by name, asked in parallel, each within ``timeout`` seconds."""
    if not found:
        return {}
    with ThreadPoolExecutor(max_workers=min(8, len(found))) as pool:
        answers = list(pool.map(lambda member: _ask(member, timeout), found))
    return {m.name: a for m, a in zip(found, answers, strict=True) if a is not None}


def _ask(member: Member, timeout: float) -> wire.ProcessStatus | None:
    try:
        with grpc.insecure_channel(member.address) as channel:
            stub = wire_grpc.AdminStub(channel)  # type: ignore[no-untyped-call]
            status: wire.ProcessStatus = stub.Status(
                wire.StatusRequest(), timeout=timeout, metadata=call_metadata()
            )
            return status
    except grpc.RpcError:
        return None


def scale_to(
    client: KazooClient, local: Path | None, layer: str, count: int, *, timeout: float = 60.0
) -> tuple[ScaleOutcome, int]:
    """Scale ``layer`` (one of :data:`ROLES`) to ``count`` processes; the outcome and the
    size before. InvalidInput when it cannot begin (too few processes running for a cluster
    that is not ``silbo up``'s, no configuration, a count below 1)."""
    role = ROLES[layer]
    if count < 1:
        raise InvalidInput(f"a cluster needs at least one {role.value}")
    repair_once(client)  # a dead member is removed first: survivors are kept
    current = ClusterConfiguration(client).read()
    if current is None:
        raise InvalidInput("the cluster is not formed")
    slots = {} if local is None else registered_slots(local, client, role)
    old = serving(client, current.configuration, layer)
    if role is Role.CONNECTION_POINT and slots:
        # Every live one serves; a scale in keeps the first slots (the addresses clients were
        # given first), whatever order they registered in (a restarted one is last).
        old.sort(key=lambda name: slots.get(name, 1 << 30))
    leaving: list[str] = []
    if count > len(old):
        idle = [m.name for m in members(client, role.value) if m.name not in old]
        missing = count - len(old) - len(idle)
        if missing > 0 and local is None:
            raise InvalidInput(
                f"{missing} more {layer} must be running first (start them with silbo run "
                f"{role.value})"
            )
        if missing > 0 and local is not None:
            idle += [m.name for m in add_processes(local, role, missing)]
        new = old + idle[: count - len(old)]
    else:
        new, leaving = old[:count], old[count:]
    outcome = scale_layer(client, layer, new, timeout=timeout)
    if outcome.outcome == "completed" and local is not None:
        if role is Role.CONNECTION_POINT and count <= len(old):
            # and a dead one restarting (no scale saw it)
            kept = [m for m in members(client, role.value) if m.name in new]
            retire_all_but(local, role, kept)
        elif leaving:
            retire_processes(local, leaving)
    return outcome, len(old)


def idle_members(client: KazooClient, layer: str, local: Path | None = None) -> list[str]:
    """Registered processes of ``layer`` outside the configuration, by registration order
    (with ``local``: only those of that ``silbo up`` cluster). A layer the configuration does
    not name (connection points) has none: every live one serves."""
    current = ClusterConfiguration(client).read()
    if current is None:
        return []
    now = set(serving(client, current.configuration, layer))
    ours = None
    if local is not None:
        description = read_cluster(local) or {}
        ours = {p.get("name") for p in description.get("processes") or []}
    return [
        m.name
        for m in members(client, ROLES[layer].value)
        if m.name not in now and (ours is None or m.name in ours)
    ]


def prewarm(client: KazooClient, local: Path, layer: str, count: int) -> list[str]:
    """Have ``count`` idle processes of ``layer`` running (started here as needed, registered
    on return): the ones started, by member name."""
    missing = count - len(idle_members(client, layer, local))
    if missing <= 0:
        return []
    return [m.name for m in add_processes(local, ROLES[layer], missing)]


def retire_idle(client: KazooClient, local: Path, layer: str, count: int) -> list[str]:
    """Stop up to ``count`` idle processes of ``layer`` of the ``silbo up`` cluster, the last
    registered first: the ones stopped."""
    leaving = idle_members(client, layer, local)[::-1][:count]
    if leaving:
        retire_processes(local, leaving)
    return leaving


def resize_store_layer(
    client: KazooClient, local: Path | None, count: int, timeout: float
) -> tuple[StoreScaleOutcome, int]:
    """Scale the store layer to ``count`` stores, the processes of a ``silbo up`` cluster
    (``local``: its state directory; None: an external one) started and stopped as the
    module doc says; the outcome and the store count before. A SilboError if refused
    (nothing changed, the stores it started stopped again). ``silbo bench store-scale``
    scales through this too."""
    started: list[str] = []  # member names of the stores this call started
    try:
        layout = check_store_count(read_store_layout(client), count)
        if client.exists(SCALE):
            raise ScaleInProgress("a scale of the context store layer is running")
        old = list(layout.previous or layout.stores)
        new, leaving = old[:count], old[count:]
        if count > len(old):
            new += _added(client, local, old, count - len(old), started)
        outcome = scale_stores(client, new, timeout=timeout)
        if local is not None:
            members = {s: r.member for s, r in registrations(client).items()}
            if outcome.outcome == "completed":
                retire_processes(local, [members[s] for s in leaving if s in members])
            elif started:
                retire_processes(local, started)
    except SilboError:
        if local is not None and started:
            retire_processes(local, started)
        raise
    return outcome, len(old)


def _added(
    client: KazooClient, local: Path | None, old: list[str], count: int, started: list[str]
) -> list[str]:
    """``count`` store ids to add: idle registered stores first, then stores started here
    (their member names go to ``started``)."""
    idle = sorted(s for s in registrations(client) if s not in old)
    missing = count - len(idle)
    if missing <= 0:
        return idle[:count]
    if local is None:
        raise ClusterError(
            f"{missing} more context stores must be running first (start them with "
            "silbo run context-store --store-id ID)"
        )
    members = [m.name for m in add_processes(local, Role.CONTEXT_STORE, missing)]
    started.extend(members)
    deadline = time.monotonic() + REGISTER_TIMEOUT
    while True:
        ids = {r.member: s for s, r in registrations(client).items()}
        if all(m in ids for m in members):
            return idle + sorted(ids[m] for m in members)
        if time.monotonic() > deadline:
            raise ClusterError("the started context stores did not announce their store ids")
        time.sleep(0.05)
