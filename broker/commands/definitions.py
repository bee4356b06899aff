"""What ``silbo aggregate`` and ``silbo alert`` share: the five actions on one kind of
definition a ``/v2/x/...`` route keeps (``add``, ``change``, ``list``, ``show``,
``delete``), the flags that select entities, and the exit statuses.

A definition is a JSON document (FILE, ``-`` for stdin) or given with the kind's flags.
``list`` prints one line per definition, ``show`` the JSON. Errors the front refuses (a bad
definition, an unknown id) are one line on stderr with its NGSI error and exit status 2; a
front that cannot be reached or answers 5xx exits 1 (broker.commands.front_request finds
the front and calls it).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
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

__all__ = ["Kind", "configure", "document_of", "run", "selection"]

Document = dict[str, Any]


@dataclass(frozen=True)
class Kind:
    """One kind of definition: its command, its route, its words and its own flags."""

    command: str  # "aggregate": the command's name in messages
    path: str  # "/v2/x/aggregations"
    noun: str  # "group": in the help texts
    called: str  # "aggregation": what the outcome lines call one
    document: str  # "definition": what its JSON is called
    changed: str  # "from its next window": when a change takes effect
    stays: str  # "its derived entities": what a delete leaves
    options: Callable[[argparse.ArgumentParser], None]  # the kind's own flags
    missing: Callable[[argparse.Namespace], list[str]]  # the flags an add or change lacks
    build: Callable[[argparse.Namespace], Document]  # the document the flags give
    line: Callable[[Document], str]  # one ``list`` line


def configure(parser: argparse.ArgumentParser, kind: Kind) -> None:
    """Add the five actions of ``kind`` to its command's parser."""
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    noun = kind.noun
    add = actions.add_parser("add", help=f"define a {noun} (a JSON file, or flags)")
    _definition_options(add, kind, with_id=True)
    change = actions.add_parser("change", help=f"change a {noun} ({kind.changed} on)")
    change.add_argument("id", help=f"the {kind.noun}'s id")
    _definition_options(change, kind, with_id=False)
    actions.add_parser("list", help=f"the tenant's {noun}s, one a line")
    show = actions.add_parser("show", help=f"one {noun}, as JSON")
    show.add_argument("id", help=f"the {kind.noun}'s id")
    delete = actions.add_parser("delete", help=f"remove a {noun} ({kind.stays} stay)")
    delete.add_argument("id", help=f"the {kind.noun}'s id")
    for sub in (add, change, *(actions.choices[n] for n in ("list", "show", "delete"))):
        add_front_options(sub)
    parser.set_defaults(handler=lambda args: run(args, kind))


def _definition_options(parser: argparse.ArgumentParser, kind: Kind, *, with_id: bool) -> None:
    parser.add_argument("file", nargs="?", default=None, help=f"a JSON {kind.document} (- : stdin)")
    if with_id:
        parser.add_argument("--id", default=None, help=f"the {kind.noun}'s id")
    parser.add_argument("--type", default=None, help="the entities' type")
    parser.add_argument("--id-pattern", default=None, help="a regular expression their ids match")
    parser.add_argument("--q", default=None, help="a filter on their attributes (NGSI q)")
    kind.options(parser)


def selection(args: argparse.Namespace) -> Document:
    """The ``entities`` member the selection flags give (``type``, ``idPattern``, ``q``)."""
    return {
        key: value
        for key, value in (("type", args.type), ("idPattern", args.id_pattern), ("q", args.q))
        if value is not None
    }


def document_of(args: argparse.Namespace, kind: Kind, stdin: IO[str] | None = None) -> Document:
    """The definition the arguments give: a JSON file, or the flags (InvalidInput naming
    every flag missing)."""
    if args.file is not None:
        return json_document(args.file, stdin)
    missing = kind.missing(args)
    if getattr(args, "id", None) is None:
        missing.insert(0, "--id")
    if missing:
        raise InvalidInput(f"give a JSON {kind.document} (FILE or -), or {', '.join(missing)}")
    return kind.build(args)


def run(args: argparse.Namespace, kind: Kind, out: IO[str] | None = None) -> int:
    """Carry out one action; the exit status."""
    stream = out or sys.stdout
    try:
        body = document_of(args, kind) if args.action in ("add", "change") else None
        base = front_of(args)
        one = f"{kind.path}/{quote(getattr(args, 'id', '') or '', safe='')}"
        if args.action == "add":
            call(base, args, "POST", kind.path, body)
            print(f"{kind.called} {body.get('id') if body else ''} added", file=stream)
        elif args.action == "change":
            assert body is not None
            body.setdefault("id", args.id)
            call(base, args, "PUT", one, body)
            print(f"{kind.called} {args.id} changed ({kind.changed})", file=stream)
        elif args.action == "list":
            for item in call(base, args, "GET", kind.path) or []:
                print(kind.line(item), file=stream)
        elif args.action == "show":
            print(json.dumps(call(base, args, "GET", one), indent=2), file=stream)
        else:
            call(base, args, "DELETE", one)
            print(f"{kind.called} {args.id} deleted", file=stream)
    except InvalidInput as exc:
        print(f"silbo {kind.command}: error: {exc}", file=sys.stderr)
        return 2
    except Failed as exc:
        print(f"silbo {kind.command}: error: {exc}", file=sys.stderr)
        return 2 if 400 <= exc.status < 500 else 1
    return 0
