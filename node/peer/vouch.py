"""No state on one peer's word (docs/SECURITY.md): which announced module state a node may adopt when it is behind.

A contribution that claims a later round than ours is only a hint that we may be behind; its sender could be
anyone. Before re-syncing, the node reads the module's announcements (`Announced`) from the DHT and adopts
a state only if a strict majority of the peers it counts announce that same (round, digest), newer than ours; the
download must then hash to that digest. Counted: the module's seasoned holders as this node knows them, i.e. the
peers whose outer gradients were merged in rounds of the module we applied; a node with no such history (just
started) counts the holders in the claims instead, which is weaker (SECURITY.md says so). Pure: no network.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import NamedTuple


class Announced(NamedTuple):
    """One holder's announcement of a module's state, as vouching and the split watch (node/peer/splits.py) read it:
    fields by name, so a field added later breaks no reader."""

    peer: str
    round: int
    digest: str
    reducers: str = ""
    """The digest of the reducer list announced with the state ("" : none, an announcement from before the field)."""

    @classmethod
    def of(cls, record) -> Announced:
        """From a `ModuleAnnouncement` DHT record (protocol/records.py)."""
        return cls(record.peer_id, record.round, record.digest, record.reducers_digest)


@dataclass(frozen=True)
class Vouched:
    """A module state a strict majority of the counted announcers hold."""

    round: int
    digest: str
    peers: tuple[str, ...]
    """Who announces it (sorted): where to download it from."""
    reducers: str = ""
    """The digest of the reducer list a strict majority of `peers` announce with it ("" when none has one): the list
    a download brings must have it (the state digest does not cover the list)."""


def majority_state(announced: Iterable[Announced], me: str, counted: Collection[str]) -> Vouched | None:
    """Announcements of one module → the (round, digest) that more than half of the announcers in `counted` (never
    ourselves) hold, each at its latest announcement; None if none has a strict majority. Its `reducers`: the list
    digest a strict majority of those holders announce."""
    latest: dict[str, tuple[int, str]] = {}
    lists: dict[str, str] = {}
    for a in announced:
        if a.peer != me and a.peer in counted and a.round >= latest.get(a.peer, (-1, ""))[0]:
            latest[a.peer] = (a.round, a.digest)
            lists[a.peer] = a.reducers
    if not latest:
        return None
    tally: dict[tuple[int, str], list[str]] = {}
    for peer, state in latest.items():
        tally.setdefault(state, []).append(peer)
    (round_, digest), peers = max(tally.items(), key=lambda kv: (len(kv[1]), kv[0][0], kv[0][1]))
    if 2 * len(peers) <= len(latest):
        return None
    by_list: dict[str, int] = {}
    for p in peers:
        by_list[lists[p]] = by_list.get(lists[p], 0) + 1
    top = max(by_list, key=lambda d: (by_list[d], d))
    return Vouched(round_, digest, tuple(sorted(peers)), top if 2 * by_list[top] > len(peers) else "")


def vouched_state(announced: Iterable[Announced], me: str, my_round: int,
                  counted: Collection[str]) -> Vouched | None:
    """The state to re-sync to, or None: the majority's (`majority_state`) if it is newer than `my_round`. (A group
    that says our replica differs at our own round is checked against `majority_state` directly: StateSync.resync.)"""
    got = majority_state(announced, me, counted)
    return got if got is not None and got.round > my_round else None


def counted_peers(merged_with: Iterable[str], claim_holders: Iterable[str], me: str,
                  distrusted: Iterable[str] = ()) -> set[str]:
    """The peers whose announcements count: those we merged rounds with, else (no history) the claims' holders;
    never a peer we caught lying (node/peer/audit.py), whose own replicas it may have made agree with it."""
    out = set(merged_with) - {me} or set(claim_holders) - {me}
    return out - set(distrusted)


def voted_out(votes: dict[str, Collection[str]], voters: Collection[str], me: str) -> set[str]:
    """Peers that a strict majority of `voters` announce they caught lying (`ModuleAnnouncement.distrusts`; never
    us; a target counts as voting for itself, so two peers that accuse each other both stay): a node with no history
    of its own (a joiner) does not count them.

    Why: a joiner counts the claims' holders, and a reducer caught lying by the others still holds the module and
    announces its own state; with one honest holder against it, nobody has a majority and the joiner starts the
    module from round 0 (benchmarks/hostile.py, `lying-reducer`). The peers that caught it say so in their
    announcements. A vote is as cheap as a claim, so this gives a joiner nothing it did not already take on the
    claims' word (sybil claimants could outvote honest holders in its count anyway); nodes with history of their
    own count only their own proofs."""
    voters = set(voters) - {me}
    out = set()
    for target in {t for v in voters for t in votes.get(v, ())} - {me}:
        against = sum(1 for v in voters - {target} if target in votes.get(v, ()))
        if 2 * against > len(voters | {target}):
            out.add(target)
    return out
