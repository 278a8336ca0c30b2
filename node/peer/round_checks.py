"""The check before applying another's round, and undoing a liar's rounds once an audit proves it (docs/SECURITY.md,
docs/ARCHITECTURE.md "The check before applying").

A reply to one of our units (a module's round, or one slice of it) comes to `check` before anything is applied: the
mean must decode, stay within what an honest round sends (protocol/rounds/rule.py `mean_bound`), and pass the
auditor's verdict (a new reducer's first rounds, a suspicious mean: node/peer/audit.py). A proven lie sends the same
contribution to the next candidate (`retry_after_lie`) instead of failing the round. A lie proven only after it was
applied is undone before the module's next send (`undo_lies`: protocol/rounds/heal.py). node/peer/rounds.py drives
both from the training thread.
"""

from __future__ import annotations

import dataclasses
import logging

import torch

from pathswarm.node.peer.audit import Auditor
from pathswarm.node.peer.config import NodeConfig
from pathswarm.node.peer.flights import InFlight, UnitFlight
from pathswarm.node.peer.node_status import NodeStatus
from pathswarm.node.train.worker import PathWorker
from pathswarm.protocol.netloop import NetLoop
from pathswarm.protocol.rounds.exchange import ModuleExchange
from pathswarm.protocol.rounds.heal import AppliedLog, heal
from pathswarm.protocol.rounds.messages import RoundReply, RoundStatus
from pathswarm.protocol.rounds.outer import OuterState
from pathswarm.protocol.rounds.reducer_state import RANK_LOST
from pathswarm.protocol.rounds.rule import (
    RoundError,
    beyond_bound,
    decode_mean,
    mean_bound,
    reference_norm,
    suspicious,
)
from pathswarm.protocol.rounds.slices import view

logger = logging.getLogger(__name__)


