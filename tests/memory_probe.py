"""Measure one training step's memory on the CPU, for tests/unit/test_memory_plan.py (run as a fresh process).

Usage: python tests/memory_probe.py WIDTH LAYERS CONTEXT BATCH OPTIMIZER [ckpt] [vocab=N]. Builds the path and its
optimizer (with activation checkpointing when told), takes a first step (the optimizer allocates its state), resets the
kernel's peak-RSS mark (/proc/self/clear_refs), takes a second step and prints JSON: the anonymous memory the first
step left allocated plus the second step's peak over the RSS at the reset (weights and library code excluded), and
the plan's figures for the same shape."""

from __future__ import annotations

import gc
import json
import sys

import torch

from pathswarm.node.model.model import build_path
from pathswarm.node.train.inner import make_inner_optimizer, train_steps
from pathswarm.node.train.memory import plan_path
from pathswarm.protocol.spec import InnerOptSpec, ModelSpec, SwarmSpec


def rss(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field))


def main() -> None:
    width, layers, ctx, batch = (int(a) for a in sys.argv[1:5])
    torch.set_num_threads(1)
    flags = sys.argv[6:]
    vocab = next((int(f.split("=")[1]) for f in flags if f.startswith("vocab=")), 256)
    spec = SwarmSpec(model=ModelSpec(width=width, n_heads=max(1, width // 64), layers_per_module=layers,
                                     context_len=ctx, vocab_size=vocab),
                     inner=InnerOptSpec(batch_size=batch, optimizer=sys.argv[5]))
    path = spec.path_of_index(0)
    plan = plan_path(spec, path)
    model = build_path(spec, path)
    checkpointing = "ckpt" in flags
    model.set_checkpointing(checkpointing)
    opt = make_inner_optimizer(model, spec.inner)
    x, y = torch.randint(0, vocab, (batch, ctx)), torch.randint(0, vocab, (batch, ctx))
    gc.collect()
    anon_before, file_before = rss("RssAnon:"), rss("RssFile:")
    train_steps(model, opt, lambda: (x, y), spec.inner, 1, 100)
    gc.collect()
    # Only anonymous memory counts: the first step also pages in library code (file-backed, and how much depends on
    # the CPU's kernels), which no plan of tensors should be held to.
    held = rss("RssAnon:") - anon_before  # what the first step left allocated: optimizer state, gradients
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    at_reset = rss("VmRSS:")
    train_steps(model, opt, lambda: (x, y), spec.inner, 1, 101)
    # The second step pages in no new code: its peak over the RSS at the reset is its transient tensors
    print(json.dumps({"measured": held + rss("VmHWM:") - at_reset, "held": held,
                      "library_code": rss("RssFile:") - file_before,
                      "planned": plan.device_bytes(batch, sys.argv[5], checkpointing) - plan.weights}))


if __name__ == "__main__":
    main()
