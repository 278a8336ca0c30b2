"""The member's side of a module's round: send our frame to the round's reducer, fail over, check the reply.

Who may reduce comes in the agreed failover order (reducers.py): a candidate that cannot be reached, or refuses,
passes the round to the next, as does one whose state is behind the round (it refuses that round from then on); one
that redirects us to an earlier candidate is followed (twice at most). A broken connection is tried once more: if
the reducer merged our frame and only its reply was lost, it answers from the closed round ("merged"). After a proven
lie (node/peer/round_checks.py `retry_after_lie`) a candidate that still defers to the liar is asked again, backing off,
for a grace window at most.

The check on replies (docs/SECURITY.md): an honest result lists every contributor's (peer, tokens, frame hash);
a result without that list, or whose entry for us is not the frame we sent, proves the reducer a liar to us.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging

from pathswarm.protocol.rounds.context import Context
from pathswarm.protocol.rounds.frame_list import frame_hash
from pathswarm.protocol.rounds.messages import ContributeRequest, Refusal, RoundReply, RoundStatus
from pathswarm.protocol.rounds.reducer import Reducer
from pathswarm.protocol.rounds.reducer_state import RESULTS_KEPT, failed
from pathswarm.protocol.rounds.slices import module_of_unit
from pathswarm.protocol.rounds.trust import STANCE_TIMEOUT_S
from pathswarm.protocol.wire import NotServingYetError, read_message, write_message

logger = logging.getLogger(__name__)

UNREACHABLE = "reducer unreachable"  # reason prefix of a round that failed at the connection level
REASK_S, REASK_MAX_S = 0.25, 4.0  # pauses before asking again a candidate that defers to a proven liar (doubling)
LOST_REPLY_RETRY_S = 0.3  # pause before asking a reducer again after its connection broke
NOT_SERVING_RETRY_S = 0.5  # pause before asking again a peer that is up but does not serve rounds yet


class Member:
    """Sends this node's contributions; remembers what it sent and which reducers failed it."""

    def __init__(self, ctx: Context, reducer: Reducer):
        self.ctx, self.reducer = ctx, reducer
        self.skip_until: dict[str, float] = {}
        """Peer → clock time until which members try it last: it failed one of our rounds at the connection level."""
        self.sent: dict[str, dict[int, set[tuple[int, str]]]] = {}
        """Module → round → (tokens, frame hash) of every frame we sent for it: a resend after a lost reply carries
        a newer frame, and the reducer answers from the round it closed with the older one (not a lie)."""

    def skipped(self) -> list[str]:
        """Peers that failed one of our rounds at the connection level recently: members try them last."""
        now = self.ctx.clock.now()
        return sorted(p for p, until in list(self.skip_until.items()) if until > now)

    def _note_sent(self, module: str, round_: int, own: tuple[int, str]) -> set[tuple[int, str]]:
        rounds = self.sent.setdefault(module, {})
        sent = rounds.setdefault(round_, set())
        sent.add(own)
        # Keep this round and the newest others. Not the newest RESULTS_KEPT overall: a node that went back to an
        # older state (a heal, a re-sync) sends a round below those it sent, and pruning it at once ended the node
        # with a KeyError (benchmarks/restarts.py --kill replying).
        others = sorted(r for r in rounds if r != round_)
        for old in others[:max(0, len(others) - (RESULTS_KEPT - 1))]:
            del rounds[old]
        return sent

    async def contribute(self, candidates: list[str], module: str, round_: int, tokens: int, digest: str,
                         frame: bytes, timeout_s: float, after_lie: bool = False) -> RoundReply:
        """Send our frame to the round's reducer and wait for the round's mean (see the module docstring)."""
        ctx = self.ctx
        clock, grace = ctx.clock, ctx.spec.averaging.grace_s
        deadline = clock.now() + timeout_s
        own = (tokens, frame_hash(frame))  # hashed once: a frame is ~1 byte per parameter
        sent = self._note_sent(module, round_, own)
        candidates = [p for p in candidates if not ctx.trust.shunned(p)]  # revoked or a proven liar: never ours
        queue, redirects, last = list(candidates), 0, None
        reask_until, reask_pause = clock.now() + grace + STANCE_TIMEOUT_S, REASK_S
        while queue:
            reducer = queue.pop(0)
            left = deadline - clock.now()
            if left <= 0:
                break
            # A live reducer answers once its round closes (the grace window after it opened); more means frozen.
            wait_s = left if ctx.sync_world else min(left, grace + STANCE_TIMEOUT_S + 3)
            asked = clock.now()
            last = await self._contribute_to(reducer, module, round_, tokens, digest, frame, wait_s)
            last = dataclasses.replace(last, reducer=reducer)
            logger.debug("%s round %d: %s from %s after %.2f s", module, round_, last.status.value, reducer[-8:],
                         clock.now() - asked)
            if last.status == RoundStatus.REDIRECT and redirects < 2 and last.redirect in candidates:
                redirects += 1
                queue.insert(0, last.redirect)
                continue
            if (after_lie and last.status == RoundStatus.REDIRECT and last.redirect in ctx.trust.distrusted
                    and reducer != ctx.peer_id and clock.now() + reask_pause < min(deadline, reask_until)):
                # It defers to the peer we proved a liar in this very round: it has not finished its own check of
                # that round yet (every member checks a new reducer's first rounds), and will reduce the round once
                # it has. Ask it again, backing off (each ask carries our frame), for a grace window at most.
                await clock.sleep(reask_pause)
                reask_pause = min(2 * reask_pause, REASK_MAX_S)
                queue.insert(0, reducer)
                continue
            if last.status == RoundStatus.FAILED and last.reason.startswith((UNREACHABLE, "refused")):
                self._skip(reducer)
                continue
            if last.status == RoundStatus.BEHIND:
                # Its state has not reached the round (a slice's reducer still settling the round before, a restarted
                # node): it will not reduce this round (reducer.py `_compare`), the next candidate may.
                continue
            return self._checked(last, module, round_, own, sent)
        if last is not None and last.status != RoundStatus.REDIRECT:
            return last
        return failed(module, round_, f"{UNREACHABLE}: no candidate reduced the round")

    def _skip(self, reducer: str) -> None:
        if reducer != self.ctx.peer_id:
            now = self.ctx.clock.now()
            self.skip_until = {p: t for p, t in self.skip_until.items() if t > now}
            self.skip_until[reducer] = now + self.ctx.spec.averaging.claim_ttl_s

    def _checked(self, last: RoundReply, module: str, round_: int, own: tuple[int, str],
                 sent: set[tuple[int, str]]) -> RoundReply:
        """The reply, or a failed round when it proves its reducer a liar to us."""
        ctx, reducer = self.ctx, last.reducer
        if last.applicable and reducer != ctx.peer_id and (
                not last.listed or {p for p, _ in last.listed} != set(last.contributors)):
            # An honest reducer lists every contributor's frame; a result without them could not be audited.
            ctx.trust.distrust(reducer, f"its result of {module} round {round_} does not list its contributors' frames")
            return failed(module, round_, "the reducer's result lists no frames", reducer=reducer)
        earlier_run = False  # the reducer merged a frame our run before a restart sent
        if last.applicable and last.status.ours and reducer != ctx.peer_id:
            tokens_listed = dict(last.listed).get(ctx.peer_id)
            mine = None if tokens_listed is None else (tokens_listed, last.own)
            if mine is not None and mine != own and (mine in sent or module_of_unit(module) in ctx.fresh):
                # A frame we sent for this round before (a resend after a lost reply, or before our restart):
                # the reducer merged that one.
                earlier_run = mine not in sent
                logger.info("%s round %d: %s merged our earlier frame of the round", module, round_, reducer[-8:])
            elif mine != own:
                # Proof for us alone (others cannot know what we sent): we stop trusting it, nobody else does.
                ctx.trust.distrust(reducer, f"its result of {module} round {round_} misreports our contribution")
                return failed(module, round_, "the reducer misreported our contribution", reducer=reducer)
        if last.applicable:
            if not earlier_run:
                # fresh no more once a reducer merged a frame of this run: a frame of our run before the restart
                # listed later is then a lie. Not on a frame of that earlier run: its round may fail here (its
                # check) and the reducer answer our resend with it again, which was then taken for a lie
                # (benchmarks/restarts.py --kill replying).
                ctx.fresh.discard(module_of_unit(module))
            log = self.reducer.log(module)
            for peer in last.contributors:  # active in the module: our own rounds wait for them
                log.note_seen(peer, round_)
        return last

    async def _contribute_to(self, reducer: str, module: str, round_: int, tokens: int, digest: str, frame: bytes,
                             timeout_s: float) -> RoundReply:
        """One reducer; a connection that breaks is tried once more. A peer that is up but does not serve rounds yet
        (it claimed its path moments ago) is waited for, within timeout_s."""
        clock = self.ctx.clock
        deadline, attempt = clock.now() + timeout_s, 0
        while True:
            try:
                if reducer == self.ctx.peer_id:
                    return await asyncio.wait_for(self.reducer.reduce(module, round_, reducer, tokens, digest, frame),
                                                  timeout_s)
                return await asyncio.wait_for(self._remote(reducer, module, round_, tokens, digest, frame), timeout_s)
            except TimeoutError:
                return failed(module, round_, f"{UNREACHABLE}: no answer in {timeout_s:.0f} s")
            except NotServingYetError as e:
                if clock.now() + NOT_SERVING_RETRY_S >= deadline:
                    return failed(module, round_, f"{UNREACHABLE}: {e}")
                await clock.sleep(NOT_SERVING_RETRY_S)
            except Exception as e:  # broken stream, p2pd control errors (several types): never fatal
                reason = f"{UNREACHABLE}: {type(e).__name__}: {e}"
                attempt += 1
                if attempt == 2 or clock.now() + LOST_REPLY_RETRY_S >= deadline:
                    return failed(module, round_, reason)
                logger.info("%s round %d: %s; asking %s again", module, round_, reason, reducer[-8:])
                await clock.sleep(LOST_REPLY_RETRY_S)
            timeout_s = max(0.1, deadline - clock.now())

    async def _remote(self, reducer: str, module: str, round_: int, tokens: int, digest: str,
                      frame: bytes) -> RoundReply:
        ctx = self.ctx
        assert ctx.streams is not None
        reader, writer = await ctx.streams.open(reducer, ctx.name("contribute"))
        try:
            ask = ContributeRequest(module, round_, tokens, digest, ctx.membership, ctx.client)
            await write_message(writer, ask.header(), b"", ctx.traffic)
            await write_message(writer, {}, frame, ctx.traffic)
            header, mean_frame = await read_message(reader, ctx.mean_limit(module), ctx.traffic)
        finally:
            writer.close()
        if (refusal := Refusal.parse(header)) is not None:
            return failed(module, round_, f"refused: {refusal.reason}")
        return RoundReply.parse(header, mean_frame)
