"""Internal services are kept from clients: a connection point's client port serves the client
API only (an injected notification or an admin status there is UNIMPLEMENTED), its internal
services listen on an internal port of their own; with a cluster token, an internal service
called without it (an injected notification, a peer's stream, an admin status) is refused
with UNAUTHENTICATED. Clients publish and subscribe as ever, and the cluster goes on serving."""

from __future__ import annotations

import grpc
import pytest
from conftest import StartCluster

from broker.client import Client
from broker.cluster.local import LocalCluster
from broker.commands.admin import gather_status
from broker.model.update import ContextUpdate
from broker.runtime.token import METADATA_KEY, TOKEN_ENV
from broker.wire import internal_pb2 as wire
from broker.wire import internal_pb2_grpc as wire_grpc

pytestmark = pytest.mark.slow


def _inject(address: str, metadata: tuple[tuple[str, str], ...] | None) -> grpc.StatusCode:
    """Try to hand the connection point a notification, as an exit point would."""
    handoff = wire.Handoff(hello=wire.Hello(sender="intruder", role="exit-point"))
    with grpc.insecure_channel(address) as channel:
        stub = wire_grpc.DeliveryStub(channel)  # type: ignore[no-untyped-call]
        try:
            stub.Deliver(iter([handoff]), timeout=10, metadata=metadata)
        except grpc.RpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


def _admin_status(address: str) -> grpc.RpcError | None:
    with grpc.insecure_channel(address) as channel:
        admin = wire_grpc.AdminStub(channel)  # type: ignore[no-untyped-call]
        try:
            admin.Status(wire.StatusRequest(), timeout=5)
        except grpc.RpcError as exc:
            return exc
    return None


def _internal_address(cluster: LocalCluster) -> str:
    (entry,) = [p for p in cluster.description["processes"] if p["role"] == "connection-point"]
    assert entry["address"] == cluster.endpoints[0] and entry["internal"] != entry["address"]
    return str(entry["internal"])


def test_the_client_port_serves_no_internal_service(start_cluster: StartCluster) -> None:
    cluster = start_cluster(matchers=1)
    internal = _internal_address(cluster)
    with Client(cluster.endpoints) as client:
        room = client.subscribe(type="Room")
        assert _inject(cluster.endpoints[0], None) == grpc.StatusCode.UNIMPLEMENTED
        refused = _admin_status(cluster.endpoints[0])
        assert refused is not None and refused.code() == grpc.StatusCode.UNIMPLEMENTED
        assert _admin_status(internal) is None  # peers and admin find it on the internal port
        client.publish(ContextUpdate.of("Room1", {"t": 1}, entity_type="Room"))
        assert room.get(timeout=15).update.entity_id == "Room1"  # still serving


def test_internal_services_want_the_token_and_clients_do_not(
    start_cluster: StartCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOKEN_ENV, "s3cret-token")
    cluster = start_cluster(matchers=2)
    address = _internal_address(cluster)
    with Client(cluster.endpoints) as client:
        room = client.subscribe(type="Room")
        client.publish(ContextUpdate.of("Room1", {"t": 1}, entity_type="Room"))
        assert room.get(timeout=15).update.entity_id == "Room1"  # every internal hop passed

        assert _inject(address, None) == grpc.StatusCode.UNAUTHENTICATED
        assert _inject(address, ((METADATA_KEY, "guess"),)) == grpc.StatusCode.UNAUTHENTICATED
        assert _inject(address, ((METADATA_KEY, "s3cret-token"),)) == grpc.StatusCode.OK

        refused = _admin_status(address)
        assert refused is not None and refused.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "cluster token" in str(refused.details())
        # silbo admin status carries the token of its environment
        status = gather_status(cluster.zk_address, cluster.spec.cluster, interval=0)
        assert all(p["reachable"] for p in status["processes"])

        client.publish(ContextUpdate.of("Room2", {"t": 2}, entity_type="Room"))
        assert room.get(timeout=15).update.entity_id == "Room2"  # still serving
