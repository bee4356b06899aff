"""Connecting to ZooKeeper for one Silbo cluster, and watching the connection's state.

Every cluster lives under its own chroot, ``/silbo/<cluster>``: a client from :func:`connect`
sees that znode as ``/``, so two clusters sharing a ZooKeeper never see each other's znodes.

The connection's states (kazoo's, mirrored by :class:`ConnectionState`)::

                 connection dropped                  session expired (or client stopped)
    CONNECTED ---------------------------> SUSPENDED -----------------------------------> LOST
        ^                                      |                                          |
        +------- reconnected in time: ---------+                                          |
        |        same session, ephemeral znodes and watches intact                        |
        +------- reconnected: a NEW session; the old session's ephemerals are gone -------+

- CONNECTED: operations work; ephemeral znodes of this session exist.
- SUSPENDED: no connection, but the session may still be alive on the server. Do not assume
  anything you hold (a membership, a lock) is still yours; do not write until CONNECTED.
- LOST: the session is gone for good; everything ephemeral it held was deleted. Kazoo keeps
  reconnecting, and the next CONNECTED is a fresh session: recipes that own ephemeral znodes
  (e.g. :class:`broker.coordination.membership.Membership`) re-create them then.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from kazoo.client import KazooClient
from kazoo.retry import KazooRetry

from broker.coordination.errors import ZooKeeperUnavailable, translated
from broker.errors import InvalidIdentifier, InvalidInput

__all__ = [
    "ROOT",
    "ConnectionState",
    "ConnectionStateWatcher",
    "StateCallback",
    "Transition",
    "chroot_of",
    "connect",
]

ROOT = "/silbo"
CLOSE_WITHIN = 1.5  # seconds a process about to stop or exit waits for a client to close

_log = logging.getLogger(__name__)


class ConnectionState(enum.Enum):
    """A ZooKeeper connection's state (transitions in the module doc)."""

    CONNECTED = "CONNECTED"
    SUSPENDED = "SUSPENDED"
    LOST = "LOST"


StateCallback = Callable[[ConnectionState], None]


@dataclass(frozen=True, slots=True)
class Transition:
    """One state change: the state entered and when (``time.monotonic()``)."""

    state: ConnectionState
    at: float


def chroot_of(cluster: str) -> str:
    """The chroot path of ``cluster``; InvalidIdentifier if the name cannot be a znode name."""
    if (
        not isinstance(cluster, str)
        or not cluster
        or cluster in {".", "..", "zookeeper"}
        or "/" in cluster
        or any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in cluster)
    ):
        raise InvalidIdentifier(
            f"cluster name {cluster!r} is not usable as a znode name "
            "(non-empty, no '/', no control characters, not '.', '..' or 'zookeeper')"
        )
    return f"{ROOT}/{cluster}"


def connect(
    hosts: str,
    *,
    cluster: str,
    timeout: float,
    session_timeout: float = 10.0,
) -> KazooClient:
    """A started client whose root is ``/silbo/<cluster>`` (created first if missing).

    ``hosts`` is kazoo's ``host:port[,host:port...]`` without a chroot. ``timeout`` bounds the
    whole call (both connections and the chroot creation); when ZooKeeper does not answer
    within it, ZooKeeperUnavailable is raised and no client is left running.
    ``session_timeout`` is the session's lifetime without a connection, which the server
    clamps to between 2 and 20 of its ticks.
    """
    chroot = chroot_of(cluster)
    if "/" in hosts:
        raise InvalidInput(f"hosts {hosts!r} must not carry a chroot; name the cluster instead")
    deadline = time.monotonic() + timeout
    bootstrap = _start(hosts, deadline, timeout, session_timeout)
    try:
        with translated(f"create the cluster root {chroot}"):
            bootstrap.ensure_path(chroot)
    finally:
        _close(bootstrap)
    return _start(hosts + chroot, deadline, timeout, session_timeout)


