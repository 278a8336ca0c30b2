"""The reducer's round rule: contributions → one canonical encoded mean and the state it makes; its checks.

Pure functions over tensors and bytes (no network, no clock): the reducer of a round (protocol/rounds/reducer.py),
the simulator (node/train/simulate.py) and every auditor (node/peer/audit.py) run exactly these, so what the
benchmarks measure is the rule the swarm runs. The member's side (make a contribution, settle a result) is
node/train/round.py.

1. `close_round` (the reducer): validated frames, sorted by peer id → screened, robust token-weighted mean
   (protocol/rounds/merge.py `merge_round`) → encoded **once** → the canonical result every member decodes, and
   the state (and digest) it makes of the state the round opened with.
2. `decode_mean` (every member): the result's untrusted bytes → the mean, checked for size and finiteness;
   `mean_bound` / `beyond_bound` (every member, before applying another's round): a mean far larger than any
   honest round's is a proven lie (docs/SECURITY.md, "Bounded damage").
3. `audit_mean` (a member auditing another's round, protocol/rounds/audit.py): the frames the result lists →
   the same screened, clipped mean → is the reducer's within AUDIT_TOLERANCE of it?
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from pathswarm.compression import CodecError
from pathswarm.protocol.rounds.frame_list import commit_frames, frame_hash
from pathswarm.protocol.rounds.merge import merge_round
from pathswarm.protocol.rounds.outer import OuterState
from pathswarm.protocol.spec import CodecSpec, SwarmSpec


class RoundError(ValueError):
    """A round's result cannot be applied (its mean does not decode, has the wrong size or is not finite)."""


def encode_mean(mean: torch.Tensor, codec: CodecSpec) -> bytes:
    """The canonical bytes of a round's mean: encoded once, without error feedback (every member decodes these)."""
    return codec.mean_codec().encode(mean)


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


def close_round(contributions: Sequence[tuple[str, int, bytes]], numel: int, spec: SwarmSpec,
                before: OuterState | None = None) -> ClosedRound:
    """Merge (peer, tokens, frame) contributions in sorted peer-id order into one canonical encoded mean, each
    weighed by its tokens capped at `max_weight(spec)`.

    `before`: the module's state the round opened with; the result then carries the state after the round
    (its digest is what every member must reach). `before` is not modified."""
    # A group of 1 or 2 has no majority to measure a norm against: the module's outer momentum (the running sum of
    # the rounds merged so far, the same on every replica) bounds it instead.
    merged = merge_round(contributions, numel, spec, reference_norm(before))
    if merged.mean is None:
        return ClosedRound(b"", (), 0, tuple(merged.rejected))
    # The mean is encoded without error feedback: every member decodes exactly these bytes.
    mean_frame = encode_mean(merged.mean, spec.codec)
    after = None
    if before is not None:
        after = before.stepped(decode_mean(mean_frame, numel, spec.codec), spec.outer)
    claimed = dict((peer, tokens) for peer, tokens, _ in contributions)  # the tokens they trained, uncapped
    return ClosedRound(mean_frame, tuple(merged.used), sum(claimed[p] for p in merged.used), tuple(merged.rejected),
                       after)


def reference_norm(before: OuterState | None) -> float:
    """The history norm that bounds a group of 1 or 2 (protocol/rounds/merge.py): the outer momentum's, or 0."""
    return float(torch.linalg.vector_norm(before.momentum)) if before is not None else 0.0


MEAN_BOUND = 4.0
"""A member applies another reducer's mean only if its norm is at most this × the larger of (its own outer
gradient's norm, scaled up to a full round's tokens) and (the module's outer momentum's norm). An honest mean is a
robust average of outer gradients like ours: in the round rule's own runs (benchmarks/hostile.py's spec, 4 paths,
30 rounds) it never exceeded 1.05 × the member's own, and 1.08 × the momentum once that exists. A factor of 4
leaves room for a group whose members trained unevenly, and for an outlier CenteredClip lets move the mean by
its weight × the clip radius; a liar is held to it (what it can still do inside it: docs/SECURITY.md). With
`averaging.clip_factor = 0` (a plain mean) the factor is the norm screen's instead, and with `norm_bound = 0` (no
screen) there is no bound."""


