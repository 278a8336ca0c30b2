"""Who reduces a module's round: decided by what every member already agrees on, not by each node's view.

The invariant (docs/ARCHITECTURE.md): for each (module, round) at most one version is ever merged in the swarm.
Picking the reducer from each node's private view of the DHT claims broke it: a restarted node picked itself
while the others still skipped it, and a node whose claim was read late was picked by some members only.

The rule:
1. The result of round r names the candidates for round r+1, in failover order: the peer that reduced round r
   (it works), then the round's contributors, sorted (`successors`). Every member that applied round r holds
   this same list (it came with the same bytes), and so does a node that downloads the module's state.
2. A member sends round r+1 to the first candidate; on a connection failure (or a refusal) to the next one.
3. A candidate other than the first reduces only after asking every earlier candidate for its stance on the
   round (`Stance`): one that has the round open or closed, or is ahead, wins (the member is redirected
   there); one that is unreachable or at an older state does not. A node that is asked and holds the round's
   state opens the round itself, so the earliest live candidate always reduces.
4. A process that just started (a restart keeps the identity, or brings a new one) holds a list written
   before it died: at the head of it, it asks the others before reducing, as a later candidate does.
5. Before any round has closed (round 0) there is no list: the candidates are the holders in the claims,
   those that have trained first (`genesis_candidates`), a slice's rotated (slices.py `agreed_list`); a split
   there is detected and healed from digests.

What remains possible: a candidate that is alive but unreachable from the next one (a partition, a frozen
process) may close the same round as its successor. Those splits are detected from the announced digests.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from enum import StrEnum

MAX_CANDIDATES = 64
"""Most candidates a result or a state download may name (a module group of more holders lists the first)."""


class Stance(StrEnum):
    """What a candidate answers when a later one asks it about a round."""

    OPEN = "open"
    """It is reducing the round (it opened it now if it had not): send contributions there."""
    CLOSED = "closed"
    """It closed the round: its result is the round's version."""
    AHEAD = "ahead"
    """Its state is past the round: the asker is behind and must re-sync."""
    NOT_HERE = "not_here"
    """It cannot reduce the round (behind, no such module): not a rival."""


RIVAL = {Stance.OPEN, Stance.CLOSED, Stance.AHEAD}
"""Answers that forbid the asker to reduce the round."""


def successors(reducer: str, contributors: Iterable[str], clients: Iterable[str] = ()) -> tuple[str, ...]:
    """The candidates for the next round: the reducer of this one, then its contributors, sorted. `clients` (peers
    nobody can dial: protocol/reachability.py) are left out, except a client reducer, which comes last: a module
    held by clients only still has someone to close its rounds."""
    clients = set(clients)
    rest = sorted(set(contributors) - {reducer} - clients)
    if reducer in clients:
        return (*rest, reducer)[:MAX_CANDIDATES]
    return (reducer, *rest)[:MAX_CANDIDATES]


def next_candidates(me: str, used: Iterable[str], clients: Iterable[str], partners: Sequence[str] = (),
                    sliced: bool = False) -> tuple[str, ...]:
    """The candidates a reducer (`me`) names for the next round, from its round's merged peers (`used`): rule 1
    (`successors`), with two exceptions.
    - A slice's result (slices.py, `sliced`) names the members sorted, clients left out: every slice's result of a
      round then names the same list when the same members are in each, and each slice rotates over it; a client
      never heads it.
    - Alone in the round while holders we have merged this module with (`partners`, us included, sorted) may reduce:
      each side of a split (after a revocation, say) would otherwise name only itself and reduce itself round after
      round, the split watch healing one round while the next is already in flight. Both sides have merged with each
      other and name the same sorted list, so they meet at its head next round (node/peer/claims.py `partners_of`; a
      node that just joined, at another round of the module, is not in it)."""
    used, clients = set(used), set(clients)
    reducers = successors(me, used, clients)
    if sliced:
        reducers = tuple(sorted(set(reducers) - clients))[:MAX_CANDIDATES] or reducers
    if used == {me} and len(partners) > 1:
        reducers = tuple(partners[:MAX_CANDIDATES])
    return reducers


def genesis_candidates(holders: Iterable[str], seasoned: Iterable[str]) -> tuple[str, ...]:
    """Before any result names them: holders that have trained a round first, then the others, each sorted."""
    seasoned = set(seasoned)
    rest = set(holders) - seasoned
    return (*sorted(seasoned), *sorted(rest))[:MAX_CANDIDATES]


def candidates(agreed: tuple[str, ...], fallback: Iterable[str], skip: Iterable[str] = ()) -> list[str]:
    """The order a member tries reducers in: the agreed list, then the holders it knows that the list lacks
    (sorted), peers in `skip` (failed us at the connection level moments ago) moved to the end."""
    order = list(agreed) + sorted(set(fallback) - set(agreed))
    skip = set(skip)
    return [p for p in order if p not in skip] + [p for p in order if p in skip]


def earlier(agreed: tuple[str, ...], me: str) -> list[str]:
    """The candidates a reducer must ask before reducing: those before it in the agreed list (all of it when it
    is not in the list)."""
    return list(agreed[:agreed.index(me)]) if me in agreed else list(agreed)


def parse_candidates(value: object) -> tuple[str, ...]:
    """A candidate list received from a peer (untrusted): peer ids only, bounded; ValueError otherwise."""
    if not isinstance(value, list) or len(value) > MAX_CANDIDATES:
        raise ValueError("reducers must be a list of at most 64 peer ids")
    out = []
    for p in value:
        if not isinstance(p, str) or not 0 < len(p) <= 128 or not p.isalnum():
            raise ValueError("reducers must be peer ids")
        out.append(p)
    return tuple(out)


def list_digest(reducers: Sequence[str]) -> str:
    """sha256 (hex) of a candidate list. Announced beside a module's state digest, which does not cover the list: a
    node that downloads a state takes the list that came with it only if a majority of the state's announcers
    announce the same list (node/peer/vouch.py), so a state server cannot put itself at the head of our list."""
    return hashlib.sha256("\n".join(reducers).encode()).hexdigest()
