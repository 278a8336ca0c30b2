"""The round loop of a running node: inner steps, sends, settling, and what a complete round leaves behind.

The round, as straight code in `RoundLoop.run`:
  1. H inner AdamW steps on the documents routed to our path (`PathWorker.train_inner`);
  2. for every module of the path: outer gradient → codec frame (error feedback) → sent to the module's
     reducer for this round, in the background (node/peer/rounds.py, protocol/rounds/);
  3. the next H inner steps start at once; when a round's mean lands (checked between inner steps) it is
     settled by the round rule (node/train/round.py): outer Nesterov on the anchor, local weights shifted by
     the anchor's change so the progress made meanwhile is kept (decoupled, as in Decoupled DiLoCo);
  4. once every module's round is settled (`RoundLoop._round_complete`): atomic checkpoint (written on its own
     thread), module announcements, metrics.
A module's round r+1 goes out once its round r settled: one exchange in flight per module (a module we were late
to goes out without waiting for the others' rounds: `run`).

`Node._start` (node/peer/node.py) builds the parts and hands them here by name: the loop owns none of them, so the
node's start and leave (which save, withdraw and close them) stay in one place, and what the loop touches is
written in its constructor.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from pathswarm.logs import human_bytes
from pathswarm.node.peer.announce import Announcer
from pathswarm.node.peer.background import Chores
from pathswarm.node.peer.checkpoints import Checkpoints
from pathswarm.node.peer.config import CLAIMS_READ_S, NodeConfig
from pathswarm.node.peer.counters import Counts
from pathswarm.node.peer.lifecycle import CHECKPOINT_WAIT_S, STOP_SETTLE_S, pace
from pathswarm.node.peer.node_status import NodeStatus
from pathswarm.node.peer.resume import PartialRounds
from pathswarm.node.peer.rounds import Rounds
from pathswarm.node.peer.seat import Seat
from pathswarm.node.peer.splits import Splits
from pathswarm.node.peer.state_sync import StateSync
from pathswarm.node.peer.status import RoundWork
from pathswarm.node.train.worker import PathWorker
from pathswarm.protocol.netloop import STOP_POLL_S
from pathswarm.protocol.rounds.exchange import ModuleExchange
from pathswarm.protocol.wire import Traffic

logger = logging.getLogger(__name__)


class RoundLoop:
    """Runs the rounds on parts the node built (none of them is created or closed here)."""

    def __init__(self, cfg: NodeConfig, *, status: NodeStatus, work: RoundWork, stop_event: threading.Event,
                 worker: PathWorker, seat: Seat, rounds: Rounds, sync: StateSync, splits: Splits,
                 exchange: ModuleExchange, traffic: Traffic, partial: PartialRounds, checkpoints: Checkpoints,
                 announcer: Announcer | None, chores: Chores | None,
                 save_partial: Callable[[], bool], counts: Callable[[], Counts], write_status: Callable[[], None]):
        self.cfg, self.spec = cfg, cfg.spec
        self.status, self.work, self.stop_event = status, work, stop_event
        self.worker, self.seat, self.rounds, self.sync, self.splits = worker, seat, rounds, sync, splits
        self.exchange, self.traffic = exchange, traffic
        self.partial, self.checkpoints = partial, checkpoints
        self.announcer, self.chores = announcer, chores  # None offline
        # The node's own: the round in progress saved, the counters as of now, the status file written.
        self.save_partial, self.counts, self.write_status = save_partial, counts, write_status

    def run(self) -> None:
        """Rounds until asked to stop or `max_rounds` are sent, then the last rounds' settling."""
        spec, H = self.spec, self.spec.inner.steps
        rounds_sent, first_round = 0, self.status.round
        while not self.stop_event.is_set():
            t0 = time.perf_counter()
            losses: list[float] = []
            chunk_tokens = 0
            # A round resumed after a restart (node/peer/resume.py) already has some of its steps.
            for i in range(min(self.partial.take_resumed_steps(), H - 1), H):
                if i == H - 1 and not self.cfg.sync_rounds:
                    self.seat.prefetch_for_send(CLAIMS_READ_S)  # the send's claims read, answered while we train
                t_step = time.perf_counter()
                stats = self.worker.train_inner(1)
                losses.extend(stats.losses)
                chunk_tokens += stats.tokens
                pace(t_step, stats.tokens, self.cfg.max_tokens_per_s, self.stop_event)
                self.status.stepped(self.worker.inner_step, losses[-1], stats.tokens)  # as round_tokens counts them
                # Saved against anchors on disk only (Checkpoints.writing). A write as long as a round would keep it
                # off disk for good (a new one starts every round), so an overdue save waits for the write.
                if self.checkpoints.writing() and self.partial.overdue():
                    with self.work("checkpoint"):
                        self.checkpoints.finish(CHECKPOINT_WAIT_S)
                if not self.checkpoints.writing():
                    self.partial.maybe_save(self.save_partial, self.work)
                if self.worker.inner_step % 10 == 0:
                    with self.work("status"):
                        self.write_status()
                self._poll(block=False)
                if self.stop_event.is_set():
                    break
                if self.rounds.catch_up and i + 1 >= H // 2:
                    # Our last round came late: a shorter chunk moves our next send earlier, back into the group's
                    # window (a node whose phase drifted, or a slower one, would otherwise stay late every round).
                    self.rounds.catch_up = False
                    break
            self.status.chunk_trained(losses, chunk_tokens, time.perf_counter() - t0, first_round)
            # A module's round r-1 must settle before its round r is sent. It normally settled while we trained; if
            # not, a decoupled node stands still for the grace window at most, then trains on, and the steps of a
            # module whose round is still open carry (sync mode waits for every module, as data-parallel training
            # does). A module we were late to last time goes out at once, without waiting for the others: waiting
            # let two holders each late in another module hold each other's rounds to their grace windows for good
            # (benchmarks/restarts.py --kill replying: a restarted holder merged none of its rounds of `shared` for
            # 36 rounds). Sending every module as soon as its round settled avoided that too, but met slices'
            # reducers still settling the round before more often (twice in tests/swarm/test_home_links.py).
            with self.work("settle"):
                if self.cfg.sync_rounds:
                    self._poll_timed()
                else:
                    self._poll(block=False)
            if self.stop_event.is_set():
                break
            with self.work("claims"):
                # Read where the round is sent: every member picks the reducer from a view this fresh, so views
                # agree when membership changes. Decoupled, the read is bounded: a lookup that meets a just-dead
                # peer waits seconds for it, and then the last view (with failed reducers skipped) serves.
                self.seat.refresh_for_send(None if self.cfg.sync_rounds else CLAIMS_READ_S)
            with self.work("send"):
                self.partial.on_send()
                open_ = set(self.rounds.in_flight)
                # With every round settled, all modules go out together. With some still open, only the modules we
                # were late to go out now; the others wait for them as before (sent together once they settle).
                early = [mid for mid in self.rounds.late_modules if mid not in open_] if open_ else None
                sent = self.rounds.send(self.seat.groups, only=early, new_generation=True)
            last = bool(self.cfg.max_rounds) and rounds_sent + 1 >= self.cfg.max_rounds
            still_open: list[str] = []
            if self.cfg.sync_rounds:
                self.rounds.generation_sent()
                with self.work("settle"):
                    self._poll_timed()  # data-parallel: nobody trains on until the round is done
            else:
                rest = [mid for mid in self.worker.module_ids
                        if mid not in sent and not self.rounds.resyncs.pending(mid)]
                if rest:
                    with self.work("settle"):
                        still_open = self._send_settled(rest, None if last else spec.averaging.grace_s)
                self.rounds.generation_sent()
            if len(still_open) == len(self.worker.module_ids):
                continue  # nothing went out this time: not a round sent
            rounds_sent += 1
            if self.cfg.max_rounds and rounds_sent >= self.cfg.max_rounds:
                self._poll(block=True, stoppable=False)
                break
        # Rounds still open after this are abandoned, but stay in flight: the last status file counts their tokens
        # unmerged (not known merged), and the next run, which cannot resume them, counts them lost. A run that ends
        # as planned gives them the grace window; one asked to stop (Ctrl-C) a moment only: it leaves at once.
        self._poll(block=True, stoppable=False,
                   timeout_s=STOP_SETTLE_S if self.stop_event.is_set() else spec.averaging.grace_s)
        if not self.stop_event.is_set():  # asked to stop, the last line says it (`_farewell`)
            for mid in self.rounds.in_flight:
                logger.warning("round of %s still open at shutdown; abandoned", mid)

    def _send_settled(self, waiting: list[str], timeout_s: float | None) -> list[str]:
        """Decoupled: send the modules of `waiting` (not sent with the chunk's first send) together once every round
        still open has settled, standing still `timeout_s` at most (None: the round's own timeout, for the last round
        of a run); then those whose round settled go out, the others train on, their steps going with their next
        send. Returns those."""
        t0 = time.monotonic()
        deadline = t0 + (timeout_s if timeout_s is not None
                         else self.spec.averaging.grace_s + self.spec.averaging.timeout_s + 5)
        while self.rounds.in_flight.keys() & set(waiting) and not self.stop_event.is_set() \
                and time.monotonic() < deadline:
            self._poll(block=True, timeout_s=min(STOP_POLL_S, max(0.0, deadline - time.monotonic())))
        ready = [mid for mid in waiting if mid not in self.rounds.in_flight]
        if ready and not self.stop_event.is_set():
            self.partial.on_send()
            self.rounds.send(self.seat.groups, only=ready)
        waiting = [mid for mid in waiting if mid not in ready]
        self.status.waited(time.monotonic() - t0)
        if waiting:
            logger.info("round of %s still open after %.0f s: training on", ", ".join(waiting),
                        time.monotonic() - t0)
        return waiting

    def _poll_timed(self, timeout_s: float | None = None) -> None:
        """Wait (at most timeout_s; None: the round's own timeout) for the rounds in flight to settle, keeping
        unsettled ones in flight, and record how long training stood still."""
        t0 = time.monotonic()
        if self.cfg.sync_rounds and timeout_s is None:
            # The reducer fails the round when a member dies: it learns that from the claims we read here.
            deadline = t0 + self.spec.averaging.grace_s + self.spec.averaging.timeout_s + 5
            while self.rounds.in_flight and not self.stop_event.is_set() and time.monotonic() < deadline:
                self._poll(block=True, timeout_s=1.0)
                if self.rounds.in_flight:
                    self.seat.refresh()
            self._poll(block=False)  # settles nothing new; completes the round if it is done
        else:
            self._poll(block=True, timeout_s=timeout_s)
        self.status.waited(time.monotonic() - t0)

    def _poll(self, block: bool, timeout_s: float | None = None, stoppable: bool = True) -> None:
        if self._settle_rounds(block, timeout_s, stoppable):
            self._round_complete()
        if self.stop_event.is_set():
            # Leaving: no heal or re-sync now. Their downloads meet peers that are leaving too, each waiting out its
            # timeout (a node asked to stop was still downloading 90 s later); the next run syncs anyway.
            return
        self.splits.heal_found()
        self.sync.resync(self.rounds.resyncs, self.seat.holders)

    def _settle_rounds(self, block: bool, timeout_s: float | None, stoppable: bool) -> bool:
        """`Rounds.poll`, a blocking wait cut in slices so that a stop request ends it at once (a node waiting out
        a slow group's grace window left 10 s after Ctrl-C); True when the round is complete."""
        if not block:
            return self.rounds.poll(False)
        avg = self.spec.averaging
        deadline = time.monotonic() + (timeout_s if timeout_s is not None else avg.grace_s + avg.timeout_s + 5)
        complete = False
        while True:
            left = max(0.0, deadline - time.monotonic())
            final = left <= STOP_POLL_S
            complete = self.rounds.poll(True, min(left, STOP_POLL_S)) or complete
            if final or not self.rounds.in_flight or (stoppable and self.stop_event.is_set()):
                return complete

    def _round_complete(self) -> None:
        st = self.status
        st.round_complete(self.traffic.sent, self.traffic.received)
        if st.round == 1:
            self.seat.trained_first_round()  # our claim says so at once: from now on we may reduce
        for mid in self.exchange.take_behind():
            self.sync.behind(mid, self.seat.holders(mid), self.rounds.resyncs)
        with self.work("checkpoint"):  # the states copied here, the files written meanwhile (node/peer/checkpoints.py)
            self.checkpoints.save(self.worker, self.counts(), self.rounds.residuals_before_send(), background=True)
        self.partial.renew_next_step()
        if self.announcer is not None:
            with self.work("announce"):
                self.announcer.announce()
                self.chores.submit("splits", self.splits.look)
        with self.work("status"):
            self.write_status()
        logger.info("round %d: loss %.4f, %.0f tok/s, group %d, sent %s, received %s", st.round, st.loss,
                    st.tokens_per_s, st.last_group, human_bytes(st.bytes_sent), human_bytes(st.bytes_received))
