"""What a node tells the swarm about itself besides its claim: module announcements (round and digest, and the last
few states before them, for joiners, the split watch and `swarm status`), its metrics (loss history, throughput,
bytes, healed splits, stalled modules), and that it serves the spec.

Records are built on the training thread from a consistent state and stored on the chores thread: a store
that meets a dead peer waits seconds for it, and these records are advisory.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from pathswarm.node.peer.background import Chores
from pathswarm.node.peer.node_status import NodeStatus
from pathswarm.node.train.worker import PathWorker
from pathswarm.protocol.dht import (
    Entry,
    announcement_entry,
    metrics_entry,
    publish_entries,
    read_revocations,
    revocations_entry,
)
from pathswarm.protocol.records import (
    MAX_CHAIN,
    MAX_DISTRUSTS,
    MAX_GROUPS,
    MAX_HISTORY,
    MAX_SPLITS,
    STALLED_ROUNDS,
    ModuleAnnouncement,
    NodeMetrics,
    announce_ttl_s,
)
from pathswarm.protocol.rounds.reducers import list_digest
from pathswarm.protocol.spec import SwarmSpec
from pathswarm.protocol.spec_share import SERVER_TTL_S, spec_server_entry

logger = logging.getLogger(__name__)

SPEC_SERVER_RENEW_S = SERVER_TTL_S / 3
"""How often a node renews its listing as a spec server (it lives SERVER_TTL_S), not every round."""


def announced_chain(chain: list[list], round_: int, digest: str) -> tuple[tuple[int, str, str], ...]:
    """The states named before the announced one (`ModuleAnnouncement.chain`): the status's chain of the module
    (node/peer/config.py `chains`) when it ends at the announced state, else none."""
    if not chain or (chain[-1][0], chain[-1][1]) != (round_, digest):
        return ()
    return tuple((int(r), str(d), str(lst)) for r, d, lst in chain[:-1][-MAX_CHAIN:])


class StallWatch:
    """How many of the node's rounds have passed since a round with its outer gradient in it made each module's state:
    a holder left behind, refused by its group, told "behind" or "out of sync", or late round after round shows in
    the metrics (`NodeMetrics.stalled`)."""

    def __init__(self):
        self._last: dict[str, tuple[int, str, int]] = {}  # module → (round, digest, node rounds since)

    def note(self, mid: str, round_: int, digest: str, ours: bool) -> int:
        """One round of the node completed with `mid` at (round_, digest), made by a round with our frame in it or
        not (`ours`): the node's rounds since the last one that was."""
        last = self._last.get(mid)
        since = 0 if ours and (last is None or last[:2] != (round_, digest)) else (last[2] + 1 if last else 1)
        self._last[mid] = (round_, digest, since)
        return since


