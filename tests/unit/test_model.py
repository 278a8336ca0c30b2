"""The modular muP transformer: composition by module id, identical init across peers, muP coordinate check."""

import math
import subprocess
import sys

import pytest
import torch

from pathswarm.node.model.model import build_path, count_module_params, new_module, path_param_count
from pathswarm.node.train.inner import make_inner_optimizer, set_warmup_lr
from pathswarm.protocol.spec import InnerOptSpec, ModelSpec, SwarmSpec


def small(**kw) -> SwarmSpec:
    model = dict(width=32, base_width=32, n_heads=2, layers_per_module=1, context_len=16)
    model.update(kw)
    return SwarmSpec(model=ModelSpec(**model))


def test_path_forward_shapes_and_initial_loss():
    spec = small()
    model = build_path(spec, (1, 0))
    assert model.module_ids == ["shared", "L0M1", "L1M0"]
    x = torch.randint(0, 256, (3, 16))
    logits, loss = model(x, x)
    assert logits.shape == (3, 16, 256)
    # The readout is N(0, init_std) (issue 16), not zero: logits start small, near the uniform distribution.
    assert loss.item() == pytest.approx(math.log(256), abs=0.05)
    assert loss.item() != pytest.approx(math.log(256), abs=1e-5)
    with pytest.raises(ValueError, match="context_len"):
        model(torch.zeros(1, 17, dtype=torch.long))


def test_mup_initial_logits_shrink_as_one_over_sqrt_width():
    # A random readout times muP's 1/m output multiplier: logits are O(1/sqrt(m)) at init, so the output starts
    # nearer uniform as the model widens (width-stable training, as with the zero readout muP also allows).
    torch.manual_seed(0)
    x = torch.randint(0, 256, (8, 16))
    stds = {}
    for width in (32, 128):
        model = build_path(small(width=width, n_heads=2), (0, 0))
        with torch.no_grad():
            stds[width] = model(x)[0].std().item()
    assert 0.35 < stds[128] / stds[32] < 0.65, stds


def test_same_module_is_identical_on_every_path_and_peer():
    spec = small()
    a, b = build_path(spec, (0, 0)), build_path(spec, (1, 0))
    for mid in ("shared", "L1M0"):
        sa, sb = a.module_state(mid), b.module_state(mid)
        assert all(torch.equal(sa[k], sb[k]) for k in sa)
    # Different modules of a level get different weights.
    w0 = new_module(spec, "L0M0").state_dict()
    w1 = new_module(spec, "L0M1").state_dict()
    assert not torch.equal(w0["blocks.0.mlp.fc.weight"], w1["blocks.0.mlp.fc.weight"])
    # Another seed gives other weights.
    other = new_module(spec.replace(model=ModelSpec(**{**spec.model.__dict__, "seed": 1})), "L0M0").state_dict()
    assert not torch.equal(w0["blocks.0.mlp.fc.weight"], other["blocks.0.mlp.fc.weight"])


def test_module_state_round_trip_and_errors():
    spec = small()
    a, b = build_path(spec, (0, 1)), build_path(spec, (1, 1))
    with torch.no_grad():
        for p in a.module("L1M1").parameters():
            p.add_(1.0)
    b.load_module_state("L1M1", a.module_state("L1M1"))
    x = torch.randint(0, 256, (2, 16))
    assert torch.equal(a.module("L1M1")(a.shared.embed(x)), b.module("L1M1")(b.shared.embed(x)))
    state = a.module_state("L1M1")
    state.pop(next(iter(state)))
    with pytest.raises(ValueError, match="missing"):
        b.load_module_state("L1M1", state)
    with pytest.raises(KeyError):
        a.module("L0M1")
    with pytest.raises(KeyError):
        new_module(spec, "L5M0")


def test_param_counts_add_up():
    spec = small()
    counts = count_module_params(spec)
    assert set(counts) == set(spec.all_module_ids())
    model = build_path(spec, (0, 0))
    assert path_param_count(spec) == sum(p.numel() for p in model.parameters())


def test_mup_learning_rates_per_group():
    spec = small(width=128, base_width=32)
    model = build_path(spec, (0, 0))
    opt = make_inner_optimizer(model, InnerOptSpec(lr=1e-2))
    hidden = {id(p) for mid in ("L0M0", "L1M0") for p in model.module(mid).parameters() if p.ndim == 2}
    for g in opt.param_groups:
        ids = {id(p) for p in g["params"]}
        if ids & hidden:
            assert ids <= hidden and g["lr"] == pytest.approx(1e-2 / 4)
        else:
            assert g["lr"] == pytest.approx(1e-2)


