"""Running one broker process: ZooKeeper, the gRPC server, membership, signals, shutdown.

The order of a process's life:

1. connect to ZooKeeper (the cluster's chroot); unreachable within ``zk_timeout`` seconds is
   a clear ZooKeeperUnavailable, not a hang;
2. bind the gRPC server (a taken port is a clear AddressInUse) and the metrics endpoint;
3. register in ``/members/<role>/`` with the advertised address, then start the role and
   the server;
4. serve until SIGTERM or SIGINT; then leave the membership (peers stop sending), stop the
   role (it drains its links), stop the server, close the ZooKeeper session.

kazoo's SUSPENDED state is logged and the data path (gRPC) never waits on ZooKeeper. A
process whose registration is gone, because its session expired (a hang past the session
timeout, ZooKeeper away too long) or because its member znode was deleted (a repair or a
supervisor declared it dead: broker.coordination.repair), is *fenced*: the configuration no
longer counts on it and it may have missed what happened meanwhile, so it stops at once and
exits with ``EXIT_FENCED`` (75); its supervisor starts a new process, which joins as a new
member.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import grpc
from kazoo.client import KazooClient
from kazoo.recipe.watchers import DataWatch

from broker.coordination.client import CLOSE_WITHIN, ConnectionStateWatcher, close, connect
from broker.coordination.errors import CoordinationError
from broker.coordination.membership import Member, Membership, MembershipState
from broker.coordination.repair import Repairer
from broker.errors import AddressInUse
from broker.runtime.link import SERVER_OPTIONS
from broker.runtime.liveness import PeerWatch
from broker.runtime.load import Load, LoadSample
from broker.runtime.metrics import ProcessMetrics
from broker.runtime.options import ProcessOptions, parse_address
from broker.runtime.token import TokenCheck, cluster_token
from broker.wire import internal_pb2 as wire
from broker.wire import internal_pb2_grpc as wire_grpc

__all__ = ["AddressInUse", "ProcessContext", "RoleService", "run_process", "serve"]

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ProcessContext:
    """What a role gets from the process that runs it."""

    options: ProcessOptions
    zk: KazooClient
    member: Member
    metrics: ProcessMetrics
    loop: asyncio.AbstractEventLoop

    @property
    def name(self) -> str:
        """This process's member name (unique in the cluster)."""
        return self.member.name

    @property
    def load(self) -> Load:
        """This process's load meter and rate cap (broker.runtime.load)."""
        return self.metrics.load

    def hello(self) -> bytes:
        """The Hello every internal stream of this process opens with (a serialized Batch)."""
        role = self.options.role.value
        return wire.Batch(hello=wire.Hello(sender=self.name, role=role)).SerializeToString()


class RoleService(Protocol):
    """One layer's behaviour inside a process."""

    def add_to(self, server: grpc.aio.Server) -> None:
        """Add the role's gRPC services to the server (before it starts)."""

    async def start(self, context: ProcessContext) -> None:
        """Start watching peers and opening links (the process is registered)."""

    async def stop(self) -> None:
        """Drain and close the role's links."""

    def status(self) -> tuple[int, int]:
        """``(epoch, subscriptions held or open)`` for ``silbo admin status``."""


@runtime_checkable
class ServesClients(Protocol):
    """A role with a client API (the connection point), served on a listener of its own."""

    def add_client_to(self, server: grpc.aio.Server) -> None:
        """Add the client services to the client server (before it starts)."""


