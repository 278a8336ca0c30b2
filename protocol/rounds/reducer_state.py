"""What the reducer keeps of its rounds: one `ReducerRound` per (module, round), one `ModuleLog` per module.

A `ReducerRound` is a round this node reduces while it is open: the frames in, the quorum that closes it early, the
closing flag and its one result. A `ModuleLog` is the module's history as a reducer: the rounds open, the results
of the last closed ones (answered to members that ask late or again), the tokens merged, and which claimants are
active (a silent one no longer holds rounds open). The rules that open, close and answer rounds are reducer.py's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from pathswarm.protocol.rounds.frame_store import FrameStore
from pathswarm.protocol.rounds.messages import RoundReply, RoundStatus
from pathswarm.protocol.rounds.outer import OuterState
from pathswarm.protocol.rounds.slices import module_of_unit

RESULTS_KEPT = 4  # closed rounds a reducer remembers for late members
RESULTS_LOGGED = 64  # rounds whose merged tokens a reducer remembers (a healed split takes them back)
RANK_LOST = "a member left the world"  # sync baseline: reason prefix of a round failed because a member died
EXTEND_EVERY = 2
"""A module's rounds between two grace-window extensions for a member that came late (`Extensions`)."""
LATE_GRACES = 2.0
"""How late, in grace windows, a frame may come and still earn the next round the wait it needs (`Extensions`)."""
SILENT_ROUNDS = 3
"""A claimant none of whose frames reached us (merged or late) in this many rounds of a module, after claiming it
this long, no longer holds that module's rounds open: it counts toward the quorum again once a frame of it does."""


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
    opened_at: float = 0.0
    """Clock time the round opened (debug logs: how long it stayed open)."""

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
class Extensions:
    """The grace windows late frames earned. A frame of a round's own state that comes after the round's grace window
    ended (the round waited for it): its member is in step with us but behind, and (its next send waits for its other
    modules' rounds, which end when ours do) may stay so round after round, its outer gradient carried, growing,
    until the screen rejects it (issue 27: a restarted node late 10 rounds in a row). The module's next round here
    waits longer for it (it still closes as soon as its quorum is in), at most every EXTEND_EVERY rounds of the
    module: the member's next frame is in that round, so its carried steps stop growing even if its phase stays off
    (an extension once in four rounds still left a node late three rounds in four), and a peer late on purpose slows
    every other round by LATE_GRACES grace windows at most (it holds every round for one grace window already).
    A round closed by its quorum did not wait for the late one: it was not counted, and the next round counts it.
    The wait is as long as the frame was late, plus half a grace window, up to LATE_GRACES windows: a holder
    restarted in a phase one whole round off (its frames a grace window late, the rounds closing on their grace
    window while they waited for it) was never brought back by one more window, which it missed by milliseconds
    (benchmarks/restarts.py --kill replying --slices 3: 37 rounds of `shared` late, the run timed out).

    Per module, not per slice: in a round in slices the list rotates, and the slice we reduce next is another (we
    may not have opened it yet). Kept per slice, the extension never applied, and a restarted holder stayed late to
    every round of the module (benchmarks/restarts.py --kill replying --slices 3: 36 rounds)."""

    closing_at: dict[str, tuple[int, float]] = field(default_factory=dict)
    """Unit → (round, clock time) of the last close we began when its grace window ended (not its quorum)."""
    extend: dict[str, tuple[int, float]] = field(default_factory=dict)
    """Module → (the round whose grace window waits longer here, whichever of its slices we reduce in it, seconds)."""
    extended: dict[str, int] = field(default_factory=dict)
    """Module → the last round whose grace window we extended."""

    def closing(self, unit: str, round_: int, now: float) -> None:
        """(unit, round) closes here at the end of its grace window."""
        self.closing_at[unit] = (round_, now)

    def late_frame(self, unit: str, round_: int, now: float, grace_s: float) -> float | None:
        """A frame of (unit, round) came after the round closed: how late it came when that earns the module's next
        round a longer wait (None: it does not)."""
        closing, now_open, module = self.closing_at.get(unit), round_ + 1, module_of_unit(unit)
        if (closing is None or closing[0] != round_ or now - closing[1] >= LATE_GRACES * grace_s
                or now_open - self.extended.get(module, -EXTEND_EVERY) < EXTEND_EVERY):
            return None
        late_s = now - closing[1]
        self.extended[module] = now_open
        self.extend[module] = (now_open, min(LATE_GRACES * grace_s, late_s + grace_s / 2))
        return late_s

    def take(self, module: str, round_: int) -> float:
        """How much longer than its grace window the module's `round_` waits (0: not longer; asked once, when its
        window ends)."""
        got = self.extend.get(module)
        if got is None or got[0] != round_:
            return 0.0
        del self.extend[module]
        return got[1]


@dataclass
class Activity:
    """Which claimants of a module are active in its rounds, as this node saw them. One per module, shared by its
    slices' logs: in a round in slices a member's late frame of slice j reaches the reducer of slice j, which reduces
    another slice the next round (the list rotates). Kept per slice, that frame counted for no round the node reduced
    next: a restarted holder stayed "silent" to every slice's reducer, was never waited for, and was late to every
    round of the module for the rest of the run (benchmarks/restarts.py --kill replying --slices 3: 36 rounds)."""

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
    activity: Activity = field(default_factory=lambda: Activity())
    """Who is active in the module's rounds: one for all the slices of a module (reducer.py `log`)."""
    refused: dict[int, float] = field(default_factory=dict)
    """Round → when we answered it "behind" (our state had not reached it): we do not reduce it for a round's timeout
    afterwards, so the members that fail over to the next candidate and those that would reach us once we caught up
    apply one version. Not for good: when every candidate was behind once, each refuses, and the round would have
    no reducer at all (tests/swarm/test_split_heals.py stalled so); after the timeout, whoever took it elsewhere is
    past it, and its members with them."""

    def refuse(self, round_: int, now: float) -> None:
        self.refused.setdefault(round_, now)
        for old in sorted(self.refused)[:-RESULTS_KEPT]:
            del self.refused[old]

    def refuses(self, round_: int, now: float, hold_s: float) -> bool:
        """Whether the round is still refused here: answered "behind" less than hold_s ago."""
        since = self.refused.get(round_)
        if since is not None and now - since >= hold_s:
            del self.refused[round_]
            return False
        return since is not None

    def note_claims(self, holders: tuple[str, ...], round_: int) -> None:
        self.activity.note_claims(holders, round_)

    def note_seen(self, peer: str, round_: int) -> None:
        self.activity.note_seen(peer, round_)

    def silent(self, peer: str, round_: int) -> bool:
        return self.activity.silent(peer, round_)

    def quorum(self, holders: tuple[str, ...], round_: int,
               refuses: Callable[[str], bool]) -> tuple[int, tuple[str, ...]]:
        """The claimants a round waits for: not those whose contributions we refuse (a proven liar, a revoked member)
        nor the silent ones (they claim the module but send nothing): counted, either held every such round open for
        the whole grace window (benchmarks/hostile.py; issue 27: 0.90 → 0.3 rounds/s with one silent claimant in 3
        nodes). Returns the count and the silent claimants left out."""
        self.note_claims(holders, round_)
        welcome = [p for p in holders if not refuses(p)]
        silent = tuple(p for p in welcome if self.silent(p, round_))
        return len(welcome) - len(silent), silent

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
    return result.to(sender, status)


def failed(module: str, round_: int, reason: str, status: RoundStatus = RoundStatus.FAILED, **kw) -> RoundReply:
    return RoundReply(module, round_, status, reason=reason, **kw)
