"""GPU figures for issue 19 on one CUDA device (run by benchmarks/gpu_check.sh; a few minutes).

1. Inner-step speed, tokens/s: fp32, fp32 with TF32 matmuls, bf16 autocast (the node's default on CUDA), on the
   default spec's path and a ~100M-parameter path.
2. Peak memory of a training step (torch.cuda.max_memory_allocated) with AdamW vs AdamW8bit, against the memory plan
   (node/train/memory.py, which counts fp32 activations: bf16 autocast needs less).
3. A 2-node swarm on loopback, one node on CUDA and one on the CPU, training the same path for 3 rounds: every module
   digest both recorded for a round must agree (the outer state is fp32 on the CPU whatever the device).

Without a CUDA device it says so and exits 0 (writing nothing).

    python benchmarks/gpu.py --json benchmarks/results/gpu.json
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import torch
from _swarm_common import arguments, machine, write_json, write_spec

from pathswarm.node.model.data import TokenSampler, load_documents, split
from pathswarm.node.train import inner
from pathswarm.node.train.inner import optimizer_state_bytes
from pathswarm.node.train.memory import plan_path
from pathswarm.node.train.worker import PathWorker
from pathswarm.protocol.spec import ModelSpec, SwarmSpec

LARGE = ModelSpec(width=1024, n_heads=16, layers_per_module=4, context_len=512)
"""About 100M parameters per path: the shared module and two level modules of 4 blocks at width 1024."""


def worker(spec: SwarmSpec, train, optimizer: str = "adamw") -> PathWorker:
    sampler = TokenSampler(train, spec.model.context_len, seed=0)
    return PathWorker(spec, spec.path_of_index(0), lambda: sampler.sample(spec.inner.batch_size), device="cuda",
                      optimizer=optimizer)


def speed(spec: SwarmSpec, train, mode: str, steps: int) -> dict:
    inner.AUTOCAST_BF16 = mode == "bf16"
    torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"
    w = worker(spec, train)
    w.train_inner(3)  # warm-up: kernels, allocator
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    stats = w.train_inner(steps)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    inner.AUTOCAST_BF16, torch.backends.cuda.matmul.allow_tf32 = True, False
    return {"mode": mode, "tokens_per_s": stats.tokens / seconds, "final_loss": stats.losses[-1]}


def memory(spec: SwarmSpec, train, optimizer: str) -> dict:
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    w = worker(spec, train, optimizer)
    w.train_inner(3)
    peak = torch.cuda.max_memory_allocated()
    plan = plan_path(spec, spec.path_of_index(0))
    out = {"optimizer": optimizer, "params": plan.params, "peak_bytes": peak,
           "optimizer_state_bytes": optimizer_state_bytes(w.opt),
           "planned_peak_bytes": plan.device_bytes(spec.inner.batch_size, optimizer)}
    del w
    return out


def swarm(rounds: int) -> dict:
    from pathswarm.node.app.local_swarm import LocalSwarm
    from pathswarm.node.app.replicas import check_replicas

    with tempfile.TemporaryDirectory() as tmp:
        _, spec_path = write_spec(Path(tmp), 20, name="gpu-check")
        with LocalSwarm(spec_path, Path(tmp) / "swarm") as s:
            s.start_bootstrap()
            for name, device in (("gpu", "cuda"), ("cpu", "cpu")):
                s.start_node(name, path="0.0", max_rounds=rounds, extra=["--wait-peers", "2", "--device", device])
            codes = s.wait_nodes(["gpu", "cpu"], timeout_s=600)
            statuses = {n: s.status(n) for n in ("gpu", "cpu")}
    check = check_replicas(statuses)
    return {"exit_codes": codes, "rounds": {n: st["round"] for n, st in statuses.items()},
            "replicas_identical": check.identical, "digests_compared": check.digests_compared}


def main() -> None:
    ap = arguments(__doc__, "gpu")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device on this machine: nothing to measure")
        sys.exit(0)
    default = SwarmSpec()
    large = SwarmSpec(model=LARGE)
    train, _ = split(load_documents(default.data), default.data.val_fraction)
    result = {"device": torch.cuda.get_device_name(0), "bf16": torch.cuda.is_bf16_supported(), "speed": {},
              "memory": {}}
    for name, spec in (("default", default), ("large", large)):
        result["speed"][name] = [speed(spec, train, mode, args.steps) for mode in ("fp32", "tf32", "bf16")]
        result["memory"][name] = [memory(spec, train, kind) for kind in ("adamw", "adamw8bit")]
        print(name, result["speed"][name], result["memory"][name], flush=True)
    result["swarm"] = swarm(args.rounds)
    fp32, bf16 = (next(r for r in result["speed"]["large"] if r["mode"] == m) for m in ("fp32", "bf16"))
    a, b = result["memory"]["large"]
    result["summary"] = {"bf16_speedup_large": bf16["tokens_per_s"] / fp32["tokens_per_s"],
                         "state_ratio_8bit_large": b["optimizer_state_bytes"] / a["optimizer_state_bytes"],
                         "peak_within_plan_large": a["peak_bytes"] <= a["planned_peak_bytes"] * 1.25,
                         "replicas_identical_cuda_and_cpu": result["swarm"]["replicas_identical"]}
    result["machine"] = machine()
    print(result["summary"])
    write_json(args.json, result)


if __name__ == "__main__":
    main()
