"""Robust aggregation of a module group's outer gradients (protocol/rounds/merge.py) and the reducer's
handling of bad contributors (protocol/rounds/, offline): exact values, no network."""

import asyncio

import torch

from pathswarm.compression import decode, encode
from pathswarm.protocol.rounds.merge import centered_clip, merge, weighted_average

from .test_exchange import NUMEL, make_exchange

RULE = dict(norm_bound=10.0, clip_factor=2.0, clip_iterations=10)


def honest(n: int, seed: int = 0, spread: float = 0.3) -> list[torch.Tensor]:
    """n correlated outer gradients: a common direction plus individual noise (as workers' Δs are)."""
    gen = torch.Generator().manual_seed(seed)
    common = torch.randn(NUMEL, generator=gen) * 1e-3
    return [common + spread * torch.randn(NUMEL, generator=gen) * 1e-3 for _ in range(n)]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b))


def test_honest_groups_get_their_token_weighted_mean():
    xs, tokens = honest(4), [100, 200, 300, 400]
    assert rel(centered_clip(xs, tokens, 2.0, 10), weighted_average(xs, tokens)) < 1e-6
    # two contributions have no robust centre: exactly the plain mean
    assert torch.equal(centered_clip(xs[:2], tokens[:2], 2.0, 10), weighted_average(xs[:2], tokens[:2]))
    assert torch.equal(centered_clip(xs, tokens, 0.0, 10), weighted_average(xs, tokens))


def test_one_sign_flipped_or_noisy_peer_of_four_barely_moves_the_result():
    xs = honest(3)
    target = weighted_average(xs, [1, 1, 1])
    for bad in (-3 * xs[0], torch.randn(NUMEL, generator=torch.Generator().manual_seed(9)) * 3e-3):
        plain = weighted_average([*xs, bad], [1, 1, 1, 1])
        robust = centered_clip([*xs, bad], [1, 1, 1, 1], 2.0, 10)
        assert rel(robust, target) < 0.25 * rel(plain, target), (rel(robust, target), rel(plain, target))


def test_merge_screens_scaled_wrong_size_and_garbage_frames():
    xs = honest(4)
    frames = [encode(x) for x in xs]
    honest_mean = weighted_average([decode(f) for f in frames[:3]], [10, 10, 10])
    cases = {"scaled x100": encode(xs[3] * 100), "wrong size": encode(torch.zeros(NUMEL - 1)),
             "too large": encode(torch.zeros(NUMEL + 1)), "garbage": b"\0" * 64}
    reasons = {}
    for name, bad in cases.items():
        m = merge([("p0", 10, frames[0]), ("p1", 10, frames[1]), ("p2", 10, frames[2]), ("zz", 10, bad)], NUMEL,
                  **RULE)
        assert m.used == ["p0", "p1", "p2"] and m.tokens == 30, name
        assert [p for p, _ in m.rejected] == ["zz"], name
        assert rel(m.mean, honest_mean) < 1e-6, name
        reasons[name] = m.rejected[0][1]
    assert "median" in reasons["scaled x100"] and "wrong size" in reasons["wrong size"]
    assert reasons["garbage"].startswith("undecodable") and "max_elements" in reasons["too large"]
    everyone_bad = merge([("p0", 10, b"junk")], NUMEL, **RULE)
    assert everyone_bad.mean is None and everyone_bad.used == []


def test_non_finite_values_are_rejected():
    from pathswarm.protocol.rounds.merge import screen

    xs = honest(3)
    reasons = screen([xs[0], xs[1], torch.full((NUMEL,), float("nan")), xs[2]], 10.0)
    assert reasons == [None, None, "NaN or Inf values", None]


def test_all_zero_contributions_do_not_set_the_median_a_norm_is_screened_against():
    """A round in slices: most members' part of an embedding slice may be all zeros (bytes their documents never
    held); the one member that trained those rows is not rejected for a norm far above the median of zeros."""
    from pathswarm.protocol.rounds.merge import screen

    xs = honest(4)
    zero = torch.zeros(NUMEL)
    assert screen([zero, zero, zero, xs[0]], 10.0) == [None] * 4
    # with three non-zero ones, the screen still holds against an outlier among them
    assert screen([zero, xs[0], xs[1], xs[2], 100 * xs[3]], 10.0)[4].startswith("norm ")


