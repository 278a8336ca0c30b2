"""The node's round checkpoints (the file format: node/train/checkpoint.py): read once at start (the path a restarted
node takes back, the module states it resumes from, the counters it continues: node/peer/counters.py), written after
every round with the counters as of then, and which round of each module is on disk (the status file records no
later one: node/peer/status.py `write_status`)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

import torch

from pathswarm.node.peer.config import NodeConfig
from pathswarm.node.peer.counters import Counts
from pathswarm.node.peer.node_status import NodeStatus
from pathswarm.node.train.checkpoint import Checkpoint, CheckpointError, load_checkpoint, save_checkpoint
from pathswarm.node.train.worker import PathWorker

logger = logging.getLogger(__name__)


class Checkpoints:
    """Our checkpoint in `cfg.checkpoint_dir` ('' : none). Training thread only."""

    def __init__(self, cfg: NodeConfig):
        self.cfg, self.spec = cfg, cfg.spec
        self.durable: dict[str, int] = {}
        """Module → round of it in our last checkpoint."""
        self._loaded: Checkpoint | bool | None = None  # None: not read yet; False: none usable

    def load(self) -> Checkpoint | None:
        """Our checkpoint, validated against the spec, or None (loaded once: the path choice and the sync use it)."""
        if not self.cfg.checkpoint_dir:
            return None
        if self._loaded is None:
            try:
                self._loaded = load_checkpoint(self.cfg.checkpoint_dir, self.spec)
            except CheckpointError as e:
                # None yet is a first start; anything else (every round damaged, another swarm's) is worth a look
                first_start = not Path(self.cfg.checkpoint_dir).exists()
                logger.log(logging.INFO if first_start else logging.WARNING,
                           "no usable checkpoint (%s)%s", e, "" if first_start else "; starting without it")
                self._loaded = False
        return self._loaded or None

    def path_held(self) -> tuple[int, ...] | None:
        """The path whose modules our checkpoint holds, if it holds exactly one path's."""
        ckpt = self.load()
        if ckpt is None:
            return None
        held = set(ckpt.modules)
        paths = (self.spec.path_of_index(i) for i in range(self.spec.n_paths))
        return next((p for p in paths if set(self.spec.module_ids(p)) == held), None)

    def restore(self, worker: PathWorker, status: NodeStatus) -> Checkpoint | None:
        """Put our checkpoint's state of every module of the worker's path back into it; None (nothing restored) when
        there is no usable checkpoint or it holds another path's modules."""
        ckpt = self.load()
        if ckpt is not None and not set(worker.module_ids) <= set(ckpt.modules):
            logger.info("the checkpoint holds another path's modules (%s); not resuming from it",
                        ", ".join(sorted(ckpt.modules)))
            return None
        if ckpt is not None:
            status.resumed_checkpoint(ckpt.round)
            for mid in worker.module_ids:
                worker.restore(mid, ckpt.modules[mid])
        return ckpt

    def saved_counters(self) -> dict | None:
        """The counters our checkpoint holds, as written (None: no checkpoint, or one without them), whichever path
        its modules are: a node that takes another path is still the same node."""
        ckpt = self.load()
        return None if ckpt is None else ckpt.counters

    def save(self, worker: PathWorker | None, counts: Counts,
             residuals: Mapping[str, torch.Tensor | None] | None = None) -> None:
        """Checkpoint every module's state as of its last round (atomically: node/train/checkpoint.py), and the
        counters as of now; `residuals`: the modules with a round in flight, their error feedback before its send
        (node/peer/rounds.py `residuals_before_send`)."""
        if self.cfg.checkpoint_dir and worker is not None:
            round_ = max(st.round for st in worker.outer.values())
            states = {mid: worker.module_state(mid, residuals) for mid in worker.module_ids}
            try:
                save_checkpoint(self.cfg.checkpoint_dir, self.spec, round_, states, counts.to_json())
            except OSError as e:  # a full disk must not end the node: the last complete round stays on disk
                logger.error("checkpoint of round %d not written (%s); keeping the last one, training on", round_, e)
                return
            self.durable = {mid: st.round for mid, st in states.items()}
