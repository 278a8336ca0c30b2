"""Detect and heal a round merged in two versions (a split), and count the work it throws away.

The reducer rule (protocol/reducers.py) leaves one way to split a round: a candidate that is alive but cannot be
reached by the next one (a partition, a frozen process) closes the same round as its successor. Every node
announces (module, round, digest) on the DHT after each round; reading them, a node that sees another holder
at its own round with another digest has found a split. The version announced by more holders wins (ties: the
smaller digest, so both sides agree on it); only the holders the node counts for vouching (node/peer/vouch.py: the
peers it merged rounds with, else the claims' holders) are counted, so ids that announce a forged digest at our
round, however many, decide nothing. The other side re-syncs from a winner, once per (module, round),
keeping its local progress. Its own merged rounds from the split on are not in the state that survives:
their tokens move from merged to discarded (and a reducer's from reduced to discarded).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection, Iterable
from dataclasses import dataclass

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Heal:
    """A split our replica of `module` lost: re-sync from `peer`, whose version won at `round`."""

    module: str
    round: int
    peer: str
    winner: str
    """The digest that won."""
    ours: str


def split_verdict(module: str, my_round: int, my_digest: str, me: str,
                  announced: Iterable[tuple], counted: Collection[str] | None = None) -> Heal | None:
    """(peer, round, digest[, reducer list digest]) announcements of a module → a Heal when our version of our round
    lost, else None. `counted`: the only announcers that count (None: all of them)."""
    versions: dict[str, set[str]] = {my_digest: {me}}
    for peer, round_, digest, *_ in announced:
        if round_ == my_round and peer != me and (counted is None or peer in counted):
            versions.setdefault(digest, set()).add(peer)
    if len(versions) < 2:
        return None
    winner = min(versions, key=lambda d: (-len(versions[d]), d))
    if winner == my_digest:
        return None
    return Heal(module, my_round, min(versions[winner]), winner, my_digest)


class SplitWatch:
    """Split verdicts found on the chores thread, handed to the training thread; each (module, round) once."""

    def __init__(self):
        self._lock = threading.Lock()
        self._pending: list[Heal] = []
        self._seen: set[tuple[str, int]] = set()

    def observe(self, heal: Heal | None) -> None:
        if heal is None:
            return
        with self._lock:
            if (heal.module, heal.round) in self._seen:
                return
            self._seen.add((heal.module, heal.round))
            self._pending.append(heal)
        logger.error("module %s round %d was merged in two versions: ours %s lost to %s (held by %s); re-syncing",
                     heal.module, heal.round, heal.ours, heal.winner, heal.peer[-8:])

    def take(self) -> list[Heal]:
        with self._lock:
            out, self._pending = self._pending, []
        return out


def lost_since(log: dict[int, int], first_round: int) -> int:
    """Tokens of the rounds from `first_round` on (state rounds after each merge, as `log` keys them)."""
    return sum(tokens for round_, tokens in log.items() if round_ >= first_round)
