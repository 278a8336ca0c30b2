"""A node's memory plan: what training one path needs, counted before anything is allocated (issue 19).

Per path: the fp32 weights, their gradients, the inner optimizer's state (AdamW: two fp32 moments; AdamW8bit: two
8-bit moments with a 4-byte scale per 256 values, and 32-bit moments for tensors under bitsandbytes' min_8bit_size),
and the activations autograd keeps for the backward pass. Activations are not a formula: the path is built on
PyTorch's meta device (shapes, no memory) and one forward pass of `micro_batch` sequences at the spec's context
records every tensor autograd saves (`saved_tensors_hooks`); a tensor saved twice, or a view of one, counts once.
They grow linearly with the micro-batch, so gradient accumulation over smaller micro-batches trades them for steps.

The outer state (anchor, Nesterov buffer, error feedback, the weights of a contribution in flight) lives in host
memory whatever the device: `host_bytes`. Nothing here allocates real tensors or touches a device.

tests/unit/test_memory_plan.py checks the figures against what the CPU allocator actually holds during a step.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from pathswarm.node.model.model import Block, PathModel, build_path
from pathswarm.node.train.inner import optimizer_kind
from pathswarm.protocol.spec import SwarmSpec

logger = logging.getLogger(__name__)

MIN_8BIT_SIZE = 4096
"""bitsandbytes keeps 32-bit moments for tensors with fewer values than this (its optimizers' default)."""
BLOCK = 256
"""bitsandbytes' 8-bit optimizer block: one fp32 scale per moment per block."""
QMAPS_BYTES = 2 * 256 * 4
"""Its two quantisation maps (256 fp32 values each), shared by every parameter."""
RUNTIME_SLACK = 16 << 20
"""Framework and allocator memory beyond the tensors counted here (small allocations, autograd's bookkeeping): on the
CPU a small path's step peaked up to 7.5 MB above the tensors. A GPU's CUDA context (a few hundred MB) is not in the
plan: the 10 % headroom of `fits` covers it on cards of 8 GB and more."""
BACKWARD_WORKSPACE = 0.2
"""The backward pass's temporaries (gradients of activations, a checkpointed block's recompute) as a share of the
saved activations. With it the plan is an upper bound: on the CPU, at steady state and with freed memory returned to
the kernel at once (glibc's MALLOC_MMAP_THRESHOLD_=65536), a step's peak of anonymous memory measured 0.60–0.83 of
the plan over seven shapes of 50–490 MB (vocabularies of 256 and 8,192, with and without activation checkpointing,
AdamW and AdamW8bit; tests/unit/test_memory_plan.py keeps two), 0.44–0.49 for two shapes under 50 MB, where the
runtime slack is most of the plan. Library code the first step pages in (11–15 MB here, more with other CPUs'
kernels) is file-backed memory and not counted. Without that setting glibc keeps freed memory, and the peak RSS read
up to 1.27× the plan (1.9× with checkpointing): memory that was free, not in use."""


@dataclass(frozen=True)
class PathMemory:
    """Bytes to train one path at one micro-batch (device side) and to keep its outer state (host side)."""

    params: int
    weights: int
    grads: int
    adamw: int
    adamw8bit: int
    activations_per_sequence: int
    """Bytes autograd keeps per sequence of the spec's context (the micro-batch multiplies it)."""
    checkpointed_per_sequence: int
    """The same with activation checkpointing: each block's input, plus one block recomputed during backward."""
    host_bytes: int
    """Outer state in host memory: anchor, Nesterov buffer, error feedback and the weights of a round in flight."""
    step_workspace: int = 0
    """The optimizer step's temporaries: two fp32 copies of the largest parameter tensor."""
    runtime_slack: int = RUNTIME_SLACK

    def activations(self, micro_batch: int, checkpointing: bool = False) -> int:
        return (self.checkpointed_per_sequence if checkpointing else self.activations_per_sequence) * micro_batch

    def device_bytes(self, micro_batch: int, optimizer: str, checkpointing: bool = False) -> int:
        """Peak bytes of a training step: weights, gradients, optimizer state, activations and backward workspace."""
        state = self.adamw8bit if optimizer == "adamw8bit" else self.adamw
        act = self.activations(micro_batch, checkpointing)
        return (self.weights + self.grads + state + round(act * (1 + BACKWARD_WORKSPACE)) + self.step_workspace
                + self.runtime_slack)


def optimizer_bytes(shapes: list[int]) -> tuple[int, int]:
    """(AdamW, AdamW8bit) state bytes for parameter tensors of these sizes."""
    adamw = sum(8 * n for n in shapes)
    small = sum(8 * n for n in shapes if n < MIN_8BIT_SIZE)
    big = sum(2 * n + 2 * 4 * -(-n // BLOCK) for n in shapes if n >= MIN_8BIT_SIZE)
    return adamw, small + big + (QMAPS_BYTES if big else 0)


def activation_bytes(spec: SwarmSpec, path: tuple[int, ...], micro_batch: int = 1,
                     checkpointing: bool = False) -> int:
    """Bytes of the tensors autograd saves in one forward pass of `micro_batch` sequences (meta device). With
    checkpointing: the whole path's less its blocks', plus each block's input and one block's (the recompute)."""
    with torch.device("meta"):
        model = build_path(spec, path)
        tokens = torch.zeros(micro_batch, spec.model.context_len, dtype=torch.long)
    full = _saved_bytes(model, (tokens,))
    if not checkpointing:
        return full
    cfg = spec.model
    with torch.device("meta"):
        block = Block(cfg)
        x = torch.zeros(micro_batch, cfg.context_len, cfg.width, requires_grad=True)
    one = _saved_bytes(block, (x,))
    n = cfg.layers_per_module * len(spec.levels)
    return full - n * one + n * x.numel() * 4 + one


def _saved_bytes(model: torch.nn.Module, inputs: tuple) -> int:
    """Bytes autograd saves for backward in one forward of `model` on meta `inputs` (a path model also counts the
    loss's softmax over its logits)."""
    seen: dict[int, int] = {}
    keep = []  # hold every saved tensor until counted: ids of freed tensors are reused
    weights = {id(p) for p in model.parameters()}

    def pack(t: torch.Tensor):
        base = t._base if t._base is not None else t
        if id(base) not in weights:  # a weight (or a view of one, e.g. its transpose) is saved, not copied
            keep.append(base)
            seen[id(base)] = base.numel() * base.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(*inputs)
    if isinstance(model, PathModel):  # the loss saves the logits' softmax, and backward makes their gradient
        seen[-1] = seen[-2] = out.numel() * 4
    return sum(seen.values())


def plan_path(spec: SwarmSpec, path: tuple[int, ...]) -> PathMemory:
    with torch.device("meta"):
        model = build_path(spec, path)
    shapes = [p.numel() for p in model.parameters()]
    params = sum(shapes)
    adamw, adamw8bit = optimizer_bytes(shapes)
    # anchor + momentum + feedback residual (or unsent part), and local weights at the send while a round is in flight
    host = 4 * params * 4
    return PathMemory(params=params, weights=4 * params, grads=4 * params, adamw=adamw, adamw8bit=adamw8bit,
                      activations_per_sequence=activation_bytes(spec, path, 1),
                      checkpointed_per_sequence=activation_bytes(spec, path, 1, checkpointing=True), host_bytes=host,
                      step_workspace=2 * 4 * max(shapes))


@dataclass(frozen=True)
class Fit:
    """A setting that fits a memory budget: `micro_batch` sequences per backward, accumulated to the spec's batch."""

    optimizer: str
    micro_batch: int
    accumulation: int
    device_bytes: int
    checkpointing: bool = False


def fits(memory: PathMemory, batch: int, budget: int, headroom: float = 0.9) -> list[Fit]:
    """For each optimizer, the largest micro-batch (a divisor of the batch) whose training fits in `headroom` of
    `budget` bytes, without activation checkpointing if possible (it costs a recompute), else with it; an
    optimizer with neither is left out."""
    out = []
    micros = sorted((d for d in range(1, batch + 1) if batch % d == 0), reverse=True)
    for optimizer in ("adamw", "adamw8bit"):
        for checkpointing in (False, True):
            need, micro = next(((memory.device_bytes(m, optimizer, checkpointing), m) for m in micros
                                if memory.device_bytes(m, optimizer, checkpointing) <= headroom * budget), (0, 0))
            if micro:
                out.append(Fit(optimizer, micro, batch // micro, need, checkpointing))
                break
    return out


def parse_bytes(text: str) -> int:
    """'8GB', '12 GiB', '512MB', '1e9' → bytes: GB, MB, KB, TB are powers of 10 (8GB = 8·10^9), GiB, MiB, KiB, TiB
    and the bare G, M, K, T powers of 2 (8GiB = 8·2^30), as `nvidia-smi` (MiB) and disk makers (GB) write them.
    (GB once meant 2^30 here too: a budget of "8GB" was 7 % larger than the 8·10^9 bytes asked for.)"""
    t = text.strip().upper().replace(" ", "")
    units = {"TIB": 1 << 40, "TB": 10**12, "T": 1 << 40, "GIB": 1 << 30, "GB": 10**9, "G": 1 << 30,
             "MIB": 1 << 20, "MB": 10**6, "M": 1 << 20, "KIB": 1 << 10, "KB": 10**3, "K": 1 << 10, "B": 1}
    unit = next((u for u in units if t.endswith(u)), "")
    number, scale = (t[:-len(unit)], units[unit]) if unit else (t, 1)
    try:
        value = float(number)
    except ValueError:
        raise ValueError(f"{text!r} is not a size (e.g. 8GB, 512MB)") from None
    if not value > 0 or value == float("inf"):
        raise ValueError(f"{text!r}: a size must be positive")
    return int(value * scale)


def device_budget(device: str) -> int:
    """Memory a node may train in on `device`: a GPU's total memory, or the host RAM available now."""
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError("no CUDA device here: give the card's memory with --vram (e.g. 8GB)")
        return torch.cuda.get_device_properties(torch.device(device)).total_memory
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise ValueError("cannot read the available memory: give it with --vram")


def planned_training(spec: SwarmSpec, path: tuple[int, ...], optimizer: str, budget: int) -> Fit:
    """How a node training `path` with `optimizer` fits `budget` bytes; ValueError, with the figures, when not even
    one sequence per micro-batch with activation checkpointing fits."""
    memory = plan_path(spec, path)
    for fit in fits(memory, spec.inner.batch_size, budget):
        if fit.optimizer == optimizer:
            return fit
    need = memory.device_bytes(1, optimizer, checkpointing=True)
    raise ValueError(f"training this path needs {need / 2**30:.2f} GiB with {optimizer} at one sequence per "
                     f"micro-batch with activation checkpointing, the device has {budget / 2**30:.2f} GiB "
                     "(see `pathswarm node plan`)")


def fit_to_device(worker, device: str) -> Fit:
    """Set a PathWorker to train at what the plan fits on `device`: its micro-batch and activation checkpointing.
    ValueError, with the figures, when nothing fits (the node's start ends there)."""
    kind = optimizer_kind(worker.opt)
    budget = device_budget(device)
    fit = planned_training(worker.spec, worker.path, kind, budget)
    worker.micro.size = fit.micro_batch
    worker.model.set_checkpointing(fit.checkpointing)
    logger.info("memory plan: %d of %d sequences per micro-batch with %s%s in %.1f GiB", fit.micro_batch,
                worker.spec.inner.batch_size, kind, ", activation checkpointing" if fit.checkpointing else "",
                budget / 2**30)
    return fit
