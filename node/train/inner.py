"""The inner loop of DiLoCo: AdamW on one path's documents, with muP learning rates and warm-up.

Kept as straight visible code (nanoGPT style): sample a batch, forward, backward, clip, step.
The same functions drive the simulator, the synchronous baseline and the real node.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from pathswarm.node.model.model import PathModel, param_groups
from pathswarm.protocol.spec import InnerOptSpec

logger = logging.getLogger(__name__)


class AdamW:
    """AdamW with decoupled weight decay, step for step what `torch.optim.AdamW` computes (amsgrad off).

    Ours because constructing any `torch.optim` optimizer imports torch._dynamo, about 3 s of CPU at
    every node start: a restarted volunteer node trains that much sooner, and a test suite of
    subprocess nodes saves minutes. `tests/test_model.py` checks it against torch's AdamW."""

    def __init__(self, groups: list[dict], betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8):
        self.param_groups = [{"betas": betas, "eps": eps, "weight_decay": 0.0, **g, "params": list(g["params"])}
                             for g in groups]
        self.state: dict[torch.Tensor, dict] = {}

    def zero_grad(self, set_to_none: bool = True) -> None:
        for g in self.param_groups:
            for p in g["params"]:
                if set_to_none:
                    p.grad = None
                elif p.grad is not None:
                    p.grad.zero_()

    @torch.no_grad()
    def step(self) -> None:
        for g in self.param_groups:
            lr, wd, eps = g["lr"], g["weight_decay"], g["eps"]
            beta1, beta2 = g["betas"]
            for p in g["params"]:
                if p.grad is None:
                    continue
                st = self.state.get(p)
                if st is None:
                    st = self.state[p] = {"step": 0, "exp_avg": torch.zeros_like(p),
                                          "exp_avg_sq": torch.zeros_like(p)}
                st["step"] += 1
                p.mul_(1 - lr * wd)
                st["exp_avg"].lerp_(p.grad, 1 - beta1)
                st["exp_avg_sq"].mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
                bias1, bias2 = 1 - beta1 ** st["step"], 1 - beta2 ** st["step"]
                denom = (st["exp_avg_sq"].sqrt() / math.sqrt(bias2)).add_(eps)
                p.addcdiv_(st["exp_avg"], denom, value=-lr / bias1)


def import_bitsandbytes():
    """bitsandbytes, imported without its CPU backend's warning: on a CPU with AVX-512 BF16 it tries to download a
    4-bit matmul kernel and, without the `kernels` package, tells the user to `pip install kernels`. We use its 8-bit
    AdamW only, which needs no such kernel: the hint is irrelevant to a pathswarm node (issue 32)."""
    import logging

    logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
    import bitsandbytes

    return bitsandbytes


def make_inner_optimizer(model: PathModel, cfg: InnerOptSpec, lr: float | None = None,
                         optimizer: str | None = None):
    """The inner optimizer over the path's parameters with muP per-group learning rates (lr overrides cfg.lr):
    our AdamW, or with `optimizer` (else cfg.optimizer) "adamw8bit" bitsandbytes' AdamW8bit (blockwise 8-bit
    moments; tensors under its min_8bit_size, 4096 values, keep 32-bit ones)."""
    kind = optimizer or cfg.optimizer
    groups = param_groups(model, lr if lr is not None else cfg.lr, cfg.weight_decay)
    if kind == "adamw8bit":
        # Imported here only: bitsandbytes and the torch.optim machinery it pulls in cost seconds at start-up
        # (see AdamW above), and most nodes never use it.
        bnb = import_bitsandbytes()
        return bnb.optim.AdamW8bit(groups, betas=(cfg.beta1, cfg.beta2))
    if kind != "adamw":
        raise ValueError(f"unknown inner optimizer {kind!r} (adamw or adamw8bit)")
    return AdamW(groups, betas=(cfg.beta1, cfg.beta2))


def optimizer_kind(opt) -> str:
    """'adamw8bit' for bitsandbytes' optimizer, else 'adamw'."""
    return "adamw" if isinstance(opt, AdamW) else "adamw8bit"


def optimizer_state_bytes(opt) -> int:
    """Bytes of the optimizer's state tensors (moments, quantisation maps and scales); a tensor shared by several
    parameters (AdamW8bit's maps) counts once."""
    tensors = {v.data_ptr(): v for st in opt.state.values() for v in st.values() if torch.is_tensor(v)}
    return sum(v.numel() * v.element_size() for v in tensors.values())


