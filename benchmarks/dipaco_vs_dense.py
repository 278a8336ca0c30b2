"""DiPaCo vs dense at small scale: 2x2 and 2x4 swarms of routed paths against dense models on BBC News.

Claim (DiPaCo, arXiv 2403.10616): routed paths reach a lower validation loss than a dense model of one
path's size trained on all documents with the same per-path compute; the paper also compares with a
dense model as large as the whole swarm. Arms (all in node/train/simulate.py, same width, data and seeds):

- dipaco: levels 2x2 (4 paths: shared module + one module per level), one worker per path, each on the
  documents the router sends to it, H inner AdamW steps then the node's outer round (node/train/round.py: int8 +
  zstd, error feedback, robust mean, outer Nesterov after `[outer] warmup_rounds` of plain averaging);
- dipaco-warm: the 2x2 swarm from a warm start, as the DiPaCo paper starts its paths from a pre-trained dense
  model: node/train/warm_start.py trains round 0 of every module for --warm-start-steps synchronous steps at the
  swarm's global batch (4 paths × batch; what `swarm init --warm-start-steps` does), then the swarm trains the
  remaining rounds: the same tokens as every other arm; its spec starts the outer Nesterov at once;
- dipaco-2x4: levels 2x4 (8 paths, its own router), the same per-path compute: the trend with more paths;
- dense-path: a dense model of exactly one path's size (levels 1x1, same modules) trained with plain
  AdamW on all documents for the same steps × batch as each DiPaCo path (same per-path compute);
- dense-path-diloco: the same model trained with the same DiLoCo optimiser as the paths (1 worker: H
  inner steps, then the outer Nesterov step), to separate the optimiser's effect from routing's;
- dense-large: a dense model with the swarm's total parameter count (levels 1x1, twice the layers per
  module: shared + 4 modules' worth of blocks), synchronous data-parallel over 4 workers for the same
  steps, so it sees the same tokens as the whole swarm (at ≈ 1.9× the swarm's FLOPs: a generous upper
  reference, not a same-compute one). It is the 2x2 swarm's size; the 2x4 swarm holds 1.5× its blocks (a dense
  model of that size, 8 workers, would take longer than the whole benchmark: not run).

Every arm is scored on the same windows: the whole validation split, grouped by (topic, routed path);
a DiPaCo document is scored by the path the router picks for it, a dense one by the dense model.

    nice -n 10 .venv/bin/python benchmarks/dipaco_vs_dense.py    # ≈ 20 min on 2 cores (--jobs 2)

Defaults: H = 25 and outer lr 0.5, what `swarm init` gives a grid (node/app/swarm_init.py `round_defaults`);
`--inner-steps 50 --rounds 40` is the setting of the previous runs.

Goals (issue 16): DiPaCo 2x2 ≥ 10 % below dense-path and within 3 % of dense-large; the larger grid closer.
"""

from __future__ import annotations

import dataclasses
import json
import random
import tempfile
import time
from multiprocessing import Pool
from pathlib import Path

import torch
from _swarm_common import arguments, machine, read_json, save_plot, write_json

from pathswarm.node.app.fmt import subplots
from pathswarm.node.app.swarm_init import init_spec, round_defaults
from pathswarm.node.model.data import Document, TokenSampler, load_documents, split
from pathswarm.node.model.model import count_module_params, path_param_count
from pathswarm.node.model.router import assignment_table, documents_by_path
from pathswarm.node.train.checkpoint import load_checkpoint
from pathswarm.node.train.evaluate import model_from_checkpoint
from pathswarm.node.train.inner import evaluate_loss
from pathswarm.node.train.simulate import SimConfig, run_simulation
from pathswarm.node.train.warm_start import warm_started
from pathswarm.protocol.spec import DataSpec, InnerOptSpec, ModelSpec, OuterOptSpec, SwarmSpec, format_path

EVAL_BATCH = 32


def make_spec(docs: list[Document], levels: tuple[int, ...], layers: int, args) -> SwarmSpec:
    base = SwarmSpec(name=f"dipaco-vs-dense-{'x'.join(map(str, levels))}-l{layers}", levels=levels,
                     model=ModelSpec(width=args.width, base_width=64, n_heads=4, layers_per_module=layers,
                                     context_len=args.context_len),
                     inner=InnerOptSpec(batch_size=args.batch_size, steps=args.inner_steps),
                     outer=OuterOptSpec(lr=args.outer_lr),
                     data=DataSpec(corpus="bbc"))
    return init_spec(base, docs)


