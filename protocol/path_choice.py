"""Which path a node trains: a pure function of the live claims and the node's own throughput.

The rule (after petals' `block_selection.py`, with paths instead of blocks):
- The *service* of a path is the sum of the throughputs (tokens/s) of the live claims on it. A claim
  that reports 0 (its node has not measured yet) counts as `MIN_CLAIM_TOKENS_PER_S`, so a new node is
  never invisible and two newcomers do not pile onto one path.
- Throughputs are self-reported, so each claim is credited at most `CLAIM_CAP_FACTOR` × the median
  reported throughput of the live claims (docs/SECURITY.md, "claimer"): a stranger reporting 1e15
  tokens/s on a path weighs as two typical nodes, not as the whole swarm, while the honest majority
  sets the median. One claim per peer follows from the records (one subkey per owner).
- A node picks the path with the least service. When every path is served this doubles up on the
  least-served one; with no claims at all it is an exact tie across all paths.
- Ties are broken by (fewest claimants, then a hash of (peer_id, path), then path index). The hash
  spreads nodes that join an empty swarm at the same moment: each sees the same claims but ranks the
  tied paths in its own pseudo-random order, so two joiners pick different paths with probability
  1 - 1/n_paths instead of both taking path 0. It is sha256, not Python's salted `hash`, so a node
  decides the same way in every process and a test can pin the expected choice.
- Expired claims and the node's own claim (it is choosing afresh) are ignored, as are claims whose
  path does not fit the spec (they cannot be served by anyone).

Pure code: no networking, no hivemind.
"""

from __future__ import annotations

import hashlib
import math
import statistics
from collections.abc import Iterable

from pathswarm.protocol.records import PathClaim
from pathswarm.protocol.spec import SwarmSpec, format_path

MIN_CLAIM_TOKENS_PER_S = 1.0
"""Service credited to a live claim that reports less (e.g. 0 before its first measurement)."""
CLAIM_CAP_FACTOR = 2.0
"""Most service one claim is credited, in medians of the live claims' reported throughputs."""

Path = tuple[int, ...]


def live_claims(spec: SwarmSpec, claims: Iterable[PathClaim], my_peer_id: str, now: float) -> list[PathClaim]:
    """Claims that count: not expired at `now`, not this peer's, on a path of the spec."""
    out = []
    for c in claims:
        if c.expires_at <= now or c.peer_id == my_peer_id:
            continue
        try:
            spec.check_path(c.path)
        except ValueError:
            continue
        out.append(c)
    return out


def path_service(spec: SwarmSpec, claims: Iterable[PathClaim]) -> dict[Path, tuple[float, int]]:
    """(service in tokens/s, number of claimants) of every path of the spec, for the given claims."""
    service: dict[Path, tuple[float, int]] = {p: (0.0, 0) for p in spec.paths()}
    claims = sorted(claims, key=lambda c: (c.path, c.peer_id, c.tokens_per_s, c.expires_at, c.round))
    cap = CLAIM_CAP_FACTOR * max(statistics.median([c.tokens_per_s for c in claims] or [0.0]), MIN_CLAIM_TOKENS_PER_S)
    # Summed in a canonical order, so float rounding cannot make the choice depend on claim order.
    for c in claims:
        if c.path in service:
            tps, n = service[c.path]
            service[c.path] = (tps + min(max(c.tokens_per_s, MIN_CLAIM_TOKENS_PER_S), cap), n + 1)
    return service



def tie_break(peer_id: str, path: Path) -> int:
    """A per-(peer, path) pseudo-random rank: 64 bits of sha256('{peer_id}/{path}')."""
    digest = hashlib.sha256(f"{peer_id}/{format_path(path)}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def rank_paths(spec: SwarmSpec, claims: Iterable[PathClaim], my_peer_id: str, now: float) -> list[Path]:
    """All paths, best for this peer to join first (see the module docstring for the order)."""
    service = path_service(spec, live_claims(spec, claims, my_peer_id, now))
    return sorted(
        service,
        key=lambda p: (service[p][0], service[p][1], tie_break(my_peer_id, p), spec.index_of_path(p)),
    )


def choose_path(
    spec: SwarmSpec,
    claims: list[PathClaim],
    my_tokens_per_s: float,
    my_peer_id: str,
    now: float,
) -> Path:
    """The path this peer should claim now: the least-served one, ties broken deterministically.

    `my_tokens_per_s` is checked but does not change the choice: adding the same amount to any path
    keeps the least-served one least served.
    """
    _check_tokens_per_s(my_tokens_per_s)
    return rank_paths(spec, claims, my_peer_id, now)[0]


def _check_tokens_per_s(tokens_per_s: float) -> None:
    if not (isinstance(tokens_per_s, int | float) and math.isfinite(tokens_per_s) and tokens_per_s >= 0):
        raise ValueError(f"my_tokens_per_s must be a finite number >= 0, got {tokens_per_s!r}")
