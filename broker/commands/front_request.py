"""What ``silbo aggregate`` and ``silbo alert`` share: finding an NGSI front, calling it.

A command names its front with ``--front http://HOST:PORT``, or takes the first HTTP front
``silbo up`` described in ``STATE_DIR/cluster.json`` (``--state-dir``, default ``.silbo``);
``--tenant`` and ``--service-path`` become ``Fiware-Service`` and ``Fiware-ServicePath``.
A request the front refuses is :class:`Failed` with its status and NGSI error (``400
BadRequest: ...``); one that does not reach it is :class:`Failed` with status 0.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO, Any

from broker.commands.publish import DEFAULT_STATE_DIR
from broker.errors import InvalidInput

__all__ = ["Failed", "add_front_options", "call", "front_of", "json_document"]

TIMEOUT = 10.0  # seconds a front may take to answer


class Failed(Exception):
    """A request the front refused (``status``) or that did not reach it (0)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def add_front_options(parser: argparse.ArgumentParser) -> None:
    """``--tenant``, ``--service-path``, and ``--front`` or ``--state-dir``."""
    parser.add_argument("--tenant", default="", metavar="S", help="the tenant (Fiware-Service)")
    parser.add_argument(
        "--service-path", default="", metavar="P", help="the service path (Fiware-ServicePath)"
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--front", default=None, metavar="URL", help="an NGSI front's URL")
    where.add_argument(
        "--state-dir",
        default=DEFAULT_STATE_DIR,
        metavar="DIR",
        help=f"the cluster silbo up described in DIR/cluster.json (default {DEFAULT_STATE_DIR})",
    )


def json_document(name: str, stdin: IO[str] | None = None) -> dict[str, Any]:
    """The JSON object in file ``name`` (``-``: stdin); InvalidInput if there is none."""
    text = (stdin or sys.stdin).read() if name == "-" else _read(name)
    try:
        body = json.loads(text)
    except ValueError as exc:
        raise InvalidInput(f"{name} holds no JSON: {exc}") from None
    if not isinstance(body, dict):
        raise InvalidInput(f"{name} holds no JSON object")
    return body


def front_of(args: argparse.Namespace) -> str:
    """The base URL of the front the arguments name (InvalidInput if none)."""
    if args.front is not None:
        url = args.front if "://" in args.front else f"http://{args.front}"
        return str(url).rstrip("/")
    described = Path(args.state_dir) / "cluster.json"
    try:
        endpoints = json.loads(described.read_text())["http_endpoints"]
    except (OSError, ValueError, KeyError, TypeError):
        endpoints = []
    if not endpoints:
        raise InvalidInput(
            f"no NGSI front described in {described}; start a cluster with silbo up "
            "--http-port, or name a front with --front http://HOST:PORT"
        )
    return f"http://{endpoints[0]}"


def call(base: str, args: argparse.Namespace, method: str, path: str, body: Any = None) -> Any:
    """One request to the front, as the tenant and service path of ``args``; its JSON
    answer (None: none). Failed if the front refuses it or cannot be reached."""
    headers = {"Fiware-Service": args.tenant}
    if args.service_path:
        headers["Fiware-ServicePath"] = args.service_path
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    request = urllib.request.Request(base + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as answer:
            payload = answer.read()
    except urllib.error.HTTPError as exc:
        raise Failed(exc.code, _error(exc.code, exc.read())) from None
    except (urllib.error.URLError, OSError) as exc:
        raise Failed(0, f"the front at {base} did not answer: {exc}") from None
    return json.loads(payload) if payload else None


def _error(status: int, payload: bytes) -> str:
    try:
        body = json.loads(payload)
        return f"{status} {body['error']}: {body['description']}"
    except (ValueError, KeyError, TypeError):
        return f"{status}: {payload[:200]!r}"


def _read(name: str) -> str:
    try:
        return Path(name).read_text()
    except OSError as exc:
        raise InvalidInput(f"cannot read {name}: {exc}") from None