def eval_groups(swarm: SwarmSpec, val: list[Document]) -> dict[tuple[str, tuple[int, ...]], list]:
    """(topic, routed path of the swarm) → fixed validation batches covering all of those documents."""
    groups: dict[tuple[str, tuple[int, ...]], list[Document]] = {}
    for path, docs in documents_by_path(swarm, val).items():
        for d in docs:
            groups.setdefault((d.label, path), []).append(d)
    ctx = swarm.model.context_len
    return {key: list(TokenSampler(docs, ctx).eval_batches(EVAL_BATCH, 10**6)) for key, docs in sorted(groups.items())}


def score(spec: SwarmSpec, checkpoint_dir: str, groups: dict, routed: bool) -> dict:
    """Loss per topic and overall (token-weighted) on the fixed groups; routed: each group by its path."""
    ckpt = load_checkpoint(checkpoint_dir, spec)
    models = {}
    per_topic: dict[str, list[float]] = {}
    for (topic, path), batches in groups.items():
        key = path if routed else spec.path_of_index(0)
        if key not in models:
            models[key] = model_from_checkpoint(spec, ckpt, key)
        loss, n = evaluate_loss(models[key], batches)
        acc = per_topic.setdefault(topic, [0.0, 0])
        acc[0] += loss * n
        acc[1] += n
    total = sum(v[0] for v in per_topic.values())
    tokens = sum(v[1] for v in per_topic.values())
    return {"all": total / tokens, "tokens": tokens,
            "per_topic": {t: v[0] / v[1] for t, v in sorted(per_topic.items())}}


def run_arm(name: str, spec: SwarmSpec, cfg: SimConfig, docs: list[Document], groups: dict, routed: bool,
            warm_start_steps: int = 0) -> dict:
    """One arm. With `warm_start_steps` (a multiple of H), round 0 is that many synchronous steps at the swarm's
    global batch, and the swarm trains the rounds left: the same tokens as the arms without it."""
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    init, warm_tokens, warm_rounds = None, 0, 0
    if warm_start_steps:
        batch = spec.n_paths * spec.inner.batch_size
        spec, init = warm_started(spec, docs, warm_start_steps, batch_size=batch, seed=1000 + cfg.seed)
        warm_tokens = warm_start_steps * batch * spec.model.context_len
        warm_rounds = warm_start_steps // cfg.inner_steps
        cfg = dataclasses.replace(cfg, rounds=cfg.rounds - warm_rounds)
    with tempfile.TemporaryDirectory() as ckpt:
        res = run_simulation(spec, dataclasses.replace(cfg, checkpoint_dir=ckpt), docs=docs, init_weights=init)
        final = score(spec, ckpt, groups, routed)
    steps_per_point = res.inner_steps
    curve = [{"inner_steps": warm_start_steps, "tokens": warm_tokens, "val_loss": res.val_loss_before["all"]}]
    curve += [{"inner_steps": warm_start_steps + r["round"] * steps_per_point, "tokens": warm_tokens + r["tokens"],
               "val_loss": r["val_loss"]["all"]} for r in res.rounds]
    params_held = sum(count_module_params(spec).values())
    print(f"{name:18s} val {final['all']:.4f}  " + " ".join(f"{t} {v:.3f}" for t, v in final["per_topic"].items())
          + f"  ({res.wall_s:.0f} s)", flush=True)
    return {"name": name, "mode": cfg.mode, "workers": res.workers, "levels": list(spec.levels),
            "layers_per_module": spec.model.layers_per_module, "params_per_path": path_param_count(spec),
            "params_total": params_held, "warm_start_steps": warm_start_steps,
            "inner_steps_per_worker": warm_start_steps + cfg.rounds * res.inner_steps,
            "tokens": warm_tokens + res.tokens_total, "final_val_loss": final["all"],
            "final_eval_tokens": final["tokens"],
            "per_topic": final["per_topic"], "curve": curve, "curve_eval_batches": cfg.eval_batches,
            "bytes_sent": res.bytes_sent_total, "bytes_up": res.bytes_up_total, "bytes_down": res.bytes_down_total,
            "rounds": len(res.rounds), "inner_s": res.inner_s, "round_s": res.round_s,
            "wall_s": time.perf_counter() - t0}


