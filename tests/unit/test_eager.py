"""Eager updates (node/train/round.py `eager_shift`, `settle(moved=...)`) on a problem whose answer is known: M
workers with quadratic losses of their own, trained by plain SGD with seeded noise, so that a chunk of H steps is
an affine map of where it starts. There a decoupled schedule with eager updates must reproduce DiLoCo's anchors
exactly (each worker's estimate errs by its own Δ minus the mean, which sums to zero over the group), while the
same schedule without them (the next chunk trained from the weights sent) falls behind."""

from __future__ import annotations

import dataclasses

import torch

from pathswarm.node.train.round import Contribution, eager_shift, settle
from pathswarm.protocol.rounds.outer import OuterState, pseudo_gradient
from pathswarm.protocol.spec import SwarmSpec

M, D, ETA, ROUNDS = 4, 64, 0.05, 12
OUTER = SwarmSpec().outer
CODEC = SwarmSpec().codec
CURV = torch.logspace(-2, 0, D)
CENTERS = torch.randn(M, D, generator=torch.Generator().manual_seed(0))


def loss(x: torch.Tensor) -> float:
    return 0.5 * float((CURV * (x - CENTERS.mean(0)) ** 2).sum())


def chunk(x: torch.Tensor, k: int, r: int, h: int) -> torch.Tensor:
    """H SGD steps of worker k in its round r; the noise depends on (k, r) only, not on where the chunk starts."""
    gen = torch.Generator().manual_seed(1000 * k + r)
    x = x.clone()
    for _ in range(h):
        x -= ETA * (CURV * (x - CENTERS[k]) + 0.3 * torch.randn(D, generator=gen))
    return x


def sent(st: OuterState, local: torch.Tensor) -> Contribution:
    return Contribution(frame=b"", tokens=1, round=st.round, digest_before=st.digest(), local_when_sent=local.clone())


def synchronous(h: int) -> list[OuterState]:
    st, states = OuterState.fresh(torch.full((D,), 3.0)), []
    for r in range(ROUNDS):
        ends = [chunk(st.anchor, k, r, h) for k in range(M)]
        st = st.stepped(torch.stack([pseudo_gradient(st.anchor, e) for e in ends]).mean(0), OUTER)
        states.append(st)
    return states


def decoupled(h: int, eager: bool) -> list[OuterState]:
    """Each round's mean lands after the whole next chunk (the simulator's overlap 1), settled by `settle`."""
    st, states = OuterState.fresh(torch.full((D,), 3.0)), []
    local = [st.anchor.clone() for _ in range(M)]
    pending = None  # (the mean, each worker's contribution, each worker's eager move)
    for r in range(ROUNDS + 1):
        if r < ROUNDS:
            local = [chunk(local[k], k, r, h) for k in range(M)]
        if pending is not None:
            mean, contributions, moves = pending
            done = [settle(st, contributions[k], local[k], "merged", st.round, b"mean", "", OUTER, codec=CODEC,
                           decoded=mean, moved=moves[k]) for k in range(M)]
            assert all(d.applied for d in done) and len({d.digest_after for d in done}) == 1
            st, local = done[0].state, [d.local for d in done]
            states.append(st)
        if r == ROUNDS:
            break
        contributions = [sent(st, x) for x in local]
        mean = torch.stack([pseudo_gradient(st.anchor, x) for x in local]).mean(0)
        moves = [eager_shift(st, x, OUTER) if eager else None for x in local]
        local = [x if m is None else x + m for x, m in zip(local, moves, strict=True)]
        pending = (mean, contributions, moves)
    return states


def test_eager_updates_give_diloco_anchors_on_a_quadratic_and_plain_overlap_falls_behind():
    for h in (10, 50):
        sync, late, eager = synchronous(h), decoupled(h, eager=False), decoupled(h, eager=True)
        assert len(sync) == len(late) == len(eager) == ROUNDS
        for a, b in zip(sync, eager, strict=True):
            assert torch.allclose(a.anchor, b.anchor, rtol=1e-4, atol=1e-4) and a.round == b.round
        assert loss(late[-1].anchor) > 1.1 * loss(sync[-1].anchor), h  # the gap eager updates close
        assert loss(sync[-1].anchor) < 0.05 * loss(torch.full((D,), 3.0))  # and the problem was learned


def test_a_round_not_applied_gives_back_the_weights_as_sent_plus_the_steps_since():
    st = OuterState(torch.randn(D), torch.randn(D) * 0.1, round=OUTER.warmup_rounds + 4)  # past the warm-up
    at_send = st.anchor - 0.1 * torch.randn(D)
    move = eager_shift(st, at_send, OUTER)
    assert move is not None and float(move.abs().max()) > 0
    # the move is the outer step of our own Δ: to where the anchor would go if the mean were exactly ours
    for outer in (OUTER, dataclasses.replace(OUTER, nesterov=False), dataclasses.replace(OUTER, lr=0.35)):
        assert torch.allclose(at_send + eager_shift(st, at_send, outer),
                              st.stepped(st.anchor - at_send, outer).anchor, atol=1e-6)
    steps = 0.01 * torch.randn(D)
    done = settle(st, sent(st, at_send), at_send + move + steps, "failed", st.round, b"", "", OUTER, codec=CODEC,
                  moved=move)
    assert not done.applied and torch.allclose(done.local, at_send + steps, atol=1e-6)
    # late: the mean applied, our Δ kept for the next round, on top of the new anchor as without the move
    mean = 0.05 * torch.randn(D)
    done = settle(st, sent(st, at_send), at_send + move + steps, "late", st.round, b"mean", "", OUTER, codec=CODEC,
                  decoded=mean, moved=move)
    after = st.stepped(mean, OUTER)
    assert done.applied and torch.allclose(done.local, after.anchor + (at_send + steps - st.anchor), atol=1e-6)
    # in warm-up rounds the outer step is plain averaging: our own Δ moves us nowhere
    warm = OuterState(st.anchor, st.momentum, round=2)
    assert eager_shift(warm, at_send, dataclasses.replace(OUTER, warmup_rounds=3)) is None
    # SparseLoCo's sparse step is not what our dense Δ estimates: no move
    assert eager_shift(st, at_send, dataclasses.replace(OUTER, kind="sparseloco")) is None
