"""The outer round as pure functions: the one rule the simulator and the running node both use.

DiLoCo (arXiv 2311.08105) run decoupled (as in Decoupled DiLoCo, arXiv 2604.21428): after H inner steps a
holder of a module sends its outer gradient to the round's reducer and trains on; the reducer merges the
contributions into one encoded mean; every member decodes those same bytes and applies the same outer
Nesterov step. Nothing here touches the network or reads a clock; everything is deterministic for a given
input, which is what keeps replicas bit-identical.

1. `make_contribution`: Δ = anchor − local (+ the error-feedback residual) → one frame of the spec's codec
   (`[codec] kind`: int8 + zstd, or sparse top-k; compression/codecs.py), with what
   the sender must remember to settle the round later (its local weights and residual at the send).
2. `close_round` (the reducer): validated frames, sorted by peer id → screened, robust token-weighted mean
   (protocol/aggregate.py) → encoded **once** → the canonical result every member decodes, and the
   digest the state has after applying it.
3. `settle` (every member): apply the decoded mean with the outer Nesterov step and decide what becomes of
   the member's own work, by the round's status:
     merged / alone: our Δ is in the mean.      local ← new_anchor + (local_now − local_when_sent)
            (with `[codec] feedback` in the weights, minus what our frame did not carry: it stays ours)
     late:  the round closed without us: apply the mean, keep our Δ for the next round (its tokens carry,
            its error-feedback residual is restored).   local ← new_anchor + (local_now − old_anchor)
     failed (or any other status, or a mean that does not decode): nothing is applied; our steps stay in the
            local weights and the next Δ carries them (its tokens carry). A synchronous baseline may instead
            discard them (local ← anchor), as data-parallel training redoes a step a dead rank broke.
   With no overlap (local_now == local_when_sent, as in the simulator) `merged` leaves local = new anchor:
   plain DiLoCo.
4. `audit_mean` (a member auditing another's round, protocol/audit.py): the frames the result lists →
   the same screened, clipped mean → is the reducer's within AUDIT_TOLERANCE of it?
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from pathswarm.compression import CodecError, ErrorFeedback
from pathswarm.compression.codecs import Codec, Int8Codec, SparseCodec, encode_with
from pathswarm.node.train.outer import OuterState, pseudo_gradient
from pathswarm.protocol.aggregate import merge
from pathswarm.protocol.audit import frame_hash
from pathswarm.protocol.spec import CodecSpec, OuterOptSpec, SwarmSpec

APPLIED = ("merged", "alone", "late")
"""Statuses whose mean every member applies."""
MERGED = ("merged", "alone")
"""Statuses in which our own outer gradient is part of the mean."""


class RoundError(ValueError):
    """A round's result cannot be applied (its mean does not decode, has the wrong size or is not finite)."""


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
    unsent: torch.Tensor | None = None
    """With `[codec] feedback` in the weights: Δ minus what the frame carries (flat fp32), kept in the local weights
    when the round merges."""

    @property
    def merged_base(self) -> torch.Tensor:
        """What the local weights count from once this Δ is merged: local ← new anchor + (local − merged_base).
        The weights at the send, plus what the frame did not carry when that stays in the weights."""
        return self.local_when_sent if self.unsent is None else self.local_when_sent + self.unsent


def contribution_codec(codec: CodecSpec) -> Codec:
    """How a member encodes its outer gradient (the spec's codec kind and parameters)."""
    if codec.kind == "sparse":
        return SparseCodec(codec.chunk_size, codec.k_per_chunk, codec.value_bits, codec.zstd_level)
    return Int8Codec(codec.block_size, codec.zstd_level, codec.target_error)


def mean_codec(codec: CodecSpec) -> Codec:
    """How a reducer encodes a round's mean. Sparse: every non-zero entry (the union of the contributions'
    supports) at `mean_bits`; int8: as a contribution."""
    if codec.kind == "sparse":
        return SparseCodec(codec.chunk_size, None, codec.mean_bits, codec.zstd_level)
    return contribution_codec(codec)


def encode_mean(mean: torch.Tensor, codec: CodecSpec) -> bytes:
    """The canonical bytes of a round's mean: encoded once, without error feedback (every member decodes these)."""
    return encode_with(mean_codec(codec), mean)


