"""``silbo admin``: operate a running cluster.

    silbo admin init --matchers N [--timeout S] (--state-dir DIR | --zk HOST:PORT [--cluster NAME])
    silbo admin status [--json] [--interval S] (--state-dir DIR | --zk HOST:PORT [--cluster NAME])
    silbo admin scale matchers|exit-points|access-points|connection-points|context-stores N
                      [--json] [--timeout S] (--state-dir DIR | --zk ... --cluster ...)
    silbo admin autoscale on|off|status|set [KEY=VALUE ...] [--json] [--last N]
                      (--state-dir DIR | --zk ... --cluster ...)

``init`` forms a cluster whose processes were started one by one (``silbo run``; compose/):
it waits for N matchers to register and writes the first configuration. ``status`` shows
the processes per layer, the epoch, the subscriptions each matcher holds and rates measured
over ``--interval`` seconds (each process is asked over its Admin service), and the context
stores: each one's state, partitions held and still missing. ``scale`` changes a layer's
size while traffic flows (``context-stores``: broker.roles.store_scaling). ``autoscale``
turns automatic scaling on or off, shows it (on or off, the leading controller, the policy,
the last decisions with their reasons and outcomes) or sets its policy's knobs (a bad key
or value: exit 2, every problem named; docs/autoscaling.md).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from broker.autoscale.state import AutoscaleState
from broker.cluster.operations import ROLES, ask_all, scale_to
from broker.commands.store_scale import run_store_scale
from broker.coordination.client import connect
from broker.coordination.configuration import (
    DEFAULT_REPLICAS,
    ClusterConfiguration,
    Configuration,
)
from broker.coordination.coordinator import LAYERS as SCALABLE
from broker.coordination.coordinator import ScaleOutcome
from broker.coordination.formation import form
from broker.coordination.membership import Member, members
from broker.coordination.scale import read_state
from broker.errors import InvalidInput, SilboError
from broker.roles.store_scaling import store_status
from broker.runtime.options import DEFAULT_CLUSTER
from broker.wire import internal_pb2 as wire

__all__ = [
    "cluster_address",
    "configure",
    "gather_status",
    "run_autoscale",
    "run_init",
    "run_status",
]

LAYERS = ("connection-point", "access-point", "matcher", "exit-point", "context-store")
STORE_LAYER = "context-stores"


def configure(parser: argparse.ArgumentParser) -> None:
    """Add ``silbo admin`` and its subcommands."""
    commands = parser.add_subparsers(dest="admin_command", metavar="COMMAND", required=True)
    init = commands.add_parser("init", help="form a cluster of separately started processes")
    _where(init)
    init.add_argument("--matchers", type=int, required=True, help="matchers to wait for")
    init.add_argument("--timeout", type=float, default=60.0, help="seconds to wait")
    init.add_argument(
        "--replicas",
        type=int,
        default=DEFAULT_REPLICAS,
        help=f"matchers that hold each subscription (default {DEFAULT_REPLICAS})",
    )
    init.set_defaults(handler=run_init)
    status = commands.add_parser("status", help="processes, epoch, subscriptions and rates")
    _where(status)
    status.add_argument("--json", action="store_true", help="one JSON object")
    status.add_argument("--interval", type=float, default=1.0, help="seconds to measure rates")
    status.set_defaults(handler=run_status)
    scale = commands.add_parser("scale", help="change the size of a layer while traffic flows")
    scale.add_argument("layer", choices=(*SCALABLE, STORE_LAYER), help="the layer to scale")
    scale.add_argument("count", type=int, help="how many processes the layer should have")
    _where(scale)
    scale.add_argument("--json", action="store_true", help="one JSON object")
    scale.add_argument("--timeout", type=float, default=60.0, help="seconds before rolling back")
    scale.set_defaults(handler=run_scale)
    autoscale = commands.add_parser(
        "autoscale", help="turn automatic scaling on or off, show it, set its policy"
    )
    autoscale.add_argument("action", choices=("on", "off", "status", "set"), help="what to do")
    autoscale.add_argument(
        "settings", nargs="*", metavar="KEY=VALUE", help="set: the knobs (docs/autoscaling.md)"
    )
    _where(autoscale)
    autoscale.add_argument("--json", action="store_true", help="one JSON object")
    autoscale.add_argument("--last", type=int, default=10, help="decisions shown (default 10)")
    autoscale.set_defaults(handler=run_autoscale)


def _where(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--state-dir", default=None, help="a cluster started by silbo up")
    parser.add_argument("--zk", default=None, help="ZooKeeper HOST:PORT[,...]")
    parser.add_argument("--cluster", default=None, help=f"cluster name (default {DEFAULT_CLUSTER})")


def cluster_address(args: argparse.Namespace) -> tuple[str, str]:
    """``(zookeeper hosts, cluster name)`` from --zk/--cluster or STATE_DIR/cluster.json."""
    if args.zk:
        return args.zk, args.cluster or DEFAULT_CLUSTER
    path = Path(args.state_dir or ".silbo") / "cluster.json"
    try:
        described = json.loads(path.read_text())
        return described["zookeeper"]["address"], args.cluster or described["cluster"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InvalidInput(
            f"no cluster described in {path} ({exc}); start one with silbo up, "
            "or name it with --zk HOST:PORT --cluster NAME"
        ) from exc


def run_init(args: argparse.Namespace) -> int:
    """Form the cluster; prints its configuration."""
    try:
        hosts, cluster = cluster_address(args)
        client = connect(hosts, cluster=cluster, timeout=10.0)
        try:
            configuration = form(
                client, args.matchers, timeout=args.timeout, replicas=args.replicas
            )
        finally:
            client.stop()
            client.close()
    except SilboError as exc:
        print(f"silbo admin init: error: {exc}", file=sys.stderr)
        return 2
    matchers = ", ".join(configuration.matchers)
    print(f"cluster {cluster}: epoch {configuration.epoch}, matchers {matchers}")
    return 0


def run_scale(args: argparse.Namespace) -> int:
    """Scale a layer to N processes (docs/protocol.md); prints the outcome. Exit 0 if completed.

    For a cluster of ``silbo up`` (``--state-dir``), new processes are started and leaving
    ones stopped by the command. For an external cluster (``--zk``), start the new processes
    first (``silbo run ROLE``): registered ones outside the configuration are taken in
    registration order; leaving ones are stopped by the operator afterwards (they are idle
    once the scale completes).
    """
    if args.layer == STORE_LAYER:
        return run_store_scale(args, cluster_address)
    if args.count < 1:
        print(
            f"silbo admin scale: error: a cluster needs at least one {ROLES[args.layer].value}",
            file=sys.stderr,
        )
        return 2
    try:
        hosts, cluster = cluster_address(args)
        client = connect(hosts, cluster=cluster, timeout=10.0)
    except SilboError as exc:
        print(f"silbo admin scale: error: {exc}", file=sys.stderr)
        return 2
    local = None if args.zk else Path(args.state_dir or ".silbo")
    try:
        outcome, before = scale_to(client, local, args.layer, args.count, timeout=args.timeout)
    except SilboError as exc:
        print(f"silbo admin scale: error: {exc}", file=sys.stderr)
        return 2
    finally:
        client.stop()
        client.close()
    _print_outcome(outcome, args, before)
    return 0 if outcome.outcome == "completed" else 1


def _print_outcome(outcome: ScaleOutcome, args: argparse.Namespace, before: int) -> None:
    if args.json:
        print(json.dumps(outcome.to_dict(), sort_keys=True))
        return
    took = f"{outcome.duration_s:.2f} s"
    print(
        f"{outcome.outcome}: {args.layer} {before} -> {args.count} in {took}, "
        f"{outcome.moved_subscriptions} subscriptions ({outcome.moved_bytes} bytes) moved, "
        f"no-matching time {outcome.no_matching_ms:g} ms, epoch {outcome.epoch}"
        + (f" ({outcome.message})" if outcome.message else "")
    )


def gather_status(hosts: str, cluster: str, interval: float = 1.0) -> dict[str, Any]:
    """The cluster's status as one JSON-able object (see ``silbo admin status --json``)."""
    client = connect(hosts, cluster=cluster, timeout=10.0)
    try:
        found = members(client)
        current = ClusterConfiguration(client).read()
        scale = read_state(client)
        stores = store_status(client)
        autoscaler = _autoscaler(AutoscaleState(client))
    finally:
        client.stop()
        client.close()
    first = ask_all(found)
    started = time.monotonic()
    if interval > 0:
        time.sleep(interval)
    second = ask_all(found) if interval > 0 else first
    elapsed = max(time.monotonic() - started, 1e-9)
    processes = []
    for member in found:
        before, after = first.get(member.name), second.get(member.name)
        entry: dict[str, Any] = {
            "role": member.role,
            "name": member.name,
            "address": member.endpoint,
            "internal": member.address,
            "pid": member.pid,
            "metrics": member.metrics,
            "reachable": after is not None,
        }
        if after is not None:
            entry["epoch"] = after.epoch
            entry["subscriptions"] = after.subscriptions
            entry["counters"] = dict(after.counters)
            entry["load"] = _load_of(after.load)
            if before is not None and interval > 0:
                entry["rates"] = {
                    key: round((value - before.counters.get(key, 0.0)) / elapsed, 1)
                    for key, value in after.counters.items()
                    if key.startswith("items_")
                }
        processes.append(entry)
    configuration = current.configuration if current else None
    status: dict[str, Any] = {
        "cluster": cluster,
        "zookeeper": hosts,
        "epoch": configuration.epoch if configuration else None,
        "matchers": list(configuration.matchers) if configuration else [],
        "layers": {layer: sum(1 for p in processes if p["role"] == layer) for layer in LAYERS},
        "processes": processes,
        "scale": None,  # or what /scale holds, in words
        # members the configuration names that are not registered (a repair is due)
        "dead": _unregistered(configuration, found) if configuration else [],
        # members repairs removed because they died, oldest first
        "failed": list(configuration.failed) if configuration else [],
        # matchers configured to hold each subscription, and how many live ones do now
        "replicas": configuration.replicas if configuration else None,
        "replicas_live": _live_replicas(configuration, found) if configuration else None,
        # the context store layer: its layout version, and each store's state (None: none)
        "store_layer": stores,
        # automatic scaling: on or off, the leading controller (None: none runs), standbys
        "autoscaler": autoscaler,
    }
    plan = scale.plan
    if plan is not None:
        what = f"{plan.id} ({plan.layer}, epoch {plan.old.epoch} -> {plan.new.epoch})"
        ending = "finished by its participants" if scale.switched else "rolled back"
        status["scale"] = (
            f"running {what}"
            if scale.owned
            else f"stale plan {what}: its coordinator died; {ending}; the next scale removes it"
        )
    return status


