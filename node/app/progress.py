"""Live progress for people waiting on training: a rich progress bar, one line per round, a summary.

The simulator reports events (`start`, `inner_step`, `round`); this module turns them into a display
so that the library code stays free of terminal concerns.
"""

from __future__ import annotations

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from pathswarm.node.app.fmt import count, fmt_bytes
from pathswarm.node.train.simulate import SimConfig, SimResult, run_simulation
from pathswarm.protocol.spec import SwarmSpec


def run_with_progress(spec: SwarmSpec, cfg: SimConfig, console: Console | None = None) -> SimResult:
    console = console or Console(stderr=True)
    H = cfg.inner_steps or spec.inner.steps
    n_workers = cfg.workers or (spec.n_paths if cfg.mode == "dipaco" else 4)
    total = cfg.rounds * H * (1 if cfg.mode == "sync" else n_workers)
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[info]}"),
               TimeElapsedColumn(), TimeRemainingColumn())
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task(f"{cfg.mode} inner steps", total=total, info="")

        def on_event(kind: str, info: dict) -> None:
            if kind == "inner_step":
                progress.update(task, advance=1, info=f"worker {info['worker']} loss {info['loss']:.3f}")
            elif kind == "start":
                progress.console.print(f"start: routed val loss {info['val_loss'].get('all', float('nan')):.4f} "
                                       f"with {info['workers']} workers")
            elif kind == "round":
                per_path = " ".join(f"{p}={v:.3f}" for p, v in info["val_loss"].items() if p != "all")
                progress.console.print(
                    f"round {info['round']}/{cfg.rounds}: val loss {info['val_loss']['all']:.4f} ({per_path}) "
                    f"tokens {info['tokens']:,} sent {fmt_bytes(info['bytes_sent'])} "
                    f"replicas {'identical' if info['replicas_identical'] else 'DIFFER'}")

        result = run_simulation(spec, cfg, on_event=on_event)
    console.print(summary_table(result))
    return result


def summary_table(result: SimResult) -> Table:
    table = Table(title=f"{result.mode}: {result.workers} workers, H={result.inner_steps}, "
                        f"{count(len(result.rounds), 'round')}, {result.wall_s:.0f} s")
    table.add_column("path")
    table.add_column("val loss before", justify="right")
    table.add_column("val loss after", justify="right")
    table.add_column("change", justify="right")
    for p in [*result.paths, "all"]:
        before, after = result.val_loss_before.get(p), result.val_loss_after.get(p)
        if before is None or after is None:
            continue
        table.add_row(p, f"{before:.4f}", f"{after:.4f}", f"{(after - before) / before:+.1%}")
    ratio = result.ddp_fp32_bytes_equivalent / result.bytes_sent_total if result.bytes_sent_total else float("inf")
    table.caption = (f"tokens {result.tokens_total:,} · sent {fmt_bytes(result.bytes_sent_total)} "
                     "vs fp32 data-parallel "
                     f"{fmt_bytes(result.ddp_fp32_bytes_equivalent)} ({ratio:,.0f}× less) · replicas "
                     f"{'identical' if result.replicas_identical else 'DIFFER'}")
    return table
