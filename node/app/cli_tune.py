"""`pathswarm tune`: sweep the inner learning rate on narrow muP proxies and write the best one into the spec.

The sweep and its selection rules are node/train/tune.py; this file parses the options, shows progress and
writes the spec and the JSON report.
"""

from __future__ import annotations

from pathlib import Path

import click

from pathswarm.jsonfile import write_json_atomic
from pathswarm.node.app.cli_common import friendly
from pathswarm.node.train.tune import (
    SweepConfig,
    Trial,
    format_table,
    lr_grid,
    sweep,
    sweep_report,
    with_inner_lr,
)


def _parse_list(text: str, kind: type, option: str) -> tuple:
    try:
        values = tuple(kind(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise click.BadParameter(f"{text!r}: expected comma-separated numbers", param_hint=option) from None
    if not values:
        raise click.BadParameter("needs at least one value", param_hint=option)
    return values


@click.command("tune")
@click.option("--spec", "spec_path", required=True, type=click.Path(dir_okay=False),
              help="Swarm spec (TOML) whose inner learning rate to tune.")
@click.option("--widths", default="64,128", show_default=True,
              help="Comma-separated proxy widths (narrower than the swarm's: that is the point).")
@click.option("--lrs", default=None, help="Comma-separated learning rates at base width to try (overrides --grid).")
@click.option("--grid", type=int, default=7, show_default=True,
              help="Try this many learning rates, factors of 2 apart, centred on the spec's inner.lr.")
@click.option("--steps", type=int, default=200, show_default=True, help="AdamW steps per proxy run.")
@click.option("--seeds", type=int, default=1, show_default=True, help="Seeds per (width, lr); losses are averaged.")
@click.option("--eval-batches", type=int, default=16, show_default=True, help="Validation batches scoring each run.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="Write every run's losses and the choice as JSON.")
@click.option("--write/--no-write", default=True, show_default=True,
              help="Write the chosen lr into the spec file (this changes the swarm id: do it before the swarm starts).")
def tune_command(**options) -> None:
    """Sweep the inner learning rate on narrow muP proxies and write the best one into the spec.

    Under muP the best learning rate (given at the spec's base width) is the same at every width, so a
    sweep on cheap narrow copies of one path finds it for the wide swarm. Prints the loss of every
    (lr, width) with the best per width starred, how far the best moves across widths, and the choice.
    """
    friendly(_tune)(**options)


def _tune(spec_path: str, widths: str, lrs: str | None, grid: int, steps: int, seeds: int, eval_batches: int,
          json_path: str | None, write: bool) -> None:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from pathswarm.node.model.data import load_documents
    from pathswarm.protocol.spec import load_spec

    if grid <= 0 or seeds <= 0:
        raise click.BadParameter("--grid and --seeds must be positive")
    spec = load_spec(spec_path)
    cfg = SweepConfig(widths=_parse_list(widths, int, "--widths"),
                      lrs=_parse_list(lrs, float, "--lrs") if lrs else lr_grid(spec.inner.lr, grid),
                      steps=steps, eval_batches=eval_batches, seeds=tuple(range(seeds)))
    console = Console(stderr=True)
    if spec.model.parametrization != "mup":
        console.print("[yellow]warning:[/] the spec uses standard parametrisation: a learning rate found on "
                      "narrow proxies does not carry over to other widths (muP's does)")
    if max(cfg.widths) > spec.model.width:
        console.print(f"[yellow]warning:[/] proxies wider than the swarm ({spec.model.width}) cost more than "
                      "tuning the swarm's width itself")
    docs = load_documents(spec.data)
    n = len(cfg.widths) * len(cfg.lrs) * len(cfg.seeds)
    with Progress(TextColumn("[bold]tune"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                  TimeElapsedColumn(), console=console) as progress:
        task = progress.add_task("tune", total=n, info="")

        def advance(t: Trial) -> None:
            progress.update(task, advance=1, info=f"width {t.width} lr {t.lr:.3g}: {t.val_loss:.4f}")

        trials = sweep(spec, cfg, docs, on_trial=advance)
    report = sweep_report(trials)
    chosen = report["chosen_lr"]
    click.echo(f"validation loss (nats/byte) after {steps} steps, {spec.model.parametrization}, "
               f"base width {spec.model.base_width}; * = best at that width")
    click.echo(format_table(trials))
    fitted = ", ".join(f"{w}: {2 ** x:.3g}" for w, x in report["fitted_log2_optimum_per_width"].items())
    click.echo(f"best lr moves {report['shift_grid_steps']} grid step(s) across widths "
               f"{', '.join(map(str, cfg.widths))}; fitted optimum per width {fitted} "
               f"(moves {report['fitted_shift_log2']:.2f} factors of 2)")
    click.echo(f"chosen inner lr: {chosen:.4g} (spec had {spec.inner.lr:.4g})")
    if chosen in (min(cfg.lrs), max(cfg.lrs)):
        console.print("[yellow]warning:[/] the chosen lr is at the edge of the grid: the optimum may lie beyond "
                      "it (widen --grid or --lrs)")
    if write:
        new = with_inner_lr(spec, chosen)
        Path(spec_path).write_text(new.to_toml(), encoding="utf-8")
        click.echo(f"wrote inner.lr = {chosen:.4g} into {spec_path} (swarm id {spec.swarm_id[:16]}… → "
                   f"{new.swarm_id[:16]}…)")
    if json_path:
        report.update(spec=spec_path, steps=steps, widths=list(cfg.widths), written=write,
                      previous_lr=spec.inner.lr)
        write_json_atomic(json_path, report)
        click.echo(f"wrote {json_path}")
