"""compose/docker-compose.yml brought up for real: a notification crosses every layer.

With testcontainers' ``DockerCompose`` this builds the broker image, starts the whole stack
(ZooKeeper ensemble, the four broker layers, ``silbo admin init``, Spark), waits until ``init``
has exited 0 and the connection point accepts connections on localhost:7777, then runs
``silbo subscribe --count 1`` and publishes a matching update until the subscriber has
printed the notification and exited 0.

It needs a Docker engine and the ``docker compose`` plugin; without them (as on the
development machine) it is skipped, with the reason, not failed.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from testcontainers.compose import DockerCompose

pytestmark = pytest.mark.slow

COMPOSE_DIR = Path(__file__).resolve().parents[2] / "compose"
PROJECT = "silbo-compose-test"  # not the file's own `name: silbo`, so a running stack is spared
CONNECT = "localhost:7777"
ENTITY = "Room1"

# The client CLI contract (`silbo publish` / `silbo subscribe`).
SUBSCRIBE = ["subscribe", "--connect", CONNECT, "--type", "Room", "--count", "1"]
PUBLISH = ["publish", "--connect", CONNECT, "--entity", ENTITY, "--type", "Room", "temperature=21"]

READY_TIMEOUT = 300.0  # after `up` returns (the image is built by then)
DELIVERY_TIMEOUT = 90.0


def docker_unavailable() -> str | None:
    """Why the stack cannot be started here (no CLI, no engine, no compose), or None."""
    docker = shutil.which("docker")
    if docker is None:
        return "no Docker engine reachable (no `docker` CLI on PATH)"
    try:
        info = subprocess.run(
            [docker, "info"], capture_output=True, text=True, timeout=10, check=False
        )
    except subprocess.TimeoutExpired:
        return "no Docker engine reachable (docker info did not answer within 10 s)"
    if info.returncode != 0:
        lines = (info.stderr or info.stdout).strip().splitlines()
        detail = lines[-1] if lines else f"exit status {info.returncode}"
        return f"no Docker engine reachable (docker info failed: {detail})"
    plugin = subprocess.run(
        [docker, "compose", "version"], capture_output=True, text=True, timeout=10, check=False
    )
    if plugin.returncode != 0:
        return "the Docker engine is reachable but `docker compose` is not installed"
    return None


def silbo(*args: str) -> list[str]:
    """The host-side ``silbo`` command line (this interpreter, so this checkout's code)."""
    return [sys.executable, "-m", "broker.cli", *args]


def logs(compose: DockerCompose) -> str:
    stdout, stderr = compose.get_logs()
    return f"--- docker compose logs ---\n{stdout}\n{stderr}"


def wait_for_init(compose: DockerCompose, deadline: float) -> None:
    """Until the one-shot ``init`` has exited; fails unless it exited 0."""
    while time.monotonic() < deadline:
        init = compose.get_container("init", include_all=True)
        if init.State == "exited":
            assert init.ExitCode == 0, f"silbo admin init exited {init.ExitCode}\n{logs(compose)}"
            return
        time.sleep(2)
    pytest.fail(f"silbo admin init did not finish in {READY_TIMEOUT:.0f} s\n{logs(compose)}")


def wait_for_port(host: str, port: int, deadline: float) -> None:
    """Until ``host:port`` accepts a TCP connection."""
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=2):
                return
        except OSError:
            time.sleep(1)
    pytest.fail(f"nothing accepts connections on {host}:{port}")


@pytest.fixture(scope="module")
def stack() -> Iterator[DockerCompose]:
    reason = docker_unavailable()
    if reason is not None:
        pytest.skip(reason)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("COMPOSE_PROJECT_NAME", PROJECT)
        compose = DockerCompose(
            context=COMPOSE_DIR, compose_file_name="docker-compose.yml", build=True, wait=False
        )
        with compose:
            deadline = time.monotonic() + READY_TIMEOUT
            wait_for_init(compose, deadline)
            host, _, port = CONNECT.rpartition(":")
            wait_for_port(host, int(port), deadline)
            yield compose


def test_a_published_update_reaches_a_subscriber(stack: DockerCompose) -> None:
    subscriber = subprocess.Popen(
        silbo(*SUBSCRIBE),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        deadline = time.monotonic() + DELIVERY_TIMEOUT
        # The subscription takes effect asynchronously: publish until it is delivered.
        while subscriber.poll() is None and time.monotonic() < deadline:
            published = subprocess.run(
                silbo(*PUBLISH), capture_output=True, text=True, timeout=30, check=False
            )
            assert published.returncode == 0, f"silbo publish failed:\n{published.stderr}"
            try:
                subscriber.wait(timeout=2)
            except subprocess.TimeoutExpired:
                continue
        if subscriber.poll() is None:
            subscriber.kill()
            out, err = subscriber.communicate(timeout=10)
            pytest.fail(
                f"no notification within {DELIVERY_TIMEOUT:.0f} s\n"
                f"subscriber stdout:\n{out}\nstderr:\n{err}\n{logs(stack)}"
            )
        out, err = subscriber.communicate(timeout=10)
    finally:
        if subscriber.poll() is None:
            subscriber.kill()
            subscriber.communicate(timeout=10)
    assert subscriber.returncode == 0, f"silbo subscribe exited {subscriber.returncode}:\n{err}"
    assert ENTITY in out, f"the notification does not name {ENTITY}:\n{out}"
