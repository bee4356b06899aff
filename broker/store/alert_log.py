"""The alert state of one store's entities, kept in the writes' commits, and what to publish.

:class:`AlertLog` is to alerts what broker.store.history's log is to history: the store's
``Apply`` hands it each write it applies (:meth:`AlertLog.stage`, from broker.store.entities,
as the partition's primary), and it adds to that write's own commit the new state of every
(rule, entity) the write moved (broker.store.alerting: the rules and the state machine)
and, for every transition, an *outbox* entry: the alert entity to publish. A write and the
alert state it leaves are durable together, here and on the backups (the commit is
replicated as a whole), or not at all: a failover or a restart neither loses a transition
nor makes one twice. The outbox entries are published by broker.roles.store_alerts, then
deleted.

Keys (both of the source entity's partition, so replicated, copied and dropped with it:
broker.store.entities lists their spaces with its own):

- ``a``, the entity's document key without its ``d`` (the partition, tenant NUL id NUL
  service path NUL type), NUL, the rule id: the (rule, entity)'s :class:`AlertState`,
  msgpack;
- ``o``, the same, NUL, the rule id, NUL, the transition number (8 bytes): one transition
  to publish, msgpack [tenant, service path, alert id, alert type, attributes]. The entries
  of one (rule, entity) sort in transition order.

A state is read from the writes pending (staged, not yet durable) first, then from the
engine: two writes of one entity in one commit group move its state in order. An outbox
entry is *staging* until its write is durable here and on the backups (:meth:`release`);
:meth:`outbox` gives none of them, nor any later entry of the same (rule, entity), so the
transitions leave in order and only once their write is acknowledged-durable. An entry this
process staged itself is *sure*: nobody published it before (an entry found otherwise, after
a failover, a restart or a partition copied here, may have been, and is checked first).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import msgpack

from broker.model.change import Alteration
from broker.store.alerting import AlertState, Rule, alert_attributes, is_number, step
from broker.store.semantics import Applied, Attributes

if TYPE_CHECKING:  # the engine's module loads the storage libraries: only its interface here
    from broker.store.engine import Engine

__all__ = ["OUTBOX_BATCH", "OUTBOX_SPACE", "STATE_SPACE", "AlertLog", "Outgoing", "sorted_out"]

STATE_SPACE: Final = b"a"
OUTBOX_SPACE: Final = b"o"
OUTBOX_BATCH: Final = 500  # outbox entries one call of :meth:`AlertLog.outbox` gives at most
_SEP: Final = b"\x00"


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One transition to publish: its outbox key, the alert entity and its attributes, its
    number, and whether this process staged it (``sure``: nobody published it before)."""

    key: bytes
    tenant: str
    service_path: str
    entity_id: str
    entity_type: str
    attributes: Attributes
    number: int
    sure: bool


