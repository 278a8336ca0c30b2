"""The node's side of saving and resuming the round in progress (the file format: node/peer/partial_round.py).

The round in progress is saved every `partial_every_s` at most, and never with more than 1/PARTIAL_COST_SHARE
of training time, so a crash loses seconds of training, not the round. Steps already sent are not saved (if
their round merged, the swarm's anchor holds them already), and sending a round deletes the saved one. Each save
holds the node's counters too (node/peer/counters.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import torch

from pathswarm.node.peer.config import PARTIAL_COST_SHARE, NodeConfig
from pathswarm.node.peer.counters import Counts
from pathswarm.node.peer.node_status import NodeStatus
from pathswarm.node.peer.partial_round import PartialError, discard_partial, load_partial, save_partial, saved_counters
from pathswarm.node.train.worker import PathWorker

logger = logging.getLogger(__name__)


class PartialRounds:
    def __init__(self, cfg: NodeConfig, status: NodeStatus):
        self.cfg, self.status = cfg, status
        # The synchronous baseline restarts from the last good state, as a data-parallel job does.
        self.enabled = bool(cfg.checkpoint_dir and cfg.partial_every_s > 0 and not cfg.sync_rounds)
        self.next_save = 0.0  # perf_counter time of the next save
        self.earliest = 0.0  # perf_counter time before which no save fits the 1/PARTIAL_COST_SHARE budget
        self.resumed_steps = 0  # inner steps of the resumed round that the first chunk skips

    def resume(self, worker: PathWorker) -> dict[str, int] | None:
        """Take over the round in progress our previous run saved on top of the checkpoint just restored.
        Returns the carried tokens per module, or None when there is nothing to resume."""
        if not self.enabled:
            return None
        try:
            got = load_partial(self.cfg.checkpoint_dir, self.cfg.spec, worker)
        except PartialError as e:
            logger.info("no round in progress to resume (%s)", e)
            return None
        self.status.resumed_round(got.round_tokens + got.carry.get("shared", 0), got.inner_step)
        self.resumed_steps = got.round_steps
        logger.info("resumed the round in progress: %d tokens of inner steps, inner step %d",
                    self.status.tokens_resumed, got.inner_step)
        return dict(got.carry)

    def take_resumed_steps(self) -> int:
        steps, self.resumed_steps = self.resumed_steps, 0
        return steps

    def maybe_save(self, save: Callable[[], None], work: Callable) -> None:
        if not self.enabled or time.perf_counter() < self.next_save:
            return
        t0 = time.perf_counter()
        with work("partial"):
            save()
        spent = time.perf_counter() - t0
        # At most 1/PARTIAL_COST_SHARE of training time: a big model saves less often than a small one.
        self.earliest = t0 + PARTIAL_COST_SHARE * spent
        self.next_save = max(t0 + self.cfg.partial_every_s, self.earliest)

    def overdue(self) -> bool:
        """A save has been due for a further `partial_every_s`: whatever keeps it back (a checkpoint still being
        written: RoundLoop.run) should give way."""
        return self.enabled and time.perf_counter() >= self.next_save + self.cfg.partial_every_s

    def saved_counters(self) -> Any:
        """The counters the saved round in progress holds, as written (None: none), resumed or not."""
        return saved_counters(self.cfg.checkpoint_dir, self.cfg.spec.swarm_id) if self.cfg.checkpoint_dir else None

    def save(self, worker: PathWorker, bases: dict[str, torch.Tensor], carry: dict[str, int], counts: Counts) -> None:
        """bases: per module, what the saved steps are measured from (the anchor, or the weights at the send);
        counts: the node's counters as of now."""
        if not self.enabled:
            return
        try:
            save_partial(self.cfg.checkpoint_dir, self.cfg.spec, worker, bases, carry, counts.to_json())
        except Exception as e:  # a full disk must not stop training; the round checkpoint still stands
            logger.warning("could not save the round in progress: %s", e)

    def on_send(self) -> None:
        """The saved round holds the steps about to be sent: if this round merges and we crash before the next
        save, resuming it would apply them twice. The next step saves it anew, without them."""
        if self.enabled:
            discard_partial(self.cfg.checkpoint_dir)
            self.next_save = self.earliest

    def renew_next_step(self) -> None:
        """The anchors changed: the saved round was made against the old ones (a resume would ignore it). Save anew
        as soon as the budget allows: saving at once after every send and every round cost a 25M-parameter node
        3.5-4 % of its training time (benchmarks/results/overhead.json), twice the budget."""
        self.next_save = self.earliest
