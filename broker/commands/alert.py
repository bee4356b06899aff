"""``silbo alert``: define the alert rules of a running cluster (docs/alerts.md).

    silbo alert add (FILE | -) [--tenant S] [--service-path P] [--front URL | --state-dir DIR]
    silbo alert add --id ID --attribute A (--above N [--clear-below N] | --below N
        [--clear-above N]) [--for 10s] [--severity S] [--type T] [--id-pattern RE] [--q Q]
        [--alert-type T] [--alert-id 'Alert:{rule}:{id}']
    silbo alert change ID (FILE | - | the flags of add but --id)
    silbo alert list | show ID | delete ID   [--tenant S] [--service-path P] [...]

Each talks to an NGSI v2 front (``/v2/x/alerts``; broker.commands.front_request finds it).
A rule is a JSON document (FILE, ``-`` for stdin) or given with flags. The actions and exit
statuses are broker.commands.definitions'.
"""

from __future__ import annotations

import argparse
import functools
from typing import Any

from broker.commands import definitions

__all__ = ["KIND", "configure"]


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--attribute", default=None, help="the attribute watched")
    parser.add_argument("--above", type=float, default=None, help="raise over this value")
    parser.add_argument("--below", type=float, default=None, help="raise under this value")
    parser.add_argument("--clear-below", type=float, default=None, help="clear under this")
    parser.add_argument("--clear-above", type=float, default=None, help="clear over this")
    parser.add_argument("--for", dest="hold", default=None, help="held this long first: 10s")
    parser.add_argument("--severity", default=None, help="the alerts' severity (warning)")
    parser.add_argument("--alert-type", default=None, help="the alert entities' type (Alert)")
    parser.add_argument("--alert-id", default=None, help="their id: 'Alert:{rule}:{id}'")


def _missing(args: argparse.Namespace) -> list[str]:
    missing = [] if args.attribute is not None else ["--attribute"]
    if args.above is None and args.below is None:
        missing.append("--above or --below")
    return missing


def _build(args: argparse.Namespace) -> dict[str, Any]:
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
    alert = {
        key: value
        for key, value in (("type", args.alert_type), ("id", args.alert_id))
        if value is not None
    }
    body: dict[str, Any] = {
        "id": args.id,
        "entities": definitions.selection(args),
        "attribute": args.attribute,
        "condition": condition,
    }
    if args.severity is not None:
        body["severity"] = args.severity
    if alert:
        body["alert"] = alert
    return body


def _line(item: dict[str, Any]) -> str:
    """``hot  Room  temperature above 30 clearBelow 28 for 10  critical  v1``."""
    condition = " ".join(f"{k} {v:g}" for k, v in item.get("condition", {}).items())
    kind = item.get("entities", {}).get("type", "*")
    return (
        f"{item.get('id')}  {kind}  {item.get('attribute')} {condition}  "
        f"{item.get('severity')}  v{item.get('version')}"
    )


KIND = definitions.Kind(
    command="alert",
    path="/v2/x/alerts",
    noun="rule",
    called="alert rule",
    document="rule",
    changed="from the next write",
    stays="its alert entities",
    options=_options,
    missing=_missing,
    build=_build,
    line=_line,
)

configure = functools.partial(definitions.configure, kind=KIND)  # silbo's subcommand hook
