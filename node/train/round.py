"""A member's side of the outer round as pure functions: make a contribution, settle the result.

DiLoCo (arXiv 2311.08105) run decoupled (as in Decoupled DiLoCo, arXiv 2604.21428): after H inner steps a
holder of a module sends its outer gradient to the round's reducer and trains on; the reducer merges the
contributions into one encoded mean (protocol/rounds/rule.py `close_round`, the reducer's side of the same rule);
every member decodes those same bytes and applies the same outer Nesterov step. Nothing here touches the network
or reads a clock; everything is deterministic for a given input, which is what keeps replicas bit-identical. The
simulator and the running node both call these.

1. `make_contribution`: Δ = anchor − local (+ the error-feedback residual) → one frame of the spec's codec
   (`[codec] kind`: int8 + zstd, or sparse top-k), with what the sender must remember to settle the round later
   (its local weights and residual at the send).
2. `settle` (every member): apply the decoded mean with the outer Nesterov step and decide what becomes of
   the member's own work, by the round's status:
     merged / alone: our Δ is in the mean.      local ← new_anchor + (local_now − local_when_sent)
            (with `[codec] feedback` in the weights, minus what our frame did not carry: it stays ours)
     late:  the round closed without us: apply the mean, keep our Δ for the next round (its tokens carry,
            its error-feedback residual is restored).   local ← new_anchor + (local_now − old_anchor)
     beyond the bound (`bound`: protocol/rounds/rule.py `mean_bound`, for another reducer's round): nothing is
            applied, as for a failed round, and `Settlement.lie` says why: the caller treats the reducer as a
            proven liar.
     failed (or any other status, or a mean that does not decode): nothing is applied; our steps stay in the
            local weights and the next Δ carries them (its tokens carry). A synchronous baseline may instead
            discard them (local ← anchor), as data-parallel training redoes a step a dead rank broke.
   With no overlap (local_now == local_when_sent, as in the simulator) `merged` leaves local = new anchor:
   plain DiLoCo.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from pathswarm.compression import ErrorFeedback, encode_with
from pathswarm.protocol.rounds.messages import APPLIED, OURS
from pathswarm.protocol.rounds.outer import OuterState, pseudo_gradient
from pathswarm.protocol.rounds.rule import RoundError, beyond_bound, decode_mean
from pathswarm.protocol.rounds.slices import Unit, view
from pathswarm.protocol.spec import CodecSpec, OuterOptSpec


@dataclass(frozen=True)
class Contribution:
    """One holder's outer gradient for one module and round, and what it needs to settle the round."""

    frame: bytes
    """The encoded outer gradient: what is sent to the reducer."""
    tokens: int
    """Tokens behind it (this round's, plus those carried from rounds that did not merge it)."""
    round: int
    """The module's outer round it belongs to (the anchor's round at the send)."""
    digest_before: str
    """Digest of the module's outer state at the send: the reducer merges only contributions from its state."""
    local_when_sent: torch.Tensor
    """The local weights at the send (flat fp32): the base of the shift applied when the round merges."""
    feedback_before: dict = field(default_factory=dict)
    """The error-feedback state before this frame was encoded: restored when the Δ is kept for later."""
    delta_norm: float = 0.0
    """The norm of the outer gradient Δ (before encoding): what bounds the means this member applies."""
    unsent: torch.Tensor | None = None
    """With `[codec] feedback` in the weights: Δ minus what the frame carries (flat fp32), kept in the local weights
    when the round merges."""

    @property
    def merged_base(self) -> torch.Tensor:
        """What the local weights count from once this Δ is merged: local ← new anchor + (local − merged_base).
        The weights at the send, plus what the frame did not carry when that stays in the weights."""
        return self.local_when_sent if self.unsent is None else self.local_when_sent + self.unsent



def make_contribution(state: OuterState, local: torch.Tensor, feedback: ErrorFeedback, codec: CodecSpec,
                      tokens: int, decay: float = 1.0) -> Contribution:
    """Encode Δ = anchor − local (with error feedback when the spec says so, its residual decayed by `decay`:
    SparseLoCo's β, `feedback_decay`; `feedback` is updated)."""
    if tokens <= 0:
        raise ValueError(f"a contribution needs a positive token count, got {tokens}")
    local = local.detach().to("cpu", torch.float32, copy=True)  # kept: the caller's tensor may change
    delta = pseudo_gradient(state.anchor, local)
    before = feedback.state_dict()
    kind = codec.contribution_codec()
    unsent = None
    delta_norm = float(torch.linalg.vector_norm(delta))
    if codec.feedback_in_weights:
        kind.check(delta)
        flat = delta.reshape(-1).contiguous()
        frame, decoded = kind.encode_values(flat, tuple(delta.shape), delta.dtype, want_decoded=True)
        assert decoded is not None  # asked for
        unsent = flat - decoded
    elif codec.error_feedback:
        frame = feedback.encode(delta, codec=kind, decay=decay)
        delta_norm = feedback.last_norm  # what the frame encodes: with a decaying buffer, far more than this Δ
    else:
        frame = encode_with(kind, delta)
    return Contribution(frame=frame, tokens=tokens, round=state.round, digest_before=state.digest(),
                        local_when_sent=local, feedback_before=before, delta_norm=delta_norm, unsent=unsent)


