"""The supervisor of ``silbo up``: a dead process is restarted and its layer made whole again.

Every ``CHECK_INTERVAL`` seconds :meth:`Supervisor.check` looks at each process cluster.json
names (the ones ``silbo up`` started and the ones ``silbo admin scale`` added), and a
watchdog thread at the embedded ZooKeeper:

1. **a process is gone** (exited, killed, or fenced: exit status 75): its member znode is
   deleted at once (:func:`broker.coordination.repair.declare_dead`; a connection point's
   HTTP front entry and subscription claims too, so the other fronts adopt them now:
   :func:`broker.coordination.http_subscriptions.release_dead_front`) and the configuration
   repaired from here (:func:`~broker.coordination.repair.repair_once`: in milliseconds,
   not after a session timeout, even when the dead process was the elected repairer), and
   a new process
   is started in its slot (same role, number, port and log) after a backoff: 0.5 s, doubled
   for each restart of a slot whose process ran less than ``STABLE`` (10) seconds (a crash
   loop), at most 30 s;
2. **the replacement registered**: cluster.json gets its name and address; if its layer is
   one the configuration names (matchers, exit points, access points) and serves fewer
   processes than the layer's size (STATE_DIR/layout.json: the size ``up`` or the last
   ``admin scale`` gave it), a scale takes it in (for matchers the snapshot protocol moves
   its share of the subscriptions to it). Scales run one at a time in a thread; one that
   does not complete is tried again at the next check;
3. **a process hangs** (stopped for ``hang_after`` seconds, 1.25 by default, or its event
   loop silent 8 times as long: broker.cluster.liveness): it is killed, and so replaced as
   in 1;
4. **an autoscaling controller exited** (``silbo up --autoscale``): it is started again with
   the same log, unless it ran less than ``STABLE`` seconds (a crash loop: tried again once
   that time has passed); meanwhile the standby leads;
5. **the embedded ZooKeeper is gone**: it is started again on the same port and data
   directory; clients reconnect, and sessions still within their timeout go on. The
   watchdog is a thread of its own: the checks above wait on ZooKeeper when it is away, and
   must not be what keeps it away.

Every event is one line on ``out`` (stderr of ``silbo up``) and a count in cluster.json
(``restarts`` per process) that ``silbo admin status`` shows.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from dataclasses import dataclass
from typing import IO, Any

from kazoo.client import KazooClient

from broker.cluster.durable import read_layout
from broker.cluster.liveness import HANG_AFTER, Liveness
from broker.cluster.local import (
    LocalCluster,
    _same_process,
    _start_time,
    read_cluster,
    update_description,
)
from broker.coordination.client import CLOSE_WITHIN, close, connect
from broker.coordination.configuration import ClusterConfiguration
from broker.coordination.coordinator import scale_layer, serving
from broker.coordination.http_subscriptions import release_dead_front
from broker.coordination.membership import members
from broker.coordination.repair import declare_dead, repair_once
from broker.errors import SilboError
from broker.runtime.options import Role

__all__ = ["CHECK_INTERVAL", "Supervisor"]

_log = logging.getLogger(__name__)

CHECK_INTERVAL = 0.2  # seconds between two looks at the processes
FIRST_BACKOFF = 0.5  # seconds before the first restart of a slot
MAX_BACKOFF = 30.0
_IDLE = 3600.0  # seconds the ZooKeeper watchdog sleeps once closed (it lives on, idle)
STABLE = 10.0  # a process that ran this long resets its slot's backoff (no crash loop)
SCALE_TIMEOUT = 60.0
_LAYER_OF = {
    Role.MATCHER: "matchers",
    Role.EXIT_POINT: "exit-points",
    Role.ACCESS_POINT: "access-points",
}
_SLOT = re.compile(r"-(\d+)\.log$")


@dataclass
class _Slot:
    """One place of a layer (``role``, ``number``) and its restarts."""

    role: Role
    number: int
    restarts: int = 0
    streak: int = 0  # restarts since the slot last ran STABLE seconds
    due: float | None = None  # when the pending restart starts
    started: float = 0.0


class Supervisor:
    """Keeps the processes of a foreground ``silbo up`` running (see the module doc)."""

    def __init__(
        self, cluster: LocalCluster, *, out: IO[str], hang_after: float = HANG_AFTER
    ) -> None:
        self._cluster = cluster
        self._state_dir = cluster.state_dir
        self._out = out
        self._slots: dict[tuple[str, int], _Slot] = {}
        self._client: KazooClient | None = None
        self._scaling: threading.Thread | None = None
        self._next_scale = 0.0
        self._restoring = False  # a process was restarted: its layer may be short of one
        self._undeclared: dict[str, str] = {}  # dead members whose znode is not deleted yet
        self._closed = threading.Event()
        self._watchdog = threading.Thread(
            target=self._watch_zookeeper, name="zookeeper-watchdog", daemon=True
        )
        self._watchdog.start()
        self._liveness = (
            Liveness(self._state_dir, on_kill=self._hung, hang_after=hang_after)
            if hang_after > 0
            else None
        )

    def close(self) -> None:
        """Stop using ZooKeeper (a scale under way finishes in its thread)."""
        self._closed.set()
        if self._liveness is not None:
            self._liveness.close()
        if self._client is not None:
            close(self._client, CLOSE_WITHIN)
            self._client = None

    def check(self) -> None:
        """One look at everything; restarts and scales what needs it (never raises for a
        ZooKeeper that is away: the next check tries again)."""
        description = read_cluster(self._state_dir)
        if description is None:
            return
        try:
            self._declare_dead()
            for entry in description.get("processes") or []:
                self._check_process(entry)
            self._restart_due()
            for line in self._cluster.restart_autoscalers(ran_at_least=STABLE):
                self._say(line)
            self._learn_names(description)
            if self._restoring:
                self._restore_sizes(description)
        except SilboError as exc:
            _log.warning("supervisor check failed (%s); trying again", exc)

    # -- the embedded ZooKeeper -----------------------------------------------------------

    def _watch_zookeeper(self) -> None:
        # The thread outlives close(): a ZooKeeper it started again is its child, which
        # Linux's parent-death signal (die_with_parent) kills when the *thread* that forked
        # it ends; it must serve until the cluster's stop has stopped every process (they
        # waited for it out their grace, 10 s, when it died at close()).
        while True:
            self._closed.wait(CHECK_INTERVAL)
            if self._closed.is_set():
                time.sleep(_IDLE)
                continue
            try:
                self._keep_zookeeper()
            except Exception:  # a watchdog must outlive what it watches
                _log.exception("restarting the embedded ZooKeeper failed; trying again")

    def _keep_zookeeper(self) -> None:
        """Start the embedded ZooKeeper again if it died (only the watchdog looks)."""
        status = self._cluster.zookeeper_exited()
        if status is None or self._closed.is_set():
            return
        self._say(f"the embedded ZooKeeper exited with {status}; starting it again")
        self._cluster.restart_zookeeper()
        self._say("the embedded ZooKeeper serves again")

    def _hung(self, entry: dict[str, Any], reason: str) -> None:
        self._say(
            f"{entry.get('role')} {entry.get('name')} (pid {entry.get('pid')}) {reason}: "
            "killed as hung"
        )

    # -- dead processes -----------------------------------------------------------------

    def _check_process(self, entry: dict[str, Any]) -> None:
        pid = int(entry.get("pid") or 0)
        slot = self._slot(entry)
        if slot is None or slot.due is not None:
            return
        child = self._cluster.child(pid)
        if child is not None:
            status = child.poll()
            if status is None:
                if slot.started and time.monotonic() - slot.started > STABLE:
                    slot.streak = 0
                return
            how = f"exited with {status}"
        elif _same_process(pid, entry.get("start_time"), "broker.cli run"):
            return
        else:
            how = "is gone"
        name = entry.get("name")
        if name:
            self._undeclared[name] = slot.role.value
            self._declare_dead()
        delay = min(MAX_BACKOFF, FIRST_BACKOFF * 2**slot.streak)
        slot.due = time.monotonic() + delay
        self._say(
            f"{slot.role.value} (pid {pid}) {how} (log: {entry.get('log')}); "
            f"restarting it in {delay:g} s"
        )

    def _declare_dead(self) -> None:
        """Delete the znodes of the processes seen dead, and repair; what fails (ZooKeeper
        away) is tried again at the next check, not left to the session timeout."""
        for name, role in list(self._undeclared.items()):
            try:
                declare_dead(self._zk(), role, name)
                if role == Role.CONNECTION_POINT.value:  # its HTTP subscriptions adopted now
                    release_dead_front(self._zk(), name)
                del self._undeclared[name]
                # The elected repairer may be the dead one (its election znode lasts as long
                # as its session): repair from here too; a compare-and-set, so no race.
                repair_once(self._zk())
            except SilboError as exc:
                _log.warning("declaring %s dead failed (%s); trying again", name, exc)

    def _restart_due(self) -> None:
        now = time.monotonic()
        for slot in self._slots.values():
            if slot.due is None or slot.due > now:
                continue
            slot.due = None
            log = str(self._state_dir / "logs" / f"{slot.role.value}-{slot.number}.log")
            started: list[int] = []

            def swap(
                description: dict[str, Any],
                slot: _Slot = slot,
                log: str = log,
                started: list[int] = started,
            ) -> None:
                # Under cluster.json's lock: a slot ``admin scale`` retired while its restart
                # was due (it left cluster.json) stays retired, not restarted over the size.
                processes = description.get("processes") or []
                if not any(p.get("log") == log for p in processes):
                    return
                process = self._cluster.replace(slot.role, slot.number)
                started.append(process.pid)
                fresh = {
                    "role": slot.role.value,
                    "name": None,
                    "pid": process.pid,
                    "start_time": _start_time(process.pid),
                    "address": None,
                    "internal": None,
                    "metrics": None,
                    "log": log,
                    "restarts": slot.restarts + 1,
                }
                description["processes"] = [p for p in processes if p.get("log") != log]
                description["processes"].append(fresh)

            update_description(self._state_dir, swap)
            if not started:
                self._say(f"{slot.role.value} slot {slot.number} was retired: not restarted")
                continue
            slot.restarts += 1
            slot.streak += 1
            slot.started = now
            self._say(f"{slot.role.value} restarted (pid {started[0]}, restart {slot.restarts})")
            self._restoring = True

    def _learn_names(self, description: dict[str, Any]) -> None:
        unnamed = [p for p in description.get("processes") or [] if not p.get("name")]
        if not unnamed:
            return
        by_pid = {m.pid: m for m in members(self._zk())}
        found = {int(p["pid"]): by_pid[int(p["pid"])] for p in unnamed if p["pid"] in by_pid}
        if not found:
            return

        def name(description: dict[str, Any]) -> None:
            for entry in description.get("processes") or []:
                member = found.get(int(entry.get("pid") or 0))
                if member is not None and not entry.get("name"):
                    entry.update(
                        name=member.name,
                        address=member.endpoint,
                        internal=member.address,
                        metrics=member.metrics,
                    )

        update_description(self._state_dir, name)

    # -- layers back to their size --------------------------------------------------------

    def _restore_sizes(self, description: dict[str, Any]) -> None:
        """Scale a layer short of its size back to it (after a restart: ``_restoring``)."""
        if self._scaling is not None and self._scaling.is_alive():
            return
        if time.monotonic() < self._next_scale:
            return
        client = self._zk()
        current = ClusterConfiguration(client).read()
        if current is None:
            return
        configuration = current.configuration
        layout = read_layout(self._state_dir)
        ours = {p.get("name") for p in description.get("processes") or [] if p.get("name")}
        short = False
        for role, layer in _LAYER_OF.items():
            named = getattr(configuration, layer.replace("-", "_"))
            if role is not Role.MATCHER and not named:
                continue  # "every live one": a replacement serves as soon as it registers
            live = {m.name for m in members(client, role.value)}
            if set(named) - live:
                return  # a dead member is still named: the repair comes first
            now = serving(client, configuration, layer)
            wanted = layout.get(layer.replace("-", "_"), len(now))
            idle = [m for m in sorted(live - set(now)) if m in ours]
            short = short or len(now) < wanted
            if len(now) < wanted and idle:
                names = now + idle[: wanted - len(now)]
                self._scaling = threading.Thread(
                    target=self._scale, args=(layer, names), name="restore", daemon=True
                )
                self._scaling.start()
                return
        self._restoring = short  # until every layer has its size again

    def _scale(self, layer: str, names: list[str]) -> None:
        self._say(f"scaling {layer} back to {len(names)}")
        try:
            outcome = scale_layer(self._zk(), layer, names, timeout=SCALE_TIMEOUT)
        except SilboError as exc:
            self._say(f"scaling {layer} back failed: {exc}; trying again")
            self._next_scale = time.monotonic() + 2.0
            return
        self._say(f"scaling {layer} back to {len(names)}: {outcome.outcome} {outcome.message}")
        if outcome.outcome != "completed":
            self._next_scale = time.monotonic() + 2.0

    # -- helpers --------------------------------------------------------------------------

    def _slot(self, entry: dict[str, Any]) -> _Slot | None:
        found = _SLOT.search(str(entry.get("log") or ""))
        try:
            role = Role(str(entry.get("role")))
        except ValueError:
            return None
        if found is None:
            return None
        key = (role.value, int(found.group(1)))
        slot = self._slots.get(key)
        if slot is None:
            slot = self._slots[key] = _Slot(role, key[1], restarts=int(entry.get("restarts") or 0))
        return slot

    def _zk(self) -> KazooClient:
        if self._client is None:
            self._client = connect(
                self._cluster.zk_address, cluster=self._cluster.spec.cluster, timeout=10.0
            )
        return self._client

    def _say(self, line: str) -> None:
        now = time.strftime("%H:%M:%S", time.localtime())
        print(f"silbo up: {now} {line}", file=self._out, flush=True)
        _log.info("%s", line)
