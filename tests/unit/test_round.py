"""The round rule (node/train/round.py) by value: contribution, close, and every settle case.

What is applied (the anchor after one outer Nesterov step on the decoded mean), what the local weights become,
what is carried (tokens, error-feedback residual), and what the digest is.
"""

import pytest
import torch

from pathswarm.compression import ErrorFeedback, decode, encode
from pathswarm.node.train.round import make_contribution, settle
from pathswarm.protocol.rounds.merge import weighted_average
from pathswarm.protocol.rounds.outer import OuterState, nesterov_step
from pathswarm.protocol.rounds.rule import RoundError, close_round, decode_mean
from pathswarm.protocol.spec import AveragingSpec, SwarmSpec

NUMEL = 4096
SPEC = SwarmSpec(averaging=AveragingSpec(min_group=64, grace_s=0.5))


def state(seed: int = 0, round_: int = 3) -> OuterState:
    g = torch.Generator().manual_seed(seed)
    return OuterState(torch.randn(NUMEL, generator=g), torch.randn(NUMEL, generator=g) * 1e-3, round_)


def drift(st: OuterState, seed: int, scale: float = 1e-2) -> torch.Tensor:
    """Local weights after some inner steps: the anchor plus a random move."""
    return st.anchor + torch.randn(NUMEL, generator=torch.Generator().manual_seed(seed)) * scale


def copy(st: OuterState) -> OuterState:
    return OuterState(st.anchor.clone(), st.momentum.clone(), st.round)


def by_hand(st: OuterState, mean: torch.Tensor) -> OuterState:
    out = copy(st)
    nesterov_step(out.anchor, out.momentum, mean, SPEC.outer, st.round)  # plain averaging in warm-up rounds
    return OuterState(out.anchor, out.momentum, st.round + 1)


def test_a_contribution_is_the_encoded_outer_gradient_and_remembers_what_settling_needs():
    st, fb = state(), ErrorFeedback()
    local = drift(st, 1)
    c = make_contribution(st, local, fb, SPEC.codec, tokens=640)
    delta = st.anchor - local
    got = decode(c.frame)
    assert torch.linalg.vector_norm(got - delta) / torch.linalg.vector_norm(delta) < 0.015  # codec's target 1.3 %
    assert torch.equal(fb.residual, delta - got)  # error feedback keeps exactly what the frame left out
    assert c.feedback_before == {} and (c.tokens, c.round, c.digest_before) == (640, 3, st.digest())
    at_send = local.clone()
    local.add_(1.0)  # the caller trains on: the contribution keeps the weights as they were at the send
    assert torch.equal(c.local_when_sent, at_send)
    with pytest.raises(ValueError, match="positive token count"):
        make_contribution(st, local, fb, SPEC.codec, tokens=0)


def test_a_self_reported_token_count_weighs_at_most_max_weight():
    from pathswarm.protocol.rounds.merge import max_weight

    st, cap = state(), max_weight(SPEC)
    assert cap == SPEC.inner.steps * SPEC.inner.batch_size * SPEC.model.context_len * 4
    deltas = [st.anchor - drift(st, s) for s in (1, 2)]
    greedy = close_round([("a", 2**52, encode(deltas[0])), ("b", cap, encode(deltas[1]))], NUMEL, SPEC)
    fair = close_round([("a", cap, encode(deltas[0])), ("b", cap, encode(deltas[1]))], NUMEL, SPEC)
    assert greedy.mean_frame == fair.mean_frame  # claiming 2^52 tokens buys no more weight than the cap
    assert greedy.tokens == 2**52 + cap  # accounting still counts what was claimed as trained


def test_close_round_is_one_canonical_encoded_mean_whatever_the_arrival_order():
    st = state()
    deltas = [st.anchor - drift(st, s) for s in (1, 2, 3)]
    contributions = [("peer-b", 100, encode(deltas[0])), ("peer-a", 300, encode(deltas[1])),
                     ("peer-c", 200, encode(deltas[2]))]
    closed = close_round(contributions, NUMEL, SPEC, before=st)
    again = close_round(list(reversed(contributions)), NUMEL, SPEC, before=st)
    assert closed.mean_frame == again.mean_frame and closed.used == ("peer-a", "peer-b", "peer-c")
    assert closed.tokens == 600 and closed.rejected == ()
    # the mean of the decoded contributions, in sorted peer order (CenteredClip of honest peers: the plain mean)
    decoded = [decode(f) for _, _, f in sorted(contributions)]
    exact = weighted_average(decoded, [300, 100, 200])
    mean = decode(closed.mean_frame)
    assert torch.linalg.vector_norm(mean - exact) / torch.linalg.vector_norm(exact) < 0.015
    # the digest after is the state after one outer step on the decoded bytes; `before` is not touched
    assert closed.digest_after == by_hand(st, mean).digest() and st.round == 3


