"""``silbo publish``: publish one context update to a running cluster.

    silbo publish --entity ID [--type T] [--tenant S] [--service-path P]
        [--publisher NAME] [--sequence N]
        [--timeout S] [--state-dir DIR | --connect HOST:PORT[,...]]
        NAME=VALUE | NAME:TYPE=VALUE ...

Each ``NAME=VALUE`` is one attribute. ``VALUE`` is read as JSON when it parses as JSON
(``30`` and ``21.5`` are Numbers, ``true`` a Boolean, ``null`` None, ``{"a": 1}`` and
``[1, 2]`` StructuredValues, ``'"30"'`` the Text ``30``) and is taken as text otherwise
(``hello``, ``01234``, ``NaN``, an empty value). The NGSI type is the one Orion infers from the
value, unless ``NAME:TYPE=VALUE`` names it: ``dateObserved:DateTime=2024-01-01T00:00:00Z``,
``location:geo:json={"type": "Point", "coordinates": [2.1, 41.4]}``. The first ``:`` ends the
name (so types such as ``geo:json`` work, and attribute names holding a ``:`` cannot be given
here). With the types ``Text``, ``DateTime`` and ``ISO8601`` the value is always taken verbatim
as text (``zip:Text=08001`` and ``code:Text=42`` are strings).

``--publisher`` names the publisher (a fresh ``client-...`` name otherwise) and ``--sequence``
numbers this update (default 1): a publisher numbers its updates 1, 2, 3, ... and
notifications keep that order, so a script publishing in turn gives ``--sequence`` its own
count. The command prints one line (``published Room1 (3 attributes) as NAME #1``) and exits
0. Errors a user can fix (a bad identifier or value, an argument that is not ``NAME=VALUE``,
no cluster in the state directory, an endpoint that does not answer within ``--timeout``)
are one line on stderr and exit status 2.

The cluster is the one ``silbo up`` described in ``STATE_DIR/cluster.json`` (``--state-dir``,
default ``.silbo``), or the connection points given with ``--connect``. This module also
holds those connection options for the other client commands (``silbo subscribe``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from broker.client import Client
from broker.commands import standalone
from broker.errors import InvalidInput, SilboError, Unavailable
from broker.model.attribute import DATE_TYPES, Attribute
from broker.model.identifiers import DEFAULT_SERVICE_PATH
from broker.model.update import DEFAULT_ENTITY_TYPE, ContextUpdate
from broker.wire import client_pb2 as pb
from broker.wire.convert import entity_from_update

__all__ = [
    "DEFAULT_STATE_DIR",
    "DEFAULT_TIMEOUT",
    "add_connection_options",
    "configure",
    "main",
    "open_client",
    "parse_assignment",
    "positive_int",
    "positive_seconds",
    "run",
]

DEFAULT_STATE_DIR = ".silbo"
DEFAULT_TIMEOUT = 10.0
_VERBATIM_TYPES = frozenset({"Text", *DATE_TYPES})
_PROG = "silbo publish"
_EPILOG = """\
values:
  VALUE is JSON when it parses as JSON: 30 and 21.5 are Numbers, true a Boolean,
  null None, {"a": 1} and [1, 2] StructuredValues, '"30"' the Text 30; anything
  else is text (hello, 01234, NaN). NAME:TYPE=VALUE names the NGSI type instead:
    dateObserved:DateTime=2024-01-01T00:00:00Z
    location:geo:json='{"type": "Point", "coordinates": [2.1, 41.4]}'
  (the first ':' ends the name). Text, DateTime and ISO8601 values are taken
  verbatim as text: code:Text=42 is the string "42".

example:
  silbo publish --entity Room1 --type Room temperature=23.5 occupied=true
