"""This node's seat in the swarm: the path it holds, the claim that says so, and the module groups the claims make.

At start the path is chosen (the least-served one, settled against peers that join at the same moment) or, after a
restart, taken back from our checkpoint, and claimed. The claim is renewed by a heartbeat whose renewals run on the
chores thread, and withdrawn when the node leaves. Before each send the claims are read again (bounded in time);
the groups they make are installed in the exchange (`use_groups`): whom our rounds wait for, who may reduce a
module's first round. Offline, the node holds its path alone. The DHT side of claims is node/peer/claims.py.
"""

from __future__ import annotations

import logging
import threading
import time

from pathswarm.node.peer.background import Chores
from pathswarm.node.peer.checkpoints import Checkpoints
from pathswarm.node.peer.claims import Claims, Groups, partners_of
from pathswarm.node.peer.config import CLAIMS_READ_S, ROUND1_SETTLE_S, NodeConfig
from pathswarm.node.peer.node_status import NodeStatus
from pathswarm.protocol.rounds.exchange import ModuleExchange
from pathswarm.protocol.spec import parse_path

logger = logging.getLogger(__name__)


class Seat:
    """Our path and claim, and the groups installed in the exchange. The training thread drives it; the chores
    thread renews the claim, and a read of the claims on either thread installs fresh groups."""

    def __init__(self, cfg: NodeConfig, status: NodeStatus, checkpoints: Checkpoints, stop_event: threading.Event):
        self.cfg, self.spec, self.status = cfg, cfg.spec, status
        self.checkpoints, self.stop_event = checkpoints, stop_event
        self.claims: Claims | None = None  # None: offline
        self.exchange: ModuleExchange | None = None  # where the groups go, once the node's exchange is started
        self.groups: Groups | None = None
        self._expected: dict[str, int] = {}  # module → the quorum we last gave the exchange (sync: it only grows)
        self.path: tuple[int, ...] = ()
        self.chores: Chores | None = None
        self.heartbeat: threading.Thread | None = None
        self._read_not_before = 0.0  # monotonic time before which the claims are not read for a send

    def join(self, sdht) -> None:
        self.claims = Claims(sdht, self.spec, self.stop_event, lambda: self.status.round, self.use_groups)

    def pick_path(self) -> tuple[int, ...]:
        if self.cfg.offline:
            return self.spec.path_of_index(0) if self.cfg.path == "auto" else parse_path(self.cfg.path, self.spec)
        if self.cfg.path == "auto" and (resumed := self.checkpoints.path_held()) is not None:
            # A restarted node takes its path back without the settling wait: its checkpoint holds that
            # path's modules, and its claim lapsed only moments ago (no other node is likely to have moved in).
            return resumed
        path = self.claims.choose_path(self.cfg.path)
        return self.claims.settle_path(path) if self.cfg.path == "auto" else path

    def claim(self, path: tuple[int, ...], module_ids: list[str]) -> None:
        """Claim `path` (whose modules are `module_ids`) and wait for the peers `--wait-peers` asks for."""
        self.path = path
        if self.cfg.offline:
            me = self.status.peer_id
            self.use_groups(Groups({mid: [me] for mid in module_ids}, {mid: (me,) for mid in module_ids}, {}))
        else:
            self.claims.publish(path, self.status.tokens_per_s)
            self.claims.wait_for_peers(self.cfg.wait_peers, self.cfg.wait_peers_timeout_s)

    def use_groups(self, groups: Groups) -> None:
        """Install freshly derived groups: holders for our sends, group sizes for the rounds we reduce."""
        self.groups = groups
        expected = {}
        for mid, peers in groups.holders.items():
            if self.cfg.sync_rounds:
                # A data-parallel job's world only grows: a dead worker still counts, and the round waits
                # for it to come back (up to timeout_s), as a collective waits for a missing rank.
                expected[mid] = max(len(peers), self._expected.get(mid, 0))
            else:
                # A peer whose contributions we refuse (a proven liar, a revoked member) cannot complete a round we
                # reduce: counted, it would hold every such round open for the whole grace window
                # (benchmarks/hostile.py's lying arm: a caught liar that keeps claiming its path).
                expected[mid] = sum(1 for p in peers if not self.exchange.refuses(p))
        self._expected = expected
        # Decoupled, the reducer counts its quorum from the claimants itself (protocol/rounds/reducer_state.py `quorum`:
        # no refused peer, no silent one); the count above is then only a fallback.
        self.exchange.set_groups(expected, groups.live if self.cfg.sync_rounds else None, groups.genesis,
                                 partners_of(groups, self.status.groups, self.status.peer_id),
                                 None if self.cfg.sync_rounds else {m: tuple(p) for m, p in groups.holders.items()})

    def holders(self, mid: str) -> list[str]:
        """The module's holders in the last groups, ourselves included."""
        return self.groups.holders.get(mid, []) if self.groups is not None else []

    def live(self, mid: str) -> dict[str, int]:
        """The module's live holders → the round each claims."""
        return self.groups.live.get(mid, {}) if self.groups else {}

    # ---- keeping the claim -------------------------------------------------------------------
    def start_heartbeat(self, chores: Chores) -> None:
        self.chores = chores
        self.heartbeat = threading.Thread(target=self._beat, name="pathswarm-heartbeat", daemon=True)
        self.heartbeat.start()

    def _beat(self) -> None:
        # A timer only: the renewal runs on the chores thread, so no two DHT writes of our claim race.
        period = max(1.0, self.spec.averaging.claim_ttl_s / 3)
        while not self.stop_event.wait(period):
            self.chores.submit("claim", self.renew, first=True)

    def renew(self) -> None:
        """Store our claim again, at our round as of now (round 1: we may reduce from now on)."""
        # At start the first view is worth waiting for; a renewal must not hold the chores thread for long.
        self.claims.renew(self.path, self.status.tokens_per_s, None if self.chores is None else 3 * CLAIMS_READ_S)

    def trained_first_round(self) -> None:
        """Our claim now says we have trained a round, so we may reduce. Stored before our next send, on the training
        thread (once per run): peers that read it late would pick another reducer than we do, a split round. Claims
        are read for a send no sooner than ROUND1_SETTLE_S later, so that the renewals of peers that finished round 1
        with us land first; we train meanwhile (this used to be a pause of the training loop: 2 % of a short run)."""
        if self.chores is None:  # offline
            return
        self.renew()
        self._read_not_before = time.monotonic() + ROUND1_SETTLE_S
        if self.claims is not None:  # a read started before this would serve the send with the views not yet settled
            self.claims.drop_prefetch()

    def refresh_for_send(self, timeout_s: float | None = None) -> None:
        """Read the claims where a round is sent, once `trained_first_round` allows: every member picks the reducer
        from a view this fresh, so views agree when membership changes."""
        self.stop_event.wait(max(0.0, self._read_not_before - time.monotonic()))
        self.refresh(timeout_s)

    def prefetch_for_send(self, timeout_s: float | None = None) -> None:
        """Start the read of the claims the next `refresh_for_send` uses (Claims.prefetch), if it may read by then."""
        if self.claims is not None and time.monotonic() >= self._read_not_before:
            self.claims.prefetch(timeout_s)

    def refresh(self, timeout_s: float | None = None) -> None:
        """Read the claims (past timeout_s the last view serves: counted as a late read)."""
        if self.claims is not None and not self.claims.refresh_for_send(timeout_s):
            self.status.claims_late()

    def stop_heartbeat(self) -> None:
        if self.heartbeat is not None:
            self.heartbeat.join(timeout=10)

    def withdraw(self) -> None:
        """Take our claim off the DHT (once the chores thread is done: no renewal may store it again)."""
        try:
            if self.claims is not None:
                self.claims.withdraw()
        except Exception as e:
            logger.warning("could not withdraw the claim: %s", e)