def test_our_adamw_takes_the_same_steps_as_torch_adamw():
    spec = small(width=64, base_width=32)  # muP: two learning rates, and decay on matrices only
    ours_model, torch_model = build_path(spec, (0, 1)), build_path(spec, (0, 1))
    cfg = InnerOptSpec(lr=3e-3, weight_decay=0.1, beta1=0.8, beta2=0.95)
    ours = make_inner_optimizer(ours_model, cfg)
    names = {id(p): n for n, p in ours_model.named_parameters()}
    twins = dict(torch_model.named_parameters())
    reference = torch.optim.AdamW([{"params": [twins[names[id(p)]] for p in g["params"]], "lr": g["lr"],
                                    "base_lr": g["base_lr"], "weight_decay": g["weight_decay"]}
                                   for g in ours.param_groups], betas=(0.8, 0.95))
    gen = torch.Generator().manual_seed(0)
    for step in range(12):
        x = torch.randint(0, 256, (4, 17), generator=gen)
        for model, opt in ((ours_model, ours), (torch_model, reference)):
            set_warmup_lr(opt, step, warmup_steps=5)  # the learning rate changes between steps
            _, loss = model(x[:, :-1], x[:, 1:])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    moved = 0.0
    for (name, p), q in zip(ours_model.named_parameters(), torch_model.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-7, msg=name)
        moved = max(moved, (p - build_path(spec, (0, 1)).get_parameter(name)).abs().max().item())
    assert moved > 1e-3  # the models did train


def test_a_node_training_step_imports_neither_dynamo_nor_sklearn():
    """Both cost ~3 s of CPU each at every node start (a restart's downtime, every test subprocess)."""
    code = ("import sys, torch\n"
            "from pathswarm.node.peer import node\n"
            "from pathswarm.node.model import router\n"
            "from pathswarm.node.train.worker import PathWorker\n"
            "from pathswarm.protocol.spec import SwarmSpec, ModelSpec\n"
            "spec = SwarmSpec(model=ModelSpec(width=32, base_width=32, n_heads=2, context_len=16))\n"
            "x = torch.randint(0, 256, (2, 17))\n"
            "w = PathWorker(spec, spec.path_of_index(0), lambda: (x[:, :-1], x[:, 1:]))\n"
            "w.train_inner(2)\n"
            "print(sorted(m for m in ('torch._dynamo', 'sklearn') if m in sys.modules))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]"


def _coordinate_sizes(parametrization: str, width: int, seed: int, steps: int = 4) -> dict[str, float]:
    """Mean |activation| per layer after a few Adam steps (the coordinate check of Tensor Programs V)."""
    spec = SwarmSpec(model=ModelSpec(width=width, base_width=64, n_heads=4, layers_per_module=1, context_len=32,
                                     parametrization=parametrization, seed=seed))
    model = build_path(spec, (0, 0))
    opt = make_inner_optimizer(model, InnerOptSpec(lr=3e-3, weight_decay=0.0))
    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randint(0, 256, (8, 32), generator=gen)
    for _ in range(steps):
        _, loss = model(x[:, :-1], x[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
    sizes: dict[str, float] = {}
    hooks = []
    for mid in model.module_ids[1:]:
        for i, block in enumerate(model.module(mid).blocks):
            for part in ("attn", "mlp"):
                name = f"{mid}.{i}.{part}"
                hooks.append(getattr(block, part).register_forward_hook(
                    lambda m, inp, out, name=name: sizes.__setitem__(name, out.abs().mean().item())))
    with torch.no_grad():
        logits = model(x[:, :-1])
    sizes["logits"] = logits.abs().mean().item()
    for h in hooks:
        h.remove()
    return sizes


def _mean_sizes(parametrization: str, width: int, seeds=(0, 1)) -> dict[str, float]:
    runs = [_coordinate_sizes(parametrization, width, s) for s in seeds]
    return {k: sum(r[k] for r in runs) / len(runs) for k in runs[0]}


def test_mup_coordinate_check_flat_while_sp_grows():
    widths = (64, 128, 256, 512)
    mup = [_mean_sizes("mup", w) for w in widths]
    sp = [_mean_sizes("sp", w, seeds=(0,)) for w in widths]  # SP grows by far more than seed noise
    layers = list(mup[0])
    mup_spread = {k: max(s[k] for s in mup) / min(s[k] for s in mup) for k in layers}
    sp_growth = {k: sp[-1][k] / sp[0][k] for k in layers}
    assert all(v <= 2.0 for v in mup_spread.values()), mup_spread
    # Standard parametrisation: activations grow with width (by more than 2× somewhere over 8× width).
    assert max(sp_growth.values()) > 2.0, sp_growth
    assert sp_growth["logits"] > 2.0, sp_growth