def plot(result: dict, path: Path) -> None:
    arms = result["arms"]
    colors = {"dipaco": "tab:red", "dipaco-warm": "tab:purple", "dipaco-2x4": "tab:orange", "dense-path": "tab:blue",
              "dense-path-diloco": "tab:cyan", "dense-large": "black"}
    fig, (ax, bx) = subplots(1, 2, figsize=(12, 4.4))
    for arm in arms:
        ax.plot([p["inner_steps"] for p in arm["curve"]], [p["val_loss"] for p in arm["curve"]], "-",
                color=colors.get(arm["name"]), label=f"{arm['name']} ({arm['params_total'] / 1e3:.0f}k params)")
    lo = min(p["val_loss"] for a in arms for p in a["curve"])
    ax.set_ylim(lo - 0.05, lo + 1.0)
    ax.set_xlabel("inner steps per worker")
    ax.set_ylabel("validation loss (nats/byte)")
    ax.set_title("loss curves (subset of validation windows)")
    ax.grid(alpha=0.3)
    ax.legend()
    topics = list(arms[0]["per_topic"]) + ["all"]
    width = 0.8 / len(arms)
    for i, arm in enumerate(arms):
        vals = [arm["per_topic"][t] for t in topics[:-1]] + [arm["final_val_loss"]]
        bx.bar([j + i * width for j in range(len(topics))], vals, width, color=colors.get(arm["name"]),
               label=arm["name"])
    finals = [v for a in arms for v in list(a["per_topic"].values()) + [a["final_val_loss"]]]
    bx.set_ylim(min(finals) - 0.1, max(finals) + 0.3)
    bx.set_xticks([j + width * (len(arms) - 1) / 2 for j in range(len(topics))], topics, rotation=15)
    bx.set_ylabel("final validation loss (nats/byte)")
    bx.set_title("final loss per topic, whole validation split")
    bx.legend(fontsize=8, ncol=2, loc="upper center")
    fig.suptitle("DiPaCo routed paths (2x2, 2x4) vs dense models on BBC News")
    save_plot(fig, path)


