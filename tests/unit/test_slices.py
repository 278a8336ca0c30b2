"""A module's round in slices (protocol/rounds/slices.py, node/train/round.py `make_slice_contributions` /
`settle_slices`, protocol/rounds/heal.py's parts): the cut, the unit ids peers send, the rotation, and that putting a
round's slices back together gives the module what one reducer's round would."""

import dataclasses

import pytest
import torch

from pathswarm.compression import ErrorFeedback
from pathswarm.node.train.round import (
    make_contribution,
    make_slice_contributions,
    restore_feedback,
    settle,
    settle_slices,
)
from pathswarm.protocol.rounds.heal import AppliedLog, AppliedPart, heal
from pathswarm.protocol.rounds.outer import OuterState
from pathswarm.protocol.rounds.rule import close_round, decode_mean, encode_mean
from pathswarm.protocol.rounds.slices import (
    SLICE_ALIGN,
    UnitNumels,
    UnitStates,
    agreed_list,
    parse_unit,
    rotated,
    slice_bounds,
    slice_count,
    unit_id,
    units_of,
    view,
)

from ..conftest import tiny_spec


def test_slices_cover_the_module_once_on_block_boundaries():
    numel = 10 * SLICE_ALIGN + 123
    for k in (1, 2, 3, 7, 11):
        bounds = slice_bounds(numel, k)
        assert len(bounds) == k and bounds[0][0] == 0 and bounds[-1][1] == numel
        assert all(hi == lo2 for (_, hi), (lo2, _) in zip(bounds, bounds[1:], strict=False))
        assert all(lo % SLICE_ALIGN == 0 and hi > lo for lo, hi in bounds)
        sizes = [hi - lo for lo, hi in bounds]
        assert max(sizes) - min(sizes) <= 2 * SLICE_ALIGN  # about equal
    with pytest.raises(ValueError):
        slice_bounds(numel, 12)  # more slices than blocks


def test_the_slice_count_follows_the_agreed_list_the_cap_and_the_size():
    agreed = ("a", "b", "c", "d", "e")
    numel = 100 * SLICE_ALIGN
    assert slice_count(numel, agreed, 1) == 1  # the spec's default: one reducer
    assert slice_count(numel, (), 16) == 1  # round 0: no list yet
    assert slice_count(numel, ("a",), 16) == 1
    assert slice_count(numel, agreed, 16) == 5  # one per member of the last round
    assert slice_count(numel, agreed, 3) == 3  # the spec's cap
    assert slice_count(2 * SLICE_ALIGN + 5, agreed, 16) == 2  # one per block


def test_unit_ids_round_trip_and_a_peer_cannot_name_a_slicing_the_spec_forbids():
    numels = {"shared": 8 * SLICE_ALIGN, "L0M0": SLICE_ALIGN}
    assert parse_unit("shared", numels, 4).k == 1
    unit = parse_unit(unit_id("shared", 2, 4), numels, 4)
    assert (unit.module, unit.j, unit.k, unit.lo, unit.hi) == ("shared", 2, 4, 4 * SLICE_ALIGN, 6 * SLICE_ALIGN)
    assert unit.id == "shared[2/4]"
    for bad in ("shared[4/4]", "shared[0/5]", "shared[01/4]", "shared[0/1]", "L0M0[0/2]", "other[0/2]",
                "shared[0/4", "shared[x/4]", "shared[]", "shared[0/4]x"):
        assert parse_unit(bad, numels, 4) is None, bad
    sizes = UnitNumels(numels, 4)
    assert "shared[3/4]" in sizes and sizes["shared[3/4]"] == 2 * SLICE_ALIGN and "shared[3/8]" not in sizes
    assert list(sizes) == ["shared", "L0M0"] and dict(sizes.items()) == numels  # iteration: the modules only
    with pytest.raises(KeyError):
        sizes["shared[9/4]"]


def test_the_slices_of_a_round_start_at_different_candidates_and_move_each_round():
    agreed = ("a", "b", "c", "d")
    for r in range(6):
        heads = [rotated(agreed, r, j)[0] for j in range(4)]
        assert sorted(heads) == list(agreed)  # every member reduces one slice
        assert heads != [rotated(agreed, r + 1, j)[0] for j in range(4)]  # and the load moves
    assert sorted(rotated(agreed, 3, 1)) == sorted(agreed)


