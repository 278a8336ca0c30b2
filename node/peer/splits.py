"""Detect and heal a module merged in two versions (a split), and count the work it throws away.

The reducer rule (protocol/rounds/reducers.py) leaves ways to split a round: a candidate that is alive but cannot be
reached by the next one (a partition, a frozen process) closes the same round as its successor, and a reducer killed
while it replies leaves one member with the round's result and another without, which then reduces the round alone.
Every node announces (module, round, digest) on the DHT after each round, with the last few states it held before
(`ModuleAnnouncement.chain`); reading them, a node finds two kinds of split with its counted holders
(node/peer/vouch.py: the peers it merged rounds with that still claim the module, else the claims' holders; ids that
announce a forged digest, however many, decide nothing; live claimants only break a tie between versions counted
holders hold):

- **two versions of a round** (`split_verdict`): at the earliest round both our chain and another holder's name, with
  another digest. The version more holders vouch for wins (a tie: the live claimants holding a tied version weigh
  in, then the smaller digest, so both sides agree on it), and the other side re-syncs from a winner. Compared over
  the chains, not only at the round each holder is at now: a holder that got the result of a round its reducer died
  replying to goes on, and the others meet it at no round.
- **a minority ahead** (`ahead_alone`): nobody counted vouches for our state, and two or more of them, a strict
  majority, hold one older state for two grace windows (counted here: the module's live claimants too, not only the
  peers we merged with). It happens when we alone got the result of a round (its
  reducer died replying to the others and restarted from its checkpoint before that round): no majority vouches for
  our state, so the others cannot adopt it, and we answer each of their sends "out of sync". We go back to theirs
  (the majority's word, downloaded as announced); the group then reduces that round again, together.

Our merged rounds that did not survive are discarded: their tokens move from merged to discarded (a reducer's from
reduced to discarded), for every module, and the heal is recorded (round, rounds it took) for the status file and the
node's metrics. That is done for any re-sync that replaces states of ours with another version (`Splits.replaced`),
not only for those this watch asks for: a split often settles first through a reducer's "out of sync".
`split_verdict`, `ahead_alone` and `SplitWatch` are the rules and the hand-over between threads; `Splits` is the
node's side.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pathswarm.node.peer.vouch import Announced, Vouched, majority_state
from pathswarm.protocol.dht import read_modules_holders

if TYPE_CHECKING:
    from pathswarm.node.peer.node_status import NodeStatus
    from pathswarm.node.peer.rounds import Rounds
    from pathswarm.node.peer.state_sync import StateSync
    from pathswarm.node.train.worker import PathWorker
    from pathswarm.protocol.rounds.exchange import ModuleExchange

logger = logging.getLogger(__name__)

AHEAD_PATIENCE_GRACES = 2
"""Grace windows a node ahead alone waits, seeing the same older majority state, before it goes back to it: the
others' announcements lag their rounds by a DHT store (seconds when a store meets a dead peer), and one grace window
once took a group a moment behind for one that had stopped."""
AHEAD_STRANGERS_PATIENCE_GRACES = 4
"""The same wait when the older state's vouchers include claimants we never merged with: a node just restarted from
an older checkpoint (its new identity beside its old one, whose claim lapses within the claim TTL) vouches for the
state it restarted on until it has caught up, some seconds later. Going back on its word discarded 6 good rounds
(benchmarks/restarts.py --kill replying); not counting such peers at all left a node ahead alone for good."""


@dataclass(frozen=True)
class Heal:
    """Our version of `module` from state round `round` on lost: re-sync from `peer`."""

    module: str
    round: int
    """The first state round of ours that is not the winning version's (our tokens merged from it on are lost)."""
    peer: str
    winner: str
    """The digest that won (at `round`; for a minority ahead, the older state's, at `back_to.round`)."""
    ours: str
    """Our digest at `round` (for a minority ahead: our current one)."""
    at: tuple[int, str] = (-1, "")
    """Our state (round, digest) when the split was found: once it has moved, the heal is void (the next look
    decides again)."""
    back_to: Vouched | None = None
    """A minority ahead: the older state a majority holds, which the download must be."""
    counted: frozenset[str] = frozenset()
    """The announcers whose word decided (a verdict made while one of them was not yet known to lie is void)."""


def _latest(announced: Iterable[Announced], me: str, counted: Collection[str] | None) -> dict[str, Announced]:
    out: dict[str, Announced] = {}
    for a in announced:
        if a.peer != me and (counted is None or a.peer in counted) and (a.peer not in out
                                                                           or a.round >= out[a.peer].round):
            out[a.peer] = a
    return out


