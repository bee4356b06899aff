"""``silbo alert``: define the alert rules of a running cluster (docs/alerts.md).

    silbo alert add (FILE | -) [--tenant S] [--service-path P] [--front URL | --state-dir DIR]
    silbo alert add --id ID --attribute A (--above N [--clear-below N] | --below N
        [--clear-above N]) [--for 10s] [--severity S] [--type T] [--id-pattern RE] [--q Q]
        [--alert-type T] [--alert-id 'Alert:{rule}:{id}']
    silbo alert change ID (FILE | - | the flags of add but --id)
    silbo alert list | show ID | delete ID   [--tenant S] [--service-path P] [...]

Each talks to an NGSI v2 front (``/v2/x/alerts``; broker.commands.front_request finds it).
A rule is a JSON document (FILE, ``-`` for stdin) or given with flags. ``list`` prints one
line per rule, ``show`` the JSON. Errors the front refuses (a bad rule, an unknown id) are
one line on stderr with its NGSI error and exit status 2; a front that cannot be reached or
answers 5xx exits 1.
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

__all__ = ["configure", "rule_of", "run"]

_PATH = "/v2/x/alerts"


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the subcommands of ``silbo alert``."""
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    add = actions.add_parser("add", help="define a rule (a JSON file, or flags)")
    _rule_options(add, with_id=True)
    change = actions.add_parser("change", help="change a rule (from the next write on)")
    change.add_argument("id", help="the rule's id")
    _rule_options(change, with_id=False)
    actions.add_parser("list", help="the tenant's rules, one a line")
    show = actions.add_parser("show", help="one rule, as JSON")
    show.add_argument("id", help="the rule's id")
    delete = actions.add_parser("delete", help="remove a rule (its alert entities stay)")
    delete.add_argument("id", help="the rule's id")
    for sub in (add, change, *(actions.choices[n] for n in ("list", "show", "delete"))):
        add_front_options(sub)
    parser.set_defaults(handler=run)


def _rule_options(parser: argparse.ArgumentParser, *, with_id: bool) -> None:
    parser.add_argument("file", nargs="?", default=None, help="a JSON rule (- : stdin)")
    if with_id:
        parser.add_argument("--id", default=None, help="the rule's id")
    parser.add_argument("--type", default=None, help="the entities' type")
    parser.add_argument("--id-pattern", default=None, help="a regular expression their ids match")
    parser.add_argument("--q", default=None, help="a filter on their attributes (NGSI q)")
    parser.add_argument("--attribute", default=None, help="the attribute watched")
    parser.add_argument("--above", type=float, default=None, help="raise over this value")
    parser.add_argument("--below", type=float, default=None, help="raise under this value")
    parser.add_argument("--clear-below", type=float, default=None, help="clear under this")
    parser.add_argument("--clear-above", type=float, default=None, help="clear over this")
    parser.add_argument("--for", dest="hold", default=None, help="held this long first: 10s")
    parser.add_argument("--severity", default=None, help="the alerts' severity (warning)")
    parser.add_argument("--alert-type", default=None, help="the alert entities' type (Alert)")
    parser.add_argument("--alert-id", default=None, help="their id: 'Alert:{rule}:{id}'")


def rule_of(args: argparse.Namespace, stdin: IO[str] | None = None) -> dict[str, Any]:
    """The rule the arguments give: a JSON file, or the flags (InvalidInput)."""
    if args.file is not None:
        return json_document(args.file, stdin)
    missing = [] if args.attribute is not None else ["--attribute"]
    if args.above is None and args.below is None:
        missing.append("--above or --below")
    if getattr(args, "id", None) is None:
        missing.insert(0, "--id")
    if missing:
        raise InvalidInput(f"give a JSON rule (FILE or -), or {', '.join(missing)}")
    condition = {
        key: value
        for key, value in (
            ("above", args.above),
            ("below", args.below),
            ("clearBelow", args.clear_below),
            ("clearAbove", args.clear_above),
            ("for", args.hold),
        )
        if value is not None
    }
    entities = {
        key: value
        for key, value in (("type", args.type), ("idPattern", args.id_pattern), ("q", args.q))
        if value is not None
    }
    alert = {
        key: value
        for key, value in (("type", args.alert_type), ("id", args.alert_id))
        if value is not None
    }
    body: dict[str, Any] = {
        "id": args.id,
        "entities": entities,
        "attribute": args.attribute,
        "condition": condition,
    }
    if args.severity is not None:
        body["severity"] = args.severity
    if alert:
        body["alert"] = alert
    return body


def run(args: argparse.Namespace, out: IO[str] | None = None) -> int:
    """Carry out one action; the exit status."""
    stream = out or sys.stdout
    try:
        body = rule_of(args) if args.action in ("add", "change") else None
        base = front_of(args)
        one = f"{_PATH}/{quote(getattr(args, 'id', '') or '', safe='')}"
        if args.action == "add":
            call(base, args, "POST", _PATH, body)
            print(f"alert rule {body.get('id') if body else ''} added", file=stream)
        elif args.action == "change":
            assert body is not None
            body.setdefault("id", args.id)
            call(base, args, "PUT", one, body)
            print(f"alert rule {args.id} changed (from the next write)", file=stream)
        elif args.action == "list":
            for item in call(base, args, "GET", _PATH) or []:
                print(_line(item), file=stream)
        elif args.action == "show":
            print(json.dumps(call(base, args, "GET", one), indent=2), file=stream)
        else:
            call(base, args, "DELETE", one)
            print(f"alert rule {args.id} deleted", file=stream)
    except InvalidInput as exc:
        print(f"silbo alert: error: {exc}", file=sys.stderr)
        return 2
    except Failed as exc:
        print(f"silbo alert: error: {exc}", file=sys.stderr)
        return 2 if 400 <= exc.status < 500 else 1
    return 0


def _line(item: dict[str, Any]) -> str:
    """``hot  Room  temperature above 30 clearBelow 28 for 10  critical  v1``."""
    condition = " ".join(f"{k} {v:g}" for k, v in item.get("condition", {}).items())
    kind = item.get("entities", {}).get("type", "*")
    return (
        f"{item.get('id')}  {kind}  {item.get('attribute')} {condition}  "
        f"{item.get('severity')}  v{item.get('version')}"
    )
