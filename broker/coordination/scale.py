"""The scale protocol's znodes: the plan of a running scale, and its participants' reports.

Layout (under the cluster's chroot)::

    /scale                      persistent while a scale runs; JSON: the plan
        {"id": "...", "layer": "matchers", "old": <configuration>, "new": <configuration>,
         "connection_points": [], "started": 1763750000.5}
    /scale/owner                ephemeral: the coordinator's session (a scale without it is
                                stale: its coordinator died)
    /scale/ready/<matcher>      each matcher of the new configuration once it holds its parts;
                                JSON {"moved": n, "bytes": b} received
    /scale/done/<matcher>       each matcher of the old configuration once every access point
                                has switched on its channel (it dropped what moved away)
    /scale/drained/<exit point> (exit-point scales) each exit point of the old configuration
                                once it delivered every batch of the old epoch
    /scale/moved/<connection point>  (access-point and connection-point scales) each
                                connection point once it moved its traffic where the plan
                                wants it

Only one scale at a time: :func:`begin` creates ``/scale`` or fails with ScaleInProgress.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError, NoNodeError

from broker.coordination.configuration import Configuration
from broker.coordination.errors import CoordinationError, CorruptCoordinationData, translated

__all__ = [
    "SCALE",
    "ScaleInProgress",
    "ScalePlan",
    "begin",
    "finish",
    "read_plan",
    "report",
    "reports",
]

SCALE = "/scale"


class ScaleInProgress(CoordinationError):
    """Another scale is running; one runs at a time."""


@dataclass(frozen=True, slots=True)
class ScalePlan:
    """A scale of one layer from one configuration to the next (epoch + 1).

    A connection-point scale leaves the configuration as it is (``new`` is ``old``) and names
    the connection points that stay in ``connection_points``.
    """

    id: str
    old: Configuration
    new: Configuration
    started: float
    layer: str = "matchers"
    connection_points: tuple[str, ...] = ()

    @classmethod
    def of(
        cls,
        old: Configuration,
        new: Configuration,
        *,
        layer: str = "matchers",
        connection_points: tuple[str, ...] = (),
    ) -> ScalePlan:
        """A new plan with a fresh id."""
        return cls(uuid.uuid4().hex[:12], old, new, time.time(), layer, connection_points)

    def encode(self) -> bytes:
        """The /scale znode's JSON data."""
        return json.dumps(
            {
                "id": self.id,
                "layer": self.layer,
                "old": json.loads(self.old.encode()),
                "new": json.loads(self.new.encode()),
                "connection_points": list(self.connection_points),
                "started": self.started,
            }
        ).encode()

    @classmethod
    def decode(cls, data: bytes) -> ScalePlan:
        """The plan in ``data``; CorruptCoordinationData if unreadable."""
        try:
            body = json.loads(data)
            return cls(
                str(body["id"]),
                Configuration.decode(json.dumps(body["old"]).encode()),
                Configuration.decode(json.dumps(body["new"]).encode()),
                float(body["started"]),
                str(body.get("layer", "matchers")),
                tuple(str(n) for n in body.get("connection_points", [])),
            )
        except (ValueError, TypeError, KeyError) as exc:
            raise CorruptCoordinationData(f"the scale plan is unreadable: {exc}") from exc


def begin(client: KazooClient, plan: ScalePlan) -> None:
    """Publish the plan; ScaleInProgress if a live scale exists (a stale one is removed).

    The plan and its report directories appear in one transaction: a participant that sees
    the plan can always report.
    """
    with translated("begin a scale"):
        if client.exists(SCALE) is not None:
            if client.exists(f"{SCALE}/owner") is not None:
                raise ScaleInProgress(
                    "another scale is running; wait for it to end (one scale at a time)"
                )
            client.delete(SCALE, recursive=True)  # its coordinator died: stale
        transaction = client.transaction()
        transaction.create(SCALE, plan.encode())
        transaction.create(f"{SCALE}/ready")
        transaction.create(f"{SCALE}/done")
        transaction.create(f"{SCALE}/drained")
        transaction.create(f"{SCALE}/moved")
        transaction.create(f"{SCALE}/owner", plan.id.encode(), ephemeral=True)
        results = transaction.commit()
        failures = [r for r in results if isinstance(r, Exception)]
        if failures:
            if isinstance(failures[0], NodeExistsError):
                raise ScaleInProgress("another scale began at the same moment; try again")
            raise failures[0]


def read_plan(client: KazooClient) -> ScalePlan | None:
    """The running scale's plan, or None."""
    with translated("read the scale plan"):
        try:
            data, _stat = client.get(SCALE)
        except NoNodeError:
            return None
    return ScalePlan.decode(data)


def report(client: KazooClient, stage: str, name: str, body: Mapping[str, float]) -> None:
    """A participant reports a stage (``ready`` or ``done``) of the running scale."""
    with translated(f"report {stage} for {name}"):
        try:
            client.create(f"{SCALE}/{stage}/{name}", json.dumps(body).encode())
        except NodeExistsError:
            pass
        except NoNodeError:
            pass  # the scale ended (rolled back) meanwhile


def reports(client: KazooClient, stage: str) -> dict[str, dict[str, float]]:
    """The reports of a stage so far, by participant."""
    found: dict[str, dict[str, float]] = {}
    with translated(f"read the {stage} reports"):
        try:
            names = client.get_children(f"{SCALE}/{stage}")
        except NoNodeError:
            return found
        for name in names:
            try:
                data, _stat = client.get(f"{SCALE}/{stage}/{name}")
            except NoNodeError:
                continue
            found[name] = json.loads(data) if data else {}
    return found


def finish(client: KazooClient) -> None:
    """Remove the scale's znodes (it completed or was rolled back)."""
    with translated("end the scale"), contextlib.suppress(NoNodeError):
        client.delete(SCALE, recursive=True)