def make_contribution(state: OuterState, local: torch.Tensor, feedback: ErrorFeedback, codec: CodecSpec,
                      tokens: int) -> Contribution:
    """Encode Δ = anchor − local (with error feedback when the spec says so; `feedback` is updated)."""
    if tokens <= 0:
        raise ValueError(f"a contribution needs a positive token count, got {tokens}")
    local = local.detach().to("cpu", torch.float32, copy=True)  # kept: the caller's tensor may change
    delta = pseudo_gradient(state.anchor, local)
    before = feedback.state_dict()
    kind = contribution_codec(codec)
    unsent = None
    if codec.feedback_in_weights:
        kind.check(delta)
        flat = delta.reshape(-1).contiguous()
        frame, decoded = kind.encode_values(flat, tuple(delta.shape), delta.dtype, want_decoded=True)
        unsent = flat - decoded
    elif codec.error_feedback:
        frame = feedback.encode(delta, codec=kind)
    else:
        frame = encode_with(kind, delta)
    return Contribution(frame=frame, tokens=tokens, round=state.round, digest_before=state.digest(),
                        local_when_sent=local, feedback_before=before, unsent=unsent)


@dataclass(frozen=True)
class ClosedRound:
    """What the reducer makes of a round's contributions."""

    mean_frame: bytes
    """The encoded robust mean every member decodes (b'' when no contribution passed screening)."""
    used: tuple[str, ...]
    """Peers whose outer gradients are in the mean, sorted."""
    tokens: int
    """Their tokens."""
    rejected: tuple[tuple[str, str], ...]
    """(peer, reason) of every contribution screened out."""
    after: OuterState | None = None
    """The state after applying the mean to the state the round opened with (None when not given or no mean)."""

    @property
    def digest_after(self) -> str:
        return self.after.digest() if self.after is not None else ""


CARRIED_ROUNDS_WEIGHED = 4
"""A contribution weighs at most this many rounds' tokens (see `max_weight`)."""


def max_weight(spec: SwarmSpec) -> int:
    """The most tokens one contribution may weigh in a mean: what one node trains in CARRIED_ROUNDS_WEIGHED rounds
    (H × batch × context each; a late or failed round carries its tokens into the next). Token counts are
    self-reported: without a cap one peer claiming 2^53 tokens would own the weighted mean (docs/SECURITY.md)."""
    return spec.inner.steps * spec.inner.batch_size * spec.model.context_len * CARRIED_ROUNDS_WEIGHED


def close_round(contributions: Sequence[tuple[str, int, bytes]], numel: int, spec: SwarmSpec,
                before: OuterState | None = None) -> ClosedRound:
    """Merge (peer, tokens, frame) contributions in sorted peer-id order into one canonical encoded mean, each
    weighed by its tokens capped at `max_weight(spec)`.

    `before`: the module's state the round opened with; the result then carries the state after the round
    (its digest is what every member must reach). `before` is not modified."""
    # A group of 1 or 2 has no majority to measure a norm against: the module's outer momentum (the running sum of
    # the rounds merged so far, the same on every replica) bounds it instead.
    merged = _merge(contributions, numel, spec, reference_norm(before))
    if merged.mean is None:
        return ClosedRound(b"", (), 0, tuple(merged.rejected))
    # The mean is encoded without error feedback: every member decodes exactly these bytes.
    mean_frame = encode_mean(merged.mean, spec.codec)
    after = None
    if before is not None:
        after = OuterState(before.anchor.clone(), before.momentum.clone(), before.round)
        after.apply(decode_mean(mean_frame, numel, spec.codec), spec.outer)
    claimed = dict((peer, tokens) for peer, tokens, _ in contributions)  # the tokens they trained, uncapped
    return ClosedRound(mean_frame, tuple(merged.used), sum(claimed[p] for p in merged.used), tuple(merged.rejected),
                       after)


def reference_norm(before: OuterState | None) -> float:
    """The history norm that bounds a group of 1 or 2 (protocol/aggregate.py): the outer momentum's, or 0."""
    return float(torch.linalg.vector_norm(before.momentum)) if before is not None else 0.0


def _merge(contributions: Sequence[tuple[str, int, bytes]], numel: int, spec: SwarmSpec, reference: float,
           screen_norms: bool = True):
    cap = max_weight(spec)
    ordered = sorted(((peer, min(tokens, cap), frame) for peer, tokens, frame in contributions), key=lambda c: c[0])
    avg = spec.averaging
    return merge(ordered, numel, norm_bound=avg.norm_bound, clip_factor=avg.clip_factor,
                 clip_iterations=avg.clip_iterations, reference=reference, screen_norms=screen_norms,
                 decode=contribution_codec(spec.codec).decode)


AUDIT_TOLERANCE = 1e-2
"""An audited mean may differ from the recomputed one by this fraction of its norm: another machine's float sums
(SIMD width, threads) may round a few values into the next int8 step. A reducer can bias a round by no more."""


