"""Warm start (node/train/warm_start.py): round 0 trained by the swarm's creator, named by digests in the spec."""

import pytest
import torch

from pathswarm.node.train.warm_start import (
    InitMismatchError,
    check_init,
    expected_digest,
    module_states,
    warm_start,
    warm_started,
    weights_digest,
)
from pathswarm.node.train.worker import PathWorker
from pathswarm.protocol.spec import InitSpec, SpecError, loads_spec


def test_warm_start_is_deterministic_trains_and_is_named_by_the_spec(spec, synthetic_docs):
    warm, weights = warm_started(spec, synthetic_docs, steps=8, batch_size=2)
    again = warm_start(spec, synthetic_docs, steps=8, batch_size=2)
    assert all(torch.equal(weights[m], again[m]) for m in spec.all_module_ids())  # any machine gets the same bytes
    fresh = {m: PathWorker(spec, p, lambda: None).flat(m) for p in spec.paths() for m in spec.module_ids(p)}
    assert all(not torch.equal(weights[m], fresh[m]) for m in spec.all_module_ids())  # every module was trained
    assert warm.init.warm_start_steps == 8 and warm.swarm_id != spec.swarm_id
    assert warm.init.digests == tuple(weights_digest(weights[m]) for m in spec.all_module_ids())
    assert loads_spec(warm.to_toml()).swarm_id == warm.swarm_id  # the digests survive the TOML round trip
    for mid in spec.all_module_ids():
        check_init(warm, mid, weights[mid], torch.zeros_like(weights[mid]))
        assert expected_digest(spec, mid) == ""
        check_init(spec, mid, fresh[mid])  # a seed-init swarm checks nothing
    # Round-0 checkpoint states unflatten to the same weights.
    states = module_states(warm, weights)
    assert all(torch.equal(states[m].flat_weights(), weights[m]) and states[m].round == 0 for m in states)


def test_round_zero_that_is_not_the_specs_is_refused(spec, synthetic_docs):
    warm, weights = warm_started(spec, synthetic_docs, steps=2, batch_size=2)
    bad = weights["shared"].clone()
    bad[0] += 1e-6  # one value off: another digest
    with pytest.raises(InitMismatchError, match="shared"):
        check_init(warm, "shared", bad)
    with pytest.raises(InitMismatchError, match="momentum"):
        check_init(warm, "shared", weights["shared"], torch.ones_like(weights["shared"]))
    with pytest.raises(InitMismatchError, match="L0M1"):
        check_init(warm, "L0M1", weights["L0M0"])  # another module's weights


def test_init_spec_validation(spec):
    n = len(spec.all_module_ids())
    with pytest.raises(SpecError, match="init.digests"):
        spec.replace(init=InitSpec(warm_start_steps=0, digests=("0" * 64,) * n))
    with pytest.raises(SpecError, match="one digest per module"):
        spec.replace(init=InitSpec(warm_start_steps=5, digests=("0" * 64,)))
    with pytest.raises(SpecError, match="sha256"):
        spec.replace(init=InitSpec(warm_start_steps=5, digests=("xyz",) * n))
    with pytest.raises(SpecError, match="warm_start_steps"):
        spec.replace(init=InitSpec(warm_start_steps=-1))
    with pytest.raises(ValueError, match="positive"):
        warm_start(spec, [], 0)


def test_the_simulator_starts_from_the_warm_start_and_checks_it(spec, synthetic_docs):
    from pathswarm.node.train.simulate import SimConfig, run_simulation

    warm, weights = warm_started(spec, synthetic_docs, steps=30, batch_size=4)
    cfg = SimConfig(mode="dipaco", rounds=1, inner_steps=1, eval_batches=2)
    cold = run_simulation(spec, cfg, docs=synthetic_docs)
    hot = run_simulation(warm, cfg, docs=synthetic_docs, init_weights=weights)
    assert hot.val_loss_before["all"] < cold.val_loss_before["all"] - 0.2, (hot.val_loss_before, cold.val_loss_before)
    with pytest.raises(ValueError, match="init_weights"):
        run_simulation(warm, cfg, docs=synthetic_docs)
    other = {**weights, "shared": weights["shared"] * 2}
    with pytest.raises(InitMismatchError):
        run_simulation(warm, cfg, docs=synthetic_docs, init_weights=other)
