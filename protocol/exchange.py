"""Module-group outer rounds over libp2p streams (protocol/net.py), with bit-identical results for every member.

For each (module, outer round) one holder is the *reducer*: the live holder with the smallest peer id.
Every holder sends it one codec frame (its outer gradient) with its token count and the digest of
its state before the round. The reducer closes the round when `min(min_group, live holders)` are in
or when the grace window since the first contribution ends, and closes it by the round rule the node injects
(node/train/round.py `close_round`: screen, robust token-weighted mean in sorted peer-id order, encode **once**).
A peer whose contributions are rejected `averaging.max_rejections` times is ignored for the session.
Every member, the reducer included, decodes those same bytes, so all apply the identical outer step;
the reducer also returns the digest the state must have afterwards, and a member that disagrees
treats the round as failed and re-syncs.

No reducer is trusted alone (protocol/audit.py): the result lists every merged contribution as (peer, tokens,
frame hash); a member whose own entry is missing or wrong stops trusting that reducer, and members audit rounds
at random by recomputing the mean from the listed frames.

Replies: `merged` (your frame is in the mean), `late` (the round had closed; apply the mean and
keep your outer gradient for the next round), `out_of_sync` (your state before the round differs
from the group's: download the module's state), `behind` (the reducer is behind you). A reducer that
dies just closes the stream: the member's round fails at once and its outer gradient is kept.

Synchronous baseline (`node run --sync-rounds`, for benchmarks/chaos.py): a round waits for the job's
whole world, and fails for everyone when one of its members dies (its claim lapses or restarts), as a
data-parallel collective does; the members discard their steps and retry the round.

Also served: `state` requests, which return a module's anchor, outer momentum and round for joiners.
Everything received is bounded by the module's size from the spec before it is read.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from pathswarm.protocol.audit import AuditService, FrameEntry, frame_hash, list_frames, parse_frame_list
from pathswarm.protocol.clock import MONOTONIC, Clock
from pathswarm.protocol.handlers import Budget, Guard
from pathswarm.protocol.membership import MembershipError, gate_of
from pathswarm.protocol.reducers import MAX_CANDIDATES, RIVAL, Stance, earlier, parse_candidates, successors
from pathswarm.protocol.spec import SwarmSpec
from pathswarm.protocol.wire import (
    MAX_HEADER_BYTES,
    NotServingYetError,
    Traffic,
    WireError,
    discard_rest,
    field_of,
    read_message,
    write_message,
)

if TYPE_CHECKING:
    from pathswarm.protocol.net import PeerStreams

logger = logging.getLogger(__name__)

PROTOCOL_VERSION = "v3"  # v3: results list their merged frames' hashes, which members check (protocol/audit.py)
RESULTS_KEPT = 4  # closed rounds a reducer remembers for late members
RESULTS_LOGGED = 64  # rounds whose merged tokens a reducer remembers (a healed split takes them back)
MAX_CLIENTS = 4096  # most client peers remembered (one set entry each)
MAX_TOKENS = 1 << 53  # most tokens one contribution may count (exact in a float; no round trains so many)
UNREACHABLE = "reducer unreachable"  # reason prefix of a round that failed at the connection level
RANK_LOST = "a member left the world"  # sync baseline: reason prefix of a round failed because a member died
REFUSAL_DRAIN_S = 3.0  # how long a refused request's remaining bytes are read and dropped before closing
MAX_ROUND = 1 << 62  # rounds are int64 everywhere (records.MAX_COUNT); state_digest packs them in 8 bytes
REASK_S, REASK_MAX_S = 0.25, 4.0  # pauses before asking again a candidate that defers to a proven liar (doubling)
STANCE_TIMEOUT_S = 2.0  # how long a candidate waits for an earlier one's stance before counting it out
LOST_REPLY_RETRY_S = 0.3  # pause before asking a reducer again after its connection broke
NOT_SERVING_RETRY_S = 0.5  # pause before asking again a peer that is up but does not serve rounds yet


def rank_lost(world: dict[str, int], live: dict[str, int]) -> str:
    """A peer of `world` (holders when a sync round opened → the round their claim said) that has since died:
    its claim lapsed, or it came back as a new process (its claim's round went down; rounds count per process).
    Returns that peer's id, or '' when every rank is still there."""
    for peer, round_ in sorted(world.items()):
        if peer not in live or live[peer] < round_:
            return peer
    return ""


@dataclass(frozen=True)
class LocalState:
    """A module's state as of its last applied round: what digests compare and joiners download."""

    round: int
    digest: str
    anchor: torch.Tensor
    momentum: torch.Tensor
    reducers: tuple[str, ...] = ()
    """Who reduces the next round, in failover order, as the last round's result named them (protocol/reducers.py)."""


@dataclass(frozen=True)
class Closed:
    """What the reducer makes of a round's contributions (computed by the round rule the node injects)."""

    mean_frame: bytes
    """The one encoded mean every member decodes; b'' when no contribution passed screening."""
    used: tuple[str, ...]
    """Peers whose outer gradients are in it, sorted."""
    tokens: int
    rejected: tuple[tuple[str, str], ...]
    """(peer, reason) of each contribution screened out."""
    after: LocalState | None
    """Our state after applying the mean to the state the round opened with (None if we no longer hold that)."""


Closer = Callable[[list[tuple[str, int, bytes]], int, "LocalState | None"], Closed]
"""(contributions as (peer, tokens, frame) sorted by peer, the module's size, the state the round opened with)
→ the closed round."""


@dataclass
class RoundResult:
    module: str
    round: int
    status: str  # merged | late | alone | out_of_sync | behind | failed | redirect
    mean_frame: bytes = b""
    contributors: list[str] = field(default_factory=list)
    tokens: int = 0
    digest_after: str = ""
    reason: str = ""
    reducers: tuple[str, ...] = ()
    """Who reduces the next round, in failover order (the reducer of this one, then its contributors, sorted)."""
    redirect: str = ""
    """status 'redirect': the earlier candidate that holds the round; send the contribution there."""
    reducer: str = ""
    """Who answered (the member side fills it in): the peer to re-sync from when it says we are out of sync."""
    frames: tuple[FrameEntry, ...] = ()
    """(peer, tokens, frame hash) of every merged contribution, as the reducer lists them (protocol/audit.py)."""

    @property
    def applicable(self) -> bool:
        return self.status in ("merged", "late", "alone") and bool(self.mean_frame)


@dataclass
class _OpenRound:
    digest_before: str
    target: int
    frames: dict[str, tuple[int, bytes]] = field(default_factory=dict)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    result: RoundResult | None = None
    world: dict[str, int] = field(default_factory=dict)  # sync: live holders at opening → their claimed round
    checked: bool = False  # the earlier candidates were asked (protocol/reducers.py); until then no frame enters


class ModuleExchange:
    """Serves and joins module rounds for one node. All methods run on the node's network event loop."""

    def __init__(self, spec: SwarmSpec, streams: PeerStreams | None, peer_id: str, numels: dict[str, int],
                 state_of: Callable[[str], LocalState | None],
                 closer: Closer,
                 traffic: Traffic | None = None, membership: str = "",
                 sync_world: bool = False, clock: Clock = MONOTONIC):
        self.spec = spec
        self.clock = clock  # grace windows and the sync deadline read it (tests pass a ManualClock)
        # Synchronous baseline (benchmarks/chaos.py): a round waits for expected_holders contributions (the
        # node sets it to the job's whole world, dead workers included) instead of closing at the grace
        # window, as a data-parallel collective blocks until every rank arrives; only timeout_s ends the wait.
        self.sync_world = sync_world
        # Private swarms: every request carries our certificate, and every request we serve must carry
        # one that names the peer id libp2p authenticated on the stream (a copied one names another).
        self.membership = membership
        self.gate = gate_of(spec.membership.owner_key, spec.swarm_id)  # shared: revocations learnt apply here too
        self.streams = streams  # None: offline
        self.peer_id = peer_id
        self.numels = numels  # module id → parameter count, from the spec: bounds every message
        self.state_of = state_of
        self.closer = closer  # the round rule's close (node/train/round.py), injected: protocol/ knows no node code
        # The state each module will have once our own node applies the rounds we closed: members that
        # apply a mean faster than our training loop does must not find us "behind".
        self._post: dict[str, LocalState] = {}
        self.traffic = traffic or Traffic()
        self.expected_holders: dict[str, int] = {}
        # sync: module → {live holder: the round its claim says}, refreshed by the node while it waits. A holder
        # whose claim lapses or restarts at a lower round has lost its rank: the open round fails for all.
        self.live_holders: dict[str, dict[str, int]] = {}
        self.behind: dict[str, str] = {}  # module → a peer that is ahead of us (re-sync from it)
        # module → tokens in the rounds we closed with a mean: what entered the model through us (a member that
        # dies before it hears the result cannot count its own tokens; the reducer that merged them can)
        self.tokens_reduced: dict[str, int] = {}
        self.reduced_log: dict[str, dict[int, int]] = {}  # module → state round → tokens we merged into it
        self.offenses: dict[str, int] = {}  # peer → contributions of it we rejected (robust aggregation)
        self.client = False
        """We run as a client (protocol/reachability.py): our contributions say so, and we name ourselves last."""
        self.clients: set[str] = set()
        """Peers whose contributions said they are clients: left out of the reducer candidates we name."""
        # A member sends one contribution per module per round and downloads a module's state when it joins or
        # re-syncs: these budgets are far above that, and far below what a flood would need.
        # Deadlines: a contribution waits for its round (grace window, and up to the timeout in sync mode); a state
        # download gets the time its downloader waits (fetch_state); per peer, two states in service at a time (a
        # refused request keeps its slot while its rest is drained: a retry right after it must still get one).
        avg = spec.averaging
        self.guard = Guard({
            "contribute": Budget(4.0, 32, per_peer=2 * len(numels) + 2, total=1024,
                                 deadline_s=avg.grace_s + avg.timeout_s + 30),
            "state": Budget(1.0, 16, per_peer=2, total=8, deadline_s=avg.timeout_s + 5),
            "stance": Budget(4.0, 32, per_peer=2 * len(numels) + 2, total=1024, deadline_s=STANCE_TIMEOUT_S + 5),
            # an audit downloads a round's frames (about once a round per group); an alert follows a proven lie
            "frames": Budget(1.0, 8, per_peer=len(numels) + 1, total=16, deadline_s=avg.timeout_s + 5),
            "alert": Budget(0.5, 8, per_peer=2, total=64, deadline_s=10.0)},
            self._refuse)
        self.limits = self.guard.limits
        # Modules whose reducer list this process has not seen work yet (it started from a checkpoint or the seed):
        # at the head of the list it asks the others before reducing (protocol/reducers.py, rule 4).
        self.fresh: set[str] = set(numels)
        # peer → clock time until which members try it last: it failed one of our rounds at the connection level
        self.skip_until: dict[str, float] = {}
        # module → who may reduce its round 0, from the claims (the node sets it): no result has named anyone yet
        self.genesis: dict[str, tuple[str, ...]] = {}
        self.partners: dict[str, tuple[str, ...]] = {}
        """Module → the holders we merged it with, and us, sorted: named next by a reducer alone in its round."""
        self.drop_reply: set[tuple[str, int]] = set()  # fault injection (tests): close these rounds' replies unsent
        self._checks: dict[tuple[str, int], asyncio.Future] = {}
        self._open: dict[tuple[str, int], _OpenRound] = {}
        self._closed: dict[tuple[str, int], tuple[str, RoundResult]] = {}
        # The protocol's version is in the names: a node of another version is "not serving" to us, cleanly, instead
        # of out of sync every round (v2: full-length state digests).
        prefix = f"{spec.swarm_id[:16]}.{PROTOCOL_VERSION}"
        self.contribute_name = f"pathswarm.{prefix}.contribute"
        self.state_name = f"pathswarm.{prefix}.state"
        self.stance_name = f"pathswarm.{prefix}.stance"
        self.audits = AuditService(streams, prefix, numels, self._frame_limit, self._admit, self.guard.serve,
                                   self.traffic, membership)
        # peer → why we no longer trust it: it misreported our contribution or sent a mean its frames do not give
        # (protocol/audit.py). It is never our reducer again, and we neither ask its stance nor merge its frames.
        self.distrusted: dict[str, str] = {}
        self.voted_out: frozenset[str] = frozenset()
        """Peers most holders of our modules announce they caught lying (set by node/peer/state_sync.py)."""
        # (module, round) → (tokens, frame hash) of every frame we sent for it: a resend after a lost reply carries
        # a newer frame, and the reducer answers from the round it closed with the older one (not a lie)
        self._sent: dict[tuple[str, int], set[tuple[int, str]]] = {}

    async def start(self) -> None:
        if self.streams is None:  # offline: the node reduces its own rounds, nothing is served
            return
        await self.streams.serve(self.contribute_name, self._on_contribute)
        await self.streams.serve(self.state_name, self._on_state)
        await self.streams.serve(self.stance_name, self._on_stance)
        await self.audits.start()

    def distrust(self, peer: str, reason: str) -> None:
        if peer != self.peer_id and peer not in self.distrusted:
            logger.error("no longer trusting peer %s: %s", peer, reason)
            self.distrusted[peer] = reason

    def refuses(self, peer: str) -> bool:
        """We refuse this peer's contributions (a proven liar, or revoked by the owner): it cannot complete a round
        we reduce, so the node leaves it out of the quorum (node/peer/node.py `_use_groups`). A peer only voted out
        (`voted_out`) is still merged: it counts."""
        return peer in self.distrusted or self.gate.revoked(peer)

    def shunned(self, peer: str) -> bool:
        """Revoked by the owner, proven to have lied to us, or caught lying by most holders of our modules
        (`voted_out`, node/peer/vouch.py): never our reducer, no say in who reduces. The others leave a liar they
        caught; a member that followed the list to it would merge its rounds alone with the liar."""
        return peer in self.distrusted or peer in self.voted_out or self.gate.revoked(peer)

    def _frame_limit(self, module: str) -> int:
        # An int8 frame is ~1 byte per value plus scales and headers; 2× + 64 KiB is a generous cap.
        return 2 * self.numels[module] + (64 << 10)

    # ---- reducer side ------------------------------------------------------------------------
    def effective_state(self, module: str) -> LocalState | None:
        """Our module state, or the state it will have after the rounds we closed, whichever is newer."""
        mine, post = self.state_of(module), self._post.get(module)
        if post is not None and (mine is None or post.round > mine.round):
            return post
        return mine

    def forget_pending(self, module: str) -> None:
        """Our state of the module was replaced (re-sync): rounds we closed earlier no longer define it."""
        self._post.pop(module, None)

    async def _wait_for_state(self, module: str) -> LocalState | None:
        """A node registers its handlers before it has synced its modules: wait (at most the grace
        window) for our state instead of failing the round of a peer that is quicker than us."""
        deadline = self.clock.now() + self.spec.averaging.grace_s
        while (mine := self.effective_state(module)) is None and self.clock.now() < deadline:
            await self.clock.sleep(0.05)
        return mine

    async def _on_contribute(self, sender: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async def body() -> None:
            header, _ = await read_message(reader, 0, self.traffic)
            if not await self._admit(header, sender, reader, writer):
                return
            module = field_of(header, "module", str)
            if module not in self.numels:
                raise WireError(f"unknown module {module!r}")
            round_ = field_of(header, "round", int)
            if why := self._beyond_limit(round_):  # before anything of it is read or remembered
                await self._refuse(why, reader, writer)
                return
            if header.get("client") is not True:
                self.clients.discard(sender)  # its latest word: a restart may have made it reachable
            elif len(self.clients) < MAX_CLIENTS:
                self.clients.add(sender)  # never named a reducer candidate: nobody could dial it
            # The frame follows in a second message, bounded by this module's size.
            _, frame = await read_message(reader, self._frame_limit(module), self.traffic)
            result = await self.reduce(module, round_, sender, field_of(header, "tokens", int),
                                       field_of(header, "digest", str), frame)
            if (module, round_) in self.drop_reply and result.applicable:
                self.drop_reply.discard((module, round_))
                logger.warning("fault injection: the reply of %s round %d to %s is dropped", module, round_,
                               sender[-8:])
                return
            await self._send_result(writer, result)

        await self.guard.serve("contribute", sender, reader, writer, body)

    async def _refuse(self, reason: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Tell the peer why, then drop the rest of its request (a frame may follow) so that closing the
        stream does not reset it before the peer has read the reason."""
        await write_message(writer, {"status": "refused", "reason": reason[:200]}, b"", self.traffic)
        await discard_rest(reader, MAX_HEADER_BYTES + max(map(self._frame_limit, self.numels), default=0) + 64,
                           REFUSAL_DRAIN_S)

    async def _admit(self, header: dict, sender: str, reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> bool:
        """Check the requester's membership (private swarms); refuse and log it when it has none valid."""
        try:
            self.gate.check(header.get("membership") if isinstance(header.get("membership"), str) else None, sender)
            return True
        except MembershipError as e:
            logger.warning("refused peer %s: %s", sender, e)
            await self._refuse(str(e), reader, writer)
            return False

    async def _send_result(self, writer: asyncio.StreamWriter, r: RoundResult) -> None:
        header = {"module": r.module, "round": r.round, "status": r.status, "contributors": r.contributors,
                  "tokens": r.tokens, "digest_after": r.digest_after, "reason": r.reason,
                  "reducers": list(r.reducers), "redirect": r.redirect, "frames": [list(e) for e in r.frames]}
        await write_message(writer, header, r.mean_frame, self.traffic)

    async def reduce(self, module: str, round_: int, sender: str, tokens: int, digest: str,
                     frame: bytes) -> RoundResult:
        """Add one contribution to (module, round) and wait until the round closes."""
        if tokens <= 0:
            return RoundResult(module, round_, "failed", reason="non-positive token count")
        if tokens > MAX_TOKENS:  # JSON ints have no bound: float(10**400) in weighted_average would raise
            return RoundResult(module, round_, "failed", reason="token count too large")
        if sender in self.distrusted:
            return RoundResult(module, round_, "failed", reason="ignored: you misreported a round to us")
        if self.offenses.get(sender, 0) >= self.spec.averaging.max_rejections:
            return RoundResult(module, round_, "failed",
                               reason=f"ignored: {self.offenses[sender]} contributions of yours were rejected")
        closed = self._closed.get((module, round_))
        if closed is not None:
            digest_before, result = closed
            if digest != digest_before:
                return RoundResult(module, round_, "out_of_sync", reason="state before the round differs")
            # A contributor asking again lost our reply: its outer gradient is in the mean ("merged", not "late").
            return self._answer(result, sender)
        mine = await self._wait_for_state(module)
        if mine is None:
            return RoundResult(module, round_, "failed", reason="reducer does not hold this module")
        if mine.round > round_:
            return RoundResult(module, round_, "out_of_sync", reason=f"the group is at round {mine.round}")
        if mine.round < round_:
            self.behind[module] = sender
            return RoundResult(module, round_, "behind", reason=f"reducer is at round {mine.round}")
        if digest != mine.digest:
            return RoundResult(module, round_, "out_of_sync", reason="state before the round differs")
        key = (module, round_)
        open_round = self._open.get(key)
        if open_round is not None and digest != open_round.digest_before:
            # Our own state changed (a re-sync) after the round opened: merging outer gradients taken from two
            # different states would leave the members with different replicas under one round.
            return RoundResult(module, round_, "out_of_sync", reason="state before the round differs from the group's")
        if open_round is None or not open_round.checked:
            # Before the first contribution enters, the candidates before us must not hold the round.
            rival = await self._rival(module, round_, mine)
            if rival:
                stale = self._open.get(key)
                if stale is not None and not stale.frames:  # opened empty for a later candidate's question
                    self._open.pop(key, None)
                peer, stance = rival
                if stance == Stance.AHEAD:
                    return RoundResult(module, round_, "out_of_sync", reason=f"peer {peer[-8:]} is past this round")
                return RoundResult(module, round_, "redirect", reason=f"{peer[-8:]} holds this round", redirect=peer)
            closed = self._closed.get(key)
            if closed is not None:  # closed while we asked
                return self._answer(closed[1], sender)
            open_round = self._open.get(key) or self._open_round(module, round_, mine)
            open_round.checked = True
        if open_round.result is None:
            open_round.frames[sender] = (tokens, frame)
            if len(open_round.frames) >= open_round.target:
                self._close(key, open_round)
        await open_round.done.wait()
        assert open_round.result is not None
        result = open_round.result
        if result.status in ("failed", "out_of_sync"):
            return result
        return self._answer(result, sender)

    def _answer(self, result: RoundResult, sender: str) -> RoundResult:
        status = "merged" if sender in result.contributors else "late"
        if status == "late":
            # A late member applies the round too, so it may audit it: let it read the frames (protocol/audit.py).
            self.audits.store.allow(result.module, result.round, sender)
        if status == "merged" and len(result.contributors) == 1:
            status = "alone"
        return RoundResult(result.module, result.round, status, result.mean_frame, result.contributors, result.tokens,
                           result.digest_after, reducers=result.reducers, frames=result.frames)

    def _open_round(self, module: str, round_: int, mine: LocalState) -> _OpenRound:
        quorum = 1 << 30 if self.sync_world else self.spec.averaging.min_group  # sync: all of them
        target = max(1, min(quorum, self.expected_holders.get(module, 1)))
        world = dict(self.live_holders.get(module, {}))
        open_round = self._open[(module, round_)] = _OpenRound(mine.digest, target, world=world)
        asyncio.get_running_loop().create_task(self._close_after_grace((module, round_), open_round))
        return open_round

    def _beyond_limit(self, round_: int) -> str:
        """Why a round number a peer sent is refused ("" when it is not): later than the swarm's age allows
        (protocol/spec.py `round_limit`). A stranger's claimed round is then not even a hint; an honest peer
        refused this way has a clock far off, and the reason says so."""
        limit = self.spec.round_limit(time.time())
        if limit is not None and round_ > limit:
            return (f"round {round_} is later than the swarm's age allows ({limit} rounds at most now, by this "
                    f"peer's clock: check both clocks)")
        return ""

    # ---- who reduces (protocol/reducers.py) -------------------------------------------------
    def _must_ask(self, module: str, mine: LocalState) -> list[str]:
        """The candidates to ask before we reduce this round: those before us in the agreed list, or, at its
        head in a process that has not seen the list work yet, all the others."""
        agreed = mine.reducers or self.genesis.get(module, ())  # before any result: the holders in the claims
        if self.streams is None or not agreed:
            return []  # offline
        if agreed[0] == self.peer_id:
            return [p for p in agreed[1:] if not self.shunned(p)] if module in self.fresh else []
        return [p for p in earlier(agreed, self.peer_id) if not self.shunned(p)]  # a revoked one has no say

    async def _rival(self, module: str, round_: int, mine: LocalState) -> tuple[str, Stance] | None:
        """Ask the candidates that come first whether one of them holds the round (once per round: concurrent
        contributions wait for the same answer)."""
        ask = self._must_ask(module, mine)
        if not ask:
            return None
        key = (module, round_)
        check = self._checks.get(key)
        if check is None:
            check = self._checks[key] = asyncio.ensure_future(self._ask_all(module, round_, mine.digest, ask))
            check.add_done_callback(lambda _f: self._checks.pop(key, None))
        return await asyncio.shield(check)

    async def _ask_all(self, module: str, round_: int, digest: str, peers: list[str]) -> tuple[str, Stance] | None:
        answers = await asyncio.gather(*(self._ask(p, module, round_, digest) for p in peers))
        for peer, stance in zip(peers, answers, strict=True):  # the earliest rival wins
            if stance in RIVAL:
                logger.info("%s round %d: %s answers %s; not reducing it here", module, round_, peer[-8:], stance.value)
                return peer, stance
        return None

    async def _ask(self, peer: str, module: str, round_: int, digest: str) -> Stance:
        async def go():
            reader, writer = await self.streams.open(peer, self.stance_name)
            try:
                await write_message(writer, {"module": module, "round": round_, "digest": digest,
                                             "membership": self.membership}, b"", self.traffic)
                header, _ = await read_message(reader, 0, self.traffic)
            finally:
                writer.close()
            return Stance(header.get("stance"))

        try:
            return await asyncio.wait_for(go(), STANCE_TIMEOUT_S)
        except Exception as e:  # unreachable, frozen, refused or nonsense: not a rival
            logger.info("%s round %d: no stance from %s (%s)", module, round_, peer[-8:], type(e).__name__)
            return Stance.NOT_HERE

    def stance(self, module: str, round_: int, digest: str, asker: str) -> Stance:
        """Our stance on (module, round) when a candidate asks; we open the round for a later candidate, so the
        earliest live candidate reduces it."""
        if (module, round_) in self._closed:
            return Stance.CLOSED
        if (module, round_) in self._open:
            return Stance.OPEN
        mine = self.effective_state(module) if module in self.numels else None
        if mine is None or mine.round < round_ or mine.digest != digest and mine.round == round_:
            return Stance.NOT_HERE
        if mine.round > round_:
            return Stance.AHEAD
        agreed = mine.reducers or self.genesis.get(module, ())
        if asker in agreed and self.peer_id in agreed and agreed.index(asker) < agreed.index(self.peer_id):
            return Stance.NOT_HERE  # a restarted head asking whether anyone took its round: we have not
        self._open_round(module, round_, mine)
        return Stance.OPEN

    async def _on_stance(self, sender: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async def body() -> None:
            header, _ = await read_message(reader, 0, self.traffic)
            if not await self._admit(header, sender, reader, writer):
                return
            module, round_ = field_of(header, "module", str), field_of(header, "round", int)
            if why := self._beyond_limit(round_):
                await self._refuse(why, reader, writer)
                return
            stance = self.stance(module, round_, field_of(header, "digest", str), sender)
            await write_message(writer, {"stance": stance.value}, b"", self.traffic)

        await self.guard.serve("stance", sender, reader, writer, body)

    async def _close_after_grace(self, key: tuple[str, int], open_round: _OpenRound) -> None:
        if not self.sync_world:
            await self.clock.sleep(self.spec.averaging.grace_s)
            if open_round.result is None:
                self._close(key, open_round)
            return
        # sync: reaching the target closes the round in reduce(); a rank lost fails it; otherwise the timeout ends it
        deadline = self.clock.now() + self.spec.averaging.timeout_s
        while open_round.result is None and self.clock.now() < deadline:
            lost = rank_lost(open_round.world, self.live_holders.get(key[0], {}))
            if lost:
                self._fail(key, open_round, f"{RANK_LOST}: {lost[-8:]}")
                return
            await self.clock.sleep(0.25)
        if open_round.result is None:
            self._close(key, open_round)

    def _fail(self, key: tuple[str, int], open_round: _OpenRound, reason: str) -> None:
        """Fail an open round for every member, as a collective fails when a rank dies: nobody applies anything,
        and the round is not remembered as closed, so the members' retry at the same round number opens it anew."""
        logger.warning("module %s round %d failed: %s", key[0], key[1], reason)
        open_round.result = RoundResult(key[0], key[1], "failed", reason=reason)
        open_round.done.set()
        if self._open.get(key) is open_round:
            self._open.pop(key)

    def _close(self, key: tuple[str, int], open_round: _OpenRound) -> None:
        module, round_ = key
        avg = self.spec.averaging
        # The state the round opened with, if we still hold it: the result then says the state after the round.
        mine = self.effective_state(module)
        if mine is not None and (mine.round > round_ or (mine.round == round_
                                                          and mine.digest != open_round.digest_before)):
            # Our state moved while the round was open (we applied another reducer's version of this round, or
            # re-synced): a result from us would not say the state it makes, and its members would apply a second
            # version of the round unchecked. They look at the announcements instead (an out-of-sync answer).
            if self._open.get(key) is open_round:
                self._open.pop(key)
            open_round.result = RoundResult(module, round_, "out_of_sync",
                                            reason="the reducer's state moved past the round while it was open")
            open_round.done.set()
            return
        before = mine if mine is not None and mine.digest == open_round.digest_before and mine.round == round_ else None
        closed = self.closer([(p, *open_round.frames[p]) for p in sorted(open_round.frames)], self.numels[module],
                             before)
        for peer, reason in closed.rejected:
            self.offenses[peer] = self.offenses.get(peer, 0) + 1
            logger.warning("rejected peer %s's outer gradient for %s round %d: %s (%d rejected so far%s)", peer, module,
                           round_, reason, self.offenses[peer],
                           "; ignoring it from now on" if self.offenses[peer] >= avg.max_rejections else "")
        if self._open.get(key) is open_round:
            self._open.pop(key)
        if not closed.mean_frame:
            # Not remembered as closed: a retry of the round (or a candidate asked about it) opens it anew.
            open_round.result = RoundResult(module, round_, "failed", reason="no valid contribution")
            open_round.done.set()
            return
        reducers = successors(self.peer_id, closed.used, self.clients | ({self.peer_id} if self.client else set()))
        if set(closed.used) == {self.peer_id} and len(self.partners.get(module, ())) > 1:
            # Alone in the round while holders we have merged this module with may reduce: each side of a split
            # (after a revocation, say) would otherwise name only itself and reduce itself round after round, the
            # split watch healing one round while the next is already in flight. Both sides have merged with each
            # other and name the same sorted list, so they meet at its head next round (node/peer/claims.py
            # `partners_of`; a node that just joined, at another round of the module, is not in it).
            reducers = self.partners[module][:MAX_CANDIDATES]
        merged = {p: open_round.frames[p] for p in closed.used}
        self.audits.store.keep(module, round_, merged)  # for members who audit the round
        after = None if closed.after is None else dataclasses.replace(closed.after, reducers=reducers)
        if after is not None:
            self._post[module] = after
        result = RoundResult(module, round_, "merged", closed.mean_frame, list(closed.used), closed.tokens,
                             after.digest if after is not None else "", reducers=reducers,
                             frames=list_frames(merged, closed.used))
        self.tokens_reduced[module] = self.tokens_reduced.get(module, 0) + closed.tokens
        log = self.reduced_log.setdefault(module, {})
        log[round_ + 1] = closed.tokens  # keyed by the state round the result makes, as the node's history
        for old in sorted(log)[:-RESULTS_LOGGED]:
            del log[old]
        self.fresh.discard(module)  # the list works: we named the next round's candidates ourselves
        open_round.result = result
        open_round.done.set()
        self._closed[key] = (open_round.digest_before, result)
        # Per module: pruning the whole dict in (module, round) order once dropped every result of all
        # modules but the last, so a late member of those was told out_of_sync instead of late.
        rounds = sorted(r for m, r in self._closed if m == module)
        for old in rounds[:-RESULTS_KEPT]:
            self._closed.pop((module, old), None)

    # ---- member side -------------------------------------------------------------------------
    async def contribute(self, candidates: list[str], module: str, round_: int, tokens: int, digest: str,
                         frame: bytes, timeout_s: float, after_lie: bool = False) -> RoundResult:
        """Send our frame to the round's reducer and wait for the round's mean. `candidates`: who may reduce it, in
        the agreed failover order (protocol/reducers.py); a candidate that cannot be reached, or refuses, passes
        the round to the next, and one that redirects us to an earlier candidate is followed (twice at most).
        `after_lie`: the round is sent again because its first reducer was proven a liar (node/peer/rounds.py
        `_retry_after_lie`): a candidate that still defers to that liar is asked again for a while."""
        deadline = self.clock.now() + timeout_s
        own = (tokens, frame_hash(frame))  # hashed once: a frame is ~1 byte per parameter
        sent = self._sent.setdefault((module, round_), set())
        sent.add(own)
        for old in sorted(r for m, r in self._sent if m == module)[:-RESULTS_KEPT]:
            self._sent.pop((module, old), None)
        candidates = [p for p in candidates if not self.shunned(p)]  # revoked or a proven liar: never our reducer
        queue, redirects, last = list(candidates), 0, None
        reask_until, reask_pause = self.clock.now() + self.spec.averaging.grace_s + STANCE_TIMEOUT_S, REASK_S
        while queue:
            reducer = queue.pop(0)
            left = deadline - self.clock.now()
            if left <= 0:
                break
            # A live reducer answers once its round closes (the grace window after it opened); more means frozen.
            wait_s = left if self.sync_world else min(left, self.spec.averaging.grace_s + STANCE_TIMEOUT_S + 3)
            last = await self._contribute_to(reducer, module, round_, tokens, digest, frame, wait_s)
            last.reducer = reducer
            if last.status == "redirect" and redirects < 2 and last.redirect in candidates:
                redirects += 1
                queue.insert(0, last.redirect)
                continue
            if (after_lie and last.status == "redirect" and last.redirect in self.distrusted
                    and reducer != self.peer_id and self.clock.now() + reask_pause < min(deadline, reask_until)):
                # It defers to the peer we proved a liar in this very round: it has not finished its own check of
                # that round yet (every member checks a new reducer's first rounds), and will reduce the round once
                # it has. Ask it again, backing off (each ask carries our frame), for a grace window at most.
                await self.clock.sleep(reask_pause)
                reask_pause = min(2 * reask_pause, REASK_MAX_S)
                queue.insert(0, reducer)
                continue
            if last.status == "failed" and (last.reason.startswith(UNREACHABLE) or last.reason.startswith("refused")):
                if reducer != self.peer_id:
                    now = self.clock.now()
                    self.skip_until = {p: t for p, t in self.skip_until.items() if t > now}
                    self.skip_until[reducer] = now + self.spec.averaging.claim_ttl_s
                continue
            if last.applicable and reducer != self.peer_id and (
                    not last.frames or {p for p, _, _ in last.frames} != set(last.contributors)):
                # An honest reducer lists every contributor's frame; a result without them could not be audited.
                self.distrust(reducer, f"its result of {module} round {round_} does not list its contributors' frames")
                return RoundResult(module, round_, "failed", reason="the reducer's result lists no frames",
                                   reducer=reducer)
            if last.applicable and last.status in ("merged", "alone") and reducer != self.peer_id:
                mine = dict((p, (t, h)) for p, t, h in last.frames).get(self.peer_id)
                if mine is not None and mine != own and (mine in sent or module in self.fresh):
                    # A frame we sent for this round before (a resend after a lost reply, or before our restart):
                    # the reducer merged that one.
                    logger.info("%s round %d: %s merged our earlier frame of the round", module, round_,
                                reducer[-8:])
                elif mine != own:
                    # Proof for us alone (others cannot know what we sent): we stop trusting it, nobody else does.
                    self.distrust(reducer, f"its result of {module} round {round_} misreports our contribution")
                    return RoundResult(module, round_, "failed", reason="the reducer misreported our contribution",
                                       reducer=reducer)
            if last.applicable:
                self.fresh.discard(module)
            return last
        if last is not None and last.status != "redirect":
            return last
        return RoundResult(module, round_, "failed", reason=f"{UNREACHABLE}: no candidate reduced the round")

    def skipped(self) -> list[str]:
        """Peers that failed one of our rounds at the connection level recently: members try them last. (Read by
        the training thread; written on the network loop, which also prunes it.)"""
        now = self.clock.now()
        return sorted(p for p, until in list(self.skip_until.items()) if until > now)

    async def _contribute_to(self, reducer: str, module: str, round_: int, tokens: int, digest: str, frame: bytes,
                             timeout_s: float) -> RoundResult:
        """One reducer; a connection that breaks is tried once more: if the reducer merged our frame and only its
        reply was lost, it answers from the closed round ("merged"), so we do not go elsewhere with it. A peer that
        is up but does not serve rounds yet (it claimed its path moments ago) is waited for, within timeout_s."""
        deadline, attempt = self.clock.now() + timeout_s, 0
        while True:
            try:
                if reducer == self.peer_id:
                    return await asyncio.wait_for(self.reduce(module, round_, reducer, tokens, digest, frame),
                                                  timeout_s)
                return await asyncio.wait_for(self._remote_contribute(reducer, module, round_, tokens, digest, frame),
                                              timeout_s)
            except TimeoutError:
                return RoundResult(module, round_, "failed", reason=f"{UNREACHABLE}: no answer in {timeout_s:.0f} s")
            except NotServingYetError as e:
                if self.clock.now() + NOT_SERVING_RETRY_S >= deadline:
                    return RoundResult(module, round_, "failed", reason=f"{UNREACHABLE}: {e}")
                await self.clock.sleep(NOT_SERVING_RETRY_S)
            except Exception as e:  # broken stream, p2pd control errors (several types): never fatal
                reason = f"{UNREACHABLE}: {type(e).__name__}: {e}"
                attempt += 1
                if attempt == 2 or self.clock.now() + LOST_REPLY_RETRY_S >= deadline:
                    return RoundResult(module, round_, "failed", reason=reason)
                logger.info("%s round %d: %s; asking %s again", module, round_, reason, reducer[-8:])
                await self.clock.sleep(LOST_REPLY_RETRY_S)
            timeout_s = max(0.1, deadline - self.clock.now())

    async def _remote_contribute(self, reducer: str, module: str, round_: int, tokens: int, digest: str,
                                 frame: bytes) -> RoundResult:
        reader, writer = await self.streams.open(reducer, self.contribute_name)
        try:
            await write_message(writer, {"module": module, "round": round_, "tokens": tokens, "digest": digest,
                                         "membership": self.membership, "client": self.client}, b"", self.traffic)
            await write_message(writer, {}, frame, self.traffic)
            header, mean_frame = await read_message(reader, self._frame_limit(module), self.traffic)
        finally:
            writer.close()
        status = field_of(header, "status", str)
        if status == "refused":
            return RoundResult(module, round_, "failed", reason=f"refused: {str(header.get('reason'))[:200]}")
        contributors = header.get("contributors") if isinstance(header.get("contributors"), list) else []
        try:
            reducers = parse_candidates(header.get("reducers") or [])
        except ValueError:
            reducers = ()
        try:  # a result whose list does not parse lists nothing: our own entry is then missing
            frames = parse_frame_list(header.get("frames") or [])
        except ValueError:
            frames = ()
        return RoundResult(module, field_of(header, "round", int), status, mean_frame,
                           [str(c) for c in contributors[:1024]], int(header.get("tokens") or 0),
                           str(header.get("digest_after") or ""), str(header.get("reason") or "")[:200],
                           reducers=reducers, redirect=str(header.get("redirect") or "")[:128], frames=frames)

    # ---- state download ----------------------------------------------------------------------
    async def _on_state(self, sender: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async def body() -> None:
            header, _ = await read_message(reader, 0, self.traffic)
            if not await self._admit(header, sender, reader, writer):
                return
            module = field_of(header, "module", str)
            # the newest state we know: after the rounds we closed, even before our own loop applied them
            state = self.effective_state(module) if module in self.numels else None
            if state is None:
                await write_message(writer, {"status": "missing"}, b"", self.traffic)
                return
            # Written from the state's own tensors, chunk by chunk (no copy of the whole state per request):
            # states are replaced, never changed in place, so the bytes stay those of the digest.
            parts = [memoryview(t.float().contiguous().numpy()).cast("B") for t in (state.anchor, state.momentum)]
            await write_message(writer, {"status": "ok", "round": state.round, "digest": state.digest,
                                         "reducers": list(state.reducers)}, parts, self.traffic)

        await self.guard.serve("state", sender, reader, writer, body)

    async def fetch_state(self, peer: str, module: str, timeout_s: float) -> LocalState | None:
        """Download a module's state (round, digest as the peer says it, anchor, momentum, reducers) from a peer;
        None if it fails. The caller checks the digest."""
        numel = self.numels[module]

        async def go():
            reader, writer = await self.streams.open(peer, self.state_name)
            try:
                await write_message(writer, {"module": module, "membership": self.membership}, b"", self.traffic)
                return await read_message(reader, 8 * numel, self.traffic)
            finally:
                writer.close()

        try:
            header, payload = await asyncio.wait_for(go(), timeout_s)
        except Exception as e:  # unreachable peer, timeout, malformed message: try another source
            logger.info("state download of %s from %s failed: %s", module, peer[-8:], e)
            return None
        if header.get("status") == "refused":
            logger.warning("state download of %s refused by %s: %s", module, peer[-8:], str(header.get("reason"))[:200])
            return None
        if header.get("status") != "ok" or len(payload) != 8 * numel:
            return None
        # The round is a stranger's JSON value: int() of it raised on "x", [1] or 1e400, and a negative or
        # huge one made state_digest (8 unsigned bytes) raise in the caller.
        round_ = header.get("round") or 0
        if not isinstance(round_, int) or isinstance(round_, bool) or not 0 <= round_ <= MAX_ROUND:
            return None
        limit = self.spec.round_limit(time.time())
        if limit is not None and round_ > limit:
            logger.warning("state download of %s from %s: round %d is later than the swarm's age allows", module,
                           peer[-8:], round_)
            return None
        values = torch.frombuffer(bytearray(payload), dtype=torch.float32)
        anchor, momentum = values[:numel].clone(), values[numel:].clone()
        if not (torch.isfinite(anchor).all() and torch.isfinite(momentum).all()):
            return None
        try:
            reducers = parse_candidates(header.get("reducers") or [])
        except ValueError:
            return None
        return LocalState(round_, str(header.get("digest") or "")[:64], anchor, momentum, reducers)
