"""The ``silbo`` command: wires each command family's module into one argparse tree.

Every command lives in its own module, which exposes ``configure(parser)`` (adds its options
and sets ``handler``) and a handler ``run(args) -> int`` (the exit status). This module
only builds the tree; adding a command is one row in :data:`_COMMANDS` or
:data:`_BENCHMARKS`::

    silbo demo                      broker.demo_cluster
    silbo demo-engine               broker.demo
    silbo run ROLE                  broker.commands.run
    silbo admin init|status|scale   broker.commands.admin
    silbo up / silbo down           broker.commands.up, broker.commands.down
    silbo publish / subscribe       broker.commands.publish, broker.commands.subscribe
    silbo replay                    broker.commands.replay
    silbo bench match               broker.bench.match
    silbo bench e2e                 broker.bench.e2e
    silbo bench scale               broker.bench.scale
    silbo bench ngsi                broker.bench.ngsi
    silbo bench spark               broker.bench.spark
    silbo bench chaos               broker.bench.chaos
    silbo bench storage             broker.bench.storage
    silbo bench context             broker.bench.context
    silbo bench store-scale         broker.bench.store_scale
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Callable, Sequence

from broker import __version__, demo, demo_cluster
from broker.bench import chaos, context, e2e, match, ngsi, scale, spark, storage, store_scale
from broker.commands import admin, down, publish, read, replay, run, subscribe, up
from broker.errors import MissingExtra

__all__ = ["build_parser", "main"]

_Configure = Callable[[argparse.ArgumentParser], None]

# (name, one-line help, configure) of each top-level command but ``bench``.
_COMMANDS: tuple[tuple[str, str, _Configure], ...] = (
    ("demo", "a whole cluster on W-IoT for ~30 s, every delivery checked", demo_cluster.configure),
    ("demo-engine", "the matching engine alone, checked against the reference", demo.configure),
    (
        "run",
        "run one broker process (connection point, access point, matcher, exit point)",
        run.configure,
    ),
    ("admin", "operate a running cluster (init, status, scale)", admin.configure),
    ("up", up.HELP, up.configure),
    ("down", down.HELP, down.configure),
    ("publish", "publish one context update (NAME[:TYPE]=VALUE attributes)", publish.configure),
    ("subscribe", "subscribe; print each notification as one JSON line", subscribe.configure),
    ("get", "print one entity (the context store's; --json for NGSI JSON)", read.configure_get),
    ("query", "print the entities a query finds (NGSI v2 parameters)", read.configure_query),
    ("replay", replay.HELP, replay.configure),
)

# (name, one-line help, configure) of each ``silbo bench`` benchmark.
_BENCHMARKS: tuple[tuple[str, str, _Configure], ...] = (
    ("match", "index build and matching throughput of one matcher", match.configure),
    ("e2e", "throughput and latency of a whole cluster, end to end", e2e.configure),
    ("scale", "matchers scaled out and in under a constant load, as a time line", scale.configure),
    ("ngsi", "updates/s over NGSI v2 HTTP and notifications/s sent by HTTP", ngsi.configure),
    ("spark", "the Spark matcher against the in-process engine, same input", spark.configure),
    ("chaos", "faults injected into a cluster under load, checked by an oracle", chaos.configure),
    ("storage", "the context store's engines: durable writes, reads, size", storage.configure),
    (
        "context",
        "the context store layer's processes: writes, GETs, q queries, memory",
        context.configure,
    ),
    (
        "store-scale",
        "the context store layer scaled under writes and reads, checked by an oracle",
        store_scale.configure,
    ),
)


def build_parser() -> argparse.ArgumentParser:
    """The ``silbo`` argument parser, with every command and its options."""
    parser = argparse.ArgumentParser(
        prog="silbo",
        description="Silbo: an elastic content-based publish/subscribe broker (NGSI v2).",
    )
    parser.add_argument("--version", action="version", version=f"silbo {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, help_text, configure in _COMMANDS:
        configure(commands.add_parser(name, help=help_text, description=help_text))
    bench = commands.add_parser(
        "bench", help="benchmarks (see docs/benchmarks.md)", description="Run a benchmark."
    )
    benchmarks = bench.add_subparsers(dest="benchmark", metavar="BENCHMARK", required=True)
    for name, help_text, configure in _BENCHMARKS:
        configure(benchmarks.add_parser(name, help=help_text, description=help_text))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line, run the command and return its exit status."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(arguments)
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
