"""The supervisor's liveness watch: a child that hangs is killed, then replaced.

The supervisor of ``silbo up`` watches every process cluster.json names two ways:

- **stopped**: the process's state, read from the kernel (psutil) every ``PROBE_INTERVAL``
  seconds. One that stays stopped (SIGSTOP, a job-control stop) for ``hang_after`` seconds
  (1.25 by default, ``silbo up --hang-after``) is hung. Exact, and blind to load: a busy
  process is running, never stopped.
- **silent**: once it knows its name and internal address, the supervisor asks it for
  ``Admin.Status`` (a :class:`broker.runtime.liveness.Prober`). ``Admin.Status`` is
  answered from the process's event loop, and a loop can be busy for a while with a large
  batch; one that leaves it unanswered for ``loop_after`` seconds (8 times ``hang_after``,
  10 s by default) is stuck (a deadlock, a loop that never yields).

A hung or stuck process is sent SIGKILL. From there it is an ordinary death
(broker.cluster.supervisor): its znode is deleted, the configuration repaired, a new process
started in its slot. A stopped process is so repaired within about 2 s, where the ZooKeeper
session would take 10.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from broker.cluster.local import _same_process, read_cluster
from broker.runtime.liveness import HANG_AFTER, PROBE_INTERVAL, Prober, Target

__all__ = ["HANG_AFTER", "LOOP_FACTOR", "Liveness"]

LOOP_FACTOR = 8  # a silent event loop is stuck after this many times hang_after


class Liveness:
    """Watches the processes cluster.json names; kills the ones that hang (module doc).

    ``on_kill(entry, reason)`` is called after a kill (from the watch's threads), for the
    supervisor's log line.
    """

    def __init__(
        self,
        state_dir: Path,
        *,
        on_kill: Callable[[dict[str, Any], str], None],
        hang_after: float = HANG_AFTER,
    ) -> None:
        self._state_dir = state_dir
        self._on_kill = on_kill
        self._hang_after = hang_after
        self._entries: dict[object, dict[str, Any]] = {}
        self._stopped_since: dict[int, float] = {}
        self._lock = threading.Lock()
        self.kills = 0
        self._closed = threading.Event()
        self._prober = Prober(self._targets, self._silent, hang_after=LOOP_FACTOR * hang_after)
        self._thread = threading.Thread(target=self._watch_stopped, name="stopped", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop watching."""
        self._closed.set()
        self._thread.join(timeout=5.0)
        self._prober.close()

    # -- stopped processes ----------------------------------------------------------------

    def _watch_stopped(self) -> None:
        while not self._closed.wait(PROBE_INTERVAL):
            with contextlib.suppress(Exception):  # a bad look must not end the watch
                self.look_once()

    def look_once(self) -> None:
        """One look at every process's state; kill the ones stopped for ``hang_after``."""
        description = read_cluster(self._state_dir)
        now = time.monotonic()
        stopped: dict[int, float] = {}
        for entry in (description or {}).get("processes") or []:
            pid = int(entry.get("pid") or 0)
            try:
                state = psutil.Process(pid).status() if pid else None
            except psutil.Error:
                continue
            if state != psutil.STATUS_STOPPED:
                continue
            since = stopped[pid] = self._stopped_since.get(pid, now)
            if now - since >= self._hang_after:
                self._kill(entry, f"stopped for {now - since:.1f} s")
                stopped.pop(pid)
        self._stopped_since = stopped

    # -- silent event loops ---------------------------------------------------------------

    def _targets(self) -> list[Target]:
        description = read_cluster(self._state_dir)
        if description is None:
            return []
        self._entries = {
            (int(e["pid"]), e.get("start_time")): e
            for e in description.get("processes") or []
            if e.get("pid") and e.get("name") and e.get("address")
        }
        return [
            Target(key, str(e["role"]), str(e["name"]), e.get("internal") or e["address"])
            for key, e in self._entries.items()
        ]

    def _silent(self, target: Target, silent: float) -> bool:
        entry = self._entries.get(target.key)
        if entry is not None:
            self._kill(entry, f"did not answer for {silent:.1f} s")
        return True

    def _kill(self, entry: dict[str, Any], reason: str) -> None:
        pid = int(entry["pid"])
        with self._lock:
            if not _same_process(pid, entry.get("start_time"), "broker.cli run"):
                return  # exited (or killed by the other watch): the supervisor's check sees it
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                self.kills += 1
                self._on_kill(entry, reason)