class _AdminServicer(wire_grpc.AdminServicer):
    def __init__(self, role: RoleService, metrics: ProcessMetrics) -> None:
        self._role = role
        self._metrics = metrics
        self.member: Member | None = None

    async def Status(
        self, request: wire.StatusRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> wire.ProcessStatus:
        epoch, subscriptions = self._role.status()
        member = self.member
        return wire.ProcessStatus(
            name=member.name if member else "",
            role=member.role if member else "",
            address=member.address if member else "",
            pid=os.getpid(),
            epoch=epoch,
            subscriptions=subscriptions,
            load=_load_message(self._metrics.show_load()),
            counters=self._metrics.totals(),
            metrics=member.metrics if member else "",
        )


def _load_message(sample: LoadSample) -> wire.Load:
    return wire.Load(
        window=sample.window,
        busy_fraction=sample.busy_fraction,
        input_rate=sample.input_rate,
        output_rate=sample.output_rate,
        true_rate=sample.true_rate,
        queue_depth=sample.queue_depth,
        queue_age=sample.queue_age,
        busy_seconds=sample.busy_seconds,
        items_in=sample.items_in,
        items_out=sample.items_out,
        max_rate=sample.max_rate,
        held_fraction=sample.held_fraction,
        items_held=sample.items_held,
    )


EXIT_FENCED = 75  # the registration was lost: start again as a new member
LOAD_REFRESH = 1.0  # seconds between two refreshes of the load gauges
# seconds a stopping process gives the delete of its registration: cut off from ZooKeeper
# (restarted under a loaded machine) it waited the client's 10-s retry deadline, past its
# supervisor's stop grace
LEAVE_WITHIN = 2.0
EXECUTOR_WITHIN = 1.0  # seconds a stopped process waits for its to_thread calls still running


def run_process(options: ProcessOptions, make_role: Callable[[], RoleService]) -> int:
    """Run a process until SIGTERM or SIGINT; the exit status (0 after a clean stop).

    With ``SILBO_PROFILE=DIR`` in the environment the whole run is profiled (cProfile) and
    the statistics written to ``DIR/<role>-<pid>.prof`` at exit (for performance work).
    """
    # A broker process allocates many short-lived objects per batch and holds long-lived
    # indexes: collect the young generation less often, and never rescan what start-up built.
    gc.set_threshold(50_000, 20, 50)
    profile_dir = os.environ.get("SILBO_PROFILE")
    if not profile_dir:
        status = _run(serve(options, make_role))
        _exit_if_held(status)
        return status
    import cProfile

    profiler = cProfile.Profile()
    try:
        return profiler.runcall(asyncio.run, serve(options, make_role))
    finally:
        profiler.dump_stats(os.path.join(profile_dir, f"{options.role.value}-{os.getpid()}.prof"))


def _run(main: Coroutine[Any, Any, int]) -> int:
    """``asyncio.run(main)``, but waiting EXECUTOR_WITHIN seconds at most for the threads of
    ``asyncio.to_thread`` calls still running: one blocked in a ZooKeeper call (a ZooKeeper
    restarted under load that does not answer) held a stopping process until kazoo gave up,
    about 10 s (a CI run's foreground ``silbo up`` took 9.5 s to stop so)."""
    loop = asyncio.new_event_loop()
    executor = ThreadPoolExecutor(thread_name_prefix="to-thread")
    loop.set_default_executor(executor)
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(main)
    finally:
        try:
            left = asyncio.all_tasks(loop)
            for task in left:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            # not loop.shutdown_default_executor(): it joins the executor's threads, unbounded
            waiting = threading.Thread(
                target=executor.shutdown, name="executor-shutdown", daemon=True
            )
            waiting.start()
            waiting.join(EXECUTOR_WITHIN)
        finally:
            asyncio.set_event_loop(None)
            loop.close()


def _exit_if_held(status: int) -> None:
    """Exit now with ``status`` if a thread would hold the interpreter's exit (the executor's
    threads are joined at exit): every step of the stop is done and bounded, and what such a
    thread waits for (ZooKeeper) ends with the process anyway."""
    held = [
        t.name
        for t in threading.enumerate()
        if t is not threading.main_thread() and not t.daemon and t.is_alive()
    ]
    if held:
        _log.warning("exiting although threads still wait: %s", ", ".join(held))
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)


