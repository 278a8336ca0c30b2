"""The module exchange as the node sees it: one facade over the round's parts, with methods, not attributes.

For each (module, outer round) one holder reduces (reducer.py): the head of the candidate list the previous
round's result named (reducers.py), asking the candidates before it first (stance.py). Every holder sends it one
codec frame with its token count and the digest of its state before the round (member.py); the reducer closes
the round by the round rule (rule.py), encodes the mean **once**, and every member decodes those same bytes, so
all apply the identical outer step and must reach the digest the result names. No reducer is trusted alone
(audit.py, trust.py): results list their merged frames, members check their own entry and audit rounds at random.
Also served: module states for joiners (service.py).

The node calls these methods from its training thread; each either submits work to the network loop (the node
runs the coroutines there) or replaces one immutable value the network thread reads, so no half-written view is
ever seen. Everything of the round runs on the node's network event loop; the merge itself runs off it.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from pathswarm.protocol.clock import MONOTONIC, Clock
from pathswarm.protocol.rounds.audit import AuditService
from pathswarm.protocol.rounds.context import Context, GroupView
from pathswarm.protocol.rounds.member import Member
from pathswarm.protocol.rounds.messages import RoundReply
from pathswarm.protocol.rounds.outer import OuterState
from pathswarm.protocol.rounds.reducer import Closer, Reducer
from pathswarm.protocol.rounds.reply_faults import ReplyFaults
from pathswarm.protocol.rounds.rule import close_round
from pathswarm.protocol.rounds.service import Service
from pathswarm.protocol.rounds.slices import UnitNumels, UnitStates, module_of_unit
from pathswarm.protocol.rounds.trust import Trust
from pathswarm.protocol.spec import SwarmSpec
from pathswarm.protocol.wire import Pacer, Traffic

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from pathswarm.protocol.net import PeerStreams


class ModuleExchange:
    """Serves and joins module rounds for one node."""

    def __init__(self, spec: SwarmSpec, streams: PeerStreams | None, peer_id: str, numels: Mapping[str, int],
                 state_of: Callable[[str], OuterState | None], *, traffic: Traffic | None = None,
                 membership: str = "", sync_world: bool = False, clock: Clock = MONOTONIC,
                 closer: Closer | None = None, serve_state_bytes_per_s: float = 0.0):
        traffic = traffic or Traffic()
        # A module's round may be cut into slices (slices.py): the round's parts take a slice's id where a module's
        # goes, and these answer for both.
        state_bytes = 8 * max(numels.values(), default=0)  # our largest module's anchor and momentum, fp32
        numels = UnitNumels(numels, spec.averaging.slices)
        state_of = UnitStates(state_of, numels)
        self.spec, self.peer_id, self.numels, self.traffic = spec, peer_id, numels, traffic
        # A reducer gets at most one slice of a module per round from each member (slices.py `rotated`): the
        # request budgets per module stay those of one reducer.
        trust = Trust(spec, peer_id, len(numels), traffic,
                      lambda: max((spec.codec.max_frame_bytes(n) for n in numels.values()), default=0), state_bytes)
        self.ctx = Context(spec, peer_id, numels, state_of, streams, trust, traffic, clock=clock,
                           membership=membership, sync_world=sync_world,
                           state_pacer=Pacer(serve_state_bytes_per_s) if serve_state_bytes_per_s else None)
        self.trust = trust
        self.audits = AuditService(streams, self.ctx.prefix, numels, self.ctx.contribution_limit, trust.serve,
                                   traffic, membership, idle_s=spec.averaging.timeout_s)
        self.reducer = Reducer(self.ctx, closer or functools.partial(rule_closer, spec), self.audits.store)
        self.member = Member(self.ctx, self.reducer)
        self.service = Service(self.ctx, self.reducer, self.audits)

    async def start(self) -> None:
        await self.service.start()

    # ---- a round: the member's side, and the reducer's (tests call it directly) ----------------------
    async def contribute(self, candidates: list[str], module: str, round_: int, tokens: int, digest: str,
                         frame: bytes, timeout_s: float, after_lie: bool = False) -> RoundReply:
        """Send our frame to the round's reducer (the first reachable of `candidates`) and wait for its result. The
        frame is kept and served to the round's other contributors when they check it (frame_store.py)."""
        store = self.audits.store
        store.sending(module, round_, self.peer_id, tokens, frame)
        reply = await self.member.contribute(candidates, module, round_, tokens, digest, frame, timeout_s, after_lie)
        store.replied(module, round_, dict(reply.listed) if reply.applicable else {}, reply.own, reply.contributors)
        return reply

    async def reduce(self, module: str, round_: int, sender: str, tokens: int, digest: str,
                     frame: bytes) -> RoundReply:
        return await self.reducer.reduce(module, round_, sender, tokens, digest, frame)

    def stance(self, module: str, round_: int, digest: str, asker: str):
        return self.reducer.stance(module, round_, digest, asker)

    async def fetch_state(self, peer: str, module: str, timeout_s: float, round_: int = -1) -> OuterState | None:
        return await self.service.fetch_state(peer, module, timeout_s, round_)

    async def fetch_state_parts(self, peers: list[str], module: str, timeout_s: float, round_: int,
                                digest: str) -> OuterState | None:
        return await self.service.fetch_state_parts(peers, module, timeout_s, round_, digest)

    def effective_state(self, module: str) -> OuterState | None:
        return self.reducer.effective_state(module)

    # ---- what the node tells the exchange ------------------------------------------------------------
    def set_groups(self, expected: Mapping[str, int], live: Mapping[str, Mapping[str, int]] | None = None,
                   genesis: Mapping[str, tuple[str, ...]] | None = None,
                   partners: Mapping[str, tuple[str, ...]] | None = None,
                   holders: Mapping[str, tuple[str, ...]] | None = None) -> None:
        """The groups the node derived from the claims (context.py `GroupView`); None keeps the current part."""
        old = self.ctx.groups
        self.ctx.groups = GroupView(
            expected=dict(expected), live=old.live if live is None else dict(live),
            genesis=old.genesis if genesis is None else dict(genesis),
            partners=old.partners if partners is None else dict(partners),
            holders=old.holders if holders is None else {m: tuple(p) for m, p in holders.items()})

    def set_client(self, client: bool) -> None:
        self.ctx.client = client

    def set_voted_out(self, peers: frozenset[str]) -> None:
        """Peers most holders of our modules announce they caught lying (node/peer/vouch.py)."""
        self.trust.voted_out = frozenset(peers)

    def drop_replies(self, rounds: set[tuple[str, int]], die_replying: dict[tuple[str, int], str] | None = None,
                     exit_arm: str = "") -> None:
        """Fault injection for tests: as the reducer of these (module, round)s, close the replies unsent;
        `die_replying`: (module, round, or -1: any) → which member ("first" or "last" by peer id) gets its reply
        before the process exits, the others none; `exit_arm`: a file a process must remove to die so
        (reply_faults.py). With none, the service keeps no fault object at all."""
        faults = ReplyFaults(set(rounds), dict(die_replying or {}), exit_arm)
        self.service.faults = faults if faults else None

    def forget_pending(self, module: str, from_round: int | None = None) -> None:
        """Our state of the module was replaced (re-sync) by one at `from_round`: rounds we closed earlier no longer
        define it, nor are those from `from_round` on ours (reducer.py)."""
        self.reducer.forget_pending(module, from_round)

    # ---- what the node reads ------------------------------------------------------------------------
    @property
    def distrusted(self) -> Mapping[str, str]:
        """Peer → why we no longer trust it (read-only)."""
        return self.trust.distrusted

    @property
    def voted_out(self) -> frozenset[str]:
        """Peers most holders of our modules announce they caught lying (read-only: `set_voted_out`)."""
        return self.trust.voted_out

    @property
    def clients(self) -> set[str]:
        return self.ctx.clients

    def distrust(self, peer: str, reason: str) -> None:
        self.trust.distrust(peer, reason)

    def refuses(self, peer: str) -> bool:
        return self.trust.refuses(peer)

    def shunned(self, peer: str) -> bool:
        return self.trust.shunned(peer)

    def skipped(self) -> list[str]:
        return self.member.skipped()

    def since_last_close_s(self) -> float | None:
        """Seconds since we last closed a round with a mean (None: never)."""
        last = self.reducer.last_closed
        return None if last is None else self.ctx.clock.now() - last

    def take_behind(self) -> dict[str, str]:
        """Module → a peer that found us behind it, since the last call (the node re-syncs those modules)."""
        out = {}
        for module in list(self.reducer.behind):
            peer = self.reducer.behind.pop(module, None)
            if peer is not None:
                out[module] = peer
        return out

    def take_ahead(self, module: str) -> str | None:
        """A candidate that answered it is past a round of `module` we were to reduce, since the last call (None:
        none): our own reducer's "out of sync" names no peer, this one does."""
        return self.reducer.ahead.pop(module, None)

    def tokens_reduced(self, module: str) -> int:
        """Tokens in the rounds of `module` we closed with a mean, its slices' shares included (less those a healed
        split took back)."""
        return sum(log.tokens_reduced for unit, log in list(self.reducer.logs.items())
                   if module_of_unit(unit) == module)

    async def take_back_reduced(self, module: str, first_round: int) -> int:
        """A split we lost: the tokens we merged into `module`'s states from `first_round` on no longer count.
        Returns them. A coroutine: run on the network loop, where the reducer adds to the same count."""
        tokens = 0
        for unit, log in list(self.reducer.logs.items()):
            if module_of_unit(unit) != module:
                continue
            lost = [r for r in log.reduced if r >= first_round]
            taken = sum(log.reduced.pop(r) for r in lost)  # taken back once: a later heal over them counts none again
            log.tokens_reduced -= taken
            tokens += taken
        return tokens


def rule_closer(spec: SwarmSpec, contributions, numel: int, before: OuterState | None):
    """The round rule's close, as every reducer runs it (tests/lying_node.py swaps this function for a lying one)."""
    return close_round(contributions, numel, spec, before)
