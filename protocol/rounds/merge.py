"""How a module group's outer gradients become one: screening each contribution, then a robust mean.

Pure math over decoded tensors (no networking): the reducer of a round (protocol/rounds/rule.py) and the
simulator (node/train/simulate.py) call the same `merge`, so benchmarks measure the rule the swarm runs.

1. Screening. A contribution is rejected, with its peer and a reason, if its frame does not decode,
   holds another number of values than the module, holds NaN/Inf, or (in groups of 3 or more) has a
   norm above `norm_bound` × the median norm of the group's non-zero contributions. With one or two
   contributions there is no majority to measure against: each is clipped (scaled down, not
   rejected) to `norm_bound` × a reference from the module's history instead (the round rule passes
   the norm of the outer momentum, the running sum of the rounds merged so far; 0 before any
   Nesterov round, when only the first three checks apply). Clipping, not rejection: an honest
   contribution that once exceeded the bound would be carried into the next round, larger, and a
   lone node could be stuck rejecting itself.
2. Robust mean: token-weighted CenteredClip (Karimireddy et al. 2021, the rule hivemind ships):
   start at the coordinate-wise median, then repeat v ← v + Σ wᵢ·clip(xᵢ − v, τ) / Σ wᵢ, where clip
   scales a vector down to norm τ, and τ = `clip_factor` × the median distance of the contributions
   to the starting point. Honest contributions of a group lie within τ of each other's centre and
   are averaged as they are (with no clipping the first step lands exactly on the weighted mean);
   one far-off contribution (sign-flipped, noise) moves the result by at most its weight × τ.
   `clip_factor = 0` gives the plain token-weighted mean.

Everything runs in the order given (callers sort by peer id) and in float32, so every replica that
computed it would get the same bits; in the swarm only the reducer computes it and encodes it once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from pathswarm.compression import CodecError, decode
from pathswarm.protocol.spec import SwarmSpec


def _decode_int8(frame, max_elements: int) -> torch.Tensor:
    return decode(frame, max_elements=max_elements)


def weighted_average(deltas: Sequence[torch.Tensor], tokens: Sequence[float]) -> torch.Tensor:
    """Token-weighted mean Σ wᵢΔᵢ / Σ wᵢ, accumulated in the order given.

    Callers pass contributions in a canonical order (e.g. sorted by peer id) so that every member of
    a group computes the very same floating-point result."""
    if len(deltas) == 0:
        raise ValueError("weighted_average needs at least one contribution")
    if len(deltas) != len(tokens):
        raise ValueError(f"{len(deltas)} deltas but {len(tokens)} token counts")
    if any(not (t > 0) for t in tokens):
        raise ValueError(f"token counts must be positive, got {list(tokens)}")
    shape = deltas[0].shape
    for d in deltas:
        if d.shape != shape:
            raise ValueError(f"contributions differ in shape: {tuple(d.shape)} vs {tuple(shape)}")
    total = float(sum(tokens))
    out = torch.zeros(shape, dtype=torch.float32)
    for d, t in zip(deltas, tokens, strict=True):
        out.add_(d.float(), alpha=float(t) / total)
    return out


def centered_clip(deltas: Sequence[torch.Tensor], tokens: Sequence[float], clip_factor: float,
                  iterations: int) -> torch.Tensor:
    """Token-weighted CenteredClip of 1-D float32 tensors (see the module docstring)."""
    if clip_factor <= 0 or len(deltas) < 3:
        # Two points have no robust centre (their median is their mean): the plain mean, unclipped.
        return weighted_average(deltas, tokens)
    stacked = torch.stack([d.float() for d in deltas])
    weights = torch.tensor([float(t) for t in tokens], dtype=torch.float32)
    weights /= weights.sum()
    v = stacked.median(dim=0).values if len(deltas) % 2 else stacked.sort(dim=0).values[
        len(deltas) // 2 - 1:len(deltas) // 2 + 1].mean(dim=0)
    tau = clip_factor * float(torch.linalg.vector_norm(stacked - v, dim=1).median())
    if tau == 0.0:
        return weighted_average(deltas, tokens)
    for _ in range(iterations):
        diff = stacked - v
        norms = torch.linalg.vector_norm(diff, dim=1)
        scale = torch.clamp(tau / torch.clamp(norms, min=1e-30), max=1.0)
        v = v + (diff * (weights * scale)[:, None]).sum(dim=0)
    return v


@dataclass
class Merged:
    """What `merge` made of a round's contributions."""

    mean: torch.Tensor | None
    """The robust mean, or None when no contribution passed screening."""
    used: list[str] = field(default_factory=list)
    """Peers whose contributions went into it, in the order given."""
    tokens: int = 0
    """Their tokens."""
    rejected: list[tuple[str, str]] = field(default_factory=list)
    """(peer, reason) of every contribution screened out."""
    clipped: list[str] = field(default_factory=list)
    """Peers whose contribution a small group's history bound scaled down."""