@dataclass(frozen=True)
class Settlement:
    """What settling one round did to a member's module."""

    applied: bool
    """An outer step was applied to the anchor."""
    state: OuterState | None = None
    """The module's outer state after the round (None: it stays as it was)."""
    local: torch.Tensor | None = None
    """The member's new local weights (None: leave them as they are)."""
    restore_feedback: bool = False
    """Put the error feedback back to `Contribution.feedback_before`: our Δ was not used and is sent again."""
    merged_tokens: int = 0
    """Our tokens that entered the module through this round."""
    carried_tokens: int = 0
    """Our tokens whose steps stay in the local weights, to be sent with the next outer gradient."""
    discarded_tokens: int = 0
    """Our tokens whose steps were thrown away."""
    digest_after: str = ""
    """Our state's digest after the round ('' when nothing was applied)."""
    diverged: bool = False
    """A mean was applied but our digest is not the one the reducer announced: our replica must be re-synced."""
    reason: str = ""
    """Why nothing was applied, when nothing was."""
    lie: str = ""
    """The mean broke the member's bound (`bound`): proof that its reducer lied; nothing was applied."""


def settle(state: OuterState, sent: Contribution, local_now: torch.Tensor, status: str, result_round: int,
           mean_frame: bytes, digest_expected: str, outer: OuterOptSpec, *, codec: CodecSpec,
           discard: bool = False, next_reducers: tuple[str, ...] = (), bound: float | None = None,
           decoded: torch.Tensor | None = None, moved: torch.Tensor | None = None) -> Settlement:
    """Settle one round of one module on a member (the rule in the module docstring).

    `state` is the module's outer state (left as it is: the new one is `Settlement.state`); `local_now` the local
    weights now (inner steps may have run since the send); `discard`: on a failed round throw our steps away
    instead of carrying them (the synchronous baseline when a member died); `codec`: the spec's, whose mean codec
    the result is decoded with; `next_reducers`: who reduces the next
    round, as the result names them (protocol/rounds/reducers.py), kept with the state when the mean is applied;
    `bound`: the largest mean norm to apply (protocol/rounds/rule.py `mean_bound`; None: no bound, our own round);
    `decoded`: `mean_frame` already decoded by `decode_mean` (the node decodes it once for its checks); `moved`:
    what `eager_shift` moved the local weights by at the send (taken back out first: the steps since the send then
    stand on the new anchor, or on the weights as sent when nothing is applied)."""
    reason = f"status {status}"
    if moved is not None:
        local_now = local_now.detach().to("cpu", torch.float32) - moved
    kept = None if moved is None else local_now  # nothing applied: the weights as sent plus the steps since
    if status in APPLIED and mean_frame and result_round == state.round == sent.round:
        try:
            mean = decoded if decoded is not None else decode_mean(mean_frame, state.anchor.numel(), codec)
        except RoundError as e:
            reason = f"bad mean from the reducer: {e}"
        else:
            lie = beyond_bound(mean, bound) if bound is not None else None
            if lie is not None:
                return Settlement(applied=False, local=kept, restore_feedback=True, carried_tokens=sent.tokens,
                                  reason=f"not applied: {lie}", lie=lie)
            after = state.stepped(mean, outer, reducers=tuple(next_reducers))
            digest = after.digest()
            base = sent.merged_base if status in OURS else state.anchor
            local = after.anchor + (local_now.detach().to("cpu", torch.float32) - base)
            ours = status in OURS
            return Settlement(applied=True, state=after, local=local, restore_feedback=not ours,
                              merged_tokens=sent.tokens if ours else 0, carried_tokens=0 if ours else sent.tokens,
                              digest_after=digest, diverged=bool(digest_expected) and digest != digest_expected)
    elif status in APPLIED and mean_frame:
        reason = f"the result is for round {result_round}, our module is at round {state.round}"
    if discard:
        return Settlement(applied=False, local=state.anchor.clone(), restore_feedback=True,
                          discarded_tokens=sent.tokens, reason=reason)
    return Settlement(applied=False, local=kept, restore_feedback=True, carried_tokens=sent.tokens, reason=reason)