"""


def positive_int(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    try:
        number = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"{text} is not at least 1")
    return number


def positive_seconds(text: str) -> float:
    """An argparse type: a finite number of seconds above 0."""
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < seconds < float("inf"):
        raise argparse.ArgumentTypeError(f"{text} is not a positive number of seconds")
    return seconds


def add_connection_options(parser: argparse.ArgumentParser) -> None:
    """Add ``--state-dir DIR | --connect HOST:PORT[,...]`` and ``--timeout S``."""
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--state-dir",
        default=DEFAULT_STATE_DIR,
        metavar="DIR",
        help=f"the cluster silbo up described in DIR/cluster.json (default {DEFAULT_STATE_DIR})",
    )
    where.add_argument(
        "--connect",
        default=None,
        metavar="HOST:PORT[,HOST:PORT]",
        help="connection points to use instead of a state directory",
    )
    parser.add_argument(
        "--timeout",
        type=positive_seconds,
        default=DEFAULT_TIMEOUT,
        metavar="S",
        help=f"seconds to wait for the cluster to answer (default {DEFAULT_TIMEOUT:g})",
    )


def open_client(args: argparse.Namespace, *, publisher: str | None = None) -> Client:
    """A client of the cluster named by the connection options (InvalidInput if there is none)."""
    if args.connect is not None:
        return Client(args.connect, publisher=publisher, timeout=args.timeout)
    described = Path(args.state_dir) / "cluster.json"
    if not described.is_file():
        raise InvalidInput(
            f"no cluster described in {described}; start one with silbo up, or name its "
            "connection points with --connect HOST:PORT"
        )
    try:
        return Client.from_state_dir(args.state_dir, publisher=publisher, timeout=args.timeout)
    except InvalidInput as exc:
        raise InvalidInput(
            f"{exc}; start a cluster with silbo up, or name its connection points with "
            "--connect HOST:PORT"
        ) from None


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the options of ``silbo publish``."""
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = _EPILOG
    parser.add_argument("--entity", required=True, metavar="ID", help="the entity id")
    parser.add_argument(
        "--type",
        default=DEFAULT_ENTITY_TYPE,
        metavar="T",
        help=f"the entity type (default {DEFAULT_ENTITY_TYPE})",
    )
    parser.add_argument("--tenant", default="", metavar="S", help="the tenant (Fiware-Service)")
    parser.add_argument(
        "--service-path",
        default=DEFAULT_SERVICE_PATH,
        metavar="P",
        help=f"the service path (Fiware-ServicePath, default {DEFAULT_SERVICE_PATH})",
    )
    parser.add_argument(
        "--publisher", default=None, metavar="NAME", help="the publisher's name (default: fresh)"
    )
    parser.add_argument(
        "--sequence",
        type=positive_int,
        default=1,
        metavar="N",
        help="this update's number in the publisher's order (default 1)",
    )
    parser.add_argument(
        "--store",
        action="store_true",
        help="upsert it in the context store first and publish the whole stored entity (what "
        "an NGSI write does: readers see it, subscriptions match the merged entity)",
    )
    add_connection_options(parser)
    parser.add_argument(
        "attributes",
        nargs="*",
        metavar="NAME[:TYPE]=VALUE",
        help="an attribute; VALUE is JSON if it parses as JSON, text otherwise",
    )
    parser.set_defaults(handler=run)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _value(text: str) -> Any:
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except ValueError:
        return text


def parse_assignment(text: str) -> tuple[str, Attribute]:
    """``(name, attribute)`` of one ``NAME=VALUE`` or ``NAME:TYPE=VALUE`` argument."""
    left, equals, raw = text.partition("=")
    if not equals:
        raise InvalidInput(f"{text!r} is not NAME=VALUE (or NAME:TYPE=VALUE): it has no '='")
    name, colon, type_ = left.partition(":")
    if not name:
        raise InvalidInput(f"{text!r} names no attribute before the '='")
    if colon and not type_:
        raise InvalidInput(f"{text!r} names no type after the ':'")
    what = f"attribute {name!r}"
    try:
        if type_ in _VERBATIM_TYPES:
            return name, Attribute.of(raw, type_)
        return name, Attribute.of(_value(raw), type_ or None)
    except InvalidInput as exc:  # "attribute is typed DateTime but ..." names the attribute
        message = str(exc).removeprefix("attribute")
        raise type(exc)(f"{what}{message}") from None


def _update(args: argparse.Namespace) -> ContextUpdate:
    attributes: dict[str, Attribute] = {}
    for text in args.attributes:
        name, attribute = parse_assignment(text)
        if name in attributes:
            raise InvalidInput(f"attribute {name!r} is given twice")
        attributes[name] = attribute
    return ContextUpdate(
        args.entity,
        attributes,
        entity_type=args.type,
        tenant=args.tenant,
        service_path=args.service_path,
    )


def run(args: argparse.Namespace) -> int:
    """Publish the update, wait for the cluster to accept it, print one line."""
    try:
        update = _update(args)
        with open_client(args, publisher=args.publisher) as client:
            request = pb.PublishRequest(
                publisher=client.publisher,
                first_sequence=args.sequence,
                entities=[entity_from_update(update)],
                store=args.store,
            )
            try:
                client.publish_requests([request])
            except TimeoutError:  # a client whose publish lets the future's timeout out
                raise Unavailable(
                    f"no answer from {client.target} within {args.timeout:g} s"
                ) from None
            publisher = client.publisher
    except SilboError as exc:
        print(f"{_PROG}: error: {exc}", file=sys.stderr)
        return 2
    count = len(update.attributes)
    noun = "attribute" if count == 1 else "attributes"
    print(f"published {update.entity_id} ({count} {noun}) as {publisher} #{args.sequence}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``silbo publish`` on its own: parse ``argv`` (default ``sys.argv[1:]``) and run it."""
    description = "Publish one context update to a running Silbo cluster."
    return standalone(_PROG, description, configure, run, argv)


if __name__ == "__main__":
    sys.exit(main())
