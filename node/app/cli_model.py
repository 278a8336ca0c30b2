"""`pathswarm simulate`, `demo`, `eval` and `generate`: train, score or sample the model in this process.

`simulate` runs the training algorithm without networking (node/train/simulate.py), `demo` the README's
quickstart (node/app/demo.py), `eval` and `generate` read a checkpoint (node/train/evaluate.py).
"""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from pathswarm.node.app.cli_common import friendly, load_spec_option, write_json
from pathswarm.protocol.spec import format_path

# The simulator, the demo, checkpoints and evaluation are imported inside the commands that need them, after the
# checks of their options and spec, so that `pathswarm --help` and a mistyped option or path answer at once: they
# import torch, ~1.8 s (python -X importtime, on top of what `--help` loads).


@click.command()
@click.option("--spec", "spec_path", required=True, type=click.Path(dir_okay=False), help="Swarm spec (TOML).")
@click.option("--mode", type=click.Choice(["dipaco", "diloco", "sync"]), default="dipaco", show_default=True,
              help="dipaco: one worker per path on routed data; diloco: N replicas of one path; "
                   "sync: data-parallel baseline with gradients averaged every step.")
@click.option("--workers", type=int, default=0, help="Workers (default: one per path for dipaco, 4 otherwise).")
@click.option("--rounds", type=int, default=5, show_default=True, help="Outer rounds.")
@click.option("--inner-steps", type=int, default=0, help="H inner steps per round (default: the spec's).")
@click.option("--lr", type=float, default=0.0, help="Override the spec's inner learning rate.")
@click.option("--eval-batches", type=int, default=8, show_default=True, help="Validation batches per path.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the workers' data streams.")
@click.option("--overlap", type=click.FloatRange(0.0, 1.0), default=0.0, show_default=True,
              help="dipaco/diloco: share of the next round's inner steps trained before a round's mean is applied, "
                   "as on a decoupled node whose round is in flight meanwhile (0: before the next step; 1: after all "
                   "of them).")
