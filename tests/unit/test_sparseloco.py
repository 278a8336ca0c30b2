"""SparseLoCo's outer step (`[outer] kind = "sparseloco"`, arXiv 2508.15706): a decaying error-feedback buffer in place
of outer momentum, a plain step of lr on the round's mean, and a mean as sparse as a contribution. Replicas stay
bit-identical, the model learns, the spec says what it needs, and the buffer survives checkpoints and saved rounds."""

import dataclasses

import pytest
import torch

from pathswarm.compression.feedback import ErrorFeedback
from pathswarm.compression.registry import codec_class
from pathswarm.node.train.checkpoint import load_checkpoint, save_checkpoint
from pathswarm.node.train.round import feedback_decay, make_contribution
from pathswarm.node.train.simulate import SimConfig, run_simulation
from pathswarm.protocol.rounds.outer import OuterState, nesterov_step
from pathswarm.protocol.spec import CodecSpec, OuterOptSpec, SpecError

from ..conftest import tiny_spec

SPARSE = CodecSpec(kind="sparse", feedback="buffer", k_per_chunk=41, value_bits=2, mean_k_per_chunk=41, mean_bits=2)
LOCO = OuterOptSpec(kind="sparseloco", beta=0.9, lr=1.0)


def sparseloco_spec():
    return tiny_spec().replace(codec=SPARSE, outer=LOCO)


def test_the_spec_needs_a_buffer_and_keeps_old_ids():
    plain = tiny_spec()
    assert "kind" not in plain.to_dict()["outer"] and "mean_k_per_chunk" not in plain.to_dict()["codec"]
    spec = sparseloco_spec()
    assert spec.to_dict()["outer"]["kind"] == "sparseloco" and spec.swarm_id != plain.swarm_id
    with pytest.raises(SpecError, match='feedback = "buffer"'):
        tiny_spec().replace(codec=dataclasses.replace(SPARSE, feedback="weights"), outer=LOCO)
    with pytest.raises(SpecError, match="outer.kind"):
        OuterOptSpec(kind="adam").validate()
    assert feedback_decay(spec) == 0.9 and feedback_decay(plain) == 1.0


def test_the_outer_step_is_plain_and_momentum_stays_zero():
    anchor, momentum, grad = torch.ones(8), torch.zeros(8), torch.full((8,), 0.25)
    nesterov_step(anchor, momentum, grad, OuterOptSpec(kind="sparseloco", lr=0.5), round_=0)
    assert torch.equal(anchor, torch.full((8,), 0.875)) and torch.equal(momentum, torch.zeros(8))


def test_the_buffer_decays_and_the_frame_carries_its_top_k():
    """e ← β·e + Δ, the frame carries top-k of e, e keeps the rest: with Δ = 0 the buffer shrinks by β a round."""
    codec = SPARSE.contribution_codec()
    fb = ErrorFeedback()
    gen = torch.Generator().manual_seed(0)
    delta = torch.randn(4096, generator=gen)
    fb.encode(delta, codec, decay=0.9)
    first = fb.residual.clone()
    assert 0 < int((delta - first != 0).sum()) <= 41  # only k entries left the buffer
    fb.encode(torch.zeros(4096), codec, decay=0.9)
    sent = 0.9 * first - fb.residual
    assert int((sent != 0).sum()) <= 41
    assert fb.last_norm == pytest.approx(float(torch.linalg.vector_norm(0.9 * first)), rel=1e-5)


def test_the_mean_is_as_sparse_as_a_contribution():
    mean_codec = codec_class("sparse").for_mean(SPARSE)
    dense = torch.randn(8192, generator=torch.Generator().manual_seed(1))
    frame, decoded = mean_codec.encode_values(dense, (8192,), torch.float32, want_decoded=True)
    assert int((decoded != 0).sum()) == 2 * 41
    contribution = SPARSE.contribution_codec().encode_values(dense, (8192,), torch.float32)[0]
    assert len(frame) <= 1.05 * len(contribution)


def test_a_member_bound_counts_what_its_frame_carries():
    """The bound on a reducer's mean starts from our own frame's norm: with a decaying buffer that is Δ plus what
    the buffer still holds (an honest mean of such frames broke a bound taken from Δ alone)."""
    spec = sparseloco_spec()
    st = OuterState(torch.zeros(4096), torch.zeros(4096), 3, ("a", "b"))
    fb = ErrorFeedback()
    fb.residual = torch.full((4096,), 2.0)
    sent = make_contribution(st, torch.full((4096,), -0.01), fb, spec.codec, 100, decay=0.9)
    assert sent.delta_norm == pytest.approx(float(torch.linalg.vector_norm(torch.full((4096,), 1.81))), rel=1e-5)


def test_sparseloco_learns_with_identical_replicas(synthetic_docs):
    """At 10 % density (1 % learns too, slowly: its benchmark runs hundreds of rounds, benchmarks/sparse_vs_int8.py)."""
    dense = dataclasses.replace(SPARSE, k_per_chunk=410, mean_k_per_chunk=410)
    spec = tiny_spec().replace(codec=dense, outer=LOCO)
    result = run_simulation(spec, SimConfig(mode="diloco", workers=3, rounds=8, inner_steps=6, eval_batches=2),
                            docs=synthetic_docs)
    assert all(r["replicas_identical"] for r in result.rounds)
    assert result.val_loss_after["all"] < 0.85 * result.val_loss_before["all"]


def test_the_buffer_survives_a_checkpoint(tmp_path, synthetic_docs):
    from pathswarm.node.model.data import TokenSampler
    from pathswarm.node.train.worker import PathWorker

    spec = sparseloco_spec()
    sampler = TokenSampler(synthetic_docs, spec.model.context_len, seed=0)
    worker = PathWorker(spec, (0, 0), lambda: sampler.sample(2))
    residual = torch.arange(worker.outer["shared"].anchor.numel(), dtype=torch.float32)
    worker.feedback["shared"].residual = residual.clone()
    save_checkpoint(tmp_path, spec, 1, {m: worker.module_state(m) for m in worker.module_ids})
    back = load_checkpoint(tmp_path, spec)
    assert torch.equal(back.modules["shared"].feedback, residual) and back.modules["L0M0"].feedback is None
    other = PathWorker(spec, (0, 0), lambda: sampler.sample(2))
    other.restore("shared", back.modules["shared"])
    assert torch.equal(other.feedback["shared"].residual, residual)
