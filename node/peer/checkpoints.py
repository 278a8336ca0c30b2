"""The node's round checkpoints (the file format: node/train/checkpoint.py): read once at start (the path a restarted
node takes back, the module states it resumes from, the counters it continues: node/peer/counters.py), written after
every round with the counters as of then, and which round of each module is on disk (the status file records no
later one: node/peer/status.py `write_status`).

A round's checkpoint is written off the training thread (`LatestWriter`): the training thread takes a copy of the
states (`PathWorker.module_state` copies) and trains on while the files are written and fsync'ed. Written on the
training thread, the fsyncs held every round up for their duration: 0.17 s of a 2.4 s round at H = 10 with 8 nodes
on one host (a fifth of the node's time outside its inner steps), and a large path's gigabytes far longer. A round
completed while the previous one is still being written replaces it in the queue (only the latest round matters);
the run's final checkpoint is written in place, after whatever was being written.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

import torch

from pathswarm.node.peer.config import NodeConfig
from pathswarm.node.peer.counters import Counts
from pathswarm.node.peer.node_status import NodeStatus
from pathswarm.node.train.checkpoint import Checkpoint, CheckpointError, load_checkpoint, save_checkpoint
from pathswarm.node.train.worker import PathWorker

logger = logging.getLogger(__name__)


class LatestWriter:
    """Runs `write(job)` on a thread of its own, one job at a time, keeping only the latest job not yet begun: a job
    submitted while another waits replaces it. The thread lives while there is work (none idles)."""

    def __init__(self, write: Callable[[object], None], name: str):
        self._write, self._name = write, name
        self._cv = threading.Condition()
        self._pending: object | None = None
        self._busy = False  # a thread is running (writing, or about to take the pending job)

    def submit(self, job: object) -> None:
        with self._cv:
            self._pending = job
            if self._busy:
                return
            self._busy = True
        try:
            threading.Thread(target=self._run, name=self._name, daemon=True).start()
        except RuntimeError:  # no thread to be had (a process at its limit): written here, as before the writer
            logger.warning("%s: no thread; writing on the caller's", self._name)
            self._run()

    def busy(self) -> bool:
        """A job is being written or waits to be."""
        with self._cv:
            return self._busy

    def wait(self, timeout_s: float | None = None, drop_pending: bool = False) -> bool:
        """Until nothing is being written (`drop_pending`: a job not begun is dropped first); False on timeout."""
        with self._cv:
            if drop_pending:
                self._pending = None
            return self._cv.wait_for(lambda: not self._busy, timeout_s)

    def _run(self) -> None:
        idle = False
        try:
            while True:
                with self._cv:
                    job, self._pending = self._pending, None
                    if job is None:  # idle, in the same hold of the lock as the last look: no job is left behind
                        self._busy = False
                        self._cv.notify_all()
                        idle = True
                        return
                try:
                    self._write(job)
                except Exception:  # the next job (the next round) tries again; the last complete one stays on disk
                    logger.exception("%s failed", self._name)
        finally:
            if not idle:  # ended by something else (a BaseException): waiters released, the next submit starts anew
                with self._cv:
                    self._busy = False
                    self._cv.notify_all()


class Checkpoints:
    """Our checkpoint in `cfg.checkpoint_dir` ('' : none). Called from the training thread; the writes of
    `save(background=True)` run on a `LatestWriter`."""

    def __init__(self, cfg: NodeConfig):
        self.cfg, self.spec = cfg, cfg.spec
        self.durable: dict[str, int] = {}
        """Module → round of it in our last checkpoint (replaced whole by the writer once a round is on disk)."""
        self._loaded: Checkpoint | bool | None = None  # None: not read yet; False: none usable
        self._writer = LatestWriter(self._write, "checkpoint-writer")

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
             residuals: Mapping[str, torch.Tensor | None] | None = None, background: bool = False) -> None:
        """Checkpoint every module's state as of its last round (atomically: node/train/checkpoint.py), and the
        counters as of now; `residuals`: the modules with a round in flight, their error feedback before its send
        (node/peer/rounds.py `residuals_before_send`). `background`: return once the states are copied, the files
        written on the writer's thread; otherwise written here, after any background write in progress (one not
        begun yet is dropped: this one is newer)."""
        if not self.cfg.checkpoint_dir or worker is None:
            return
        round_ = max(st.round for st in worker.outer.values())
        job = (round_, {mid: worker.module_state(mid, residuals) for mid in worker.module_ids}, counts.to_json())
        if background:
            self._writer.submit(job)
            return
        self._writer.wait(drop_pending=True)
        self._write(job)

    def writing(self) -> bool:
        """A background checkpoint is being written or waits to be: the disk's round is not the one in memory yet
        (a round in progress saved now would name anchors no checkpoint holds, and a restart would not resume it)."""
        return self._writer.busy()

    def finish(self, timeout_s: float | None) -> bool:
        """Wait (at most timeout_s; None: as long as it takes) for the background checkpoint to be on disk; False if
        it is not yet."""
        return self._writer.wait(timeout_s)

    def _write(self, job: tuple[int, dict, dict]) -> None:
        round_, states, counters = job
        try:
            save_checkpoint(self.cfg.checkpoint_dir, self.spec, round_, states, counters)
        except OSError as e:  # a full disk must not end the node: the last complete round stays on disk
            logger.error("checkpoint of round %d not written (%s); keeping the last one, training on", round_, e)
            return
        self.durable = {mid: st.round for mid, st in states.items()}
