"""A pathswarm node: join the DHT, claim a path, sync its modules, train, average each module with its holders.

This file is the node's lifecycle: `Node.run` joins the DHT, `_start` builds the parts (path, model, exchange,
claim, the modules' state, the first evaluation), hands them to the round loop (node/peer/round_loop.py, which
says what a round is), and `_leave` saves, withdraws and closes them once the loop ends.

The parts: config.py (options; the status record, `NodeStatus`, whose methods are its only writers), seat.py (our
path, its claim kept alive, the module groups installed in the exchange), claims.py (the claims on the DHT, who
holds and reduces each module), state_sync.py (a module's state from peers), resyncs.py (re-syncs asked for),
rounds.py (rounds in flight), splits.py (a round merged in two versions, healed), checkpoints.py (the round
checkpoint), resume.py (the round in progress on disk), announce.py (DHT records), status.py (files and timers),
lifecycle.py (signals, pace, the device, lingering, the last line).

SIGINT/SIGTERM: stop at the next inner step (or give up the state download in progress), wait a second for the
round in flight and abandon it if it has not settled, checkpoint the last complete round, save the round in
progress, withdraw the claim, log one last line (what is on disk, what was left), exit 0. A second signal exits at
once (130). Before the DHT is joined, Ctrl-C stops the start (exit 0, nothing saved).
"""

from __future__ import annotations

import logging
import threading
import time

import torch

from pathswarm.node.model.data import DataSpec, TokenSampler, load_documents, split
from pathswarm.node.model.router import documents_of_path
from pathswarm.node.peer.announce import Announcer
from pathswarm.node.peer.background import Chores
from pathswarm.node.peer.checkpoints import Checkpoints
from pathswarm.node.peer.config import NodeConfig
from pathswarm.node.peer.counters import Counts, restart_counts
from pathswarm.node.peer.faults import faults_from_env
from pathswarm.node.peer.lifecycle import (
    CHECKPOINT_WAIT_S,
    farewell,
    linger_s,
    pick_device,
    stop_on_signals,
    validation_batches,
)
from pathswarm.node.peer.node_status import NodeStatus
from pathswarm.node.peer.reachable import start_node_dht
from pathswarm.node.peer.resume import PartialRounds
from pathswarm.node.peer.round_loop import RoundLoop
from pathswarm.node.peer.rounds import Rounds
from pathswarm.node.peer.seat import Seat
from pathswarm.node.peer.splits import Splits
from pathswarm.node.peer.state_sync import StateSync
from pathswarm.node.peer.status import PhaseClock, RoundWork, write_ready, write_status
from pathswarm.node.train.inner import evaluate_loss
from pathswarm.node.train.memory import fit_to_device
from pathswarm.node.train.worker import PathWorker
from pathswarm.protocol.dht import read_revocations
from pathswarm.protocol.netloop import Interrupted, NetLoop
from pathswarm.protocol.reachability import DialBackServer
from pathswarm.protocol.rounds.exchange import ModuleExchange
from pathswarm.protocol.spec import format_path
from pathswarm.protocol.spec_share import SpecServer
from pathswarm.protocol.wire import Traffic

__all__ = ["Node", "NodeConfig", "NodeStatus"]

logger = logging.getLogger(__name__)


