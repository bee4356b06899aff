"""A matcher's subscriptions, listed for ``silbo replay --state-dir`` (``Matcher.Subscriptions``).

A matcher lists the subscriptions it owns under the current configuration's selector: during
a scale it may also hold subscriptions that arrived for the next epoch, or that moved away
and are not dropped yet; those are some other matcher's to list. The list is a stream of
parts (:mod:`broker.partition.parts`, addressed to the matcher itself), each at most
:data:`PART_SIZE` subscriptions, packed between turns of the event loop so that matching
goes on meanwhile.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from broker.coordination.configuration import Configuration
from broker.partition.parts import SubscriptionSource, pack_part
from broker.wire import internal_pb2 as wire

__all__ = ["PART_SIZE", "owned_parts"]

PART_SIZE = 5000


async def owned_parts(
    holder: SubscriptionSource, name: str, configuration: Configuration | None
) -> AsyncIterator[wire.Part]:
    """The subscriptions of ``holder`` that ``name`` owns under ``configuration``, as parts
    for ``name`` (at least one; none when ``name`` is not one of its matchers)."""
    if configuration is None or name not in configuration.selector.owners:
        return
    held = list(holder.subscriptions())  # a snapshot: taken without yielding to the loop
    owners = configuration.selector.owners_of([s.id for s in held]) if held else []
    mine = [s for s, owner in zip(held, owners, strict=True) if owner == name]
    for start in range(0, max(len(mine), 1), PART_SIZE):  # one part at least, maybe empty
        data = pack_part(name, mine[start : start + PART_SIZE])
        yield wire.Part(sender=name, epoch=configuration.epoch, data=data)
        await asyncio.sleep(0)
