"""Entities and types as NGSI v2 reads answer them: the JSON of a query's page.

Pure functions over stored documents and a parsed query (:mod:`broker.store.query`,
:mod:`broker.store.entity_types`). Sources: Orion's ``doc/manuals/orion-api.md`` ("api"
below) and its code ("code": apiTypesV2/Entity.cpp ``filterAndOrderAttrs``,
``toJsonUniqueValues``).

- Formats (api: Simplified Entity Representation): ``normalized`` (``{"id", "type", name:
  {"type", "value", "metadata"}}``, ``metadata`` always present), ``keyValues`` (bare
  values), ``values`` (a list of values in ``attrs`` order) and ``unique`` (``values`` with
  a value repeated within one entity left out: Orion compares the values' JSON text, so
  does Silbo, whose text of ``1.0`` is not ``1``'s).
- Attributes (api: Filtering out attributes and metadata; code: ``filterAndOrderAttrs``):
  ``attrs`` absent, every user attribute in stored order; listed, those, in the list's
  order; with ``*``, every user attribute in stored order and the builtins named. Builtin
  attributes appear only when named: ``dateCreated``, ``dateModified`` (the entity's dates,
  ``DateTime``), ``servicePath`` (``Text``) and ``dateExpires`` (a stored attribute, hidden
  unless named).
- Metadata likewise with ``metadata``: absent, every user metadata; listed, those (``*``
  for every user one) and the builtins named, ``dateCreated`` / ``dateModified`` (the
  attribute's dates). Dates render as :func:`broker.store.semantics.iso8601` does.
- ``GET .../attrs/{name}``: a stored attribute only; builtins "cannot be used in resource
  URLs" (api: Builtin Attributes), so naming one is 404 as for any missing attribute.
- Types (api: List Entity Types): ``[{"type", "attrs": {name: {"types": [...]}}, "count"}]``,
  or the bare names with ``options=values``; one type: ``{"attrs", "count"}``, 404 "Entity
  type not found" when no entity has it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from broker.errors import NotFound
from broker.store.entity_types import TypesPage, TypesQuery, TypeSummary
from broker.store.query import EntityQuery, Format, Page
from broker.store.semantics import Document, iso8601

__all__ = [
    "render",
    "render_attribute",
    "render_page",
    "render_type",
    "render_types",
]

_NO_ATTRIBUTE = "The entity does not have such an attribute"
_NO_TYPE = "Entity type not found"
_ALL = "*"


# -- rendering --------------------------------------------------------------------------------


def render_page(page: Page, query: EntityQuery) -> list[Any]:
    """The JSON body of a list query: each entity of the page, rendered."""
    return [render(document, query) for document in page.documents]


def render(document: Document, query: EntityQuery, *, with_id: bool = True) -> Any:
    """One entity in the query's format, with its ``attrs`` and ``metadata`` filters (without
    ``id`` and ``type`` when not ``with_id``, as ``GET .../attrs`` answers)."""
    attributes = _chosen(document, query.attrs)
    if query.format is Format.VALUES:
        return [a["value"] for a in attributes.values()]
    if query.format is Format.UNIQUE:
        seen: dict[str, Any] = {}
        for attribute in attributes.values():
            seen.setdefault(_json_text(attribute["value"]), attribute["value"])
        return list(seen.values())
    out: dict[str, Any] = {"id": document.id, "type": document.type} if with_id else {}
    if query.format is Format.KEY_VALUES:
        out.update((name, a["value"]) for name, a in attributes.items())
        return out
    for name, attribute in attributes.items():
        out[name] = _with_metadata(document, name, attribute, query.metadata)
    return out


def render_attribute(document: Document, name: str, query: EntityQuery) -> dict[str, Any]:
    """``GET .../attrs/{name}``: the stored attribute (NotFound, 404, if the entity has none;
    builtins cannot be named in a URL, api: Builtin Attributes)."""
    attribute = document.attributes.get(name)
    if attribute is None:
        raise NotFound(_NO_ATTRIBUTE)
    return _with_metadata(document, name, attribute, query.metadata)


def render_types(page: TypesPage, query: TypesQuery) -> list[Any]:
    """The JSON body of ``GET /v2/types``."""
    if query.values:
        return [name for name, _ in page.types]
    return [{"type": name, **_type_body(summary)} for name, summary in page.types]


def render_type(page: TypesPage) -> dict[str, Any]:
    """The JSON body of ``GET /v2/types/{type}`` (NotFound, 404, if no entity has it)."""
    if not page.types:
        raise NotFound(_NO_TYPE)
    return _type_body(page.types[0][1])


# -- rendering helpers --------------------------------------------------------------------------


def _chosen(document: Document, attrs: tuple[str, ...] | None) -> dict[str, dict[str, Any]]:
    """The attributes to render, in order (api: Filtering out attributes and metadata)."""
    stored = document.attributes
    if attrs is None:
        return {n: a for n, a in stored.items() if n != "dateExpires"}
    named = set(attrs)
    out: dict[str, dict[str, Any]] = {}
    if _ALL in named:
        out = {n: a for n, a in stored.items() if n != "dateExpires" or n in named}
    for name in attrs:
        if name in out or name == _ALL:
            continue
        attribute = stored.get(name) or _builtin(document, name)
        if attribute is not None:
            out[name] = attribute
    return out


def _builtin(document: Document, name: str) -> dict[str, Any] | None:
    if name == "dateCreated":
        return {"type": "DateTime", "value": iso8601(document.date_created), "metadata": {}}
    if name == "dateModified":
        return {"type": "DateTime", "value": iso8601(document.date_modified), "metadata": {}}
    if name == "servicePath":
        return {"type": "Text", "value": document.service_path, "metadata": {}}
    return None


def _with_metadata(
    document: Document, name: str, attribute: Mapping[str, Any], wanted: tuple[str, ...] | None
) -> dict[str, Any]:
    """The attribute in normalized form, with only the wanted metadata."""
    stored: Mapping[str, Any] = attribute["metadata"]
    if wanted is None:
        metadata = dict(stored)
    else:
        metadata = dict(stored) if _ALL in wanted else {}
        created, modified = document.dates(name)
        for meta in wanted:
            if meta in stored:
                metadata[meta] = stored[meta]
            elif meta == "dateCreated" and name in document.attributes:
                metadata[meta] = {"type": "DateTime", "value": iso8601(created)}
            elif meta == "dateModified" and name in document.attributes:
                metadata[meta] = {"type": "DateTime", "value": iso8601(modified)}
    return {"type": attribute["type"], "value": attribute["value"], "metadata": metadata}


def _json_text(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _type_body(summary: TypeSummary) -> dict[str, Any]:
    attrs = {name: {"types": sorted(summary.attrs[name])} for name in sorted(summary.attrs)}
    return {"attrs": attrs, "count": summary.count}