class Node:
    def __init__(self, cfg: NodeConfig, handle_signals: bool = False):
        self.cfg, self.spec, self.handle_signals = cfg, cfg.spec, handle_signals
        self.stop_event = threading.Event()
        self.status = NodeStatus()
        self.work = RoundWork(self.status)
        self.partial = PartialRounds(cfg, self.status)
        self.checkpoints = Checkpoints(cfg)
        self.seat = Seat(cfg, self.status, self.checkpoints, self.stop_event)  # our path, claim and module groups
        self.sdht = self.chores = self.announcer = None
        self.worker = self.exchange = self.rounds = self.sync = self.net = None
        self.splits: Splits | None = None
        self._reduced_before = 0  # tokens_reduced of our earlier runs (this run's exchange counts its own)
        self._partial_saved = False  # the round in progress was saved as the run ended
        self._training = False  # the start is over: the training loop runs (or ran)

    # ---- lifecycle ---------------------------------------------------------------------------
    def run(self) -> int:
        cfg, spec = self.cfg, self.spec
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        device = pick_device(cfg.device)
        logger.info("training on %s", device)
        clock = PhaseClock()
        docs = load_documents(DataSpec(corpus="dir", path=cfg.data_dir) if cfg.data_dir else spec.data)
        train, val = split(docs, spec.data.val_fraction)
        clock.lap("data")
        self.net = NetLoop()
        if not cfg.offline:
            try:
                self.sdht = start_node_dht(cfg, spec, self.net)
            except KeyboardInterrupt:  # our handler is not installed yet (below): Python's own raised this
                logger.info("stopped while joining the swarm's DHT: nothing was saved or claimed")
                self.net.stop(timeout_s=1)
                return 0
            self.status.joined_dht(self.sdht.reachable, self.sdht.client_mode)
            self.seat.join(self.sdht)
            clock.lap("dht")
        if self.handle_signals:
            # After the DHT process is forked, so it does not inherit our handler (ParentBoundDHT also resets it).
            stop_on_signals(self.stop_event)
        code = 0
        try:
            try:
                self._start(train, val, device, clock)
            except Interrupted:  # Ctrl-C while the path's modules were being synced: nothing new to save
                self.status.stopped_starting()
                return code
            t0 = time.perf_counter()
            self._training = True
            self._round_loop().run()
            train_wall_s = time.perf_counter() - t0
            self.status.training_stopped(train_wall_s, evaluate_loss(self.worker.model, self.val_batches)[0])
            self.checkpoints.save(self.worker, self._counts())
            # after the round checkpoint it builds on: a restart resumes this very round
            self._partial_saved = self._save_partial(final=True)
            self._write_status()
            code = 2 if self.announcer is not None and self.announcer.revoked else 0  # restarting would not help
            return code
        finally:
            self._leave()
            logger.info("%s", self._farewell(code))

    def _start(self, train: list, val: list, device: str, clock: PhaseClock) -> None:
        """From the DHT joined to the first inner step: path, model, exchange, claim, state, first eval, ready file."""
        cfg, spec = self.cfg, self.spec
        self.status.started_as("offline" if cfg.offline else self.sdht.peer_id)
        path = self.seat.pick_path()
        self.status.took_path(format_path(path))
        clock.lap("path")
        sampler = TokenSampler(documents_of_path(spec, train, path), spec.model.context_len, seed=cfg.seed)
        clock.lap("routing")
        self.worker = PathWorker(spec, path, lambda: sampler.sample(spec.inner.batch_size),
                                 name=self.status.peer_id, device=device, optimizer=cfg.optimizer or None)
        if device.startswith("cuda"):  # train at what the memory plan fits in the card (an OOM later halves it)
            fit_to_device(self.worker, device)
        self._start_exchange()
        self.seat.exchange = self.exchange
        self.splits = Splits(self.worker, self.sync, self.rounds, self.exchange, self.status, self.seat.holders)
        self.sync.replaced = self.splits.replaced  # a re-sync counts the work of ours it replaced, whoever asked
        self.seat.claim(path, self.worker.module_ids)
        clock.lap("model+claim")
        self._initial_sync()
        if spec.init.digests and not cfg.offline:
            self.announcer.announce()  # a warm start's round 0 is downloadable from us before our first round
        clock.lap("sync")
        self.val_batches = validation_batches(spec, val, path, cfg.eval_batches)
        val_loss_before = evaluate_loss(self.worker.model, self.val_batches)[0]
        clock.lap("eval")
        logger.info("ready %s", clock)
        write_ready(cfg.ready_file, self.status.peer_id, [] if cfg.offline else self.sdht.visible_maddrs(),
                    self.status.path)
        if not cfg.offline:
            self.chores = Chores()
            self.announcer.chores = self.chores
            self.seat.start_heartbeat(self.chores)
        self.status.training_started(val_loss_before)

    def _start_exchange(self) -> None:
        spec, offline = self.spec, self.cfg.offline
        self.traffic = Traffic()
        numels = {mid: self.worker.outer[mid].anchor.numel() for mid in self.worker.module_ids}
        streams = None if offline else self.net.run(self.sdht.streams(), 30)
        self.exchange = ModuleExchange(spec, streams, self.status.peer_id, numels,
                                       lambda mid: self.sync.local_states.get(mid), traffic=self.traffic,
                                       membership=self.cfg.membership, sync_world=self.cfg.sync_rounds,
                                       serve_state_bytes_per_s=self.cfg.serve_state_mbps * 1e6 / 8)
        self.exchange.set_client(bool(self.sdht is not None and self.sdht.client_mode))
        self.net.run(self.exchange.start(), 30)
        self.sync = StateSync(spec, self.worker, self.status, self.exchange, self.net, self.sdht, self.stop_event)
        self.rounds = Rounds(self.cfg, self.status, self.worker, self.exchange, self.net, self.sync.publish_local)
        self.exchange.drop_replies(*faults_from_env())
        if not offline:  # any member can hand the spec to a machine joining with --join
            self.net.run(SpecServer([spec]).start(streams), 30)
            if not self.sdht.client_mode:  # tell joiners whether they can be dialed (protocol/reachability.py)
                self.net.run(DialBackServer().start(streams), 30)
            self.announcer = Announcer(spec, self.sdht, self.status, self.worker, None, on_revoked=self.stop_event.set)
            self.announcer.announce_spec_server()

    def _round_loop(self) -> RoundLoop:
        return RoundLoop(self.cfg, status=self.status, work=self.work, stop_event=self.stop_event,
                         worker=self.worker, seat=self.seat, rounds=self.rounds, sync=self.sync, splits=self.splits,
                         exchange=self.exchange, traffic=self.traffic, partial=self.partial,
                         checkpoints=self.checkpoints, announcer=self.announcer, chores=self.chores,
                         save_partial=self._save_partial, counts=self._counts, write_status=self._write_status)

    # ---- state at start ----------------------------------------------------------------------
    def _initial_sync(self) -> None:
        if self.sdht is not None and self.spec.membership.private:
            read_revocations(self.sdht, self.spec)  # before counting anyone's announcement: a revoked peer's count not
        ckpt = self.checkpoints.restore(self.worker, self.status)
        carry = None if ckpt is None else self.partial.resume(self.worker)
        if carry is not None:
            self.rounds.carry = carry
        # The counters go on from where our previous run left them (same peer id or not): what it trained and we
        # did not resume is lost (node/peer/counters.py).
        counts = restart_counts([self.checkpoints.saved_counters(), self.partial.saved_counters()],
                                self.cfg.status_file, self.status.tokens_resumed)
        self.status.counts_continued(counts)
        self._reduced_before = counts.reduced
        warm = ckpt is None and bool(self.spec.init.digests)
        if warm and self.cfg.init_dir:
            self.sync.load_init(self.cfg.init_dir)
        self.sync.initial(ckpt, resumed=carry is not None, need_init=warm and not self.cfg.init_dir,
                          source=f"warm start {self.cfg.init_dir}" if warm and self.cfg.init_dir else "seed",
                          holders=self.seat.live)

    def _save_partial(self, final: bool = False) -> bool:
        """Save the round in progress (False: nothing to save, or not now)."""
        # Steps already sent are not saved: if their round merged, the swarm's anchor holds them already. At the end
        # of the run (final), a round still in flight was abandoned: its fate is unknown, nothing is saved.
        if self.worker is not None and not (final and self.rounds.in_flight):
            self.partial.save(self.worker, self.rounds.unsent_bases(), self.rounds.carry, self._counts())
            return self.partial.enabled
        return False

    # ---- leaving ---------------------------------------------------------------------------
    def _serve_last_frames(self) -> None:
        wait = linger_s(self.exchange.since_last_close_s() if self.exchange is not None else None,
                        self.spec.averaging.grace_s)
        if wait > 0:
            logger.info("serving the frames of the last round we reduced for %.1f s (its members check them)", wait)
            time.sleep(wait)

    def _take_stock(self) -> None:
        reduced = None if self.exchange is None else self._reduced_before + self.exchange.tokens_reduced("shared")
        self.status.took_stock(None if self.rounds is None else self.rounds.unmerged_tokens(), reduced,
                               None if self.worker is None else self.worker.settings())

    def _counts(self) -> Counts:
        """The counters as of now, for a checkpoint or a saved round in progress."""
        self._take_stock()
        return self.status.counts()

    def _write_status(self) -> None:
        self._take_stock()
        write_status(self.cfg.status_file, self.status, self.checkpoints.durable if self.cfg.checkpoint_dir else None)

    def _farewell(self, code: int) -> str:
        return farewell(code, stopped=self.stop_event.is_set(), trained=self._training, rounds_done=self.status.round,
                        checkpoint_dir=self.cfg.checkpoint_dir, durable=self.checkpoints.durable,
                        open_rounds=sorted(self.rounds.in_flight) if self.rounds is not None else [],
                        partial_saved=self._partial_saved)

    def _leave(self) -> None:
        by_signal = self.stop_event.is_set()
        self.stop_event.set()
        if not self.checkpoints.finish(timeout_s=CHECKPOINT_WAIT_S):
            # only after an error ended the loop: a run that ends as planned wrote its final checkpoint in place
            logger.warning("the last round's checkpoint is still being written; leaving without it")
        self.seat.stop_heartbeat()
        # The last round's announcement goes out (bounded: a store can wait seconds on a dead peer).
        if self.chores is not None and not self.chores.finish(timeout_s=1 if by_signal else 5):
            # Typically the last announcement, meeting peers that are leaving too: advisory, not worth waiting for.
            logger.info("a DHT store is still running; leaving without it")
        self.seat.withdraw()
        if not by_signal and self.status.state == "stopped":  # a run that ended as planned, not an error
            self._serve_last_frames()
        if self.net is not None:
            self.net.stop()
            if self.status.state == "stopped":
                self._write_status()  # rounds we closed for others until our network stopped count too
        if self.sdht is not None:
            self.sdht.shutdown()
