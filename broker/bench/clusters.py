"""What the benchmarks that start a local cluster share (``silbo bench context``, ``derived``,
``store-scale``): the ``--dir`` option (``storage`` has it too; the directory is made if
missing), the cluster's lifetime (its state directory removed after a run, its logs kept
after a failure), and waiting for its HTTP front."""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from broker.cluster import ClusterSpec, LocalCluster

__all__ = ["add_dir_option", "bench_cluster", "store_cluster", "wait_serving", "work_directory"]


def work_directory(text: str) -> Path:
    """``--dir``'s type: the directory, made if it is not there yet (a usage error if it
    cannot be)."""
    path = Path(text)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"cannot make {text}: {exc.strerror or exc}") from None
    return path


def add_dir_option(add: Callable[..., Any], made: str = "the clusters' state directories") -> None:
    """``--dir``: where ``made`` are made (made itself if missing)."""
    add(
        "--dir", type=work_directory, default=Path(tempfile.gettempdir()),
        help=f"where {made} are made (default: the temporary directory)",
    )  # fmt: skip


@contextmanager
def bench_cluster(
    args: argparse.Namespace,
    prefix: str,
    spec_of: Callable[[Path], ClusterSpec],
    say: Callable[[argparse.Namespace, str], None],
) -> Iterator[tuple[LocalCluster, dict[str, Any]]]:
    """A local cluster of ``spec_of(its state directory)`` in a new directory under
    ``args.dir``, started, and its description; stopped and removed afterwards (its logs
    kept, and said where, if the run failed)."""
    state = Path(tempfile.mkdtemp(prefix=prefix, dir=args.dir))
    cluster = LocalCluster(spec_of(state))
    try:
        described = cluster.start()
        yield cluster, described
    except BaseException:
        cluster.stop()
        say(args, f"failed: the cluster's logs are kept in {state / 'logs'}")
        raise
    cluster.stop()
    shutil.rmtree(state, ignore_errors=True)


@contextmanager
def store_cluster(
    args: argparse.Namespace,
    bench: str,
    stores: int,
    say: Callable[[argparse.Namespace, str], None],
    more: Callable[[Path], dict[str, Any]] = lambda _state: {},
) -> Iterator[tuple[LocalCluster, dict[str, Any]]]:
    """:func:`bench_cluster` of one matcher, ``stores`` context stores (their history as
    ``args.history`` says) and an HTTP front, logging warnings, for ``silbo bench BENCH``;
    ``more``: further fields of its spec, given its state directory."""

    def spec_of(state: Path) -> ClusterSpec:
        return ClusterSpec(
            matchers=1,
            context_stores=stores,
            grpc_port=0,
            http_port=0,  # any free port: cluster.json names the fronts
            state_dir=state,
            log_level="WARNING",
            store_history=args.history == "on",
            **more(state),
        )

    say(args, f"starting a cluster with {stores} context store{'s' if stores > 1 else ''}")
    with bench_cluster(args, f"silbo-bench-{bench}-{stores}-", spec_of, say) as started:
        yield started


def wait_serving(base: str, timeout: float = 30.0) -> None:
    """Return once the front at ``base`` answers ``GET /version`` with 200 (RuntimeError
    after ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"{base}/version", timeout=5.0) as answer:
                if answer.status == 200:
                    return
        except (OSError, urllib.error.URLError):
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{base} did not serve within {timeout:g} s")
        time.sleep(0.1)