def eager_shift(state: OuterState, local_when_sent: torch.Tensor, outer: OuterOptSpec) -> torch.Tensor | None:
    """Eager updates (Kale et al., arXiv 2502.12996), adapted to anchors every holder keeps identical: at the send,
    what moves the local weights from where they are to the outer step of our own Δ, the estimate of the round's
    mean (`target − local_when_sent`, flat fp32). A decoupled member trains the next chunk from there instead of
    from weights a whole outer step behind the anchor it will get; `settle(moved=...)` takes the shift back out,
    so anchors, digests and what a round merges are unchanged. Why our own Δ and not the last mean: the holders'
    errors (own Δ − mean) average to zero over the group, while the last mean's error is shared by every holder and
    the outer momentum amplifies it (on a quadratic it diverged at H = 50, in the simulator too: docs/BENCHMARKS.md).
    None: no move (the outer warm-up, SparseLoCo)."""
    local = local_when_sent.detach().to("cpu", torch.float32).reshape(-1)
    if outer.kind != "nesterov" or state.round < outer.warmup_rounds:
        # Warm-up rounds are plain averaging: our own Δ would put us where we are (exactly: no rounding noise).
        # SparseLoCo's step is a sparse top-k of the members' feedback buffers, which our dense Δ does not
        # estimate: left alone (not measured).
        return None
    # target − local = Δ − lr · step, the step of protocol/rounds/outer.py `nesterov_step` on Δ, computed with two
    # module-sized temporaries instead of a stepped copy of the whole state (tests/unit/test_eager.py checks the
    # two agree)
    delta = pseudo_gradient(state.anchor, local)
    step = state.momentum.float() * outer.momentum + delta  # the momentum buffer after the step
    if outer.nesterov:
        step.mul_(outer.momentum).add_(delta)
    return delta.sub_(step, alpha=outer.lr)


# ---- a round in slices (protocol/rounds/slices.py) ----------------------------------------------------------------
def make_slice_contributions(state: OuterState, local: torch.Tensor, feedback: ErrorFeedback, codec: CodecSpec,
                             tokens: int, units: Sequence[Unit], decay: float = 1.0) -> list[Contribution]:
    """One contribution per unit of the module's round: `make_contribution` itself for a whole module (K = 1); for
    slices, Δ = anchor − local computed once and each slice encoded on its own (with its part of the error-feedback
    residual, which is updated), each naming its slice's state (`view`) as the state it was taken from."""
    if len(units) == 1 and units[0].k == 1:
        return [make_contribution(state, local, feedback, codec, tokens, decay)]
    if tokens <= 0:
        raise ValueError(f"a contribution needs a positive token count, got {tokens}")
    local = local.detach().to("cpu", torch.float32, copy=True).reshape(-1)
    delta = pseudo_gradient(state.anchor, local)
    kind = codec.contribution_codec()
    kind.check(delta)
    before = feedback.residual
    residual = None if before is None else before.clone()
    out = []
    for unit in units:
        part, unsent = delta[unit.lo:unit.hi].contiguous(), None
        norm = float(torch.linalg.vector_norm(part))
        if codec.feedback_in_weights:
            frame, decoded = kind.encode_values(part, (unit.numel,), part.dtype, want_decoded=True)
            assert decoded is not None  # asked for
            unsent = part - decoded
        elif codec.error_feedback:
            slice_feedback = ErrorFeedback()
            if before is not None:
                slice_feedback.residual = before[unit.lo:unit.hi].clone()
            frame = slice_feedback.encode(part, codec=kind, decay=decay)
            norm = slice_feedback.last_norm  # what the frame encodes, the decayed residual included
            assert slice_feedback.residual is not None  # set by encode
            if residual is None:
                residual = torch.zeros_like(delta)
            residual[unit.lo:unit.hi] = slice_feedback.residual
        else:
            frame = encode_with(kind, part)
        out.append(Contribution(frame=frame, tokens=tokens, round=state.round,
                                digest_before=view(state, unit).digest(), local_when_sent=local[unit.lo:unit.hi],
                                feedback_before={} if before is None else {"residual": before[unit.lo:unit.hi]},
                                delta_norm=norm, unsent=unsent))
    if codec.error_feedback and not codec.feedback_in_weights:
        feedback.residual = residual
    return out


