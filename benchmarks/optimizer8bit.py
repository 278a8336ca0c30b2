"""The 8-bit inner optimizer against AdamW on the default spec's path, on this machine's CPU (issue 19).

Both arms train the same path from the same seed on the same batches for --steps inner steps (the node's own inner
loop, node/train/worker.py), one torch thread each, one after the other. Reported: optimizer state bytes per
parameter (every tensor of the state: moments, bitsandbytes' quantisation maps and block scales), the mean training
loss of the last 20 steps, and seconds per step. On a CUDA machine the same comparison runs in
benchmarks/gpu_check.sh (not written yet).

    .venv/bin/python benchmarks/optimizer8bit.py          # ≈ 1 min on one core

Goals (issue 19): 8-bit state ≤ 0.3× AdamW's bytes; training loss within 1 % of AdamW's.
"""

from __future__ import annotations

import time

import torch
from _swarm_common import arguments, machine, write_json

from pathswarm.node.model.data import TokenSampler, load_documents, split
from pathswarm.node.train.inner import optimizer_state_bytes
from pathswarm.node.train.worker import PathWorker
from pathswarm.protocol.spec import SwarmSpec


def arm(spec: SwarmSpec, train, kind: str, steps: int, seed: int) -> dict:
    torch.manual_seed(seed)
    sampler = TokenSampler(train, spec.model.context_len, seed=seed)
    worker = PathWorker(spec, spec.path_of_index(0), lambda: sampler.sample(spec.inner.batch_size), optimizer=kind)
    t0 = time.perf_counter()
    losses = worker.train_inner(steps).losses
    seconds = time.perf_counter() - t0
    params = sum(p.numel() for p in worker.model.parameters())
    state = optimizer_state_bytes(worker.opt)
    return {"optimizer": kind, "params": params, "state_bytes": state, "state_bytes_per_param": state / params,
            "final_train_loss": sum(losses[-20:]) / 20, "curve": losses[::10], "s_per_step": seconds / steps}


def main() -> None:
    ap = arguments(__doc__, "optimizer8bit")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    spec = SwarmSpec()
    train, _ = split(load_documents(spec.data), spec.data.val_fraction)
    arms = [arm(spec, train, kind, args.steps, args.seed) for kind in ("adamw", "adamw8bit")]
    full, small = arms
    ratio, loss = small["state_bytes"] / full["state_bytes"], small["final_train_loss"] / full["final_train_loss"]
    for a in arms:
        print(f"{a['optimizer']:10s} state {a['state_bytes_per_param']:.3f} B/param  loss {a['final_train_loss']:.4f}"
              f"  {a['s_per_step'] * 1e3:.0f} ms/step")
    write_json(args.json, {
        "claim": "AdamW8bit: optimizer state <= 0.3x AdamW's bytes, training loss within 1 % (default spec, CPU)",
        "config": {"steps": args.steps, "seed": args.seed, "width": spec.model.width,
                   "batch_size": spec.inner.batch_size, "context_len": spec.model.context_len, "device": "cpu"},
        "arms": arms,
        "goals": {"state_ratio": {"value": ratio, "goal": 0.3, "met": ratio <= 0.3},
                  "loss_ratio": {"value": loss, "goal": 1.01, "met": abs(loss - 1) <= 0.01}},
        "machine": machine()})


if __name__ == "__main__":
    main()
