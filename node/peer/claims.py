"""Who serves what: the node's path claim, the claims of its peers, and the module groups they make.

`view_of` and `groups_of` are pure: the claims read from the DHT → a `ClaimsView` (per module: holders,
holders that have trained a round, the round each live holder's claim says) → `Groups` (holders including
ourselves; the candidates to reduce a module's first round, before any result has named them). Who reduces
later rounds does not depend on the claims: protocol/rounds/reducers.py. `Claims` does the DHT side: choosing and
settling a path, publishing and renewing our claim, reading the others' (bounded in time).
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from pathswarm.node.peer.config import read_live
from pathswarm.protocol.dht import publish_claim, read_claims, withdraw_claim
from pathswarm.protocol.path_choice import choose_path
from pathswarm.protocol.records import PathClaim
from pathswarm.protocol.rounds.reducers import genesis_candidates
from pathswarm.protocol.spec import SwarmSpec, format_path, parse_path

logger = logging.getLogger(__name__)

PREFETCH_MAX_AGE_S = 5.0
"""A read started ahead of a send (`Claims.prefetch`) serves it only if it began at most this long before: about the
time a claim takes to reach the DHT anyway (renewals go out every claim TTL / 3), so views still agree."""


@dataclass(frozen=True)
class ClaimsView:
    """What the last read of the claims said, per module of our path (our own claim left out)."""

    holders: dict[str, frozenset[str]]
    """Peers whose live claim covers the module."""
    seasoned: dict[str, frozenset[str]]
    """Those of them that have trained a round (claim round > 0): the only reducer candidates. A node that just
    joined could otherwise reduce a round while still downloading state, and split the group in two."""
    live: dict[str, dict[str, int]]
    """Peer → the round its claim says (the synchronous baseline detects a dead member by it)."""
    clients: frozenset[str] = frozenset()
    """Claimants that cannot be dialed (protocol/reachability.py): never reducer candidates."""


@dataclass(frozen=True)
class Groups:
    """The module groups as this node sees them now."""

    holders: dict[str, list[str]]
    """Module → its holders, ourselves included, sorted."""
    genesis: dict[str, tuple[str, ...]]
    """Module → who may reduce its round 0, in order (protocol/rounds/reducers.py `genesis_candidates`)."""
    live: dict[str, dict[str, int]]
    """Module → live holder → its claim's round, ourselves included."""
    reducible: dict[str, list[str]] = field(default_factory=dict)
    """Module → the holders that may reduce its rounds when the agreed list fails: those peers can dial, sorted
    (a client holding the module with clients only may reduce it itself)."""


def view_of(claims: Iterable[PathClaim], spec: SwarmSpec, module_ids: Iterable[str], me: str) -> ClaimsView:
    holders: dict[str, set[str]] = {mid: set() for mid in module_ids}
    seasoned: dict[str, set[str]] = {mid: set() for mid in holders}
    live: dict[str, dict[str, int]] = {mid: {} for mid in holders}
    clients: set[str] = set()
    for c in claims:
        if c.peer_id == me:
            continue  # our own claim may be older than our round: groups_of adds us as we are now
        if c.client:
            clients.add(c.peer_id)
        for mid in spec.module_ids(tuple(c.path)):
            if mid in holders:
                holders[mid].add(c.peer_id)
                live[mid][c.peer_id] = c.round
                if c.round > 0:
                    seasoned[mid].add(c.peer_id)
    return ClaimsView({m: frozenset(p) for m, p in holders.items()}, {m: frozenset(p) for m, p in seasoned.items()},
                      live, frozenset(clients))


def groups_of(view: ClaimsView, me: str, my_round: int, client: bool = False) -> Groups:
    """`client`: we cannot be dialed ourselves (we then reduce only a module no reachable peer holds)."""
    clients = view.clients | ({me} if client else set())
    holders = {mid: peers | {me} for mid, peers in view.holders.items()}
    seasoned = {mid: peers | ({me} if my_round > 0 else set()) for mid, peers in view.seasoned.items()}
    reducible = {mid: sorted(peers - clients) or sorted(peers) for mid, peers in holders.items()}
    genesis = {mid: genesis_candidates(reducible[mid], seasoned[mid] & set(reducible[mid])) for mid in holders}
    live = {mid: {**peers, me: my_round} for mid, peers in view.live.items()}
    return Groups({mid: sorted(peers) for mid, peers in holders.items()}, genesis, live, reducible)


