"""vs_peers' `lan` goal from the algorithm's side: does DiLoCo reach synchronous training's loss in as many tokens?

vs_peers.py on `lan` compares pathswarm's time to DDP's final loss with DDP's own; at H = 100 pathswarm ends far
above it (2.05 against 1.74 at 1,200 steps). This runs the same model (vs_peers.py `make_spec`: width 128, 2 layers,
context 64, batch 8), the same data and 8 workers in node/train/simulate.py, whose round is the node's own (int8 +
zstd, error feedback, outer Nesterov), without a network: `sync` (the 8 workers' gradients averaged every step,
as DDP does) and DiLoCo at each H of --inner-steps, the same --steps inner steps per worker. Each result lands
before the next inner step here; a live decoupled node applies it a round later, so this is DiLoCo's best case.
Curves of held-out loss against steps, and each H's steps to sync's final loss (by the curve; None if not reached).
--outer adds, for each H, arms with other outer learning rates and momenta than the spec's (0.7, 0.9), to see
whether the gap at small H is the outer step's tuning. --overlap runs each arm at each of the given shares of the
simulator's `overlap`: a round's mean applied after that share of the next H steps (1: after all of them, the latest
a decoupled node applies it; 0: before them, DiLoCo's own schedule).

    nice -n 10 .venv/bin/python benchmarks/lan_h_sweep.py        # ≈ 9 min on 2 cores
    nice -n 10 .venv/bin/python benchmarks/lan_h_sweep.py --inner-steps 25 --outer 0.7/0.9,1.0/0.9,0.5/0.8
    nice -n 10 .venv/bin/python benchmarks/lan_h_sweep.py --inner-steps 10 --overlap 0,0.5,1
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
import types
from multiprocessing import Pool
from pathlib import Path

import torch
from _swarm_common import arguments, machine, write_json
from vs_peers import make_spec, time_to

from pathswarm.node.model.data import load_documents
from pathswarm.node.train.simulate import SimConfig, run_simulation

WORKERS = 8
SYNC_EVAL_EVERY = 100


def run_arm(job: dict) -> dict:
    torch.set_num_threads(1)
    a, h, outer, overlap = types.SimpleNamespace(**job["args"]), job["h"], job.get("outer"), job.get("overlap", 0.0)
    eager = bool(job.get("eager"))
    with tempfile.TemporaryDirectory(prefix="lan-h-") as tmp:
        spec, _ = make_spec(Path(tmp), a)
    if outer:
        spec = spec.replace(outer=dataclasses.replace(spec.outer, lr=outer[0], momentum=outer[1]))
    if eager:
        spec = spec.replace(outer=dataclasses.replace(spec.outer, eager=True))
    every = SYNC_EVAL_EVERY if h == 0 else h
    cfg = SimConfig(mode="sync" if h == 0 else "diloco", workers=WORKERS, rounds=a.steps // every, inner_steps=every,
                    eval_batches=a.eval_batches, seed=0, overlap=overlap)
    t0 = time.perf_counter()
    res = run_simulation(spec, cfg, docs=load_documents(spec.data))
    curve = [{"steps": r["round"] * every, "val_loss": r["val_loss"]["all"]} for r in res.rounds]
    name = "sync" if h == 0 else f"diloco H={h}" + (f" outer {outer[0]}/{outer[1]}" if outer else "") \
        + (f" overlap {overlap:g}" if overlap else "") + (" eager" if eager else "")
    arm = {"arm": name, "inner_steps": h or 1, "outer_lr": spec.outer.lr, "outer_momentum": spec.outer.momentum,
           "overlap": overlap, "eager": eager,
           "curve": curve,
           "final_val_loss": curve[-1]["val_loss"], "wall_s": time.perf_counter() - t0}
    print(f"{arm['arm']:28s} final {arm['final_val_loss']:.4f} ({arm['wall_s']:.0f} s)", flush=True)
    return arm


def main() -> None:
    ap = arguments(__doc__, "lan_h_sweep")
    ap.add_argument("--inner-steps", default="10,25,50", help="comma-separated H values")
    ap.add_argument("--outer", default="", help="comma-separated LR/MOMENTUM pairs of the outer step, each run at "
                    "every H (empty: the spec's only)")
    ap.add_argument("--overlap", default="0", help="comma-separated shares of the next round's H steps trained "
                    "before a round's mean lands, each run at every H (0: DiLoCo's schedule; 1: a decoupled node's "
                    "latest)")
    ap.add_argument("--eager", action="store_true", help="overlapped arms (overlap > 0) with eager updates "
                    "(the spec's [outer] eager: node/train/round.py eager_shift)")
    ap.add_argument("--steps", type=int, default=1200, help="inner steps per worker (vs_peers.py's --steps)")
    ap.add_argument("--eval-batches", type=int, default=32, help="held-out batches at each curve point")
    ap.add_argument("--jobs", type=int, default=2, help="arms run at once (one torch thread each)")
    a = ap.parse_args()
    args = {"width": 128, "layers": 2, "context_len": 64, "batch_size": 8, "inner_steps": 100, "grace_s": 30.0,
            "nodes": WORKERS, "steps": a.steps, "eval_batches": a.eval_batches}
    try:
        outers = [tuple(float(v) for v in pair.split("/")) for pair in a.outer.split(",") if pair] or [None]
        if any(o is not None and (len(o) != 2 or o[0] <= 0 or not 0 <= o[1] < 1) for o in outers):
            raise ValueError
    except ValueError:
        ap.error(f"--outer takes LR/MOMENTUM pairs with LR > 0 and 0 <= MOMENTUM < 1, got {a.outer!r}")
    try:
        overlaps = [float(x) for x in a.overlap.split(",")]
        if not overlaps or any(not 0 <= x <= 1 for x in overlaps):
            raise ValueError
    except ValueError:
        ap.error(f"--overlap takes shares in [0, 1], got {a.overlap!r}")
    jobs = [{"args": args, "h": 0}] + [{"args": args, "h": int(h), "outer": o, "overlap": ov,
                                        "eager": a.eager and ov > 0}
                                       for h in a.inner_steps.split(",") for o in outers for ov in overlaps]
    with Pool(a.jobs) as pool:
        arms = pool.map(run_arm, jobs, chunksize=1)
    sync = arms[0]
    for arm in arms[1:]:
        # vs_peers' time_to on steps instead of seconds (linear between points, None if never reached)
        arm["steps_to_sync_final"] = time_to([{"t": c["steps"], "val_loss": c["val_loss"]} for c in arm["curve"]],
                                             sync["final_val_loss"])
        arm["over_sync"] = arm["final_val_loss"] / sync["final_val_loss"]
    write_json(a.json, {"claim": "DiLoCo at small H against synchronous training, 8 workers, vs_peers' model",
                        "machine": machine(), "config": args | {"workers": WORKERS}, "arms": arms})


if __name__ == "__main__":
    main()
