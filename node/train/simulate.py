"""The whole algorithm in one process, without networking: DiLoCo, DiPaCo and a synchronous baseline.

Modes (same model, data and optimisers as the real node; `PathWorker` and the round rule of
node/train/round.py — contribution, close, settle — are the very code the node runs):
- `diloco`: N workers train replicas of one path on i.i.d. shards of all documents; every H inner
  steps each module's outer gradients are encoded (error feedback), merged by the reducer's robust
  token-weighted rule into one encoded mean, and every worker decodes it and applies the outer
  Nesterov step. Every holder is in every round, and each result lands before the next inner step
  (`overlap`: after a share of the next round's H inner steps, as on a decoupled node whose round is in flight
  meanwhile).
- `dipaco`: workers are assigned to paths round-robin (one per path by default); each trains on the
  documents the router sends to its path; each module is averaged only among the workers holding it.
- `sync`: synchronous data-parallel: N workers' gradients averaged every inner step, one AdamW, the
  same total tokens as the other modes.

Validation loss is routed: each validation document is scored by the path the router picks for it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial

import torch

from pathswarm.node.model.data import Document, TokenSampler, load_documents, split
from pathswarm.node.model.model import PathModel, build_path
from pathswarm.node.model.router import documents_by_path
from pathswarm.node.train.checkpoint import ModuleState, save_checkpoint
from pathswarm.node.train.inner import evaluate_loss, make_inner_optimizer, set_warmup_lr
from pathswarm.node.train.sim_round import (
    ClosedRound,
    Tamper,
    close_module_round,
    move_eagerly,
    settle_module_round,
)
from pathswarm.node.train.warm_start import check_init
from pathswarm.node.train.worker import PathWorker
from pathswarm.protocol.rounds.outer import OuterState
from pathswarm.protocol.spec import SwarmSpec, format_path

MODES = ("diloco", "dipaco", "sync")


@dataclass(frozen=True)
class SimConfig:
    """One simulated run."""

    mode: str = "dipaco"
    """'diloco', 'dipaco' or 'sync'."""
    workers: int = 0
    """Workers (0: one per path in dipaco mode, 4 otherwise)."""
    rounds: int = 5
    """Outer rounds (in sync mode: evaluation points, H synchronous steps apart)."""
    inner_steps: int = 0
    """H inner steps per round (0: the spec's inner.steps)."""
    eval_batches: int = 8
    """Validation batches per path at each evaluation."""
    seed: int = 0
    """Seed of the workers' data streams."""
    lr: float = 0.0
    """Inner learning rate override at base width (0: the spec's inner.lr)."""
    synthetic_docs: int = 200
    """Documents of the generated corpus when the spec's data.corpus is 'synthetic'."""
    checkpoint_dir: str = ""
    """Write a checkpoint of every module here at the end ('' for none)."""
    overlap: float = 0.0
    """Local-SGD modes: the share of the next round's H inner steps trained before a round's result is applied (0:
    before the next step; 1: after all H of them, the latest a decoupled node applies a round, since it sends round
    r + 1 once round r settled). The steps trained meanwhile stay on top of the result, as on the node
    (node/train/round.py `settle`); on a node the share is about the round's time on the wire ÷ the time of H steps.
    The last round lands at once; with `[outer] eager` in the spec each send moves the workers' local weights as a
    node's does (node/train/round.py `eager_shift`). With overlap, validation scores the anchors (the state a node's
    checkpoint holds), not the local weights."""


    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if not 0.0 <= self.overlap <= 1.0:
            raise ValueError(f"overlap must be in [0, 1], got {self.overlap}")
        if self.overlap and self.mode == "sync":
            raise ValueError("overlap applies to the local-SGD modes (diloco, dipaco), not sync")
        for name in ("workers", "inner_steps", "lr"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        if self.rounds <= 0 or self.eval_batches <= 0:
            raise ValueError("rounds and eval_batches must be positive")


@dataclass
class SimResult:
    mode: str
    swarm_id: str
    workers: int
    inner_steps: int
    paths: list[str]
    rounds: list[dict] = field(default_factory=list)
    val_loss_before: dict[str, float] = field(default_factory=dict)
    val_loss_after: dict[str, float] = field(default_factory=dict)
    tokens_total: int = 0
    rejected: int = 0
    """Contributions the group merge screened out (benchmarks/byzantine.py)."""
    bytes_sent_total: int = 0
    """Bytes of the outer rounds, both directions (contributions up to the reducer, its mean back down)."""
    bytes_up_total: int = 0
    """Of which contributions (each member but the reducer sends its frame)."""
    bytes_down_total: int = 0
    """Of which the reducer's mean (to each member but itself)."""
    ddp_fp32_bytes_equivalent: int = 0
    inner_s: float = 0.0
    """Seconds of inner steps (every worker's, one after another)."""
    round_s: float = 0.0
    """Seconds of the round rule: encoding, the reducer's decode and merge and its mean's encode, every member's
    decode and outer step (node/train/round.py), one after another."""
    replicas_identical: bool = True
    history: dict[str, dict[str, str]] = field(default_factory=dict)
    """module → outer round → its digest after that round (the first holder's; `replicas_identical` says whether
    every holder's agreed): the same record a node keeps in its status, so the two can be compared."""
    wall_s: float = 0.0

    def to_json(self) -> dict:
        return asdict(self)


Event = Callable[[str, dict], None]


class RoutedEval:
    """Fixed validation batches per path: the same windows at every evaluation."""

    def __init__(self, spec: SwarmSpec, val_docs: list[Document], paths: list[tuple[int, ...]], n_batches: int,
                 routed: bool):
        self.batches: dict[tuple[int, ...], list] = {}
        if routed:
            routed_docs = documents_by_path(spec, val_docs)
            by_path = {p: routed_docs[p] for p in paths}
        else:
            by_path = {p: val_docs for p in paths}
        for p, docs in by_path.items():
            if not docs:
                continue
            sampler = TokenSampler(docs, spec.model.context_len, seed=0)
            self.batches[p] = list(sampler.eval_batches(spec.inner.batch_size, n_batches))

    def losses(self, models: dict[tuple[int, ...], PathModel]) -> dict[str, float]:
        out: dict[str, float] = {}
        total, count = 0.0, 0
        for p, batches in self.batches.items():
            loss, n = evaluate_loss(models[p], batches)
            out[format_path(p)] = loss
            total, count = total + loss * n, count + n
        out["all"] = total / count if count else float("nan")
        return out


def _samplers_for(spec: SwarmSpec, cfg: SimConfig, train: list[Document], paths: list[tuple[int, ...]],
                  routed: bool) -> list[TokenSampler]:
    """One data stream per worker: routed documents of its path (dipaco) or all documents."""
    by_path = documents_by_path(spec, train) if routed else {}
    samplers = []
    for i, p in enumerate(paths):
        docs = by_path[p] if routed else train
        if not docs:
            raise ValueError(f"no training documents are routed to path {format_path(p)}")
        samplers.append(TokenSampler(docs, spec.model.context_len, seed=cfg.seed * 1000 + i))
    return samplers


def run_simulation(spec: SwarmSpec, cfg: SimConfig, docs: list[Document] | None = None,
                   on_event: Event | None = None, tamper: Tamper | None = None,
                   init_weights: dict[str, torch.Tensor] | None = None) -> SimResult:
    """Run one simulated swarm and return per-round losses, tokens and bytes.

    `tamper` (local-SGD modes) rewrites the frames workers send, to simulate hostile peers. `init_weights`: round 0
    of every module (module id → flat fp32), required when the spec names a warm start (node/train/warm_start.py),
    and checked against its digests as a node checks them."""
    spec.require_router()
    if spec.init.digests and init_weights is None:
        raise ValueError("the spec starts from a warm start: pass its round-0 weights (init_weights)")
    if init_weights is not None:
        for mid in spec.all_module_ids():
            check_init(spec, mid, init_weights[mid])
    emit = on_event or (lambda kind, info: None)
    t0 = time.perf_counter()
    docs = docs if docs is not None else load_documents(spec.data, synthetic_docs=cfg.synthetic_docs)
    train, val = split(docs, spec.data.val_fraction)
    H = cfg.inner_steps or spec.inner.steps
    lr = cfg.lr or None
    routed = cfg.mode == "dipaco"
    if routed:
        n = cfg.workers or spec.n_paths
        if n < spec.n_paths:
            raise ValueError(f"dipaco mode needs at least one worker per path ({spec.n_paths}), got {n}")
        worker_paths = [spec.path_of_index(i % spec.n_paths) for i in range(n)]
    else:
        n = cfg.workers or 4
        worker_paths = [spec.path_of_index(0)] * n
    eval_paths = sorted(set(worker_paths))
    evaluator = RoutedEval(spec, val, eval_paths, cfg.eval_batches, routed)
    samplers = _samplers_for(spec, cfg, train, worker_paths, routed)
    result = SimResult(mode=cfg.mode, swarm_id=spec.swarm_id, workers=n, inner_steps=H,
                       paths=[format_path(p) for p in eval_paths])
    if cfg.mode == "sync":
        _run_sync(spec, cfg, H, lr, samplers, evaluator, result, emit, init_weights)
    else:
        _run_local_sgd(spec, cfg, H, lr, worker_paths, samplers, evaluator, result, emit, tamper, init_weights)
    result.wall_s = time.perf_counter() - t0
    return result


def _emit_inner_step(emit: Event, worker: int, step: int, loss: float) -> None:
    emit("inner_step", {"worker": worker, "loss": loss})


def _run_local_sgd(spec: SwarmSpec, cfg: SimConfig, H: int, lr: float | None, worker_paths: list[tuple[int, ...]],
                   samplers: list[TokenSampler], evaluator: RoutedEval, result: SimResult, emit: Event,
                   tamper: Tamper | None = None, init_weights: dict[str, torch.Tensor] | None = None) -> None:
    bs = spec.inner.batch_size
    workers = [PathWorker(spec, p, partial(s.sample, bs), name=f"w{i}", lr=lr)
               for i, (p, s) in enumerate(zip(worker_paths, samplers, strict=True))]
    if init_weights is not None:
        for w in workers:
            for mid in w.module_ids:
                w.set_flat(mid, init_weights[mid])
                w.outer[mid] = OuterState.fresh(init_weights[mid])
    models: dict[tuple[int, ...], PathModel] = {}
    for w in workers:
        models.setdefault(w.path, w.model)
    result.val_loss_before = evaluator.losses(models)
    emit("start", {"val_loss": result.val_loss_before, "workers": len(workers)})
    # (worker, module) → tokens whose steps a late or failed round left in the worker's local weights
    carry: dict[tuple[str, str], int] = {}
    in_flight: dict[str, ClosedRound] = {}  # overlap: module → its last round, closed, applied after the next chunk
    for r in range(cfg.rounds):
        train_loss: dict[str, list[float]] = {}
        losses: dict[int, list[float]] = {i: [] for i in range(len(workers))}
        before_landing = round(cfg.overlap * H) if in_flight else H
        identical = True  # every holder of each round settled in this row holds the same state
        for part, steps in enumerate((before_landing, H - before_landing)):
            if part == 1 and in_flight:  # round r - 1 lands now: the steps trained so far stay on top of it
                for mid in list(in_flight):
                    identical &= _settled_alike(spec, in_flight.pop(mid), carry, result)
            t_inner = time.perf_counter()
            for i, w in enumerate(workers):
                if steps:
                    losses[i] += w.train_inner(steps, on_step=partial(_emit_inner_step, emit, i)).losses
            result.inner_s += time.perf_counter() - t_inner
        for i, w in enumerate(workers):
            train_loss.setdefault(format_path(w.path), []).append(sum(losses[i][-10:]) / len(losses[i][-10:]))
        round_bytes = 0
        for mid in spec.all_module_ids():
            holders = [w for w in workers if mid in w.module_ids]  # canonical order: worker index
            if not holders:
                continue
            closed = close_module_round(spec, mid, r, holders, carry, result, tamper, workers)
            round_bytes += closed.bytes
            if cfg.overlap and r < cfg.rounds - 1:
                in_flight[mid] = closed
                if spec.outer.eager:  # `[outer] eager`, as a node runs it
                    move_eagerly(spec, closed)
            else:
                identical &= _settled_alike(spec, closed, carry, result)
        if cfg.checkpoint_dir and r == cfg.rounds - 1:
            first_holder = {mid: next(w for w in workers if mid in w.module_ids)
                            for mid in spec.all_module_ids() if any(mid in w.module_ids for w in workers)}
            save_checkpoint(cfg.checkpoint_dir, spec, r + 1,
                            {mid: w.module_state(mid) for mid, w in first_holder.items()})
        tokens = sum(w.round_tokens for w in workers)
        for w in workers:
            w.end_round()
        result.tokens_total += tokens
        result.bytes_sent_total += round_bytes
        result.ddp_fp32_bytes_equivalent += _ddp_bytes(workers, H)
        result.replicas_identical &= identical
        val = _anchor_losses(evaluator, models, workers) if cfg.overlap else evaluator.losses(models)
        row = {"round": r + 1, "train_loss": {p: sum(v) / len(v) for p, v in train_loss.items()},
               "val_loss": val, "tokens": result.tokens_total, "bytes_sent": round_bytes,
               "replicas_identical": identical}
        result.rounds.append(row)
        emit("round", row)
    result.val_loss_after = result.rounds[-1]["val_loss"]


def _settled_alike(spec: SwarmSpec, closed: ClosedRound, carry: dict[tuple[str, str], int],
                   result: SimResult) -> bool:
    """Settle a closed round (sim_round.py `settle_module_round`); True if its holders agree after it."""
    settle_module_round(spec, closed, carry, result)
    return len({w.digest(closed.mid) for w in closed.holders}) == 1


def _anchor_losses(evaluator: RoutedEval, models: dict[tuple[int, ...], PathModel],
                   workers: list[PathWorker]) -> dict[str, float]:
    """The evaluator's losses of the evaluated workers' anchors (their local weights put back afterwards)."""
    evaluated = [w for w in workers if models.get(w.path) is w.model]
    saved = {(w.name, mid): w.flat(mid).clone() for w in evaluated for mid in w.module_ids}
    for w in evaluated:
        for mid in w.module_ids:
            w.set_flat(mid, w.outer[mid].anchor)
    try:
        return evaluator.losses(models)
    finally:
        for w in evaluated:
            for mid in w.module_ids:
                w.set_flat(mid, saved[(w.name, mid)])


def _ddp_bytes(workers: list[PathWorker], H: int) -> int:
    """What fp32 data-parallel would send for the same inner steps: every worker sends (and receives)
    its full gradient once per step; a ring all-reduce moves 2·(n−1)/n of it per worker."""
    total = 0
    for w in workers:
        params = sum(p.numel() for p in w.model.parameters())
        total += int(4 * params * H * 2 * (len(workers) - 1) / max(1, len(workers)))
    return total


def _run_sync(spec: SwarmSpec, cfg: SimConfig, H: int, lr: float | None, samplers: list[TokenSampler],
              evaluator: RoutedEval, result: SimResult, emit: Event,
              init_weights: dict[str, torch.Tensor] | None = None) -> None:
    path = spec.path_of_index(0)
    model = build_path(spec, path)
    if init_weights is not None:
        for mid, module in model.named_modules_of_path().items():
            torch.nn.utils.vector_to_parameters(init_weights[mid].clone(), module.parameters())  # a private copy
    opt = make_inner_optimizer(model, spec.inner, lr)
    bs, n = spec.inner.batch_size, len(samplers)
    result.val_loss_before = evaluator.losses({path: model})
    emit("start", {"val_loss": result.val_loss_before, "workers": n})
    step = 0
    for r in range(cfg.rounds):
        losses = []
        for _ in range(H):
            set_warmup_lr(opt, step, spec.inner.warmup_steps)
            opt.zero_grad(set_to_none=True)
            step_loss = 0.0
            for s in samplers:  # each worker's gradient, averaged: what an all-reduce would produce
                x, y = s.sample(bs)
                _, loss = model(x, y)
                (loss / n).backward()
                step_loss += loss.item() / n
                result.tokens_total += y.numel()
            if spec.inner.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), spec.inner.grad_clip)
            opt.step()
            losses.append(step_loss)
            emit("inner_step", {"worker": 0, "loss": step_loss})
            step += 1
        params = sum(p.numel() for p in model.parameters())
        round_ddp = int(4 * params * H * 2 * (n - 1))
        result.ddp_fp32_bytes_equivalent += round_ddp
        result.bytes_sent_total += round_ddp
        val = evaluator.losses({path: model})
        tail = losses[-10:]
        row = {"round": r + 1, "train_loss": {format_path(path): sum(tail) / len(tail)}, "val_loss": val,
               "tokens": result.tokens_total, "bytes_sent": round_ddp, "replicas_identical": True}
        result.rounds.append(row)
        emit("round", row)
    result.val_loss_after = result.rounds[-1]["val_loss"]
    if cfg.checkpoint_dir:
        states = {}
        for mid in model.module_ids:
            weights = model.module_state(mid)
            numel = sum(v.numel() for v in weights.values())
            states[mid] = ModuleState(weights=weights, momentum=torch.zeros(numel), round=cfg.rounds)
        save_checkpoint(cfg.checkpoint_dir, spec, cfg.rounds, states)
