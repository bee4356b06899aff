"""The cluster token: what guards the internal services when one is set.

Every process of a cluster serves the internal services (``AccessPoint``, ``Matcher``,
``ExitPoint``, ``Delivery``, ``Admin``) on its gRPC port, and a connection point serves its
clients on the same port. With a token set (``SILBO_CLUSTER_TOKEN`` in the environment, or
``--cluster-token`` of ``silbo up`` / ``silbo run``, which set it for the processes they
start), an internal call must carry it in its ``silbo-cluster-token`` metadata or it is
refused with UNAUTHENTICATED: a client that reaches a connection point can publish and
subscribe, but cannot inject notifications (``Delivery.Deliver``) or act as a peer. Every
internal caller attaches the token (:func:`call_metadata`). Without a token nothing is
checked (a cluster on one host, or on a network of its own).
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

__all__ = ["INTERNAL_SERVICES", "METADATA_KEY", "TOKEN_ENV", "TokenCheck", "call_metadata"]

TOKEN_ENV = "SILBO_CLUSTER_TOKEN"
METADATA_KEY = "silbo-cluster-token"
INTERNAL_SERVICES = tuple(
    f"/broker.wire.{service}/"
    for service in ("AccessPoint", "Matcher", "ExitPoint", "Delivery", "Admin")
)


def cluster_token() -> str:
    """The token of this process's cluster ('' when none is set)."""
    return os.environ.get(TOKEN_ENV, "")


def call_metadata() -> tuple[tuple[str, str], ...] | None:
    """The metadata an internal call carries (None without a token)."""
    token = cluster_token()
    return ((METADATA_KEY, token),) if token else None


class TokenCheck(grpc.aio.ServerInterceptor):
    """Refuses internal calls that do not carry ``token`` (UNAUTHENTICATED)."""

    def __init__(self, token: str) -> None:
        self._token = token.encode()
        self._refusal = _refusal()

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]
        ],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        if details.method.startswith(INTERNAL_SERVICES):
            given = dict(details.invocation_metadata or ()).get(METADATA_KEY, "")
            if not hmac.compare_digest(str(given).encode(), self._token):
                return self._refusal
        return await continuation(details)


def _refusal() -> grpc.RpcMethodHandler[Any, Any]:
    async def refuse(_request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        await context.abort(
            grpc.StatusCode.UNAUTHENTICATED,
            "an internal service of a Silbo cluster: this call does not carry the cluster token",
        )

    # one handler for any call shape: the request is never read
    return grpc.stream_stream_rpc_method_handler(refuse)