def screen(deltas: Sequence[torch.Tensor | None], norm_bound: float) -> list[str | None]:
    """Per contribution: None if it passes, else why it is rejected (None entries: already rejected)."""
    reasons: list[str | None] = [None if d is not None else "undecodable" for d in deltas]
    norms = {}
    for i, d in enumerate(deltas):
        if d is None:
            continue
        if not bool(torch.isfinite(d).all()):
            reasons[i] = "NaN or Inf values"
            continue
        norms[i] = float(torch.linalg.vector_norm(d))
    # An all-zero contribution says nothing of how large an outer gradient is: left out of the median. In a round in
    # slices (slices.py) most members' slice of embedding rows for rare bytes is all zeros, and the median of 0 then
    # rejected the one member that trained them (and, three times over, ignored it for the session).
    norms = {i: n for i, n in norms.items() if n > 0}
    if norm_bound > 0 and len(norms) >= 3:
        median = float(torch.tensor(list(norms.values())).median())
        for i, n in norms.items():
            if n > norm_bound * median:
                reasons[i] = f"norm {n:.3g} is {n / max(median, 1e-30):.0f}x the group's median {median:.3g}"
    return reasons


def merge(contributions: Sequence[tuple[str, int, bytes]], numel: int, *, norm_bound: float,
          clip_factor: float, clip_iterations: int, reference: float = 0.0, screen_norms: bool = True,
          decode=None) -> Merged:
    """Decode, screen and robustly average (peer, tokens, codec frame) contributions, in the order given;
    `reference`: the history norm that bounds groups of fewer than 3 (`screen`); `decode(frame, max_elements)`:
    the swarm's codec (compression/registry.py; default blockwise int8), raising CodecError for a bad frame."""
    decode = decode or _decode_int8
    deltas: list[torch.Tensor | None] = []
    early: list[str | None] = []
    for _, _, frame in contributions:
        try:
            delta = decode(frame, numel).reshape(-1).float()
        except CodecError as e:
            deltas.append(None)
            early.append(f"undecodable frame ({str(e)[:80]})")
            continue
        if delta.numel() != numel:
            deltas.append(None)
            early.append(f"wrong size: {delta.numel()} values, the module has {numel}")
            continue
        deltas.append(delta)
        early.append(None)
    # screen_norms=False: an audit of the frames a round used (the group's median was taken over all, rejected ones
    # included, so the used ones alone would screen differently); the small-group clip below still applies.
    reasons = [e or r for e, r in zip(early, screen(deltas, norm_bound if screen_norms else 0.0), strict=True)]
    out = Merged(None)
    kept: list[torch.Tensor] = []
    weights: list[int] = []
    for (peer, tokens, _), delta, reason in zip(contributions, deltas, reasons, strict=True):
        if reason is not None:
            out.rejected.append((peer, reason))
            continue
        assert delta is not None  # no reason to reject it: it decoded
        kept.append(delta)
        weights.append(tokens)
        out.used.append(peer)
    if 0 < len(kept) < 3 and norm_bound > 0 and reference > 0:
        bound = norm_bound * reference
        for i, delta in enumerate(kept):
            norm = float(torch.linalg.vector_norm(delta))
            if norm > bound:
                kept[i] = delta * (bound / norm)
                out.clipped.append(out.used[i])
    if kept:
        out.mean = centered_clip(kept, weights, clip_factor, clip_iterations)
        out.tokens = int(sum(weights))
    return out


CARRIED_ROUNDS_WEIGHED = 4
"""A contribution weighs at most this many rounds' tokens (see `max_weight`)."""


def max_weight(spec: SwarmSpec) -> int:
    """The most tokens one contribution may weigh in a mean: what one node trains in CARRIED_ROUNDS_WEIGHED rounds
    (H × batch × context each; a late or failed round carries its tokens into the next). Token counts are
    self-reported: without a cap one peer claiming 2^53 tokens would own the weighted mean (docs/SECURITY.md)."""
    return spec.inner.steps * spec.inner.batch_size * spec.model.context_len * CARRIED_ROUNDS_WEIGHED


def merge_round(contributions: Sequence[tuple[str, int, bytes]], numel: int, spec: SwarmSpec, reference: float,
           screen_norms: bool = True) -> Merged:
    """The round rule's merge of (peer, tokens, frame) contributions: each weighed by its tokens capped at
    `max_weight(spec)`, in sorted peer-id order, decoded with the spec's codec, screened and robustly averaged."""
    cap = max_weight(spec)
    ordered = sorted(((peer, min(tokens, cap), frame) for peer, tokens, frame in contributions), key=lambda c: c[0])
    avg = spec.averaging
    return merge(ordered, numel, norm_bound=avg.norm_bound, clip_factor=avg.clip_factor,
                 clip_iterations=avg.clip_iterations, reference=reference, screen_norms=screen_norms,
                 decode=spec.codec.contribution_codec().decode)
