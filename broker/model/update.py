"""A context update: what an IoT agent publishes and what subscriptions are matched against."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from broker.errors import InvalidUpdate
from broker.model.attribute import Attribute
from broker.model.identifiers import (
    DEFAULT_SERVICE_PATH,
    check_identifier,
    check_service_path,
    check_tenant,
)

__all__ = ["DEFAULT_ENTITY_TYPE", "RESERVED_ATTRIBUTE_NAMES", "ContextUpdate"]

DEFAULT_ENTITY_TYPE = "Thing"
RESERVED_ATTRIBUTE_NAMES = frozenset({"id", "type", "geo:distance", "*"})


@dataclass(frozen=True, slots=True)
class ContextUpdate:
    """One entity's new attribute values, as published under a tenant and a service path.

    ``publisher`` and ``sequence`` identify the update: a publisher numbers its updates
    1, 2, 3, ... and the broker delivers notifications in that order per publisher.
    Construction validates every field and raises InvalidInput subclasses.
    """

    entity_id: str
    attributes: Mapping[str, Attribute] = field(default_factory=dict)
    entity_type: str = DEFAULT_ENTITY_TYPE
    tenant: str = ""
    service_path: str = DEFAULT_SERVICE_PATH
    publisher: str = ""
    sequence: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "entity_id", check_identifier(self.entity_id, "entity id"))
        object.__setattr__(self, "entity_type", check_identifier(self.entity_type, "entity type"))
        object.__setattr__(self, "tenant", check_tenant(self.tenant))
        object.__setattr__(self, "service_path", check_service_path(self.service_path))
        if not isinstance(self.attributes, Mapping):
            raise InvalidUpdate("attributes must be a mapping of name to Attribute")
        for name, attribute in self.attributes.items():
            check_identifier(name, "attribute name")
            if name in RESERVED_ATTRIBUTE_NAMES:
                raise InvalidUpdate(f"attribute name {name!r} is reserved")
            if not isinstance(attribute, Attribute):
                raise InvalidUpdate(f"attribute {name!r} must be an Attribute, not {attribute!r}")
        if not isinstance(self.publisher, str):
            raise InvalidUpdate("publisher must be a string")
        if isinstance(self.sequence, bool) or not isinstance(self.sequence, int):
            raise InvalidUpdate("sequence must be an integer")
        if self.sequence < 0:
            raise InvalidUpdate(f"sequence must not be negative, got {self.sequence}")

    @classmethod
    def unchecked(
        cls,
        entity_id: str,
        attributes: Mapping[str, Attribute],
        entity_type: str,
        tenant: str,
        service_path: str,
    ) -> ContextUpdate:
        """An update from input already checked elsewhere (for instance by Spark's native
        checks): the fields are taken as they are."""
        update = object.__new__(cls)
        for name, value in (
            ("entity_id", entity_id),
            ("attributes", attributes),
            ("entity_type", entity_type),
            ("tenant", tenant),
            ("service_path", service_path),
            ("publisher", ""),
            ("sequence", 0),
        ):
            object.__setattr__(update, name, value)
        return update

    @classmethod
    def of(
        cls,
        entity_id: str,
        values: Mapping[str, Any],
        *,
        entity_type: str = DEFAULT_ENTITY_TYPE,
        tenant: str = "",
        service_path: str = DEFAULT_SERVICE_PATH,
        publisher: str = "",
        sequence: int = 0,
    ) -> ContextUpdate:
        """An update whose attributes are bare values, typed as Orion infers them."""
        return cls(
            entity_id,
            {name: Attribute.of(value) for name, value in values.items()},
            entity_type=entity_type,
            tenant=tenant,
            service_path=service_path,
            publisher=publisher,
            sequence=sequence,
        )
