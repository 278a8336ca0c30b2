"""The stance handshake: before a candidate reduces a round it asks the candidates before it (reducers.py rule 3).

One ask per (module, round): concurrent contributions wait for the same answers. The earliest candidate that
answers open, closed or ahead wins, and the asker redirects its members there; one that is unreachable, frozen,
refused or at an older state is not a rival. The answering side is `Reducer.stance` (reducer.py): a node asked
about a round it can reduce opens it, so the earliest live candidate always reduces.
"""

from __future__ import annotations

import asyncio
import logging

from pathswarm.protocol.rounds.context import Context
from pathswarm.protocol.rounds.messages import StanceReply, StanceRequest
from pathswarm.protocol.rounds.outer import OuterState
from pathswarm.protocol.rounds.reducers import RIVAL, Stance, earlier
from pathswarm.protocol.rounds.slices import agreed_list, module_of_unit
from pathswarm.protocol.rounds.trust import STANCE_TIMEOUT_S
from pathswarm.protocol.wire import read_message, write_message

logger = logging.getLogger(__name__)


def must_ask(agreed: tuple[str, ...], me: str, fresh: bool, shunned) -> list[str]:
    """The candidates to ask before we reduce a round: those before us in the agreed list, or, at its head in a
    process that has not seen the list work yet (`fresh`), all the others; never a shunned peer (no say)."""
    if not agreed:
        return []
    if agreed[0] == me:
        return [p for p in agreed[1:] if not shunned(p)] if fresh else []
    return [p for p in earlier(agreed, me) if not shunned(p)]


class Stances:
    """Asks earlier candidates for their stance on the rounds we are about to reduce."""

    def __init__(self, ctx: Context):
        self.ctx = ctx
        self._asking: dict[tuple[str, int], asyncio.Future] = {}
        """(module, round) → the ask in progress; removed when it completes (at most one per round we open)."""

    def to_ask(self, module: str, mine: OuterState) -> list[str]:
        ctx = self.ctx
        if ctx.streams is None:
            return []  # offline
        whole = module_of_unit(module)  # a slice's (slices.py): its module's
        agreed = agreed_list(mine, module, ctx.groups.genesis)  # before any result: the holders in the claims
        return must_ask(agreed, ctx.peer_id, whole in ctx.fresh, ctx.trust.shunned)

    async def rival(self, module: str, round_: int, mine: OuterState) -> tuple[str, Stance] | None:
        """The earliest candidate before us that holds the round, or None (we may reduce it)."""
        ask = self.to_ask(module, mine)
        if not ask:
            return None
        key = (module, round_)
        check = self._asking.get(key)
        if check is None:
            check = self._asking[key] = asyncio.ensure_future(self._ask_all(module, round_, mine.digest(), ask))
            check.add_done_callback(lambda _f: self._asking.pop(key, None))
        return await asyncio.shield(check)

    async def _ask_all(self, module: str, round_: int, digest: str, peers: list[str]) -> tuple[str, Stance] | None:
        answers = await asyncio.gather(*(self._ask(p, module, round_, digest) for p in peers))
        for peer, stance in zip(peers, answers, strict=True):  # the earliest rival wins
            if stance in RIVAL:
                logger.info("%s round %d: %s answers %s; not reducing it here", module, round_, peer[-8:], stance.value)
                return peer, stance
        return None

    async def _ask(self, peer: str, module: str, round_: int, digest: str) -> Stance:
        ctx, streams = self.ctx, self.ctx.streams
        assert streams is not None

        async def go() -> Stance:
            reader, writer = await streams.open(peer, ctx.name("stance"))
            try:
                await write_message(writer, StanceRequest(module, round_, digest, ctx.membership).header(), b"",
                                    ctx.traffic)
                header, _ = await read_message(reader, 0, ctx.traffic)
            finally:
                writer.close()
            return StanceReply.parse(header).stance

        try:
            return await asyncio.wait_for(go(), STANCE_TIMEOUT_S)
        except Exception as e:  # unreachable, frozen, refused or nonsense: not a rival
            logger.info("%s round %d: no stance from %s (%s)", module, round_, peer[-8:], type(e).__name__)
            return Stance.NOT_HERE
