"""A module's state from the swarm: the newest at start (a peer, else our checkpoint, else the seed init), a
re-sync when our replica is not the group's, and what we serve to others (`local_states`).
"""

from __future__ import annotations

import logging
import time

from pathswarm.node.model.model import unflatten_like
from pathswarm.node.peer.config import NodeStatus
from pathswarm.node.peer.vouch import Vouched, counted_peers, vouched_state
from pathswarm.node.train.checkpoint import Checkpoint, CheckpointError, ModuleState, load_checkpoint
from pathswarm.node.train.outer import state_digest
from pathswarm.node.train.warm_start import InitMismatchError, check_init
from pathswarm.node.train.worker import PathWorker
from pathswarm.protocol.dht import read_module_holders
from pathswarm.protocol.exchange import LocalState, ModuleExchange
from pathswarm.protocol.netloop import NetLoop
from pathswarm.protocol.spec import SwarmSpec

logger = logging.getLogger(__name__)


class StateSync:
    def __init__(self, spec: SwarmSpec, worker: PathWorker, status: NodeStatus, exchange: ModuleExchange,
                 net: NetLoop, sdht=None):
        self.spec, self.worker, self.status = spec, worker, status
        self.exchange, self.net, self.sdht = exchange, net, sdht
        self.local_states: dict[str, LocalState] = {}
        """Module → its state as of our last applied round: what the exchange serves and checks digests against."""

    def publish_local(self, mid: str) -> None:
        st = self.worker.outer[mid]
        digest = st.digest()
        self.local_states[mid] = LocalState(st.round, digest, st.anchor.clone(), st.momentum.clone(), st.reducers)
        self.status.digests[mid] = digest
        self.status.module_rounds[mid] = st.round
        self.status.reducers[mid] = list(st.reducers)

    def initial(self, ckpt: Checkpoint | None, resumed: bool, need_init: bool = False,
                source: str = "seed") -> None:
        """Newest state of every module: from a peer, else our checkpoint (already restored), else `source` (the seed
        init, or the warm start's round 0 loaded from --init). A round we resumed stays on top of a newer anchor, as
        after a re-sync. `need_init`: the spec names a warm start we do not hold: a peer must give us some round of
        every module (its round 0 checked against the spec's digests), within the averaging timeout."""
        deadline = time.monotonic() + self.spec.averaging.timeout_s
        for mid in self.worker.module_ids:
            got = ""
            while True:
                for ann in ([] if self.sdht is None else read_module_holders(self.sdht, self.spec, mid)):
                    if ann.peer_id == self.sdht.peer_id or ann.round < self.worker.outer[mid].round or (
                            ann.round == self.worker.outer[mid].round and not need_init):
                        break
                    if self.download(mid, ann.peer_id, keep_progress=resumed):
                        got = f"peer {ann.peer_id[-8:]} round {self.worker.outer[mid].round}"
                        break
                if got or not need_init:
                    break
                if self.sdht is None or time.monotonic() > deadline:
                    raise InitMismatchError(
                        f"this swarm starts from a warm start (spec [init], {self.spec.init.warm_start_steps} steps) "
                        f"and no peer served module {mid}: pass --init DIR (written by `pathswarm swarm init "
                        f"--warm-start-steps`), or start once a node that holds it is up")
                time.sleep(1.0)
            self.publish_local(mid)
            logger.info("module %s from %s", mid, got or (source if ckpt is None else
                                                          f"checkpoint round {ckpt.modules[mid].round}"))

    def load_init(self, init_dir: str) -> None:
        """Round 0 of a warm-started swarm from `init_dir` (`--init`), every module checked against the spec."""
        init = load_checkpoint(init_dir, self.spec, module_ids=self.worker.module_ids)
        if init.round != 0:
            raise CheckpointError(f"{init_dir}: holds round {init.round}; --init takes round 0")
        for mid in self.worker.module_ids:
            state = init.modules[mid]
            check_init(self.spec, mid, state.flat_weights(), state.momentum)
            self.worker.restore(mid, state)

    def vouched(self, mid: str, claim_holders: list[str]) -> Vouched | None:
        """The later state of `mid` a strict majority of its counted holders announce (node/peer/vouch.py), or None."""
        me, mine = self.status.peer_id, self.worker.outer[mid]
        announced = [(a.peer_id, a.round, a.digest) for a in read_module_holders(self.sdht, self.spec, mid)]
        merged = {p for members in self.status.groups.get(mid, {}).values() for p in members}
        got = vouched_state(announced, me, mine.round, counted_peers(merged, claim_holders, me))
        if got is None:
            logger.warning("module %s: a peer says our round %d is behind, but no majority of the module's holders "
                           "announces a later state; not re-syncing", mid, mine.round)
        return got

    def download(self, mid: str, peer: str, keep_progress: bool = False,
                 expect: tuple[int, str] | None = None) -> bool:
        """Adopt `peer`'s state of `mid` if it matches its own digest (and is `expect`'s (round, digest) when
        given: a state a majority vouched for); keep_progress: our local steps since our anchor stay on top."""
        timeout_s = self.spec.averaging.timeout_s
        got = self.net.run(self.exchange.fetch_state(peer, mid, timeout_s), timeout_s + 5)
        if got is None:
            return False
        if state_digest(got.anchor, got.momentum, got.round) != got.digest:
            logger.warning("state of %s from %s fails its digest; ignored", mid, peer[-8:])
            return False
        if expect is not None and (got.round, got.digest) != tuple(expect):
            logger.warning("state of %s from %s is round %d %s, not the vouched round %d %s; ignored", mid,
                           peer[-8:], got.round, got.digest, *expect)
            return False
        if got.round == 0:
            try:
                check_init(self.spec, mid, got.anchor, got.momentum)
            except InitMismatchError as e:
                logger.warning("round 0 of %s from %s is not the swarm's: %s; ignored", mid, peer[-8:], e)
                return False
        anchor = got.anchor
        old_anchor = self.worker.outer[mid].anchor.clone()
        progress = self.worker.flat(mid) - old_anchor if keep_progress else None
        weights = unflatten_like(self.worker.model.module(mid).state_dict(), anchor)
        state = ModuleState(weights=weights, momentum=got.momentum, round=got.round, reducers=got.reducers)
        self.worker.restore(mid, state)
        self.worker.feedback[mid].reset()
        self.net.loop.call_soon_threadsafe(self.exchange.forget_pending, mid)
        if progress is not None:
            self.worker.set_flat(mid, anchor + progress)
        return True