def audit_mean(frames: dict[str, tuple[int, bytes]], listed: Sequence[tuple[str, int, str]], mean_frame: bytes,
               numel: int, spec: SwarmSpec, reference: float) -> str | None:
    """Check a reducer's result against the frames it says it merged (protocol/audit.py): None when the mean is
    what the round rule makes of them, else the proof in words. `frames`: {peer: (tokens, frame)} as downloaded;
    `listed`: the result's (peer, tokens, frame hash) list, as the reducer sent it to us; `reference`: the
    module's outer momentum norm before the round (`reference_norm`). Raises ValueError when the frames are not
    the listed ones (no proof: whoever served them may be the liar)."""
    want = {p: (t, h) for p, t, h in listed}
    got = {p: (t, frame_hash(f)) for p, (t, f) in frames.items()}
    if got != want:
        raise ValueError("the frames served are not the ones the result lists")
    # Norms are not screened again: the reducer measured them against the median of all the round's frames, the
    # rejected ones included, which the list does not carry. What does not decode, has the wrong size or holds NaN
    # is rejected by any reducer, whatever the group.
    merged = _merge([(p, t, f) for p, (t, f) in frames.items()], numel, spec, reference, screen_norms=False)
    if merged.mean is None:
        return "none of the listed frames decodes, yet the result has a mean"
    if merged.rejected:
        return f"the result lists {len(merged.rejected)} frame(s) no reducer merges ({merged.rejected[0][1]})"
    try:
        theirs = decode_mean(mean_frame, numel, spec.codec)
    except RoundError as e:
        return str(e)
    ours = decode_mean(encode_mean(merged.mean, spec.codec), numel, spec.codec)
    gap, size = float(torch.linalg.vector_norm(theirs - ours)), float(torch.linalg.vector_norm(ours))
    if gap > AUDIT_TOLERANCE * size + 1e-12:
        return f"its mean is {gap / max(size, 1e-30):.3g}x the recomputed mean's norm away from it"
    return None


def decode_mean(frame: bytes, numel: int, codec: CodecSpec) -> torch.Tensor:
    """A round's mean from its (untrusted) bytes: flat fp32 of the module's size, all finite, or RoundError."""
    try:
        mean = mean_codec(codec).decode(frame, max_elements=numel).reshape(-1)
    except CodecError as e:
        raise RoundError(f"the mean does not decode: {e}") from None
    if mean.numel() != numel:
        raise RoundError(f"the mean has {mean.numel()} values, the module {numel}")
    if not bool(torch.isfinite(mean).all()):
        raise RoundError("the mean holds NaN or Inf values")
    return mean.float()


@dataclass(frozen=True)
class Settlement:
    """What settling one round did to a member's module (its outer state is updated in place)."""

    applied: bool
    """An outer step was applied to the anchor."""
    local: torch.Tensor | None
    """The member's new local weights (None: leave them as they are)."""
    restore_feedback: bool
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


def settle(state: OuterState, sent: Contribution, local_now: torch.Tensor, status: str, result_round: int,
           mean_frame: bytes, digest_expected: str, outer: OuterOptSpec, *, codec: CodecSpec,
           discard: bool = False, next_reducers: tuple[str, ...] = ()) -> Settlement:
    """Settle one round of one module on a member (the rule in the module docstring).

    `state` is the module's outer state and is updated in place when a mean is applied; `local_now` the local
    weights now (inner steps may have run since the send); `discard`: on a failed round throw our steps away
    instead of carrying them (the synchronous baseline when a member died); `codec`: the spec's, whose mean codec
    the result is decoded with; `next_reducers`: who reduces the next
    round, as the result names them (protocol/reducers.py), kept with the state when the mean is applied."""
    reason = f"status {status}"
    if status in APPLIED and mean_frame and result_round == state.round == sent.round:
        try:
            mean = decode_mean(mean_frame, state.anchor.numel(), codec)
        except RoundError as e:
            reason = f"bad mean from the reducer: {e}"
        else:
            old_anchor = state.anchor.clone()
            state.apply(mean, outer)
            state.reducers = tuple(next_reducers)
            digest = state.digest()
            base = sent.merged_base if status in MERGED else old_anchor
            local = state.anchor + (local_now.detach().to("cpu", torch.float32) - base)
            ours = status in MERGED
            return Settlement(applied=True, local=local, restore_feedback=not ours,
                              merged_tokens=sent.tokens if ours else 0, carried_tokens=0 if ours else sent.tokens,
                              digest_after=digest, diverged=bool(digest_expected) and digest != digest_expected)
    elif status in APPLIED and mean_frame:
        reason = f"the result is for round {result_round}, our module is at round {state.round}"
    if discard:
        return Settlement(applied=False, local=state.anchor.clone(), restore_feedback=True,
                          discarded_tokens=sent.tokens, reason=reason)
    return Settlement(applied=False, local=None, restore_feedback=True, carried_tokens=sent.tokens, reason=reason)
