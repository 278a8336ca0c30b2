"""The memory plan (node/train/memory.py, `pathswarm node plan`): its optimizer figures are what the optimizers
hold, and its training-step peak bounds what the CPU reaches, with and without activation checkpointing, and is at
most 1/0.5 of it; micro-batches accumulate to the full batch's update and an out-of-memory error halves them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pathswarm.node.model.model import build_path
from pathswarm.node.train.inner import MicroBatching, make_inner_optimizer, optimizer_state_bytes, train_steps
from pathswarm.node.train.memory import PathMemory, fits, parse_bytes, plan_path
from pathswarm.protocol.spec import InnerOptSpec, ModelSpec, SwarmSpec

PROBE = Path(__file__).parent.parent / "memory_probe.py"
LOW = 0.5
"""The plan is an upper bound: measured peaks were 0.60-0.83 of it over seven shapes (node/train/memory.py)."""


@pytest.mark.parametrize("optimizer", ["adamw", "adamw8bit"])
def test_the_planned_optimizer_state_is_what_the_optimizer_holds(optimizer):
    spec = SwarmSpec(model=ModelSpec(width=128, n_heads=2, context_len=32), inner=InnerOptSpec(batch_size=2))
    path = spec.path_of_index(0)
    model = build_path(spec, path)
    opt = make_inner_optimizer(model, spec.inner, optimizer=optimizer)
    x = torch.randint(0, 256, (2, 32))
    train_steps(model, opt, lambda: (x, x), spec.inner, 1)
    plan = plan_path(spec, path)
    assert optimizer_state_bytes(opt) == (plan.adamw8bit if optimizer == "adamw8bit" else plan.adamw)
    assert plan.params == sum(p.numel() for p in model.parameters()) and plan.weights == 4 * plan.params


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's peak-RSS reset")
@pytest.mark.parametrize("shape", [(256, 2, 128, 16, "adamw", "vocab=8192"), (256, 2, 64, 8, "adamw", "ckpt")])
def test_the_plan_bounds_the_step_peak_the_cpu_reaches(shape):
    # glibc returns every allocation of 64 KiB or more to the kernel when freed: the peak RSS is then live memory
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    out = subprocess.run([sys.executable, str(PROBE), *map(str, shape)], capture_output=True, text=True,
                         timeout=120, check=True, env=env)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert LOW <= got["measured"] / got["planned"] <= 1.0, got


def test_the_largest_micro_batch_that_fits_is_chosen():
    m = PathMemory(params=100, weights=400, grads=400, adamw=800, adamw8bit=250, activations_per_sequence=1000,
                   checkpointed_per_sequence=100, host_bytes=1600, runtime_slack=0)
    by = {f.optimizer: f for f in fits(m, 8, budget=8000)}  # 90 %: 7,200 bytes usable
    assert (by["adamw"].micro_batch, by["adamw"].accumulation) == (4, 2)  # 1,600 + 4,800; 8 would need 11,200
    assert by["adamw8bit"].micro_batch == 4 and by["adamw8bit"].device_bytes == 400 + 400 + 250 + 4800
    assert not by["adamw"].checkpointing
    # 2,700 usable: one sequence without checkpointing needs 1,600 + 1,200 (AdamW); with it, 8 x 120 fit
    by = {f.optimizer: f for f in fits(m, 8, budget=3000)}
    assert (by["adamw"].micro_batch, by["adamw"].checkpointing) == (8, True)
    assert (by["adamw8bit"].micro_batch, by["adamw8bit"].checkpointing) == (1, False)  # 1,050 + 1,200
    assert fits(m, 8, budget=1000) == []


def test_sizes_parse_and_nonsense_is_refused():
    assert parse_bytes("8 GiB") == parse_bytes("8g") == 8 << 30 and parse_bytes("8GB") == 8 * 10**9
    assert parse_bytes("512MiB") == 512 << 20 and parse_bytes("512MB") == 512 * 10**6 and parse_bytes("1e9") == 10**9
    for bad in ("lots", "-1GB", "0", "infGB"):
        with pytest.raises(ValueError):
            parse_bytes(bad)


class _OomAbove(torch.nn.Module):
    """A path model stand-in that raises the device's out-of-memory error for micro-batches over `limit`."""

    def __init__(self, model, limit: int):
        super().__init__()
        self.inner, self.limit, self.sizes = model, limit, []

    def forward(self, x, y):
        self.sizes.append(x.shape[0])
        if x.shape[0] > self.limit:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return self.inner(x, y)


