"""One way to start a process of a local cluster: the options every role gets, from the
cluster's spec, the same for ``up``, the supervisor's restarts and ``admin scale``."""

from __future__ import annotations

import json
from pathlib import Path

from broker.cluster.local import ChildOptions, ClusterSpec
from broker.runtime.options import Role


def test_each_role_gets_its_own_options_from_the_spec(tmp_path: Path) -> None:
    spec = ClusterSpec(
        http_port=1026,
        spark_offload=5000,
        log_level="DEBUG",
        notify_allow=("10.0.0.0/8",),
        retry_window=12.0,
        peer_hang_after=3.5,
        state_dir=tmp_path,
    )
    options = ChildOptions.of(spec)
    common = ["--log-level", "DEBUG", "--peer-hang-after", "3.5"]
    assert options.arguments(Role.MATCHER, 1) == [*common, *("--spark-offload", "5000")]
    assert options.arguments(Role.EXIT_POINT, 2) == common
    second = options.arguments(Role.CONNECTION_POINT, 2)
    assert second[:6] == [*common, "--http-listen", "127.0.0.1:1027"]
    assert second[second.index("--retry-window") :][:2] == ["--retry-window", "12.0"]
    assert second[-2:] == ["--notify-allow", "10.0.0.0/8"]


def test_any_port_stays_any_port_and_no_http_means_no_front() -> None:
    any_port = ChildOptions(http_port=0).arguments(Role.CONNECTION_POINT, 3)
    assert any_port[any_port.index("--http-listen") + 1] == "127.0.0.1:0"
    assert "--http-listen" not in ChildOptions().arguments(Role.CONNECTION_POINT, 1)


def test_options_survive_cluster_json_and_old_files_read_as_the_defaults() -> None:
    options = ChildOptions(log_level="WARNING", http_port=0, notify_allow=("example.org",))
    assert ChildOptions.from_dict(json.loads(json.dumps(options.to_dict()))) == options
    assert ChildOptions.from_dict(None) == ChildOptions()
    assert ChildOptions.from_dict({"log_level": "ERROR", "unknown": 1}).log_level == "ERROR"


def test_history_on_reaches_the_context_stores_only() -> None:
    options = ChildOptions(store_root="/s", store_history=True)
    assert options.arguments(Role.CONTEXT_STORE, 1)[-2:] == ["--history", "on"]
    assert "--history" not in options.arguments(Role.MATCHER, 1)
    assert "--history" not in ChildOptions(store_root="/s").arguments(Role.CONTEXT_STORE, 1)
    assert ChildOptions.from_dict(json.loads(json.dumps(options.to_dict()))) == options
    kept = ChildOptions(store_root="/s", history_retention="raw=1d")
    assert kept.arguments(Role.CONTEXT_STORE, 1)[-2:] == ["--history-retention", "raw=1d"]
    assert "--history-retention" not in kept.arguments(Role.EXIT_POINT, 1)
    assert ChildOptions.from_dict(json.loads(json.dumps(kept.to_dict()))) == kept


def test_cors_reaches_the_connection_points_only_when_asked_for() -> None:
    options = ChildOptions(http_port=0, cors_origin="__ALL", cors_max_age=600)
    arguments = options.arguments(Role.CONNECTION_POINT, 1)
    assert arguments[arguments.index("--cors-origin") :][:4] == [
        *("--cors-origin", "__ALL"),
        *("--cors-max-age", "600"),
    ]
    assert ChildOptions.from_dict(json.loads(json.dumps(options.to_dict()))) == options
    assert "--cors-origin" not in ChildOptions(http_port=0).arguments(Role.CONNECTION_POINT, 1)


def test_an_archive_starts_an_archiver_and_turns_the_stores_recording_on(tmp_path: Path) -> None:
    spec = ClusterSpec(state_dir=tmp_path, archive="relative/archive", archive_interval=0.5)
    assert spec.counts()[Role.ARCHIVER] == 1 and ClusterSpec().counts()[Role.ARCHIVER] == 0
    options = ChildOptions.of(spec)
    root = str(Path("relative/archive").resolve())  # absolute: the children's cwd may differ
    assert options.arguments(Role.CONTEXT_STORE, 1)[-2:] == ["--archive", "on"]
    assert options.arguments(Role.ARCHIVER, 1)[-4:] == [
        *("--archive", root),
        *("--archive-interval", "0.5"),
    ]
    assert "--archive" not in options.arguments(Role.MATCHER, 1)
    assert "--archive" not in ChildOptions(store_root="/s").arguments(Role.CONTEXT_STORE, 1)
    assert ChildOptions.from_dict(json.loads(json.dumps(options.to_dict()))) == options
    uri = "s3://bucket/archive?region=eu-west-1"  # a URI as given; a file:// one is a path
    for given, kept in ((uri, uri), (f"file://{tmp_path}/a%20b", f"{tmp_path}/a b")):
        archiver = ChildOptions.of(ClusterSpec(state_dir=tmp_path, archive=given))
        assert archiver.arguments(Role.ARCHIVER, 1)[-4:-2] == ["--archive", kept]
