"""One hostile worker of four, in the simulator (the node's worker, codec and group merge): with the
robust rule the honest replicas end where a clean run with the same seed ends; with the plain mean a
100×-scaled outer gradient wrecks them (the control showing the attack bites)."""

import pytest

from pathswarm.node.train.simulate import SimConfig, run_simulation
from pathswarm.protocol.spec import AveragingSpec, InnerOptSpec, OuterOptSpec

from ..attacks import KINDS, attacker
from ..conftest import tiny_spec

H = 10
CFG = SimConfig(mode="diloco", workers=4, rounds=5, inner_steps=H, eval_batches=4, seed=0)


@pytest.fixture(scope="module")
def runs(synthetic_docs):
    # The outer Nesterov step from round 0 (no plain-averaging warm-up): the bound below was set on it. In plain
    # averaging rounds (lr 1) the attacks that pass the screen by design (sign flip and noise of a bounded norm)
    # cost more: 2.8 % on this run with the default warmup_rounds (issue 17 takes bounded attacks on).
    robust = tiny_spec().replace(inner=InnerOptSpec(steps=H, batch_size=4, warmup_steps=2),
                                 outer=OuterOptSpec(warmup_rounds=0))
    plain = robust.replace(averaging=AveragingSpec(norm_bound=0.0, clip_factor=0.0))

    def final(spec, attack, cfg=CFG):
        result = run_simulation(spec, cfg, synthetic_docs, tamper=attacker(attack, 3) if attack else None)
        return result.val_loss_after[result.paths[0]], result.rejected, result.replicas_identical

    three = SimConfig(mode="diloco", workers=3, rounds=CFG.rounds, inner_steps=H, eval_batches=4, seed=0)
    return {"clean": final(robust, ""), "cycle": final(robust, "cycle"), "scaled": final(robust, "scaled"),
            "plain scaled": final(plain, "scaled"), "three honest": final(robust, "", three)}


def test_robust_merge_keeps_honest_loss_within_2_percent_of_a_clean_run(runs):
    clean, _, _ = runs["clean"]
    for name in ("cycle", "scaled"):
        loss, rejected, identical = runs[name]
        assert loss <= 1.02 * clean, (name, loss, clean)
        assert identical
    # cycle: rounds 0..4 are scaled, sign_flip, noise, nan, wrong_shape; three of them are screened out
    # for each of the path's 3 modules (shared, L0M0, L1M0)
    assert KINDS == ("scaled", "sign_flip", "noise", "nan", "wrong_shape")
    assert runs["cycle"][1] == 3 * 3 and runs["scaled"][1] == 5 * 3


def test_a_screened_out_attacker_is_as_if_it_were_not_there(runs):
    # every scaled frame is rejected, so the 3 honest workers train exactly as a 3-worker swarm does
    assert runs["scaled"][0] == runs["three honest"][0]


def test_the_plain_mean_is_wrecked_by_the_same_attack(runs):
    assert runs["plain scaled"][0] > 1.2 * runs["clean"][0]
    assert runs["plain scaled"][1] == 0
