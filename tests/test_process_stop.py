"""A stopping process closes its ZooKeeper client within a bound, whatever ZooKeeper does:
a client whose connection thread waits in a read for a ZooKeeper that does not answer (one
restarted on a loaded machine) held kazoo's stop up to 10 s (a CI run's access point took
9.9 s to stop, near its supervisor's 10-s grace)."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time

from kazoo.client import KazooClient

from broker.coordination.client import close


def _stuck_client(listener: socket.socket) -> tuple[KazooClient, socket.socket]:
    """A client connected to ``listener``, which accepts and never answers its handshake."""
    port = listener.getsockname()[1]
    zk = KazooClient(hosts=f"127.0.0.1:{port}", timeout=10.0)
    zk.start_async()
    accepted, _ = listener.accept()
    accepted.recv(1024)  # its connect request: the client now waits in a read for an answer
    return zk, accepted


def test_a_client_waiting_for_a_silent_zookeeper_is_closed_within_the_bound() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.settimeout(10)
        zk, accepted = _stuck_client(listener)
        with accepted:
            began = time.monotonic()
            close(zk, within=1.0)
            took = time.monotonic() - began
            # kazoo's own stop still waits for the read (so the bound is what ended it)
            assert any(t.name == "zookeeper-close" for t in threading.enumerate())
        assert took < 2.5, f"closing took {took:.1f} s"


_HELD = """
import asyncio, threading, time
from broker.runtime.process import _exit_if_held, _run

async def main() -> int:
    release = threading.Event()
    asyncio.get_running_loop().run_in_executor(None, release.wait, 60)  # never released
    await asyncio.sleep(0.1)
    return 3

_exit_if_held(_run(main()))
"""


def test_a_thread_still_waiting_does_not_hold_the_exit() -> None:
    """A stopped process whose executor thread still waits (on a ZooKeeper that does not
    answer, say) exits within a second or two with its status, not when the thread gives up
    (a CI run's foreground ``silbo up`` took 9.5 s to stop so)."""
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-c", _HELD], capture_output=True, timeout=60)
    took = time.monotonic() - began
    assert done.returncode == 3, done.stderr.decode()[-2000:]
    assert took < 10.0, f"the exit took {took:.1f} s"
    assert b"threads still wait" in done.stderr
