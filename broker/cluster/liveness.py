"""The supervisor's liveness probe: a process that stops answering is killed, then replaced.

A process that hangs (SIGSTOP, a deadlock, a loop that never yields) keeps its ZooKeeper
znode until its session times out (10 s), and until then its layer waits on it: a hung
access point holds its publishers' acknowledgements, a hung exit point its deliveries. The
supervisor of ``silbo up`` does not wait for the session: every ``PROBE_INTERVAL`` seconds it
asks each registered process for its ``Admin.Status`` (deadline ``PROBE_DEADLINE``, the
cluster token attached), and a process that has not answered for ``HANG_AFTER`` seconds is
sent SIGKILL. From there it is an ordinary death (broker.cluster.supervisor): its znode is
deleted, the configuration repaired, a new process started in its slot. A hang is so
detected within ``HANG_AFTER`` + ``PROBE_INTERVAL`` seconds (2 s).

The probe runs on a thread of its own, with the calls in flight together (one hung process
must not delay the look at the others). A process is probed once the supervisor knows its
name and address; until it first answers, its clock starts when it was first seen (it may
still be starting its services). ``Admin.Status`` answers from the process's event loop, so
a loop blocked for ``HANG_AFTER`` seconds counts as a hang: none of ours blocks that long.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from broker.cluster.local import _same_process, read_cluster
from broker.runtime.token import call_metadata
from broker.wire import internal_pb2 as wire
from broker.wire import internal_pb2_grpc as wire_grpc

__all__ = ["HANG_AFTER", "PROBE_DEADLINE", "PROBE_INTERVAL", "Liveness"]

_log = logging.getLogger(__name__)

PROBE_INTERVAL = 0.2  # seconds between two rounds of probes
PROBE_DEADLINE = 0.6  # seconds one probe may take
HANG_AFTER = 1.25  # seconds without an answer after which a process is killed
STARTING_GRACE = 30.0  # seconds a process that never answered is given to start serving


@dataclass
class _Probed:
    """What the probe knows of one process (by pid and start time)."""

    name: str
    address: str
    answered: float  # monotonic time of the last answer (or of the first look)
    ever: bool = False  # has it answered once?
    channel: grpc.Channel | None = None


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
        self._hang_after = hang_after
        self._probed: dict[tuple[int, object], _Probed] = {}
        self._closed = threading.Event()
        self.kills = 0
        self._thread = threading.Thread(target=self._run, name="liveness", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop probing (at the end of the round under way)."""
        self._closed.set()
        self._thread.join(timeout=5.0)
        for probed in self._probed.values():
            if probed.channel is not None:
                probed.channel.close()
        self._probed.clear()

    def _run(self) -> None:
        while not self._closed.wait(PROBE_INTERVAL):
            try:
                self.probe_once()
            except Exception:  # the probe must outlive any one bad round
                _log.exception("a liveness probe round failed; trying again")

    def probe_once(self) -> None:
        """One round: ask every named process, kill the ones silent past ``hang_after``."""
        description = read_cluster(self._state_dir)
        if description is None:
            return
        now = time.monotonic()
        entries = {
            (int(e["pid"]), e.get("start_time")): e
            for e in description.get("processes") or []
            if e.get("pid") and e.get("name") and e.get("address")
        }
        for key in set(self._probed) - set(entries):  # gone, or replaced
            gone = self._probed.pop(key)
            if gone.channel is not None:
                gone.channel.close()
        calls: list[tuple[_Probed, Any]] = []
        for key, entry in entries.items():
            probed = self._probed.get(key)
            address = entry.get("internal") or entry["address"]  # where Admin is served
            if probed is None or probed.address != address:
                probed = self._probed[key] = _Probed(entry["name"], address, now)
            if probed.channel is None:
                probed.channel = grpc.insecure_channel(probed.address)
            stub = wire_grpc.AdminStub(probed.channel)  # type: ignore[no-untyped-call]
            call = stub.Status.future(
                wire.StatusRequest(), timeout=PROBE_DEADLINE, metadata=call_metadata()
            )
            calls.append((probed, call))
        for probed, call in calls:
            with contextlib.suppress(grpc.RpcError, grpc.FutureTimeoutError):
                call.result()
                probed.answered = time.monotonic()
                probed.ever = True
        now = time.monotonic()
        for key, entry in entries.items():
            probed = self._probed[key]
            silent = now - probed.answered
            if silent < (self._hang_after if probed.ever else STARTING_GRACE):
                continue
            pid, start_time = key
            if not _same_process(pid, start_time, "broker.cli run"):
                continue  # exited: the supervisor's check sees it
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                self.kills += 1
                self._on_kill(entry, silent)
            probed.answered = now  # once: the check replaces it
