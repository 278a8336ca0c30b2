"""The node's side of auditing reducers (docs/SECURITY.md, "No reducer trusted alone"): which rounds to audit,
checking them, and checking what other members report.

For each round another peer reduced and we applied, we keep what that reducer sent us (its list of merged frames, the
mean's bytes) and the history norm the round rule needed; at a rate of min(1, audit_rate / group size) a round, drawn
from the operating system's randomness (the reducer cannot predict who audits; `AuditDraw` keeps a member's audits
between half and 1.5 times their mean spacing apart rather than leaving their count to chance), we download the
listed frames (each from its own contributor, failing that from the reducer: protocol/rounds/frame_store.py) and
recompute the mean (protocol/rounds/rule.py `audit_mean`). A mean that does not match is proof: we stop trusting the
reducer (never our reducer again, its frames refused) and alert the round's other contributors. An alert makes its
receiver download the frames from the alerter and check them against the result *it* received: only that check moves
it. The round the liar reduced stays applied on every replica that took it (they still agree with each other) until
each of them learns of the proof and undoes the liar's rounds it kept (node/peer/rounds.py, protocol/rounds/heal.py);
the audit bounds a liar to the rounds before it is caught. A reducer's first NEW_REDUCER_AUDITS rounds are checked
before they are applied, and so are the next ones of a reducer that did not answer a random audit.

Downloads run on the network loop; checks run in the training thread (`poll`), and a module's checks are done
before its next round is sent (`before_send`).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import dataclass

from pathswarm.node.peer.config import NodeConfig
from pathswarm.node.peer.node_status import NodeStatus
from pathswarm.protocol.netloop import NetLoop
from pathswarm.protocol.rounds.audit import Alert, Gathered, frames_deadline_s
from pathswarm.protocol.rounds.exchange import ModuleExchange
from pathswarm.protocol.rounds.frame_list import Listed, frame_hash
from pathswarm.protocol.rounds.frame_store import FRAMES_KEPT
from pathswarm.protocol.rounds.messages import RoundReply
from pathswarm.protocol.rounds.rule import audit_mean
from pathswarm.protocol.rounds.slices import module_of_unit
from pathswarm.protocol.wire import FramesMissingError, UnreachableError

logger = logging.getLogger(__name__)

NEW_REDUCER_AUDITS = 3
"""Rounds of a reducer we audit for certain before auditing it at random: a reducer that lies from its first round
(a stranger that ground a small id, a newcomer at the head of the list) is caught in that round, not after the
seven rounds on average that rate 0.2 in a group of 3 takes (benchmarks/hostile.py, `lying-reducer`)."""
VERIFY_RETRY_S = (0.2, 1.0)
"""Jittered pause before asking a reducer not yet audited for its frames again (it refused, busy, or timed out)."""
MAX_PASSED = 4096
"""(reducer, module) pairs whose passed audits are counted (past it, a reducer is checked before applying every round:
safe)."""
FALSE_ALERTS_IGNORED = 3
"""A peer whose alerts were wrong this many times is not listened to again (each costs us a download)."""


AUDIT_SPACING = (0.5, 1.5)
"""How far apart a member's random audits fall, in expected audits (`AuditDraw`): mean 1, so the rate is
--audit-rate's; never closer than half the mean spacing, never further than 1.5 times it."""


