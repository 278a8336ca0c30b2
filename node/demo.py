"""`pathswarm demo`: the README's main job.

Today it is a short simulated 2x2 DiPaCo swarm on the BBC News corpus (in one process, the same
training code a node runs): create the spec and fit the router, train every path with DiLoCo rounds,
print a summary, write JSON and a loss plot, and leave a checkpoint that `pathswarm eval` and
`pathswarm generate` read. The networked local swarm replaces the simulator here once nodes exist.
"""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console

from pathswarm.node.data import load_documents
from pathswarm.node.progress import run_with_progress
from pathswarm.node.simulate import SimConfig, SimResult
from pathswarm.node.swarm_init import format_init_report, init_spec
from pathswarm.protocol.spec import InnerOptSpec, SwarmSpec


def plot_losses(result: SimResult, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    rounds = [0] + [r["round"] for r in result.rounds]
    for p in [*result.paths, "all"]:
        ys = [result.val_loss_before[p]] + [r["val_loss"][p] for r in result.rounds]
        ax.plot(rounds, ys, marker="o", label=f"path {p}" if p != "all" else "all (routed)",
                linewidth=2.5 if p == "all" else 1.2)
    ax.set_xlabel("outer round")
    ax.set_ylabel("routed validation loss (nats/byte)")
    ax.set_title(f"pathswarm demo: {result.mode}, {result.workers} workers, H={result.inner_steps}")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_demo(rounds: int, inner_steps: int, out_dir: Path, json_path: Path | None = None,
             plot_path: Path | None = None) -> SimResult:
    console = Console(stderr=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    base = SwarmSpec(name="pathswarm-demo", inner=InnerOptSpec(steps=inner_steps))
    docs = load_documents(base.data)
    spec = init_spec(base, docs)
    spec_path = out_dir / "swarm.toml"
    spec_path.write_text(spec.to_toml(), encoding="utf-8")
    console.print(format_init_report(spec, docs))
    cfg = SimConfig(mode="dipaco", rounds=rounds, inner_steps=inner_steps, checkpoint_dir=str(out_dir / "checkpoint"))
    result = run_with_progress(spec, cfg, console)
    json_path = json_path or out_dir / "demo.json"
    plot_path = plot_path or out_dir / "demo.png"
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps({**result.to_json(), "rounds_completed": len(result.rounds)}, indent=1),
                         encoding="utf-8")
    plot_losses(result, plot_path)
    console.print(f"spec {spec_path} · checkpoint {out_dir / 'checkpoint'} · JSON {json_path} · plot {plot_path}")
    console.print(f"next: pathswarm eval --spec {spec_path} --checkpoint {out_dir / 'checkpoint'}")
    return result
