"""One hostile peer of four: does robust aggregation keep the honest replicas' loss where a clean run ends?

Goal (issue: faults and adversaries): with 1 of 4 DiLoCo workers sending, in turn, 100×-scaled,
sign-flipped, random-noise, all-NaN and wrong-shape outer gradients, the honest workers' routed
validation loss ends within 2 % of a clean run with the same seed.

Every arm runs node/train/simulate.py (the node's worker, codec and group merge: protocol/rounds/merge.py, the
reducer's rule) with 4 workers on one path of BBC News, the same seed and data order. Arms: clean with
the robust rule (the reference), clean with the plain token-weighted mean (what the rule costs when
nobody attacks), each attack alone and all of them in turn under the robust rule, and the first three
attacks under the plain mean (what the rule prevents; NaN and wrong-shape frames are refused by
decoding whatever the rule). The loss is measured on the worker-0 replica (all replicas are identical).

    nice -n 10 .venv/bin/python benchmarks/byzantine.py --json benchmarks/results/byzantine.json
"""

from __future__ import annotations

import time
from pathlib import Path

from _swarm_common import arguments, machine, save_plot, write_json

from pathswarm.node.app.fmt import subplots
from pathswarm.node.app.swarm_init import init_spec
from pathswarm.node.model.data import load_documents
from pathswarm.node.train.simulate import SimConfig, run_simulation
from pathswarm.protocol.spec import AveragingSpec, DataSpec, InnerOptSpec, ModelSpec, SwarmSpec
from tests.attacks import KINDS, attacker

TOLERANCE = 0.02
WORKERS = 4
ATTACKER = WORKERS - 1


def make_spec(docs, width: int, context_len: int, robust: bool) -> SwarmSpec:
    averaging = AveragingSpec() if robust else AveragingSpec(norm_bound=0.0, clip_factor=0.0)
    base = SwarmSpec(name="byzantine", levels=(1,), averaging=averaging,
                     model=ModelSpec(width=width, base_width=64, n_heads=4, layers_per_module=2,
                                     context_len=context_len),
                     inner=InnerOptSpec(batch_size=8, warmup_steps=10), data=DataSpec(corpus="bbc"))
    return init_spec(base, docs)


def run_arm(name: str, spec: SwarmSpec, docs, attack: str, args) -> dict:
    t0 = time.perf_counter()
    cfg = SimConfig(mode="diloco", workers=WORKERS, rounds=args.rounds, inner_steps=args.inner_steps,
                    eval_batches=args.eval_batches, seed=args.seed)
    result = run_simulation(spec, cfg, docs, tamper=attacker(attack, ATTACKER) if attack else None)
    path = result.paths[0]
    row = {"arm": name, "attack": attack or "none", "rule": "robust" if spec.averaging.clip_factor else "plain mean",
           "val_loss_before": result.val_loss_before[path], "val_loss_after": result.val_loss_after[path],
           "val_loss_curve": [r["val_loss"][path] for r in result.rounds], "rejected": result.rejected,
           "replicas_identical": result.replicas_identical, "wall_s": time.perf_counter() - t0}
    print(f"{name:28s} val {row['val_loss_after']:.4f} rejected {row['rejected']:3d} ({row['wall_s']:.0f} s)",
          flush=True)
    return row


def plot(report: dict, path: Path) -> None:
    arms = report["arms"]
    fig, ax = subplots(figsize=(9, 4.2))
    names = [a["arm"] for a in arms]
    ratios = [a["ratio_to_clean"] for a in arms]
    colors = ["tab:green" if a["rule"] == "robust" else "tab:red" for a in arms]
    ax.bar(range(len(arms)), ratios, color=colors)
    ax.axhline(1 + TOLERANCE, color="black", ls="--", lw=1, label="clean + 2 %")
    ax.set_xticks(range(len(arms)), names, rotation=35, ha="right", fontsize=8)
    ax.set_ylabel("final val loss ÷ clean run")
    ax.set_ylim(0.9, min(max(ratios) * 1.05, 3.0))
    ax.set_title("1 hostile worker of 4: robust merge (green) vs plain mean (red)")
    ax.legend()
    save_plot(fig, path)


def main() -> None:
    ap = arguments(__doc__, "byzantine", plot=True)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--context-len", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--inner-steps", type=int, default=20)
    ap.add_argument("--eval-batches", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    t0 = time.perf_counter()
    docs = load_documents(DataSpec(corpus="bbc"))
    robust, plain = (make_spec(docs, args.width, args.context_len, r) for r in (True, False))
    arms = [run_arm("clean", robust, docs, "", args), run_arm("clean, plain mean", plain, docs, "", args)]
    arms += [run_arm(f"{kind}", robust, docs, kind, args) for kind in (*KINDS, "cycle")]
    arms += [run_arm(f"{kind}, plain mean", plain, docs, kind, args) for kind in KINDS[:3]]
    clean = arms[0]["val_loss_after"]
    for a in arms:
        a["ratio_to_clean"] = a["val_loss_after"] / clean
    robust_arms = [a for a in arms if a["rule"] == "robust" and a["attack"] != "none"]
    report = {
        "goal": f"robust arms end within {TOLERANCE:.0%} of the clean run",
        "config": {**vars(args), "workers": WORKERS, "attacker": ATTACKER, "averaging": vars(robust.averaging)},
        "arms": arms,
        "worst_robust_ratio": max(a["ratio_to_clean"] for a in robust_arms),
        "met": all(a["ratio_to_clean"] <= 1 + TOLERANCE for a in robust_arms),
        "wall_s": time.perf_counter() - t0, "machine": machine(),
    }
    write_json(args.json, report)
    plot(report, Path(args.plot))
    print(f"worst robust arm: {report['worst_robust_ratio']:.4f} × clean; goal met: {report['met']}")


if __name__ == "__main__":
    main()
