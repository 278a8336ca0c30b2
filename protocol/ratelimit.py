"""Per-peer token buckets: a peer that floods a node's request handlers is refused, not served.

Each request handler (joining a module round, downloading module state, fetching the spec) keeps one
`RateLimiter`. A peer may make `burst` requests at once and then `rate` per second; beyond that its
requests are refused with a one-line reply and at most one log line per peer per minute, so a flood
costs the node a dictionary lookup per request. The table of peers is bounded: when full, the
longest-idle half is forgotten (a forgotten peer starts again with a full bucket, which only helps it
by `burst` requests). `Slots` bounds the requests in service at once, per peer and in all. Pure code, no
networking.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

MAX_PEERS = 4096


@dataclass
class _Bucket:
    tokens: float
    updated: float
    logged: float = -1e18


class RateLimiter:
    def __init__(self, rate: float, burst: int, max_peers: int = MAX_PEERS):
        if rate <= 0 or burst < 1:
            raise ValueError("rate must be positive and burst at least 1")
        self.rate, self.burst, self.max_peers = rate, burst, max_peers
        self._buckets: dict[str, _Bucket] = {}
        self.refused = 0
        """Requests refused since start (all peers)."""

    def allow(self, peer: str, now: float | None = None) -> bool:
        """Take one token from the peer's bucket; False (refuse the request) when it is empty."""
        now = time.monotonic() if now is None else now
        b = self._buckets.get(peer)
        if b is None:
            if len(self._buckets) >= self.max_peers:
                for old in sorted(self._buckets, key=lambda p: self._buckets[p].updated)[: self.max_peers // 2]:
                    del self._buckets[old]
            b = self._buckets[peer] = _Bucket(float(self.burst), now)
        b.tokens = min(float(self.burst), b.tokens + (now - b.updated) * self.rate)
        b.updated = now
        if b.tokens >= 1.0:
            b.tokens -= 1.0
            return True
        self.refused += 1
        return False

    def should_log(self, peer: str, now: float | None = None, every_s: float = 60.0) -> bool:
        """True at most once per `every_s` per peer: log refusals without letting a flood flood the log."""
        now = time.monotonic() if now is None else now
        b = self._buckets.get(peer)
        if b is None or now - b.logged < every_s:
            return False
        b.logged = now
        return True


class Slots:
    """Requests of one kind in service at once: at most `per_peer` for one peer and `total` in all. A request that
    finds no free slot is refused at once: with a deadline on each request, a peer that opens requests and never
    reads the replies holds at most `per_peer` slots, for at most the deadline."""

    def __init__(self, per_peer: int, total: int):
        if per_peer < 1 or total < per_peer:
            raise ValueError("per_peer must be at least 1 and total at least per_peer")
        self.per_peer, self.total = per_peer, total
        self._busy: dict[str, int] = {}
        self.in_use = 0
        self.refused = 0
        """Requests refused for want of a slot since start (all peers)."""

    def take(self, peer: str) -> bool:
        if self.in_use >= self.total or self._busy.get(peer, 0) >= self.per_peer:
            self.refused += 1
            return False
        self._busy[peer] = self._busy.get(peer, 0) + 1
        self.in_use += 1
        return True

    def give(self, peer: str) -> None:
        left = self._busy.get(peer, 0) - 1
        if left < 0:
            raise ValueError(f"peer {peer[:64]} holds no slot")
        if left:
            self._busy[peer] = left
        else:
            del self._busy[peer]  # the table holds only peers in service: it is bounded by `total`
        self.in_use -= 1