def test_merge_is_deterministic_to_the_bit():
    xs = honest(5, seed=3) + [-4 * honest(1, seed=4)[0]]
    contributions = [(f"p{i}", 10 + i, encode(x)) for i, x in enumerate(xs)]
    a, b = merge(contributions, NUMEL, **RULE), merge(contributions, NUMEL, **RULE)
    assert torch.equal(a.mean, b.mean) and a.used == b.used


def test_the_reducer_logs_rejections_and_ignores_a_repeated_offender(caplog):
    async def go():
        ex, _ = make_exchange(expected=4)
        xs = honest(3)
        statuses, results = [], []
        for _ in range(4):  # four rounds; the bad peer sends a x1000 outer gradient in each
            st = ex.effective_state("L0M0")
            results = await asyncio.gather(*(ex.reduce("L0M0", st.round, f"p{i}", 10, st.digest(), encode(x))
                                             for i, x in enumerate(xs)),
                                           ex.reduce("L0M0", st.round, "bad", 10, st.digest(), encode(xs[0] * 1000)))
            statuses.append([r.status for r in results])
        return ex, statuses, results

    ex, statuses, last = asyncio.run(go())
    assert statuses[0] == ["merged", "merged", "merged", "late"]  # rejected, but it still gets the mean
    assert all(list(r.contributors) == ["p0", "p1", "p2"] for r in last[:3])
    assert ex.trust.offenses["bad"] == 3
    assert statuses[3][3] == "failed" and last[3].reason.startswith("ignored: 3 contributions")
    assert "rejected peer bad's outer gradient for L0M0 round 0: norm" in caplog.text
    assert "ignoring it from now on" in caplog.text


def test_groups_of_one_or_two_are_bounded_by_the_modules_history():
    """Issue 17: a group of 2 took a 1e30 outer gradient unscreened. The round rule (node/train/round.py) now clips
    each contribution of a small group to norm_bound × the norm of the module's outer momentum (clipped, not
    rejected: a rejected honest contribution would be carried, larger, into the next round, again and again)."""
    from pathswarm.protocol.rounds.merge import merge
    from pathswarm.protocol.rounds.outer import OuterState
    from pathswarm.protocol.rounds.rule import close_round
    from pathswarm.protocol.spec import AveragingSpec, OuterOptSpec, SwarmSpec

    spec = SwarmSpec(averaging=AveragingSpec(norm_bound=10.0), outer=OuterOptSpec(warmup_rounds=0))
    xs = honest(3)
    before = OuterState(torch.zeros(NUMEL), xs[2] * 3, round=5)  # momentum: the sum of earlier rounds
    bound = 10 * float(torch.linalg.vector_norm(before.momentum))
    for scale in (1e30, 100.0):
        closed = close_round([("p0", 10, encode(xs[0])), ("zz", 10, encode(xs[1] * scale))], NUMEL, spec, before)
        assert closed.used == ("p0", "zz") and closed.rejected == ()
        mean = decode(closed.mean_frame)
        assert float(torch.linalg.vector_norm(mean)) <= 1.02 * (float(torch.linalg.vector_norm(xs[0])) + bound) / 2
    alone = close_round([("zz", 10, encode(xs[1] * 1e30))], NUMEL, spec, before)  # a group of one too
    assert float(torch.linalg.vector_norm(decode(alone.mean_frame))) <= 1.02 * bound
    merged = merge([("p0", 10, encode(xs[0])), ("p1", 10, encode(xs[1] * 3))], NUMEL, norm_bound=10.0,
                   clip_factor=2.0, clip_iterations=10, reference=bound / 10)
    assert merged.clipped == [] and float(torch.linalg.vector_norm(xs[1] * 3)) < bound  # honest: untouched
    pair = close_round([("p0", 10, encode(xs[0])), ("p1", 10, encode(xs[1] * 3))], NUMEL, spec, before)
    plain = weighted_average([decode(encode(xs[0])), decode(encode(xs[1] * 3))], [10, 10])
    assert rel(decode(pair.mean_frame), plain) < 0.02
    # No history (before any Nesterov round, or a reducer without the state): only the first three checks apply.
    fresh = OuterState(torch.zeros(NUMEL), torch.zeros(NUMEL), round=0)
    big = close_round([("p0", 10, encode(xs[0])), ("zz", 10, encode(xs[1] * 100))], NUMEL, spec, fresh)
    assert float(torch.linalg.vector_norm(decode(big.mean_frame))) > 40 * float(torch.linalg.vector_norm(xs[0]))
