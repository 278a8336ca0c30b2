"""No state on one peer's word (docs/SECURITY.md): which announced module state a node may adopt when it is behind.

A contribution that claims a later round than ours is only a hint that we may be behind; its sender could be
anyone. Before re-syncing, the node reads the module's announcements (`Announced`) from the DHT and adopts
a state only if a strict majority of the peers it counts vouch for that same (round, digest), newer than ours: they
hold it, or held it just before their current state (an announcement names its last few states, `chain`); the
download must then hash to that digest. Counted: the module's seasoned holders as this node knows them, i.e. the
peers whose outer gradients were merged in rounds of the module we applied and that still claim it; a node with no
such history (just started) counts the holders in the claims instead, which is weaker (SECURITY.md says so). Pure:
no network.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import NamedTuple


class Announced(NamedTuple):
    """One holder's announcement of a module's state, as vouching and the split watch (node/peer/splits.py) read it:
    fields by name, so a field added later breaks no reader."""

    peer: str
    round: int
    digest: str
    reducers: str = ""
    """The digest of the reducer list announced with the state ("" : none, an announcement from before the field)."""
    chain: tuple[tuple[int, str, str], ...] = ()
    """(round, digest, reducer-list digest) of the states the announcer held just before this one, oldest first: it
    vouches for them too (a holder a round ahead of the others is not a vote against the state they hold)."""

    @classmethod
    def of(cls, record) -> Announced:
        """From a `ModuleAnnouncement` DHT record (protocol/records.py)."""
        return cls(record.peer_id, record.round, record.digest, record.reducers_digest, tuple(record.chain))

    def states(self) -> dict[int, tuple[str, str]]:
        """Round → (digest, reducer-list digest) of every state this announcement vouches for: its own and its
        chain's."""
        return {r: (d, lst) for r, d, lst in self.chain} | {self.round: (self.digest, self.reducers)}


@dataclass(frozen=True)
class Vouched:
    """A module state a strict majority of the counted announcers hold."""

    round: int
    digest: str
    peers: tuple[str, ...]
    """Who announces it as the state it holds now (sorted): where to download it from (empty when every voucher
    has moved past it)."""
    reducers: str = ""
    """The digest of the reducer list a strict majority of its vouchers announce with it ("" when none has one): the
    list a download brings must have it (the state digest does not cover the list)."""
    vouchers: tuple[str, ...] = field(default=(), compare=False)
    """Everyone who vouches for it (sorted): `peers`, and those whose chain names it (they moved past it)."""
    history: tuple[tuple[int, str], ...] = field(default=(), compare=False)
    """(round, digest) of the states this version went through, as one voucher's chain names them, oldest first,
    this state last: a re-sync compares them with ours to find the rounds of ours that did not survive
    (node/peer/splits.py `first_lost_round`)."""


def majority_state(announced: Iterable[Announced], me: str, counted: Collection[str]) -> Vouched | None:
    """Announcements of one module → the newest (round, digest) that more than half of the announcers in `counted`
    (never ourselves) vouch for, each by its latest announcement: the state it holds, or one its chain names (a holder
    that applied one more round still vouches for the state before it); None if none has a strict majority. Its
    `reducers`: the list digest a strict majority of its vouchers announce with it.

    Why the chain: holders of a live module announce at slightly different rounds, and a tally of the states they
    hold only found no majority while one of them was a round ahead (a node re-syncing, or one just restarted, then
    waited for the rounds to line up, seen for 20 s and more: issue 27)."""
    latest: dict[str, Announced] = {}
    for a in announced:
        if a.peer != me and a.peer in counted and (a.peer not in latest or a.round >= latest[a.peer].round):
            latest[a.peer] = a
    vouchers: dict[tuple[int, str], dict[str, str]] = {}  # state → voucher → the list digest it names with it
    for peer, a in latest.items():
        for round_, (digest, lst) in a.states().items():
            vouchers.setdefault((round_, digest), {})[peer] = lst
    held = [(state, by) for state, by in vouchers.items() if 2 * len(by) > len(latest)]
    if not held:
        return None
    # One digest per round and voucher, so at most one state of a round has a strict majority: the newest wins.
    (round_, digest), by = max(held, key=lambda kv: kv[0][0])
    peers = tuple(sorted(p for p in by if (latest[p].round, latest[p].digest) == (round_, digest)))
    by_list: dict[str, int] = {}
    for lst in by.values():
        by_list[lst] = by_list.get(lst, 0) + 1
    top = max(by_list, key=lambda d: (by_list[d], d))
    told = latest[(peers or tuple(sorted(by)))[0]].states()
    history = tuple((r, d) for r, (d, _) in sorted(told.items()) if r <= round_)
    return Vouched(round_, digest, peers, top if 2 * by_list[top] > len(by) else "", tuple(sorted(by)), history)


def vouched_state(announced: Iterable[Announced], me: str, my_round: int,
                  counted: Collection[str]) -> Vouched | None:
    """The state to re-sync to, or None: the majority's (`majority_state`) if it is newer than `my_round` and someone
    still holds it (serves it). (A group that says our replica differs at our own round is checked against
    `majority_state` directly: StateSync.resync.)"""
    got = majority_state(announced, me, counted)
    return got if got is not None and got.round > my_round and got.peers else None


def counted_peers(merged_with: Iterable[str], claim_holders: Iterable[str], me: str,
                  distrusted: Iterable[str] = ()) -> set[str]:
    """The peers whose announcements count: those we merged rounds with that still claim the module (a dead peer's
    last announcement outlives its claim by minutes: counted, it voted for the state it died with, and a restarted
    reducer with a new identity left no majority to the others until it expired, issue 27); when none of them still
    claims it, or with no history, the claims' holders, as a joiner counts them; the peers we merged with only when
    nobody claims the module at all. Never a peer we caught lying (node/peer/audit.py), whose own replicas it may
    have made agree with it.

    Why the claims' holders once everyone we merged with is gone: a node whose only merged peer died (it applied a
    mean that peer reduced alone) kept counting that peer's last announcement, which named its own state, and so
    answered every "out of sync" with "keeping ours" while the live holders went on without it, for good
    (benchmarks/restarts.py --kill replying, issue 27). Strangers then count for us as they count for a joiner."""
    merged, holders = set(merged_with) - {me}, set(claim_holders) - {me}
    out = merged & holders or holders or merged
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