def split_verdict(module: str, my_round: int, my_digest: str, me: str, announced: Iterable[Announced],
                  counted: Collection[str] | None = None,
                  my_chain: Sequence[tuple[int, str]] = (),
                  claimants: Collection[str] = ()) -> Heal | None:
    """Announcements of a module → a Heal when our version lost the earliest round at which we and another counted
    holder (its state or its chain) hold different digests, else None. `counted`: the only announcers that count
    (None: all of them); `my_chain`: (round, digest) of our states before the current one.

    `claimants` (the module's live claimants) break a tie between the counted versions, and only that: each adds
    weight to the version it holds when it is one of the tied versions (ours or a counted holder's: a claimant cannot
    bring a version of its own, and the heal downloads from a counted holder). Why: a holder alone on its side counts
    the peers it merged with, which lack a holder restarted under a new identity on the other side; 1 against 1, the
    smaller digest decided, and the two sides stayed split until a round's coin fell against the lone holder (heals
    of 4 and 5 rounds, benchmarks/restarts.py --kill replying), while the other side counted 2 against 1."""
    mine = {r: d for r, d in my_chain} | {my_round: my_digest}
    latest = _latest(announced, me, counted)
    extra = {p: a for p, a in _latest(announced, me, claimants).items() if p not in latest}
    for round_ in sorted(mine):
        versions: dict[str, set[str]] = {mine[round_]: {me}}
        for peer, a in latest.items():
            held = a.states().get(round_)
            if held is not None:
                versions.setdefault(held[0], set()).add(peer)
        if len(versions) < 2:
            continue
        weight = {d: len(by) for d, by in versions.items()}
        top = max(weight.values())
        tied = {d for d, w in weight.items() if w == top}
        if len(tied) > 1:
            for a in extra.values():
                held = a.states().get(round_)
                if held is not None and held[0] in tied:
                    weight[held[0]] += 1
        winner = min(versions, key=lambda d: (-weight[d], d))
        if winner == mine[round_]:
            return None  # the others heal to us; our later rounds follow from this one
        return Heal(module, round_, min(versions[winner]), winner, mine[round_], (my_round, my_digest),
                    counted=frozenset(latest) | frozenset(extra))
    return None


def ahead_alone(my_round: int, my_digest: str, me: str, announced: Iterable[Announced],
                counted: Collection[str], merged: Mapping[str, Sequence[str]] | None = None) -> Vouched | None:
    """The older state to go back to when we are a minority ahead (see the module docstring), else None: nobody
    counted vouches for our state, and a strict majority of the counted announcers, two or more (against us alone:
    with one other holder it is a tie, and that one adopts ours instead, by node/peer/vouch.py), vouch for one state
    of an earlier round that one of them still holds, not counting those whose announcement is stale (`stale`, from
    `merged`: state round → the contributors of the round that made it, as our status records them)."""
    latest = _latest(announced, me, counted)
    if any(a.states().get(my_round, ("",))[0] == my_digest for a in latest.values()):
        return None
    got = majority_state(announced, me, counted)
    if got is None or got.round >= my_round or not got.peers or len(got.vouchers) < 2:
        return None
    old = stale(latest, merged or {})
    fresh = [p for p in got.vouchers if p not in old]
    if len(fresh) < 2 or 2 * len(fresh) <= len(latest):
        return None
    return got


def stale(latest: Mapping[str, Announced], merged: Mapping[str, Sequence[str]]) -> set[str]:
    """The announcers whose latest announcement is older than a state they held: we merged a frame of theirs sent
    from a later state (a round that made state round s merged frames sent from state s - 1). On home links the DHT
    stores lag the rounds by more than the ahead-alone patience, and 16 nodes' announcements two rounds old sent a
    node that was with the group back two rounds (tests/swarm/test_home_links.py)."""
    past: dict[str, int] = {}
    for state_round, peers in merged.items():
        for p in peers:
            past[p] = max(past.get(p, -1), int(state_round) - 1)
    return {p for p, a in latest.items() if a.round < past.get(p, -1)}


