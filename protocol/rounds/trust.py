"""Admission and trust for the round's requests: who may ask, who is never our reducer, whose frames we refuse.

One object per node (docs/SECURITY.md): the membership gate of private swarms (every request carries a
certificate naming the peer id libp2p authenticated), the per-kind request budgets (protocol/handlers.py: rate,
slots, deadline), round numbers bounded by the swarm's age, and the three kinds of distrust:
- `distrusted`: peers *we* proved liars (a result misreporting our frame, a mean its frames do not give): never our
  reducer again, their contributions and stance refused;
- `voted_out`: peers most holders of our modules announce they caught lying (node/peer/vouch.py): never our
  reducer, no say in who reduces, but their contributions still count (we have no proof of our own);
- `offenses`: contributions screened out; `max_rejections` of them and the peer is ignored for the session.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from pathswarm.protocol.handlers import Budget, Guard
from pathswarm.protocol.membership import MembershipError, gate_of
from pathswarm.protocol.rounds.messages import Refusal
from pathswarm.protocol.rounds.reducers import MAX_CANDIDATES
from pathswarm.protocol.rounds.state_parts import transfer_deadline_s
from pathswarm.protocol.spec import SwarmSpec
from pathswarm.protocol.wire import MAX_HEADER_BYTES, Traffic, discard_rest, read_message, write_message

logger = logging.getLogger(__name__)

REFUSAL_DRAIN_S = 3.0
"""How long a refused request's remaining bytes are read and dropped before closing."""
FRAMES_SLOTS = 16
"""Frames downloads (audits) served at once."""
STANCE_TIMEOUT_S = 2.0
"""How long a candidate waits for an earlier one's stance before counting it out."""