@click.option("--checkpoint-dir", type=click.Path(file_okay=False), default=None,
              help="Write the final modules here (readable by eval and generate).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="Write per-round losses, tokens and bytes as JSON.")
@friendly
def simulate(spec_path: str, mode: str, workers: int, rounds: int, inner_steps: int, lr: float, eval_batches: int,
             seed: int, overlap: float, checkpoint_dir: str | None, json_path: str | None) -> None:
    """Run the whole training algorithm in one process, without networking."""
    spec = load_spec_option(spec_path)
    from pathswarm.node.app.progress import run_with_progress
    from pathswarm.node.train.simulate import SimConfig

    cfg = SimConfig(mode=mode, workers=workers, rounds=rounds, inner_steps=inner_steps, lr=lr,
                    eval_batches=eval_batches, seed=seed, overlap=overlap, checkpoint_dir=checkpoint_dir or "")
    result = run_with_progress(spec, cfg)
    write_json(json_path, result.to_json())



@click.command()
@click.option("--nodes", type=int, default=4, show_default=True, help="Node processes to start (one per path of 2x2).")
@click.option("--rounds", type=int, default=4, show_default=True, help="Outer rounds each node trains.")
@click.option("--inner-steps", type=int, default=40, show_default=True, help="H inner steps per round.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="runs/demo", show_default=True,
              help="Directory for the spec, logs, checkpoints, JSON and plot.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="JSON summary path (default: OUT/demo.json).")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None,
              help="PNG of loss curves per node and path (default: OUT/demo.png).")
@click.option("--simulated", is_flag=True, help="Run the same algorithm in one process, without networking.")
@click.option("--dashboard-port", type=click.IntRange(0, 65535), default=8470, show_default=True,
              help="Serve the swarm's live dashboard on this port of 127.0.0.1 while the demo runs (taken: any free "
                   "port; the URL is printed).")
@click.option("--no-dashboard", is_flag=True, help="Serve no dashboard.")
@friendly
def demo(nodes: int, rounds: int, inner_steps: int, out_dir: str, json_path: str | None, plot_path: str | None,
         simulated: bool, dashboard_port: int, no_dashboard: bool) -> None:
    """A real local swarm: a bootstrap peer and N nodes on 127.0.0.1 train a 2x2 DiPaCo model on BBC News."""
    from pathswarm.node.app import demo as demo_mod

    if nodes <= 0 or rounds <= 0 or inner_steps <= 0:
        raise click.BadParameter("--nodes, --rounds and --inner-steps must be positive")
    json_p, plot_p = (Path(json_path) if json_path else None), (Path(plot_path) if plot_path else None)
    if simulated:
        demo_mod.run_simulated_demo(rounds=rounds, inner_steps=inner_steps, out_dir=Path(out_dir), json_path=json_p,
                                    plot_path=plot_p)
    else:
        demo_mod.run_demo(nodes=nodes, rounds=rounds, inner_steps=inner_steps, out_dir=Path(out_dir),
                          json_path=json_p, plot_path=plot_p, dashboard_port=None if no_dashboard else dashboard_port)



@click.command("eval")
@click.option("--spec", "spec_path", default=None, type=click.Path(dir_okay=False),
              help="Swarm spec (TOML); default: the spec stored with a whole model (model pull / assemble).")
@click.option("--checkpoint", "checkpoint_dir", required=True, type=click.Path(),
              help="A whole model, or a node's checkpoint directory (its paths only).")
@click.option("--batches", type=int, default=16, show_default=True, help="Validation batches per path.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None, help="Also write JSON here.")
@friendly
def eval_cmd(spec_path: str | None, checkpoint_dir: str, batches: int, json_path: str | None) -> None:
    """Routed validation loss (and bits per byte) per path and over the paths the checkpoint holds.

    Every held-out document is scored by the path the router picks for it; a node's checkpoint holds one path, so its
    documents are that path's only (the table says how many of the swarm's paths were scored)."""
    from pathswarm.node.train.checkpoint import load_checkpoint
    from pathswarm.node.train.evaluate import routed_eval
    from pathswarm.node.train.model_dir import resolve_spec

    spec = resolve_spec(checkpoint_dir, spec_path)
    ckpt = load_checkpoint(checkpoint_dir, spec)
    rows, overall = routed_eval(spec, ckpt, max_batches=batches)
    whole = len(rows) == spec.n_paths
    table = Table(title=f"routed validation loss, round {ckpt.round}"
                        + ("" if whole else f" ({len(rows)} of the swarm's {spec.n_paths} paths held)"))
    for col in ("path", "documents", "tokens", "loss (nats/byte)", "bits/byte"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(r.path, str(r.documents), str(r.tokens), f"{r.loss:.4f}", f"{r.bits_per_byte:.4f}")
    table.add_row("all paths" if whole else f"these {len(rows)}", str(overall.documents), str(overall.tokens),
                  f"{overall.loss:.4f}", f"{overall.bits_per_byte:.4f}")
    Console().print(table)
    held = {r.path for r in rows}
    write_json(json_path, {"round": ckpt.round, "paths": {r.path: r.loss for r in rows}, "all": overall.loss,
                            "bits_per_byte": overall.bits_per_byte,
                            "paths_missing": [p for p in map(format_path, spec.paths()) if p not in held]})


@click.command()
@click.option("--spec", "spec_path", default=None, type=click.Path(dir_okay=False),
              help="Swarm spec (TOML); default: the spec stored with a whole model (model pull / assemble).")
@click.option("--checkpoint", "checkpoint_dir", required=True, type=click.Path(),
              help="A whole model, or a node's checkpoint directory (prompts routed to its path only).")
@click.option("--prompt", required=True, help="Text to continue; it is routed to its path first.")
@click.option("--max-bytes", type=int, default=200, show_default=True, help="Bytes to generate.")
@click.option("--temperature", type=float, default=0.8, show_default=True, help="Sampling temperature (0: greedy).")
@click.option("--seed", type=int, default=0, show_default=True, help="Sampling seed.")
@friendly
def generate(spec_path: str | None, checkpoint_dir: str, prompt: str, max_bytes: int, temperature: float,
             seed: int) -> None:
    """Route PROMPT to its path and sample a continuation."""
    if max_bytes <= 0:
        raise click.BadParameter("must be positive", param_hint="--max-bytes")
    from pathswarm.node.train.evaluate import generate_text
    from pathswarm.node.train.model_dir import resolve_spec

    spec = resolve_spec(checkpoint_dir, spec_path)

    path, text = generate_text(spec, checkpoint_dir, prompt, max_bytes, temperature, seed)
    click.echo(f"[path {path}] {prompt}{text}")

