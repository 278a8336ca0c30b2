"""Learning-rate sweep on narrow proxies (muTransfer, arXiv 2203.03466); `pathswarm tune` is node/app/cli_tune.py.

Under muP the best inner learning rate (given at `model.base_width`; hidden matrices get lr / width_mult)
does not move with width, so it can be found on cheap narrow copies of a swarm's path and written into
the spec of the wide swarm. `sweep` trains one proxy per (width, lr, seed) with plain AdamW (the inner
loop of node/train/inner.py, the spec's batch size, warm-up and clipping) on the spec's training documents and
scores it on fixed validation windows; `best_lr_per_width` and `choose_lr` are the selection rules, pure
functions over the trials; `with_inner_lr` writes the choice into a spec. benchmarks/mup_transfer.py
runs the same sweep under muP and under standard parametrisation at widths 64..512.

Pure of networking.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from pathswarm.protocol.spec import SwarmSpec

if TYPE_CHECKING:
    from pathswarm.node.model.data import Document

# torch and the modules that import it are imported inside the functions that train: node/app/cli_tune.py imports
# this module when `pathswarm` starts, and `pathswarm --help` should not pay for loading torch.

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SweepConfig:
    """One learning-rate sweep over proxy widths."""

    widths: tuple[int, ...] = (64, 128)
    """Proxy widths (model.width); each must be divisible by the spec's model.n_heads."""
    lrs: tuple[float, ...] = ()
    """Inner learning rates at base width to try (see `lr_grid`)."""
    steps: int = 200
    """AdamW steps per trial."""
    eval_batches: int = 16
    """Validation batches (of inner.batch_size windows) scoring each trial; the same windows for all."""
    seeds: tuple[int, ...] = (0,)
    """Each seed shifts the model's init seed and seeds the training stream."""
    parametrization: str = ""
    """'mup' or 'sp' to override the spec's model.parametrization ('' keeps it)."""

    def __post_init__(self) -> None:
        if not self.widths or any(w <= 0 for w in self.widths):
            raise ValueError(f"widths must be positive, got {self.widths}")
        if not self.lrs or any(not (lr > 0 and math.isfinite(lr)) for lr in self.lrs):
            raise ValueError(f"lrs must be positive and finite, got {self.lrs}")
        if self.steps <= 0 or self.eval_batches <= 0 or not self.seeds:
            raise ValueError("steps, eval_batches and seeds must be positive / non-empty")
        if self.parametrization not in ("", "mup", "sp"):
            raise ValueError(f"parametrization must be 'mup' or 'sp', got {self.parametrization!r}")


@dataclass(frozen=True)
class Trial:
    """One trained proxy."""

    width: int
    lr: float
    seed: int
    parametrization: str
    val_loss: float
    """Mean next-byte cross-entropy (nats) on the fixed validation windows; inf if the run diverged."""
    train_loss: float
    """Mean of the last 10 training losses."""
    wall_s: float

    @property
    def diverged(self) -> bool:
        return not math.isfinite(self.val_loss)


