"""The matcher's scale participant: its phases move one way, along the module doc's arrows."""

from __future__ import annotations

import pytest

from broker.coordination.configuration import Configuration
from broker.coordination.scale import ScalePlan
from broker.roles.participant import Participant, Phase


def _participant() -> Participant:
    old = Configuration.of(1, ["m1", "m2"])
    plan = ScalePlan("p1", old, old.next(["m1", "m2", "m3"]), started=0.0)
    return Participant(plan)


@pytest.mark.parametrize(
    "path",
    [
        [Phase.CUT, Phase.SENT, Phase.READY],  # an old matcher that stays
        [Phase.CUT, Phase.SENT],  # an old matcher that leaves: never ready
        [Phase.CUT, Phase.READY],  # a matcher that sends nothing
        [Phase.READY],  # a new matcher: every part came in
    ],
)
def test_the_paths_a_scale_takes(path: list[Phase]) -> None:
    participant = _participant()
    for phase in path:
        participant.advance(phase)
    assert participant.phase is path[-1]
    assert participant.cut
    assert participant.sent == (path[-1] in (Phase.SENT, Phase.READY))  # nothing left to send
    assert participant.ready == (path[-1] is Phase.READY)


@pytest.mark.parametrize(
    ("path", "bad"),
    [
        ([], Phase.SENT),  # parts before the cut
        ([Phase.CUT], Phase.CUT),  # a second cut
        ([Phase.READY], Phase.CUT),  # backwards
        ([Phase.CUT, Phase.SENT, Phase.READY], Phase.SENT),
    ],
)
def test_a_move_the_machine_does_not_have_is_refused(path: list[Phase], bad: Phase) -> None:
    participant = _participant()
    for phase in path:
        participant.advance(phase)
    with pytest.raises(RuntimeError, match=f"scale p1: no move from .* to {bad.value}"):
        participant.advance(bad)
    assert participant.phase is (path[-1] if path else Phase.FOLLOWING)
