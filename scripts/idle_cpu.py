"""How much CPU an idle local cluster burns: start a default cluster (on an embedded
ZooKeeper), let it settle, and read each process's CPU time from /proc over a window.

    .venv/bin/python scripts/idle_cpu.py [--seconds 20]

Prints each process's share of one core while nothing is published or subscribed, and the
sum (the ZooKeeper server's own share is not counted). Linux only (/proc).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import uuid
from pathlib import Path

from broker.cluster import ClusterSpec, LocalCluster
from broker.coordination.embedded import EmbeddedZooKeeper

SETTLE = 5.0  # seconds after the start before the window opens


def _cpu_ticks(pid: int) -> int:
    """User plus system clock ticks of ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="the window (default 20)")
    args = parser.parse_args()
    with EmbeddedZooKeeper() as zookeeper, tempfile.TemporaryDirectory() as directory:
        name = f"idle-{uuid.uuid4().hex[:8]}"
        spec = ClusterSpec(
            zk=zookeeper.address, cluster=name, grpc_port=0, state_dir=Path(directory) / name
        )
        with LocalCluster(spec) as cluster:
            time.sleep(SETTLE)
            processes = [(p["role"], int(p["pid"])) for p in cluster.description["processes"]]
            before = {pid: _cpu_ticks(pid) for _role, pid in processes}
            began = time.monotonic()
            time.sleep(args.seconds)
            window = time.monotonic() - began
            after = {pid: _cpu_ticks(pid) for _role, pid in processes}
    hertz = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for role, pid in processes:
        share = 100 * (after[pid] - before[pid]) / hertz / window
        total += share
        print(f"{role:18s} {share:5.1f}% of a core")
    print(f"{'all':18s} {total:5.1f}% of a core, idle, over {window:.0f} s")


if __name__ == "__main__":
    main()
