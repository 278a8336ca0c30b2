"""Undo the rounds a proven liar reduced: the pure rule (no network, no clock) every member that learns of the proof
runs on its own replica.

An audit proves a reducer a liar only after its round was applied (node/peer/audit.py; docs/SECURITY.md, "Healing an
applied lie"). Every member keeps the means it applied in its last HEAL_ROUNDS rounds of each module (`AppliedLog`,
the bytes the reducer sent: about one byte per parameter a round). On the proof of a lie in round P it undoes, newest
first, every kept round from P on (`heal`): an outer step is invertible given its mean, so the anchor and the
momentum come back to what they were before P. P is the proof's (the alert names it), so every member that learns of
the same proof undoes the same rounds; the liar's rounds before P carry no proof and stay (undoing a run of
unproven rounds costs as many rounds of progress: benchmarks/hostile.py lost more to that than to the lies; what
they can hold is within the members' bound, protocol/rounds/rule.py `mean_bound`). The honest rounds after P are
undone too: their outer gradients were trained from the lied anchors, and replayed on the healed one they would push
it past where it was. The module's round number does not go back: the healing counts as a round (the healed state
is at the current round + 1, naming the current reducers), so a member's state before and after its heal are never
announced at the same round (the split watch would read the two as a split, and an unhealed peer's stale
announcement could win it); every member that healed the same log at the same round reaches the same bits (the
same float operations on the same inputs, in the same order), and one that did not (a member that joined after the
lie, or learnt of the proof a round later) is re-synced from them by the digest checks and the majority rule, as
after any divergence. The proof names one module's round; the liar's other modules (a path's modules advance
together) are undone from the same round number.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pathswarm.protocol.rounds.outer import OuterState
from pathswarm.protocol.rounds.rule import decode_mean
from pathswarm.protocol.spec import CodecSpec, OuterOptSpec

HEAL_ROUNDS = 8
"""Applied rounds of each module a member keeps the means of. A lie is proven by an audit of the round it was in
(members audit a round while its frames are kept: 2 rounds, protocol/rounds/audit.py FRAMES_KEPT) and the alert
reaches the others within seconds; 8 rounds leave room for a member that learns of it late."""


@dataclass(frozen=True)
class AppliedPart:
    """One slice of a round in slices (protocol/rounds/slices.py) that a member applied: values [lo, hi) of the
    module moved by `reducer`'s mean."""

    lo: int
    hi: int
    reducer: str
    mean_frame: bytes


@dataclass(frozen=True)
class AppliedRound:
    """One round a member applied to a module: enough to undo it."""

    round: int
    """The module's round before it (its warm-up or Nesterov step depends on it)."""
    reducer: str
    mean_frame: bytes
    """The encoded mean, as the reducer sent it (every member decoded these bytes)."""
    digest_after: str
    """Our state's digest after it: the kept rounds lead to a state only while the last one's is that state's."""
    parts: tuple[AppliedPart, ...] = ()
    """A round in slices: the slices applied, each with its reducer's mean (`reducer` and `mean_frame` are then the
    first's); a slice not among them was not stepped. Empty: the whole module was, by `mean_frame`."""

    def reduced_by(self, peer: str) -> bool:
        return self.reducer == peer or any(p.reducer == peer for p in self.parts)


def unstep(after: OuterState, mean: torch.Tensor, round_: int, cfg: OuterOptSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """(anchor, momentum) before the outer step of round `round_` that made `after` with `mean`
    (protocol/rounds/outer.py `nesterov_step`, inverted). With no momentum (μ = 0) the buffer before is unknown and
    irrelevant (the step multiplies it by 0): zeros."""
    anchor, momentum = after.anchor.clone(), after.momentum.clone()
    if round_ < cfg.warmup_rounds:
        return anchor.add_(mean), momentum  # plain averaging: anchor ← anchor − Δ̄, the buffer untouched
    step = mean.add(momentum, alpha=cfg.momentum) if cfg.nesterov else momentum
    anchor.add_(step, alpha=cfg.lr)
    if cfg.momentum == 0:
        return anchor, torch.zeros_like(momentum)
    return anchor, momentum.sub_(mean).div_(cfg.momentum)


@dataclass(frozen=True)
class Healed:
    """What `heal` made of a module's state."""

    state: OuterState
    """The state before the proven round, at the current round + 1 and naming the current reducers."""
    undone: tuple[AppliedRound, ...]
    """The rounds undone, oldest first."""


def heal(state: OuterState, applied: list[AppliedRound], liar: str, from_round: int, outer: OuterOptSpec,
         codec: CodecSpec) -> Healed | None:
    """Undo `applied` (oldest first, the last one made `state`) from round `from_round` on, the round of a proven lie
    of `liar`; None when that round is not kept, or `liar` reduced none of the kept rounds from it on (this module's
    rounds from there were honest). A mean that no longer decodes (it did when applied) raises RoundError."""
    if not applied or applied[-1].digest_after != state.digest():
        return None  # the kept rounds do not lead to this state (replaced since): nothing to undo them from
    first = next((i for i, a in enumerate(applied) if a.round == from_round), None)
    if first is None or not any(a.reduced_by(liar) for a in applied[first:]):
        return None
    numel = state.anchor.numel()
    current = state
    for entry in reversed(applied[first:]):
        if not entry.parts:
            anchor, momentum = unstep(current, decode_mean(entry.mean_frame, numel, codec), entry.round, outer)
        else:  # only its applied slices moved: each is undone with its own mean
            anchor, momentum = current.anchor.clone(), current.momentum.clone()
            for part in entry.parts:
                piece = OuterState(current.anchor[part.lo:part.hi], current.momentum[part.lo:part.hi], entry.round)
                mean = decode_mean(part.mean_frame, part.hi - part.lo, codec)
                anchor[part.lo:part.hi], momentum[part.lo:part.hi] = unstep(piece, mean, entry.round, outer)
        current = OuterState(anchor, momentum, entry.round, state.reducers)
    return Healed(OuterState(current.anchor, current.momentum, state.round + 1, state.reducers),
                  tuple(applied[first:]))


class AppliedLog:
    """Per module, the last HEAL_ROUNDS rounds a member applied, oldest first."""

    def __init__(self, keep: int = HEAL_ROUNDS):
        self.keep = keep
        self._rounds: dict[str, list[AppliedRound]] = {}

    def applied(self, module: str, round_: int, reducer: str, mean_frame: bytes, digest_after: str,
                parts: tuple[AppliedPart, ...] = ()) -> None:
        """A round applied to `module` at its round `round_` by `reducer`'s mean (a round in slices: by its `parts`),
        making the state `digest_after`."""
        rounds = self._rounds.setdefault(module, [])
        if rounds and rounds[-1].round != round_ - 1:
            rounds.clear()  # not the round after the last one kept (a re-sync in between): the chain is broken
        rounds.append(AppliedRound(round_, reducer, mean_frame, digest_after, parts))
        del rounds[:-self.keep]

    def rounds(self, module: str) -> list[AppliedRound]:
        return list(self._rounds.get(module, ()))

    def healed(self, module: str) -> None:
        """The module was healed: the kept rounds no longer lead to its state (a second liar's rounds before the
        heal are past healing)."""
        self._rounds.pop(module, None)