class AuditDraw:
    """Which of the rounds it applied a member audits at random. Each round adds its audit probability p to a credit;
    the round that takes the credit past a threshold is audited, and the threshold is drawn afresh from AUDIT_SPACING
    (mean 1) each time. On average that is drawing each round alone with probability p, and the threshold is this
    node's own randomness, so a reducer cannot tell which of its rounds a member will audit; but a member's audits over
    a few rounds vary far less. With independent draws, at 16 nodes in slices (30 slice rounds a node a round), one
    node in 16 took three times its share of audits within 6 rounds, 4.5 frames received in a round where the others
    took 2.1 (benchmarks/scale.py, issue 28's goal of 2.5). What a reducer can learn: a member that just audited one
    of its rounds audits again no sooner than half its mean spacing later (and the reducer sees a member's audit only
    when its frames are downloaded from the reducer, not gathered from their contributors)."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.threshold = rng.uniform(*AUDIT_SPACING)
        self.credit = rng.uniform(0.0, self.threshold)  # a fresh node's first audit falls anywhere in its first spacing

    def draw(self, p: float) -> bool:
        """Audit this round (probability p, which the caller bounds to [0, 1])?"""
        if p >= 1.0:
            return True
        if p <= 0.0:
            return False
        self.credit += p
        if self.credit < self.threshold:
            return False
        self.credit -= self.threshold
        self.threshold = self.rng.uniform(*AUDIT_SPACING)
        return True


@dataclass(frozen=True)
class Received:
    """What a reducer sent us for one round, kept for audits: enough to check its frames later."""

    reducer: str
    listed: tuple[Listed, ...]
    frames_digest: str
    mean_frame: bytes
    reference: float
    contributors: tuple[str, ...]
    own: tuple[int, bytes] | None
    """Our own (tokens, frame) when it is in the round: not downloaded again."""


@dataclass
class _Check:
    module: str
    round: int
    source: str
    """Who the frames come from: the reducer (our own audit) or the member that alerted us."""
    alert: Alert | None
    future: Future
    applied: bool = True
    """The round was applied here (False: checked before applying; a lie found then was never applied)."""


def audit_group_size(contributors: Iterable[str], holders: Iterable[str]) -> int:
    """The group size the audit probability divides by: the round's contributors that we also know as the module's
    holders from the claims. A reducer that lists frames of ids nobody claims (sybil frames are cheap to make)
    cannot lower our odds of auditing it; a member our view has not caught up with yet only raises them."""
    return max(1, len(set(contributors) & set(holders)))


class Auditor:
    """Audits other reducers' rounds and checks alerts. Driven by the training thread (`record`, `poll`)."""

    def __init__(self, cfg: NodeConfig, status: NodeStatus, exchange: ModuleExchange, net: NetLoop):
        self.cfg, self.spec, self.status = cfg, cfg.spec, status
        self.exchange, self.net = exchange, net
        self.received: dict[tuple[str, int], Received] = {}
        self.checks: list[_Check] = []
        self.false_alerts: dict[str, int] = {}
        self.alerted: set[tuple[str, int]] = set()  # (module, round) whose alert we checked: one check per round
        self.rng = random.SystemRandom()
        self.draws = AuditDraw(self.rng)
        self._passed_now = False  # the last check found the mean right (read by _verify_now)
        self._mismatch_now = False  # the last check's frames were not the ones the result lists (read by _verify_now)
        self.passed: dict[tuple[str, str], int] = {}
        """(reducer, module) → audits of its rounds of that module that found its mean right: its first
        NEW_REDUCER_AUDITS rounds of each module are all audited before they are applied (docs/SECURITY.md). Counted
        per module: counted per reducer, a reducer of 3 modules left its probation after one round. Bounded: only
        peers that reduced rounds for us."""
        self.proven: dict[str, int] = {}
        """Reducer → the round of the first lie a recomputed mean proved in a round we had applied (node/peer/rounds.py
        undoes our rounds from it on: protocol/rounds/heal.py). A lie caught before it was applied undoes nothing.
        Bounded: only distrusted peers."""

    def record(self, module: str, result: RoundReply, reference: float, own: tuple[int, bytes],
               holders: Iterable[str] = (), suspect: bool = False) -> str:
        """A round we are about to apply: remember it, and audit it when another peer reduced it: a reducer's first
        NEW_REDUCER_AUDITS rounds now, before the mean is applied, later ones at random in the background.
        `own`: the (tokens, frame) we sent for it; `holders`: the module's holders in our view of the claims;
        `suspect`: the mean points away from our own outer gradient (protocol/rounds/rule.py `suspicious`): checked
        now, before it is applied, whatever the reducer's record.

        Returns why the round must not be applied ("" when it may): its mean is not what its frames give, or a
        reducer not yet audited did not serve them."""
        reducer = result.reducer
        if not reducer or reducer == self.status.peer_id or not result.listed:
            return ""
        # Our frame as the result lists it: the one we hold only if its hash is that of `own`. A reducer may have
        # merged a frame we sent earlier (a resend after a lost reply, or one our previous run sent before a
        # restart): the check then downloads that frame from the reducer too. Putting our current frame in its place
        # failed every such check as "frames the result does not list", and the member then resent, and took the
        # reducer's next answer for a lie (benchmarks/restarts.py --kill replying).
        mine = self.status.peer_id in dict(result.listed) and result.own == frame_hash(own[1])
        self.received[(module, result.round)] = Received(reducer, result.listed, result.frames_digest,
                                                         result.mean_frame, reference, tuple(result.contributors),
                                                         own if mine else None)
        for old in sorted(r for m, r in self.received if m == module)[:-FRAMES_KEPT]:
            del self.received[(module, old)]
            self.alerted.discard((module, old))  # an alert about a round we no longer hold is ignored anyway
        rate = self.cfg.audit_rate
        if rate <= 0:
            return ""
        passed = self.passed.get((reducer, module_of_unit(module)), 0)
        if suspect or passed < NEW_REDUCER_AUDITS:
            logger.debug("%s round %d: checking %s's mean before applying it (%s)", module, result.round,
                         reducer[-8:], "it points away from ours" if suspect else f"{passed} checks passed")
            return self._verify_now(module, result.round, reducer)
        if self.draws.draw(min(1.0, rate / audit_group_size(result.contributors, holders))):
            self._fetch(module, result.round, reducer, None)
        return ""

    def _verify_now(self, module: str, round_: int, reducer: str) -> str:
        """Audit a round before it is applied (the training thread waits for the download: a reducer's first rounds
        only). A lie is then never applied here; neither is the round of a reducer that does not show its frames
        in time (`_deadline_s`: the averaging timeout plus the download's bytes, all other members downloading from
        the reducer at once, at the slowest uplink waited for; a download refused as busy is retried). An
        answer that will not change soon ends the wait at once: the peer keeps no frames of the round (a reducer
        restarted since, or a member that relayed a result it did not reduce), serves frames the result does not
        list, or cannot be dialed twice. Waiting the whole timeout for those held the module 10 rounds behind its
        group after each restart (benchmarks/restarts.py --kill replying); the round then fails here, its Δ
        carries."""
        got = self.received.get((module, round_))
        if got is None:
            return ""
        listed = frozenset(p for p, _ in got.listed)
        deadline = time.monotonic() + self._deadline_s(module, got)
        unreachable, first = 0, True
        while True:
            left = deadline - time.monotonic()
            # First from each contributor (its own frame), then from the reducer; asking again: the reducer only.
            fut = self.net.submit(self._download(module, round_, reducer, got, max(1.0, left)) if first else
                                  self.exchange.audits.fetch_frames(reducer, module, round_, max(1.0, left), listed,
                                                                    skip=self.status.peer_id if got.own else ""))
            first = False
            try:
                fut.result(max(1.0, left) + 5)
            except Exception:  # the check below reads the failure from the future
                pass
            self._passed_now = self._mismatch_now = False
            proof = self._check(_Check(module, round_, reducer, None, fut, applied=False))
            if proof:
                return proof
            if reducer in self.exchange.distrusted:  # proven a liar meanwhile (in another module's round, say)
                return f"{reducer[-8:]} is not trusted: {self.exchange.distrusted[reducer]}"
            if self._passed_now:
                return ""
            failure = fut.exception() if fut.done() and not fut.cancelled() else None
            unreachable += isinstance(failure, UnreachableError)
            if isinstance(failure, FramesMissingError) or self._mismatch_now or unreachable >= 2:
                why = ("keeps no frames of the round" if isinstance(failure, FramesMissingError) else
                       "served frames its result does not list" if self._mismatch_now else "cannot be reached")
                return f"{reducer[-8:]} {why} ({module} round {round_}), and it is not audited yet"
            if time.monotonic() + VERIFY_RETRY_S[1] >= deadline:
                return f"{reducer[-8:]} did not show the frames of {module} round {round_}, and it is not audited yet"
            time.sleep(self.rng.uniform(*VERIFY_RETRY_S))

    def _deadline_s(self, module: str, got: Received) -> float:
        """How long a download of a round's frames is waited for: a check before applying and a random audit alike
        count every other member downloading from the same peer at once (a new reducer's checked rounds)."""
        frames = len(got.listed) - (got.own is not None)
        return frames_deadline_s(self.spec.averaging.timeout_s, frames, self.exchange.audits.frame_limit(module),
                                 downloaders=max(1, len(got.contributors) - 1))

    def _download(self, module: str, round_: int, reducer: str, got: Received, timeout_s: float):
        """A download of the round's frames for our own check: each from its contributor, failing that from the
        reducer (protocol/rounds/audit.py `gather_frames`). A coroutine for the network loop."""
        return self.exchange.audits.gather_frames(reducer, module, round_, got.listed, got.frames_digest,
                                                  self.status.peer_id, got.own, timeout_s)

    def _fetch(self, module: str, round_: int, source: str, alert: Alert | None) -> None:
        got = self.received.get((module, round_))
        if got is None:
            return
        timeout = self._deadline_s(module, got)
        if alert is None:  # our own audit of the reducer `source`
            fut = self.net.submit(self._download(module, round_, source, got, timeout))
        else:  # the alerter's frames: those it says prove the lie
            fut = self.net.submit(self.exchange.audits.fetch_frames(source, module, round_, timeout,
                                                                    frozenset(p for p, _ in got.listed),
                                                                    skip=self.status.peer_id if got.own else ""))
        self.checks.append(_Check(module, round_, source, alert, fut))

    def poll(self) -> None:
        """Check the downloads that are done, and start checking the alerts that came in."""
        self.status.distrusting(self.exchange.distrusted)
        while self.exchange.audits.alerts:
            self._on_alert(self.exchange.audits.alerts.popleft())
        pending = []
        for check in self.checks:
            if check.future.done():
                self._check(check)
            else:
                pending.append(check)
        self.checks = pending

    def before_send(self, module: str, deadline: float) -> None:
        """Finish our own audits of `module` still running (until `deadline`, one for the whole send) before its
        next round is sent: a round sent to a reducer our audit is about to prove a liar would merge us with it
        while the rest of the group has left it (a split). Checks of others' alerts do not hold the send."""
        self.poll()
        for check in [c for c in self.checks if module_of_unit(c.module) == module and c.alert is None]:
            try:
                check.future.result(max(0.0, deadline - time.monotonic()))
            except Exception:
                pass
        self.poll()

    def _on_alert(self, alert: Alert) -> None:
        got = self.received.get((alert.module, alert.round))
        if (got is None or got.reducer != alert.reducer or alert.reducer in self.exchange.distrusted
                or alert.sender not in got.contributors or (alert.module, alert.round) in self.alerted
                or self.false_alerts.get(alert.sender, 0) >= FALSE_ALERTS_IGNORED):
            # not a round we hold, already settled, not from one of its members, one check per round already,
            # or an alerter that cried wolf too often
            return
        self.alerted.add((alert.module, alert.round))
        logger.warning("peer %s says reducer %s lied in %s round %d; checking", alert.sender[-8:],
                       alert.reducer[-8:], alert.module, alert.round)
        self._fetch(alert.module, alert.round, alert.sender, alert)

    def _check(self, check: _Check) -> str:
        """Check one download; returns the proof's reason when it proved the round's reducer a liar, else ""."""
        got = self.received.get((check.module, check.round))
        try:
            frames = check.future.result()
        except Exception:
            frames = None
        if got is None or got.reducer in self.exchange.distrusted:
            return ""
        proof, gathered = None, isinstance(frames, Gathered)
        if frames is not None:
            if got.own is not None:
                frames = {**frames, self.status.peer_id: got.own}
            try:
                proof = audit_mean(frames, got.listed, got.frames_digest, got.mean_frame,
                                   self.exchange.numels[check.module], self.spec, got.reference)
            except ValueError as e:
                logger.warning("audit of %s round %d: frames from %s: %s", check.module, check.round,
                               check.source[-8:], e)
                frames = None
                self._mismatch_now = True
        if check.alert is None:
            if frames is None:
                if self.passed.get((got.reducer, module_of_unit(check.module)), 0) >= NEW_REDUCER_AUDITS:
                    # A random audit it did not answer (refused, timed out, frames it no longer keeps): proof of
                    # nothing to the others, so nobody leaves it, but we check its next rounds before applying them
                    # again. A liar that hides its frames then gets no round applied here; an honest reducer that
                    # was busy costs us NEW_REDUCER_AUDITS downloads.
                    for key in [k for k in self.passed if k[0] == got.reducer]:  # all its modules: it hid frames
                        self.passed[key] = 0
                    failure = check.future.exception() if not check.future.cancelled() else None
                    logger.warning("audit of %s round %d: its reducer %s did not show the frames (%s); its next %d "
                                   "rounds are checked before they are applied", check.module, check.round,
                                   got.reducer[-8:], repr(failure) if failure else "refused", NEW_REDUCER_AUDITS)
                return ""
            self.status.audited(gathered)
        elif proof is None and frames is None:
            self.alerted.discard((check.module, check.round))  # could not download: another alert may try again
            return ""
        elif proof is None:
            self.false_alerts[check.source] = self.false_alerts.get(check.source, 0) + 1
            logger.warning("alert from %s about %s round %d not confirmed", check.source[-8:], check.module,
                           check.round)
            return ""
        if proof is None:
            if check.alert is None:
                self._passed_now = True
                key = (got.reducer, module_of_unit(check.module))  # a slice's checks count for its module
                if key in self.passed or len(self.passed) < MAX_PASSED:
                    self.passed[key] = self.passed.get(key, 0) + 1
            return ""
        reason = f"its mean of {check.module} round {check.round} is not what its frames give: {proof}"
        self.exchange.distrust(got.reducer, reason)
        if check.applied:  # we applied its lie: our rounds from it on are undone (protocol/rounds/heal.py)
            self.proven.setdefault(got.reducer, check.round)
        self.exchange.audits.store.keep(check.module, check.round, frames)  # the proof, for those we alert
        others = [p for p in got.contributors if p not in (self.status.peer_id, got.reducer, check.source)]
        if others:
            self.net.submit(self.exchange.audits.send_alert(others, check.module, check.round, got.reducer, 10.0))
        return reason
