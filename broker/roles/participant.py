"""A matcher's part in a running matcher scale: one state machine (docs/protocol.md).

The phases, in the order a scale goes through them (never backwards)::

    FOLLOWING ──cut──> CUT ──parts sent──> SENT ──ready reported──> READY
        │               │                                              ^
        │               └──────────(a matcher that sends nothing)──────┤
        └─────────(a new matcher: every part came in)──────────────────┘

- FOLLOWING: the plan is known; start markers come in from the access points.
- CUT: every access point's start marker is in: the snapshot is taken, what moves is
  counted for the old epoch only and sent to its new holders (an old matcher), or the matcher
  waits for its parts (a new one).
- SENT: an old matcher's parts are all with their new holders.
- READY: every part this matcher is to receive is in (and, if it is an old one, its own are
  sent); it compiled what it received and reported *ready*. It matches the new epoch from
  the switch on.

The scale ends outside this machine: completed when the access points' switch markers have
all come (the matcher drops what left and counts everything for every epoch), or rolled back
when the plan ends without its epoch becoming the configuration's (the matcher drops what it
received). Either way the matcher forgets its :class:`Participant`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from broker.coordination.scale import ScalePlan

__all__ = ["Participant", "Phase"]


class Phase(enum.Enum):
    """Where a matcher is in a scale (see the module doc)."""

    FOLLOWING = "following"
    CUT = "cut"
    SENT = "sent"
    READY = "ready"


_NEXT: dict[Phase, frozenset[Phase]] = {
    Phase.FOLLOWING: frozenset({Phase.CUT, Phase.READY}),
    Phase.CUT: frozenset({Phase.SENT, Phase.READY}),
    Phase.SENT: frozenset({Phase.READY}),
    Phase.READY: frozenset(),
}


@dataclass(eq=False)
class Participant:
    """This matcher's part in the scale of ``plan``."""

    plan: ScalePlan
    phase: Phase = Phase.FOLLOWING
    started_from: set[str] = field(default_factory=set)  # access points whose marker came
    switched_from: set[str] = field(default_factory=set)  # access points that switched
    parts_from: set[str] = field(default_factory=set)  # old matchers whose whole part came
    moved_out: list[str] = field(default_factory=list)  # ids that leave once it completes
    received_from: dict[str, int] = field(default_factory=dict)  # old matcher -> taken in
    received: int = 0
    received_bytes: int = 0

    def advance(self, to: Phase) -> None:
        """Move on to ``to``; RuntimeError for a move the machine does not have."""
        if to not in _NEXT[self.phase]:
            raise RuntimeError(
                f"scale {self.plan.id}: no move from {self.phase.value} to {to.value}"
            )
        self.phase = to

    @property
    def cut(self) -> bool:
        """The snapshot is taken (or this matcher is past needing one)."""
        return self.phase is not Phase.FOLLOWING

    @property
    def sent(self) -> bool:
        """This matcher's own parts are with their new holders (or it had none to send)."""
        return self.phase in (Phase.SENT, Phase.READY)

    @property
    def ready(self) -> bool:
        """It reported ready."""
        return self.phase is Phase.READY
