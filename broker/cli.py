"""The ``silbo`` command: wires each command family's module into one argparse tree.

Every command lives in its own module, which exposes ``configure(parser)`` (adds its options
and sets ``handler``) and a handler ``run(args) -> int`` (the exit status). This module
only builds the tree; adding a command is one row in :data:`_COMMANDS` or
:data:`_BENCHMARKS`::

    silbo demo                      broker.demo_cluster
    silbo demo-engine               broker.demo
    silbo run ROLE                  broker.commands.run
    silbo admin init|status|scale|autoscale   broker.commands.admin
    silbo autoscaler                broker.commands.autoscaler
    silbo up / silbo down           broker.commands.up, broker.commands.down
    silbo publish / subscribe       broker.commands.publish, broker.commands.subscribe
    silbo replay                    broker.commands.replay
    silbo archive status            broker.commands.archive
    silbo aggregate                 broker.commands.aggregate
    silbo backfill                  broker.commands.backfill
    silbo bench match               broker.bench.match
    silbo bench e2e                 broker.bench.e2e
    silbo bench scale               broker.bench.scale
    silbo bench ngsi                broker.bench.ngsi
    silbo bench spark               broker.bench.spark
    silbo bench chaos               broker.bench.chaos
    silbo bench storage             broker.bench.storage
    silbo bench context             broker.bench.context
    silbo bench store-scale         broker.bench.store_scale
    silbo bench autoscale           broker.bench.autoscale
    silbo bench derived             broker.bench.derived
"""

from __future__ import annotations

import argparse
import importlib
import shlex
import sys
from collections.abc import Callable, Sequence

from broker import __version__
from broker.errors import MissingExtra

__all__ = ["build_parser", "main"]

_Configure = Callable[[argparse.ArgumentParser], None]

# (name, one-line help, "module:function" that configures it) of each top-level command but
# ``bench``. The modules are imported only for the command given (all of them for a parser
# of every command): a broker process (``silbo run``) starts without the benchmarks' imports.
_COMMANDS: tuple[tuple[str, str, str], ...] = (
    (
        "demo",
        "a whole cluster on W-IoT for ~30 s, every delivery checked",
        "broker.demo_cluster:configure",
    ),
    (
        "demo-engine",
        "the matching engine alone, checked against the reference",
        "broker.demo:configure",
    ),
    (
        "run",
        "run one broker process (connection point, access point, matcher, exit point, "
        "context store, archiver)",
        "broker.commands.run:configure",
    ),
    (
        "admin",
        "operate a running cluster (init, status, scale, autoscale)",
        "broker.commands.admin:configure",
    ),
    (
        "autoscaler",
        "run an automatic scaling controller (one leads, the others stand by)",
        "broker.commands.autoscaler:configure",
    ),
    (
        "up",
        "start a whole cluster on this machine (and ZooKeeper, unless --zk is given)",
        "broker.commands.up:configure",
    ),
    (
        "down",
        "stop the cluster silbo up started (every process, and its embedded ZooKeeper)",
        "broker.commands.down:configure",
    ),
    (
        "publish",
        "publish one context update (NAME[:TYPE]=VALUE attributes)",
        "broker.commands.publish:configure",
    ),
    (
        "subscribe",
        "subscribe; print each notification as one JSON line",
        "broker.commands.subscribe:configure",
    ),
    (
        "get",
        "print one entity (the context store's; --json for NGSI JSON)",
        "broker.commands.read:configure_get",
    ),
    (
        "query",
        "print the entities a query finds (NGSI v2 parameters)",
        "broker.commands.read:configure_query",
    ),
    (
        "replay",
        "the notifications a file of updates would have made, on Spark (docs/spark.md)",
        "broker.commands.replay:configure",
    ),
    (
        "archive",
        "the archive of every change the context stores apply: status (docs/archive.md)",
        "broker.commands.archive:configure",
    ),
    (
        "aggregate",
        "define aggregation groups: add, change, list, show, delete (docs/aggregation.md)",
        "broker.commands.aggregate:configure",
    ),
    (
        "alert",
        "define alert rules: add, change, list, show, delete (docs/alerts.md)",
        "broker.commands.alert:configure",
    ),
    (
        "backfill",
        "history levels and aggregation windows recomputed from the archive, on Spark",
        "broker.commands.backfill:configure",
    ),
)

