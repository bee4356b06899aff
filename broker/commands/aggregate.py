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
by building, buildings by campus). ``list`` prints one line per group, ``show`` the JSON.
Errors the front refuses (a bad definition, an unknown id) are one line on stderr with its
NGSI error and exit status 2; a front that cannot be reached or answers 5xx exits 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import IO, Any
from urllib.parse import quote

from broker.commands.front_request import (
    Failed,
    add_front_options,
    call,
    front_of,
    json_document,
)
from broker.errors import InvalidInput

__all__ = ["configure", "definition_of", "run"]

_PATH = "/v2/x/aggregations"


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the subcommands of ``silbo aggregate``."""
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    add = actions.add_parser("add", help="define a group (a JSON file, or flags)")
    _definition_options(add, with_id=True)
    change = actions.add_parser("change", help="change a group (from the next window on)")
    change.add_argument("id", help="the group's id")
    _definition_options(change, with_id=False)
    actions.add_parser("list", help="the tenant's groups, one a line")
    show = actions.add_parser("show", help="one group's definition, as JSON")
    show.add_argument("id", help="the group's id")
    delete = actions.add_parser("delete", help="remove a group (its derived entities stay)")
    delete.add_argument("id", help="the group's id")
    for sub in (add, change, *(actions.choices[n] for n in ("list", "show", "delete"))):
        add_front_options(sub)
    parser.set_defaults(handler=run)


def _definition_options(parser: argparse.ArgumentParser, *, with_id: bool) -> None:
    parser.add_argument("file", nargs="?", default=None, help="a JSON definition (- : stdin)")
    if with_id:
        parser.add_argument("--id", default=None, help="the group's id")
    parser.add_argument("--type", default=None, help="the entities' type")
    parser.add_argument("--id-pattern", default=None, help="a regular expression their ids match")
    parser.add_argument("--q", default=None, help="a filter on their attributes (NGSI q)")
    parser.add_argument(
        "--group-by", default=None, metavar="ATTR:TYPE[,...]", help="the group levels"
    )
    parser.add_argument("--attributes", default=None, metavar="A[,B]", help="what to aggregate")
    parser.add_argument(
        "--functions", default=None, metavar="F[,F]", help="count, sum, min, max, avg, last"
    )
    parser.add_argument("--window", default=None, metavar="SIZE", help="the window: 5m, 1s...")
    parser.add_argument("--slide", default=None, metavar="S", help="a sliding window's slide")


def definition_of(args: argparse.Namespace, stdin: IO[str] | None = None) -> dict[str, Any]:
    """The definition the arguments give: a JSON file, or the flags (InvalidInput)."""
    if args.file is not None:
        return json_document(args.file, stdin)
    missing = [
        flag
        for flag, value in (
            ("--group-by", args.group_by),
            ("--attributes", args.attributes),
            ("--functions", args.functions),
            ("--window", args.window),
        )
        if value is None
    ]
    if getattr(args, "id", None) is None:
        missing.insert(0, "--id")
    if missing:
        raise InvalidInput(f"give a JSON definition (FILE or -), or {', '.join(missing)}")
    levels = []
    for item in args.group_by.split(","):
        attribute, _colon, kind = item.partition(":")
        if not attribute or not kind:
            raise InvalidInput(f"--group-by takes ATTR:TYPE items, not {item!r}")
        levels.append({"attribute": attribute, "type": kind})
    entities = {
        key: value
        for key, value in (("type", args.type), ("idPattern", args.id_pattern), ("q", args.q))
        if value is not None
    }
    window: dict[str, Any] = {"type": "tumbling", "size": args.window}
    if args.slide is not None:
        window = {"type": "sliding", "size": args.window, "slide": args.slide}
    return {
        "id": args.id,
        "entities": entities,
        "groupBy": levels,
        "attributes": args.attributes.split(","),
        "functions": args.functions.split(","),
        "window": window,
    }


def run(args: argparse.Namespace, out: IO[str] | None = None) -> int:
    """Carry out one action; the exit status."""
    stream = out or sys.stdout
    try:
        body = definition_of(args) if args.action in ("add", "change") else None
        base = front_of(args)
        one = f"{_PATH}/{quote(getattr(args, 'id', '') or '', safe='')}"
        if args.action == "add":
            call(base, args, "POST", _PATH, body)
            print(f"aggregation {body.get('id') if body else ''} added", file=stream)
        elif args.action == "change":
            assert body is not None
            body.setdefault("id", args.id)
            call(base, args, "PUT", one, body)
            print(f"aggregation {args.id} changed (from its next window)", file=stream)
        elif args.action == "list":
            for item in call(base, args, "GET", _PATH) or []:
                print(_line(item), file=stream)
        elif args.action == "show":
            print(json.dumps(call(base, args, "GET", one), indent=2), file=stream)
        else:
            call(base, args, "DELETE", one)
            print(f"aggregation {args.id} deleted", file=stream)
    except InvalidInput as exc:
        print(f"silbo aggregate: error: {exc}", file=sys.stderr)
        return 2
    except Failed as exc:
        print(f"silbo aggregate: error: {exc}", file=sys.stderr)
        return 2 if 400 <= exc.status < 500 else 1
    return 0


def _line(item: dict[str, Any]) -> str:
    levels = " -> ".join(f"{g['attribute']}:{g['type']}" for g in item.get("groupBy", []))
    window = item.get("window", {})
    size = window.get("size", "?")
    if window.get("type") == "sliding":
        size = f"{size}/{window.get('slide', '?')}"
    functions = ",".join(item.get("functions", []))
    attributes = ",".join(item.get("attributes", []))
    return f"{item.get('id')}  {levels}  {functions}({attributes})  {size}  v{item.get('version')}"
