"""The alert rules on a context store process: the rules followed, the transitions published.

The states and the transitions to publish are broker.store.alert_log's :class:`AlertLog`,
kept in the commits of the writes that ``Apply`` applies (broker.store.entities); this
module carries the rest (docs/alerts.md):

- the rules: followed in ZooKeeper (broker.coordination.alerts), handed to the log on every
  change (a changed rule applies from the next write);
- the outbox: after every ``Apply`` that made a transition, and every :data:`SWEEP` seconds
  (for what a failover, a restart or a partition copied here left, and what failed), the
  durable outbox entries of the partitions this store is the primary of are published in
  order through a connection point, like a gRPC publisher's with ``store`` set
  (broker.roles.stored_publish: upserted in the context store, then published with their
  change, so that subscriptions on alert entities are notified as for any context), then
  deleted (a commit replicated to the backups).

Once only: an entry this process staged is published as it is. Any other (found after a
failover or a restart, or whose publish failed) is *unsure*: it may have been published
already, by a store that died before deleting it, or be on its way still (a connection
point goes on with a stored batch whose publisher went away: broker.roles.connection_point).
Its alert entity is read first: an entry whose transition number it carries already is
deleted unpublished; one it does not carry waits until it has been unsure for
:data:`UNSURE_WAIT` seconds (longer than a connection point tries a batch's store writes),
then is read for again and published. Entries leave in order, one round at a time, and the
later entries of a (rule, entity) wait behind an earlier one, so a (rule, entity)'s
transitions reach its alert entity in order, each once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Final

from broker.client import Client
from broker.coordination.alerts import KeptRule, RulesWatch
from broker.errors import NotFound, SilboError
from broker.ngsi.entity import to_wire
from broker.roles.store_client import STORE_WAIT
from broker.roles.store_writer import StoreWriter
from broker.runtime.process import ProcessContext
from broker.store.alert_log import OUTBOX_BATCH, AlertLog, Outgoing, sorted_out
from broker.store.alerting import Rule, number_of, parse_rule

__all__ = ["SWEEP", "UNSURE_WAIT", "StoreAlerts"]

SWEEP: Final = 1.0  # seconds between looks at the outbox without a transition made here
# seconds an unsure entry that its alert entity does not carry waits before it is published
# (a publish of it sent before may still be on its way: a connection point tries a stored
# batch's store writes for STORE_WAIT)
UNSURE_WAIT: Final = STORE_WAIT + 1.0
RULES_WAIT: Final = 10.0  # seconds a starting store waits for the rules to be read
PUBLISH_TIMEOUT: Final = 10.0  # seconds a connection point may take to store alert entities

_log = logging.getLogger(__name__)

Mine = Callable[[], Callable[[int], bool]]  # now: whether this store is a partition's primary
Durable = Callable[[list[tuple[bytes, bytes]], list[bytes]], Awaitable[None]]


class StoreAlerts:
    """One context store's part of the alert rules (see the module doc)."""

    def __init__(
        self,
        store_id: str,
        log: AlertLog,
        context: ProcessContext,
        mine: Mine,
        serving: Callable[[], bool],
        durable: Durable,
    ) -> None:
        self.log = log
        self._store_id = store_id
        self._context = context
        self._mine = mine
        self._serving = serving
        self._durable = durable  # commit here and on the backups
        self._watch: RulesWatch | None = None
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._released = 0  # the log's released count last looked at
        self._unsure: dict[bytes, float] = {}  # unsure entry: when first seen (monotonic)
        self._writer = StoreWriter(context.zk, f"alerts-{self._store_id}", PUBLISH_TIMEOUT)
        self._read = asyncio.Event()  # the rules were read once

    async def start(self) -> None:
        """Follow the rules (read once before this returns, so that the store's first
        writes are evaluated), start the publisher."""
        loop = self._context.loop
        self._watch = await asyncio.to_thread(RulesWatch, self._context.zk, loop, self._defined)
        try:
            await asyncio.wait_for(self._read.wait(), RULES_WAIT)
        except TimeoutError:
            _log.warning("alert rules not read within %g s: evaluated once read", RULES_WAIT)
        self._task = asyncio.create_task(self._run(), name="alerts")

    async def stop(self) -> None:
        """Stop; the outbox stays (this store or the next primary publishes it)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._watch is not None:
            self._watch.stop()
        await self._writer.close()

    def observe(self) -> None:
        """An ``Apply`` ended: publish at once if it made transitions."""
        if self.log.released != self._released:
            self._released = self.log.released
            self._wake.set()

    # -- the loop -------------------------------------------------------------------------

    def _defined(self, known: dict[str, KeptRule]) -> None:
        rules: list[Rule] = []
        for name, kept in known.items():
            try:
                rules.append(parse_rule(kept.document, kept.tenant, kept.service_path))
            except SilboError as exc:
                _log.error("alert rule %s is not used: %s", name, exc)
        self.log.define(rules)
        self._read.set()

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), SWEEP)
            self._wake.clear()
            if not self._serving():
                continue
            try:
                await self._round()
            except (SilboError, OSError) as exc:
                _log.warning("alerts not published (again within %g s): %s", SWEEP, exc)
            except Exception:  # a bug must not stop the alerts for good: logged, again
                _log.exception("alerts not published (again within %g s)", SWEEP)

    async def _round(self) -> None:
        """Publish the outbox, a batch at a time, and delete what was published."""
        while True:
            entries = self.log.outbox(self._mine())
            if not entries:
                self._unsure.clear()
                return
            send, done = await self._sorted(entries)
            if send:
                try:
                    await self._publish(send)
                except (SilboError, OSError):
                    self.log.unsure(e.key for e in send)
                    raise
            if not done:
                return
            keys = [e.key for e in done]
            await self._durable([], keys)
            self.log.sent(keys)
            for key in keys:
                self._unsure.pop(key, None)
            if len(entries) < OUTBOX_BATCH:
                return

    async def _sorted(self, entries: list[Outgoing]) -> tuple[list[Outgoing], list[Outgoing]]:
        """The entries to publish now, and those done with (broker.store.alert_log's
        :func:`sorted_out`: unsure ones are read for first)."""
        carried = await self._published_already([e for e in entries if not e.sure])
        send, done = sorted_out(entries, carried, self._unsure, time.monotonic(), UNSURE_WAIT)
        unsure = [e for e in done if not e.sure]
        if unsure:
            _log.info(
                "alert transitions found unsure: %d carried by their alert already, %d "
                "published now",
                sum(1 for e in unsure if e.key in carried),
                sum(1 for e in unsure if e.key not in carried),
            )
        return send, done

    async def _published_already(self, entries: Sequence[Outgoing]) -> set[bytes]:
        """The entries whose transition their alert entity carries already (module doc)."""
        if not entries:
            return set()
        client = await self._writer.client()
        carried: dict[tuple[str, str, str, str], int] = {}
        for entry in entries:
            entity = (entry.tenant, entry.service_path, entry.entity_id, entry.entity_type)
            if entity not in carried:
                carried[entity] = await asyncio.to_thread(self._transition_of, client, *entity)
        return {
            e.key
            for e in entries
            if e.number <= carried[(e.tenant, e.service_path, e.entity_id, e.entity_type)]
        }

    @staticmethod
    def _transition_of(
        client: Client, tenant: str, service_path: str, entity_id: str, entity_type: str
    ) -> int:
        try:
            found = client.get_entity(
                entity_id,
                entity_type=entity_type,
                tenant=tenant,
                service_path=service_path,
                timeout=PUBLISH_TIMEOUT,
                attrs="transition",
            )
        except NotFound:
            return 0
        return number_of(found)

    async def _publish(self, entries: Sequence[Outgoing]) -> None:
        """Upsert the alert entities through a connection point, in order."""
        entities = [
            to_wire(e.entity_id, e.entity_type, e.tenant, e.service_path, e.attributes)
            for e in entries
        ]
        await self._writer.write(entities)
