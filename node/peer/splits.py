"""Detect and heal a round merged in two versions (a split), and count the work it throws away.

The reducer rule (protocol/rounds/reducers.py) leaves one way to split a round: a candidate that is alive but cannot be
reached by the next one (a partition, a frozen process) closes the same round as its successor. Every node
announces (module, round, digest) on the DHT after each round; reading them, a node that sees another holder
at its own round with another digest has found a split. The version announced by more holders wins (ties: the
smaller digest, so both sides agree on it); only the holders the node counts for vouching (node/peer/vouch.py: the
peers it merged rounds with, else the claims' holders) are counted, so ids that announce a forged digest at our
round, however many, decide nothing. The other side re-syncs from a winner, once per (module, round),
keeping its local progress. Its own merged rounds from the split on are not in the state that survives:
their tokens move from merged to discarded (and a reducer's from reduced to discarded).

`split_verdict` and `SplitWatch` are the rule and the hand-over between threads; `Splits` is the node's side.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pathswarm.node.peer.vouch import Announced

if TYPE_CHECKING:
    from pathswarm.node.peer.config import NodeStatus
    from pathswarm.node.peer.rounds import Rounds
    from pathswarm.node.peer.state_sync import StateSync
    from pathswarm.node.train.worker import PathWorker
    from pathswarm.protocol.rounds.exchange import ModuleExchange

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
                  announced: Iterable[Announced], counted: Collection[str] | None = None) -> Heal | None:
    """Announcements of a module → a Heal when our version of our round lost, else None. `counted`: the only
    announcers that count (None: all of them)."""
    versions: dict[str, set[str]] = {my_digest: {me}}
    for a in announced:
        if a.round == my_round and a.peer != me and (counted is None or a.peer in counted):
            versions.setdefault(a.digest, set()).add(a.peer)
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


class Splits:
    """The node's split watch: our modules' digests compared with their other holders' announcements on the chores
    thread (`look`), the versions we lost healed on the training thread (`heal_found`)."""

    def __init__(self, worker: PathWorker, sync: StateSync, rounds: Rounds, exchange: ModuleExchange,
                 status: NodeStatus, holders: Callable[[str], list[str]]):
        self.worker, self.sync, self.rounds, self.exchange, self.status = worker, sync, rounds, exchange, status
        self.holders = holders
        self.watch = SplitWatch()

    def look(self) -> None:
        """Chores thread: compare our modules' digests with those their other holders announce."""
        try:
            for mid in self.worker.module_ids:
                mine = self.sync.local_states.get(mid)
                if mine is None or mine.round == 0:
                    continue
                announced, me, counted = self.sync.announced(mid, self.holders(mid))
                self.watch.observe(split_verdict(mid, mine.round, mine.digest(), me, announced, counted))
        except Exception as e:  # advisory: the next round looks again
            logger.warning("could not compare digests with the module's holders: %s", e)

    def heal_found(self) -> None:
        """Training thread: heal the splits `look` found since the last call."""
        for heal in self.watch.take():
            self._heal(heal)

    def _heal(self, heal: Heal) -> None:
        """Our version of a split round lost: count its work as discarded and re-sync from the winning side."""
        mine = self.sync.local_states.get(heal.module)
        if mine is None or mine.round != heal.round or mine.digest() != heal.ours:
            return  # our state moved on (a re-sync already replaced it)
        lost = lost_since(self.rounds.merged_log.get(heal.module, {}), heal.round)
        reduced = self.sync.net.run(self.exchange.take_back_reduced(heal.module, heal.round), 10)
        self.status.split_healed(heal.module, lost, reduced)
        self.rounds.resyncs.request_from(heal.module, heal.peer)
