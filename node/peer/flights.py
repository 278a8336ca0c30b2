"""A module's round in flight on a live node: its units (the whole module, or one per slice), what each sent, when
its reply came and what it was; and the helpers that put a sliced round's parts back together. Driven by
node/peer/rounds.py."""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch

from pathswarm.node.train.round import Contribution, Settlement
from pathswarm.protocol.rounds.heal import AppliedPart
from pathswarm.protocol.rounds.messages import RoundReply
from pathswarm.protocol.rounds.outer import OuterState
from pathswarm.protocol.rounds.rule import reference_norm
from pathswarm.protocol.rounds.slices import Unit, view


@dataclass
class UnitFlight:
    """One unit of a module's round in flight: the whole module, or one of its slices (protocol/rounds/slices.py)."""

    unit: Unit
    future: Future
    sent: Contribution
    reducer: str
    """The first candidate to reduce the unit's round: the peer to re-sync from if the group is elsewhere."""
    order: tuple[str, ...] = ()
    """Every candidate, in the agreed failover order (a slice's: rotated)."""
    retried: bool = False
    """Sent again after its reducer was proven a liar (node/peer/round_checks.py `retry_after_lie`): once per round."""
    result: RoundReply | None = None
    """The reply once it is in and checked (node/peer/round_checks.py `check`): the round is settled when every unit
    has one."""
    bound: float | None = None
    mean: torch.Tensor | None = None
    discard: bool = False
    sent_at: float = field(default_factory=time.monotonic)
    replied_at: float | None = None
    """When its reply came in: the round's time on the wire, for the status."""

    async def timed(self, contribute: Awaitable[RoundReply]) -> RoundReply:
        """`contribute`, noting when it ended. Stamped in the network thread before the future completes (a done
        callback runs after `done()` is already true, so the training thread could settle the round first)."""
        try:
            return await contribute
        finally:
            self.replied_at = time.monotonic()


@dataclass
class InFlight:
    """One module's round sent and not settled yet: its units, one per slice (one when the round is not sliced)."""

    sent: Contribution
    """The module's: its weights at the send (`merged_base`) and tokens (the unit's own contribution when K = 1)."""
    units: list[UnitFlight]
    moved: torch.Tensor | None = None
    """Eager updates (`[outer] eager`): what the module's local weights were moved by at the send (flat fp32),
    taken back out when the round settles (node/train/round.py `settle`); a round still open when the run ends saves
    none of our local weights (node/peer/node.py `_save_partial`), so none of the move outlives it."""
    state: OuterState | None = None
    """The module's outer state the round was sent from (immutable: held, not copied)."""
    _reference: tuple[OuterState, float] | None = None

    @property
    def reducer(self) -> str:
        return self.units[0].reducer

    def residual_before(self) -> torch.Tensor | None:
        """The module's error-feedback residual before this round's frames were encoded (None: it had none)."""
        if len(self.units) == 1:
            return self.units[0].sent.feedback_before.get("residual")
        parts = [f.sent.feedback_before.get("residual") for f in self.units]
        return None if any(p is None for p in parts) else torch.cat(parts)

    def unsent_base(self, now: OuterState) -> torch.Tensor:
        """What our steps not sent yet count from, with the module's state `now`: the weights at the send (and what
        the frames did not carry), plus the eager move, plus how far the anchor moved if a re-sync replaced the state
        meanwhile (node/peer/state_sync.py `_adopt` keeps our progress on top of the new anchor)."""
        base = self.sent.merged_base if self.moved is None else self.sent.merged_base + self.moved
        if self.state is not None and now is not self.state:
            base = base + (now.anchor - self.state.anchor)
        return base

    def stale_units(self, now: OuterState) -> set[str]:
        """The units whose part of the module's state is no longer the one they were sent from (a re-sync replaced
        the state meanwhile); none when the state is the one sent from (compared by identity: no digest computed)."""
        if self.state is None or now is self.state:
            return set()
        return {f.unit.id for f in self.units if view(now, f.unit).digest() != f.sent.digest_before}

    def unit_moved(self, unit) -> torch.Tensor | None:
        """Our eager move's part in one unit (None: not moved)."""
        return None if self.moved is None else self.moved[unit.lo:unit.hi]

    def module_reference(self, state: OuterState) -> float:
        """The module's momentum norm (rule.py `reference_norm`) as of `state`, once for all its slices' checks."""
        if self._reference is None or self._reference[0] is not state:
            self._reference = (state, reference_norm(state))
        return self._reference[1]


def whole_of(state: OuterState, parts: list[Contribution]) -> Contribution:
    """A sliced round's contribution as the module's (no frame of its own): its weights at the send and what its
    frames did not carry (`merged_base`: what a saved round in progress counts our unsent steps from), its tokens."""
    unsent = None if parts[0].unsent is None else torch.cat([p.unsent for p in parts if p.unsent is not None])
    return Contribution(frame=b"", tokens=parts[0].tokens, round=state.round, digest_before=state.digest(),
                        local_when_sent=torch.cat([p.local_when_sent for p in parts]), unsent=unsent,
                        delta_norm=math.sqrt(sum(p.delta_norm ** 2 for p in parts)))


def applied_parts(applied: list[tuple[UnitFlight, Settlement]]) -> tuple[AppliedPart, ...]:
    """The slices of a round we applied, as the log that can undo them keeps them (protocol/rounds/heal.py)."""
    out = []
    for flight, _ in applied:
        assert flight.result is not None
        out.append(AppliedPart(flight.unit.lo, flight.unit.hi, flight.result.reducer or flight.reducer,
                               flight.result.mean_frame))
    return tuple(out)


def wire_s(item: InFlight) -> float | None:
    """Seconds from sending a module's round to its last unit's first reply (a unit sent again after a lie counts
    from its first send), or None when a reply's time is unknown."""
    times = [f.replied_at for f in item.units]
    if any(t is None for t in times):
        return None
    return max(t for t in times if t is not None) - min(f.sent_at for f in item.units)
