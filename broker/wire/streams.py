"""The internal streams by name, as the generated service descriptors spell them.

A :class:`broker.runtime.link.Link` opens a stream by its method path; these are read from
``internal.proto``'s descriptors, so a renamed service or method fails at import, not at the
first call.
"""

from __future__ import annotations

from broker.wire import internal_pb2 as wire

__all__ = ["COLLECT", "DELIVER", "MATCH", "ROUTE", "method_path"]


def method_path(service: str, method: str) -> str:
    """``/package.Service/Method`` of a method of ``internal.proto`` (KeyError if none)."""
    described = wire.DESCRIPTOR.services_by_name[service].methods_by_name[method]
    return f"/{described.containing_service.full_name}/{described.name}"


ROUTE = method_path("AccessPoint", "Route")  # connection point -> access point
MATCH = method_path("Matcher", "Match")  # access point -> matcher
COLLECT = method_path("ExitPoint", "Collect")  # matcher -> exit point
DELIVER = method_path("Delivery", "Deliver")  # exit point -> connection point
