"""Silbo: an elastic content-based publish/subscribe broker for NGSI v2 context data."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]

import os as _os

# Silbo processes start other processes (fork + exec) while gRPC channels are open; gRPC's
# fork handlers would then run in the child before its exec and can break it. Silbo never
# uses gRPC across a fork, so they are off unless the environment says otherwise (this must
# happen before grpc is first imported).
_os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
