"""Undoing a proven liar's applied rounds (protocol/rounds/heal.py) by value: the inverse outer step, the state
healed back to before the liar's first kept round, every replica healing to the same bits, and what is not healed."""

import pytest
import torch

from pathswarm.compression import encode
from pathswarm.protocol.rounds.heal import AppliedLog, heal, unstep
from pathswarm.protocol.rounds.outer import OuterState
from pathswarm.protocol.rounds.rule import decode_mean
from pathswarm.protocol.spec import OuterOptSpec, SwarmSpec

SPEC = SwarmSpec()
NUMEL = 2048


def mean(seed: int, scale: float = 1e-2) -> torch.Tensor:
    return torch.randn(NUMEL, generator=torch.Generator().manual_seed(seed)) * scale


def start(round_: int = 0) -> OuterState:
    g = torch.Generator().manual_seed(99)
    return OuterState(torch.randn(NUMEL, generator=g), torch.randn(NUMEL, generator=g) * 1e-2, round_, ("r1", "r2"))


@pytest.mark.parametrize("outer", [SPEC.outer, OuterOptSpec(nesterov=False), OuterOptSpec(warmup_rounds=0)])
def test_unstep_inverts_every_kind_of_outer_step(outer):
    for round_ in (0, outer.warmup_rounds, outer.warmup_rounds + 3):
        before = start(round_)
        after = before.stepped(mean(1), outer)
        anchor, momentum = unstep(after, mean(1), round_, outer)
        assert torch.allclose(anchor, before.anchor, atol=1e-6) and torch.allclose(momentum, before.momentum, atol=1e-6)


def test_without_momentum_the_buffer_before_is_irrelevant_and_zero():
    outer = OuterOptSpec(momentum=0.0, warmup_rounds=0)
    before = start(3)
    after = before.stepped(mean(1), outer)
    anchor, momentum = unstep(after, mean(1), 3, outer)
    assert torch.allclose(anchor, before.anchor, atol=1e-6) and not momentum.any()
    # what comes next does not depend on the buffer before: the same step from either
    again = OuterState(anchor, momentum, 3).stepped(mean(1), outer)
    assert torch.allclose(again.anchor, after.anchor, atol=1e-6) and torch.equal(again.momentum, after.momentum)


def applied_run(liar_rounds: set[int], n: int = 12, liar: str = "L"):
    """A module's rounds 0..n-1 applied from means sent as bytes; the liar reduced `liar_rounds` with a large mean.
    Returns the states after each round (states[r]: before round r) and the log."""
    st, log, states = start(), AppliedLog(), []
    for r in range(n):
        states.append(st)
        reducer = liar if r in liar_rounds else "h"
        frame = encode(mean(r) * (30.0 if r in liar_rounds else 1.0))
        st = st.stepped(decode_mean(frame, NUMEL, SPEC.codec), SPEC.outer, reducers=(reducer, "h"))
        log.applied("m", r, reducer, frame, st.digest())
    return st, log, states


def test_heal_undoes_the_rounds_from_the_proven_lie_on_back_to_the_state_before_it():
    st, log, states = applied_run({5, 7, 8})  # the liar reduced rounds 5, 7, 8; the audit proved the lie of 7
    healed = heal(st, log.rounds("m"), "L", 7, SPEC.outer, SPEC.codec)
    assert healed is not None and [a.round for a in healed.undone] == [7, 8, 9, 10, 11]
    good = states[7]  # the state before the proven lie (round 5, unproven, stays)
    assert torch.allclose(healed.state.anchor, good.anchor, atol=1e-5)
    assert torch.allclose(healed.state.momentum, good.momentum, atol=1e-5)
    # the heal counts as a round, and who reduces the next one is kept
    assert healed.state.round == st.round + 1 == 13 and healed.state.reducers == st.reducers
    # every replica that applied the same rounds heals to the same bits
    st2, log2, _ = applied_run({5, 7, 8})
    again = heal(st2, log2.rounds("m"), "L", 7, SPEC.outer, SPEC.codec)
    assert again is not None and again.state.digest() == healed.state.digest()
    # the lie was large: undone, the anchor is far from the lied one and back where honest training had it
    assert float((st.anchor - good.anchor).norm()) > 100 * float((healed.state.anchor - good.anchor).norm())


def test_nothing_is_undone_without_the_proven_round_kept_a_liars_round_from_it_or_a_log_leading_to_the_state():
    st, log, _ = applied_run({1}, n=12)  # its round fell out of the kept window (HEAL_ROUNDS = 8)
    assert [a.round for a in log.rounds("m")] == list(range(4, 12))
    assert heal(st, log.rounds("m"), "L", 1, SPEC.outer, SPEC.codec) is None
    st, log, _ = applied_run({6})
    assert heal(st, log.rounds("m"), "L", 7, SPEC.outer, SPEC.codec) is None  # honest from the proven round on
    assert heal(st, log.rounds("m"), "someone else", 6, SPEC.outer, SPEC.codec) is None
    replaced = OuterState(st.anchor + 1, st.momentum, st.round, st.reducers)  # a re-sync replaced the state
    assert heal(replaced, log.rounds("m"), "L", 6, SPEC.outer, SPEC.codec) is None


def test_the_log_keeps_a_chain_of_consecutive_rounds_and_forgets_it_after_a_heal():
    log = AppliedLog(keep=3)
    for r in range(5):
        log.applied("m", r, "h", b"x", f"d{r}")
    assert [a.round for a in log.rounds("m")] == [2, 3, 4]
    log.applied("m", 9, "h", b"x", "d9")  # not the round after 4: a re-sync in between
    assert [a.round for a in log.rounds("m")] == [9]
    log.healed("m")
    assert log.rounds("m") == []
