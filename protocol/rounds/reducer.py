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
from dataclasses import dataclass, field

from pathswarm.protocol.rounds.audit import FrameStore
from pathswarm.protocol.rounds.context import Context
from pathswarm.protocol.rounds.messages import MAX_TOKENS, RoundReply, RoundStatus, list_frames
from pathswarm.protocol.rounds.outer import OuterState
from pathswarm.protocol.rounds.reducers import MAX_CANDIDATES, Stance, successors
from pathswarm.protocol.rounds.rule import ClosedRound
from pathswarm.protocol.rounds.stance import Stances

logger = logging.getLogger(__name__)

RESULTS_KEPT = 4  # closed rounds a reducer remembers for late members
RESULTS_LOGGED = 64  # rounds whose merged tokens a reducer remembers (a healed split takes them back)
RANK_LOST = "a member left the world"  # sync baseline: reason prefix of a round failed because a member died
SILENT_ROUNDS = 3
"""A claimant none of whose frames reached us (merged or late) in this many rounds of a module, after claiming it
this long, no longer holds that module's rounds open: it counts toward the quorum again once a frame of it does."""

Closer = Callable[[Sequence[tuple[str, int, bytes]], int, OuterState | None], ClosedRound]
"""(contributions as (peer, tokens, frame) sorted by peer, the module's size, the state the round opened with) →
the closed round: the round rule's `close_round` (tests inject a lying one)."""


def rank_lost(world: dict[str, int], live: dict[str, int]) -> str:
    """A peer of `world` (holders when a sync round opened → the round their claim said) that has since died:
    its claim lapsed, or it came back as a new process (its claim's round went down; rounds count per process).
    Returns that peer's id, or '' when every rank is still there."""
    for peer, round_ in sorted(world.items()):
        if peer not in live or live[peer] < round_:
            return peer
    return ""


@dataclass
class ReducerRound:
    """One (module, round) we reduce: the frames in, the quorum that closes it early, and its one result."""

    module: str
    round: int
    digest_before: str
    target: int
    world: dict[str, int] = field(default_factory=dict)
    """Sync baseline: live holders at opening → their claimed round."""
    frames: dict[str, tuple[int, bytes]] = field(default_factory=dict)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    result: RoundReply | None = None
    checked: bool = False
    """The earlier candidates were asked (stance.py); until then no frame enters."""
    closing: bool = False
    """The merge has begun: frames arriving now are answered late."""
    uncounted: set[str] = field(default_factory=set)
    """Claimants the quorum left out as silent when the round opened: one that sends a frame raises the quorum by
    one, so that it does not complete the round in the place of a counted holder (who would then be late)."""

    def add(self, sender: str, tokens: int, frame: bytes) -> bool:
        """Take a frame while the round is open; True when the quorum is in (the caller closes it)."""
        if self.result is None and not self.closing:
            if sender in self.uncounted and sender not in self.frames:
                self.uncounted.discard(sender)
                self.target += 1
            self.frames[sender] = (tokens, frame)
        return not self.closing and self.result is None and len(self.frames) >= self.target

    def finish(self, result: RoundReply) -> None:
        self.result = result
        self.done.set()


