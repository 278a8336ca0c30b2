"""What one peer's requests may cost a node (docs/SECURITY.md, "RPC caller"): the guard around every request handler
of the module exchange.

A request passes, in order: the peer's rate budget (`RateLimiter`), a slot (`Slots`: at most `per_peer` requests of
one kind in service for one peer, `total` in all), then the handler's body under a deadline. A refused request is
answered with one line ("rate limited", "busy") and its remaining bytes drained briefly, so the refusal reaches the
peer; a request past its deadline is cut and its stream closed. With replies written chunk by chunk
(protocol/wire.py drains after each), a peer that opens requests and never reads the replies pins at most
`per_peer` slots of a few chunks each, for at most the deadline: no longer a whole module state per request.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from pathswarm.protocol.ratelimit import RateLimiter, Slots
from pathswarm.protocol.wire import WireError

logger = logging.getLogger(__name__)

Refuse = Callable[[str, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@dataclass(frozen=True)
class Budget:
    """One request kind's limits."""

    rate: float
    """Requests per second a peer may make once its burst is spent."""
    burst: int
    per_peer: int
    """Requests of one peer in service at once."""
    total: int
    """Requests of all peers in service at once."""
    deadline_s: float
    """Longest a request may stay in service, reading, waiting for its round and writing the reply."""


class Guard:
    """Rate, slots and deadline for each request kind; `serve` runs a handler's body inside them."""

    def __init__(self, budgets: dict[str, Budget], refuse: Refuse):
        self.budgets, self.refuse = budgets, refuse
        self.limits = {kind: RateLimiter(rate=b.rate, burst=b.burst) for kind, b in budgets.items()}
        self.slots = {kind: Slots(b.per_peer, b.total) for kind, b in budgets.items()}
        self.cut = 0
        """Requests cut at their deadline since start."""

    async def serve(self, kind: str, sender: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    body: Callable[[], Awaitable[None]]) -> None:
        try:
            limiter, slots = self.limits[kind], self.slots[kind]
            if not limiter.allow(sender):
                if limiter.should_log(sender):
                    logger.warning("peer %s floods %s requests: refusing them (%d refused so far)", sender, kind,
                                   limiter.refused)
                await self.refuse("rate limited", reader, writer)
                return
            if not slots.take(sender):
                if limiter.should_log(sender):
                    logger.warning("peer %s holds %d %s requests open: refusing more", sender, slots.per_peer, kind)
                await self.refuse("busy", reader, writer)
                return
            try:
                await asyncio.wait_for(body(), self.budgets[kind].deadline_s)
            except TimeoutError:
                self.cut += 1
                logger.warning("%s request from %s cut at its %.0f s deadline", kind, sender[-8:],
                               self.budgets[kind].deadline_s)
            finally:
                slots.give(sender)
        except (WireError, asyncio.IncompleteReadError, ConnectionError) as e:
            logger.warning("%s request from %s refused: %s", kind, sender[-8:], e)
        finally:
            writer.close()