def _autoscaler(state: AutoscaleState) -> dict[str, Any]:
    contenders = state.contenders()
    return {
        "enabled": state.enabled(),
        "leader": contenders[0] if contenders else None,
        "standby": contenders[1:],
    }


def _autoscaler_line(autoscaler: dict[str, Any]) -> str:
    """``on, leader host:4242 (1 standby)``, or ``off, no controller running``."""
    state = "on" if autoscaler["enabled"] else "off"
    if autoscaler["leader"] is None:
        return f"{state}, no controller running (silbo autoscaler, or silbo up --autoscale)"
    return f"{state}, leader {autoscaler['leader']} ({len(autoscaler['standby'])} standby)"


def run_autoscale(args: argparse.Namespace) -> int:
    """``autoscale on|off|status|set KEY=VALUE...``: exit 0, or 2 for a bad request."""
    if args.action == "set" and not args.settings:
        print("silbo admin autoscale: error: set needs KEY=VALUE settings", file=sys.stderr)
        return 2
    if args.action != "set" and args.settings:
        print(
            f"silbo admin autoscale: error: {args.action} takes no settings (use set)",
            file=sys.stderr,
        )
        return 2
    try:
        hosts, cluster = cluster_address(args)
        client = connect(hosts, cluster=cluster, timeout=10.0)
        try:
            state = AutoscaleState(client)
            if args.action in ("on", "off"):
                state.set_enabled(args.action == "on")
            elif args.action == "set":
                state.update_policy(args.settings)
            shown = _autoscaler(state) | {
                "cluster": cluster,
                "policy": state.policy().settings(),
                "decisions": state.decisions(max(0, args.last)),
            }
        finally:
            client.stop()
            client.close()
    except SilboError as exc:
        print(f"silbo admin autoscale: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(shown, indent=2, sort_keys=True))
        return 0
    print(f"autoscaling of {cluster}: {_autoscaler_line(shown)}")
    print("policy: " + " ".join(f"{k}={v}" for k, v in shown["policy"].items()))
    if args.action in ("status",):
        print("decisions:" if shown["decisions"] else "decisions: none yet")
        for entry in shown["decisions"]:
            print("  " + _decision_line(entry))
    return 0


def _decision_line(entry: dict[str, Any]) -> str:
    """``12:04:31 access-points scale-out 1 -> 2: completed: ... (why: ...)``."""
    when = time.strftime("%H:%M:%S", time.localtime(float(entry.get("t") or 0.0)))
    outcome = entry.get("outcome") or "in flight"
    what = f"{entry.get('layer')} {entry.get('kind')} {entry.get('from')} -> {entry.get('to')}"
    return f"{when} {what}: {outcome}\n    why: {entry.get('reason')}"


def _load_of(load: wire.Load) -> dict[str, Any]:
    """A process's load signals (broker.runtime.load) as ``admin status --json`` shows them."""
    return {
        "window_s": round(load.window, 2),
        "busy_fraction": round(load.busy_fraction, 3),
        "input_rate": round(load.input_rate, 1),
        "output_rate": round(load.output_rate, 1),
        "true_rate": round(load.true_rate, 1),
        "queue_depth": load.queue_depth,
        "queue_age_s": round(load.queue_age, 3),
        "busy_seconds": round(load.busy_seconds, 3),
        "items_in": load.items_in,
        "items_out": load.items_out,
        "max_rate": load.max_rate,
        "held_fraction": round(load.held_fraction, 3),
        "items_held": load.items_held,
    }


def _live_replicas(configuration: Configuration, found: Sequence[Member]) -> int:
    """The fewest live holders a subscription has: the width of the preference lists less
    the dead matchers not repaired yet (each may be on a list)."""
    live = {m.name for m in found}
    dead = sum(1 for name in configuration.matchers if name not in live)
    return max(0, configuration.selector.width - dead)


def _unregistered(configuration: Configuration, found: Sequence[Member]) -> list[str]:
    live = {m.name for m in found}
    named = (*configuration.matchers, *configuration.exit_points, *configuration.access_points)
    return [name for name in named if name not in live]


def run_status(args: argparse.Namespace) -> int:
    """Print the cluster's status (a table, or JSON)."""
    try:
        hosts, cluster = cluster_address(args)
        status = gather_status(hosts, cluster, args.interval)
    except SilboError as exc:
        print(f"silbo admin status: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(status, indent=2, sort_keys=True))
        return 0
    layers = ", ".join(f"{n} {layer}" for layer, n in status["layers"].items())
    print(f"cluster {status['cluster']} (ZooKeeper {status['zookeeper']}): epoch {status['epoch']}")
    print(f"processes: {layers}")
    if status["replicas"] is not None:
        degraded = status["replicas_live"] < status["replicas"]
        note = " (degraded: fewer live holders than configured)" if degraded else ""
        print(f"replicas: {status['replicas']}, live {status['replicas_live']}{note}")
    if status.get("scale"):
        print(f"scale: {status['scale']}")
    print(f"autoscaler: {_autoscaler_line(status['autoscaler'])}")
    if status["dead"]:
        print(f"dead, not yet repaired: {', '.join(status['dead'])}")
    if status["failed"]:
        recent = status["failed"][-3:]
        print(f"failures repaired: {len(status['failed'])} (last: {', '.join(recent)})")
    if status.get("store_layer"):
        _print_stores(status["store_layer"])
    print(
        f"{'role':<17} {'name':<52} {'address':<22} {'pid':>7} {'subs':>8} {'busy':>5}  "
        "load (5 s), rates/s"
    )
    for p in status["processes"]:
        rates = ", ".join(
            f"{k.split(':', 1)[-1]} {v:g}" for k, v in p.get("rates", {}).items() if v
        )
        subs = str(p.get("subscriptions", "")) if p["role"] == "matcher" else ""
        state = "" if p["reachable"] else "  (not answering)"
        load = p.get("load")
        busy = f"{load['busy_fraction']:.0%}" if load else ""
        row = f"{p['role']:<17} {p['name']:<52} {p['address']:<22} {p['pid']:>7} {subs:>8}"
        shown = "; ".join(part for part in (_load_line(load), rates) if part)
        print(f"{row} {busy:>5}  {shown or '-'}{state}")
    return 0


def _load_line(load: dict[str, Any] | None) -> str:
    """``in 201/s, out 180/s, true 207/s, queued 3 (0.4 s)``, ``max 200/s`` when capped."""
    if not load:
        return ""
    parts = [
        f"in {load['input_rate']:g}/s",
        f"out {load['output_rate']:g}/s",
        f"true {load['true_rate']:g}/s",
    ]
    if load["queue_depth"]:
        parts.append(f"queued {load['queue_depth']} ({load['queue_age_s']:g} s)")
    if load["max_rate"]:
        parts.append(f"max {load['max_rate']:g}/s")
    if load["held_fraction"]:
        parts.append(f"held back {load['held_fraction']:.0%}")
    return ", ".join(parts)


def _print_stores(layer: dict[str, Any]) -> None:
    transition = layer["transition"]
    moving = f", scaling from {', '.join(transition)}" if transition else ""
    print(f"context stores: layout {layer['layout']}, replicas {layer['replicas']}{moving}")
    for store, entry in layer["stores"].items():
        sync = "in sync" if entry["in_sync"] else "out of sync"
        print(
            f"  {store}: {entry['state']}, {sync}, {entry['partitions']} partitions "
            f"({entry['primary_of']} as primary, {entry['missing']} missing)"
        )
