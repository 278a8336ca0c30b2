"""CUDA paths (skipped without a GPU; benchmarks/gpu_check.sh runs them on one): inner steps in bf16 autocast keep
fp32 weights and optimizer state and the outer state a GPU worker exchanges is the CPU fp32 one, AdamW8bit's state is
under 0.3x AdamW's, and the memory plan bounds the real peak. (That a CUDA node and a CPU node keep identical
replicas is benchmarks/gpu.py's swarm check.)"""

from __future__ import annotations

import pytest
import torch

from pathswarm.node.model.data import TokenSampler
from pathswarm.node.train.inner import optimizer_state_bytes
from pathswarm.node.train.memory import plan_path
from pathswarm.node.train.worker import PathWorker
from pathswarm.protocol.spec import SwarmSpec

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")]


def _worker(spec, docs, device, optimizer="adamw"):
    sampler = TokenSampler(docs, spec.model.context_len, seed=0)
    return PathWorker(spec, spec.path_of_index(0), lambda: sampler.sample(spec.inner.batch_size), device=device,
                      optimizer=optimizer)


def test_bf16_inner_steps_keep_fp32_weights_and_learn(synthetic_docs):
    spec = SwarmSpec()
    w = _worker(spec, synthetic_docs, "cuda")
    losses = w.train_inner(30).losses
    assert all(p.dtype == torch.float32 and p.device.type == "cuda" for p in w.model.parameters())
    assert all(v.dtype == torch.float32 for st in w.opt.state.values() for k, v in st.items() if k != "step")
    assert sum(losses[-5:]) / 5 < 0.9 * sum(losses[:5]) / 5
    flat = w.flat("shared")
    assert flat.device.type == "cpu" and flat.dtype == torch.float32


def test_8bit_state_and_the_plan_on_the_gpu(synthetic_docs):
    spec = SwarmSpec()
    sizes = {}
    for kind in ("adamw", "adamw8bit"):
        torch.cuda.reset_peak_memory_stats()
        w = _worker(spec, synthetic_docs, "cuda", kind)
        w.train_inner(3)
        sizes[kind] = (optimizer_state_bytes(w.opt), torch.cuda.max_memory_allocated())
        del w
        torch.cuda.empty_cache()
    assert sizes["adamw8bit"][0] <= 0.3 * sizes["adamw"][0]
    plan = plan_path(spec, spec.path_of_index(0))
    assert sizes["adamw"][1] <= plan.device_bytes(spec.inner.batch_size, "adamw")  # the plan is an upper bound
