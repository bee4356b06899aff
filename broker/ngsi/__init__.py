"""The NGSI v2 HTTP front of a connection point (docs/ngsi.md): Orion's API for publishing
updates and managing subscriptions whose notifications are HTTP requests."""

from __future__ import annotations

from broker.ngsi.allow import AllowList
from broker.ngsi.front import BrokerPort, FrontOptions, NgsiFront
from broker.ngsi.routes import add_routes

__all__ = ["AllowList", "BrokerPort", "FrontOptions", "NgsiFront", "add_routes"]
