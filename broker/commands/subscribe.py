"""``silbo subscribe``: subscribe to a running cluster and print its notifications.

    silbo subscribe [--id ID | --id-pattern RE] [--type T | --type-pattern RE]
        [--attrs a,b] [--q EXPR] [--mq EXPR] [--condition-attrs a,b]
        [--tenant S] [--service-path P] [--count N]
        [--timeout S] [--state-dir DIR | --connect HOST:PORT[,...]]

Without ``--id``/``--id-pattern`` every entity id matches; ``--service-path`` is a scope
(``/a/#`` is ``/a`` and below it, the default ``/#`` everything). Once the cluster holds the
subscription, ``subscribed ID`` goes to stderr; then each notification is one JSON line on
stdout, flushed as it comes::

    {"subscriptionId": "...", "publisher": "client-...", "sequence": 1,
     "data": {"id": "Room1", "type": "Room",
              "temperature": {"type": "Number", "value": 30, "metadata": {}}}}

``data`` is the entity in NGSI v2 normalized form; with ``--attrs`` it holds only those
attributes. The command runs until Ctrl-C (it unsubscribes and exits 0), until ``--count N``
notifications were printed (exit 0), or until the reader of its output goes away
(``silbo subscribe | head -1``: exit 0). Errors a user can fix (a bad filter, pattern or name,
no cluster in the state directory, an endpoint that does not answer within ``--timeout``) are
one line on stderr and exit status 2; a subscription the cluster drops later (it went away
and did not come back) is one line on stderr and exit status 1.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import sys
from collections.abc import Sequence
from typing import Any

from broker.client import Client, Notification, SubscriptionHandle
from broker.commands.publish import add_connection_options, open_client, positive_int
from broker.errors import SilboError
from broker.model.identifiers import DEFAULT_SCOPE
from broker.model.update import ContextUpdate
from broker.wire import client_pb2 as pb
from broker.wire.convert import subscription_from_spec

__all__ = ["configure", "main", "notification_to_json", "run"]

_PROG = "silbo subscribe"
_EPILOG = """\
output:
  one JSON line per notification, on stdout (status lines go to stderr):
    {"subscriptionId": "...", "publisher": "...", "sequence": 1,
     "data": {"id": "Room1", "type": "Room",
              "temperature": {"type": "Number", "value": 30, "metadata": {}}}}
  until Ctrl-C or --count N notifications; exit status 0.

example:
  silbo subscribe --type Room --q 'temperature>25' --attrs temperature --count 1
"""
_POLL = 0.5  # seconds between looks at a quiet subscription (keeps Ctrl-C prompt)


def _names(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the options of ``silbo subscribe``."""
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = _EPILOG
    ids = parser.add_mutually_exclusive_group()
    ids.add_argument("--id", default=None, metavar="ID", help="the entity id")
    ids.add_argument(
        "--id-pattern", default=None, metavar="RE", help="a regular expression of entity ids"
    )
    types = parser.add_mutually_exclusive_group()
    types.add_argument("--type", default=None, metavar="T", help="the entity type")
    types.add_argument(
        "--type-pattern", default=None, metavar="RE", help="a regular expression of entity types"
    )
    parser.add_argument(
        "--attrs",
        type=_names,
        default=[],
        metavar="a,b",
        help="the attributes to show in each notification (default all)",
    )
    parser.add_argument("--q", default="", metavar="EXPR", help="an NGSI v2 q filter")
    parser.add_argument("--mq", default="", metavar="EXPR", help="an NGSI v2 mq (metadata) filter")
    parser.add_argument(
        "--condition-attrs",
        type=_names,
        default=[],
        metavar="a,b",
        help="notify only for updates that carry one of these attributes",
    )
    parser.add_argument("--tenant", default="", metavar="S", help="the tenant (Fiware-Service)")
    parser.add_argument(
        "--service-path",
        default=DEFAULT_SCOPE,
        metavar="P",
        help=f"the service path scope (default {DEFAULT_SCOPE}: all of them)",
    )
    parser.add_argument(
        "--count", type=positive_int, default=None, metavar="N", help="stop after N notifications"
    )
    add_connection_options(parser)
    parser.set_defaults(handler=run)