@dataclass(frozen=True)
class SlicedSettlement:
    """A module's round put back together from its units' settlements."""

    settlement: Settlement
    """For the whole module: its state, local weights, tokens, digest (restore_feedback is per unit: below)."""
    restore: tuple[Unit, ...] = ()
    """Units whose error-feedback residual goes back to what it was before their frame was encoded."""


def settle_slices(state: OuterState, units: Sequence[Unit], parts: Sequence[Settlement], local_now: torch.Tensor,
                  tokens: int) -> SlicedSettlement:
    """Put a module's round back together from each unit's `settle` (on its `view`, with the result's list as
    `next_reducers`). A slice applied moves that part of the anchor and momentum; one not applied (failed, refused)
    leaves its part as it was and its steps in the local weights. The module is at the next round when any slice
    was applied, and names the list of the first applied slice's result (every member holding the same results
    names the same list). Our tokens are merged when every slice merged our outer gradient; otherwise they carry to
    the next round whole (the slices that did merge weigh them again then, within `max_weight`'s cap). A round some
    of whose slices were not applied is `diverged`: the others may hold them (see below)."""
    if len(units) == 1 and units[0].k == 1:
        done = parts[0]
        return SlicedSettlement(done, tuple(units) if done.restore_feedback else ())
    applied = [(u, s) for u, s in zip(units, parts, strict=True) if s.applied]
    local_now = local_now.detach().to("cpu", torch.float32).reshape(-1)
    anchor, momentum = state.anchor.clone(), state.momentum.clone()
    local = local_now.clone()
    changed_local = False
    for unit, s in zip(units, parts, strict=True):
        if s.state is not None:
            anchor[unit.lo:unit.hi] = s.state.anchor
            momentum[unit.lo:unit.hi] = s.state.momentum
        if s.local is not None:
            local[unit.lo:unit.hi] = s.local
            changed_local = True
    restore = tuple(u for u, s in zip(units, parts, strict=True) if s.restore_feedback)
    all_merged = all(s.merged_tokens for s in parts)
    discarded = all(s.discarded_tokens for s in parts)
    if not applied:
        reason = "; ".join(sorted({s.reason for s in parts if s.reason}))
        done = Settlement(applied=False, local=local if changed_local else None, restore_feedback=True,
                          carried_tokens=0 if discarded else tokens, discarded_tokens=tokens if discarded else 0,
                          reason=reason)
        return SlicedSettlement(done, restore)
    after = OuterState(anchor, momentum, state.round + 1, applied[0][1].state.reducers)  # type: ignore[union-attr]
    failed = [u for u, s in zip(units, parts, strict=True) if not s.applied]
    reason = f"slices {', '.join(str(u.j) for u in failed)} of {len(units)} not applied" if failed else ""
    # A slice not applied here may have been applied by the others (its reducer answered them, not us; it said we
    # are behind): our state at the next round is then not the group's, under the same round number, which the split
    # watch would find rounds later as two versions and heal by throwing those rounds away (benchmarks/restarts.py
    # --slices). Marked diverged, the node checks its state against the one a majority vouches for at once, and
    # adopts it if it differs (keeping its local progress); a slice that failed for everyone changes nothing then.
    done = Settlement(applied=True, state=after, local=local, restore_feedback=bool(restore),
                      merged_tokens=tokens if all_merged else 0, carried_tokens=0 if all_merged else tokens,
                      digest_after=after.digest(), diverged=any(s.diverged for s in parts) or bool(failed),
                      reason=reason)
    return SlicedSettlement(done, restore)


def restore_feedback(feedback: ErrorFeedback, units: Sequence[Unit], sent: Sequence[Contribution],
                     restore: Sequence[Unit]) -> None:
    """Put the error-feedback residual of the `restore` units (`SlicedSettlement.restore`: their outer gradient was
    not used) back to what it was before their frames were encoded: it is sent again with the steps that carry."""
    if not restore:
        return
    if len(units) == 1:
        feedback.load_state_dict(sent[0].feedback_before)
        return
    if feedback.residual is None:
        return
    by_unit = dict(zip(units, sent, strict=True))
    for unit in restore:
        before = by_unit[unit].feedback_before.get("residual")
        feedback.residual[unit.lo:unit.hi] = 0.0 if before is None else before


def feedback_decay(spec) -> float:
    """How much of a member's error-feedback residual carries into its next outer gradient: SparseLoCo's β (the
    buffer is its momentum), else all of it."""
    return spec.outer.beta if spec.outer.kind == "sparseloco" else 1.0
