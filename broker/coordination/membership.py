"""Membership: each broker process announces itself with an ephemeral znode while it lives.

Layout (under the cluster's chroot)::

    /members/<role>/<role>-<token>-<sequence>    ephemeral, sequential; JSON data:
        {"role": "matcher", "address": "10.0.0.7:7003", "pid": 4242, "started": 1763750000.5,
         "metrics": "10.0.0.7:9103"}     (metrics: optional)

``<token>`` is random per registration, so a create whose reply was lost to a connection drop
is recognised on retry instead of leaving a duplicate (kazoo's lock recipe does the same).
``<sequence>`` (ZooKeeper's ten digits) orders the members of a role by registration time.

A :class:`Membership`'s states::

    UNREGISTERED --register()--> REGISTERED <--CONNECTED (same session)-- SUSPENDED
                                    |   ^                                     ^
                                    |   +------- CONNECTED, znode re-created --+-- LOST
                                    +--- connection SUSPENDED -----------------+    ^
                                    +--- session LOST (znode deleted) ---------------+
    any --leave()--> LEFT

- REGISTERED: our znode exists.
- SUSPENDED: no connection; the znode exists if the session survives, which we cannot know.
- LOST: the session expired and the server deleted the znode. On the next CONNECTED (a new
  session) the recipe creates a new znode (same data, new sequence number), on a worker
  thread, then returns to REGISTERED; a failure there leaves it LOST until the next CONNECTED.
- LEFT: :meth:`Membership.leave` deleted the znode; nothing is re-created any more.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError
from kazoo.protocol.states import KazooState
from kazoo.recipe.watchers import ChildrenWatch

from broker.coordination.errors import CoordinationError, CorruptCoordinationData, translated
from broker.errors import InvalidIdentifier

__all__ = [
    "MEMBERS",
    "Member",
    "MembersWatch",
    "Membership",
    "MembershipState",
    "members",
    "watch_members",
]

MEMBERS = "/members"

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Member:
    """One registered process: its role, addresses, pid, start time and znode name.

    ``address`` is where its peers call its internal services; a connection point serves its
    clients on a listener of its own, ``client`` (empty for the other roles).
    """

    role: str
    address: str
    pid: int
    started: float  # seconds since the epoch (time.time()) when the process started
    name: str = ""  # the znode's name; empty until registered
    metrics: str = ""  # host:port of its Prometheus endpoint; empty if it serves none
    client: str = ""  # host:port of its client API (connection points only)

    @property
    def endpoint(self) -> str:
        """Where a user reaches it: the client address of a connection point, else ``address``."""
        return self.client or self.address

    @property
    def sequence(self) -> int:
        """ZooKeeper's sequence number of the znode (registration order within the role)."""
        return int(self.name.rsplit("-", 1)[-1])

    @property
    def path(self) -> str:
        """The znode's path, relative to the cluster's chroot."""
        return f"{MEMBERS}/{self.role}/{self.name}"

    def encode(self) -> bytes:
        """The znode's JSON data."""
        body = {
            "role": self.role,
            "address": self.address,
            "pid": self.pid,
            "started": self.started,
        }
        if self.metrics:
            body["metrics"] = self.metrics
        if self.client:
            body["client"] = self.client
        return json.dumps(body, sort_keys=True).encode()

    @classmethod
    def decode(cls, name: str, data: bytes) -> Member:
        """The member a znode describes; CorruptCoordinationData if its data is not readable."""
        try:
            body = json.loads(data)
            member = cls(
                role=_expect(body, "role", str),
                address=_expect(body, "address", str),
                pid=_expect(body, "pid", int),
                started=float(_expect(body, "started", (int, float))),
                name=name,
                metrics=str(body.get("metrics", "")),
                client=str(body.get("client", "")),
            )
            member.sequence  # noqa: B018 - checks the name ends in a sequence number
        except (ValueError, TypeError, KeyError) as exc:
            raise CorruptCoordinationData(f"member znode {name!r} is unreadable: {exc}") from exc
        return member


class MembershipState(enum.Enum):
    """Where a :class:`Membership` is (transitions in the module doc)."""

    UNREGISTERED = "unregistered"
    REGISTERED = "registered"
    SUSPENDED = "suspended"
    LOST = "lost"
    LEFT = "left"


MembershipCallback = Callable[[MembershipState], None]


