"""What starting a local cluster costs: start a default cluster (on an embedded ZooKeeper)
a few times and read each process's CPU time from /proc once the cluster serves.

    .venv/bin/python scripts/start_cpu.py [--starts 3]

Prints each start's time and its processes' CPU, and the medians. Linux only (/proc).
What ``make bytecode`` saves, on a machine that sets ``PYTHONDONTWRITEBYTECODE``: run it
once after ``find broker spark_matcher -name __pycache__ -prune -exec rm -rf {} +`` (every
process then compiles the broker's modules from source) and once after ``make bytecode``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from broker.cluster import ClusterSpec, LocalCluster
from broker.coordination.embedded import EmbeddedZooKeeper


def _cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds of ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=3, help="cluster starts (default 3)")
    args = parser.parse_args()
    with EmbeddedZooKeeper() as zookeeper, tempfile.TemporaryDirectory() as directory:
        walls, cpus = [], []
        for start in range(1, args.starts + 1):
            name = f"start-{uuid.uuid4().hex[:8]}"
            spec = ClusterSpec(
                zk=zookeeper.address, cluster=name, grpc_port=0, state_dir=Path(directory) / name
            )
            cluster = LocalCluster(spec)
            began = time.monotonic()
            described = cluster.start()
            wall = time.monotonic() - began
            try:
                each = {p["role"]: _cpu_seconds(int(p["pid"])) for p in described["processes"]}
            finally:
                cluster.stop()
            walls.append(wall)
            cpus.append(sum(each.values()))
            shown = ", ".join(f"{role} {cpu:.2f}" for role, cpu in each.items())
            print(f"start {start}: {wall:.2f} s, {cpus[-1]:.2f} CPU-s ({shown})")
    print(
        f"median of {args.starts}: {statistics.median(walls):.2f} s, "
        f"{statistics.median(cpus):.2f} CPU-s"
    )


if __name__ == "__main__":
    main()
