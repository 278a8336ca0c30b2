"""The reducer's side of a module's round: one `ReducerRound` per (module, round) this node reduces.

A round opens with the first contribution (or a later candidate's stance question, stance.py), takes frames
until `min(min_group, expected holders)` are in or the grace window since it opened ends, then closes by the
round rule (protocol/rounds/rule.py `close_round`: screen, robust token-weighted mean in sorted peer-id order,
encode **once**). The merge runs off the event loop: other requests are served meanwhile, and a frame arriving
once the close has begun is answered `late`. Every member, the reducer included, decodes the same bytes; the
result also says the digest the state must have afterwards and who reduces the next round.

Answers (messages.py `RoundStatus`): merged / alone (your frame is in the mean), late (the round had closed:
apply the mean and keep your outer gradient), out_of_sync (your state before the round is not ours: re-sync),
behind (we are behind you), redirect (an earlier candidate holds the round), failed.

Synchronous baseline (`node run --sync-rounds`, benchmarks/chaos.py): a round waits for the job's whole world and
fails for everyone when one of its members dies (its claim lapses or restarts), as a data-parallel collective
does; the members discard their steps and retry the round.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from pathswarm.protocol.rounds.context import Context
from pathswarm.protocol.rounds.frame_list import MAX_TOKENS, list_frames
from pathswarm.protocol.rounds.frame_store import FrameStore
from pathswarm.protocol.rounds.messages import RoundReply, RoundStatus
from pathswarm.protocol.rounds.outer import OuterState
from pathswarm.protocol.rounds.reducer_state import (
    RANK_LOST,
    Activity,
    Extensions,
    ModuleLog,
    ReducerRound,
    answer,
    failed,
    rank_lost,
)
from pathswarm.protocol.rounds.reducers import Stance, next_candidates
from pathswarm.protocol.rounds.rule import ClosedRound
from pathswarm.protocol.rounds.slices import UnitNumels, agreed_list, module_of_unit, rotated
from pathswarm.protocol.rounds.stance import Stances

logger = logging.getLogger(__name__)

Closer = Callable[[Sequence[tuple[str, int, bytes]], int, OuterState | None], ClosedRound]
"""(contributions as (peer, tokens, frame) sorted by peer, the module's size, the state the round opened with) →
the closed round: the round rule's `close_round` (tests inject a lying one)."""


class Reducer:
    """The rounds this node reduces, for all its modules. Runs on the node's network event loop."""

    def __init__(self, ctx: Context, closer: Closer, store: FrameStore):
        self.ctx, self.closer, self.store = ctx, closer, store
        self.activity: dict[str, Activity] = {}
        """Module → who is active in its rounds (reducer_state.py `Activity`): shared by its slices' logs."""
        self.logs: dict[str, ModuleLog] = {m: ModuleLog(activity=self._activity(m)) for m in ctx.numels}
        """Unit (a module, or a slice of one: slices.py) → its rounds; a slice's log is made on its first use."""
        self.stances = Stances(ctx)
        self.behind: dict[str, str] = {}
        """Module → a peer that is ahead of us (the node re-syncs from it)."""
        self.ahead: dict[str, str] = {}
        """Module → an earlier candidate that answered it is past a round we were to reduce (`ModuleExchange.
        take_ahead`: where a restarted head of the list, named in nobody else's list, looks for the group)."""
        # One merge at a time, as when they ran on the loop: a node's modules close in the same grace window, and
        # each 25 M-value merge holds every decoded contribution (memory) and competes with training for the cores.
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pathswarm-merge")
        self.last_closed: float | None = None
        """Clock time of the last round we closed with others' frames (a leaving node serves them a while after it)."""
        self.extensions = Extensions()
        """The grace windows late frames earned (reducer_state.py `Extensions`)."""

    def log(self, unit: str) -> ModuleLog:
        """The log of a unit we know (`ctx.numels` answers for slices: slices.py `UnitNumels`)."""
        log = self.logs.get(unit)
        if log is None:
            log = self.logs[unit] = ModuleLog(activity=self._activity(module_of_unit(unit)))
        return log

    def _activity(self, module: str) -> Activity:
        return self.activity.setdefault(module, Activity())

    def effective_state(self, module: str) -> OuterState | None:
        """Our module state, or the state it will have after the rounds we closed, whichever is newer."""
        mine, post = self.ctx.state_of(module), self.log(module).post
        if post is not None and (mine is None or post.round > mine.round):
            return post
        return mine

    async def _wait_for_state(self, module: str, round_: int) -> OuterState | None:
        """A node registers its handlers before it has synced its modules: wait (at most the grace
        window) for our state instead of failing the round of a peer that is quicker than us. A slice's reducer
        (slices.py) also waits for its state to reach the round: it settles the round before as a member, once its
        last slice is in, while a quicker member already sends the next (in a round with one reducer, the reducer of
        the round before is ahead: `effective_state`)."""
        clock = self.ctx.clock
        deadline = clock.now() + self.ctx.spec.averaging.grace_s
        sliced = module != module_of_unit(module)
        while (((mine := self.effective_state(module)) is None or sliced and mine.round < round_)
               and clock.now() < deadline):
            await clock.sleep(0.05)
        return mine

    async def reduce(self, module: str, round_: int, sender: str, tokens: int, digest: str,
                     frame: bytes) -> RoundReply:
        """Add one contribution to (module, round) and wait until the round closes."""
        if tokens <= 0:
            return failed(module, round_, "non-positive token count")
        if tokens > MAX_TOKENS:  # JSON ints have no bound: float(10**400) in weighted_average would raise
            return failed(module, round_, "token count too large")
        if why := self.ctx.trust.ignored(sender):
            return failed(module, round_, why)
        log = self.log(module)
        if round_ in log.closed:
            digest_before, result = log.closed[round_]
            if digest != digest_before:
                return failed(module, round_, "state before the round differs", RoundStatus.OUT_OF_SYNC)
            log.note_seen(sender, round_)  # a late frame of our state: not silent (the quorum waits for it again)
            if sender not in result.contributors:
                self._late_frame(module, round_)
            if sender not in result.contributors and self.store.get(module, round_) is None:
                # Late by more rounds than we keep frames for: a member still checking us (a restarted or new one)
                # could not audit the mean and would retry the download for a whole timeout, stalled, then fail the
                # round (issue 27: a restarted node was refused as a flood so). It is rounds behind: let it re-sync.
                now = self.effective_state(module)
                return failed(module, round_, f"the group is at round {now.round if now else round_ + 1}",
                              RoundStatus.OUT_OF_SYNC)
            # A contributor asking again lost our reply: its outer gradient is in the mean ("merged", not "late").
            return answer(result, sender, self.store)
        if (refusal := self._refused(module, round_)) is not None:  # known already: no wait for our state
            return refusal
        mine = await self._wait_for_state(module, round_)
        if (refusal := self._compare(module, round_, sender, digest, mine)) is not None:
            return refusal
        assert mine is not None
        log.note_seen(sender, mine.round)  # a frame of our very state and round (only such a frame counts)
        opened = log.open.get(round_)
        if opened is not None and digest != opened.digest_before:
            # Our own state changed (a re-sync) after the round opened: merging outer gradients taken from two
            # different states would leave the members with different replicas under one round.
            return failed(module, round_, "state before the round differs from the group's", RoundStatus.OUT_OF_SYNC)
        if opened is None or not opened.checked:
            got = await self._check_rivals(module, round_, sender, mine)
            if isinstance(got, RoundReply):
                return got
            opened = got
        if opened.add(sender, tokens, frame):
            # Shielded: a member whose wait ends (its timeout, a handler's deadline) must not cancel the close, which
            # would leave the round closing forever, with every other member waiting on it.
            await asyncio.shield(self._close(opened))
        elif opened.closing and sender not in opened.frames:
            self._late_frame(module, round_)
        await opened.done.wait()
        assert opened.result is not None
        if opened.result.status in (RoundStatus.FAILED, RoundStatus.OUT_OF_SYNC):
            return opened.result
        return answer(opened.result, sender, self.store)

    def _refused(self, module: str, round_: int) -> RoundReply | None:
        if self.log(module).refuses(round_, self.ctx.clock.now(), self.ctx.spec.averaging.timeout_s):
            return failed(module, round_, "reducer was behind this round and refuses it", RoundStatus.BEHIND)
        return None

    def _compare(self, module: str, round_: int, sender: str, digest: str,
                 mine: OuterState | None) -> RoundReply | None:
        """Why the contribution cannot enter our round (None when it can): we lack the module, or our state is
        another round's or another state of the round."""
        if mine is None:
            return failed(module, round_, "reducer does not hold this module")
        if mine.round > round_:
            return failed(module, round_, f"the group is at round {mine.round}", RoundStatus.OUT_OF_SYNC)
        log = self.log(module)
        if mine.round < round_:
            # Once answered "behind", a round stays refused here for a round's timeout (`_refused`): its members
            # fail over to the next candidate (member.py), and reducing it once our state caught up would make a
            # second version of it (a slice's reducer still settling the round before: tests/swarm/test_home_links.py).
            if round_ <= mine.round + 2:  # a far later round is no frame of the group's (no bound on its number)
                log.refuse(round_, self.ctx.clock.now())
            self.behind[module_of_unit(module)] = sender
            return failed(module, round_, f"reducer is at round {mine.round}", RoundStatus.BEHIND)
        if (refusal := self._refused(module, round_)) is not None:  # caught up while this frame waited
            return refusal
        if digest != mine.digest():
            return failed(module, round_, "state before the round differs", RoundStatus.OUT_OF_SYNC)
        return None

    async def _check_rivals(self, module: str, round_: int, sender: str,
                            mine: OuterState) -> ReducerRound | RoundReply:
        """Before the first contribution enters, the candidates before us must not hold the round."""
        log = self.log(module)
        rival = await self.stances.rival(module, round_, mine)
        if rival:
            stale = log.open.get(round_)
            if stale is not None and not stale.frames:  # opened empty for a later candidate's question
                log.open.pop(round_, None)
            peer, stance = rival
            if stance == Stance.AHEAD:
                self.ahead[module_of_unit(module)] = peer
                return failed(module, round_, f"peer {peer[-8:]} is past this round", RoundStatus.OUT_OF_SYNC)
            return failed(module, round_, f"{peer[-8:]} holds this round", RoundStatus.REDIRECT, redirect=peer)
        if round_ in log.closed:  # closed while we asked
            return answer(log.closed[round_][1], sender, self.store)
        opened = log.open.get(round_) or self.open_round(module, round_, mine)
        opened.checked = True
        return opened

    def open_round(self, module: str, round_: int, mine: OuterState) -> ReducerRound:
        ctx = self.ctx
        quorum = 1 << 30 if ctx.sync_world else ctx.spec.averaging.min_group  # sync: all of them
        counted, silent = self._expected(module, round_)
        world = dict(ctx.groups.live.get(module_of_unit(module), {}))
        opened = self.log(module).open[round_] = ReducerRound(module, round_, mine.digest(),
                                                               max(1, min(quorum, counted)), world=world,
                                                               uncounted=set(silent), opened_at=ctx.clock.now())
        logger.debug("%s round %d opened: waits for %d frames (silent: %s)", module, round_, opened.target,
                     ", ".join(p[-8:] for p in silent) or "none")
        asyncio.get_running_loop().create_task(self._close_after_grace(opened))
        return opened

    def _late_frame(self, module: str, round_: int) -> None:
        """A frame of the round's own state came after the round's grace window ended: the module's next round here
        may wait longer for its member, as long as it was late (reducer_state.py `Extensions` says when and why)."""
        if self.ctx.sync_world:
            return
        late_s = self.extensions.late_frame(module, round_, self.ctx.clock.now(), self.ctx.spec.averaging.grace_s)
        if late_s is not None:
            logger.debug("%s round %d: a frame of it came %.1f s late; round %d waits longer", module, round_, late_s,
                         round_ + 1)

    def _expected(self, module: str, round_: int) -> tuple[int, tuple[str, ...]]:
        """How many contributions the round waits for before its grace window ends, and the silent claimants left
        out (reducer_state.py `ModuleLog.quorum`); the sync baseline: the job's whole world."""
        ctx = self.ctx
        whole = module_of_unit(module)
        holders = None if ctx.sync_world else ctx.groups.holders.get(whole)
        if holders is None:
            return ctx.groups.expected.get(whole, 1), ()
        return self.log(module).quorum(holders, round_, ctx.trust.refuses)

    def stance(self, module: str, round_: int, digest: str, asker: str) -> Stance:
        """Our stance on (module, round) when a candidate asks; we open the round for a later candidate, so the
        earliest live candidate reduces it."""
        log = self.log(module) if module in self.ctx.numels else None
        if log is not None and round_ in log.closed:
            return Stance.CLOSED
        if log is not None and round_ in log.open:
            return Stance.OPEN
        if log is not None and self._refused(module, round_):
            return Stance.NOT_HERE  # we answered its members "behind": they go on to the asker
        mine = self.effective_state(module) if log is not None else None
        if mine is None or mine.round < round_ or mine.round == round_ and mine.digest() != digest:
            return Stance.NOT_HERE
        if mine.round > round_:
            return Stance.AHEAD
        agreed = agreed_list(mine, module, self.ctx.groups.genesis)
        me = self.ctx.peer_id
        if asker in agreed and me in agreed and agreed.index(asker) < agreed.index(me):
            return Stance.NOT_HERE  # a restarted head asking whether anyone took its round: we have not
        self.open_round(module, round_, mine)
        return Stance.OPEN

    async def _close_after_grace(self, opened: ReducerRound) -> None:
        ctx = self.ctx
        if not ctx.sync_world:
            await ctx.clock.sleep(ctx.spec.averaging.grace_s)
            if extra_s := self.extensions.take(module_of_unit(opened.module), opened.round):  # one came late to the
                await ctx.clock.sleep(extra_s)  # last round: as long as it was late (reducer_state.py `Extensions`)
            if opened.result is None and not opened.closing:
                self.extensions.closing(opened.module, opened.round, ctx.clock.now())  # it waited for someone
                await self._close(opened)
            return
        # sync: reaching the target closes the round in reduce(); a rank lost fails it; otherwise the timeout ends it
        deadline = ctx.clock.now() + ctx.spec.averaging.timeout_s
        while opened.result is None and not opened.closing and ctx.clock.now() < deadline:
            lost = rank_lost(opened.world, dict(ctx.groups.live.get(module_of_unit(opened.module), {})))
            if lost:
                self._fail(opened, f"{RANK_LOST}: {lost[-8:]}")
                return
            await ctx.clock.sleep(0.25)
        if opened.result is None and not opened.closing:
            await self._close(opened)

    def _drop(self, opened: ReducerRound) -> None:
        log = self.log(opened.module)
        if log.open.get(opened.round) is opened:
            del log.open[opened.round]

    def _fail(self, opened: ReducerRound, reason: str, status: RoundStatus = RoundStatus.FAILED) -> None:
        """End an open round for every member with nothing to apply. It is not remembered as closed, so the members'
        retry at the same round number (or a candidate's question) opens it anew."""
        if status == RoundStatus.FAILED:
            logger.warning("module %s round %d failed: %s", opened.module, opened.round, reason)
        self._drop(opened)
        opened.finish(failed(opened.module, opened.round, reason, status))

    def _moved(self, opened: ReducerRound) -> OuterState | None | bool:
        """The state the round opened with, if we still hold it (None: we hold none); False when our state moved
        while the round was open: past it, or back before it (a minority ahead goes back to the majority's state,
        node/peer/splits.py)."""
        mine = self.effective_state(opened.module)
        if mine is not None and (mine.round != opened.round or mine.digest() != opened.digest_before):
            return False
        return mine

    async def _close(self, opened: ReducerRound) -> None:
        if opened.closing or opened.result is not None:
            return
        opened.closing = True
        moved = self._moved(opened)
        if moved is False:
            # Our state moved while the round was open (we applied another reducer's version of this round, or
            # re-synced): a result from us would not say the state it makes, and its members would apply a second
            # version of the round unchecked. They look at the announcements instead (an out-of-sync answer).
            self._fail(opened, "the reducer's state moved past the round while it was open", RoundStatus.OUT_OF_SYNC)
            return
        module, round_, numel = opened.module, opened.round, self.ctx.numels[opened.module]
        if not opened.frames:  # opened for a later candidate's question, nobody came: nothing to merge
            self._drop(opened)
            opened.finish(failed(module, round_, "no valid contribution"))
            return
        contributions = [(p, *opened.frames[p]) for p in sorted(opened.frames)]
        began = self.ctx.clock.now()
        # Off the event loop: a 25 M-value merge takes a second or more, and every other request would wait for it.
        before = moved if isinstance(moved, OuterState) else None
        try:
            closed = await asyncio.get_running_loop().run_in_executor(self.executor, close_and_hash, self.closer,
                                                                      contributions, numel, before)
        except BaseException as e:  # a bug in the rule (or the loop ending) must not leave the members waiting
            if opened.result is None:
                if isinstance(e, Exception):
                    logger.exception("closing %s round %d raised", module, round_)
                self._fail(opened, f"the reducer could not close the round: {type(e).__name__}")
            if isinstance(e, Exception):
                return
            raise
        if opened.result is not None:  # ended meanwhile (the sync baseline's rank check): one answer only
            return
        if self._moved(opened) is False:
            self._fail(opened, "the reducer's state moved past the round while it was open", RoundStatus.OUT_OF_SYNC)
            return
        self.ctx.trust.note_rejected(closed.rejected, module, round_)
        self._drop(opened)
        if not closed.mean_frame:
            opened.finish(failed(module, round_, "no valid contribution"))
            return
        logger.debug("%s round %d closed with %d of %d frames after %.2f s open, merged in %.2f s", module, round_,
                     len(contributions), opened.target, began - opened.opened_at, self.ctx.clock.now() - began)
        self._publish(opened, closed)

    def _publish(self, opened: ReducerRound, closed: ClosedRound) -> None:
        module, round_ = opened.module, opened.round
        reducers = next_reducers(self.ctx, module, closed.used)
        merged = {p: opened.frames[p] for p in closed.used}
        self.store.keep(module, round_, merged)  # for members who audit the round
        after = None if closed.after is None else closed.after.with_reducers(reducers)
        log = self.log(module)
        unit = self.ctx.numels.unit(module) if isinstance(self.ctx.numels, UnitNumels) else None
        if after is not None:
            # A slice's state after names its own rotation of the list for the next round, as the slice's view of the
            # module's next state will (slices.py `view`).
            log.post = after if unit is None or unit.k == 1 else after.with_reducers(
                rotated(reducers, round_ + 1, unit.j))
        result = RoundReply(module, round_, RoundStatus.MERGED, closed.used, closed.tokens,
                            after.digest() if after is not None else "", reducers=reducers,
                            frames=list_frames(merged, closed.used), mean_frame=closed.mean_frame)
        # A slice reduced its share of the module's tokens: the K slices of a round count them about once.
        share = closed.tokens if unit is None or unit.k == 1 else (
            closed.tokens * unit.numel // self.ctx.numels[unit.module])
        log.remember(round_, opened.digest_before, result, share)
        if set(closed.used) - {self.ctx.peer_id}:  # others may check it (alone, nobody asks for our frames)
            self.last_closed = self.ctx.clock.now()
        self.ctx.fresh.discard(module_of_unit(module))  # the list works: we named the next round's candidates ourselves
        opened.finish(result)

    def forget_pending(self, module: str, from_round: int | None = None) -> None:
        """Our state of the module was replaced (re-sync) by one at `from_round`: rounds we closed earlier no longer
        define it, and those from `from_round` on are not ours any more (we went back to a majority's older state,
        node/peer/splits.py): answered from our log, or told "closed" when a candidate asks, they would keep the
        others off the round they must now reduce again."""
        for unit in [u for u in self.logs if module_of_unit(u) == module]:  # the module and its slices
            log = self.logs[unit]
            log.post = None
            if from_round is not None:
                for r in [r for r in log.closed if r >= from_round]:
                    del log.closed[r]


def next_reducers(ctx: Context, module: str, used: tuple[str, ...]) -> tuple[str, ...]:
    """Who reduces the next round, as our result names them (reducers.py `next_candidates`)."""
    return next_candidates(ctx.peer_id, used, ctx.clients | ({ctx.peer_id} if ctx.client else set()),
                           ctx.groups.partners.get(module_of_unit(module), ()), sliced=module != module_of_unit(module))


def close_and_hash(closer: Closer, contributions: list, numel: int, before: OuterState | None) -> ClosedRound:
    """The round rule's close, and the digest of the state it makes (hashed here, on the merge thread, once)."""
    closed = closer(contributions, numel, before)
    if closed.after is not None:
        closed.after.digest()
    return closed