class Trust:
    """Admission (membership, budgets, round bounds) and the peers we no longer trust, for one node."""

    def __init__(self, spec: SwarmSpec, peer_id: str, n_modules: int, traffic: Traffic,
                 frame_limit: Callable[[], int], state_bytes: int = 0):
        self.spec, self.peer_id, self.traffic = spec, peer_id, traffic
        self.max_frame_bytes = frame_limit  # the largest frame any of our modules accepts: what a refusal drains
        self.gate = gate_of(spec.membership.owner_key, spec.swarm_id)  # shared: revocations learnt apply here too
        self.distrusted: dict[str, str] = {}
        """Peer → why we no longer trust it (protocol/rounds/audit.py)."""
        self.voted_out: frozenset[str] = frozenset()
        self.offenses: dict[str, int] = {}
        """Peer → contributions of it we rejected (robust aggregation)."""
        # A member sends one contribution per module per round and downloads a module's state when it joins or
        # re-syncs: these budgets are far above that, and far below what a flood would need.
        # Deadlines: a contribution waits for its round (grace window, and up to the timeout in sync mode); a state
        # download gets the time its downloader waits (fetch_state); per peer, two states in service at a time (a
        # refused request keeps its slot while its rest is drained: a retry right after it must still get one).
        avg = spec.averaging
        checked = n_modules * max(1, avg.slices)  # the units of a round a member may be asked to serve its frame of
        self.guard = Guard({
            "contribute": Budget(4.0, 32, per_peer=2 * n_modules + 2, total=1024,
                                 deadline_s=avg.grace_s + avg.timeout_s + 30),
            # a state (`state_bytes`: our largest, anchor and momentum) may go out as slowly as a transfer is waited
            # for (state_parts.py `transfer_deadline_s`); a reader that stalls is cut after the averaging timeout
            "state": Budget(1.0, 16, per_peer=2, total=8,
                            deadline_s=transfer_deadline_s(avg.timeout_s, state_bytes) + 5),
            "stance": Budget(4.0, 32, per_peer=2 * n_modules + 2, total=1024, deadline_s=STANCE_TIMEOUT_S + 5),
            # an audit downloads a round's frames (about once a round per group; a reducer's checked rounds: every
            # member, each of its modules, every round, a second or two apart in a small swarm, and in a round in slices
            # it reduces one slice of every module); an alert follows a proven lie
            # A download may take as long as its downloader waits for it (audit.py `frames_deadline_s`): bounded
            # here by the frames of MAX_CANDIDATES members of our largest module, with every slot in use at once; a
            # reader that stalls is cut after the averaging timeout.
            # Since checks gather each frame from its own contributor (audit.py `gather_frames`), a member of a round
            # in slices is asked once per slice it contributed to by each member checking that slice: up to
            # `checked` requests a round from one peer in the checked rounds (one small frame each).
            "frames": Budget(max(2.0 * n_modules, checked / 4), max(8, 4 * n_modules, checked),
                             per_peer=n_modules + 1, total=FRAMES_SLOTS,
                             deadline_s=transfer_deadline_s(avg.timeout_s,
                                                            FRAMES_SLOTS * MAX_CANDIDATES * frame_limit()) + 5),
            "alert": Budget(0.5, 8, per_peer=2, total=64, deadline_s=10.0)},
            self.refuse)

    # ---- whom we trust ---------------------------------------------------------------------------
    def distrust(self, peer: str, reason: str) -> None:
        if peer != self.peer_id and peer not in self.distrusted:
            logger.error("no longer trusting peer %s: %s", peer, reason)
            self.distrusted[peer] = reason

    def refuses(self, peer: str) -> bool:
        """We refuse this peer's contributions (a proven liar, or revoked by the owner): it cannot complete a round
        we reduce, so it is left out of the quorum. A peer only voted out (`voted_out`) is still merged: it counts."""
        return peer in self.distrusted or self.gate.revoked(peer)

    def shunned(self, peer: str) -> bool:
        """Revoked by the owner, proven to have lied to us, or caught lying by most holders of our modules
        (`voted_out`): never our reducer, no say in who reduces. The others leave a liar they caught; a member that
        followed the list to it would merge its rounds alone with the liar."""
        return peer in self.distrusted or peer in self.voted_out or self.gate.revoked(peer)

    def ignored(self, sender: str) -> str:
        """Why a contribution of `sender` is not even merged ('' when it is welcome). Never our own: a reducer whose
        own outer gradient the screen rejected three times (steps carried over a stall) ignored itself, and failed
        every round of every module it holds for the rest of the run, alone-held ones included (issue 27)."""
        if sender == self.peer_id:
            return ""
        if sender in self.distrusted:
            return "ignored: you misreported a round to us"
        if self.offenses.get(sender, 0) >= self.spec.averaging.max_rejections:
            return f"ignored: {self.offenses[sender]} contributions of yours were rejected"
        return ""

    def note_rejected(self, rejected: tuple[tuple[str, str], ...], module: str, round_: int) -> None:
        limit = self.spec.averaging.max_rejections
        for peer, reason in rejected:
            if peer == self.peer_id:
                logger.warning("our own outer gradient for %s round %d was rejected: %s", module, round_, reason)
                continue
            self.offenses[peer] = self.offenses.get(peer, 0) + 1
            logger.warning("rejected peer %s's outer gradient for %s round %d: %s (%d rejected so far%s)", peer,
                           module, round_, reason, self.offenses[peer],
                           "; ignoring it from now on" if self.offenses[peer] >= limit else "")

    # ---- admission -------------------------------------------------------------------------------
    def beyond_limit(self, round_: int) -> str:
        """Why a round number a peer sent is refused ("" when it is not): later than the swarm's age allows
        (protocol/spec.py `round_limit`). A stranger's claimed round is then not even a hint; an honest peer
        refused this way has a clock far off, and the reason says so."""
        limit = self.spec.round_limit(time.time())
        if limit is not None and round_ > limit:
            return (f"round {round_} is later than the swarm's age allows ({limit} rounds at most now, by this "
                    f"peer's clock: check both clocks)")
        return ""

    async def refuse(self, reason: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Tell the peer why, then drop the rest of its request (a frame may follow) so that closing the
        stream does not reset it before the peer has read the reason."""
        await write_message(writer, Refusal(reason[:200]).header(), b"", self.traffic)
        await discard_rest(reader, MAX_HEADER_BYTES + self.max_frame_bytes() + 64, REFUSAL_DRAIN_S)

    async def serve(self, kind: str, sender: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    handle: Callable[[dict], Awaitable[None]]) -> None:
        """One request of `kind`, within its budget (protocol/handlers.py): its header read, its sender admitted,
        then `handle(header)`. Every handler of the round is served so: none can skip the membership check."""
        async def body() -> None:
            header, _ = await read_message(reader, 0, self.traffic)
            if await self.admit(header, sender, reader, writer):
                await handle(header)

        await self.guard.serve(kind, sender, reader, writer, body)

    async def admit(self, header: dict, sender: str, reader: asyncio.StreamReader,
                    writer: asyncio.StreamWriter) -> bool:
        """Check the requester's membership (private swarms); refuse and log it when it has none valid."""
        try:
            self.gate.check(header.get("membership") if isinstance(header.get("membership"), str) else None, sender)
            return True
        except MembershipError as e:
            logger.warning("refused peer %s: %s", sender, e)
            await self.refuse(str(e), reader, writer)
            return False