def _spec(args: argparse.Namespace) -> pb.SubscriptionSpec:
    spec = pb.SubscriptionSpec(
        tenant=args.tenant,
        service_path=args.service_path,
        condition_attrs=args.condition_attrs,
        q=args.q,
        mq=args.mq,
        attrs=args.attrs,
        description="silbo subscribe",
    )
    spec.entities.add(
        id=args.id or "",
        id_pattern=args.id_pattern or ("" if args.id else ".*"),
        type=args.type or "",
        type_pattern=args.type_pattern or "",
    )
    # The connection point checks it the same way; checking here first answers a typo
    # without a cluster, and before any connection is made.
    subscription_from_spec(spec, id="check", subscriber="silbo-subscribe")
    return spec


def notification_to_json(notification: Notification, attrs: Sequence[str] = ()) -> dict[str, Any]:
    """The JSON object ``silbo subscribe`` prints for a notification (``attrs``: only those)."""
    update: ContextUpdate = notification.update
    data: dict[str, Any] = {"id": update.entity_id, "type": update.entity_type}
    wanted = set(attrs)
    for name, attribute in update.attributes.items():
        if wanted and name not in wanted:
            continue
        data[name] = {
            "type": attribute.type,
            "value": attribute.value,
            "metadata": {
                key: {"type": item.type, "value": item.value}
                for key, item in attribute.metadata.items()
            },
        }
    return {
        "subscriptionId": notification.subscription_id,
        "publisher": update.publisher,
        "sequence": update.sequence,
        "data": data,
    }


def _silence_stdout() -> None:
    """Point stdout at /dev/null: its reader is gone, and the final flush must not fail."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # no real file descriptor (stdout replaced in-process)
        pass


def _print_notifications(
    subscription: SubscriptionHandle, attrs: Sequence[str], count: int | None
) -> bool:
    """Print notifications until ``count`` were printed (True) or the subscription ends (False).

    BrokenPipeError passes through: the reader of stdout went away.
    """
    printed = 0
    while count is None or printed < count:
        try:
            notification = subscription.get(timeout=_POLL)
        except queue.Empty:
            continue
        except StopIteration:
            return False
        sys.stdout.write(json.dumps(notification_to_json(notification, attrs)) + "\n")
        sys.stdout.flush()
        printed += 1
    return True


def _stop(client: Client, subscription: SubscriptionHandle | None) -> None:
    """Unsubscribe (best effort: closing the client drops the subscription anyway) and close."""
    try:
        if subscription is not None and not subscription.closed:
            subscription.unsubscribe()
    except (SilboError, KeyboardInterrupt):
        pass
    finally:
        client.close()


def run(args: argparse.Namespace) -> int:
    """Subscribe, print notifications as JSON lines, unsubscribe; the exit status."""
    try:
        spec = _spec(args)
        client = open_client(args)
    except SilboError as exc:
        print(f"{_PROG}: error: {exc}", file=sys.stderr)
        return 2
    subscription: SubscriptionHandle | None = None
    try:
        try:
            subscription = client.subscribe_many([spec])[0]
        except SilboError as exc:
            print(f"{_PROG}: error: {exc}", file=sys.stderr)
            return 2
        print(f"subscribed {subscription.id}", file=sys.stderr, flush=True)
        if not _print_notifications(subscription, args.attrs, args.count):
            print(
                f"{_PROG}: error: subscription {subscription.id} ended: the cluster dropped it",
                file=sys.stderr,
            )
            return 1
        return 0
    except KeyboardInterrupt:
        return 0
    except BrokenPipeError:
        _silence_stdout()
        return 0
    finally:
        _stop(client, subscription)


def main(argv: Sequence[str] | None = None) -> int:
    """``silbo subscribe`` on its own: parse ``argv`` (default ``sys.argv[1:]``) and run it."""
    parser = argparse.ArgumentParser(
        prog=_PROG, description="Subscribe to a running Silbo cluster; print notifications."
    )
    configure(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
