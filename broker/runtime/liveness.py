"""Liveness probes: who stopped answering ``Admin.Status``, and for how long.

A process that hangs (SIGSTOP, a deadlock, a loop that never yields) keeps its ZooKeeper
znode until its session times out (10 s), and until then its layer waits on it. A
:class:`Prober` does not wait for the session: every ``PROBE_INTERVAL`` seconds it asks each
of its targets for ``Admin.Status`` (deadline ``PROBE_DEADLINE``, the cluster token
attached, the calls of a round in flight together so that one hung target delays no look at
the others), and calls ``on_silent`` for a target that has not answered for ``hang_after``
seconds (until it returns True, or the target answers again). A target that never answered
yet (it may still be starting its services) is given ``STARTING_GRACE`` seconds from when it
was first seen. ``Admin.Status`` is answered from the target's event loop, so a loop blocked
that long counts as a hang: none of ours blocks that long.

Two probers use it: the supervisor of ``silbo up`` kills a silent child (broker.cluster.
liveness), and the elected repairer of any cluster declares a silent member dead (its znode
deleted: it is repaired out, and fenced when it wakes; :class:`PeerWatch`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

import grpc
from kazoo.client import KazooClient

from broker.coordination.membership import Member, members
from broker.coordination.repair import declare_dead, repair_once
from broker.errors import SilboError
from broker.runtime.options import PEER_HANG_AFTER
from broker.runtime.token import call_metadata
from broker.wire import internal_pb2 as wire
from broker.wire import internal_pb2_grpc as wire_grpc

__all__ = [
    "HANG_AFTER",
    "PEER_HANG_AFTER",
    "PROBE_DEADLINE",
    "PROBE_INTERVAL",
    "PeerWatch",
    "Prober",
    "Target",
]

_log = logging.getLogger(__name__)

PROBE_INTERVAL = 0.2  # seconds between two rounds of probes
PROBE_DEADLINE = 0.6  # seconds one probe may take
HANG_AFTER = 1.25  # seconds without an answer before the supervisor kills a child
STARTING_GRACE = 30.0  # seconds a target that never answered is given to start serving
LEADER_LOOK = 1.0  # seconds between two reads of who the elected repairer is
MIN_FAILED = 2  # unanswered probes in a row before a target counts as silent
STARVED = 0.5  # seconds between two rounds past which the prober was starved: clocks restart
CLOSE_WAIT = 1.5  # seconds a close waits for the round under way


@dataclass(frozen=True, slots=True)
class Target:
    """One process to probe: ``key`` tells two incarnations apart (pid and start time, or
    the member's name)."""

    key: Hashable
    role: str
    name: str
    address: str


@dataclass
class _Probed:
    target: Target
    answered: float  # monotonic time of the last answer (or of the first look)
    ever: bool = False  # has it answered once?
    reported: bool = False  # on_silent called since the last answer
    failed: int = 0  # probes unanswered since the last answer
    channel: grpc.Channel | None = None


class Prober:
    """Probes ``targets()`` every round; ``on_silent(target, silent_s)`` for a silent one
    (True once it was dealt with; False to be called again next round). With
    ``one_at_a_time``, a round that finds several silent targets acts on none (a single
    failure at a time is what a probe can tell from its own isolation)."""

    def __init__(
        self,
        targets: Callable[[], list[Target]],
        on_silent: Callable[[Target, float], bool],
        *,
        hang_after: float,
        name: str = "liveness",
        one_at_a_time: bool = False,
        interval: float = PROBE_INTERVAL,
    ) -> None:
        self._targets = targets
        self._interval = interval
        self._on_silent = on_silent
        self._hang_after = hang_after
        self._one_at_a_time = one_at_a_time
        self._last_round = 0.0
        self._probed: dict[Hashable, _Probed] = {}
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop probing (at the end of the round under way, given CLOSE_WAIT seconds: a round
        can wait on ZooKeeper, cut off from a stopping process)."""
        self._closed.set()
        self._thread.join(timeout=CLOSE_WAIT)
        self._forget(set(self._probed))

    def _run(self) -> None:
        while not self._closed.wait(self._interval):
            try:
                self.probe_once()
            except Exception:  # the probe must outlive any one bad round
                _log.exception("a liveness probe round failed; trying again")

    def probe_once(self) -> None:
        """One round: ask every target, report the ones silent past ``hang_after``.

        Silence is counted only while the prober itself runs: after a wait between rounds
        longer than ``STARVED`` (or half of ``hang_after``; this process was starved, stopped
        or swapped out) every clock starts again, and a target is silent only after
        ``MIN_FAILED`` probes in a row went unanswered.
        """
        now = time.monotonic()
        if self._last_round and now - self._last_round > max(STARVED, self._hang_after / 2):
            for late in self._probed.values():
                late.answered, late.failed = now, 0
        targets = {t.key: t for t in self._targets()}
        self._forget(set(self._probed) - set(targets))  # gone, or replaced
        calls: list[tuple[_Probed, Any]] = []
        for key, target in targets.items():
            probed = self._probed.get(key)
            if probed is None or probed.target.address != target.address:
                self._forget({key})
                probed = self._probed[key] = _Probed(target, now)
            if probed.channel is None:
                probed.channel = grpc.insecure_channel(target.address)
            stub = wire_grpc.AdminStub(probed.channel)  # type: ignore[no-untyped-call]
            call = stub.Status.future(
                wire.StatusRequest(), timeout=PROBE_DEADLINE, metadata=call_metadata()
            )
            calls.append((probed, call))
        for probed, call in calls:
            try:
                call.result()
            except (grpc.RpcError, grpc.FutureTimeoutError):
                probed.failed += 1
                continue
            probed.answered = time.monotonic()
            probed.ever, probed.reported, probed.failed = True, False, 0
        now = time.monotonic()
        silent = [
            (probed, now - probed.answered)
            for probed, _call in calls
            if not probed.reported
            and probed.failed >= MIN_FAILED
            and now - probed.answered >= (self._hang_after if probed.ever else STARTING_GRACE)
        ]
        if len(silent) > 1 and self._one_at_a_time:
            # Two processes hung at the same moment are less likely than this prober cut off
            # from them (its own host or network): declare neither; their sessions tell.
            _log.warning(
                "%d processes look silent at once (%s): not acting on it",
                len(silent),
                ", ".join(p.target.name for p, _s in silent),
            )
            self._last_round = time.monotonic()
            return
        for probed, silence in silent:
            probed.reported = self._on_silent(probed.target, silence)
        self._last_round = time.monotonic()

    def _forget(self, keys: set[Hashable]) -> None:
        for key in keys:
            gone = self._probed.pop(key, None)
            if gone is not None and gone.channel is not None:
                gone.channel.close()


class PeerWatch:
    """The cluster watching itself for hangs (it works without a supervisor: ``silbo run``
    under any process manager; with one, the supervisor acts first).

    The elected repairer (``leader()`` is this process) probes every other member and
    declares dead the ones silent past ``hang_after`` seconds: their znodes are deleted, the
    repair writes the epoch without them, and a hung one that wakes finds itself fenced and
    exits. Several members silent at once are not declared (see :class:`Prober`): the
    repairer's own process cut off or starved looks like that. Every other process probes
    the elected repairer, so that a hung repairer is not left to its session timeout: the
    first to find it silent declares it dead and repairs the configuration itself (a
    compare-and-set: several doing it at once is safe); the election goes to another process
    once the hung one's session ends.
    """

    def __init__(
        self,
        client: KazooClient,
        own_name: str,
        leader: Callable[[], str | None],
        *,
        hang_after: float = PEER_HANG_AFTER,
    ) -> None:
        self._client = client
        self._own_name = own_name
        self._leader = leader
        self._known_leader: str | None = None
        self._looked = 0.0
        # the members as last read: a new one is probed (and a gone one no longer) within
        # LEADER_LOOK; read every round, an idle cluster's processes made ~360 reads a second
        self._members: list[Member] = []
        self._listed = 0.0
        self._prober = Prober(
            self._targets,
            self._silent,
            hang_after=hang_after,
            name="peer-liveness",
            one_at_a_time=True,
            # a tenth of the silence that counts (0.5 s for the default 5 s): every process
            # probes the repairer, and the repairer every process, each round
            interval=max(PROBE_INTERVAL, hang_after / 10),
        )

    def close(self) -> None:
        """Stop probing."""
        self._prober.close()

    def _current_leader(self) -> str | None:
        now = time.monotonic()
        if now - self._looked >= LEADER_LOOK:  # a ZooKeeper read: not every round
            self._known_leader, self._looked = self._leader(), now
        return self._known_leader

    def _targets(self) -> list[Target]:
        leader = self._current_leader()
        if leader is None:
            return []
        now = time.monotonic()
        if now - self._listed >= LEADER_LOOK:  # ZooKeeper reads (one per member): not every round
            try:
                self._members, self._listed = members(self._client), now
            except SilboError:
                return []  # ZooKeeper away: no member can be declared dead anyway
        found = self._members
        if leader == self._own_name:
            chosen = [m for m in found if m.name != self._own_name]
        else:
            chosen = [m for m in found if m.name == leader]
        return [Target(m.name, m.role, m.name, m.address) for m in chosen]

    def _silent(self, target: Target, silent: float) -> bool:
        leader = self._current_leader()
        if leader is None or (leader != self._own_name and target.name != leader):
            return False
        _log.warning(
            "%s %s did not answer for %.1f s: declaring it dead", target.role, target.name, silent
        )
        try:
            declare_dead(self._client, target.role, target.name)
            if target.name == leader:  # the repairer itself: nobody else would repair now
                repair_once(self._client)
        except SilboError as exc:
            _log.warning("declaring %s dead failed (%s); trying again", target.name, exc)
            return False
        return True
