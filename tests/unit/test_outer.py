"""Outer optimisation: pseudo-gradient, token-weighted mean and Nesterov step against hand-computed values."""

import pytest
import torch

from pathswarm.protocol.rounds.merge import weighted_average
from pathswarm.protocol.rounds.outer import OuterState, nesterov_step, pseudo_gradient
from pathswarm.protocol.spec import OuterOptSpec


def test_pseudo_gradient_is_anchor_minus_local():
    assert torch.equal(pseudo_gradient(torch.tensor([1.0, 2.0]), torch.tensor([0.5, 2.5])), torch.tensor([0.5, -0.5]))
    with pytest.raises(ValueError, match="shape"):
        pseudo_gradient(torch.zeros(2), torch.zeros(3))


def test_weighted_average_is_token_weighted_mean():
    avg = weighted_average([torch.tensor([1.0, 0.0]), torch.tensor([5.0, 4.0])], [100, 300])
    assert torch.allclose(avg, torch.tensor([4.0, 3.0]))
    with pytest.raises(ValueError, match="positive"):
        weighted_average([torch.zeros(1)], [0])
    with pytest.raises(ValueError, match="shape"):
        weighted_average([torch.zeros(1), torch.zeros(2)], [1, 1])
    with pytest.raises(ValueError, match="at least one"):
        weighted_average([], [])


def test_nesterov_two_rounds_by_hand():
    cfg = OuterOptSpec(lr=0.7, momentum=0.9, nesterov=True)
    anchor, buf = torch.tensor([1.0, 2.0]), torch.zeros(2)
    nesterov_step(anchor, buf, torch.tensor([0.5, -0.5]), cfg)
    # buf = [0.5, -0.5]; step = Δ + 0.9·buf = [0.95, -0.95]; anchor -= 0.7·step
    assert torch.allclose(anchor, torch.tensor([0.335, 2.665]))
    nesterov_step(anchor, buf, torch.tensor([0.1, 0.1]), cfg)
    # buf = [0.55, -0.35]; step = [0.595, -0.215]
    assert torch.allclose(buf, torch.tensor([0.55, -0.35]))
    assert torch.allclose(anchor, torch.tensor([-0.0815, 2.8155]))


def test_matches_torch_sgd_nesterov():
    torch.manual_seed(0)
    w = torch.randn(50)
    p = torch.nn.Parameter(w.clone())
    sgd = torch.optim.SGD([p], lr=0.7, momentum=0.9, nesterov=True)
    state = OuterState.fresh(w)
    for _ in range(5):
        g = torch.randn(50)
        p.grad = g.clone()
        sgd.step()
        state = state.stepped(g, OuterOptSpec(warmup_rounds=0))
    assert torch.allclose(state.anchor, p.detach(), atol=1e-6)
    assert state.round == 5


def test_warmup_rounds_average_plainly_then_nesterov_starts_cold():
    cfg = OuterOptSpec(lr=0.7, momentum=0.9, nesterov=True, warmup_rounds=2)
    state = OuterState.fresh(torch.tensor([1.0, 2.0]))
    state = state.stepped(torch.tensor([0.5, -0.5]), cfg)  # round 0: anchor − Δ, buffer untouched
    assert torch.equal(state.anchor, torch.tensor([0.5, 2.5])) and torch.equal(state.momentum, torch.zeros(2))
    state = state.stepped(torch.tensor([0.25, 0.25]), cfg)  # round 1: still plain
    assert torch.equal(state.anchor, torch.tensor([0.25, 2.25])) and torch.equal(state.momentum, torch.zeros(2))
    state = state.stepped(torch.tensor([0.5, -0.5]), cfg)  # round 2: the first Nesterov step, from a zero buffer
    assert torch.allclose(state.momentum, torch.tensor([0.5, -0.5]))
    assert torch.allclose(state.anchor, torch.tensor([0.25 - 0.665, 2.25 + 0.665]))
    assert state.round == 3
    with pytest.raises(ValueError, match="warmup_rounds"):
        OuterOptSpec(warmup_rounds=-1).validate()


def test_heavy_ball_differs_from_nesterov():
    anchor, buf = torch.tensor([1.0]), torch.tensor([1.0])
    nesterov_step(anchor, buf, torch.tensor([1.0]), OuterOptSpec(lr=1.0, momentum=0.5, nesterov=False))
    # buf = 0.5 + 1 = 1.5; anchor = 1 - 1.5
    assert torch.allclose(anchor, torch.tensor([-0.5]))


def test_digest_changes_with_state_and_round():
    a = OuterState.fresh(torch.ones(4))
    b = OuterState.fresh(torch.ones(4))
    assert a.digest() == b.digest()
    b = OuterState(b.anchor, b.momentum, 1)
    assert a.digest() != b.digest()
    c = OuterState.fresh(torch.tensor([1.0, 1.0, 1.0, 1.0 + 1e-7]))
    assert a.digest() != c.digest()


def test_digest_is_pinned():
    # Peers compare digests: the bytes hashed (round as 8 little-endian bytes, then anchor and momentum as fp32)
    # must not change with how they are fed to sha256. Value computed with `.numpy().tobytes()`; full sha256 since
    # issue 17 (the first 16 characters are the 64-bit digest pinned before).
    FULL = "baa4c6459e26b0f09c83dcc89dbccb864606691259e0b05c0d680a61591a467d"
    anchor = torch.arange(10, dtype=torch.float32) / 7
    state = OuterState(anchor=anchor, momentum=-torch.arange(10, dtype=torch.float32) / 3, round=5)
    assert state.digest() == FULL
    strided = (torch.arange(20, dtype=torch.float32) / 14)[::2]
    assert not strided.is_contiguous()
    assert OuterState(anchor=strided, momentum=state.momentum, round=5).digest() == FULL