class Membership:
    """Keeps this process registered under ``/members/<role>/`` for as long as it lives.

    ``on_change`` (optional) is called with each new state, from kazoo's threads: it must
    return quickly. Use as a context manager, or call :meth:`register` and :meth:`leave`.
    """

    def __init__(
        self,
        client: KazooClient,
        role: str,
        address: str,
        *,
        pid: int | None = None,
        started: float | None = None,
        metrics: str = "",
        client_address: str = "",
        on_change: MembershipCallback | None = None,
    ) -> None:
        _check_role(role)
        self._client = client
        self._template = Member(
            role=role,
            address=address,
            pid=os.getpid() if pid is None else pid,
            started=time.time() if started is None else started,
            metrics=metrics,
            client=client_address,
        )
        self._on_change = on_change
        self._cond = threading.Condition()
        self._state = MembershipState.UNREGISTERED
        self._member: Member | None = None
        self._registering = False
        self._generation = 0  # bumped on every LOST; a re-registration of an older one is stale

    @property
    def state(self) -> MembershipState:
        """The current state."""
        return self._state

    @property
    def member(self) -> Member | None:
        """This process's registration (None until registered, and after leave)."""
        return self._member

    def register(self) -> Member:
        """Create the znode and start following the session; ZooKeeperUnavailable on failure."""
        with self._cond:
            if self._state is not MembershipState.UNREGISTERED or self._registering:
                raise CoordinationError(f"membership is {self._state.value}; register it once")
            self._registering = True
            generation = self._generation
        self._client.add_listener(self._listener)
        try:
            # No lock held across ZooKeeper calls: the listener takes it on kazoo's thread.
            member = self._create()
        except BaseException:
            self._client.remove_listener(self._listener)
            raise
        finally:
            with self._cond:
                self._registering = False
        with self._cond:
            if generation == self._generation:
                self._set(MembershipState.REGISTERED, member)
            else:  # the session was lost while creating: the znode is already gone
                self._set(MembershipState.LOST, None)
                if self._client.connected:
                    self._client.handler.spawn(self._reregister, self._generation)
        return member

    def leave(self, *, within: float | None = None) -> None:
        """Delete the znode and stop re-registering; idempotent. ``within``: give the delete
        that many seconds (ZooKeeperUnavailable after): a stopping process cut off from
        ZooKeeper waited in it until its supervisor's stop grace ran out."""
        with self._cond:
            if self._state in (MembershipState.LEFT, MembershipState.UNREGISTERED):
                self._state = MembershipState.LEFT
                return
            member = self._member
            self._set(MembershipState.LEFT, None)
        self._client.remove_listener(self._listener)
        if member is not None:
            # NoNodeError: the session already ended, and the znode with it.
            with translated(f"delete member {member.path}"), contextlib.suppress(NoNodeError):
                if within is None:
                    self._client.retry(self._client.delete, member.path)
                else:  # kazoo queues a call while it reconnects: a retry's deadline never ends it
                    self._client.delete_async(member.path).get(timeout=within)

    def wait_for(self, state: MembershipState, *, timeout: float) -> bool:
        """Wait until the membership is in ``state``; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._state is state, timeout)

    def __enter__(self) -> Membership:
        self.register()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.leave()

    # -- private helpers --------------------------------------------------------------------

    def _create(self) -> Member:
        """Create the znode (retrying; a lost reply is recognised by the token)."""
        role_path = f"{MEMBERS}/{self._template.role}"
        prefix = f"{self._template.role}-{uuid.uuid4().hex}-"
        data = self._template.encode()

        def attempt() -> str:
            self._client.ensure_path(role_path)
            for child in self._client.get_children(role_path):
                if child.startswith(prefix):
                    return f"{role_path}/{child}"
            path: str = self._client.create(
                f"{role_path}/{prefix}", data, ephemeral=True, sequence=True
            )
            return path

        with translated(f"register as a {self._template.role}"):
            path = self._client.retry(attempt)
        name = path.rsplit("/", 1)[-1]
        return dataclasses.replace(self._template, name=name)

    def _listener(self, kazoo_state: str) -> None:
        # On kazoo's connection thread: no ZooKeeper calls here.
        with self._cond:
            if self._state is MembershipState.LEFT:
                return
            if kazoo_state == KazooState.SUSPENDED and self._state is MembershipState.REGISTERED:
                self._set(MembershipState.SUSPENDED, self._member)
            elif kazoo_state == KazooState.LOST:
                self._generation += 1
                if self._state is not MembershipState.UNREGISTERED:
                    self._set(MembershipState.LOST, None)
            elif kazoo_state == KazooState.CONNECTED:
                if self._state is MembershipState.SUSPENDED:
                    self._set(MembershipState.REGISTERED, self._member)
                elif self._state is MembershipState.LOST:
                    self._client.handler.spawn(self._reregister, self._generation)

    def _reregister(self, generation: int) -> None:
        try:
            member = self._create()
        except Exception:
            _log.exception("re-registering %s failed; will retry on reconnection", self._template)
            return
        with self._cond:
            if self._state is MembershipState.LOST and generation == self._generation:
                self._set(MembershipState.REGISTERED, member)
                return
        # Stale: we left, or another re-registration won, or the session was lost again.
        _log.info("discarding stale re-registration %s", member.path)
        # It may be gone with its session already, or ZooKeeper may be away: both are fine.
        with contextlib.suppress(Exception):
            self._client.delete(member.path)

    def _set(self, state: MembershipState, member: Member | None) -> None:
        # Precondition: self._cond is held.
        changed = state is not self._state
        self._state, self._member = state, member
        self._cond.notify_all()
        if changed and self._on_change is not None:
            try:
                self._on_change(state)
            except Exception:
                _log.exception("membership callback failed on %s", state.name)


def members(client: KazooClient, role: str | None = None) -> list[Member]:
    """The registered members of ``role`` (of every role if None), by role then sequence.

    A znode with unreadable data is logged and left out, so one bad entry cannot hide the
    rest of the cluster.
    """
    with translated("list the members"):
        roles = [role] if role is not None else _children(client, MEMBERS)
        found = [
            m for r in roles for m in _read_role(client, r, _children(client, f"{MEMBERS}/{r}"))
        ]
    return sorted(found, key=lambda m: (m.role, m.sequence))


MembersCallback = Callable[[list[Member]], None]


class MembersWatch:
    """Calls back with the members of one role now and after every change, until stopped.

    The callback runs in kazoo's callback thread (the first time, in the caller's thread);
    after a lost session the watch is re-established and called again with the new list.
    """

    def __init__(self, client: KazooClient, role: str, callback: MembersCallback) -> None:
        _check_role(role)
        self._client = client
        self._role = role
        self._callback = callback
        self._stopped = False
        with translated(f"watch the members of {role}"):
            client.ensure_path(f"{MEMBERS}/{role}")
            self._watch = ChildrenWatch(client, f"{MEMBERS}/{role}", self._changed)

    def stop(self) -> None:
        """Stop calling back (takes effect at the next change at the latest)."""
        self._stopped = True

    def _changed(self, children: list[str]) -> bool:
        if self._stopped:
            return False
        try:
            with translated(f"read the members of {self._role}"):
                current = _read_role(self._client, self._role, children)
        except Exception:
            _log.exception("reading the members of %s failed", self._role)
            return True
        self._callback(sorted(current, key=lambda m: m.sequence))
        return not self._stopped


def watch_members(client: KazooClient, role: str, callback: MembersCallback) -> MembersWatch:
    """Call ``callback(members)`` with the members of ``role`` now and after every change."""
    return MembersWatch(client, role, callback)


def _children(client: KazooClient, path: str) -> list[str]:
    try:
        children: list[str] = client.retry(client.get_children, path)
    except NoNodeError:
        return []
    return children


def _read_role(client: KazooClient, role: str, names: list[str]) -> list[Member]:
    found = []
    for name in names:
        try:
            data, _stat = client.retry(client.get, f"{MEMBERS}/{role}/{name}")
            found.append(Member.decode(name, data))
        except NoNodeError:
            continue  # left between the listing and the read
        except CorruptCoordinationData as exc:
            _log.warning("ignoring member: %s", exc)
    return found


def _check_role(role: str) -> None:
    if not isinstance(role, str) or not role or "/" in role or role in {".", ".."}:
        raise InvalidIdentifier(f"role {role!r} is not usable as a znode name")


def _expect(body: Any, key: str, kind: type | tuple[type, ...]) -> Any:
    value = body[key]
    if not isinstance(value, kind) or isinstance(value, bool):
        raise TypeError(f"{key} is {type(value).__name__}, not {kind}")
    return value