# (name, one-line help, "module:function") of each ``silbo bench`` benchmark.
_BENCHMARKS: tuple[tuple[str, str, str], ...] = (
    ("match", "index build and matching throughput of one matcher", "broker.bench.match:configure"),
    ("e2e", "throughput and latency of a whole cluster, end to end", "broker.bench.e2e:configure"),
    (
        "scale",
        "matchers scaled out and in under a constant load, as a time line",
        "broker.bench.scale:configure",
    ),
    (
        "ngsi",
        "updates/s over NGSI v2 HTTP and notifications/s sent by HTTP",
        "broker.bench.ngsi:configure",
    ),
    (
        "spark",
        "the Spark matcher against the in-process engine, same input",
        "broker.bench.spark:configure",
    ),
    (
        "chaos",
        "faults injected into a cluster under load, checked by an oracle",
        "broker.bench.chaos:configure",
    ),
    (
        "storage",
        "the context store's engines: durable writes, reads, size",
        "broker.bench.storage:configure",
    ),
    (
        "context",
        "the context store layer's processes: writes, GETs, q queries, memory",
        "broker.bench.context:configure",
    ),
    (
        "store-scale",
        "the context store layer scaled under writes and reads, checked by an oracle",
        "broker.bench.store_scale:configure",
    ),
    (
        "autoscale",
        "the autoscaling controller under a load profile, with a capped layer and an oracle",
        "broker.bench.autoscale:configure",
    ),
    (
        "derived",
        "Theodolite UC2 and UC4 on the aggregation groups: highest sustained rate by stores",
        "broker.bench.derived:configure",
    ),
)


def _configure(where: str) -> _Configure:
    module, function = where.split(":")
    configure: _Configure = getattr(importlib.import_module(module), function)
    return configure


def _chosen(arguments: Sequence[str] | None) -> tuple[str | None, str | None] | None:
    """The command (and benchmark) ``arguments`` name: the first words not options (None:
    every command, for a parser of all)."""
    if arguments is None:
        return None
    words = [a for a in arguments if not a.startswith("-")]
    command = words[0] if words else None
    return command, (words[1] if command == "bench" and len(words) > 1 else None)


def build_parser(arguments: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The ``silbo`` argument parser: every command with its options, or (``arguments``
    given) every command listed and only the one they name with its options."""
    chosen = _chosen(arguments)
    parser = argparse.ArgumentParser(
        prog="silbo",
        description="Silbo: an elastic content-based publish/subscribe broker (NGSI v2).",
    )
    parser.add_argument("--version", action="version", version=f"silbo {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, help_text, where in _COMMANDS:
        sub = commands.add_parser(name, help=help_text, description=help_text)
        if chosen is None or chosen[0] == name:
            _configure(where)(sub)
    bench = commands.add_parser(
        "bench", help="benchmarks (see docs/benchmarks.md)", description="Run a benchmark."
    )
    benchmarks = bench.add_subparsers(dest="benchmark", metavar="BENCHMARK", required=True)
    for name, help_text, where in _BENCHMARKS:
        sub = benchmarks.add_parser(name, help=help_text, description=help_text)
        if chosen is None or (chosen[0] == "bench" and chosen[1] == name):
            _configure(where)(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line, run the command and return its exit status."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(arguments).parse_args(arguments)
    args.command_line = shlex.join(["silbo", *arguments])
    args.arguments = arguments
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except MissingExtra as exc:
        print(f"silbo: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
