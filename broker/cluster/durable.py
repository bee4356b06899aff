"""What a local cluster keeps across ``silbo down`` / ``silbo up``: its state directory.

The embedded ZooKeeper keeps its data in ``STATE_DIR/zookeeper/data`` (fsynced before it
answers): the HTTP subscriptions, their statuses and everything else under the cluster's
chroot survive a stop, a kill of every process and a power cut. ``STATE_DIR/layout.json``
keeps the size of each layer, rewritten whenever it changes (``silbo up``, ``silbo admin
scale``), so that the next ``silbo up`` starts the cluster as it was::

    {"matchers": 3, "access_points": 1, "exit_points": 1, "connection_points": 1}

What a restart must not keep is what belonged to the processes of the previous run: their
member znodes, the fronts and owners of HTTP subscriptions and the autoscaling controllers'
election znodes (ephemeral znodes of sessions the restored ZooKeeper still counts until
they time out), the configuration naming the old
matchers and a scale plan interrupted by the stop. :func:`clear_previous_run` removes them
before the new processes start, so the new fronts adopt every subscription at once.

``silbo down --purge`` (:func:`purge`) removes the kept data: the next ``silbo up`` starts
from nothing.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
from collections.abc import Mapping
from pathlib import Path

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError, NotEmptyError

from broker.coordination.errors import translated

__all__ = [
    "LAYERS",
    "LAYOUT_FILE",
    "STORES",
    "clear_previous_run",
    "layout_of",
    "purge",
    "read_layout",
    "write_layout",
]

_log = logging.getLogger(__name__)

LAYOUT_FILE = "layout.json"
STORES = "stores"  # the context stores' directories, one per store id (store-1, store-2...)
LAYERS = ("matchers", "access_points", "exit_points", "connection_points", "context_stores")
_LAYER_OF_ROLE = {
    "matcher": "matchers",
    "access-point": "access_points",
    "exit-point": "exit_points",
    "connection-point": "connection_points",
    "context-store": "context_stores",
}
# Where the processes of a run leave ephemeral znodes (relative to the cluster's chroot).
_EPHEMERAL_PARENTS = ("/ngsi/owners", "/ngsi/fronts", "/stores", "/autoscale/leader")
_MEMBERS = "/members"
_SCALE = "/scale"


def read_layout(state_dir: Path) -> dict[str, int]:
    """The layer sizes the last run of this state directory had ({} if none is kept, or
    the file is not one this module wrote)."""
    try:
        kept = json.loads((state_dir / LAYOUT_FILE).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(kept, dict):
        return {}
    return {
        layer: count
        for layer, count in kept.items()
        if layer in LAYERS and isinstance(count, int) and not isinstance(count, bool) and count > 0
    }


def layout_of(processes: list[dict[str, object]]) -> dict[str, int]:
    """The layer sizes of cluster.json's process list."""
    counts = dict.fromkeys(LAYERS, 0)
    for process in processes:
        layer = _LAYER_OF_ROLE.get(str(process.get("role")))
        if layer is not None:
            counts[layer] += 1
    return counts


def write_layout(state_dir: Path, counts: Mapping[str, int]) -> None:
    """Keep the layer sizes (atomically: a crash leaves the old file or the new one)."""
    path = state_dir / LAYOUT_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({layer: int(counts.get(layer, 0)) for layer in LAYERS}) + "\n")
    tmp.replace(path)


def clear_previous_run(client: KazooClient) -> int:
    """Remove what the processes of a previous run left under the chroot (see the module
    doc); how many znodes went. Call it before any process of the new run starts."""
    removed = 0
    with translated("clear what the previous run left in ZooKeeper"):
        parents = list(_EPHEMERAL_PARENTS)
        with contextlib.suppress(NoNodeError):
            parents += [f"{_MEMBERS}/{role}" for role in client.get_children(_MEMBERS)]
        for parent in parents:
            try:
                children = client.get_children(parent)
            except NoNodeError:
                continue
            for child in children:
                with contextlib.suppress(NoNodeError):
                    client.delete(f"{parent}/{child}")
                    removed += 1
        with contextlib.suppress(NoNodeError, NotEmptyError):
            client.delete(_SCALE, recursive=True)
            removed += 1
    if removed:
        _log.info("cleared %d znodes the previous run left", removed)
    return removed


def purge(state_dir: Path) -> list[Path]:
    """Remove what a state directory keeps across runs (ZooKeeper's data, the layout, the
    context stores' entities); the paths removed. Logs stay. Only for a cluster that is not
    running."""
    removed = []
    for path in (state_dir / "zookeeper" / "data", state_dir / LAYOUT_FILE, state_dir / STORES):
        if path.is_dir():
            shutil.rmtree(path)
            removed.append(path)
        elif path.exists():
            path.unlink()
            removed.append(path)
    return removed
