"""``silbo get`` and ``silbo query``: read the entities of a running cluster (its context store).

    silbo get ID [--type T] [--attrs A,B] [--tenant S] [--service-path P] [--json]
        [--timeout S] [--state-dir DIR | --connect HOST:PORT[,...]]
    silbo query [--id ID[,ID...]] [--type T] [--id-pattern RE] [--type-pattern RE]
        [--q Q] [--mq MQ] [--attrs A,B] [--order-by F] [--limit N] [--offset N]
        [--tenant S] [--service-path P] [--json] [...connection options]

Both ask a connection point (``Client.get_entity``, ``Client.query``), which answers as the
NGSI v2 front does ``GET /v2/entities/{id}`` and ``GET /v2/entities`` (same parameters, same
limits: ``--limit`` at most 1000, default 20; docs/ngsi.md). Output: a table (one row per
entity, one column per attribute, values as JSON) with ``N of M entities`` under it, or the
NGSI JSON with ``--json``. Errors a user can fix (no such entity, a bad ``q``, no cluster)
are one line on stderr and exit status 2; a cluster that cannot answer (its store is down)
exits 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import IO, Any

from broker.commands.publish import add_connection_options, open_client
from broker.errors import SilboError, Unavailable

__all__ = ["configure_get", "configure_query", "table"]

_CELL = 40  # widest a table cell grows before it is cut with "..."


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tenant", default="", help="the tenant (Fiware-Service)")
    parser.add_argument(
        "--service-path", default="", help="the service path(s) (Fiware-ServicePath; default /#)"
    )
    parser.add_argument("--attrs", default=None, help="only these attributes (comma-separated)")
    parser.add_argument("--json", action="store_true", help="print NGSI v2 JSON, not a table")
    add_connection_options(parser)


def configure_get(parser: argparse.ArgumentParser) -> None:
    """Add the options of ``silbo get``."""
    parser.add_argument("id", help="the entity's id")
    parser.add_argument("--type", default=None, help="the entity's type (needed if ambiguous)")
    _common(parser)
    parser.set_defaults(handler=run_get)


def configure_query(parser: argparse.ArgumentParser) -> None:
    """Add the options of ``silbo query``."""
    for flag, param, what in (
        ("--id", "id", "entity ids (comma-separated)"),
        ("--type", "type", "entity types (comma-separated)"),
        ("--id-pattern", "idPattern", "a regular expression the ids match"),
        ("--type-pattern", "typePattern", "a regular expression the types match"),
        ("--q", "q", "a filter on attribute values (NGSI q)"),
        ("--mq", "mq", "a filter on metadata (NGSI mq)"),
        ("--order-by", "orderBy", "order: id, type, dateCreated, an attribute; ! descends"),
        ("--limit", "limit", "at most this many entities (1 to 1000; default 20)"),
        ("--offset", "offset", "skip this many first"),
    ):
        parser.add_argument(flag, dest=f"param_{param}", default=None, help=what)
    _common(parser)
    parser.set_defaults(handler=run_query)


def _params(args: argparse.Namespace) -> dict[str, str]:
    params = {
        key.removeprefix("param_"): value
        for key, value in vars(args).items()
        if key.startswith("param_") and value is not None
    }
    if args.attrs is not None:
        params["attrs"] = args.attrs
    return params


def run_get(args: argparse.Namespace, out: IO[str] | None = None) -> int:
    """Print one entity."""
    stream = out or sys.stdout
    params = _params(args)
    try:
        with open_client(args) as client:
            entity = client.get_entity(
                args.id,
                entity_type=args.type,
                tenant=args.tenant,
                service_path=args.service_path,
                timeout=args.timeout,
                **params,
            )
    except SilboError as exc:
        return _failed("get", exc)
    if args.json:
        print(json.dumps(entity, ensure_ascii=False, indent=2), file=stream)
    else:
        print(table([entity]), file=stream)
    return 0


def run_query(args: argparse.Namespace, out: IO[str] | None = None) -> int:
    """Print the entities a query finds."""
    stream = out or sys.stdout
    params = {**_params(args), "options": "count"}
    try:
        with open_client(args) as client:
            entities, count = client.query(
                tenant=args.tenant, service_path=args.service_path, timeout=args.timeout, **params
            )
    except SilboError as exc:
        return _failed("query", exc)
    if args.json:
        print(json.dumps(entities, ensure_ascii=False, indent=2), file=stream)
        return 0
    if entities:
        print(table(entities), file=stream)
    print(f"{len(entities)} of {count} entities", file=stream)
    return 0


def _failed(command: str, exc: SilboError) -> int:
    print(f"silbo {command}: error: {exc}", file=sys.stderr)
    return 1 if isinstance(exc, Unavailable) else 2


def table(entities: Sequence[dict[str, Any]]) -> str:
    """Entities (NGSI v2 normalized) as a text table: id, type, then each attribute's value."""
    names: list[str] = []
    for entity in entities:
        names.extend(n for n in entity if n not in ("id", "type") and n not in names)
    header = ["id", "type", *names]
    rows = [
        [
            _cell(entity.get("id", "")),
            _cell(entity.get("type", "")),
            *(_cell(_value(entity.get(n))) for n in names),
        ]
        for entity in entities
    ]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return "\n".join(lines)


def _value(attribute: Any) -> Any:
    if attribute is None:
        return ""
    if isinstance(attribute, dict) and "value" in attribute:
        return attribute["value"]
    return attribute


def _cell(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = text.replace("\n", " ")
    return text if len(text) <= _CELL else text[: _CELL - 3] + "..."