class ConnectionStateWatcher:
    """Records a client's connection-state transitions and calls back on them.

    Callbacks run on kazoo's connection thread, in registration order: they must return
    quickly and never call ZooKeeper themselves (hand the work to another thread, e.g.
    ``client.handler.spawn``). A callback that raises is logged and skipped.
    """

    def __init__(self, client: KazooClient) -> None:
        self._client = client
        self._cond = threading.Condition()
        self._callbacks: list[tuple[ConnectionState | None, StateCallback]] = []
        self._transitions: list[Transition] = []
        self._state = ConnectionState(client.state)
        client.add_listener(self._listener)

    @property
    def state(self) -> ConnectionState:
        """The state most recently entered."""
        return self._state

    @property
    def transitions(self) -> list[Transition]:
        """Every transition seen since this watcher was created, oldest first (a copy)."""
        with self._cond:
            return list(self._transitions)

    def states(self, *, after: int = 0) -> list[ConnectionState]:
        """The states entered, from transition number ``after`` on."""
        with self._cond:
            return [t.state for t in self._transitions[after:]]

    def on(self, state: ConnectionState | None, callback: StateCallback) -> None:
        """Call ``callback(state)`` on every transition into ``state`` (None: into any state)."""
        with self._cond:
            self._callbacks.append((state, callback))

    def wait_for(self, state: ConnectionState, *, after: int = 0, timeout: float) -> bool:
        """Wait until a transition into ``state`` numbered ``after`` or later has happened."""
        with self._cond:
            return self._cond.wait_for(
                lambda: any(t.state is state for t in self._transitions[after:]), timeout
            )

    def close(self) -> None:
        """Stop watching (callbacks are no longer called)."""
        self._client.remove_listener(self._listener)

    def _listener(self, kazoo_state: str) -> None:
        state = ConnectionState(kazoo_state)
        with self._cond:
            self._state = state
            self._transitions.append(Transition(state, time.monotonic()))
            callbacks = [cb for wanted, cb in self._callbacks if wanted in (None, state)]
            self._cond.notify_all()
        for callback in callbacks:
            try:
                callback(state)
            except Exception:
                _log.exception("connection state callback %r failed on %s", callback, state.name)


def _start(hosts: str, deadline: float, timeout: float, session_timeout: float) -> KazooClient:
    """A started client on ``hosts``, or ZooKeeperUnavailable when ``deadline`` passes first."""
    try:
        client = KazooClient(
            hosts=hosts,
            timeout=session_timeout,
            # Reconnect forever, quickly: a broker process waits for ZooKeeper, never gives up.
            connection_retry=KazooRetry(max_tries=-1, delay=0.1, backoff=2, max_delay=2.0),
            command_retry=KazooRetry(
                max_tries=-1, delay=0.1, backoff=2, max_delay=2.0, deadline=session_timeout
            ),
        )
    except ValueError as exc:
        raise InvalidInput(f"ZooKeeper hosts {hosts!r} are malformed: {exc}") from exc
    remaining = deadline - time.monotonic()
    connected = client.start_async()
    connected.wait(max(remaining, 0.001))
    if not client.connected:
        # kazoo's own start(timeout) stops the client in this thread, and stopping joins a
        # connection thread that may wait a whole session timeout for a server that accepted
        # the TCP connection but never answers: give up now, clean up in the background.
        threading.Thread(target=_close_quietly, args=(client,), daemon=True).start()
        raise ZooKeeperUnavailable(f"ZooKeeper at {hosts} did not answer within {timeout:g} s")
    return client


def _close_quietly(client: KazooClient) -> None:
    try:
        _close(client)
    except Exception:  # best effort: the session ends with the process or its timeout anyway
        _log.debug("closing a ZooKeeper client failed", exc_info=True)


def _close(client: KazooClient) -> None:
    client.stop()
    client.close()


def close(client: KazooClient, within: float | None = None) -> None:
    """Stop and close ``client``, best effort (its session ends with the process anyway);
    with ``within``, waiting that long at most: a connection thread reading from a ZooKeeper
    that does not answer (one restarted under load) holds kazoo's stop up to 10 s (a CI run's
    access point took 9.9 s to stop so). The closing thread is then left behind, a daemon."""
    if within is None:
        _close_quietly(client)
        return
    closing = threading.Thread(
        target=_close_quietly, args=(client,), name="zookeeper-close", daemon=True
    )
    closing.start()
    closing.join(within)
    if closing.is_alive():
        _log.warning("the ZooKeeper client did not close within %g s: going on without", within)