@dataclass
class ModuleLog:
    """What this node keeps of one module's rounds as a reducer."""

    open: dict[int, ReducerRound] = field(default_factory=dict)
    closed: dict[int, tuple[str, RoundReply]] = field(default_factory=dict)
    """Round → (the digest it opened with, its result): answered to members that ask late or again."""
    post: OuterState | None = None
    """The state the module will have once our node applies the rounds we closed: members that apply a mean faster
    than our training loop does must not find us behind."""
    tokens_reduced: int = 0
    """Tokens in the rounds we closed with a mean: what entered the model through us (a member that dies before it
    hears the result cannot count its own tokens; the reducer that merged them can)."""
    reduced: dict[int, int] = field(default_factory=dict)
    """State round the result makes → tokens we merged into it (a healed split takes them back)."""
    claimed_since: dict[str, int] = field(default_factory=dict)
    """Claimant → the round of the module at which we first counted it (only current claimants are kept)."""
    seen: dict[str, int] = field(default_factory=dict)
    """Peer → the latest round of the module in which a frame of it reached us, or a result we applied merged it."""
    noted_round: int = -1
    """The round of the last `note_claims`: silence is counted in rounds this node saw."""

    def note_claims(self, holders: tuple[str, ...], round_: int) -> None:
        if round_ - self.noted_round > SILENT_ROUNDS:
            # We saw none of the rounds between (we were out of sync, or re-synced ahead): every claimant would look
            # silent at once. Count afresh from here.
            self.claimed_since, self.seen = {}, {}
        self.noted_round = max(self.noted_round, round_)
        self.claimed_since = {p: self.claimed_since.get(p, round_) for p in holders}
        self.seen = {p: r for p, r in self.seen.items() if p in self.claimed_since}

    def note_seen(self, peer: str, round_: int) -> None:
        if peer in self.claimed_since or len(self.seen) < len(self.claimed_since) + 64:  # bounded by the claims
            self.seen[peer] = max(self.seen.get(peer, round_), round_)

    def silent(self, peer: str, round_: int) -> bool:
        """A claimant that has missed the last SILENT_ROUNDS rounds (it claimed the module at least that long)."""
        since = self.claimed_since.get(peer, round_)
        return round_ - since >= SILENT_ROUNDS and round_ - self.seen.get(peer, since - 1) > SILENT_ROUNDS

    def remember(self, round_: int, digest_before: str, result: RoundReply, tokens: int) -> None:
        self.closed[round_] = (digest_before, result)
        for old in sorted(self.closed)[:-RESULTS_KEPT]:
            del self.closed[old]
        self.tokens_reduced += tokens
        self.reduced[round_ + 1] = tokens  # keyed by the state round the result makes, as the node's history
        for old in sorted(self.reduced)[:-RESULTS_LOGGED]:
            del self.reduced[old]


def answer(result: RoundReply, sender: str, store: FrameStore) -> RoundReply:
    """A closed round's result as told to `sender`: merged (or alone) when its frame is in the mean, else late."""
    status = RoundStatus.MERGED if sender in result.contributors else RoundStatus.LATE
    if status == RoundStatus.LATE:
        # A late member applies the round too, so it may audit it: let it read the frames (audit.py).
        store.allow(result.module, result.round, sender)
    elif len(result.contributors) == 1:
        status = RoundStatus.ALONE
    return RoundReply(result.module, result.round, status, result.contributors, result.tokens, result.digest_after,
                      reducers=result.reducers, frames=result.frames, mean_frame=result.mean_frame)


def failed(module: str, round_: int, reason: str, status: RoundStatus = RoundStatus.FAILED, **kw) -> RoundReply:
    return RoundReply(module, round_, status, reason=reason, **kw)


