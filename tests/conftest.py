"""Test-session set-up: Hypothesis profiles, and a summary of how often generated data matched.

Profiles (choose with ``HYPOTHESIS_PROFILE``, default ``ci``):

- ``ci``: the full budget, no deadline (matching a large batch takes a while), random seeds;
- ``dev``: a fifth of the examples, for quick local runs.

Tests scale their own ``max_examples`` by the profile with :func:`strategies.examples`.

Markers: ``slow`` is every test that starts processes (ZooKeeper, a cluster, Spark, ``silbo``
as a subprocess, a wheel build); the unmarked rest are unit and property tests
(``pytest -m "not slow"``). A test that uses a fixture of :data:`SLOW_FIXTURES` is marked
here; a module that starts processes by itself says ``pytestmark = pytest.mark.slow``.
``s3_server`` is a real S3 protocol server (moto's) in a thread of the test process, for the
archive on an object store. Under pytest-xdist (``make test`` runs ``-n``), each worker has
its own session fixtures; the Spark tests go to one worker (``xdist_group("spark")`` with
``--dist loadgroup``), so one Spark driver runs, not one per worker.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from broker.cluster import ClusterSpec, LocalCluster
from broker.coordination.embedded import EmbeddedZooKeeper
from spark_matcher.session import spark_session

settings.register_profile(
    "ci",
    max_examples=100,
    deadline=None,
    derandomize=False,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "dev",
    parent=settings.get_profile("ci"),
    max_examples=20,
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


SLOW_FIXTURES = frozenset({"zookeeper", "spark", "start_cluster"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the tests that use a process-starting fixture slow; put the Spark ones together."""
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        if used & SLOW_FIXTURES:
            item.add_marker(pytest.mark.slow)
        if "spark" in used:
            item.add_marker(pytest.mark.xdist_group("spark"))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Report, per property test, how often the generated updates found a match."""
    # Looked up rather than imported: only tests that use the strategies load the model.
    strategies = sys.modules.get("strategies")
    stats: dict[str, list[int]] = getattr(strategies, "MATCH_STATS", {})
    if not stats:
        return
    terminalreporter.section("generated data: match rates")
    for test, (updates, non_empty, pairs, matched) in sorted(stats.items()):
        terminalreporter.write_line(
            f"{test}: {updates} updates, {non_empty / max(1, updates):.0%} with a match, "
            f"{matched / max(1, updates):.1f} matches each; "
            f"{matched / max(1, pairs):.0%} of same-tenant pairs match"
        )


# -- real processes: one ZooKeeper per test session, a fresh cluster per test --------------


@pytest.fixture(scope="session")
def zookeeper() -> Iterator[EmbeddedZooKeeper]:
    """A standalone ZooKeeper server for the whole test session."""
    with EmbeddedZooKeeper() as server:
        yield server


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The process's SparkSession on local[2], started once for every Spark test (a cold
    start takes ~10 s; Spark's own exit hook stops it)."""
    yield spark_session("local[2]")


@dataclass(frozen=True, slots=True)
class S3Server:
    """A real S3 protocol server on this machine (moto's): ``endpoint`` is its HOST:PORT."""

    endpoint: str

    def filesystem(self) -> Any:
        """A pyarrow S3 file system on it that may create buckets."""
        import pyarrow.fs as pafs

        return pafs.S3FileSystem(
            endpoint_override=self.endpoint,
            scheme="http",
            region="us-east-1",
            allow_bucket_creation=True,
        )

    def bucket(self) -> str:
        """A new, empty bucket's name."""
        name = f"silbo-{uuid.uuid4().hex[:12]}"
        self.filesystem().create_dir(name)
        return name

    def uri(self, path: str) -> str:
        """The ``s3://`` URI of ``bucket/prefix`` on this server, as ``--archive`` takes it."""
        return f"s3://{path}?endpoint_override={self.endpoint}&scheme=http&region=us-east-1"


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """moto's S3 server in a thread of this process for the whole session (about 0.5 s to
    start), and credentials in the environment for the AWS SDK in pyarrow, here and in the
    processes started meanwhile (moto takes any; without them the SDK would look for an
    instance's credentials, off this machine)."""
    from moto.server import ThreadedMotoServer

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AWS_ACCESS_KEY_ID", "silbo-test")
        patch.setenv("AWS_SECRET_ACCESS_KEY", "silbo-test")
        patch.setenv("AWS_EC2_METADATA_DISABLED", "true")
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        try:
            host, port = server.get_host_and_port()
            yield S3Server(f"{host}:{port}")
        finally:
            server.stop()


StartCluster = Callable[..., LocalCluster]


@pytest.fixture
def start_cluster(zookeeper: EmbeddedZooKeeper, tmp_path: Path) -> Iterator[StartCluster]:
    """Start local clusters (real processes) on the session's ZooKeeper; stopped after the test.

    ``start_cluster(matchers=2, connection_points=1, ...)`` takes ClusterSpec's fields; each
    cluster gets its own name (so its own chroot) and state directory.
    """
    started: list[LocalCluster] = []

    def start(**fields: object) -> LocalCluster:
        name = f"it-{uuid.uuid4().hex[:10]}"
        spec = ClusterSpec(
            **{  # type: ignore[arg-type]
                "zk": zookeeper.address,
                "cluster": name,
                "grpc_port": 0,
                "state_dir": tmp_path / name,
                **fields,
            }
        )
        cluster = LocalCluster(spec)
        cluster.start()
        started.append(cluster)
        return cluster

    yield start
    for cluster in started:
        cluster.stop()