def main() -> None:
    ap = arguments(__doc__, "dipaco_vs_dense", plot=True, replot=True)
    grid_h, grid_lr = round_defaults((2, 2))
    ap.add_argument("--rounds", type=int, default=2000 // grid_h, help="outer rounds (2,000 inner steps per worker)")
    ap.add_argument("--inner-steps", type=int, default=grid_h, help="H (default: what `swarm init` gives a grid)")
    ap.add_argument("--outer-lr", type=float, default=grid_lr,
                    help="outer Nesterov lr of the local-SGD arms (default: what `swarm init` gives a grid)")
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--layers", type=int, default=1, help="blocks per level module of the swarm")
    ap.add_argument("--context-len", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--eval-batches", type=int, default=8, help="curve: validation batches per path and round")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=2, help="arms run at once (one torch thread each)")
    ap.add_argument("--warm-start-steps", type=int, default=300, help="dipaco-warm: synchronous steps of round 0 "
                    "(a multiple of H)")
    ap.add_argument("--arms", default="dipaco,dipaco-warm,dipaco-2x4,dense-path,dense-path-diloco,dense-large")
    args = ap.parse_args()
    if args.replot:
        return plot(read_json(args.json), Path(args.plot))
    if "dipaco-warm" in args.arms.split(",") and (
            args.warm_start_steps % args.inner_steps or not 0 < args.warm_start_steps < args.rounds * args.inner_steps):
        ap.error("--warm-start-steps must be a positive multiple of --inner-steps, below the whole run's steps")
    t0 = time.perf_counter()
    docs = load_documents(DataSpec(corpus="bbc"))
    random.Random(0).shuffle(docs)  # topic-sorted corpus; curve windows are read from the stream's start
    swarm = make_spec(docs, (2, 2), args.layers, args)
    swarm8 = make_spec(docs, (2, 4), args.layers, args)
    path_dense = make_spec(docs, (1, 1), args.layers, args)
    large_dense = make_spec(docs, (1, 1), 2 * args.layers, args)
    train, val = split(docs, swarm.data.val_fraction)
    groups = eval_groups(swarm, val)
    groups8 = eval_groups(swarm8, val)  # the same documents, by the 2x4 router's paths
    common = dict(rounds=args.rounds, inner_steps=args.inner_steps, seed=args.seed)
    arms_cfg = {
        "dipaco": (swarm, SimConfig(mode="dipaco", eval_batches=args.eval_batches, **common), True),
        "dipaco-warm": (swarm, SimConfig(mode="dipaco", eval_batches=args.eval_batches, **common), True),
        "dipaco-2x4": (swarm8, SimConfig(mode="dipaco", eval_batches=args.eval_batches, **common), True),
        "dense-path": (path_dense, SimConfig(mode="sync", workers=1, eval_batches=4 * args.eval_batches, **common),
                       False),
        "dense-path-diloco": (path_dense, SimConfig(mode="diloco", workers=1, eval_batches=4 * args.eval_batches,
                                                    **common), False),
        "dense-large": (large_dense, SimConfig(mode="sync", workers=swarm.n_paths,
                                               eval_batches=4 * args.eval_batches, **common), False),
    }
    names = args.arms.split(",")
    jobs = [(name, *arms_cfg[name][:2], docs, groups8 if name == "dipaco-2x4" else groups, arms_cfg[name][2],
             args.warm_start_steps if name == "dipaco-warm" else 0) for name in names]
    with Pool(args.jobs) as pool:
        arms = pool.starmap(run_arm, jobs, chunksize=1)
    by = {a["name"]: a for a in arms}
    summary = {}
    if "dipaco" in by and "dense-path" in by:
        summary["dipaco_vs_dense_path"] = by["dipaco"]["final_val_loss"] / by["dense-path"]["final_val_loss"]
    if "dipaco" in by and "dense-path-diloco" in by:
        summary["dipaco_vs_dense_path_diloco"] = (by["dipaco"]["final_val_loss"]
                                                  / by["dense-path-diloco"]["final_val_loss"])
    if "dipaco" in by and "dense-large" in by and "dense-path" in by:
        d, a, b = (by[k]["final_val_loss"] for k in ("dipaco", "dense-path", "dense-large"))
        summary["dipaco_vs_dense_large"] = d / b
        # 0: DiPaCo no better than the path-size dense model; 1: as good as the large one.
        summary["gap_closed_to_large"] = (a - d) / (a - b) if a != b else None
    if "dipaco-warm" in by and "dense-large" in by:
        summary["dipaco_warm_vs_dense_large"] = (by["dipaco-warm"]["final_val_loss"]
                                                 / by["dense-large"]["final_val_loss"])
    if "dipaco-2x4" in by and "dense-path" in by:
        summary["dipaco_2x4_vs_dense_path"] = by["dipaco-2x4"]["final_val_loss"] / by["dense-path"]["final_val_loss"]
    if "dipaco-2x4" in by and "dense-large" in by:
        summary["dipaco_2x4_vs_dense_large"] = (by["dipaco-2x4"]["final_val_loss"]
                                                / by["dense-large"]["final_val_loss"])
    summary["goals"] = {
        "dipaco_2x2_vs_dense_path <= 0.90": summary.get("dipaco_vs_dense_path", 9) <= 0.90,
        "dipaco_2x2_vs_dense_large <= 1.03": summary.get("dipaco_vs_dense_large", 9) <= 1.03,
        "2x4 closer to dense-large than 2x2": (summary.get("dipaco_2x4_vs_dense_large", 9)
                                               < summary.get("dipaco_vs_dense_large", 0)),
    }
    routing = assignment_table(val, swarm.router, swarm)
    result = {
        "claim": "DiPaCo routed paths beat a dense model of one path's size trained on all documents with the "
                 "same per-path compute; how close they come to a dense model of the whole swarm's size",
        "config": {"levels": list(swarm.levels), "width": args.width, "layers_per_module": args.layers,
                   "context_len": args.context_len, "batch_size": args.batch_size, "rounds": args.rounds,
                   "inner_steps": args.inner_steps, "inner_lr": swarm.inner.lr, "outer_lr": swarm.outer.lr,
                   "outer_momentum": swarm.outer.momentum, "outer_warmup_rounds": swarm.outer.warmup_rounds,
                   "readout_init": "N(0, init_std) x 1/width_mult", "seed": args.seed, "corpus": "bbc",
                   "train_docs": len(train), "val_docs": len(val),
                   "eval": "whole validation split, grouped by (topic, routed path); same windows for every arm"},
        "routing_val": {"purity": routing["purity"],
                        "paths": {format_path(p["path"]): p["labels"] for p in routing["paths"]}},
        "arms": arms, "summary": summary,
        "reproduced": bool(summary.get("dipaco_vs_dense_path", 2) < 1),
        "wall_s": time.perf_counter() - t0,
        "machine": machine(),
    }
    write_json(args.json, result)
    print(json.dumps(summary, indent=1))
    plot(result, Path(args.plot))


if __name__ == "__main__":
    main()
