"""The node's outer rounds with its peers: send each module's contribution to its reducer, settle what comes back.

The rule itself (contribution, settle) is node/train/round.py's, the very functions the simulator runs; this
file adds what only a live node has: the exchange in the background (protocol/rounds/), rounds still in
flight while the next inner steps train, tokens carried across rounds that did not merge, reducers that failed
us, and re-syncs when our replica is not the group's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection
from concurrent.futures import Future

import torch

from pathswarm.node.peer.claims import Groups
from pathswarm.node.peer.config import NodeConfig
from pathswarm.node.peer.flights import InFlight, UnitFlight, applied_parts, whole_of, wire_s
from pathswarm.node.peer.node_status import NodeStatus
from pathswarm.node.peer.resyncs import Resyncs
from pathswarm.node.peer.round_checks import RoundChecks
from pathswarm.node.train.round import (
    eager_shift,
    feedback_decay,
    make_slice_contributions,
    restore_feedback,
    settle,
    settle_slices,
)
from pathswarm.node.train.worker import PathWorker
from pathswarm.protocol.netloop import NetLoop
from pathswarm.protocol.rounds.exchange import ModuleExchange
from pathswarm.protocol.rounds.messages import RoundStatus
from pathswarm.protocol.rounds.reducers import candidates
from pathswarm.protocol.rounds.slices import agreed_list, slice_count, units_of, view

logger = logging.getLogger(__name__)

MERGED_LOG_ROUNDS = 64
"""Rounds of our merged tokens kept per module: a split is found within a round or two of happening."""


class Rounds:
    """Rounds in flight, tokens carried, re-syncs pending. Driven by the training thread only."""

    def __init__(self, cfg: NodeConfig, status: NodeStatus, worker: PathWorker, exchange: ModuleExchange,
                 net: NetLoop, publish_local: Callable[[str], None]):
        self.cfg, self.spec, self.status = cfg, cfg.spec, status
        self.worker, self.exchange, self.net = worker, exchange, net
        self.publish_local = publish_local
        self.in_flight: dict[str, InFlight] = {}
        self.holders: dict[str, list[str]] = {}
        """Module → its holders in the claims as of the last send."""
        # module → tokens whose steps stayed in our local weights without being merged (a late, failed or
        # skipped round): the next outer gradient of that module carries those steps, so it counts them too.
        self.carry: dict[str, int] = {}
        self.resyncs = Resyncs()
        """Re-syncs asked for (here, by StateSync and by the split watch), done by StateSync.resync."""
        self.catch_up = False  # our last round came late: make the next chunk shorter
        self.settled_any = False  # a round settled since the last completed one
        self.generation = 0  # chunks of inner steps whose outer gradients were sent (`send`)
        self.completed_generation = 0  # the last generation every module of which settled (`poll`)
        self.flight_generation: dict[str, int] = {}  # module in flight → the generation it was sent in
        self.sending = False  # the current generation has late modules still to send (`generation_sent`)
        self.late_modules: set[str] = set()  # modules whose last applied round came late for us
        # module → state round → our tokens merged in the round that made it (a healed split takes them back)
        self.merged_log: dict[str, dict[int, int]] = {}
        # module → state rounds of merged_log whose digest was not the group's: our tokens are in the group's version
        # of that round (the reducer merged them), so a re-sync to the group's state keeps them (Splits.replaced)
        self.diverged_log: dict[str, set[int]] = {}
        self.checks = RoundChecks(cfg, status, worker, exchange, net)
        self.auditor, self.applied = self.checks.auditor, self.checks.applied

    def send(self, groups: Groups, only: Collection[str] | None = None,
             new_generation: bool | None = None) -> list[str]:
        """Every module's outer gradient to its reducers (`only`: those modules'); the rounds run in the background.
        Who reduces follows from the last round's result (the module state's `reducers`), else, before any, from the
        claims. A module's round is cut into slices when the spec allows it and the list names enough members
        (protocol/rounds/slices.py): one contribution per slice, each to its own rotation of the list.

        A module whose previous round is still in flight is not sent: its steps carry (the node sends it once that
        round settles, `RoundLoop._send_settled`). Without `only` (or with `new_generation`), the send opens a new
        generation of rounds (one chunk of inner steps): the node's round is complete once every module sent in a
        generation has settled (`poll`). Returns the modules sent."""
        self.holders = groups.holders  # the audit's group size counts these, not the size a reducer reports
        if new_generation if new_generation is not None else only is None:
            self.generation += 1
            # with modules still to send, this generation waits for them to go out (`generation_sent`)
            self.sending = only is not None or any(mid in self.in_flight for mid in self.worker.module_ids)
        tokens = self.worker.round_tokens
        timeout = self.spec.averaging.grace_s + self.spec.averaging.timeout_s
        audits_by = time.monotonic() + self.spec.averaging.grace_s  # our pending audits hold the send this long
        out = []
        for mid in self.worker.module_ids:
            if self.resyncs.pending(mid) or mid in self.in_flight or (only is not None and mid not in only):
                # re-synced keeping our progress, or its last round still open: the steps stay in our weights
                self.carry[mid] = self.carry.get(mid, 0) + tokens
                continue
            self.auditor.before_send(mid, audits_by)
            if self.checks.undo_lies(mid, self.merged_log.get(mid, {})):
                self.publish_local(mid)
            st = self.worker.outer[mid]
            units = units_of(mid, st.anchor.numel(), slice_count(st.anchor.numel(), st.reducers or groups.genesis[mid],
                                                                 self.spec.averaging.slices))
            local = self.worker.flat(mid)
            parts = make_slice_contributions(st, local, self.worker.feedback[mid], self.spec.codec,
                                             tokens + self.carry.pop(mid, 0), units, feedback_decay(self.spec))
            flights = []
            for unit, sent in zip(units, parts, strict=True):
                order = candidates(agreed_list(view(st, unit), unit.id, groups.genesis),
                                   groups.reducible.get(mid, groups.holders[mid]), self.exchange.skipped())
                flight = UnitFlight(unit, Future(), sent, order[0], tuple(order))
                flight.future = self.net.submit(flight.timed(self.exchange.contribute(
                    order, unit.id, sent.round, sent.tokens, sent.digest_before, sent.frame, timeout)))
                flights.append(flight)
            item = InFlight(parts[0] if len(parts) == 1 else whole_of(st, parts), flights, state=st)
            if self.spec.outer.eager and not self.cfg.sync_rounds:
                # our next steps start from where our own Δ would take the anchor, not a whole outer step behind it
                item.moved = eager_shift(st, local, self.spec.outer)
                if item.moved is not None:
                    self.worker.set_flat(mid, local + item.moved)
            self.in_flight[mid] = item
            self.flight_generation[mid] = self.generation
            out.append(mid)
        self.worker.end_round()
        return out

    def generation_sent(self) -> None:
        """The node sent every module of this chunk it will send (the late ones as they settled): the generation
        can complete once they settle."""
        self.sending = False

    def residuals_before_send(self) -> dict[str, torch.Tensor | None]:
        """Module → its error-feedback residual before the outer gradient in flight was encoded, for the modules with
        a round in flight: a checkpoint holds the state as of the last settled round, and that residual with it (the
        one after the send belongs to a round the checkpoint does not hold)."""
        return {mid: item.residual_before() for mid, item in self.in_flight.items()}

    def poll(self, block: bool, timeout_s: float | None = None) -> bool:
        """Settle the rounds that are done (blocking: wait for them up to timeout_s). Returns True when this
        leaves no round in flight after at least one settled: the round is complete. A round still open at the
        deadline stays in flight, even at shutdown (node/peer/round_loop.py says why). A unit sent again after a
        proven lie (round_checks.py `retry_after_lie`) is waited for as the first send was."""
        deadline = time.monotonic() + (timeout_s if timeout_s is not None
                                       else self.spec.averaging.grace_s + self.spec.averaging.timeout_s + 5)
        self.auditor.poll()
        for _pass in (False, True):  # the second pass: units sent again after a proven lie in the first
            for mid in list(self.in_flight):
                item = self.in_flight[mid]
                for flight in item.units:
                    if flight.result is not None:
                        continue
                    if not flight.future.done() and block:
                        try:
                            flight.future.result(max(0.0, deadline - time.monotonic()))
                        except Exception:
                            pass
                    if flight.future.done():
                        # sets its result, or sends it again (a new future)
                        self.checks.check(mid, item, flight, self.holders.get(mid, ()))
                if all(f.result is not None for f in item.units):
                    self.in_flight.pop(mid)
                    self._settle(mid, item)
        # The generations every module of which has settled: with a module sent late (its round before was still
        # open at the chunk's end), the next generation's sends are in flight when the older one completes.
        # A generation still sending is not complete, even with nothing of it in flight yet: its late modules may
        # settle and go out in the same poll that settles the rest of it.
        done = min([self.flight_generation[m] for m in self.in_flight] + [self.generation + 1 - self.sending]) - 1
        complete = done > self.completed_generation and self.settled_any
        if complete:
            self.settled_any = False
            self.completed_generation = done
        return complete

    def _settle(self, mid: str, item: InFlight) -> None:
        """Every unit of the module's round has its checked reply: settle them (node/train/round.py), put the module
        back together (`settle_slices`) and record the round."""
        self.settled_any = True
        st = self.worker.outer[mid]
        local_now = self.worker.flat(mid)
        # A re-sync replaced the state this round was sent from: a unit whose part changed takes no mean (made against
        # the other version) and its steps carry; the others settle as usual (docs/ARCHITECTURE.md, the split watch).
        stale = item.stale_units(st)
        if stale:
            logger.info("module %s: our state of %s was replaced while its round %d was in flight; not applied "
                        "there, our steps carry", mid, ", ".join(sorted(stale)), item.sent.round)
        parts = []
        for flight in item.units:
            result, unit = flight.result, flight.unit
            assert result is not None  # _poll settles a module once every unit has its reply
            status = RoundStatus.FAILED if unit.id in stale else result.status
            parts.append(settle(view(st, unit), flight.sent, local_now[unit.lo:unit.hi], status,
                                result.round, result.mean_frame if result.applicable else b"", result.digest_after,
                                self.spec.outer, codec=self.spec.codec, discard=flight.discard,
                                next_reducers=result.reducers, bound=flight.bound, decoded=flight.mean,
                                moved=item.unit_moved(unit)))
        sliced = settle_slices(st, [f.unit for f in item.units], parts, local_now, item.sent.tokens)
        done = sliced.settlement
        if done.state is not None:
            self.worker.outer[mid] = st = done.state
        if done.local is not None:
            self.worker.set_flat(mid, done.local)
        restore_feedback(self.worker.feedback[mid], [f.unit for f in item.units], [f.sent for f in item.units],
                         sliced.restore)
        if done.carried_tokens:
            self.carry[mid] = self.carry.get(mid, 0) + done.carried_tokens  # our steps are still in the local weights
        self.status.round_settled(mid, done.merged_tokens, done.discarded_tokens)
        if done.merged_tokens:
            log = self.merged_log.setdefault(mid, {})
            log[st.round] = done.merged_tokens
            for old in sorted(log)[:-MERGED_LOG_ROUNDS]:
                del log[old]
            diverged = self.diverged_log.setdefault(mid, set())
            diverged.intersection_update(log)
            if done.diverged:
                diverged.add(st.round)
        applied = [(f, p) for f, p in zip(item.units, parts, strict=True) if p.applied]
        if done.applied:
            first = applied[0][0].result
            assert first is not None
            late = any(f.result is not None and f.result.status == "late" for f, _ in applied)
            if late:
                self.catch_up = True
                self.late_modules.add(mid)
            else:
                self.late_modules.discard(mid)
            self.applied.applied(mid, st.round - 1, first.reducer or item.reducer, first.mean_frame,
                                 done.digest_after, parts=applied_parts(applied) if len(item.units) > 1 else ())
            if done.diverged:
                # Our replica is not the group's (or, with a slice not applied, may not be: node/train/round.py
                # `settle_slices`): the re-sync check replaces it if so, and the history does not record it.
                flight, part = next(((f, p) for f, p in applied if p.diverged), applied[0])
                assert flight.result is not None
                if part.diverged:
                    logger.error("%s round %d: digest %s != group's %s; re-syncing", flight.unit.id,
                                 flight.result.round, part.digest_after, flight.result.digest_after)
                else:
                    logger.warning("module %s round %d: not every slice applied here; checking our state against "
                                   "the group's", mid, st.round - 1)
                    # The hint is the reducer of a slice that told us we are out of sync: an applied slice's may
                    # be ourselves, and then nobody is asked (a holder alone on its side of a split logged "our own
                    # reducer disagrees" 7 rounds in a row, its own slices applied, the others "out of sync").
                    flight = next((f for f, p in zip(item.units, parts, strict=True) if not p.applied
                                   and f.result is not None and f.result.status == "out_of_sync"), flight)
                    assert flight.result is not None
                self._resync_later(mid, flight.result.reducer or flight.reducer)
            if done.reason:
                logger.warning("module %s round %d: %s (their steps carry)", mid, st.round - 1, done.reason)
                for flight, part in zip(item.units, parts, strict=True):
                    if not part.applied and flight.result is not None:
                        logger.info("%s round %d: %s (%s)", flight.unit.id, st.round - 1, flight.result.status,
                                    flight.result.reason if not flight.result.applicable else part.reason)
            self.status.anchor_seen(mid, float(st.anchor.abs().max()))
            # Counted as a round missed ("late": the round went on without us) also when a slice did not merge our
            # outer gradient (it was late there, or failed or behind for us while others applied it): our steps carry.
            self.status.round_applied(mid, st.round, done.digest_after, first.contributors,
                                      late=late or not done.merged_tokens,
                                      diverged=done.diverged, wire_s=wire_s(item))
            self.publish_local(mid)
            return
        self.status.round_failed(mid)
        for flight, part in zip(item.units, parts, strict=True):
            result = flight.result
            assert result is not None
            reason = result.reason if not result.applicable else part.reason
            logger.warning("%s round %d: %s (%s)", flight.unit.id, st.round, result.status, reason)
            if result.status == "out_of_sync" and not stale:  # stale: a re-sync just happened
                self._resync_later(mid, result.reducer or flight.reducer)
                break
        # "behind": the reducer re-syncs itself; our outer gradient waits for the next round

    def _resync_later(self, mid: str, peer: str) -> None:
        """Re-sync `mid` at the next polls if a majority of its holders vouch for a state other than ours; `peer`
        (the reducer that said the group is elsewhere) is where to download it first. Not the reducer of the next
        round: views of who reduces may differ for a moment, and it may be ourselves. When it is ourselves because a
        later candidate answered our stance question that it is past the round (a restarted head of the list, named
        in nobody else's list, gets no other hint: issue 27, stalled for a whole run), that candidate is checked;
        otherwise (our state moved while our round was open: a re-sync, a heal) we wait for the next round."""
        if peer == self.status.peer_id:
            peer = self.exchange.take_ahead(mid) or ""
            if not peer:
                logger.warning("module %s: our own reducer disagrees with our state; waiting for the next round", mid)
                return
        self.resyncs.request_check(mid, peer)

    def unsent_bases(self) -> dict[str, torch.Tensor]:
        """Per module, what our steps not sent yet count from: the weights of the outer gradient in flight, else the
        anchor (the round in progress is saved as the steps since: node/peer/resume.py)."""
        inf = self.in_flight
        return {mid: inf[mid].unsent_base(self.worker.outer[mid]) if mid in inf else self.worker.outer[mid].anchor
                for mid in self.worker.module_ids}

    def unmerged_tokens(self) -> int:
        flight = self.in_flight.get("shared")
        return self.carry.get("shared", 0) + self.worker.round_tokens + (flight.sent.tokens if flight else 0)