def _state(numel, seed=0, round_=3, reducers=("a", "b", "c")):
    g = torch.Generator().manual_seed(seed)
    return OuterState(torch.randn(numel, generator=g), torch.randn(numel, generator=g) * 0.1, round_, reducers)


def test_a_slice_view_is_the_modules_part_and_its_digest_covers_only_that_part():
    st = _state(3 * SLICE_ALIGN)
    units = units_of("m", st.anchor.numel(), 3)
    views = [view(st, u) for u in units]
    assert torch.equal(torch.cat([v.anchor for v in views]), st.anchor)
    assert len({v.digest() for v in views}) == 3 and all(v.round == st.round for v in views)
    assert [v.reducers[0] for v in views] == [rotated(st.reducers, st.round, j)[0] for j in range(3)]
    other = OuterState(st.anchor.clone(), st.momentum.clone(), st.round)
    other.anchor[units[2].lo] += 1.0
    assert view(other, units[0]).digest() == views[0].digest() and view(other, units[2]).digest() != views[2].digest()
    # the exchange's state_of: one view per state, reused while the state is current
    held = {"m": st}
    states = UnitStates(held.get, UnitNumels({"m": st.anchor.numel()}, 4))
    assert states(units[1].id) is states(units[1].id) and states("m") is st and states("m[5/3]") is None
    held["m"] = other
    assert states(units[2].id).digest() == view(other, units[2]).digest()


def test_a_round_in_slices_gives_every_member_the_state_one_reducer_would_when_each_slice_mean_is_the_same(spec):
    """Nesterov is elementwise: the slices' steps put together are the whole module's step with the concatenated
    mean, bit for bit; the module moves to the next round naming the first slice's list."""
    numel = 4 * SLICE_ALIGN
    st = _state(numel, reducers=("a", "b", "c", "d"))
    units = units_of("m", numel, 4)
    mean = torch.randn(numel) * 1e-3
    local = st.anchor - 0.5
    whole = st.stepped(mean, spec.outer, reducers=("a", "b", "c", "d"))
    parts = []
    for u in units:
        piece = view(st, u)
        sent = make_contribution(piece, local[u.lo:u.hi], ErrorFeedback(), spec.codec, 10)
        parts.append(settle(piece, sent, local[u.lo:u.hi], "merged", st.round, encode_mean(mean[u.lo:u.hi],
                            spec.codec), "", spec.outer, codec=spec.codec, next_reducers=("a", "b", "c", "d"),
                            decoded=mean[u.lo:u.hi]))
    done = settle_slices(st, units, parts, local, 10).settlement
    assert done.applied and done.merged_tokens == 10 and done.carried_tokens == 0 and not done.diverged
    assert torch.equal(done.state.anchor, whole.anchor) and torch.equal(done.state.momentum, whole.momentum)
    assert done.state.round == st.round + 1 and done.state.reducers == ("a", "b", "c", "d")
    assert done.digest_after == whole.digest()