class Reducer:
    """The rounds this node reduces, for all its modules. Runs on the node's network event loop."""

    def __init__(self, ctx: Context, closer: Closer, store: FrameStore):
        self.ctx, self.closer, self.store = ctx, closer, store
        self.logs: dict[str, ModuleLog] = {m: ModuleLog() for m in ctx.numels}
        self.stances = Stances(ctx)
        self.behind: dict[str, str] = {}
        """Module → a peer that is ahead of us (the node re-syncs from it)."""
        # One merge at a time, as when they ran on the loop: a node's modules close in the same grace window, and
        # each 25 M-value merge holds every decoded contribution (memory) and competes with training for the cores.
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pathswarm-merge")

    def effective_state(self, module: str) -> OuterState | None:
        """Our module state, or the state it will have after the rounds we closed, whichever is newer."""
        mine, post = self.ctx.state_of(module), self.logs[module].post
        if post is not None and (mine is None or post.round > mine.round):
            return post
        return mine

    async def _wait_for_state(self, module: str) -> OuterState | None:
        """A node registers its handlers before it has synced its modules: wait (at most the grace
        window) for our state instead of failing the round of a peer that is quicker than us."""
        clock = self.ctx.clock
        deadline = clock.now() + self.ctx.spec.averaging.grace_s
        while (mine := self.effective_state(module)) is None and clock.now() < deadline:
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
        log = self.logs[module]
        if round_ in log.closed:
            digest_before, result = log.closed[round_]
            if digest != digest_before:
                return failed(module, round_, "state before the round differs", RoundStatus.OUT_OF_SYNC)
            log.note_seen(sender, round_)  # a late frame of our state: not silent (the quorum waits for it again)
            # A contributor asking again lost our reply: its outer gradient is in the mean ("merged", not "late").
            return answer(result, sender, self.store)
        mine = await self._wait_for_state(module)
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
        await opened.done.wait()
        assert opened.result is not None
        if opened.result.status in (RoundStatus.FAILED, RoundStatus.OUT_OF_SYNC):
            return opened.result
        return answer(opened.result, sender, self.store)

    def _compare(self, module: str, round_: int, sender: str, digest: str,
                 mine: OuterState | None) -> RoundReply | None:
        """Why the contribution cannot enter our round (None when it can): we lack the module, or our state is
        another round's or another state of the round."""
        if mine is None:
            return failed(module, round_, "reducer does not hold this module")
        if mine.round > round_:
            return failed(module, round_, f"the group is at round {mine.round}", RoundStatus.OUT_OF_SYNC)
        if mine.round < round_:
            self.behind[module] = sender
            return failed(module, round_, f"reducer is at round {mine.round}", RoundStatus.BEHIND)
        if digest != mine.digest():
            return failed(module, round_, "state before the round differs", RoundStatus.OUT_OF_SYNC)
        return None

    async def _check_rivals(self, module: str, round_: int, sender: str,
                            mine: OuterState) -> ReducerRound | RoundReply:
        """Before the first contribution enters, the candidates before us must not hold the round."""
        log = self.logs[module]
        rival = await self.stances.rival(module, round_, mine)
        if rival:
            stale = log.open.get(round_)
            if stale is not None and not stale.frames:  # opened empty for a later candidate's question
                log.open.pop(round_, None)
            peer, stance = rival
            if stance == Stance.AHEAD:
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
        world = dict(ctx.groups.live.get(module, {}))
        opened = self.logs[module].open[round_] = ReducerRound(module, round_, mine.digest(),
                                                               max(1, min(quorum, counted)), world=world,
                                                               uncounted=set(silent))
        asyncio.get_running_loop().create_task(self._close_after_grace(opened))
        return opened

    def _expected(self, module: str, round_: int) -> tuple[int, tuple[str, ...]]:
        """How many contributions the round waits for before its grace window ends. A claimant whose contributions
        we refuse (a proven liar, a revoked member) cannot complete it, and a silent one (it claims the module but
        sends nothing) would not: counted, either held every such round open for the whole grace window
        (benchmarks/hostile.py; issue 27: 0.90 → 0.3 rounds/s with one silent claimant in 3 nodes).
        Returns the count and the silent claimants left out."""
        ctx = self.ctx
        holders = None if ctx.sync_world else ctx.groups.holders.get(module)
        if holders is None:
            return ctx.groups.expected.get(module, 1), ()
        log = self.logs[module]
        log.note_claims(holders, round_)
        welcome = [p for p in holders if not ctx.trust.refuses(p)]
        silent = tuple(p for p in welcome if log.silent(p, round_))
        return len(welcome) - len(silent), silent

    def stance(self, module: str, round_: int, digest: str, asker: str) -> Stance:
        """Our stance on (module, round) when a candidate asks; we open the round for a later candidate, so the
        earliest live candidate reduces it."""
        log = self.logs.get(module)
        if log is not None and round_ in log.closed:
            return Stance.CLOSED
        if log is not None and round_ in log.open:
            return Stance.OPEN
        mine = self.effective_state(module) if log is not None else None
        if mine is None or mine.round < round_ or mine.round == round_ and mine.digest() != digest:
            return Stance.NOT_HERE
        if mine.round > round_:
            return Stance.AHEAD
        agreed = mine.reducers or self.ctx.groups.genesis.get(module, ())
        me = self.ctx.peer_id
        if asker in agreed and me in agreed and agreed.index(asker) < agreed.index(me):
            return Stance.NOT_HERE  # a restarted head asking whether anyone took its round: we have not
        self.open_round(module, round_, mine)
        return Stance.OPEN

    async def _close_after_grace(self, opened: ReducerRound) -> None:
        ctx = self.ctx
        if not ctx.sync_world:
            await ctx.clock.sleep(ctx.spec.averaging.grace_s)
            if opened.result is None and not opened.closing:
                await self._close(opened)
            return
        # sync: reaching the target closes the round in reduce(); a rank lost fails it; otherwise the timeout ends it
        deadline = ctx.clock.now() + ctx.spec.averaging.timeout_s
        while opened.result is None and not opened.closing and ctx.clock.now() < deadline:
            lost = rank_lost(opened.world, dict(ctx.groups.live.get(opened.module, {})))
            if lost:
                self._fail(opened, f"{RANK_LOST}: {lost[-8:]}")
                return
            await ctx.clock.sleep(0.25)
        if opened.result is None and not opened.closing:
            await self._close(opened)

    def _drop(self, opened: ReducerRound) -> None:
        log = self.logs[opened.module]
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
        past the round while it was open."""
        mine = self.effective_state(opened.module)
        if mine is not None and (mine.round > opened.round
                                 or (mine.round == opened.round and mine.digest() != opened.digest_before)):
            return False
        return mine if mine is not None and mine.round == opened.round else None

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
        # Off the event loop: a 25 M-value merge takes a second or more, and every other request would wait for it.
        before = moved if isinstance(moved, OuterState) else None
        try:
            closed = await asyncio.get_running_loop().run_in_executor(self.executor, self._close_and_hash,
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
        self._publish(opened, closed)

    def _close_and_hash(self, contributions: list, numel: int, before: OuterState | None) -> ClosedRound:
        """The round rule's close, and the digest of the state it makes (hashed here, off the loop, once)."""
        closed = self.closer(contributions, numel, before)
        if closed.after is not None:
            closed.after.digest()
        return closed

    def _next_reducers(self, module: str, used: tuple[str, ...]) -> tuple[str, ...]:
        ctx = self.ctx
        reducers = successors(ctx.peer_id, used, ctx.clients | ({ctx.peer_id} if ctx.client else set()))
        partners = ctx.groups.partners.get(module, ())
        if set(used) == {ctx.peer_id} and len(partners) > 1:
            # Alone in the round while holders we have merged this module with may reduce: each side of a split
            # (after a revocation, say) would otherwise name only itself and reduce itself round after round, the
            # split watch healing one round while the next is already in flight. Both sides have merged with each
            # other and name the same sorted list, so they meet at its head next round (node/peer/claims.py
            # `partners_of`; a node that just joined, at another round of the module, is not in it).
            reducers = tuple(partners[:MAX_CANDIDATES])
        return reducers

    def _publish(self, opened: ReducerRound, closed: ClosedRound) -> None:
        module, round_ = opened.module, opened.round
        reducers = self._next_reducers(module, closed.used)
        merged = {p: opened.frames[p] for p in closed.used}
        self.store.keep(module, round_, merged)  # for members who audit the round
        after = None if closed.after is None else closed.after.with_reducers(reducers)
        log = self.logs[module]
        if after is not None:
            log.post = after
        result = RoundReply(module, round_, RoundStatus.MERGED, closed.used, closed.tokens,
                            after.digest() if after is not None else "", reducers=reducers,
                            frames=list_frames(merged, closed.used), mean_frame=closed.mean_frame)
        log.remember(round_, opened.digest_before, result, closed.tokens)
        self.ctx.fresh.discard(module)  # the list works: we named the next round's candidates ourselves
        opened.finish(result)

    def forget_pending(self, module: str) -> None:
        """Our state of the module was replaced (re-sync): rounds we closed earlier no longer define it."""
        self.logs[module].post = None