def test_micro_batches_accumulate_to_the_full_batch_and_an_oom_halves_them(caplog):
    spec = SwarmSpec(model=ModelSpec(width=64, context_len=16), inner=InnerOptSpec(batch_size=8, grad_clip=0.0))
    x = torch.randint(0, 256, (8, 16))
    y = torch.roll(x, -1, 1)
    results = {}
    for name, micro in (("whole", None), ("split", MicroBatching(2))):
        torch.manual_seed(0)
        model = build_path(spec, spec.path_of_index(0))
        opt = make_inner_optimizer(model, spec.inner)
        stats = train_steps(model, opt, lambda: (x, y), spec.inner, 3, micro=micro)
        results[name] = (torch.cat([p.detach().reshape(-1) for p in model.parameters()]), stats.losses)
    assert torch.allclose(results["whole"][0], results["split"][0], atol=1e-5)
    assert results["whole"][1] == pytest.approx(results["split"][1], rel=1e-5)

    torch.manual_seed(0)
    model = build_path(spec, spec.path_of_index(0))
    opt = make_inner_optimizer(model, spec.inner)
    wrapped = _OomAbove(model, limit=3)
    micro = MicroBatching()
    with caplog.at_level("WARNING"):
        stats = train_steps(wrapped, opt, lambda: (x, y), spec.inner, 3, micro=micro)
    assert micro.size == 2 and micro.halvings == 2 and len(stats.losses) == 3  # 8 → 4 → 2, then it goes on
    assert [r.message for r in caplog.records].count(caplog.records[0].message) == 1 and "out of memory" in \
        caplog.records[0].message
    with pytest.raises(torch.OutOfMemoryError):  # one sequence that does not fit: the error is the caller's
        train_steps(_OomAbove(model, limit=0), opt, lambda: (x, y), spec.inner, 1, micro=MicroBatching(1))


def test_activation_checkpointing_gives_the_same_gradients():
    spec = SwarmSpec(model=ModelSpec(width=128, n_heads=2, layers_per_module=2, context_len=32))
    torch.manual_seed(0)
    model = build_path(spec, spec.path_of_index(0))
    x = torch.randint(0, 256, (4, 32))
    grads = []
    for on in (False, True):
        model.zero_grad()
        model.set_checkpointing(on)
        _, loss = model(x, torch.roll(x, -1, 1))
        loss.backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*grads, strict=True))
    plan = plan_path(spec, spec.path_of_index(0))
    assert plan.checkpointed_per_sequence < 0.5 * plan.activations_per_sequence


def test_a_worker_is_fitted_to_its_device_or_refused_with_the_figures(monkeypatch, synthetic_docs):
    from pathswarm.node.model.data import TokenSampler
    from pathswarm.node.train import memory
    from pathswarm.node.train.worker import PathWorker

    spec = SwarmSpec()
    sampler = TokenSampler(synthetic_docs, spec.model.context_len, seed=0)
    worker = PathWorker(spec, spec.path_of_index(0), lambda: sampler.sample(spec.inner.batch_size))
    monkeypatch.setattr(memory, "device_budget", lambda device: 8 << 30)
    fit = memory.fit_to_device(worker, "cuda")
    assert (fit.micro_batch, fit.checkpointing, worker.micro.size) == (8, False, 8)
    monkeypatch.setattr(memory, "device_budget", lambda device: 40 << 20)  # 36 MiB usable: checkpointing, 1 sequence
    fit = memory.fit_to_device(worker, "cuda")
    assert fit.checkpointing and worker.micro.size == fit.micro_batch < 8
    assert all(m.checkpointing for m in worker.model.levels)
    monkeypatch.setattr(memory, "device_budget", lambda device: 20 << 20)
    with pytest.raises(ValueError, match="GiB with adamw at one sequence per micro-batch"):
        memory.fit_to_device(worker, "cuda")


def test_node_plan_exits_1_when_nothing_fits_and_states_the_budget_in_both_units(tmp_path):
    from click.testing import CliRunner

    from pathswarm.node.app.cli import main
    from pathswarm.node.app.swarm_init import init_spec
    from pathswarm.node.model.data import synthetic_corpus

    spec_path = tmp_path / "swarm.toml"
    spec_path.write_text(init_spec(SwarmSpec(model=ModelSpec(width=64, context_len=16)),
                                   synthetic_corpus(100, seed=0)).to_toml())
    small = CliRunner().invoke(main, ["node", "plan", "--swarm", str(spec_path), "--vram", "1MB"])
    assert small.exit_code == 1, small.output
    assert "nothing fits" in small.output and "budget 976.6 KiB" not in small.output
    assert "(0.00 GB)" in small.output  # 10^6 bytes: a GB is 10^9 (it was read as a MiB)
    big = CliRunner().invoke(main, ["node", "plan", "--swarm", str(spec_path), "--vram", "8GiB"])
    assert big.exit_code == 0, big.output
    assert "budget 8.00 GiB (8.59 GB)" in big.output and "micro-batch" in big.output