def test_a_failed_slice_leaves_its_part_and_its_steps_while_the_others_apply(spec):
    numel = 3 * SLICE_ALIGN
    st = _state(numel)
    units = units_of("m", numel, 3)
    local_sent = st.anchor - 0.3
    local_now = local_sent - 0.1  # inner steps taken since the send
    feedback = ErrorFeedback()
    sent = make_slice_contributions(st, local_sent, feedback, spec.codec, 40, units)
    mean = torch.full((numel,), 2e-3)
    parts = []
    for u, c, status in zip(units, sent, ("merged", "failed", "late"), strict=True):
        piece = view(st, u)
        parts.append(settle(piece, c, local_now[u.lo:u.hi], status, st.round,
                            encode_mean(mean[u.lo:u.hi], spec.codec), "", spec.outer, codec=spec.codec,
                            next_reducers=("b", "c", "a") if u.j == 0 else ("z",)))
    sliced = settle_slices(st, units, parts, local_now, 40)
    done = sliced.settlement
    f = units[1]
    assert done.applied and done.state.round == st.round + 1 and done.state.reducers == ("b", "c", "a")
    assert torch.equal(done.state.anchor[f.lo:f.hi], st.anchor[f.lo:f.hi])  # the failed slice did not move
    assert torch.equal(done.state.momentum[f.lo:f.hi], st.momentum[f.lo:f.hi])
    assert torch.equal(done.local[f.lo:f.hi], local_now[f.lo:f.hi])  # its steps stay in the weights
    assert not torch.equal(done.state.anchor[:f.lo], st.anchor[:f.lo])
    assert done.merged_tokens == 0 and done.carried_tokens == 40  # not every slice merged: the tokens carry
    assert "slices 1 of 3" in done.reason and [u.j for u in sliced.restore] == [1, 2]
    assert done.diverged  # the others may have applied slice 1: the node checks its state against the group's
    # nothing applied at all: the module stays at its round, every slice's steps carry
    failed = [settle(view(st, u), c, local_now[u.lo:u.hi], "failed", st.round, b"", "", spec.outer,
                     codec=spec.codec) for u, c in zip(units, sent, strict=True)]
    none = settle_slices(st, units, failed, local_now, 40).settlement
    assert not none.applied and none.state is None and none.carried_tokens == 40


def test_slice_frames_carry_the_slices_of_the_outer_gradient_and_their_error_feedback(spec):
    numel = 3 * SLICE_ALIGN
    st = _state(numel)
    units = units_of("m", numel, 3)
    local = st.anchor - torch.randn(numel, generator=torch.Generator().manual_seed(5)) * 0.01
    feedback = ErrorFeedback()
    sent = make_slice_contributions(st, local, feedback, spec.codec, 7, units)
    delta = st.anchor - local
    decoded = torch.cat([spec.codec.contribution_codec().decode(c.frame, max_elements=u.numel).reshape(-1)
                         for u, c in zip(units, sent, strict=True)])
    assert float((decoded - delta).abs().max()) < 1e-3 * float(delta.abs().max()) * 10
    assert [c.digest_before for c in sent] == [view(st, u).digest() for u in units]
    assert all(c.tokens == 7 and c.round == st.round for c in sent)
    if spec.codec.error_feedback:
        assert torch.allclose(feedback.residual, delta - decoded, atol=1e-7)
        before = feedback.residual.clone()
        again = make_slice_contributions(st, local, feedback, spec.codec, 7, units)
        restore_feedback(feedback, units, again, [units[1]])  # slice 1's frame was not used: its residual is back
        u = units[1]
        assert torch.equal(feedback.residual[u.lo:u.hi], before[u.lo:u.hi])
        assert not torch.equal(feedback.residual[:u.lo], before[:u.lo])


def test_a_slices_reducer_and_its_members_reach_the_same_digest(spec):
    """The reducer closes a slice on its view of the state (rule.py `close_round`, before=view); every member's
    settle on its own view must reach the digest the result names."""
    numel = 2 * SLICE_ALIGN
    st = _state(numel, reducers=("a", "b"))
    unit = units_of("m", numel, 2)[1]
    piece = view(st, unit)
    locals_ = [st.anchor - 0.01 * (i + 1) for i in range(2)]
    sent = [make_slice_contributions(st, loc, ErrorFeedback(), spec.codec, 5, units_of("m", numel, 2))[1]
            for loc in locals_]
    closed = close_round([(p, 5, c.frame) for p, c in zip("ab", sent, strict=True)], unit.numel, spec, before=piece)
    done = settle(piece, sent[0], locals_[0][unit.lo:unit.hi], "merged", st.round, closed.mean_frame,
                  closed.digest_after, spec.outer, codec=spec.codec, next_reducers=("a", "b"))
    assert done.applied and not done.diverged and done.digest_after == closed.digest_after


