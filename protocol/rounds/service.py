"""The round's requests on the wire: the handlers this node serves, and downloading a module's state from a peer.

Served (each inside its budget: trust.py, protocol/handlers.py): `contribute` (a member's frame for a round we
reduce: reducer.py), `stance` (a later candidate asks whether we hold a round: reducer.py `stance`), `state` (a
joiner or a re-syncing node downloads a module's anchor, outer momentum, round and reducer list). Audits' `frames`
and `alert` are audit.py's. Everything received is bounded by the module's size from the spec before it is read.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

import torch

from pathswarm.protocol.rounds.context import MAX_CLIENTS, Context
from pathswarm.protocol.rounds.messages import (
    ContributeRequest,
    Refusal,
    StanceReply,
    StanceRequest,
    StateReply,
    StateRequest,
    module_of,
)
from pathswarm.protocol.rounds.outer import OuterState
from pathswarm.protocol.rounds.reducer import Reducer
from pathswarm.protocol.rounds.reply_faults import ReplyFaults
from pathswarm.protocol.rounds.state_parts import part_bounds, parts_for, transfer_deadline_s
from pathswarm.protocol.wire import WireError, read_message, write_message

if TYPE_CHECKING:
    from pathswarm.protocol.rounds.audit import AuditService

logger = logging.getLogger(__name__)

class Service:
    """Serves contribute, stance and state requests for one node; downloads states from peers."""

    def __init__(self, ctx: Context, reducer: Reducer, audits: AuditService):
        self.ctx, self.reducer, self.audits = ctx, reducer, audits
        self.faults: ReplyFaults | None = None
        """Fault injection, tests only (reply_faults.py): None in every production node."""

    async def start(self) -> None:
        streams = self.ctx.streams
        if streams is None:  # offline: the node reduces its own rounds, nothing is served
            return
        await streams.serve(self.ctx.name("contribute"), self._on_contribute)
        await streams.serve(self.ctx.name("state"), self._on_state)
        await streams.serve(self.ctx.name("stance"), self._on_stance)
        await self.audits.start()

    async def _on_contribute(self, sender: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        ctx = self.ctx

        async def handle(header: dict) -> None:
            if module_of(header) not in ctx.numels:
                raise WireError(f"unknown module {module_of(header)!r}")
            ask = ContributeRequest.parse(header)
            if why := ctx.trust.beyond_limit(ask.round):  # before anything of it is read or remembered
                await ctx.trust.refuse(why, reader, writer)
                return
            if not ask.client:
                ctx.clients.discard(sender)  # its latest word: a restart may have made it reachable
            elif len(ctx.clients) < MAX_CLIENTS:
                ctx.clients.add(sender)  # never named a reducer candidate: nobody could dial it
            # The frame follows in a second message, bounded by this module's size.
            _, frame = await read_message(reader, ctx.contribution_limit(ask.module), ctx.traffic)
            result = await self.reducer.reduce(ask.module, ask.round, sender, ask.tokens, ask.digest, frame)

            async def send() -> None:
                await write_message(writer, result.header(), result.mean_frame, ctx.traffic)

            if self.faults and await self.faults.before_reply(ask.module, ask.round, sender, ctx.peer_id, result, send):
                return
            await send()

        await ctx.trust.serve("contribute", sender, reader, writer, handle)

    async def _on_stance(self, sender: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        ctx = self.ctx

        async def handle(header: dict) -> None:
            ask = StanceRequest.parse(header)
            if why := ctx.trust.beyond_limit(ask.round):
                await ctx.trust.refuse(why, reader, writer)
                return
            stance = self.reducer.stance(ask.module, ask.round, ask.digest, sender)
            await write_message(writer, StanceReply(stance).header(), b"", ctx.traffic)

        await ctx.trust.serve("stance", sender, reader, writer, handle)

    async def _on_state(self, sender: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        ctx = self.ctx

        async def handle(header: dict) -> None:
            ask = StateRequest.parse(header)
            module = ask.module
            # the newest state we know: after the rounds we closed, even before our own loop applied them; but the
            # state our node holds when that is the round asked for (a majority vouched for it: what we announce
            # lags what we closed by a round, and a download of the newer one was refused, issue 27)
            whole = module in set(ctx.numels)  # a module, not a slice of one (slices.py): states are served whole
            state = self.reducer.effective_state(module) if whole else None
            held = ctx.state_of(module) if whole else None
            if held is not None and ask.round >= 0 and held.round == ask.round:
                state = held
            if state is None:
                await write_message(writer, StateReply("missing").header(), b"", ctx.traffic)
                return
            # Written from the state's own tensors, chunk by chunk (no copy of the whole state per request): states
            # are immutable, so the bytes stay those of the digest. A part is a range of anchor‖momentum.
            start, end = part_bounds(2 * state.anchor.numel(), ask.parts, ask.part)
            parts = []
            for offset, t in ((0, state.anchor), (state.anchor.numel(), state.momentum)):
                lo, hi = max(start - offset, 0), min(end - offset, t.numel())
                if lo < hi:
                    view = memoryview(t.float().contiguous().numpy())  # type: ignore[arg-type]  # buffer on 3.12+
                    parts.append(view[lo:hi].cast("B"))
            reply = StateReply("ok", state.round, state.digest(), state.reducers, ask.part, ask.parts)
            await write_message(writer, reply.header(), parts, ctx.traffic, ctx.state_pacer,
                                idle_s=ctx.spec.averaging.timeout_s)

        await ctx.trust.serve("state", sender, reader, writer, handle)

    async def fetch_state(self, peer: str, module: str, timeout_s: float, round_: int = -1) -> OuterState | None:
        """Download a module's state from a peer (`round_`: the round wanted, -1: the newest): None if it fails, is
        refused, is later than the swarm's age allows, holds non-finite values, or does not hash to the digest the
        peer sent with it. The caller checks that digest against the one a majority vouches for."""
        numel = self.ctx.numels[module]
        got = await self._ask_state(peer, StateRequest(module, self.ctx.membership, round_), timeout_s)
        if got is None:
            return None
        reply, payload = got
        if reply.status != "ok" or len(payload) != 8 * numel or not self._in_age(module, peer, reply.round):
            return None
        return await self._assemble(module, peer[-8:], reply, bytearray(payload))

    async def _ask_state(self, peer: str, ask: StateRequest, timeout_s: float) -> tuple[StateReply, bytes] | None:
        """One state request to `peer` and its reply (payload at most the whole state); None when it cannot be had:
        unreachable, refused, timed out, malformed (logged: the caller asks another source)."""
        ctx, streams = self.ctx, self.ctx.streams
        assert streams is not None
        what = ask.module if ask.parts == 1 else f"part {ask.part + 1}/{ask.parts} of {ask.module}"
        start, end = part_bounds(2 * ctx.numels[ask.module], ask.parts, ask.part)

        async def go() -> tuple[dict, bytes]:
            reader, writer = await streams.open(peer, ctx.name("state"))
            try:
                await write_message(writer, ask.header(), b"", ctx.traffic)
                # a slow uplink may take minutes for a large state; a dead one is found within timeout_s
                return await read_message(reader, 8 * ctx.numels[ask.module], ctx.traffic, idle_s=timeout_s)
            finally:
                writer.close()

        try:
            header, payload = await asyncio.wait_for(go(), transfer_deadline_s(timeout_s, 4 * (end - start)))
            if (refusal := Refusal.parse(header)) is not None:
                logger.warning("state download of %s refused by %s: %s", what, peer[-8:], refusal.reason)
                return None
            return StateReply.parse(header), payload
        except Exception as e:  # unreachable peer, timeout, malformed message: try another source
            logger.info("state download of %s from %s failed: %s", what, peer[-8:], e)
            return None

    def _in_age(self, module: str, peer: str, round_: int) -> bool:
        limit = self.ctx.spec.round_limit(time.time())
        if limit is not None and round_ > limit:
            logger.warning("state download of %s from %s: round %d is later than the swarm's age allows", module,
                           peer[-8:], round_)
            return False
        return True

    async def _assemble(self, module: str, source: str, reply: StateReply, payload: bytearray) -> OuterState | None:
        """anchor‖momentum (fp32) → the state, if finite and hashing to the digest the reply names (`source`: whom
        it came from, for the log)."""
        numel = self.ctx.numels[module]
        values = torch.frombuffer(payload, dtype=torch.float32)
        anchor, momentum = values[:numel].clone(), values[numel:].clone()
        if not (torch.isfinite(anchor).all() and torch.isfinite(momentum).all()):
            return None
        got = OuterState(anchor, momentum, reply.round, reply.reducers)
        # hashed off the loop (~0.1 s for a 25 M-value module): the rounds we serve do not wait for it
        if await asyncio.get_running_loop().run_in_executor(None, got.digest) != reply.digest:
            logger.warning("state of %s from %s fails its digest; ignored", module, source)
            return None
        return got

    async def fetch_state_parts(self, peers: list[str], module: str, timeout_s: float, round_: int,
                                digest: str) -> OuterState | None:
        """The state (round_, digest) of a module, its parts downloaded from `peers` at once (one part per peer; a
        part that fails is asked of the next peer): None when a part cannot be had from any of them, the parts name
        different reducer lists, or the whole does not hash to `digest`. Every part must come with that round and
        digest. A peer from before parts answers with the whole state, which is taken as it is."""
        ctx = self.ctx
        assert peers
        numel = ctx.numels[module]
        k = parts_for(len(peers), 2 * numel)
        buffer = bytearray(8 * numel)
        lists: set[tuple[str, ...]] = set()
        whole = False  # an older peer sent all of it

        async def one(part: int, peer: str) -> bool:
            nonlocal whole
            start, end = part_bounds(2 * numel, k, part)
            got = await self._ask_state(peer, StateRequest(module, ctx.membership, round_, part, k), timeout_s)
            if got is None:  # the next peer is asked
                return False
            reply, payload = got
            if reply.status != "ok" or (reply.round, reply.digest) != (round_, digest):
                return False
            if reply.parts == 1 and len(payload) == 8 * numel:  # a peer from before parts: the whole state
                buffer[:] = payload
                whole = True
            elif (reply.part, reply.parts) == (part, k) and len(payload) == 4 * (end - start):
                buffer[4 * start:4 * end] = payload
            else:
                return False
            lists.add(reply.reducers)
            return True

        async def part_from_any(part: int) -> bool:
            for i in range(len(peers)):
                if whole or await one(part, peers[(part + i) % len(peers)]):
                    return True
            return False

        if not all(await asyncio.gather(*(part_from_any(j) for j in range(k)))):
            return None
        if len(lists) != 1 or not self._in_age(module, peers[0], round_):
            return None  # the reducer list is not covered by the digest: the parts must agree on it
        return await self._assemble(module, f"{len(peers)} holders", StateReply("ok", round_, digest, lists.pop()),
                                    buffer)
