"""A pathswarm node: join the DHT, claim a path, sync its modules, train, average each module with its holders.

The round, as straight code in `Node.train_loop`:
  1. H inner AdamW steps on the documents routed to our path (`PathWorker.train_inner`);
  2. for every module of the path: outer gradient → codec frame (error feedback) → sent to the module's
     reducer for this round, in the background (node/peer/rounds.py, protocol/exchange.py);
  3. the next H inner steps start at once; when a round's mean lands (checked between inner steps) it is
     settled by the round rule (node/train/round.py): outer Nesterov on the anchor, local weights shifted by
     the anchor's change so the progress made meanwhile is kept (decoupled, as in Decoupled DiLoCo);
  4. once every module's round is settled: atomic checkpoint, module announcements, metrics.
Before sending round r+1 the node waits (bounded) for round r's results: one exchange in flight.

The parts: config.py (options, status record), claims.py (path claim, who holds and reduces each module),
state_sync.py (a module's state from peers), rounds.py (rounds in flight), resume.py (the round in progress
on disk), announce.py (DHT records), status.py (files and timers).

SIGINT/SIGTERM: stop at the next inner step, settle or abandon the round in flight, checkpoint the last
complete round, withdraw the claim, exit 0.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from dataclasses import replace

import torch

from pathswarm.node.model.data import DataSpec, TokenSampler, load_documents, split
from pathswarm.node.model.router import documents_of_path
from pathswarm.node.peer.announce import Announcer
from pathswarm.node.peer.background import Chores
from pathswarm.node.peer.claims import Claims, Groups, partners_of
from pathswarm.node.peer.config import CLAIMS_READ_S, ROUND1_SETTLE_S, NodeConfig, NodeStatus
from pathswarm.node.peer.reachable import start_node_dht
from pathswarm.node.peer.resume import PartialRounds
from pathswarm.node.peer.rounds import Rounds, exchange_closer, faults_from_env
from pathswarm.node.peer.splits import Heal, SplitWatch, lost_since, split_verdict
from pathswarm.node.peer.state_sync import StateSync
from pathswarm.node.peer.status import PhaseClock, RoundWork, write_ready, write_status
from pathswarm.node.train.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from pathswarm.node.train.inner import evaluate_loss
from pathswarm.node.train.memory import fit_to_device
from pathswarm.node.train.worker import PathWorker
from pathswarm.protocol.dht import read_revocations
from pathswarm.protocol.exchange import ModuleExchange
from pathswarm.protocol.netloop import NetLoop
from pathswarm.protocol.reachability import DialBackServer
from pathswarm.protocol.spec import format_path, parse_path
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
        self.splits = SplitWatch()
        self.sdht = self.claims = self.chores = self.heartbeat = self.announcer = None
        self.worker = self.exchange = self.rounds = self.sync = self.net = None
        self.groups: Groups | None = None
        self._durable: dict[str, int] = {}  # module → round of it in our last checkpoint (see _write_status)
        self._checkpoint = None  # None: not read yet; False: none usable (see _load_checkpoint)
        self._chunk_tokens = 0  # tokens of the chunk being trained, not yet added to status.tokens_trained
        self._claims_not_before = 0.0  # monotonic time before which claims are not read (see _round_complete)

    # ---- lifecycle ---------------------------------------------------------------------------
    def run(self) -> int:
        cfg, spec = self.cfg, self.spec
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        device = self._device()
        logger.info("training on %s", device)
        clock = PhaseClock()
        docs = load_documents(DataSpec(corpus="dir", path=cfg.data_dir) if cfg.data_dir else spec.data)
        train, val = split(docs, spec.data.val_fraction)
        clock.lap("data")
        self.net = NetLoop()
        if not cfg.offline:
            self.sdht = start_node_dht(cfg, spec, self.net)
            self.status.reachable, self.status.client = self.sdht.reachable, self.sdht.client_mode
            self.claims = Claims(self.sdht, spec, self.stop_event, lambda: self.status.round, self._use_groups)
            clock.lap("dht")
        if self.handle_signals:
            # After the DHT process is forked, so it does not inherit our handler (ParentBoundDHT also resets it).
            self._install_signal_handlers()
        try:
            self.status.peer_id = "offline" if cfg.offline else self.sdht.peer_id
            path = self._pick_path()
            self.status.path = format_path(path)
            clock.lap("path")
            sampler = TokenSampler(documents_of_path(spec, train, path), spec.model.context_len, seed=cfg.seed)
            clock.lap("routing")
            self.worker = PathWorker(spec, path, lambda: sampler.sample(spec.inner.batch_size),
                                     name=self.status.peer_id, device=device, optimizer=cfg.optimizer or None)
            if device.startswith("cuda"):  # train at what the memory plan fits in the card (an OOM later halves it)
                fit_to_device(self.worker, device)
            self._start_exchange()
            if cfg.offline:
                me = self.status.peer_id
                self._use_groups(Groups({mid: [me] for mid in self.worker.module_ids},
                                        {mid: (me,) for mid in self.worker.module_ids}, {}))
            else:
                self.claims.publish(path, self.status.tokens_per_s)
                self.claims.wait_for_peers(cfg.wait_peers, cfg.wait_peers_timeout_s)
            clock.lap("model+claim")
            self._initial_sync()
            if self.spec.init.digests and not cfg.offline:
                self.announcer.announce()  # a warm start's round 0 is downloadable from us before our first round
            clock.lap("sync")
            val_docs = documents_of_path(spec, val, path, allow_empty=True) or val
            self.val_batches = list(TokenSampler(val_docs, spec.model.context_len, seed=0)
                                    .eval_batches(spec.inner.batch_size, cfg.eval_batches))
            self.status.val_loss_before = evaluate_loss(self.worker.model, self.val_batches)[0]
            clock.lap("eval")
            logger.info("ready %s", clock)
            write_ready(cfg.ready_file, self.status.peer_id, [] if cfg.offline else self.sdht.visible_maddrs(),
                        self.status.path)
            if not cfg.offline:
                self.chores = Chores()
                self.announcer.chores = self.chores
                self.heartbeat = threading.Thread(target=self._heartbeat, name="pathswarm-heartbeat", daemon=True)
                self.heartbeat.start()
            self.status.state = "training"
            t0 = time.perf_counter()
            self.train_loop()
            self.status.train_wall_s = time.perf_counter() - t0
            self.status.val_loss_after = evaluate_loss(self.worker.model, self.val_batches)[0]
            self.status.state = "stopped"
            self._save()
            self._save_partial()  # after the round checkpoint it builds on: a restart resumes this very round
            self._write_status()
            return 2 if self.announcer is not None and self.announcer.revoked else 0  # restarting would not help
        finally:
            self._leave()

    def _install_signal_handlers(self) -> None:
        def handler(signum, frame):
            logger.info("signal %d: finishing the round and leaving the swarm", signum)
            self.stop_event.set()

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)

    def _start_exchange(self) -> None:
        spec, offline = self.spec, self.cfg.offline
        self.traffic = Traffic()
        numels = {mid: self.worker.outer[mid].anchor.numel() for mid in self.worker.module_ids}
        streams = None if offline else self.net.run(self.sdht.streams(), 30)
        self.exchange = ModuleExchange(spec, streams, self.status.peer_id, numels,
                                       lambda mid: self.sync.local_states.get(mid), exchange_closer(spec),
                                       self.traffic, membership=self.cfg.membership, sync_world=self.cfg.sync_rounds)
        self.exchange.client = bool(self.sdht is not None and self.sdht.client_mode)
        self.net.run(self.exchange.start(), 30)
        self.sync = StateSync(spec, self.worker, self.status, self.exchange, self.net, self.sdht)
        self.rounds = Rounds(self.cfg, self.status, self.worker, self.exchange, self.net, self.sync.publish_local)
        self.exchange.drop_reply = faults_from_env()
        if not offline:  # any member can hand the spec to a machine joining with --join
            self.net.run(SpecServer([spec]).start(streams), 30)
            if not self.sdht.client_mode:  # tell joiners whether they can be dialed (protocol/reachability.py)
                self.net.run(DialBackServer().start(streams), 30)
            self.announcer = Announcer(spec, self.sdht, self.status, self.worker, None, on_revoked=self.stop_event.set)
            self.announcer.announce_spec_server()

    def _device(self) -> str:
        if self.cfg.device == "auto":
            return "cuda" if torch.cuda.is_available() else "cpu"
        if self.cfg.device == "cuda" and not torch.cuda.is_available():
            raise ValueError("--device cuda: no CUDA device is available")
        return self.cfg.device

    # ---- path, claims and groups -------------------------------------------------------------
    def _pick_path(self) -> tuple[int, ...]:
        if self.cfg.offline:
            return self.spec.path_of_index(0) if self.cfg.path == "auto" else parse_path(self.cfg.path, self.spec)
        if self.cfg.path == "auto" and (resumed := self._checkpoint_path()) is not None:
            # A restarted node takes its path back without the settling wait: its checkpoint holds that
            # path's modules, and its claim lapsed only moments ago (no other node is likely to have moved in).
            return resumed
        path = self.claims.choose_path(self.cfg.path)
        return self.claims.settle_path(path) if self.cfg.path == "auto" else path

    def _use_groups(self, groups: Groups) -> None:
        """Install freshly derived groups: holders for our sends, group sizes for the rounds we reduce."""
        self.groups = groups
        self.exchange.genesis, self.exchange.partners = groups.genesis, partners_of(groups, self.status.groups,
                                                                                    self.status.peer_id)
        for mid, peers in groups.holders.items():
            if self.cfg.sync_rounds:
                # A data-parallel job's world only grows: a dead worker still counts, and the round waits
                # for it to come back (up to timeout_s), as a collective waits for a missing rank.
                self.exchange.expected_holders[mid] = max(len(peers), self.exchange.expected_holders.get(mid, 0))
                self.exchange.live_holders[mid] = groups.live[mid]  # one assignment: the network thread reads it
            else:
                # A peer whose contributions we refuse (a proven liar, a revoked member) cannot complete a round we
                # reduce: counted, it would hold every such round open for the whole grace window
                # (benchmarks/hostile.py's lying arm: a caught liar that keeps claiming its path).
                self.exchange.expected_holders[mid] = sum(1 for p in peers if not self.exchange.refuses(p))

    def _renew_claim(self) -> None:
        try:
            # At start the first view is worth waiting for; a renewal must not hold the chores thread for long.
            self.claims.publish(self.worker.path, self.status.tokens_per_s,
                                None if self.chores is None else 3 * CLAIMS_READ_S)
        except Exception as e:  # a DHT hiccup must not kill training; the heartbeat retries
            logger.warning("could not renew the claim: %s", e)

    def _heartbeat(self) -> None:
        # A timer only: the renewal runs on the chores thread, so no two DHT writes of our claim race.
        period = max(1.0, self.spec.averaging.claim_ttl_s / 3)
        while not self.stop_event.wait(period):
            self.chores.submit("claim", self._renew_claim, first=True)

    def _refresh_claims(self, timeout_s: float | None = None) -> None:
        if self.claims is None:
            return
        try:
            self.claims.refresh(timeout_s)
        except TimeoutError as e:
            self.status.claims_read_late += 1
            logger.debug("claims: %s; the last view serves", e)
            self.claims.rederive()
        except Exception as e:  # keep the last view; the round still runs
            logger.warning("could not read claims: %s", e)

    # ---- checkpoint and state ----------------------------------------------------------------
    def _load_checkpoint(self):
        """Our checkpoint, validated against the spec, or None (loaded once: the path choice and the sync use it)."""
        if not self.cfg.checkpoint_dir:
            return None
        if self._checkpoint is None:
            try:
                self._checkpoint = load_checkpoint(self.cfg.checkpoint_dir, self.spec)
            except CheckpointError as e:
                logger.info("no usable checkpoint (%s)", e)
                self._checkpoint = False
        return self._checkpoint or None

    def _checkpoint_path(self) -> tuple[int, ...] | None:
        """The path whose modules our checkpoint holds, if it holds exactly one path's."""
        ckpt = self._load_checkpoint()
        if ckpt is None:
            return None
        held = set(ckpt.modules)
        paths = (self.spec.path_of_index(i) for i in range(self.spec.n_paths))
        return next((p for p in paths if set(self.spec.module_ids(p)) == held), None)

    def _initial_sync(self) -> None:
        if self.sdht is not None and self.spec.membership.private:
            read_revocations(self.sdht, self.spec)  # before counting anyone's announcement: a revoked peer's count not
        ckpt = self._load_checkpoint()
        if ckpt is not None and not set(self.worker.module_ids) <= set(ckpt.modules):
            logger.info("the checkpoint holds another path's modules (%s); not resuming from it",
                        ", ".join(sorted(ckpt.modules)))
            ckpt = None
        carry = None
        if ckpt is not None:
            self.status.checkpoint_round = ckpt.round
            for mid in self.worker.module_ids:
                self.worker.restore(mid, ckpt.modules[mid])
            carry = self.partial.resume(self.worker)
            if carry is not None:
                self.rounds.carry = carry
        warm = ckpt is None and bool(self.spec.init.digests)
        if warm and self.cfg.init_dir:
            self.sync.load_init(self.cfg.init_dir)
        self.sync.initial(ckpt, resumed=carry is not None, need_init=warm and not self.cfg.init_dir,
                          source=f"warm start {self.cfg.init_dir}" if warm and self.cfg.init_dir else "seed",
                          holders=lambda mid: self.groups.live.get(mid, {}) if self.groups else {})

    def _save(self) -> None:
        if self.cfg.checkpoint_dir and self.worker is not None:
            round_ = max(st.round for st in self.worker.outer.values())
            states = {mid: self.worker.module_state(mid) for mid in self.worker.module_ids}
            try:
                save_checkpoint(self.cfg.checkpoint_dir, self.spec, round_, states)
            except OSError as e:  # a full disk must not end the node: the last complete round stays on disk
                logger.error("checkpoint of round %d not written (%s); keeping the last one, training on", round_, e)
                return
            self._durable = {mid: st.round for mid, st in states.items()}

    def _save_partial(self) -> None:
        if self.worker is None or self.rounds.abandoned:
            return
        # Steps already sent are not saved: if their round merged, the swarm's anchor holds them already.
        inf = self.rounds.in_flight
        bases = {mid: inf[mid].sent.merged_base if mid in inf else self.worker.outer[mid].anchor
                 for mid in self.worker.module_ids}
        self.partial.save(self.worker, bases, self.rounds.carry, self._chunk_tokens)

    # ---- the round loop ----------------------------------------------------------------------
    def train_loop(self) -> None:
        spec, H = self.spec, self.spec.inner.steps
        rounds_sent, first_round = 0, self.status.round
        while not self.stop_event.is_set():
            t0 = time.perf_counter()
            losses: list[float] = []
            chunk_tokens = self._chunk_tokens = 0
            # A round resumed after a restart (node/peer/resume.py) already has some of its steps.
            for i in range(min(self.partial.take_resumed_steps(), H - 1), H):
                t_step = time.perf_counter()
                stats = self.worker.train_inner(1)
                losses.extend(stats.losses)
                chunk_tokens += stats.tokens
                self._chunk_tokens = chunk_tokens  # not in tokens_trained yet: a saved round in progress says so
                self._pace(t_step, stats.tokens)
                self.status.inner_step, self.status.loss = self.worker.inner_step, losses[-1]
                self.partial.maybe_save(self._save_partial, self.work)
                if self.worker.inner_step % 10 == 0:
                    with self.work("status"):
                        self._write_status()
                self._poll(block=False)
                if self.stop_event.is_set():
                    break
                if self.rounds.catch_up and i + 1 >= H // 2:
                    # Our last round came late: a shorter chunk moves our next send earlier, back into the group's
                    # window (a node whose phase drifted, or a slower one, would otherwise stay late every round).
                    self.rounds.catch_up = False
                    break
            self._end_chunk(losses, chunk_tokens, time.perf_counter() - t0, first_round)
            # Round r-1 must settle before round r is sent. It normally settled while we trained; if its reducer
            # is frozen or slow, a decoupled node stands still for the grace window at most, then trains on: the
            # next outer gradient carries these steps too (sync mode waits, as data-parallel training does).
            with self.work("settle"):
                self._poll_timed(None if self.cfg.sync_rounds else spec.averaging.grace_s)
            if self.stop_event.is_set():
                break
            if self.rounds.in_flight:
                logger.info("previous round still open after %.0f s: training on", spec.averaging.grace_s)
                continue
            with self.work("claims"):
                self.stop_event.wait(max(0.0, self._claims_not_before - time.monotonic()))
                # Read where the round is sent: every member picks the reducer from a view this fresh, so views
                # agree when membership changes. Decoupled, the read is bounded: a lookup that meets a just-dead
                # peer waits seconds for it, and then the last view (with failed reducers skipped) serves.
                self._refresh_claims(None if self.cfg.sync_rounds else CLAIMS_READ_S)
            with self.work("send"):
                self.partial.on_send()
                self.rounds.send(self.groups)
            rounds_sent += 1
            if self.cfg.sync_rounds:
                with self.work("settle"):
                    self._poll_timed()  # data-parallel: nobody trains on until the round is done
            if self.cfg.max_rounds and rounds_sent >= self.cfg.max_rounds:
                self._poll(block=True)
                break
        self._poll(block=True, timeout_s=spec.averaging.grace_s)

    def _pace(self, t_step: float, tokens: int) -> None:
        if self.cfg.max_tokens_per_s > 0:
            # Pace every step on its own: time lost to a frozen machine is not made up by running faster.
            ahead = t_step + tokens / self.cfg.max_tokens_per_s - time.perf_counter()
            if ahead > 0:
                self.stop_event.wait(ahead)

    def _end_chunk(self, losses: list[float], tokens: int, elapsed_s: float, first_round: int) -> None:
        st = self.status
        st.loss = sum(losses[-10:]) / max(1, len(losses[-10:]))
        st.loss_curve.append(st.loss)
        # numbered by rounds trained, counted from the round the node started (or resumed) at
        st.loss_history.append((first_round + len(st.loss_curve), st.loss))
        st.tokens_trained += tokens
        self._chunk_tokens = 0
        st.tokens_per_s = tokens / max(elapsed_s, 1e-9)

    def _poll_timed(self, timeout_s: float | None = None) -> None:
        """Wait (at most timeout_s; None: the round's own timeout) for the rounds in flight to settle, keeping
        unsettled ones in flight, and record how long training stood still."""
        t0 = time.monotonic()
        if self.cfg.sync_rounds and timeout_s is None:
            # The reducer fails the round when a member dies: it learns that from the claims we read here.
            deadline = t0 + self.spec.averaging.grace_s + self.spec.averaging.timeout_s + 5
            while self.rounds.in_flight and not self.stop_event.is_set() and time.monotonic() < deadline:
                self._poll(block=True, timeout_s=1.0, abandon=False)
                if self.rounds.in_flight:
                    self._refresh_claims()
            self._poll(block=False, abandon=False)  # settles nothing new; completes the round if it is done
        else:
            self._poll(block=True, timeout_s=timeout_s, abandon=False)
        self.status.wait_max_s = max(self.status.wait_max_s, round(time.monotonic() - t0, 3))

    def _poll(self, block: bool, timeout_s: float | None = None, abandon: bool = True) -> None:
        if self.rounds.poll(block, timeout_s, abandon):
            self._round_complete()
        for heal in self.splits.take():
            self._heal(heal)
        self.sync.resync(self.rounds, self._holders)

    def _round_complete(self) -> None:
        st = self.status
        st.round += 1
        if st.round == 1 and self.chores is not None:
            # Our claim now says we have trained a round, so we may reduce. Stored before our next send, on this thread
            # (once per run): peers that read it late would pick another reducer than we do, a split round. Claims
            # are read no sooner than ROUND1_SETTLE_S later, so that the renewals of peers that finished round 1 with
            # us land first; we train meanwhile (this used to be a pause of the training loop: 2 % of a short run).
            self._renew_claim()
            self._claims_not_before = time.monotonic() + ROUND1_SETTLE_S
        st.bytes_sent, st.bytes_received = self.traffic.sent, self.traffic.received
        for mid in list(self.exchange.behind):
            self.exchange.behind.pop(mid, None)
            self.sync.behind(mid, self._holders(mid), self.rounds)
        with self.work("checkpoint"):
            self._save()
        self.partial.renew_next_step()
        if self.announcer is not None:
            with self.work("announce"):
                self.announcer.announce()
                self.chores.submit("splits", self._look_for_splits)
        with self.work("status"):
            self._write_status()
        logger.info("round %d: loss %.4f, %.0f tok/s, group %d, sent %d B, received %d B", st.round, st.loss,
                    st.tokens_per_s, st.last_group, st.bytes_sent, st.bytes_received)

    def _look_for_splits(self) -> None:
        """Chores thread: compare our modules' digests with those their other holders announce."""
        try:
            for mid in self.worker.module_ids:
                mine = self.sync.local_states.get(mid)
                if mine is None or mine.round == 0:
                    continue
                announced, me, counted = self.sync.announced(mid, self._holders(mid))
                self.splits.observe(split_verdict(mid, mine.round, mine.digest, me, announced, counted))
        except Exception as e:  # advisory: the next round looks again
            logger.warning("could not compare digests with the module's holders: %s", e)

    def _heal(self, heal: Heal) -> None:
        """Our version of a split round lost: count its work as discarded and re-sync from the winning side."""
        mine = self.sync.local_states.get(heal.module)
        if mine is None or mine.round != heal.round or mine.digest != heal.ours:
            return  # our state moved on (a re-sync already replaced it)
        lost = lost_since(self.rounds.merged_log.get(heal.module, {}), heal.round)
        reduced = lost_since(self.exchange.reduced_log.get(heal.module, {}), heal.round)
        self.exchange.tokens_reduced[heal.module] = self.exchange.tokens_reduced.get(heal.module, 0) - reduced
        if heal.module == "shared":
            self.status.tokens_merged -= lost
            self.status.tokens_discarded += lost
            self.status.tokens_reduced_discarded += reduced
        self.status.splits_healed += 1
        self.rounds.resync_from[heal.module] = heal.peer

    def _holders(self, mid: str) -> list[str]:
        return self.groups.holders.get(mid, []) if self.groups is not None else []

    def _write_status(self) -> None:
        if self.rounds is not None:
            self.status.tokens_unmerged = self.rounds.unmerged_tokens()
        if self.exchange is not None:
            self.status.tokens_reduced = self.exchange.tokens_reduced.get("shared", 0)
        if self.worker is not None:
            # how it trains: a memory plan (or an out-of-memory error, halving the micro-batch) may have changed it
            self.status.optimizer, self.status.micro_batch, self.status.checkpointing = self.worker.settings()
        status = self.status
        if self.cfg.checkpoint_dir:
            # A round is on record once our checkpoint holds it: a kill between a settle and the checkpoint would
            # leave on record a round the restarted node trains again (benchmarks/restarts.py saw one such split).
            durable = self._durable
            status = replace(status, history={m: {r: d for r, d in h.items() if int(r) <= durable.get(m, 0)}
                                              for m, h in status.history.items()},
                             groups={m: {r: g for r, g in h.items() if int(r) <= durable.get(m, 0)}
                                     for m, h in status.groups.items()})
        write_status(self.cfg.status_file, status)

    def _leave(self) -> None:
        self.stop_event.set()
        if self.heartbeat is not None:
            self.heartbeat.join(timeout=10)
        if self.chores is not None:
            # The last round's announcement goes out (bounded: a store can wait seconds on a dead peer).
            if not (self.chores.wait_idle(timeout_s=5) and self.chores.close(timeout_s=1)):
                self.chores.close(timeout_s=0)
                # Typically the last announcement, meeting peers that are leaving too: advisory, not worth waiting for.
                logger.info("a DHT store is still running; leaving without it")
        try:
            if self.claims is not None:
                self.claims.withdraw()
        except Exception as e:
            logger.warning("could not withdraw the claim: %s", e)
        if self.net is not None:
            self.net.stop()
            if self.status.state == "stopped":
                self._write_status()  # rounds we closed for others until our network stopped count too
        if self.sdht is not None:
            self.sdht.shutdown()