def test_healing_undoes_a_liars_slice_and_the_others_of_its_rounds(spec):
    numel = 3 * SLICE_ALIGN
    start = _state(numel, round_=5)
    units = units_of("m", numel, 3)
    log, st = AppliedLog(), start
    for r, reducers in enumerate([("a", "liar", "c"), ("c", "a", "liar")]):
        mean = torch.randn(numel, generator=torch.Generator().manual_seed(r)) * 1e-3
        anchor, momentum = st.anchor.clone(), st.momentum.clone()
        parts = []
        for u, reducer in zip(units, reducers, strict=True):
            if r == 1 and u.j == 0:
                continue  # this slice failed: not stepped
            frame = encode_mean(mean[u.lo:u.hi], spec.codec)
            after = view(st, u).stepped(decode_mean(frame, u.numel, spec.codec), spec.outer)
            anchor[u.lo:u.hi], momentum[u.lo:u.hi] = after.anchor, after.momentum
            parts.append(AppliedPart(u.lo, u.hi, reducer, frame))
        st = OuterState(anchor, momentum, st.round + 1, ("a", "c"))
        log.applied("m", st.round - 1, parts[0].reducer, parts[0].mean_frame, st.digest(), parts=tuple(parts))
    healed = heal(st, log.rounds("m"), "liar", 5, spec.outer, spec.codec)
    assert healed is not None and len(healed.undone) == 2 and healed.state.round == st.round + 1
    assert torch.allclose(healed.state.anchor, start.anchor, atol=1e-6)
    assert torch.allclose(healed.state.momentum, start.momentum, atol=1e-6)
    assert heal(st, log.rounds("m"), "nobody", 5, spec.outer, spec.codec) is None


def test_the_simulator_runs_the_round_in_slices_and_learns_as_with_one_reducer():
    """The one round rule, sliced: a 4-worker DiLoCo run with rounds in slices ends within 1 % of the loss of one
    reducer per round, its replicas identical, and its state history differs (the slices were merged on their own:
    each slice's robust mean and its own int8 blocks)."""
    from pathswarm.node.train.simulate import SimConfig, run_simulation

    base = tiny_spec(width=64, base_width=64)
    runs = {}
    for k in (1, 4):
        spec = base.replace(averaging=dataclasses.replace(base.averaging, slices=k))
        runs[k] = run_simulation(spec, SimConfig(mode="diloco", workers=4, rounds=4))
    one, sliced = runs[1], runs[4]
    assert sliced.val_loss_after["all"] < 0.97 * sliced.val_loss_before["all"]  # it learns
    assert abs(sliced.val_loss_after["all"] - one.val_loss_after["all"]) <= 0.01 * one.val_loss_after["all"]
    assert sliced.replicas_identical and one.replicas_identical
    assert sliced.history["shared"] != one.history["shared"]
    # the same bytes, give or take the slices' frame headers: slicing moves the load, it does not add to it
    assert abs(sliced.bytes_up_total - one.bytes_up_total) <= 0.02 * one.bytes_up_total


def test_the_list_a_slice_result_names_is_its_members_sorted_without_clients():
    from pathswarm.protocol.rounds.reducers import next_candidates

    used = ("c", "a", "me", "b")
    assert next_candidates("me", used, clients=()) == ("me", "a", "b", "c")  # one reducer: itself first (rule 1)
    assert next_candidates("me", used, clients=("b",), sliced=True) == ("a", "c", "me")  # every slice: the same list
    assert next_candidates("me", ("me",), clients=("me",), sliced=True) == ("me",)  # clients only: still someone
    assert next_candidates("me", ("me",), clients=(), partners=("a", "me")) == ("a", "me")  # alone: the partners


def test_round_0_takes_the_genesis_list_rotated_per_slice_and_a_named_list_wins():
    """Before any result names a list, every member, each slice's reducer and a candidate asked its stance derive one
    order from the holders in the claims: slice j starts at its j-th holder (round 0), a whole module at the head."""
    genesis = {"M": ("a", "b", "c")}
    fresh = OuterState.fresh(torch.zeros(8))
    assert agreed_list(fresh, "M", genesis) == ("a", "b", "c")
    assert agreed_list(fresh, "M[0/3]", genesis) == ("a", "b", "c")
    assert agreed_list(fresh, "M[2/3]", genesis) == ("c", "a", "b")
    assert agreed_list(fresh, "N[1/2]", genesis) == ()  # a module nobody claims: no candidates
    named = fresh.with_reducers(("x", "y"))
    assert agreed_list(named, "M[1/3]", genesis) == ("x", "y")  # the state's list (a slice's view: already rotated)