def test_close_round_screens_out_bad_frames_and_fails_when_none_is_left():
    st = state()
    good = encode(st.anchor - drift(st, 1))
    closed = close_round([("a", 10, good), ("b", 10, b"garbage"), ("c", 10, encode(torch.zeros(7)))], NUMEL, SPEC)
    assert closed.used == ("a",) and [p for p, _ in closed.rejected] == ["b", "c"]
    assert closed.digest_after == "" and closed.after is None  # no state given: no digest
    nothing = close_round([("b", 10, b"garbage")], NUMEL, SPEC, before=st)
    assert nothing.mean_frame == b"" and nothing.used == () and nothing.digest_after == ""


def settle_case(status: str, overlap: bool, **kw):
    """One member, one round: sent at `st`, inner steps since (overlap), the group's mean of it and a peer's.
    Returns the state after the round (the one before when nothing was applied) as `st`."""
    st, fb = state(), ErrorFeedback()
    sent = make_contribution(st, drift(st, 1), fb, SPEC.codec, tokens=500)
    peer = encode(st.anchor - drift(st, 2))
    closed = close_round([("me", 500, sent.frame), ("peer", 500, peer)], NUMEL, SPEC, before=st)
    local_now = sent.local_when_sent + (drift(st, 3, 1e-3) - st.anchor if overlap else 0.0)
    before = copy(st)
    done = settle(st, sent, local_now, status, kw.pop("result_round", 3), kw.pop("frame", closed.mean_frame),
                  kw.pop("expected", closed.digest_after), SPEC.outer, codec=SPEC.codec, **kw)
    assert torch.equal(st.anchor, before.anchor) and st.round == before.round  # settle leaves its input as it was
    return before, done.state or st, sent, closed, local_now, done


@pytest.mark.parametrize("status", ["merged", "alone"])
def test_merged_applies_the_mean_and_keeps_only_the_steps_since_the_send(status):
    before, st, sent, closed, local_now, done = settle_case(status, overlap=True)
    assert done.applied and not done.diverged and not done.restore_feedback
    assert st.digest() == by_hand(before, decode(closed.mean_frame)).digest() == done.digest_after
    assert done.digest_after == closed.digest_after
    assert torch.equal(done.local, st.anchor + (local_now - sent.local_when_sent))
    assert (done.merged_tokens, done.carried_tokens, done.discarded_tokens) == (500, 0, 0)


def test_merged_without_overlap_restarts_from_the_new_anchor_exactly():
    _, st, _, _, _, done = settle_case("merged", overlap=False)
    assert torch.equal(done.local, st.anchor)  # plain DiLoCo: what the simulator runs


def test_late_applies_the_mean_and_carries_our_outer_gradient():
    before, st, _, closed, local_now, done = settle_case("late", overlap=True)
    assert done.applied and st.digest() == closed.digest_after == done.digest_after
    assert torch.equal(done.local, st.anchor + (local_now - before.anchor))  # all our steps stay on top
    assert done.restore_feedback and (done.merged_tokens, done.carried_tokens) == (0, 500)


@pytest.mark.parametrize("status", ["failed", "out_of_sync", "behind"])
def test_a_round_without_a_mean_applies_nothing_and_carries_everything(status):
    before, st, _, _, _, done = settle_case(status, overlap=True, frame=b"")
    assert not done.applied and done.local is None and st.digest() == before.digest() and done.digest_after == ""
    assert done.restore_feedback and (done.merged_tokens, done.carried_tokens, done.discarded_tokens) == (0, 500, 0)


def test_a_failed_round_of_the_synchronous_baseline_discards_our_steps():
    before, st, _, _, _, done = settle_case("failed", overlap=True, frame=b"", discard=True)
    assert not done.applied and st.digest() == before.digest() and torch.equal(done.local, before.anchor)
    assert (done.carried_tokens, done.discarded_tokens) == (0, 500)


def test_a_mean_that_does_not_decode_or_is_for_another_round_is_a_failed_round():
    before, st, _, _, _, done = settle_case("merged", overlap=True, frame=b"\x00" * 64)
    assert not done.applied and st.digest() == before.digest() and done.carried_tokens == 500
    assert "bad mean" in done.reason
    before, st, _, _, _, done = settle_case("late", overlap=True, result_round=2)
    assert not done.applied and st.digest() == before.digest() and "round 2" in done.reason
    with pytest.raises(RoundError, match="values, the module"):
        decode_mean(encode(torch.zeros(NUMEL - 1)), NUMEL, SPEC.codec)


def test_a_digest_other_than_the_reducers_marks_the_replica_diverged():
    _, st, _, _, _, done = settle_case("merged", overlap=False, expected="0" * 16)
    assert done.applied and done.diverged and done.digest_after == st.digest()


