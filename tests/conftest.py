"""Shared fixtures: small specs with a router, and a fast synthetic corpus."""

from __future__ import annotations

import os

import pytest
import torch

# Two cores: keep torch from oversubscribing them when pytest runs.
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


def tiny_spec(**model_overrides):
    """A small 2x2 spec with a fitted router on the synthetic corpus (cached per argument set)."""
    from pathswarm.node.data import synthetic_corpus
    from pathswarm.node.swarm_init import init_spec
    from pathswarm.protocol.spec import DataSpec, InnerOptSpec, ModelSpec, SwarmSpec

    model = dict(width=32, base_width=32, n_heads=2, layers_per_module=1, context_len=32)
    model.update(model_overrides)
    base = SwarmSpec(name="test", model=ModelSpec(**model), inner=InnerOptSpec(steps=5, batch_size=4, warmup_steps=2),
                     data=DataSpec(corpus="synthetic"))
    return init_spec(base, synthetic_corpus(200, seed=0))


@pytest.fixture(scope="session")
def spec():
    return tiny_spec()


@pytest.fixture(scope="session")
def synthetic_docs():
    from pathswarm.node.data import synthetic_corpus

    return synthetic_corpus(200, seed=0)