async def serve(
    options: ProcessOptions,
    make_role: Callable[[], RoleService],
    *,
    stop: asyncio.Event | None = None,
    ready: Callable[[Member], None] | None = None,
) -> int:
    """Run a process in the running loop until ``stop`` is set (or a signal arrives)."""
    loop = asyncio.get_running_loop()
    stop = stop or asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    zk = await asyncio.to_thread(
        connect, options.zk, cluster=options.cluster, timeout=options.zk_timeout
    )
    watcher = ConnectionStateWatcher(zk)
    watcher.on(None, lambda state: _log.warning("ZooKeeper connection: %s", state.value))
    metrics = ProcessMetrics(options.role.value, Load(max_rate=options.max_rate))
    role = make_role()
    # no SO_REUSEPORT: a port another process holds must be an error, not a shared port
    token = cluster_token()
    server = grpc.aio.server(  # the internal services
        options=(*SERVER_OPTIONS, ("grpc.so_reuseport", 0)),
        interceptors=[TokenCheck(token)] if token else None,
    )
    admin = _AdminServicer(role, metrics)
    wire_grpc.add_AdminServicer_to_server(admin, server)  # type: ignore[no-untyped-call]
    role.add_to(server)
    clients = None  # a connection point's client API, on a listener of its own
    if isinstance(role, ServesClients):
        clients = grpc.aio.server(options=(*SERVER_OPTIONS, ("grpc.so_reuseport", 0)))
        role.add_client_to(clients)
    try:
        if clients is None:
            address = _bind(server, options.listen, options.advertise, "--listen")
            client_address = ""
        else:
            client_address = _bind(clients, options.listen, options.advertise, "--listen")
            internal = (
                options.internal_listen or f"{parse_address(options.listen, '--listen')[0]}:0"
            )
            advertised = (
                options.advertise and f"{parse_address(options.advertise, '--advertise')[0]}:0"
            )
            address = _bind(server, internal, advertised, "--internal-listen")
        metrics_address = metrics.serve(options.metrics_listen) if options.metrics_listen else ""
        fenced = asyncio.Event()

        def lost(state: MembershipState) -> None:  # kazoo's thread
            if state is MembershipState.LOST:
                loop.call_soon_threadsafe(fenced.set)

        membership = Membership(
            zk,
            options.role.value,
            address,
            metrics=metrics_address,
            client_address=client_address,
            on_change=lost,
        )
        member = await asyncio.to_thread(membership.register)
        watch_own = DataWatch(zk, member.path, _gone(loop, fenced))
        admin.member = member
        context = ProcessContext(options, zk, member, metrics, loop)
        await role.start(context)
        await server.start()
        if clients is not None:
            await clients.start()
        repairer = Repairer(zk, member.name)
        repairer.start()
        peers = (
            PeerWatch(zk, member.name, repairer.leader, hang_after=options.peer_hang_after)
            if options.peer_hang_after > 0
            else None
        )
        showing = loop.create_task(_show_load(metrics), name="load gauges")
        gc.freeze()  # what start-up built lives as long as the process
        _log.info(
            "%s %s serving on %s%s",
            options.role.value,
            member.name,
            address,
            f" (clients on {client_address})" if client_address else "",
        )
        if ready is not None:
            ready(member)
        await _first(stop.wait(), fenced.wait())
        if fenced.is_set() and not stop.is_set():
            _log.error(
                "%s %s is fenced (its registration is gone): exiting",
                options.role.value,
                member.name,
            )
            repairer.stop()
            os._exit(EXIT_FENCED)  # nothing of this process may act any more
        _log.info("%s %s stopping", options.role.value, member.name)
        showing.cancel()
        del watch_own
        if peers is not None:
            await asyncio.to_thread(peers.close)  # it waits for a probe round: not on the loop
        repairer.stop()
        try:
            await asyncio.to_thread(membership.leave, within=LEAVE_WITHIN)
        except CoordinationError as exc:  # its session's end removes the registration
            _log.warning("leaving the cluster: %s", exc)
        await role.stop()
        if clients is not None:
            await clients.stop(grace=2.0)
        await server.stop(grace=2.0)
    finally:
        watcher.close()
        await asyncio.to_thread(close, zk, CLOSE_WITHIN)
    return 0


async def _show_load(metrics: ProcessMetrics) -> None:
    """Refresh the load gauges (a Prometheus scrape runs on a thread of its own and reads
    them; the load itself is the event loop's)."""
    while True:
        metrics.show_load()
        await asyncio.sleep(LOAD_REFRESH)


async def _first(*waits: Coroutine[Any, Any, Any]) -> None:
    tasks = [asyncio.ensure_future(w) for w in waits]
    await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    for task in tasks:
        task.cancel()


def _gone(
    loop: asyncio.AbstractEventLoop, fenced: asyncio.Event
) -> Callable[[bytes | None, object], bool]:
    """A DataWatch callback setting ``fenced`` once the watched znode is deleted."""

    def changed(data: bytes | None, _stat: object) -> bool:
        if data is None:
            loop.call_soon_threadsafe(fenced.set)
            return False
        return True

    return changed


def _bind(server: grpc.aio.Server, listen: str, advertise: str, flag: str) -> str:
    """Bind ``server`` to ``listen``; the address others use (``advertise``'s host and port,
    its port 0 or none standing for the port bound)."""
    host, _port = parse_address(listen, flag)
    try:
        bound = server.add_insecure_port(listen)
    except RuntimeError as exc:
        raise AddressInUse(
            f"cannot listen on {listen}: the port is in use or the address is not "
            f"this host's (pick another with {flag} HOST:PORT, or port 0 for any)"
        ) from exc
    if bound == 0:
        raise AddressInUse(f"cannot listen on {listen}: the port is in use")
    if advertise:
        adv_host, adv_port = parse_address(advertise, "--advertise")
        return f"{adv_host}:{adv_port or bound}"
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    return f"{host}:{bound}"


def _internal(options: ProcessOptions) -> tuple[str, str]:
    """A connection point's internal listener and advertised address (any port by default,
    on the client listener's and advertised hosts)."""
    listen = options.internal_listen or f"{parse_address(options.listen, '--listen')[0]}:0"
    advertise = ""
    if options.advertise:
        advertise = f"{parse_address(options.advertise, '--advertise')[0]}:0"
    return listen, advertise