def test_every_member_of_a_group_ends_bit_identical_to_the_reducers_digest():
    st = state()
    members = {name: (copy(st), ErrorFeedback(), drift(st, seed)) for seed, name in enumerate(("a", "b", "c"), 1)}
    sent = {n: make_contribution(s, local, fb, SPEC.codec, 100 * (i + 1))
            for i, (n, (s, fb, local)) in enumerate(members.items())}
    closed = close_round([(n, c.tokens, c.frame) for n, c in sent.items() if n != "c"], NUMEL, SPEC, before=st)
    digests = set()
    for n, (s, _, local) in members.items():
        status = "merged" if n in closed.used else "late"
        done = settle(s, sent[n], local, status, 3, closed.mean_frame, closed.digest_after, SPEC.outer,
                      codec=SPEC.codec)
        assert not done.diverged
        digests.add(done.state.digest())
    assert digests == {closed.digest_after}


def test_a_mean_beyond_the_members_bound_is_not_applied_and_is_a_proven_lie():
    """Bounded damage (docs/SECURITY.md): an honest round's mean is applied under the bound its member derives alone;
    the same mean scaled up (the applied lie that once set anchors to ~3e4) is refused, nothing applied, our steps
    carried, and the settlement names the lie."""
    from pathswarm.protocol.rounds.rule import MEAN_BOUND, mean_bound

    st = state(round_=8)
    sent = make_contribution(st, drift(st, 1), ErrorFeedback(), SPEC.codec, tokens=500)
    bound = mean_bound(sent.delta_norm, 10**9, float(st.momentum.norm()), SPEC)
    assert bound == pytest.approx(MEAN_BOUND * sent.delta_norm, rel=1e-6)  # our Δ is larger than the momentum here
    _, st_ok, _, closed, _, done = settle_case("merged", overlap=True, bound=bound)
    assert done.applied and not done.lie and st_ok.digest() == closed.digest_after
    huge = encode(decode(closed.mean_frame) * 3e4)
    before, st_lie, _, _, _, done = settle_case("merged", overlap=True, frame=huge, bound=bound)
    assert not done.applied and st_lie.digest() == before.digest() and done.local is None
    assert done.lie and "most an honest round sends" in done.lie and done.carried_tokens == 500
    assert done.restore_feedback  # our Δ goes out again with the next round
    # Just inside the bound is applied: the bound is a norm, the same for every direction.
    inside = decode(closed.mean_frame)
    inside = encode(inside * (0.99 * bound / float(inside.norm())))
    assert settle_case("merged", overlap=True, frame=inside, bound=bound, expected="")[-1].applied


def test_the_bound_follows_the_screens_a_short_chunk_and_the_momentum():
    import math

    from pathswarm.protocol.rounds.rule import MEAN_BOUND, mean_bound

    per_round = SPEC.inner.steps * SPEC.inner.batch_size * SPEC.model.context_len
    assert mean_bound(2.0, per_round, 0.0, SPEC) == MEAN_BOUND * 2.0
    assert mean_bound(2.0, per_round // 4, 0.0, SPEC) == MEAN_BOUND * 8.0  # a quarter round's Δ: scaled to a round's
    assert mean_bound(2.0, per_round, 5.0, SPEC) == MEAN_BOUND * 5.0  # the replicated momentum is a floor
    plain = SPEC.replace(averaging=AveragingSpec(clip_factor=0.0, norm_bound=10.0))
    assert mean_bound(2.0, per_round, 0.0, plain) == 10.0 * 2.0  # a plain mean reaches the screen's bound
    assert mean_bound(2.0, per_round, 0.0, SPEC.replace(averaging=AveragingSpec(norm_bound=0.0))) == math.inf
    # a group of 1 or 2 is only clipped to norm_bound × the momentum's norm, and not at all before there is one
    assert mean_bound(2.0, per_round, 0.0, SPEC, group=2) == math.inf
    assert mean_bound(2.0, per_round, 1.0, SPEC, group=2) == SPEC.averaging.norm_bound * 1.0
    assert mean_bound(20.0, per_round, 1.0, SPEC, group=1) == MEAN_BOUND * 20.0


def test_a_mean_pointing_away_from_our_outer_gradient_is_suspicious():
    from pathswarm.protocol.rounds.rule import suspicious

    ours = torch.randn(NUMEL, generator=torch.Generator().manual_seed(5))
    others = torch.randn(NUMEL, generator=torch.Generator().manual_seed(6))
    honest = (ours + 2 * others) / 3  # ours in the mean with a third of the weight, the others' unrelated
    assert not suspicious(honest, ours) and suspicious(-honest, ours)
    assert not suspicious(torch.zeros(NUMEL), ours)  # nothing to compare