def set_warmup_lr(opt: AdamW, inner_step: int, warmup_steps: int) -> None:
    """Linear warm-up over the first steps of a node's training, then constant.

    Constant afterwards because a swarm trains open-ended: there is no known end for a cosine."""
    factor = min(1.0, (inner_step + 1) / warmup_steps) if warmup_steps > 0 else 1.0
    for g in opt.param_groups:
        g["lr"] = g["base_lr"] * factor


@dataclass
class InnerStats:
    losses: list[float]
    tokens: int


@dataclass
class MicroBatching:
    """How many sequences one forward/backward takes (node/train/memory.py plans it): a larger batch is split and its
    gradients accumulated, the same update up to float rounding. A device out-of-memory error halves it and the step
    is taken again (logged once), down to one sequence; only then does the error propagate."""

    size: int = 0
    """Sequences per forward/backward (0: the whole batch)."""
    halvings: int = 0
    """How often an out-of-memory error halved it."""


AUTOCAST_BF16 = True
"""Inner steps on a CUDA device run in bf16 autocast (benchmarks/gpu.py turns it off to measure fp32 against it)."""


def autocast(device: torch.device):
    """bf16 autocast on a CUDA device that has bf16 (weights, gradients and optimizer state stay fp32: autocast
    only runs matmuls and attention in bf16); nothing elsewhere. The outer state never sees it: PathWorker.flat
    reads the fp32 weights to the CPU, so digests are the same whether a node trains on a CPU or a GPU."""
    if AUTOCAST_BF16 and device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _accumulated_loss(model: PathModel, x: torch.Tensor, y: torch.Tensor, size: int) -> float:
    """Backward over micro-batches of `size` sequences, each weighted by its share of the batch's tokens; returns the
    batch's mean loss."""
    total = 0.0
    for s in range(0, x.shape[0], size):
        xs, ys = x[s:s + size], y[s:s + size]
        with autocast(x.device):
            loss = model(xs, ys)[1]  # not the logits: holding them would keep B·T·V floats through backward
        (loss * (ys.numel() / y.numel())).backward()
        total += loss.item() * ys.numel()
    return total / y.numel()


def train_steps(model: PathModel, opt: AdamW, batches: Callable[[], tuple[torch.Tensor, torch.Tensor]],
                cfg: InnerOptSpec, steps: int, first_step: int = 0,
                on_step: Callable[[int, float], None] | None = None,
                micro: MicroBatching | None = None) -> InnerStats:
    """Run `steps` inner optimizer steps; `first_step` is the node's running inner-step count (for warm-up);
    `micro`: split each batch into micro-batches (and halve them on out-of-memory errors)."""
    model.train()
    losses: list[float] = []
    tokens = 0
    for i in range(steps):
        x, y = batches()
        device = next(model.parameters()).device
        if x.device != device:  # data is sampled on the CPU; the model may live on a GPU
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        set_warmup_lr(opt, first_step + i, cfg.warmup_steps)
        while True:
            opt.zero_grad(set_to_none=True)
            out_of_memory = False
            size = micro.size if micro is not None and 0 < micro.size < x.shape[0] else x.shape[0]
            try:
                if size == x.shape[0]:
                    with autocast(device):
                        loss = model(x, y)[1]  # not the logits: holding them keeps B·T·V floats through backward
                    loss.backward()
                    value = loss.item()
                else:
                    value = _accumulated_loss(model, x, y, size)
                break
            except torch.OutOfMemoryError:
                if micro is None or size <= 1:
                    raise
                opt.zero_grad(set_to_none=True)
                loss = None  # drop the failed step's graph before trying again
                micro.size, micro.halvings = size // 2, micro.halvings + 1
                if micro.halvings == 1:
                    logger.warning("out of memory on %s at %d sequences per micro-batch: going on with %d "
                                   "(gradients accumulated; further halvings are not logged)", device, size,
                                   micro.size)
                out_of_memory = True
            # Outside the except block: its traceback no longer holds the failed step's tensors, so they can go back.
            if out_of_memory and device.type == "cuda":
                torch.cuda.empty_cache()
        if cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        losses.append(value)
        tokens += y.numel()
        if on_step is not None:
            on_step(first_step + i, losses[-1])
    return InnerStats(losses=losses, tokens=tokens)


@torch.no_grad()
def evaluate_loss(model: PathModel, batches: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> tuple[float, int]:
    """Mean next-byte cross-entropy (nats per byte: tokens are bytes) over the batches, and the token count."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    device = next(model.parameters()).device
    for x, y in batches:
        with autocast(device):
            _, loss = model(x.to(device), y.to(device))
        total += loss.item() * y.numel()
        count += y.numel()
    model.train(was_training)
    return (total / count if count else float("nan")), count