class AheadWait:
    """How long we have been ahead alone of the same older majority state, per module: `due` once it held for
    `patience_s` (a group a moment behind us announces such a state too, and moves on from it).

    Keyed on the majority's state only, whatever ours does: a node ahead alone goes on reducing rounds alone, one
    every few seconds, and keyed on our own state too the wait restarted with each of them and never ended
    (benchmarks/restarts.py --kill replying: one node 31 rounds ahead of the other two, for good)."""

    def __init__(self, patience_s: float):
        self.patience_s = patience_s
        self._since: dict[str, tuple[tuple[int, str], float]] = {}

    def due(self, mid: str, back: Vouched | None, now: float, patience_s: float | None = None) -> bool:
        """`back`: the state `ahead_alone` found for `mid` now (None: we are not ahead alone, the wait ends);
        `patience_s`: this look's wait (default: the one given at construction)."""
        if back is None:
            self._since.pop(mid, None)
            return False
        key = (back.round, back.digest)
        seen = self._since.get(mid)
        if seen is None or seen[0] != key:
            self._since[mid] = (key, now)
            return False
        return now - seen[1] >= (self.patience_s if patience_s is None else patience_s)


class SplitWatch:
    """Split verdicts found on the chores thread, handed to the training thread; each (module, round, our state)
    once."""

    def __init__(self):
        self._lock = threading.Lock()
        self._pending: list[Heal] = []
        self._seen: set[tuple[str, int, tuple[int, str]]] = set()

    def observe(self, heal: Heal | None) -> None:
        if heal is None:
            return
        with self._lock:
            key = (heal.module, heal.round, heal.at)
            if key in self._seen:
                return
            self._seen.add(key)
            if len(self._seen) > 4096:  # bounded: keys of states long gone
                self._seen = {key}
            self._pending.append(heal)
        if heal.back_to is None:
            logger.error("module %s round %d was merged in two versions: ours %s lost to %s (held by %s); "
                         "re-syncing", heal.module, heal.round, heal.ours, heal.winner, heal.peer[-8:])
        else:
            logger.error("module %s: our state at round %d is ours alone while most holders hold round %d (%s); going "
                         "back to theirs", heal.module, heal.at[0], heal.back_to.round, heal.winner)

    def take(self) -> list[Heal]:
        with self._lock:
            out, self._pending = self._pending, []
        return out

    def forget(self, heal: Heal) -> None:
        """A verdict dropped unheeded: the next look may find the same split again, and it is then taken."""
        with self._lock:
            self._seen.discard((heal.module, heal.round, heal.at))


def first_lost_round(ours: dict[int, str], theirs: dict[int, str], their_round: int) -> int:
    """The first state round of ours (round → digest) that the adopted version (round → digest of the states it went
    through, its own at `their_round` included) does not hold: the earliest round both name with other digests, else
    the first after theirs. (Rounds that only one side names are taken as shared: a holder's chain is short.)"""
    differ = [r for r in ours.keys() & theirs.keys() if ours[r] != theirs[r]]
    return min([their_round + 1, *differ])