def recent_groups(groups: dict[str, dict[str, list[str]]]) -> tuple[tuple[str, int, int], ...]:
    """(module, round, group size) of the newest merged rounds, oldest first, at most MAX_GROUPS: the newest
    rounds of every module share the room evenly."""
    per_module = max(1, MAX_GROUPS // max(1, len(groups)))
    out = [(mid, int(r), len(peers)) for mid, rounds in sorted(groups.items())
           for r, peers in sorted(rounds.items(), key=lambda kv: int(kv[0]))[-per_module:]]
    return tuple(sorted(out, key=lambda g: (g[1], g[0]))[-MAX_GROUPS:])


class Announcer:
    def __init__(self, spec: SwarmSpec, sdht, status: NodeStatus, worker: PathWorker, chores: Chores | None,
                 on_revoked: Callable[[], None] = lambda: None):
        self.spec, self.sdht, self.status, self.worker, self.chores = spec, sdht, status, worker, chores
        self.on_revoked = on_revoked
        self.revoked = False  # the owner revoked this node: it stops (its peers refuse it anyway)
        self._revocations_seen = 0.0  # issue time of the newest revocation list logged
        self._spec_served_until = 0.0  # monotonic time when our listing as a spec server is due for renewal
        self.stalls = StallWatch()

    def announce(self) -> None:
        """Module announcements and metrics as of now; the DHT stores run on the chores thread."""
        st = self.status
        distrusts = tuple(list(st.distrusted)[-MAX_DISTRUSTS:])  # the latest caught (dicts keep insertion order)
        announcements = [ModuleAnnouncement(module_id=mid, round=o.round, digest=o.digest(), peer_id=self.sdht.peer_id,
                                            numel=o.anchor.numel(), client=self.sdht.client_mode, distrusts=distrusts,
                                            reducers_digest=list_digest(o.reducers),
                                            chain=announced_chain(st.chains.get(mid, []), o.round, o.digest()))
                         for mid, o in ((mid, self.worker.outer[mid]) for mid in self.worker.module_ids)]
        stalled = tuple((a.module_id, n) for a in announcements
                        if (n := self.stalls.note(a.module_id, a.round, a.digest, st.peer_id in st.groups.get(
                            a.module_id, {}).get(str(a.round), ()))) >= STALLED_ROUNDS)
        metrics = NodeMetrics(
            path=self.worker.path, peer_id=self.sdht.peer_id, round=st.round, loss=max(0.0, st.loss),
            tokens_per_s=st.tokens_per_s, bytes_sent=st.bytes_sent, bytes_received=st.bytes_received,
            history=tuple((r, max(0.0, min(loss, 1e6))) for r, loss in st.loss_history[-MAX_HISTORY:] if loss == loss),
            inner_steps=st.inner_step, tokens_trained=st.tokens_trained, counters_id=st.counters_id,
            groups=recent_groups(st.groups),
            rounds_missed=tuple((mid, late, failed) for mid, (late, failed) in sorted(st.rounds_missed.items())),
            reachable=st.reachable, splits_healed=st.splits_healed,
            splits=tuple((mid, r, n) for mid, r, n in st.heals[-MAX_SPLITS:]), stalled=stalled)
        job = lambda: self._publish(announcements, metrics)  # noqa: E731
        if self.chores is None:
            job()
        else:
            self.chores.submit("announce", job)

    def _publish(self, announcements: list[ModuleAnnouncement], metrics: NodeMetrics) -> None:
        # One store for all of a round's records: each store searches the DHT for its keys' nearest peers, and one
        # per record made these the DHT's main load (benchmarks/dht_load.py).
        ttl = announce_ttl_s(self.spec)
        try:
            entries = [announcement_entry(self.sdht, self.spec, ann, ttl) for ann in announcements]
            entries.append(metrics_entry(self.sdht, self.spec, metrics, ttl))
            try:
                if (relayed := self.relay_revocations(ttl)) is not None:
                    entries.append(relayed)
            except Exception as e:  # the round's own records still go out
                logger.warning("could not read the revocation list: %s", e)
            serve = time.monotonic() >= self._spec_served_until
            if serve:
                entries.append(spec_server_entry(self.sdht, self.spec.swarm_id))
            if publish_entries(self.sdht, entries)[-1] and serve:
                self._spec_served_until = time.monotonic() + SPEC_SERVER_RENEW_S
        except Exception as e:  # announcements are advisory; training goes on
            logger.warning("could not announce: %s", e)

    def relay_revocations(self, ttl: float) -> Entry | None:
        """A private swarm: learn the owner's newest revocation list (this process's gate enforces it from now on);
        the store that relays it, so it outlives the owner's publication (None: nothing to relay)."""
        revs = read_revocations(self.sdht, self.spec)
        if revs is None:
            return None
        if revs.issued_at > self._revocations_seen:
            self._revocations_seen = revs.issued_at
            if self.sdht.peer_id in revs.peers:
                logger.error("this node was revoked by the swarm's owner: its peers refuse it from now on; stopping")
                self.revoked = True
                self.on_revoked()
            else:
                logger.warning("the swarm's owner revoked %d peer(s): %s", len(revs.peers),
                               ", ".join(sorted(p[-8:] for p in revs.peers)))
        return revocations_entry(self.sdht, self.spec, revs.token, ttl)

    def announce_spec_server(self) -> None:
        try:
            if publish_entries(self.sdht, [spec_server_entry(self.sdht, self.spec.swarm_id)])[0]:
                self._spec_served_until = time.monotonic() + SPEC_SERVER_RENEW_S
        except Exception as e:  # advisory: joiners also ask the initial peers directly
            logger.warning("could not list this node as a spec server: %s", e)