def lr_grid(center: float, points: int, factor: float = 2.0) -> tuple[float, ...]:
    """`points` learning rates `factor` apart around `center` (centre included when points is odd)."""
    if points <= 0 or center <= 0 or factor <= 1:
        raise ValueError(f"need points > 0, center > 0 and factor > 1, got {points}, {center}, {factor}")
    lo = -(points // 2)
    return tuple(center * factor ** (lo + i) for i in range(points))


def proxy_spec(spec: SwarmSpec, width: int, parametrization: str = "", seed_offset: int = 0) -> SwarmSpec:
    """`spec` at another width (base width, heads and everything else kept)."""
    m = spec.model
    if width % m.n_heads:
        raise ValueError(f"width {width} is not divisible by model.n_heads {m.n_heads}")
    model = dataclasses.replace(m, width=width, parametrization=parametrization or m.parametrization,
                                seed=m.seed + seed_offset)
    return spec.replace(model=model)


def validation_batches(spec: SwarmSpec, docs: Sequence[Document], n_batches: int) -> list:
    """Fixed validation windows from the spec's validation split, documents in a seeded shuffled order
    (corpora are often sorted by topic, and the windows are taken from the start of the stream)."""
    from pathswarm.node.model.data import TokenSampler, split

    _, val = split(docs, spec.data.val_fraction)
    if not val:
        raise ValueError("the validation split is empty: use more documents or a larger data.val_fraction")
    val = list(val)
    random.Random(0).shuffle(val)
    return list(TokenSampler(val, spec.model.context_len, seed=0).eval_batches(spec.inner.batch_size, n_batches))


class _Diverged(Exception):
    pass


def _stop_if_diverged(step: int, loss: float) -> None:
    if not math.isfinite(loss):
        raise _Diverged(step)


def run_trial(spec: SwarmSpec, lr: float, train_docs: Sequence[Document], val_batches: list, steps: int,
              seed: int) -> tuple[float, float]:
    """Train a fresh path of `spec` for `steps` AdamW steps at inner lr `lr`: (val loss, train loss)."""
    from pathswarm.node.model.data import TokenSampler
    from pathswarm.node.model.model import build_path
    from pathswarm.node.train.inner import evaluate_loss, make_inner_optimizer, train_steps

    model = build_path(spec, spec.path_of_index(0))
    opt = make_inner_optimizer(model, spec.inner, lr)
    sampler = TokenSampler(train_docs, spec.model.context_len, seed=seed)
    bs = spec.inner.batch_size
    try:
        stats = train_steps(model, opt, lambda: sampler.sample(bs), spec.inner, steps, on_step=_stop_if_diverged)
    except _Diverged:
        return math.inf, math.inf
    val, _ = evaluate_loss(model, val_batches)
    tail = stats.losses[-10:]
    return (val if math.isfinite(val) else math.inf), sum(tail) / len(tail)


def sweep(spec: SwarmSpec, cfg: SweepConfig, docs: Sequence[Document],
          on_trial: Callable[[Trial], None] | None = None) -> list[Trial]:
    """Every (width, lr, seed) of `cfg`, widths outermost; the same data for every lr and width of a seed."""
    from pathswarm.node.model.data import split

    train, _ = split(docs, spec.data.val_fraction)
    val_batches = validation_batches(spec, docs, cfg.eval_batches)
    trials = []
    for width in cfg.widths:
        for seed in cfg.seeds:
            proxy = proxy_spec(spec, width, cfg.parametrization, seed_offset=seed)
            for lr in cfg.lrs:
                t0 = time.perf_counter()
                val, train_loss = run_trial(proxy, lr, train, val_batches, cfg.steps, seed)
                trial = Trial(width, lr, seed, proxy.model.parametrization, val, train_loss, time.perf_counter() - t0)
                log.debug("width %d lr %.3g seed %d: val %.4f", width, lr, seed, val)
                trials.append(trial)
                if on_trial is not None:
                    on_trial(trial)
    return trials


# ---- selection (pure) ----------------------------------------------------------------------------
def mean_losses(trials: Sequence[Trial]) -> dict[int, dict[float, float]]:
    """width → lr → validation loss averaged over seeds (inf if any seed diverged)."""
    acc: dict[int, dict[float, list[float]]] = {}
    for t in trials:
        acc.setdefault(t.width, {}).setdefault(t.lr, []).append(t.val_loss)
    return {w: {lr: (sum(v) / len(v) if all(math.isfinite(x) for x in v) else math.inf)
                for lr, v in sorted(by_lr.items())} for w, by_lr in sorted(acc.items())}


def _argmin(losses: dict[float, float]) -> float:
    """The lr of lowest loss; a tie goes to the smaller lr (the safer choice)."""
    best = min(losses.values())
    if not math.isfinite(best):
        raise ValueError("every learning rate diverged")
    return min(lr for lr, v in losses.items() if v == best)


def best_lr_per_width(trials: Sequence[Trial]) -> dict[int, float]:
    """width → the lr of lowest seed-averaged validation loss."""
    return {w: _argmin(by_lr) for w, by_lr in mean_losses(trials).items()}


def choose_lr(trials: Sequence[Trial]) -> float:
    """The lr to transfer: lowest mean excess loss over the proxy widths (loss minus that width's best).

    muP's claim is that the optimum does not depend on width, so the proxies are pooled; an lr that
    diverged at any width is never chosen."""
    table = mean_losses(trials)
    lrs = sorted({lr for by_lr in table.values() for lr in by_lr})
    excess = {}
    for lr in lrs:
        gaps = []
        for by_lr in table.values():
            best = min(by_lr.values())
            if not math.isfinite(best):
                raise ValueError("every learning rate diverged at some width")
            gaps.append(by_lr.get(lr, math.inf) - best)
        excess[lr] = sum(gaps) / len(gaps)
    return _argmin(excess)


FIT_MARGIN = 0.1
"""Nats above the best loss within which grid points join the parabola of `fitted_log2_optimum`."""


def fitted_log2_optimum(losses: dict[float, float], margin: float = FIT_MARGIN) -> float:
    """log2 of the loss-minimising lr between grid points: the vertex of a parabola fitted (least squares,
    in log2 lr) to the best point, its two neighbours and every point within `margin` nats of the best.

    On a flat bottom a single-seed argmin jumps between neighbours on noise; the vertex moves only
    as much as the whole bottom does. Falls back to the argmin where the fit is not convex, and is
    clipped to the range of the points fitted."""
    finite = sorted((math.log2(lr), v) for lr, v in losses.items() if math.isfinite(v))
    if not finite:
        raise ValueError("every learning rate diverged")
    i = min(range(len(finite)), key=lambda j: finite[j][1])
    best = finite[i][1]
    pts = [p for j, p in enumerate(finite) if abs(j - i) <= 1 or p[1] <= best + margin]
    if len(pts) < 3:
        return finite[i][0]
    a, b, _ = np.polyfit([x for x, _ in pts], [y for _, y in pts], 2)
    if a <= 0:
        return finite[i][0]
    return float(min(max(-b / (2 * a), pts[0][0]), pts[-1][0]))


def grid_shift(best: dict[int, float], lrs: Sequence[float]) -> int:
    """How many grid steps the best lr moves across widths (max index − min index in the sorted grid)."""
    grid = sorted(lrs)

    def nearest(lr: float) -> int:
        return min(range(len(grid)), key=lambda i: abs(math.log(grid[i] / lr)))

    idx = [nearest(lr) for lr in best.values()]
    return max(idx) - min(idx)


def with_inner_lr(spec: SwarmSpec, lr: float) -> SwarmSpec:
    """`spec` with inner.lr = lr, every other field unchanged (the swarm id changes: it is a new swarm)."""
    return spec.replace(inner=dataclasses.replace(spec.inner, lr=float(lr)))


def sweep_report(trials: Sequence[Trial]) -> dict:
    """JSON-ready summary: the loss table, the best lr per width, its shift in grid steps, the choice."""
    table = mean_losses(trials)
    lrs = sorted({t.lr for t in trials})
    best = best_lr_per_width(trials)
    fitted = {w: fitted_log2_optimum(by_lr) for w, by_lr in table.items()}
    return {"lrs": lrs,
            "val_loss": {str(w): [_json_number(by_lr.get(lr, math.inf)) for lr in lrs] for w, by_lr in table.items()},
            "best_lr_per_width": {str(w): lr for w, lr in best.items()},
            "shift_grid_steps": grid_shift(best, lrs),
            "fitted_log2_optimum_per_width": {str(w): x for w, x in fitted.items()},
            "fitted_shift_log2": max(fitted.values()) - min(fitted.values()), "chosen_lr": choose_lr(trials),
            "trials": [{k: _json_number(v) for k, v in dataclasses.asdict(t).items()} for t in trials]}


def _json_number(v):
    """JSON has no infinity: a diverged loss is written as null."""
    return None if isinstance(v, float) and not math.isfinite(v) else v


def format_table(trials: Sequence[Trial]) -> str:
    """Plain-text evidence: validation loss per lr (rows) and width (columns), best per width starred."""
    table = mean_losses(trials)
    best = best_lr_per_width(trials)
    widths = list(table)
    lrs = sorted({t.lr for t in trials})
    lines = ["lr (base width)  " + "  ".join(f"{'width ' + str(w):>12}" for w in widths)]
    for lr in lrs:
        cells = []
        for w in widths:
            v = table[w].get(lr, math.inf)
            cell = "diverged" if not math.isfinite(v) else f"{v:.4f}"
            cells.append(f"{cell + (' *' if best[w] == lr else '  '):>12}")
        lines.append(f"{lr:<15.4g}  " + "  ".join(cells))
    return "\n".join(lines)
