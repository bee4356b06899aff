"""One context store process's part of every aggregation group: its panes, and the groups
it writes (docs/aggregation.md).

No I/O here: the store's aggregation loop (broker.roles.store_aggregation) feeds an
:class:`Aggregator` and carries what it gives out. Each store process is both:

- a **source**: every write it applies (as a partition's primary) folds into its own panes
  (:meth:`Aggregator.observe`, broker.store.aggregation), in the pane of the write's own
  time (when the store applied it, its entity's new ``dateModified``: ``event_time``, not
  when it is observed, so that a backfill from the archive puts it in the same pane). A
  pane *closes* here once its end is past: level 0 at ``end + GRACE`` by the time
  :meth:`Aggregator.close` is given (the store gives the time of the oldest write it is
  still applying, if any, else its clock: a write not yet observed has a later time, so it
  never finds its pane closed), a level above once this process, as an owner, has written
  every window of the level below up to its end (so the derived values it is made of have
  been applied here). Closed panes are made durable in the store's engine (key space
  ``g``) and sent, each to the *owner* of its group key: the primary of the derived
  entity's partition. A source keeps a pane, and sends it again
  to an owner that restarted or changed, until the owner says every window holding it was
  written :data:`RETAIN` seconds ago. Every report also carries the source's *marks*: per
  group and level, the end up to which its panes are closed.
- an **owner**: it keeps each source's partial of each pane (a pane sent again replaces
  the one kept: reports are idempotent) and writes a window once every serving store's
  mark passed its end (:meth:`Aggregator.due`): all the panes merged, as the derived
  entity's attributes (broker.store.aggregation.window_attributes). It keeps how far it
  wrote in its engine too, so that a restart does not write old windows again from the
  panes the sources still hold. A pane that changes after it was sent (*late*: a value of a
  level above that came after its close, or a write whose time is behind the marks: a clock
  gone back) writes its windows again: a correction; so does one that first comes after
  this owner wrote its window (its source was not serving in this owner's view then, or
  offered it to another owner that did not take it), and the windows of a key that came
  due while this store did not see itself as its primary, once it does (views crossed
  while its partition moved).

Versions: a group's definition applies from ``since``, a pane boundary at least a second
after it was made or changed (so every store has it by then); the one it replaced keeps
applying to the panes before. The panes of a version are its own (a changed window or
hierarchy never mixes with the old one's).

What a crash loses: the panes open in a killed store process (at most ``slide + GRACE``
seconds of the writes it applied); a stopped one persists them and goes on. An owner keeps
nothing durable: the sources send again what it had not written.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import msgpack

from broker.store.aggregation import (
    Definition,
    Partial,
    contributions,
    event_time,
    parse_definition,
    window_attributes,
)
from broker.store.semantics import Applied

__all__ = [
    "GRACE",
    "KEY_SPACE",
    "RETAIN",
    "Aggregator",
    "DerivedWrite",
    "PaneKey",
    "Version",
]

GRACE: Final = 0.1  # seconds a level-0 pane stays open past its end
RETAIN: Final = 30.0  # seconds panes are kept past their last window's writing (corrections)
KEY_SPACE: Final = b"g"  # the engine's keys of aggregation state
_PANES: Final = KEY_SPACE + b"p"  # a source's pane: [closed, parts, late]
_WRITTEN: Final = KEY_SPACE + b"w"  # an owner's group level: the end it wrote up to

# tenant, group id, version, level
GroupLevel = tuple[str, str, int, int]
# tenant, group id, version, level, service path, group key, pane start
PaneKey = tuple[str, str, int, int, str, str, float]
Partials = dict[str, Partial]  # attribute -> partial
# a pane's parts: child entity ("" at level 0) -> attribute -> (when written, partial)
Parts = dict[str, dict[str, tuple[float, Partial]]]
OwnerOf = Callable[[str, str], "str | None"]  # (tenant, entity id) -> its partition's primary


@dataclass(frozen=True, slots=True)
class Version:
    """One version of a group: its definition, number, and the panes it applies to (from
    ``since``; up to ``until``, the next version's since, if there is one)."""

    definition: Definition
    number: int
    since: float
    until: float | None = None

    @classmethod
    def parse(
        cls,
        document: Any,
        tenant: str,
        service_path: str | None,
        number: int,
        since: float,
        until: float | None = None,
    ) -> Version:
        """The version a kept definition is (broker.coordination.aggregations: its document,
        tenant, service path...); InvalidInput if the document is not a definition."""
        return cls(parse_definition(document, tenant, service_path), number, since, until)

    def covers(self, pane: float) -> bool:
        """Tell whether the pane starting at ``pane`` is this version's."""
        return self.since <= pane and (self.until is None or pane < self.until)


@dataclass(frozen=True, slots=True)
class DerivedWrite:
    """One window's result: attributes to upsert on one derived entity."""

    tenant: str
    service_path: str
    entity_id: str
    entity_type: str
    attributes: dict[str, dict[str, Any]]
    end: float


@dataclass
class _Pane:
    """A source's pane: its partials, closed or not, the owner (``owner@incarnation``) that
    took it as it is now ("": not sent since it last changed), and whether it changed after
    it closed (late: its windows are written again).

    ``parts``: at level 0 one ("": every value folded in); at a level above one per child
    entity (a building's window under a campus), as it was last written, with when: a
    child's window written again (a correction, or after its partition moved, on another
    store) replaces its part wherever it lands, its owner keeping the latest."""

    parts: Parts = field(default_factory=dict)
    closed: bool = False
    sent: str = ""
    late: bool = False
    written: bool = False  # its owner said every window holding it is written


@dataclass
class _Due:
    """What :meth:`Aggregator.due` handed out, to settle once the writes are done."""

    advance: dict[GroupLevel, float] = field(default_factory=dict)
    corrected: set[PaneKey] = field(default_factory=set)


class Aggregator:
    """The aggregation state of one store process (see the module doc). One event loop
    uses it."""

    def __init__(self, store_id: str, incarnation: int) -> None:
        self.store_id = store_id
        self.incarnation = incarnation
        self._versions: dict[tuple[str, str, int], Version] = {}  # by (tenant, id, number)
        self._by_tenant: dict[str, list[Version]] = {}
        # source side
        self._panes: dict[PaneKey, _Pane] = {}
        self._unsaved: set[PaneKey] = set()
        self._dropped: set[PaneKey] = set()
        self._marks: dict[GroupLevel, float] = {}  # this source's own
        self._owners: dict[str, int] = {}  # owner store -> the incarnation it last answered
        # owner side: group level -> (service path, key) -> pane -> source -> parts
        self._received: dict[GroupLevel, dict[tuple[str, str], dict[float, dict[str, Parts]]]]
        self._received = {}
        self._their_marks: dict[GroupLevel, dict[str, float]] = {}
        self._written: dict[GroupLevel, float] = {}  # windows written up to this end
        self._written_kept: dict[GroupLevel, float] = {}  # ... as the engine holds it
        self._loaded: dict[GroupLevel, float] = {}  # ... as an earlier life wrote it
        self._corrections: set[PaneKey] = set()
        # keys whose windows came due while this store was not their primary
        self._skipped: dict[GroupLevel, set[tuple[str, str]]] = {}

    # -- definitions ---------------------------------------------------------------------

    @property
    def active(self) -> bool:
        """Whether any group is defined, or any pane is held."""
        return bool(self._by_tenant or self._panes or self._received)

    def define(self, versions: Iterable[Version]) -> None:
        """Use these versions of the groups from now on; forget the state of the others."""
        kept: dict[tuple[str, str, int], Version] = {}
        by_tenant: dict[str, list[Version]] = {}
        for version in versions:
            definition = version.definition
            kept[(definition.tenant, definition.id, version.number)] = version
            by_tenant.setdefault(definition.tenant, []).append(version)
        self._versions = kept
        self._by_tenant = by_tenant
        for pane_key in [k for k in self._panes if self._version_of(k) is None]:
            del self._panes[pane_key]
            self._unsaved.discard(pane_key)
            self._dropped.add(pane_key)
        for group in [g for g in self._received if self._version_of(g) is None]:
            del self._received[group]
        tables = (self._their_marks, self._written, self._marks, self._skipped, self._loaded)
        for table in tables:
            for group in [g for g in table if self._version_of(g) is None]:
                del table[group]
        self._corrections = {k for k in self._corrections if self._version_of(k) is not None}

    def _version_of(self, key: tuple[Any, ...]) -> Version | None:
        return self._versions.get((key[0], key[1], key[2]))

    # -- source side ---------------------------------------------------------------------

    def observe(self, applied: Iterable[Applied], now: float) -> None:
        """Fold writes the store applied at ``now`` into this source's panes, each at its
        time (broker.store.aggregation.event_time)."""
        for one in applied:
            document = one.document
            if document is None or one.change is None:
                continue
            versions = self._by_tenant.get(document.tenant)
            if not versions:
                continue
            at = event_time(document, now)
            for version in versions:
                definition = version.definition
                for found in contributions(definition, document, one.change, at):
                    if not version.covers(found.pane):
                        continue
                    pane_key = (
                        definition.tenant, definition.id, version.number, found.level,
                        found.service_path, found.key, found.pane,
                    )  # fmt: skip
                    child = found.child if found.level else ""
                    self._add(pane_key, definition, child, found.attribute, found.partial, at)

    def _add(
        self,
        pane_key: PaneKey,
        definition: Definition,
        child: str,
        name: str,
        part: Partial,
        at: float,
    ) -> None:
        pane = self._panes.get(pane_key)
        new = pane is None
        if pane is None:
            pane = self._panes[pane_key] = _Pane()
        partials = pane.parts.setdefault(child, {})
        if not child:
            partials[name] = (0.0, partials.get(name, (0.0, Partial()))[1].merged(part))
        elif at >= partials.get(name, (-math.inf, part))[0]:
            partials[name] = (at, part)
        pane.sent = ""
        if pane.closed:  # late (a level above): sent again, written again by its owner
            pane.late = True
            self._unsaved.add(pane_key)
        else:
            end = pane_key[6] + definition.window.slide
            mark = self._marks.get(pane_key[:4])
            if mark is not None and end <= mark:
                # the marks passed it before it held anything (a clock gone back, a value
                # of a level above after its windows were written): its owner may have
                # written them without it, so it writes them again
                pane.closed = True
                pane.late = new
                self._unsaved.add(pane_key)

    def close(self, now: float) -> None:
        """Move this source's marks to ``now`` and close the panes they passed: level 0's
        up to ``now - GRACE``, so ``now`` must be before the time of any write still to be
        observed (the store gives the oldest time of a write it is applying)."""
        for (tenant, group, number), version in self._versions.items():
            window = version.definition.window
            below = math.floor((now - GRACE) / window.slide) * window.slide
            for level in range(len(version.definition.levels)):
                if level:
                    below = self._written.get((tenant, group, number, level - 1), version.since)
                self._marks[(tenant, group, number, level)] = max(version.since, below)
        for pane_key, pane in self._panes.items():
            held = self._version_of(pane_key)
            if pane.closed or held is None:
                continue
            mark = self._marks.get(pane_key[:4], held.since)
            if pane_key[6] + held.definition.window.slide <= mark:
                pane.closed = True
                self._unsaved.add(pane_key)

    def close_all(self) -> None:
        """Close every pane and move every mark past all time: this store applies nothing
        more (it left the store layer), so what it holds is final (a hand-over)."""
        for group in [(*k, level) for k, v in self._versions.items()
                      for level in range(len(v.definition.levels))]:  # fmt: skip
            self._marks[_group(group)] = math.inf
        for pane_key, pane in self._panes.items():
            if not pane.closed:
                pane.closed = True
                self._unsaved.add(pane_key)

    def unsent(self, owner_of: OwnerOf) -> int:
        """How many closed panes with an owner that owner has not taken as they are."""
        count = 0
        for pane_key, pane in self._panes.items():
            owner = owner_of(pane_key[0], pane_key[5])
            if pane.closed and owner is not None and pane.sent != self._tag(owner):
                count += 1
        return count

    def _tag(self, owner: str) -> str:
        return f"{owner}@{self._owners.get(owner, 0)}"

    def forget_marks(self, serving: Iterable[str]) -> None:
        """Forget the marks of sources that are not serving: one that comes back (the same
        store id, scaled out again) counts from its first report again, not from a mark
        its last life left (a hand-over leaves marks past all time)."""
        keep = set(serving)
        for marks in self._their_marks.values():
            for source in [s for s in marks if s not in keep]:
                del marks[source]

    def durable(self, everything: bool = False) -> tuple[list[tuple[bytes, bytes]], list[bytes]]:
        """What to write to the engine so that it holds this source's closed panes and this
        owner's written ends as they are (``everything``: the open panes too, as a stopping
        store does)."""
        chosen = set(self._unsaved)
        if everything:
            chosen |= set(self._panes)
        puts = [(_key(_PANES, k), _pane_bytes(self._panes[k])) for k in sorted(chosen)]
        deletes = [_key(_PANES, k) for k in sorted(self._dropped)]
        for group, end in self._written.items():
            if self._written_kept.get(group) != end:
                puts.append((_key(_WRITTEN, group), msgpack.packb(end)))
                self._written_kept[group] = end
        for group in [g for g in self._written_kept if g not in self._written]:
            deletes.append(_key(_WRITTEN, group))
            del self._written_kept[group]
        self._unsaved.clear()
        self._dropped.clear()
        return puts, deletes

    def load(self, items: Iterable[tuple[bytes, bytes]]) -> None:
        """Take back what a store kept in its engine (before :meth:`define`: the state of a
        group no longer defined is dropped then)."""
        for key, value in items:
            if key.startswith(_WRITTEN):
                group = _group(msgpack.unpackb(key[len(_WRITTEN) :], raw=False))
                end = float(msgpack.unpackb(value))
                self._written[group] = self._written_kept[group] = self._loaded[group] = end
                continue
            if not key.startswith(_PANES):
                continue
            pane_key = _pane_key(msgpack.unpackb(key[len(_PANES) :], raw=False))
            closed, parts, _late, written = msgpack.unpackb(value, raw=False)
            # A closed pane kept whose windows were not known written may have missed them
            # (this store was fenced, they were written without it): sent as late, they are
            # written again with it.
            late = bool(closed) and not written
            self._panes[pane_key] = _Pane(
                _parts_of(parts), bool(closed), late=late, written=bool(written)
            )

    def reports(
        self, owner_of: OwnerOf, serving: Sequence[str]
    ) -> dict[str, tuple[dict[str, Any], list[PaneKey]]]:
        """What to send each serving store: this source's marks, and the closed panes it
        owns that it has not taken as they are (with their keys, for :meth:`answered`)."""
        marks = [[*group, mark] for group, mark in self._marks.items()]
        out: dict[str, tuple[dict[str, Any], list[PaneKey]]] = {
            store: (
                {
                    "from": self.store_id,
                    "to": self._owners.get(store, 0),  # the owner's incarnation, as known
                    "marks": marks,
                    "panes": [],
                },
                [],
            )
            for store in serving
        }
        for pane_key, pane in self._panes.items():
            if not pane.closed:
                continue
            owner = owner_of(pane_key[0], pane_key[5])
            if owner is None or owner not in out:
                continue
            if pane.sent == self._tag(owner):
                continue
            report, keys = out[owner]
            # sent to another owner before (its partition moved): the new one may not have
            # written its windows, so it writes them again, as for a late pane
            moved = bool(pane.sent) and not pane.sent.startswith(f"{owner}@")
            report["panes"].append([*pane_key, _parts_wire(pane.parts), pane.late or moved])
            keys.append(pane_key)
        return out

    def answered(self, owner: str, answer: Mapping[str, Any], sent: Iterable[PaneKey]) -> None:
        """An owner took a report holding the panes ``sent``: they are sent to it as they
        are; the panes of windows it wrote RETAIN seconds ago are dropped. An owner that
        restarted (another incarnation) is sent every pane again."""
        incarnation = int(answer["inc"])
        if self._owners.get(owner) != incarnation:
            self._owners[owner] = incarnation
            for pane in self._panes.values():
                if pane.sent.startswith(f"{owner}@"):
                    pane.sent = ""
        tag = f"{owner}@{incarnation}"
        for pane_key in sent:
            taken = self._panes.get(pane_key)
            if taken is not None:
                taken.sent = tag
        written = {tuple(row[:4]): float(row[4]) for row in answer.get("written", ())}
        for pane_key, pane in list(self._panes.items()):
            if pane.sent != tag:
                continue
            version = self._version_of(pane_key)
            done = written.get(pane_key[:4])
            if version is None or done is None:
                continue
            last = pane_key[6] + version.definition.window.size
            if last + RETAIN <= done:
                del self._panes[pane_key]
                self._unsaved.discard(pane_key)
                self._dropped.add(pane_key)
            elif last <= done and not pane.written:
                pane.written = True
                self._unsaved.add(pane_key)

    # -- owner side ----------------------------------------------------------------------

    def receive(self, report: Mapping[str, Any]) -> dict[str, Any]:
        """Take a source's report; the answer tells it what was written (module doc)."""
        source = str(report["from"])
        # Marks count only from a source that knew this incarnation: it sent every pane it
        # holds to this one, so none it holds below its marks is still to come.
        if report.get("to") == self.incarnation:
            for *group, mark in report.get("marks", ()):
                key = _group(group)
                if self._version_of(key) is not None:
                    self._their_marks.setdefault(key, {})[source] = float(mark)
        for *head, parts, late in report.get("panes", ()):
            pane_key = _pane_key(head)
            version = self._version_of(pane_key)
            if version is None:
                continue
            given = _parts_of(parts)
            group = _group(pane_key[:4])
            by_key = self._received.setdefault(group, {})
            by_pane = by_key.setdefault((pane_key[4], pane_key[5]), {})
            held = by_pane.setdefault(pane_key[6], {})
            before = held.get(source)
            if before != given:
                held[source] = given
                # changed since its windows were written, or come after one was (its source
                # was not a serving store here then, or offered it to another owner first)
                if before is not None or late or self._written_without(group, version, pane_key):
                    self._corrections.add(pane_key)
        return {
            "inc": self.incarnation,
            "written": [[*group, end] for group, end in self._written.items()],
        }

    def _written_without(self, group: GroupLevel, version: Version, pane_key: PaneKey) -> bool:
        """Whether this process wrote a window holding this pane (so without it) and it is
        still corrected: every source holds its panes of it (they drop one RETAIN seconds
        after its last window was written, as this owner told them). Not the windows an
        earlier life of this store wrote: after a restart every source sends its panes
        again, and writing those windows again would give a level above the child's window
        under its parent of now, not of then."""
        done = self._written.get(group)
        if done is None:
            return False
        window = version.definition.window
        first = pane_key[6] + window.slide
        return (
            self._loaded.get(group, -math.inf)
            < first
            <= done
            < first - window.slide + (window.size + RETAIN)
        )

    def due(
        self, serving: Sequence[str], is_primary: Callable[[str, str], bool]
    ) -> tuple[list[DerivedWrite], _Due]:
        """The windows to write now (in order of their ends): those every serving store's
        mark passed, and those a pane changed after they were written; settle what it
        returns with :meth:`written` once they are, or :meth:`failed`."""
        writes: list[tuple[float, int, DerivedWrite]] = []
        settle = _Due()
        corrections, self._corrections = self._corrections, set()
        settle.corrected = corrections
        for (tenant, group, number), version in self._versions.items():
            definition = version.definition
            for level in range(len(definition.levels)):
                key = (tenant, group, number, level)
                done = self._written.get(key, version.since)
                marks = self._their_marks.get(key, {})
                low = min((marks.get(s, -math.inf) for s in serving), default=-math.inf)
                if low > done:
                    settle.advance[key] = low
                wanted: set[tuple[str, str, float]] = set()
                for (path, entity_id), panes in self._received.get(key, {}).items():
                    for pane in panes:
                        for end in definition.window.ends_with(pane):
                            if done < end <= low:
                                wanted.add((path, entity_id, end))
                for pane_key in [k for k in corrections if k[:4] == key]:
                    if low == -math.inf:  # a source has not sent all it holds to this one
                        corrections.discard(pane_key)
                        self._corrections.add(pane_key)  # (settle.corrected shares the set)
                        continue
                    for end in definition.window.ends_with(pane_key[6]):
                        if end <= done:
                            wanted.add((pane_key[4], pane_key[5], end))
                received = self._received.get(key, {})
                skipped = self._skipped.setdefault(key, set())
                for pair in list(skipped):
                    if pair not in received:  # its panes were dropped: past correcting
                        skipped.discard(pair)
                    elif low > -math.inf and is_primary(tenant, pair[1]):
                        # its partition came here after windows of it were due elsewhere
                        # (the other store may have seen this one as its primary then)
                        skipped.discard(pair)
                        for pane in received[pair]:
                            for end in definition.window.ends_with(pane):
                                if end <= done:
                                    wanted.add((*pair, end))
                for path, entity_id, end in wanted:
                    if not is_primary(tenant, entity_id):
                        skipped.add((path, entity_id))
                        continue
                    panes = self._received[key].get((path, entity_id), {})
                    merged = {
                        pane: _combined(by_source.values()) for pane, by_source in panes.items()
                    }
                    attributes = window_attributes(definition, end, merged)
                    if attributes:
                        entity_type = definition.levels[level].type
                        write = DerivedWrite(
                            tenant, path, entity_id, entity_type, attributes, end
                        )  # fmt: skip
                        writes.append((end, level, write))
        writes.sort(key=lambda item: (item[0], item[1], item[2].entity_id))
        return [w for _end, _level, w in writes], settle

    def written(self, settled: _Due) -> None:
        """The writes :meth:`due` gave are done: the windows up to each mark are written;
        the panes kept past RETAIN are dropped."""
        for key, end in settled.advance.items():
            if self._version_of(key) is None:
                continue
            self._written[key] = max(end, self._written.get(key, end))
            version = self._version_of(key)
            assert version is not None
            size = version.definition.window.size
            by_key = self._received.get(key, {})
            for pair in list(by_key):
                panes = by_key[pair]
                for pane in [p for p in panes if p + size + RETAIN <= end]:
                    del panes[pane]
                if not panes:
                    del by_key[pair]

    def failed(self, settled: _Due) -> None:
        """The writes :meth:`due` gave did not all happen: they are due again."""
        self._corrections |= settled.corrected

    # -- inspection (tests, logs) --------------------------------------------------------

    def pane_count(self) -> int:
        """How many panes this source holds."""
        return len(self._panes)

    def held(self) -> Iterator[tuple[PaneKey, Partials, bool]]:
        """This source's panes: key, partials, closed."""
        for pane_key, pane in self._panes.items():
            yield pane_key, _combined([pane.parts]), pane.closed


def _combined(sources: Iterable[Parts]) -> Partials:
    """One pane's partials from every source's parts: the values of level 0 merged, each
    child's latest part (by when it was written, wherever) merged once."""
    latest: dict[tuple[str, str], tuple[float, Partial]] = {}
    out: Partials = {}
    for parts in sources:
        for child, partials in parts.items():
            for name, (at, partial) in partials.items():
                if not child:
                    out[name] = out.get(name, Partial()).merged(partial)
                elif at >= latest.get((child, name), (-math.inf, partial))[0]:
                    latest[(child, name)] = (at, partial)
    for (_child, name), (_at, partial) in latest.items():
        out[name] = out.get(name, Partial()).merged(partial)
    return out


def _parts_wire(parts: Parts) -> dict[str, dict[str, list[Any]]]:
    return {
        child: {name: [at, p.to_wire()] for name, (at, p) in partials.items()}
        for child, partials in parts.items()
    }


def _parts_of(data: Mapping[str, Mapping[str, Sequence[Any]]]) -> Parts:
    return {
        str(child): {
            str(name): (float(at), Partial.from_wire(wire)) for name, (at, wire) in partials.items()
        }
        for child, partials in data.items()
    }


def _group(values: Sequence[Any]) -> GroupLevel:
    tenant, group, number, level = values
    return str(tenant), str(group), int(number), int(level)


def _pane_key(values: Sequence[Any]) -> PaneKey:
    tenant, group, number, level, path, entity_id, pane = values
    return str(tenant), str(group), int(number), int(level), str(path), str(entity_id), float(pane)


def _key(space: bytes, parts: tuple[Any, ...]) -> bytes:
    return space + bytes(msgpack.packb(list(parts)))


def _pane_bytes(pane: _Pane) -> bytes:
    body = [pane.closed, _parts_wire(pane.parts), pane.late, pane.written]
    return bytes(msgpack.packb(body))