class Claims:
    """Our claim and our view of everyone's. Used by the training thread and the chores thread (renewals)."""

    def __init__(self, sdht, spec: SwarmSpec, stop_event: threading.Event, my_round: Callable[[], int],
                 on_groups: Callable[[Groups], None], clock: Callable[[], float] = time.monotonic):
        self.sdht, self.spec, self.stop_event = sdht, spec, stop_event
        self.my_round, self.on_groups, self.clock = my_round, on_groups, clock
        self.module_ids: list[str] = []
        self.client = bool(getattr(sdht, "client_mode", False))
        """We cannot be dialed (protocol/reachability.py): our claim says so."""
        self.claim: PathClaim | None = None
        self.groups: Groups | None = None
        self._prefetched: tuple[float, concurrent.futures.Future] | None = None  # (clock at its start, the read)
        self._view: ClaimsView | None = None
        self._view_started = 0.0  # clock time the installed view was read from
        self._view_lock = threading.Lock()
        self._claim_lock = threading.Lock()

    # ---- choosing a path ------------------------------------------------------------------------
    def choose_path(self, wanted: str) -> tuple[int, ...]:
        if wanted != "auto":
            return parse_path(wanted, self.spec)
        claims = read_claims(self.sdht, self.spec)
        return tuple(choose_path(self.spec, claims, 0.0, self.sdht.peer_id, self.sdht.dht_time()))

    def settle_path(self, path: tuple[int, ...], wait_s: float = 1.5) -> tuple[int, ...]:
        """Nodes that join at the same moment see the same claims and may pick the same path: claim,
        wait a moment, re-read, and give the path up to a peer with a smaller id if a path is left
        with less service (the peer with the smaller id keeps it, so exactly one of them moves)."""
        me = self.sdht.peer_id
        claim = publish_claim(self.sdht, self.spec, PathClaim(path=path, peer_id=me, tokens_per_s=0.0, round=0,
                                                              expires_at=0.0, client=self.client))
        self.stop_event.wait(wait_s)
        claims = read_claims(self.sdht, self.spec)
        rivals = [c for c in claims if tuple(c.path) == path and c.peer_id < me]
        if rivals:
            others = [c for c in claims if c.peer_id != me]
            better = tuple(choose_path(self.spec, others, 0.0, me, self.sdht.dht_time()))
            if better != path:
                logger.info("path %s is taken by %s; moving to %s", format_path(path), rivals[0].peer_id[-8:],
                            format_path(better))
                if claim is not None:
                    withdraw_claim(self.sdht, self.spec, claim)
                return better
        return path

    # ---- our claim ----------------------------------------------------------------------------
    def publish(self, path: tuple[int, ...], tokens_per_s: float, view_timeout_s: float | None = None) -> None:
        """Store (or renew) our claim at our current round, then read everyone's."""
        self.module_ids = self.spec.module_ids(path)
        with self._claim_lock:  # the training thread (round 1) and the chores thread: one store at a time, in order
            claim = PathClaim(path=path, peer_id=self.sdht.peer_id, tokens_per_s=tokens_per_s, round=self.my_round(),
                              expires_at=0.0, client=self.client)
            self.claim = publish_claim(self.sdht, self.spec, claim) or claim
        self.refresh(view_timeout_s)

    def renew(self, path: tuple[int, ...], tokens_per_s: float, view_timeout_s: float | None = None) -> None:
        """`publish`, for a node already training: a DHT hiccup is logged, never raised (the heartbeat retries)."""
        try:
            self.publish(path, tokens_per_s, view_timeout_s)
        except Exception as e:  # a DHT hiccup must not kill training; the heartbeat retries
            logger.warning("could not renew the claim: %s", e)

    def withdraw(self) -> None:
        if self.claim is not None:
            withdraw_claim(self.sdht, self.spec, self.claim)

    # ---- the view -----------------------------------------------------------------------------
    def refresh(self, timeout_s: float | None = None) -> None:
        """Read the claims (seconds if a peer just died; TimeoutError past timeout_s) and derive the groups."""
        started = self.clock()
        self._install(read_claims(self.sdht, self.spec, timeout_s=timeout_s), started)

    def _install(self, claims: list[PathClaim], started: float) -> None:
        view = view_of(claims, self.spec, self.module_ids, self.sdht.peer_id)
        with self._view_lock:
            # a read that began earlier (and waited on a dead peer) must not replace a fresher view; the groups are
            # derived again all the same, with our round as of now
            if started >= self._view_started:
                self._view, self._view_started = view, started
            self._derive()

    def prefetch(self, timeout_s: float | None = None) -> None:
        """Start the read the next `refresh_for_send` uses, on a thread of its own, so that the DHT's answer comes
        while we train our last inner step instead of after it: waiting for it held the training thread 0.15 s of
        every round (8 nodes on one host, benchmarks/vs_peers.py at H = 10). One at a time."""
        with self._view_lock:
            if self._prefetched is not None:
                return
            read: concurrent.futures.Future = concurrent.futures.Future()
            self._prefetched = (self.clock(), read)

        def run() -> None:
            try:
                read.set_result(read_claims(self.sdht, self.spec, timeout_s=timeout_s))
            except BaseException as e:  # handed to refresh_for_send, which decides what it means
                read.set_exception(e)

        threading.Thread(target=run, name="claims-prefetch", daemon=True).start()

    def drop_prefetch(self) -> None:
        """Forget a read `prefetch` started: the next send reads anew (its answer, if it comes, is dropped)."""
        with self._view_lock:
            self._prefetched = None

    def refresh_for_send(self, timeout_s: float | None = None) -> bool:
        """`refresh` before a round is sent, never raising: when the read takes over timeout_s (a lookup that met a
        just-dead peer) the last view serves, re-derived with our round as of now. False when it did (a late read).
        A read `prefetch` started at most PREFETCH_MAX_AGE_S ago serves instead of a new one (bounded by the same
        timeout from its start)."""
        with self._view_lock:
            prefetched, self._prefetched = self._prefetched, None
        try:
            if prefetched is not None and self.clock() - prefetched[0] <= PREFETCH_MAX_AGE_S:
                started, read = prefetched
                left = None if timeout_s is None else max(0.0, started + timeout_s - self.clock())
                self._install(read.result(timeout=left), started)
            else:
                self.refresh(timeout_s)
        except TimeoutError as e:
            logger.debug("claims: %s; the last view serves", e)
            self.rederive()
            return False
        except Exception as e:  # keep the last view; the round still runs
            logger.warning("could not read claims: %s", e)
        return True

    def rederive(self) -> None:
        """Re-derive the groups from the last claims read (our own round may have changed)."""
        with self._view_lock:
            if self._view is not None:
                self._derive()

    def _derive(self) -> None:  # held: self._view_lock
        self.groups = groups_of(self._view, self.sdht.peer_id, self.my_round(), self.client)
        self.on_groups(self.groups)

    def wait_for_peers(self, count: int, timeout_s: float) -> None:
        """Before training, wait (at most timeout_s) until `count` nodes, us included, hold our modules."""
        if count <= 1:
            return
        deadline = time.monotonic() + timeout_s
        while not self.stop_event.is_set() and time.monotonic() < deadline:
            self.refresh()
            nodes = set().union(*map(set, self.groups.holders.values())) if self.groups.holders else set()
            if len(nodes) >= count:
                return
            self.stop_event.wait(0.5)
        logger.warning("only some of the %d peers waited for are here; training anyway", count)


def partners_of(groups: Groups, merged: dict[str, dict[str, list[str]]], me: str) -> dict[str, tuple[str, ...]]:
    """Module → the holders we have merged rounds of it with, that may reduce it, and ourselves, sorted: whom a
    reducer alone in its round names for the next one (protocol/rounds/reducer.py). Both sides of a split (after a
    revocation) have merged with each other and name the same list; a node that just joined, at another round of
    the module, is not named."""
    out = {}
    for mid, reducible in groups.reducible.items():
        try:  # `merged` is the training thread's (status.groups): it may gain a round meanwhile
            seen = read_live(lambda mid=mid: {p for peers in list(merged.get(mid, {}).values()) for p in peers})
        except RuntimeError:
            seen = set()
        out[mid] = tuple(sorted((set(reducible) & seen) | {me}))
    return out