def mean_bound(own_norm: float, own_tokens: int, momentum_norm: float, spec: SwarmSpec, group: int = 3) -> float:
    """The largest mean norm a member applies from another reducer (MEAN_BOUND): derived from what the member
    knows alone (its own outer gradient and tokens, the replicated momentum, the spec), so a reducer cannot widen
    it. An outer gradient of fewer tokens than a round's (a short catch-up chunk) is scaled up to a full round's.
    `group`: the contributors the result lists. A group of 1 or 2 has no median to screen against: each
    contribution is only clipped to `norm_bound` × the momentum's norm (protocol/rounds/merge.py), so the bound is
    that when it is larger, and there is none before the first Nesterov round (no momentum yet): a restarted
    member's first outer gradient, its AdamW moments lost, measured 12 × the group's, and a pair's honest mean
    with it broke the 4 × bound. A reducer that lists fewer contributors to reach this wider bound must leave out
    members, who see that their frame is not listed (protocol/rounds/member.py)."""
    avg = spec.averaging
    if avg.norm_bound <= 0 or (group < 3 and momentum_norm <= 0):
        return math.inf  # no screen, or none yet: nothing bounds an honest mean (one outer gradient may be any size)
    # A robust mean (CenteredClip) stays near the group's centre; a plain mean of screened contributions can reach
    # the screen's own bound (norm_bound × the group's median norm).
    factor = MEAN_BOUND if avg.clip_factor > 0 else max(MEAN_BOUND, avg.norm_bound)
    per_round = spec.inner.steps * spec.inner.batch_size * spec.model.context_len
    scale = max(1.0, per_round / max(own_tokens, 1))
    bound = factor * max(own_norm * scale, momentum_norm)
    return max(bound, avg.norm_bound * momentum_norm) if group < 3 else bound


def beyond_bound(mean: torch.Tensor, bound: float) -> str | None:
    """Why a decoded mean breaks the member's bound (`mean_bound`), or None when it respects it."""
    norm = float(torch.linalg.vector_norm(mean))
    if norm > bound:
        return f"its mean's norm {norm:.3g} is {norm / max(bound, 1e-30):.3g}x the most an honest round sends us"
    return None


SUSPECT_COSINE = 0.0
"""A member's check before applying (node/peer/audit.py) also takes any round whose mean has at most this cosine
with the member's own outer gradient in it: an honest robust mean contains ours with its weight and the others'
pull the same way more often than not (the round rule's own runs: never below 0.09 over 360 DiPaCo member-rounds,
0.48 over 480 DiLoCo ones), where a sign-flipped mean sits near −0.6. A suspicion, not a proof: the audit decides."""


def suspicious(mean: torch.Tensor, own_delta: torch.Tensor) -> bool:
    """Does a round's mean point away from our own outer gradient in it (SUSPECT_COSINE)?"""
    dot = float(torch.dot(mean.reshape(-1).double(), own_delta.reshape(-1).double()))
    norms = float(torch.linalg.vector_norm(mean)) * float(torch.linalg.vector_norm(own_delta))
    return norms > 0 and dot <= SUSPECT_COSINE * norms


AUDIT_TOLERANCE = 1e-2
"""An audited mean may differ from the recomputed one by this fraction of its norm: another machine's float sums
(SIMD width, threads) may round a few values into the next int8 step. A reducer can bias a round by no more."""


def audit_mean(frames: dict[str, tuple[int, bytes]], listed: Sequence[tuple[str, int]], frames_digest: str,
               mean_frame: bytes, numel: int, spec: SwarmSpec, reference: float) -> str | None:
    """Check a reducer's result against the frames it says it merged (protocol/rounds/audit.py): None when the mean is
    what the round rule makes of them, else the proof in words. `frames`: {peer: (tokens, frame)} as downloaded;
    `listed` and `frames_digest`: the result's (peer, tokens) list and its commitment to the frames
    (frame_list.py `commit_frames`), as the reducer sent them to us; `reference`: the module's outer momentum norm
    before the round (`reference_norm`). Raises ValueError when the frames are not the listed ones (no proof:
    whoever served them may be the liar)."""
    if {p: t for p, (t, _) in frames.items()} != dict(listed) or commit_frames(
            [(p, t, frame_hash(frames[p][1])) for p, t in listed]) != frames_digest:
        raise ValueError("the frames served are not the ones the result lists")
    # Norms are not screened again: the reducer measured them against the median of all the round's frames, the
    # rejected ones included, which the list does not carry. What does not decode, has the wrong size or holds NaN
    # is rejected by any reducer, whatever the group.
    merged = merge_round([(p, t, f) for p, (t, f) in frames.items()], numel, spec, reference, screen_norms=False)
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
        mean = codec.mean_codec().decode(frame, max_elements=numel).reshape(-1)
    except CodecError as e:
        raise RoundError(f"the mean does not decode: {e}") from None
    if mean.numel() != numel:
        raise RoundError(f"the mean has {mean.numel()} values, the module {numel}")
    if not bool(torch.isfinite(mean).all()):
        raise RoundError("the mean holds NaN or Inf values")
    return mean.float()