class AlertLog:
    """The alert state one store's writes keep (see the module doc). One event loop uses
    it."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._rules: dict[str, tuple[Rule, ...]] = {}  # tenant: its rules
        self._pending: dict[bytes, tuple[int, AlertState]] = {}  # state key: (ticket, state)
        self._held: dict[int, list[bytes]] = {}  # ticket: the state and outbox keys it holds
        self._ticket = 0
        self._staging: set[bytes] = set()  # outbox keys whose write is not durable yet
        self._sure: set[bytes] = set()  # outbox keys this process staged
        self.released = 0  # outbox entries whose write ended (the publisher's wake-up)

    def define(self, rules: Iterable[Rule]) -> None:
        """Evaluate these rules from the next write on (every rule, all tenants)."""
        by_tenant: dict[str, list[Rule]] = {}
        for rule in rules:
            by_tenant.setdefault(rule.tenant, []).append(rule)
        self._rules = {tenant: tuple(found) for tenant, found in by_tenant.items()}

    @property
    def active(self) -> bool:
        """Whether any rule is defined."""
        return bool(self._rules)

    def stage(
        self, key: bytes, applied: Applied, now: float, puts: list[tuple[bytes, bytes]]
    ) -> int | None:
        """Add to a commit's ``puts`` the states and outbox entries the write ``applied`` to
        the document at ``key`` (applied at ``now``) makes; the ticket they are pending
        under until :meth:`release` (None: the write moved no alert)."""
        document, change = applied.document, applied.change
        if document is None or change is None or change.alteration is Alteration.DELETE:
            return None
        rules = self._rules.get(document.tenant, ())
        ticket: int | None = None
        for rule in rules:
            if rule.attribute not in change.requested:
                continue
            value = document.attributes.get(rule.attribute, {}).get("value")
            if not is_number(value) or not rule.selects(document, now):
                continue
            alert_id = rule.alert_id_of(document.id, document.type)
            state_key = STATE_SPACE + key[1:] + _SEP + rule.id.encode()
            if alert_id is None or not self._fits(state_key):
                continue
            state = self._state(state_key)
            moved, transition = step(rule.condition, state, value, now)
            if moved == state:
                continue
            if ticket is None:
                self._ticket += 1
                ticket = self._ticket
            held = self._held.setdefault(ticket, [])
            puts.append((state_key, msgpack.packb(moved.to_wire())))
            self._pending[state_key] = (ticket, moved)
            held.append(state_key)
            if transition is None:
                continue
            outbox_key = OUTBOX_SPACE + state_key[1:] + _SEP + transition.number.to_bytes(8, "big")
            attributes = alert_attributes(rule, document, transition)
            entry = [document.tenant, document.service_path, alert_id, rule.alert_type]
            puts.append((outbox_key, msgpack.packb([*entry, attributes], use_bin_type=True)))
            self._staging.add(outbox_key)
            self._sure.add(outbox_key)
            held.append(outbox_key)
        return ticket

    def release(self, ticket: int) -> None:
        """The commit holding ``ticket``'s write ended (durable here and on the backups, or
        the store failed and stops)."""
        for key in self._held.pop(ticket, ()):
            if key[:1] == OUTBOX_SPACE:
                self._staging.discard(key)
                self.released += 1
                continue
            pending = self._pending.get(key)
            if pending is not None and pending[0] == ticket:
                del self._pending[key]

    def outbox(self, mine: Callable[[int], bool], most: int = OUTBOX_BATCH) -> list[Outgoing]:
        """The durable outbox entries of the partitions ``mine`` says this store is the
        primary of, in order, at most ``most``; none of a (rule, entity) from its first
        entry still staging on (module doc)."""
        found: list[Outgoing] = []
        blocked: set[bytes] = set()  # (rule, entity) prefixes with an entry staging
        for key, value in self._engine.scan(OUTBOX_SPACE):
            if not mine(int.from_bytes(key[1:3], "big")):
                self._sure.discard(key)  # a partition gone elsewhere: sure no more
                continue
            prefix = key[:-8]
            if key in self._staging:
                blocked.add(prefix)
            if prefix in blocked:
                continue
            tenant, path, entity_id, entity_type, attributes = msgpack.unpackb(
                value, raw=False, strict_map_key=False
            )
            number = int.from_bytes(key[-8:], "big")
            sure = key in self._sure
            found.append(
                Outgoing(key, tenant, path, entity_id, entity_type, attributes, number, sure)
            )
            if len(found) >= most:
                break
        return found

    def sent(self, keys: Iterable[bytes]) -> None:
        """These entries were published (their deletion is committed): forget them."""
        for key in keys:
            self._sure.discard(key)

    def unsure(self, keys: Iterable[bytes]) -> None:
        """A publish of these entries failed: they may be published or not."""
        for key in keys:
            self._sure.discard(key)

    def _state(self, key: bytes) -> AlertState:
        pending = self._pending.get(key)
        if pending is not None:
            return pending[1]
        data = self._engine.get(key)
        if data is None:
            return AlertState()
        return AlertState.from_wire(msgpack.unpackb(data, raw=False))

    def _fits(self, state_key: bytes) -> bool:
        """Whether the engine takes the keys of this state and its outbox entries."""
        limit = self._engine.max_key_size
        return limit is None or len(state_key) + 9 <= limit


def sorted_out(
    entries: Sequence[Outgoing],
    carried: Collection[bytes],
    unsure_since: dict[bytes, float],
    now: float,
    wait: float,
) -> tuple[list[Outgoing], list[Outgoing]]:
    """Of outbox entries (in order), those to publish now and those done with (published
    now, or ``carried`` by their alert entity already). An unsure entry its alert entity
    does not carry waits until it has been unsure ``wait`` seconds (``unsure_since``: when
    each was first seen so, kept up to date here), and the later entries of its (rule,
    entity) wait behind it (broker.roles.store_alerts says why)."""
    held: set[bytes] = set()  # (rule, entity) prefixes that wait
    send: list[Outgoing] = []
    done: list[Outgoing] = []
    for entry in entries:
        prefix = entry.key[:-8]
        if prefix in held:
            continue
        if entry.key in carried:
            done.append(entry)
            continue
        if not entry.sure and now - unsure_since.setdefault(entry.key, now) < wait:
            held.add(prefix)
            continue
        send.append(entry)
        done.append(entry)
    return send, done
