"""``silbo aggregate``: define the aggregation groups of a running cluster (docs/aggregation.md).

    silbo aggregate add (FILE | -) [--tenant S] [--service-path P] [--front URL | --state-dir DIR]
    silbo aggregate add --id ID --group-by ATTR:TYPE[,ATTR:TYPE...] --attributes A[,B]
        --functions avg,max[,...] --window 5m [--slide 1m] [--type T] [--id-pattern RE] [--q Q]
    silbo aggregate change ID (FILE | - | the flags of add but --id)
    silbo aggregate list | show ID | delete ID   [--tenant S] [--service-path P] [...]

Each talks to an NGSI v2 front (``/v2/x/aggregations``): ``--front http://HOST:PORT``, or the
first HTTP front ``silbo up`` described in ``STATE_DIR/cluster.json`` (``--state-dir``,
default ``.silbo``). A definition is a JSON document (FILE, ``-`` for stdin) or given with
flags: ``--group-by refBuilding:Building,refCampus:Campus`` is a hierarchy (sensors grouped
by building, buildings by campus). The actions and exit statuses are
broker.commands.definitions'.
"""

from __future__ import annotations

import argparse
import functools
from typing import Any

from broker.commands import definitions
from broker.errors import InvalidInput

__all__ = ["KIND", "configure"]


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--group-by", default=None, metavar="ATTR:TYPE[,...]", help="the group levels"
    )
    parser.add_argument("--attributes", default=None, metavar="A[,B]", help="what to aggregate")
    parser.add_argument(
        "--functions", default=None, metavar="F[,F]", help="count, sum, min, max, avg, last"
    )
    parser.add_argument("--window", default=None, metavar="SIZE", help="the window: 5m, 1s...")
    parser.add_argument("--slide", default=None, metavar="S", help="a sliding window's slide")


def _missing(args: argparse.Namespace) -> list[str]:
    flags = (
        ("--group-by", args.group_by),
        ("--attributes", args.attributes),
        ("--functions", args.functions),
        ("--window", args.window),
    )
    return [flag for flag, value in flags if value is None]


def _build(args: argparse.Namespace) -> dict[str, Any]:
    levels = []
    for item in args.group_by.split(","):
        attribute, _colon, kind = item.partition(":")
        if not attribute or not kind:
            raise InvalidInput(f"--group-by takes ATTR:TYPE items, not {item!r}")
        levels.append({"attribute": attribute, "type": kind})
    window: dict[str, Any] = {"type": "tumbling", "size": args.window}
    if args.slide is not None:
        window = {"type": "sliding", "size": args.window, "slide": args.slide}
    return {
        "id": args.id,
        "entities": definitions.selection(args),
        "groupBy": levels,
        "attributes": args.attributes.split(","),
        "functions": args.functions.split(","),
        "window": window,
    }


def _line(item: dict[str, Any]) -> str:
    levels = " -> ".join(f"{g['attribute']}:{g['type']}" for g in item.get("groupBy", []))
    window = item.get("window", {})
    size = window.get("size", "?")
    if window.get("type") == "sliding":
        size = f"{size}/{window.get('slide', '?')}"
    functions = ",".join(item.get("functions", []))
    attributes = ",".join(item.get("attributes", []))
    return f"{item.get('id')}  {levels}  {functions}({attributes})  {size}  v{item.get('version')}"


KIND = definitions.Kind(
    command="aggregate",
    path="/v2/x/aggregations",
    noun="group",
    called="aggregation",
    document="definition",
    changed="from its next window",
    stays="its derived entities",
    options=_options,
    missing=_missing,
    build=_build,
    line=_line,
)

configure = functools.partial(definitions.configure, kind=KIND)  # silbo's subcommand hook