class Splits:
    """The node's split watch: our modules' digests compared with their other holders' announcements on the chores
    thread (`look`), the versions we lost healed on the training thread (`heal_found`)."""

    def __init__(self, worker: PathWorker, sync: StateSync, rounds: Rounds, exchange: ModuleExchange,
                 status: NodeStatus, holders: Callable[[str], list[str]]):
        self.worker, self.sync, self.rounds, self.exchange, self.status = worker, sync, rounds, exchange, status
        self.holders = holders
        self.watch = SplitWatch()
        self._ahead = AheadWait(AHEAD_PATIENCE_GRACES * sync.spec.averaging.grace_s)
        self._found: dict[str, Heal] = {}  # module → the split verdict whose re-sync is pending

    def look(self) -> None:
        """Chores thread: compare our modules' digests with those their other holders announce."""
        try:
            mids = [mid for mid in self.worker.module_ids
                    if (mine := self.sync.local_states.get(mid)) is not None and mine.round > 0]
            # one search of the DHT for all our modules' announcements (a search per key asks every peer of a
            # swarm under hivemind's bucket size)
            found = read_modules_holders(self.sync.sdht, self.sync.spec, mids) if mids else {}
            for mid in mids:
                mine = self.sync.local_states[mid]
                announced, me, counted = self.sync.announced(mid, self.holders(mid), found[mid])
                digest = mine.digest()
                chain = [(r, d) for r, d, _ in list(self.status.chains.get(mid, ()))[:-1] if r < mine.round]
                # Ahead alone is judged by every live claimant, not only those we merged with: a holder restarted
                # under a new identity re-synced to the others' state without merging a round with us, and counted
                # out it left one voucher of the older state, a "tie" its other holder did not see (it counts the
                # claims): both sides kept their states for good (benchmarks/restarts.py --kill replying). The same
                # claimants break a tie of two versions.
                claimants = (set(self.holders(mid)) - {me} - self.sync.caught()) | counted
                heal = split_verdict(mid, mine.round, digest, me, announced, counted, chain, claimants)
                merged = dict(self.status.groups.get(mid, {}))  # a copy: the training thread adds rounds
                self.watch.observe(heal or self._ahead_for(mid, mine.round, digest, me, announced, counted,
                                                           claimants, merged))
        except Exception as e:  # advisory: the next round looks again
            logger.warning("could not compare digests with the module's holders: %s", e)

    def _ahead_for(self, mid: str, my_round: int, digest: str, me: str, announced: list[Announced],
                   counted: set[str], claimants: set[str], merged: dict[str, list[str]]) -> Heal | None:
        back = ahead_alone(my_round, digest, me, announced, counted, merged)
        patience = None
        if back is None:  # judged by the live claimants too, with more patience (AHEAD_STRANGERS_PATIENCE_GRACES)
            back = ahead_alone(my_round, digest, me, announced, claimants, merged)
            patience = AHEAD_STRANGERS_PATIENCE_GRACES * self.sync.spec.averaging.grace_s
        if not self._ahead.due(mid, back, time.monotonic(), patience) or back is None:
            return None
        return Heal(mid, back.round + 1, back.peers[0], back.digest, digest, (my_round, digest), back,
                    counted=frozenset(back.vouchers) | frozenset(back.peers))

    def heal_found(self) -> None:
        """Training thread: heal the splits `look` found since the last call."""
        for heal in self.watch.take():
            self._heal(heal)

    def _heal(self, heal: Heal) -> None:
        """Our version lost: re-sync from the winning side (the download counts the work it discards: `replaced`)."""
        mine = self.sync.local_states.get(heal.module)
        if mine is None or (mine.round, mine.digest()) != heal.at:
            return  # our state moved on (a round, a re-sync): the next look decides again
        liars = ({heal.peer} | heal.counted) & set(self.exchange.distrusted)
        if liars:
            # Caught lying after the look counted it (the look runs on another thread): its word may have decided
            # the verdict. The next look leaves it out and decides again, the same split included.
            logger.info("module %s: split verdict of round %d dropped: %s counted in it, and we caught it lying",
                        heal.module, heal.round, ", ".join(sorted(p[-8:] for p in liars)))
            self.watch.forget(heal)
            return
        self._found[heal.module] = heal
        self.rounds.resyncs.request_from(heal.module, heal.peer, heal.back_to)

    def replaced(self, mid: str, before: tuple[int, dict[int, str]], adopted: Vouched) -> None:
        """Training thread, after any re-sync replaced our state of `mid` (a heal's, an "out of sync", a round whose
        digest was not the group's, "behind"): our merged (and reduced) tokens of the states of ours the adopted
        version does not hold are discarded, for every module, and the heal is recorded. Whoever asked: a split also
        settles through a re-sync the split watch did not ask for (our reducer answers "out of sync" first), and its
        work went uncounted (the slow split-heal test, issue 27)."""
        our_round, ours = before
        first = first_lost_round(ours, dict(adopted.history) | {adopted.round: adopted.digest}, adopted.round)
        heal = self._found.pop(mid, None)
        if heal is not None and heal.at == (our_round, ours.get(our_round)):
            first = min(first, heal.round)  # the split watch compared chains the download does not bring
        # A round whose digest was not the group's (ours diverged) is in the group's version all the same: kept.
        kept = {r for r in self.rounds.diverged_log.get(mid, ()) if first <= r <= adopted.round}
        if not set(range(first, our_round + 1)) - kept:
            return  # we were behind on the same version, or only our replica of it differed: nothing of ours is gone
        log = self.rounds.merged_log.get(mid, {})
        gone = [r for r in log if r >= first and r not in kept]
        lost = sum(log.pop(r) for r in gone)  # counted now: a later heal over the same rounds must not count them again
        reduced = self.sync.net.run(self.exchange.take_back_reduced(mid, first), 10)
        rounds = our_round - first + 1
        self.status.split_healed(mid, lost, reduced)
        self.status.split_settled(mid, first, rounds, lost, reduced)
        logger.warning("module %s: healed; %d round(s) of ours from round %d discarded (%d tokens merged, %d reduced)",
                       mid, rounds, first, lost, reduced)
