"""gRPC publishes through the context store (``PublishRequest.store``).

A publisher that sets ``store`` gets what an NGSI client gets: each entity is upserted in
the context store first (created, or its attributes appended: Orion's
``POST /v2/entities?options=upsert``, so update operators such as ``{"$inc": 1}`` apply),
and what is published is the whole stored entity with its change, exactly as the HTTP front
publishes it. Readers then see the publisher's updates, and a subscription's ``q`` on an
attribute the update did not carry, its condition attributes and ``onlyChangedAttrs`` behave
as for an NGSI write. An entity whose upsert changed nothing is published with the alteration
``entityUpdate``, as the HTTP front publishes it: only subscriptions that ask for
``entityUpdate`` fire on it (Orion's default, ``entityCreate`` and ``entityChange``, does
not). One the store refused (an operator on a value it cannot apply to, say) is named in the
batch's error while the others stay applied and published.

A batch the connection point has begun to store is run to its end, published too, even if
its publisher goes away meanwhile (broker.roles.connection_point): else a store write whose
publisher died (a context store publishing alerts or derived entities, killed) would stay
unnotified, its change seen by nobody.

Sequences keep their publisher's order: the published entities keep the sequence each had in
the batch (gaps where nothing was published), so per-publisher order and duplicate removal
downstream work as for any batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from broker.errors import SilboError, Unprocessable, error_for, mapping_for
from broker.model.update import DEFAULT_ENTITY_TYPE
from broker.ngsi.change import builtins_of, with_change
from broker.ngsi.entity import from_wire, to_wire
from broker.store.client import EntityStore
from broker.store.semantics import Mode
from broker.store.wire import Intent
from broker.wire import client_pb2 as pb

__all__ = ["Stored", "through_store"]

_NAMED = 5  # refused entities named in the batch's error


@dataclass
class Stored:
    """What a batch became in the store: the entities to publish (the stored ones, with
    their changes) and their sequences; the entities it refused, by index, and why."""

    entities: list[pb.Entity] = field(default_factory=list)
    sequences: list[int] = field(default_factory=list)
    refused: list[tuple[int, SilboError]] = field(default_factory=list)

    def refusal(self) -> SilboError | None:
        """The batch's error if the store refused any entity (the first one's kind)."""
        if not self.refused:
            return None
        first = self.refused[0][1]
        named = "; ".join(f"entity {i}: {error}" for i, error in self.refused[:_NAMED])
        more = len(self.refused) - _NAMED
        tail = f" (and {more} more)" if more > 0 else ""
        return error_for(
            mapping_for(first).grpc_status,
            f"the context store refused {len(self.refused)} of the batch's entities, the others "
            f"were stored and published: {named}{tail}",
            Unprocessable,
        )


async def through_store(
    store: EntityStore, entities: Sequence[pb.Entity], first_sequence: int
) -> Stored:
    """Upsert ``entities`` (validated: the connection point checked them) in order."""
    intents = [
        Intent(
            Mode.UPSERT,
            entity.id,
            entity.type or DEFAULT_ENTITY_TYPE,
            entity.service_path or "/",
            entity.tenant,
            from_wire(entity),
        )
        for entity in entities
    ]
    stored = Stored()
    for index, applied in enumerate(await store.apply(intents)):
        if applied.error is not None:
            stored.refused.append((index, applied.error))
        document = applied.document
        if applied.change is None or document is None:
            continue  # refused: the store applied nothing
        entity = to_wire(
            document.id, document.type, document.tenant, document.service_path,
            document.attributes,
        )  # fmt: skip
        stored.entities.append(with_change(entity, applied.change, builtins_of(applied)))
        stored.sequences.append(first_sequence + index)
    return stored
