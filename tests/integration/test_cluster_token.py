"""A cluster with a token: clients publish and subscribe as ever; an internal service called
without the token (an injected notification, a peer's stream, an admin status) is refused
with UNAUTHENTICATED, and the cluster goes on serving."""

from __future__ import annotations

import grpc
import pytest
from conftest import StartCluster

from broker.client import Client
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


def test_internal_services_want_the_token_and_clients_do_not(
    start_cluster: StartCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOKEN_ENV, "s3cret-token")
    cluster = start_cluster(matchers=2)
    address = cluster.endpoints[0]
    with Client(cluster.endpoints) as client:
        room = client.subscribe(type="Room")
        client.publish(ContextUpdate.of("Room1", {"t": 1}, entity_type="Room"))
        assert room.get(timeout=15).update.entity_id == "Room1"  # every internal hop passed

        assert _inject(address, None) == grpc.StatusCode.UNAUTHENTICATED
        assert _inject(address, ((METADATA_KEY, "guess"),)) == grpc.StatusCode.UNAUTHENTICATED
        assert _inject(address, ((METADATA_KEY, "s3cret-token"),)) == grpc.StatusCode.OK

        with grpc.insecure_channel(address) as channel:
            admin = wire_grpc.AdminStub(channel)  # type: ignore[no-untyped-call]
            with pytest.raises(grpc.RpcError) as refused:
                admin.Status(wire.StatusRequest(), timeout=5)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "cluster token" in str(refused.value.details())
        # silbo admin status carries the token of its environment
        status = gather_status(cluster.zk_address, cluster.spec.cluster, interval=0)
        assert all(p["reachable"] for p in status["processes"])

        client.publish(ContextUpdate.of("Room2", {"t": 2}, entity_type="Room"))
        assert room.get(timeout=15).update.entity_id == "Room2"  # still serving
