"""Silbo: an elastic content-based publish/subscribe broker for NGSI v2 context data.

The distribution is ``silbo``, the import name ``broker``. The public API is :data:`__all__`:
the client, the model, the matching engine and the errors. Each name is imported on first use,
so ``import broker`` stays light (every Silbo process imports it).
"""

from __future__ import annotations

import os as _os
from importlib import import_module as _import_module
from typing import TYPE_CHECKING, Any

from broker._version import __version__

# Silbo processes start other processes (fork + exec) while gRPC channels are open; gRPC's
# fork handlers would then run in the child before its exec and can break it. Silbo never
# uses gRPC across a fork, so they are off unless the environment says otherwise (this must
# happen before grpc is first imported).
_os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

if TYPE_CHECKING:
    from broker.client import Client, Notification, SubscriptionHandle
    from broker.errors import (
        AddressInUse,
        AlreadyExists,
        InvalidIdentifier,
        InvalidInput,
        InvalidRegex,
        InvalidSubscription,
        InvalidUpdate,
        InvalidValue,
        MissingExtra,
        NotFound,
        QuerySyntaxError,
        SerializationError,
        SilboError,
        Unavailable,
    )
    from broker.matching.engine import Engine
    from broker.model.attribute import Attribute, Metadata
    from broker.model.subscription import (
        AttrsFormat,
        EntitySelector,
        NotificationOptions,
        Status,
        Subscription,
    )
    from broker.model.update import ContextUpdate

# public name -> the module that defines it
_SOURCES: dict[str, str] = {
    "Client": "broker.client",
    "Notification": "broker.client",
    "SubscriptionHandle": "broker.client",
    "ContextUpdate": "broker.model.update",
    "Attribute": "broker.model.attribute",
    "Metadata": "broker.model.attribute",
    "Subscription": "broker.model.subscription",
    "EntitySelector": "broker.model.subscription",
    "NotificationOptions": "broker.model.subscription",
    "AttrsFormat": "broker.model.subscription",
    "Status": "broker.model.subscription",
    "Engine": "broker.matching.engine",
    **{
        name: "broker.errors"
        for name in (
            "SilboError",
            "InvalidInput",
            "InvalidIdentifier",
            "InvalidValue",
            "QuerySyntaxError",
            "InvalidRegex",
            "InvalidSubscription",
            "InvalidUpdate",
            "SerializationError",
            "NotFound",
            "AlreadyExists",
            "Unavailable",
            "AddressInUse",
            "MissingExtra",
        )
    },
}

__all__ = [
    "AddressInUse",
    "AlreadyExists",
    "Attribute",
    "AttrsFormat",
    "Client",
    "ContextUpdate",
    "Engine",
    "EntitySelector",
    "InvalidIdentifier",
    "InvalidInput",
    "InvalidRegex",
    "InvalidSubscription",
    "InvalidUpdate",
    "InvalidValue",
    "Metadata",
    "MissingExtra",
    "NotFound",
    "Notification",
    "NotificationOptions",
    "QuerySyntaxError",
    "SerializationError",
    "SilboError",
    "Status",
    "Subscription",
    "SubscriptionHandle",
    "Unavailable",
    "__version__",
]


def __getattr__(name: str) -> Any:
    source = _SOURCES.get(name)
    if source is None:
        raise AttributeError(f"module 'broker' has no attribute {name!r}")
    value = getattr(_import_module(source), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
