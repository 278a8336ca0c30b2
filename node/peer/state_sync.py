"""A module's state from the swarm: the newest at start (a peer, else our checkpoint, else the seed init), a
re-sync when our replica is not the group's, and what we serve to others (`local_states`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from pathswarm.logs import human_bytes
from pathswarm.node.model.model import unflatten_like
from pathswarm.node.peer.node_status import NodeStatus
from pathswarm.node.peer.resyncs import Resyncs
from pathswarm.node.peer.vouch import Announced, Vouched, counted_peers, majority_state, voted_out, vouched_state
from pathswarm.node.train.checkpoint import Checkpoint, CheckpointError, ModuleState, load_checkpoint
from pathswarm.node.train.warm_start import InitMismatchError, check_init
from pathswarm.node.train.worker import PathWorker
from pathswarm.protocol.dht import read_module_holders, read_modules_holders
from pathswarm.protocol.netloop import Interrupted, NetLoop
from pathswarm.protocol.records import ModuleAnnouncement
from pathswarm.protocol.rounds.context import MAX_CLIENTS
from pathswarm.protocol.rounds.exchange import ModuleExchange
from pathswarm.protocol.rounds.outer import OuterState
from pathswarm.protocol.rounds.reducers import list_digest
from pathswarm.protocol.rounds.state_parts import transfer_deadline_s
from pathswarm.protocol.spec import SwarmSpec

logger = logging.getLogger(__name__)

PROGRESS_LOG_S = 10.0
"""How often a state download in progress logs how far it got."""


class StateSync:
    def __init__(self, spec: SwarmSpec, worker: PathWorker, status: NodeStatus, exchange: ModuleExchange,
                 net: NetLoop, sdht=None, stop: threading.Event | None = None):
        self.spec, self.worker, self.status = spec, worker, status
        self.exchange, self.net, self.sdht = exchange, net, sdht
        self.stop = stop or threading.Event()
        """Set when the node is asked to stop: a download in progress is given up at once (netloop.Interrupted)."""
        self.local_states: dict[str, OuterState] = {}
        """Module → its state as of our last applied round: what the exchange serves and checks digests against."""
        self._checks: dict[str, tuple[float, float]] = {}  # module → (first check, next check) of a re-sync check
        self.clients: set[str] = set()
        """Announcers that cannot be dialed (their announcements say so): never asked for state."""
        self.votes: dict[str, tuple[str, ...]] = {}
        """Announcer → the peers its latest announcement says it caught lying (node/peer/vouch.py `voted_out`)."""
        self.voters: set[str] = set()
        """The claims' holders of all our modules at start: whose votes count while we have no history."""
        self.replaced: Callable[[str, tuple[int, dict[int, str]], Vouched], None] | None = None
        """Called after a re-sync replaced a module's state: (module, `ours` before it, the state adopted). The node
        counts there the work of ours the new state does not hold (node/peer/splits.py `Splits.replaced`)."""

    def publish_local(self, mid: str) -> None:
        st = self.worker.outer[mid]  # immutable: the exchange serves this very object (no copy)
        digest = st.digest()
        self.local_states[mid] = st
        self.status.module_published(mid, st.round, digest, st.reducers)
        self.status.chain_moved(mid, st.round, digest, list_digest(st.reducers))  # announced: node/peer/announce.py

    def initial(self, ckpt: Checkpoint | None, resumed: bool, need_init: bool = False,
                source: str = "seed", holders: Callable[[str], dict[str, int]] = lambda mid: {}) -> None:
        """Newest state of every module that the swarm vouches for: from a peer, else our checkpoint (already
        restored), else `source` (the seed init, or the warm start's round 0 loaded from --init). A round we resumed
        stays on top of a newer anchor, as after a re-sync. `need_init`: the spec names a warm start we do not hold: a
        peer must give us some round of every module (round 0 checked against the spec's digests), within the
        averaging timeout. `holders(mid)`: the module's holders in the claims → the round each claims.

        No state on one peer's word (docs/SECURITY.md): a later round is adopted only if a strict majority of the
        module's claim holders that announce it (those that claim a trained round, when some do) announce the same
        (round, digest), and the bytes hash to it; announcements of one module can lag a round behind each other, so
        we look again for up to a grace window before starting from what we have (a "behind" answer in our first
        round re-syncs us then, by the same rule)."""
        deadline = time.monotonic() + self.spec.averaging.timeout_s
        patience = time.monotonic() + self.spec.averaging.grace_s
        # Every module's announcements before the first is counted: whom the holders of any module of ours say they
        # caught lying counts for all of them. A module's first attempt below uses this read while it is fresh.
        self.voters = {p for mid in self.worker.module_ids for p in holders(mid)}
        first = {} if self.sdht is None else read_modules_holders(self.sdht, self.spec, list(self.worker.module_ids))
        read_at = time.monotonic()
        for anns in first.values():
            self.note_announcements(anns)
        logger.info("syncing %s: the newest state the module's holders vouch for", ", ".join(self.worker.module_ids))
        for mid in self.worker.module_ids:
            got = ""
            while True:
                anns = first.pop(mid, None)
                if anns is None or time.monotonic() - read_at > 1.0:
                    anns = [] if self.sdht is None else read_module_holders(self.sdht, self.spec, mid)
                got = self._adopt_vouched(mid, anns, holders(mid), resumed)
                if not got and need_init:
                    got = self._adopt_round0(mid, anns)
                ahead = any(a.round > self.worker.outer[mid].round for a in anns if a.peer_id != self.status.peer_id)
                if got or not (need_init or (ahead and time.monotonic() < patience)):
                    break
                if self.sdht is None or time.monotonic() > deadline:
                    raise InitMismatchError(
                        f"this swarm starts from a warm start (spec [init], {self.spec.init.warm_start_steps} steps) "
                        f"and no peer served module {mid}: pass --init DIR (written by `pathswarm swarm init "
                        f"--warm-start-steps`), or start once a node that holds it is up")
                if self.stop.wait(1.0):
                    raise Interrupted(f"stopping before module {mid} was synced")
            self.publish_local(mid)
            logger.info("module %s from %s", mid, got or (source if ckpt is None else
                                                          f"checkpoint round {ckpt.modules[mid].round}"))

    def _adopt_vouched(self, mid: str, anns, claimed: dict[str, int], resumed: bool) -> str:
        """At start, with no history of our own: the claims' holders count, less those most holders of our modules
        announce they caught lying (`note_announcements`)."""
        me, mine = self.status.peer_id, self.worker.outer[mid]
        self.note_announcements(anns)
        seasoned = {p for p, r in claimed.items() if r > 0}
        counted = counted_peers(seasoned, claimed, me, self.caught() | self.exchange.voted_out)
        got = vouched_state([Announced.of(a) for a in anns], me, mine.round, counted)
        if got is None:
            return ""
        if self.download_parts(mid, got, keep_progress=resumed):
            return f"{len(got.peers)} holders in parts, round {got.round} (announced by {len(got.peers)} of them)"
        for peer in got.peers:
            if self.download(mid, peer, keep_progress=resumed, expect=got):
                return f"peer {peer[-8:]} round {got.round} (announced by {len(got.peers)} of its holders)"
        return ""

    def _adopt_round0(self, mid: str, anns) -> str:
        """A warm start's round 0 from any announcer: its bytes must hash to the spec's digest (`download`)."""
        self.note_announcements(anns)
        for a in anns:
            if a.peer_id != self.status.peer_id and a.round == 0 and self.download(mid, a.peer_id):
                return f"peer {a.peer_id[-8:]} round 0 (the spec's digest)"
        return ""

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
        announced, me, counted = self.announced(mid, claim_holders)
        return vouched_state(announced, me, self.worker.outer[mid].round, counted)

    def announced(self, mid: str, claim_holders: list[str],
                  anns: list[ModuleAnnouncement] | None = None) -> tuple[list[Announced], str, set[str]]:
        """(announcements of `mid` (read now unless given), us, the peers whose announcements count)."""
        me = self.status.peer_id
        if anns is None:
            anns = read_module_holders(self.sdht, self.spec, mid)
        self.note_announcements(anns)
        announced = [Announced.of(a) for a in anns]
        # list(): one step under the GIL, so the chores thread (split watch) reads it while the training thread adds
        merged = {p for members in list(self.status.groups.get(mid, {}).values()) for p in members}
        caught = self.caught()
        if not merged - {me}:  # no history of this module yet: the claims count, less whom most holders caught
            caught |= voted_out(self.votes, self.voters | set(claim_holders), me)
        return announced, me, counted_peers(merged, claim_holders, me, caught)

    def caught(self) -> set[str]:
        """The peers we caught lying, as of now: the exchange's own list. Not the status file's copy, refreshed only at
        the next poll: the split watch, counting a liar caught in between, adopted its lied state (a tie of one holder
        against it, broken by the smaller digest: benchmarks/hostile.py `late-liar-huge`)."""
        return set(self.exchange.distrusted)

    def behind(self, mid: str, claim_holders: list[str], resyncs: Resyncs) -> None:
        """A contribution claimed a later round of `mid` than ours: re-sync only to a state a majority vouches for."""
        got = self.vouched(mid, claim_holders)
        if got is None:
            logger.warning("module %s: a peer says our round %d is behind, but no majority of the module's holders "
                           "announces a later state; not re-syncing", mid, self.worker.outer[mid].round)
            return
        resyncs.request_from(mid, got.peers[0], got)

    def resync(self, resyncs: Resyncs, holders: Callable[[str], list[str]]) -> None:
        """The re-syncs asked for (node/peer/resyncs.py). A reducer's word that we are out of sync (a check) is
        checked against the module's announcements once a second (they land as the group's members finish the
        round) until a majority vouches for another state, or for one averaging timeout: then we keep ours."""
        now = time.monotonic()
        for mid, hint in resyncs.checks():
            since, next_try = self._checks.setdefault(mid, (now, now))
            if now < next_try:
                continue
            mine = self.local_states.get(mid)  # its digest is already computed (hashing the state costs ~0.1 s)
            if mine is None:
                continue
            got = majority_state(*self.announced(mid, holders(mid)))
            ours = got is not None and (got.round, got.digest) == (mine.round, mine.digest())
            # A newer state its holders all moved past cannot be downloaded: look again, as when there is none.
            unserved = got is not None and not got.peers
            # No majority yet, or announcements a round behind ours: look again. A majority that announces our own
            # state may still be finishing the round we missed: one grace window, then we believe it. With none, two
            # (the chains make holders a round apart agree: more waiting only stalled the module, issue 27).
            patience = self.spec.averaging.grace_s if ours else min(self.spec.averaging.timeout_s,
                                                                    2 * self.spec.averaging.grace_s)
            if (ours or got is None or unserved or got.round < mine.round) and now - since < patience:
                self._checks[mid] = (since, now + 1.0)
                continue
            resyncs.close_check(mid)
            del self._checks[mid]
            if ours or got is None or unserved or got.round < mine.round:
                logger.warning("module %s: our reducer says our state is not the group's, but %s; keeping ours", mid,
                               "a majority of the module's holders announces ours" if ours else "no majority "
                               "of the module's holders announces another")
                continue
            servers = [p for p in got.peers if p not in self.clients] or list(got.peers)
            resyncs.request_from(mid, hint if hint in servers else servers[0], got)
        for r in resyncs.take():
            before = self.ours(r.module)
            try:
                adopted = self._download_any(r.module, r.peer, r.expect, holders)
            except Interrupted:  # leaving: the next run syncs anyway
                logger.info("re-sync of %s given up: the node is stopping", r.module)
                return
            if adopted is not None and self.replaced is not None:
                self.replaced(r.module, before, adopted)

    def ours(self, mid: str) -> tuple[int, dict[int, str]]:
        """Our state round of `mid` and the (round → digest) of the states we hold and held just before it."""
        mine = self.local_states.get(mid)
        states = {r: d for r, d, _ in self.status.chains.get(mid, ())}
        if mine is None:
            return self.worker.outer[mid].round, states
        return mine.round, states | {mine.round: mine.digest()}

    def _download_any(self, mid: str, peer: str, expect: Vouched | None,
                      holders: Callable[[str], list[str]]) -> Vouched | None:
        """A re-sync's download: from `peer`, then the state's other announcers (one may serve a list the others do
        not hold). When every holder of the vouched state has moved past it meanwhile, the announcements are read
        again, once, and the state a majority vouches for now is downloaded instead. Returns the state adopted (with
        the history its vouchers name; without a vouched state, only the state itself), None if none was."""
        for attempt in range(2):
            if expect is not None and self.download_parts(mid, expect, keep_progress=True):
                logger.info("re-synced %s from %d holders at round %d", mid, len(expect.peers),
                            self.worker.outer[mid].round)
                self.publish_local(mid)
                return expect
            for server in [peer] + [p for p in (expect.peers if expect else ()) if p != peer and p not in self.clients]:
                if self.download(mid, server, keep_progress=True, expect=expect):
                    logger.info("re-synced %s from %s at round %d", mid, server[-8:], self.worker.outer[mid].round)
                    self.publish_local(mid)
                    if expect is not None:
                        return expect
                    got = self.local_states[mid]
                    return Vouched(got.round, got.digest(), (server,), history=((got.round, got.digest()),))
            if expect is None or attempt or self.sdht is None:
                return None
            again = majority_state(*self.announced(mid, holders(mid)))
            if again is None or again.round <= expect.round or not again.peers:
                return None
            expect, peer = again, next((p for p in again.peers if p not in self.clients), again.peers[0])
        return None

    def note_announcements(self, anns) -> None:
        """Remember what announcements say beside the state: announcers that cannot be dialed
        (protocol/reachability.py; never asked for state), and whom each says it caught lying: the peers most of
        `self.voters` name become reducer candidates to skip (`ModuleExchange.set_voted_out`, node/peer/vouch.py)."""
        for a in anns:
            if not a.client:
                self.clients.discard(a.peer_id)  # its latest announcement: it may have become reachable
            elif len(self.clients) < MAX_CLIENTS:
                self.clients.add(a.peer_id)
            if a.peer_id in self.votes or (a.distrusts and len(self.votes) < MAX_CLIENTS):
                self.votes[a.peer_id] = a.distrusts  # its latest word (bounded: one entry per announcer)
        if self.voters:
            self.exchange.set_voted_out(frozenset(voted_out(self.votes, self.voters, self.status.peer_id)))

    def download(self, mid: str, peer: str, keep_progress: bool = False, expect: Vouched | None = None) -> bool:
        """Adopt `peer`'s state of `mid` if it matches its own digest (and is `expect`'s round, digest and, when a
        majority of its announcers agree on one, reducer list: a state a majority vouched for); keep_progress: our
        local steps since our anchor stay on top."""
        if peer in self.clients:  # behind NAT: it vouches for the state, it cannot serve it
            logger.debug("not downloading %s from %s: it cannot be dialed", mid, peer[-8:])
            return False
        if peer in self.exchange.distrusted:  # a proven liar's state is never ours, whoever points at it
            logger.info("not downloading %s from %s: we caught it lying", mid, peer[-8:])
            return False
        timeout_s = self.spec.averaging.timeout_s
        got = self.net.run(self.exchange.fetch_state(peer, mid, timeout_s, expect.round if expect else -1),
                           self._deadline_s(mid), stop=self.stop, tick=self._progress(mid, f"peer {peer[-8:]}"))
        return got is not None and self._adopt(mid, got, peer[-8:], keep_progress, expect)

    def download_parts(self, mid: str, expect: Vouched, keep_progress: bool = False) -> bool:
        """Adopt the state `expect` names, its parts downloaded from all its holders that can be dialed at once
        (protocol/rounds/state_parts.py): a large state does not wait on one holder's uplink. False (nothing
        changed) when fewer than two can serve it or a part cannot be had: the caller then downloads it whole."""
        servers = [p for p in expect.peers if p not in self.clients and p not in self.exchange.distrusted]
        if len(servers) < 2:
            return False
        timeout_s = self.spec.averaging.timeout_s
        got = self.net.run(self.exchange.fetch_state_parts(servers, mid, timeout_s, expect.round, expect.digest),
                           self._deadline_s(mid), stop=self.stop, tick=self._progress(mid, f"{len(servers)} holders"))
        if got is None:
            logger.info("state of %s in parts from %d holders failed; downloading it whole", mid, len(servers))
            return False
        return self._adopt(mid, got, f"{len(servers)} holders", keep_progress, expect)

    def _progress(self, mid: str, source: str) -> Callable[[], None]:
        """A download's progress line every PROGRESS_LOG_S (a large state over a home link takes minutes; the log
        said nothing meanwhile). Counted from what the exchange receives, which is mostly this download then."""
        total = 8 * self.worker.outer[mid].anchor.numel()
        first = self.exchange.traffic.received
        last = (time.monotonic(), first)

        def tick() -> None:
            nonlocal last
            now, received = time.monotonic(), self.exchange.traffic.received
            if now - last[0] < PROGRESS_LOG_S:
                return
            logger.info("state of %s from %s: %s of %s so far (%s/s)", mid, source,
                        human_bytes(min(received - first, total)), human_bytes(total),
                        human_bytes((received - last[1]) / (now - last[0])))
            last = (now, received)

        return tick

    def _deadline_s(self, mid: str) -> float:
        """How long a download of `mid` is waited for: the whole state at the slowest rate waited for (the transfer
        itself gives up sooner when nothing arrives for the averaging timeout)."""
        return transfer_deadline_s(self.spec.averaging.timeout_s, 8 * self.worker.outer[mid].anchor.numel()) + 5

    def _adopt(self, mid: str, got: OuterState, source: str, keep_progress: bool, expect: Vouched | None) -> bool:
        # the fetch checked that the state hashes to the digest its server(s) sent with it
        if expect is not None and (got.round, got.digest()) != (expect.round, expect.digest):
            # A holder that moved on since it announced serves its newer state: normal while a group trains (the
            # announcements lag a round), an INFO; another state at the vouched round or before is worth a WARN.
            logger.log(logging.INFO if got.round > expect.round else logging.WARNING,
                       "state of %s from %s is round %d %s, not the vouched round %d %s; ignored", mid, source,
                       got.round, got.digest(), expect.round, expect.digest)
            return False
        if expect is not None and expect.reducers and list_digest(got.reducers) != expect.reducers:
            logger.warning("state of %s from %s comes with a reducer list its other announcers do not hold; ignored",
                           mid, source)
            return False
        if got.round == 0:
            try:
                check_init(self.spec, mid, got.anchor, got.momentum)
            except InitMismatchError as e:
                logger.warning("round 0 of %s from %s is not the swarm's: %s; ignored", mid, source, e)
                return False
        anchor = got.anchor
        old_anchor = self.worker.outer[mid].anchor.clone()
        progress = self.worker.flat(mid) - old_anchor if keep_progress else None
        weights = unflatten_like(self.worker.model.module(mid).state_dict(), anchor)
        state = ModuleState(weights=weights, momentum=got.momentum, round=got.round, reducers=got.reducers)
        self.worker.restore(mid, state)
        self.worker.feedback[mid].reset()
        self.status.chain_restarted(mid)  # we know no state this one was reached from
        self.net.loop.call_soon_threadsafe(self.exchange.forget_pending, mid, got.round)
        if progress is not None:
            self.worker.set_flat(mid, anchor + progress)
        return True