class RoundChecks:
    """The auditor, the means we applied lately, and the rules that read them. Driven by the training thread only."""

    def __init__(self, cfg: NodeConfig, status: NodeStatus, worker: PathWorker, exchange: ModuleExchange,
                 net: NetLoop):
        self.cfg, self.spec, self.status = cfg, cfg.spec, status
        self.worker, self.exchange, self.net = worker, exchange, net
        self.auditor = Auditor(cfg, status, exchange, net)  # checks other reducers' means (docs/SECURITY.md)
        self.applied = AppliedLog()  # the means we applied lately: a liar's rounds are undone once it is proven one

    def check(self, mid: str, item: InFlight, flight: UnitFlight, holders: list[str] | tuple[str, ...]) -> None:
        """A unit's reply: checked before it may be applied; sets `flight.result` (and the bound and decoded mean
        settle reuses), or sends the unit again to the next candidate after a proven lie (a new future)."""
        result: RoundReply = flight.future.result()
        module = self.worker.outer[mid]
        st = view(module, flight.unit)
        uid = flight.unit.id
        logger.debug("%s round %d: %s with %d contributors (%s)", uid, result.round, result.status,
                     len(result.contributors), result.reason)
        flight.discard = self.cfg.sync_rounds and result.reason.startswith(RANK_LOST)
        bound, mean = None, None
        if result.applicable and result.reducer and result.reducer != self.status.peer_id:
            # before settle: the round rule's history norm is the momentum's before this round's mean moves it
            reference = reference_norm(st)
            # Another's round is applied only within what an honest round sends (protocol/rounds/rule.py
            # `mean_bound`): our own outer gradient and the momentum, the whole module's even for a slice (ours may be
            # all zeros in a slice where another member's is not: embedding rows of bytes our documents never had).
            bound = mean_bound(item.sent.delta_norm, item.sent.tokens, item.module_reference(module), self.spec,
                               len(result.contributors))
            mean = self.decoded(st, result)  # once: for the checks here and for settle
            # A mean pointing away from our own outer gradient in it (rule.py `suspicious`) is audited before applying.
            suspect = (mean is not None and result.status.ours
                       and suspicious(mean, st.anchor - flight.sent.local_when_sent))
            refused = self.auditor.record(uid, result, reference, (flight.sent.tokens, flight.sent.frame),
                                          holders, suspect=suspect)
            lie = beyond_bound(mean, bound) if mean is not None and not refused else None
            if lie is not None:
                # As a lie caught before applying: we stop trusting the reducer and the round goes to the next one.
                self.exchange.distrust(result.reducer, f"its mean of {uid} round {result.round}: {lie}")
                refused = f"not applied: {lie}"
            if refused and self.retry_after_lie(uid, flight, result):
                return
            if refused:  # checked before applying, and not to be applied: the round failed for us, our steps carry
                result = dataclasses.replace(result, status=RoundStatus.FAILED,
                                             reason=(refused if refused.startswith("not applied")
                                                     else f"not applied: {refused}")[:300])
        flight.result, flight.bound, flight.mean = result, bound, mean

    def decoded(self, st: OuterState, result: RoundReply) -> torch.Tensor | None:
        """The round's mean decoded, None when there is none or it does not decode (settling then refuses it)."""
        if not result.mean_frame:
            return None
        try:
            return decode_mean(result.mean_frame, st.anchor.numel(), self.spec.codec)
        except RoundError:
            return None

    def retry_after_lie(self, uid: str, flight: UnitFlight, result: RoundReply) -> bool:
        """A round whose reducer our check before applying proved a liar (its first rounds, or one on probation):
        send the same contribution again, for the same round, to the next candidates of the agreed list (the
        exchange skips proven liars). The honest members for whom the liar is new all check its round before
        applying it, so they all leave it here and meet at the same next candidate, which closes the round
        honestly: the lie costs the group a grace window instead of a round's progress. A member that had already
        passed the liar's first checks applies the lie and answers at a later round (or, as a candidate, out of
        sync): the round then fails for us as before, and the split watch heals the two versions. Once per round; not
        for a reducer that merely did not show its frames (that proves nothing, and the others may have applied
        its round)."""
        if flight.retried or result.reducer not in self.exchange.distrusted:
            return False
        order = [p for p in flight.order if p != result.reducer]
        if not order:
            return False
        timeout = self.spec.averaging.grace_s + self.spec.averaging.timeout_s
        sent = flight.sent
        flight.replied_at = None  # its time on the wire runs on to the resent unit's reply
        flight.future = self.net.submit(flight.timed(self.exchange.contribute(
            order, uid, sent.round, sent.tokens, sent.digest_before, sent.frame, timeout, after_lie=True)))
        flight.reducer, flight.order, flight.retried = order[0], tuple(order), True
        self.status.round_retried()
        logger.warning("%s round %d: not applied (%s's mean is a lie); sent again to the next candidate",
                       uid, result.round, result.reducer[-8:])
        return True

    def undo_lies(self, mid: str, merged_log: dict[int, int]) -> bool:
        """Undo our rounds of `mid` from the round of a lie an audit proved (protocol/rounds/heal.py), keeping our
        local progress on top of the healed anchor; called before the module's next send, with none of its rounds in
        flight. Our tokens merged in the rounds undone (taken out of `merged_log`, state round → tokens) are
        discarded: those steps are gone from the module. True when it undid rounds (the state is new)."""
        if not self.auditor.proven:
            return False
        st = self.worker.outer[mid]
        for liar, from_round in sorted(self.auditor.proven.items(), key=lambda kv: kv[1]):
            try:
                healed = heal(st, self.applied.rounds(mid), liar, from_round, self.spec.outer, self.spec.codec)
            except RoundError as e:  # a kept mean that decoded when applied: cannot happen short of memory corruption
                logger.error("module %s: cannot undo the liar's rounds: %s", mid, e)
                healed = None
            if healed is not None:
                break
        else:
            return False
        self.applied.healed(mid)
        self.worker.set_flat(mid, healed.state.anchor + (self.worker.flat(mid) - st.anchor))
        self.worker.outer[mid] = healed.state
        lost = sum(merged_log.pop(a.round + 1, 0) for a in healed.undone)
        self.status.lies_undone(mid, len(healed.undone), lost)
        logger.warning("module %s: undid rounds %d-%d (from the lie of %s an audit proved); state %s at round %d",
                       mid, healed.undone[0].round, healed.undone[-1].round, liar[-8:], healed.state.digest()[:12],
                       healed.state.round)
        return True
