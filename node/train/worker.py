"""One path's worker: a PathModel, its inner optimizer, and an outer state per module it holds.

This is the unit both the in-process simulator and the real node drive: `train_inner` runs inner steps;
the outer round itself (contribution, close, settle) is node/train/round.py's, on the worker's `outer`
states, `feedback` residuals and flat weights (`flat` / `set_flat`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch.nn.utils import parameters_to_vector

from pathswarm.compression import ErrorFeedback
from pathswarm.node.model.model import PathModel, build_path, unflatten_like
from pathswarm.node.train.checkpoint import ModuleState
from pathswarm.node.train.inner import InnerStats, MicroBatching, make_inner_optimizer, optimizer_kind, train_steps
from pathswarm.protocol.rounds.outer import OuterState, pseudo_gradient
from pathswarm.protocol.spec import SwarmSpec


class PathWorker:
    def __init__(self, spec: SwarmSpec, path: tuple[int, ...], batches: Callable[[], tuple[torch.Tensor, torch.Tensor]],
                 name: str = "worker", lr: float | None = None, model: PathModel | None = None,
                 device: str = "cpu", optimizer: str | None = None):
        self.spec = spec
        self.path = tuple(path)
        self.name = name
        self.model = (model if model is not None else build_path(spec, self.path)).to(device)
        self.module_ids = self.model.module_ids
        self.batches = batches
        self.opt = make_inner_optimizer(self.model, spec.inner, lr, optimizer)
        self.micro = MicroBatching()  # the whole batch per backward unless a memory plan or an OOM says less
        self.outer = {mid: OuterState.fresh(self.flat(mid)) for mid in self.module_ids}
        self.feedback = {mid: ErrorFeedback() for mid in self.module_ids}
        self.inner_step = 0
        self.round_tokens = 0
        self.round_steps = 0  # inner steps since the last end_round

    # ---- weights as flat vectors, one per module ---------------------------------------------
    def flat(self, mid: str) -> torch.Tensor:
        # Outer state lives on the CPU in fp32 whatever the training device: it is what peers exchange.
        return parameters_to_vector(self.model.module(mid).parameters()).detach().to("cpu", torch.float32, copy=True)

    def set_flat(self, mid: str, vec: torch.Tensor) -> None:
        """Copy a flat vector into the module's parameters (never aliasing it: torch's
        vector_to_parameters would make the parameters views of `vec`, so training would
        silently rewrite the anchor)."""
        offset = 0
        with torch.no_grad():
            for p in self.model.module(mid).parameters():
                n = p.numel()
                p.copy_(vec[offset:offset + n].view_as(p).to(p.device))
                offset += n
        if offset != vec.numel():
            raise ValueError(f"module {mid}: vector has {vec.numel()} values, parameters {offset}")

    # ---- the round ---------------------------------------------------------------------------
    def train_inner(self, steps: int, on_step: Callable[[int, float], None] | None = None) -> InnerStats:
        stats = train_steps(self.model, self.opt, self.batches, self.spec.inner, steps, self.inner_step, on_step,
                            self.micro)
        self.inner_step += steps
        self.round_steps += steps
        self.round_tokens += stats.tokens
        return stats

    def pseudo_grad(self, mid: str) -> torch.Tensor:
        return pseudo_gradient(self.outer[mid].anchor, self.flat(mid))

    def settings(self) -> tuple[str, int, bool]:
        """How it trains: (inner optimizer, sequences per micro-batch or 0 for all, activation checkpointing)."""
        return optimizer_kind(self.opt), self.micro.size, any(m.checkpointing for m in self.model.levels)

    def end_round(self) -> None:
        self.round_tokens = 0
        self.round_steps = 0

    def digest(self, mid: str) -> str:
        return self.outer[mid].digest()

    # ---- checkpoints -------------------------------------------------------------------------
    def module_state(self, mid: str, residuals: Mapping[str, torch.Tensor | None] | None = None) -> ModuleState:
        """The module at its last complete outer round (anchor, not the in-flight local weights). `residuals`: the
        error-feedback residual of modules whose round is in flight, as it was before their send (the current one
        belongs to that round)."""
        st = self.outer[mid]
        weights = unflatten_like(self.model.module(mid).state_dict(), st.anchor)
        residual = residuals[mid] if residuals is not None and mid in residuals else self.feedback[mid].residual
        # The anchor and momentum are not copied: an OuterState never changes (a round makes a new one), and at 1B
        # parameters each copy is 4 GB held while the checkpoint writer writes. The residual changes in place.
        return ModuleState(weights=weights, momentum=st.momentum, round=st.round, reducers=st.reducers,
                           feedback=None if residual is None else residual.clone())

    def restore(self, mid: str, state: ModuleState) -> None:
        """Adopt a module state (from a checkpoint or a peer): anchor, momentum, round, local weights."""
        anchor = state.flat_weights()
        if anchor.numel() != self.outer[mid].anchor.numel() or state.momentum.numel() != anchor.numel():
            raise ValueError(f"module {mid}: state has {anchor.numel()} values, "
                             f"expected {self.outer[mid].anchor.numel()}")
        self.outer[mid] = OuterState(anchor=anchor.clone(), momentum=state.momentum.float().clone(), round=state.round,
                                     reducers=tuple(state.reducers))
        self.set_flat(mid, anchor)
        if state.feedback is not None:  # our own checkpoint's: what our frames had not carried yet
            self.feedback[mid].residual = state.feedback.float().reshape(-1).clone()

