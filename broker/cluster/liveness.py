"""The supervisor's liveness probe: a child that stops answering is killed, then replaced.

The supervisor of ``silbo up`` probes every process cluster.json names (once it knows its
name and internal address) with a :class:`broker.runtime.liveness.Prober`; a process that
has not answered ``Admin.Status`` for ``hang_after`` seconds (1.25 by default,
``silbo up --hang-after``) is sent SIGKILL. From there it is an ordinary death
(broker.cluster.supervisor): its znode is deleted, the configuration repaired, a new process
started in its slot. A hang is so repaired within about 2 s, where the ZooKeeper session
would take 10.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from broker.cluster.local import _same_process, read_cluster
from broker.runtime.liveness import HANG_AFTER, Prober, Target

__all__ = ["HANG_AFTER", "Liveness"]


class Liveness:
    """Probes the processes cluster.json names; kills the ones that hang (module doc).

    ``on_kill(entry, silent_s)`` is called after a kill (from the probe's thread), for the
    supervisor's log line.
    """

    def __init__(
        self,
        state_dir: Path,
        *,
        on_kill: Callable[[dict[str, Any], float], None],
        hang_after: float = HANG_AFTER,
    ) -> None:
        self._state_dir = state_dir
        self._on_kill = on_kill
        self._entries: dict[object, dict[str, Any]] = {}
        self.kills = 0
        self._prober = Prober(self._targets, self._silent, hang_after=hang_after)

    def close(self) -> None:
        """Stop probing."""
        self._prober.close()

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
        if entry is None:
            return True
        pid = int(entry["pid"])
        if not _same_process(pid, entry.get("start_time"), "broker.cli run"):
            return True  # exited: the supervisor's check sees it
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
            self.kills += 1
            self._on_kill(entry, silent)
        return True
