"""A pathswarm node: join the DHT, claim a path, sync its modules, train, average each module with its holders.

The round, as straight code in `Node.train_loop`:
  1. H inner AdamW steps on the documents routed to our path (`PathWorker.train_inner`);
  2. for every module of the path: outer gradient → codec frame (error feedback) → sent to the
     module's reducer for this round (protocol/exchange.py), in the background;
  3. the next H inner steps start at once; when a round's mean lands (checked between inner steps)
     the outer Nesterov step is applied to the anchor and the local weights are *shifted* by the
     anchor's change, so the progress made meanwhile is kept (decoupled, as in Decoupled DiLoCo):
       merged: local ← new_anchor + (local_now − local_when_sent)   (our Δ is in the mean)
       late:   local ← new_anchor + (local_now − old_anchor)         (our Δ stays for next round)
     a failed round applies nothing: the anchor stays, so the next Δ still contains this one;
  4. once every module's round is settled: atomic checkpoint, module announcements, metrics.
Before sending round r+1 the node waits (bounded) for round r's results: one exchange in flight.

SIGINT/SIGTERM: stop at the next inner step, settle or abandon the round in flight, checkpoint the
last complete round, withdraw the claim, exit 0.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from pathswarm.compression import CodecError, decode
from pathswarm.node.model.data import DataSpec, TokenSampler, load_documents, split
from pathswarm.node.model.router import route_many
from pathswarm.node.train.checkpoint import CheckpointError, ModuleState, load_checkpoint, save_checkpoint
from pathswarm.node.train.inner import evaluate_loss
from pathswarm.node.train.outer import OuterState, state_digest
from pathswarm.node.train.worker import PathWorker
from pathswarm.protocol.exchange import RANK_LOST, UNREACHABLE, RoundResult
from pathswarm.protocol.spec import SwarmSpec, format_path, parse_path

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class NodeConfig:
    """Everything `pathswarm node run` needs."""

    spec: SwarmSpec
    initial_peers: tuple[str, ...] = ()
    """Multiaddrs of DHT peers to join (empty: start a new DHT)."""
    path: str = "auto"
    """'auto' (least-served path) or a path like '0.1'."""
    device: str = "auto"
    """'auto' (CUDA when present), 'cpu' or 'cuda'."""
    data_dir: str = ""
    """Train on this directory's .txt/.jsonl documents instead of the spec's corpus."""
    host_maddrs: tuple[str, ...] = ("/ip4/127.0.0.1/tcp/0",)
    """Where p2pd listens."""
    checkpoint_dir: str = ""
    """Checkpoint root ('' for none)."""
    ready_file: str = ""
    """Write a JSON with peer id, addresses and path here once the node trains."""
    status_file: str = ""
    """Rewrite a JSON with the node's progress here after every round."""
    max_rounds: int = 0
    """Stop after this many outer rounds (0: run until stopped)."""
    threads: int = 0
    """torch CPU threads (0: torch's default)."""
    eval_batches: int = 4
    """Validation batches for the loss reported at start and end."""
    seed: int = 0
    """Seed of this node's data stream."""
    wait_peers: int = 0
    """Before training, wait (at most wait_peers_timeout_s) until this many nodes, us included, claim paths."""
    wait_peers_timeout_s: float = 120.0
    """How long to wait for wait_peers before training anyway."""
    offline: bool = False
    """The very same loop with networking switched off (no DHT, no peers): the overhead benchmark's baseline."""
    identity_path: str = ""
    """libp2p identity file (fixes the peer id; '' for a fresh one each run). node/joining.py picks it."""
    membership: str = ""
    """This node's membership certificate (private swarms), already checked against the identity."""
    sync_rounds: bool = False
    """Synchronous baseline for benchmarks/chaos.py: every round waits for every holder ever seen (dead ones
    until they return or timeout_s passes), training waits for the round (no grace window, no overlap), and a
    round in which a member dies fails for everyone, whose steps are thrown away, as data-parallel training does."""
    max_tokens_per_s: float = 0.0
    """Cap on training speed (0: none): a volunteer sharing the machine keeps it responsive, and
    benchmarks/chaos.py makes each node's speed independent of how many others share the CPU."""
    partial_every_s: float = 2.0
    """Save the round in progress (node/partial_round.py) this often at most, and never spend more than
    1/PARTIAL_COST_SHARE of training time on it (0: never; needs checkpoint_dir): a crash then loses seconds of
    training, not the round."""


@dataclass
class _InFlight:
    future: object
    local_when_sent: torch.Tensor
    feedback_before: dict
    tokens: int
    """Tokens behind this outer gradient (this round's, plus any carried from rounds that did not merge)."""
    reducer: str
    """Who reduces the round: the peer to re-sync from if it answers that the group is ahead."""


@dataclass
class NodeStatus:
    peer_id: str = ""
    path: str = ""
    round: int = 0
    inner_step: int = 0
    loss: float = float("nan")
    tokens_per_s: float = 0.0
    tokens_trained: int = 0
    tokens_merged: int = 0
    tokens_unmerged: int = 0
    """Tokens trained whose steps are not in a merged round yet (being trained, in flight, or carried over
    from a late or failed round): tokens_trained = tokens_merged + tokens_unmerged + tokens_discarded, unless
    the node restarted."""
    tokens_reduced: int = 0
    """Tokens of the shared module's rounds this node closed as their reducer (summed over the swarm: the tokens
    that entered the model, counted once, including those of members that died before hearing the result)."""
    digest_mismatches: int = 0
    """Rounds after which our replica of a module differed from the group's (then re-synced from the reducer)."""
    tokens_resumed: int = 0
    """Tokens of a round in progress that a previous run of this node saved and this one took over (their steps
    were trained before the restart: tokens_trained counts this round's share of them)."""
    tokens_discarded: int = 0
    """Tokens whose steps were thrown away: only in the sync baseline, when a round failed because a member died
    (a data-parallel job redoes the step from the last good state)."""
    last_group: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    val_loss_before: float = float("nan")
    val_loss_after: float = float("nan")
    rounds_failed: int = 0
    train_wall_s: float = 0.0
    """Wall time of the whole training loop (inner steps, waiting and applying included)."""
    digests: dict[str, str] = field(default_factory=dict)
    module_rounds: dict[str, int] = field(default_factory=dict)
    loss_curve: list[float] = field(default_factory=list)
    """Mean training loss of the last inner steps of every round."""
    loss_history: list[tuple[int, float]] = field(default_factory=list)
    """(outer round, that loss): published with the node's metrics for `swarm status --plot`."""
    groups: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    """module → outer round → the peers whose outer gradients were merged in that round."""
    history: dict[str, dict[str, str]] = field(default_factory=dict)
    """module → outer round → digest after that round: replicas must agree on every entry."""
    checkpoint_round: int = -1
    """Round of the checkpoint the node resumed from at start (-1: none)."""
    claims_read_late: int = 0
    """Rounds sent with the previous view of the claims because the DHT took over CLAIMS_READ_S to answer."""
    wait_max_s: float = 0.0
    """Longest time the training loop stood still waiting for a round to settle (decoupled: ≈ grace_s at most)."""
    round_work_s: dict[str, float] = field(default_factory=dict)
    """Seconds the training loop spent on round work instead of inner steps, by kind (settle: waiting for the
    previous round; claims: reading who holds the modules; send: encoding outer gradients; checkpoint;
    announce: DHT records; status: the status file). Their sum is the round's cost in training time."""
    state: str = "starting"


class Node:
    def __init__(self, cfg: NodeConfig, handle_signals: bool = False):
        self.cfg = cfg
        self.handle_signals = handle_signals
        self.spec = cfg.spec
        self.stop_event = threading.Event()
        self.status = NodeStatus()
        self.in_flight: dict[str, _InFlight] = {}
        self.local_states: dict = {}
        self.resync_from: dict[str, str] = {}
        # module → tokens whose steps stayed in our local weights without being merged (a late, failed or
        # skipped round): the next outer gradient of that module carries those steps, so it counts them too.
        self.carry: dict[str, int] = {}
        self.catch_up = False  # our last round came late: make the next chunk shorter
        # peer → monotonic time until which we do not pick it as a reducer: it failed a round of ours at the
        # connection level (killed, restarting, frozen). Its claim may stay in the DHT for claim_ttl_s.
        self.unreachable: dict[str, float] = {}
        self._checkpoint = None  # None: not read yet; False: none usable (see _load_checkpoint)
        self._nested_work_s = 0.0  # see _round_work
        self.chores = None  # the DHT chores thread (node/background.py), started with training
        # The last claims read (holders, seasoned, live rounds per module) and the state derived from it (holders,
        # reducers, unreachable): written by the chores thread and by the training thread, so under this lock.
        self._view_lock = threading.Lock()
        self._view: tuple[dict, dict, dict] | None = None
        self._next_partial = 0.0  # perf_counter time of the next save of the round in progress
        self._abandoned = False  # a round's fate is unknown: its steps may or may not be in the swarm's anchor
        self._resumed_steps = 0  # inner steps of the resumed round in progress that the first chunk skips
        self._chunk_tokens = 0  # tokens of the chunk being trained, not yet added to status.tokens_trained
        self._view_started = 0.0  # monotonic time the installed view of the claims was read from
        self._claim_lock = threading.Lock()

    # ---- lifecycle ---------------------------------------------------------------------------
    def install_signal_handlers(self) -> None:
        def handler(signum, frame):
            logger.info("signal %d: finishing the round and leaving the swarm", signum)
            self.stop_event.set()

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)

    def run(self) -> int:
        from pathswarm.protocol.exchange import ModuleExchange
        from pathswarm.protocol.netloop import NetLoop
        from pathswarm.protocol.wire import Traffic

        if self.cfg.threads:
            torch.set_num_threads(self.cfg.threads)
        device = self._device()
        logger.info("training on %s", device)
        spec = self.spec
        clock = _PhaseClock()
        docs = load_documents(DataSpec(corpus="dir", path=self.cfg.data_dir) if self.cfg.data_dir else spec.data)
        train, val = split(docs, spec.data.val_fraction)
        clock.lap("data")
        offline = self.cfg.offline
        if not offline:
            self.sdht = _start_dht_or_explain(self.cfg, spec)
            clock.lap("dht")
        self.net = NetLoop()
        if self.handle_signals:
            # After the DHT process is forked, so it does not inherit our handler (ParentBoundDHT also resets it).
            self.install_signal_handlers()
        try:
            self.status.peer_id = "offline" if offline else self.sdht.peer_id
            if offline:
                path = spec.path_of_index(0) if self.cfg.path == "auto" else parse_path(self.cfg.path, spec)
            elif self.cfg.path == "auto" and (resumed := self._checkpoint_path()) is not None:
                # A restarted node takes its path back without the settling wait: its checkpoint holds that
                # path's modules, and its claim lapsed only moments ago (no other node is likely to have moved in).
                path = resumed
            else:
                path = self._choose_path()
                if self.cfg.path == "auto":
                    path = self._settle_path(path)
            self.status.path = format_path(path)
            clock.lap("path")
            mine = self._routed(train, path)
            clock.lap("routing")
            sampler = TokenSampler(mine, spec.model.context_len, seed=self.cfg.seed)
            self.worker = PathWorker(spec, path, lambda: sampler.sample(spec.inner.batch_size),
                                     name=self.status.peer_id, device=device)
            self.traffic = Traffic()
            numels = {mid: self.worker.outer[mid].anchor.numel() for mid in self.worker.module_ids}
            p2p = None if offline else self.net.run(self.sdht.dht.replicate_p2p(), 30)
            self.exchange = ModuleExchange(spec, p2p, self.status.peer_id, numels, self.local_states.get,
                                           _post_state(spec), self.traffic, membership=self.cfg.membership,
                                           sync_world=self.cfg.sync_rounds)
            self.net.run(self.exchange.start(), 30)
            if not offline:  # any member can hand the spec to a machine joining with --join
                from pathswarm.protocol.spec_share import SpecServer

                self.net.run(SpecServer([spec]).start(p2p), 30)
                self._announce_spec_server()
            if offline:
                self.holders = {mid: [self.status.peer_id] for mid in self.worker.module_ids}
                self.reducers = {mid: self.status.peer_id for mid in self.worker.module_ids}
            else:
                self._claim()
                self._wait_for_peers()
            clock.lap("model+claim")
            self._initial_sync()
            clock.lap("sync")
            val_docs = self._routed(val, path, allow_empty=True) or val
            self.val_batches = list(TokenSampler(val_docs, spec.model.context_len, seed=0)
                                    .eval_batches(spec.inner.batch_size, self.cfg.eval_batches))
            self.status.val_loss_before = evaluate_loss(self.worker.model, self.val_batches)[0]
            clock.lap("eval")
            logger.info("ready %s", clock)
            self._write_ready()
            if not offline:
                from pathswarm.node.peer.background import Chores

                self.chores = Chores()
                self.heartbeat = threading.Thread(target=self._heartbeat, name="pathswarm-heartbeat", daemon=True)
                self.heartbeat.start()
            self.status.state = "training"
            t0 = time.perf_counter()
            self.train_loop()
            self.status.train_wall_s = time.perf_counter() - t0
            self.status.val_loss_after = evaluate_loss(self.worker.model, self.val_batches)[0]
            self.status.state = "stopped"
            self._save()
            self._save_partial()  # after the round checkpoint it builds on: a restart resumes this very round
            self._write_status()
            return 0
        finally:
            self._leave()

    def _device(self) -> str:
        if self.cfg.device == "auto":
            return "cuda" if torch.cuda.is_available() else "cpu"
        if self.cfg.device == "cuda" and not torch.cuda.is_available():
            raise ValueError("--device cuda: no CUDA device is available")
        return self.cfg.device

    def _routed(self, docs, path, allow_empty: bool = False):
        idx = self.spec.index_of_path(path)
        assign = route_many([d.text for d in docs], self.spec.router)
        mine = [d for d, a in zip(docs, assign, strict=True) if int(a) == idx]
        if not mine and not allow_empty:
            raise ValueError(f"no documents are routed to path {format_path(path)} in this corpus")
        return mine

    # ---- path and claims ---------------------------------------------------------------------
    def _load_checkpoint(self):
        """Our checkpoint, validated against the spec, or None (loaded once: the path choice and the sync use it)."""
        if not self.cfg.checkpoint_dir:
            return None
        if self._checkpoint is None:
            try:
                self._checkpoint = load_checkpoint(self.cfg.checkpoint_dir, self.spec)
            except CheckpointError as e:
                logger.info("no usable checkpoint (%s)", e)
                self._checkpoint = False
        return self._checkpoint or None

    def _checkpoint_path(self) -> tuple[int, ...] | None:
        """The path whose modules our checkpoint holds, if it holds exactly one path's."""
        ckpt = self._load_checkpoint()
        if ckpt is None:
            return None
        held = set(ckpt.modules)
        paths = (self.spec.path_of_index(i) for i in range(self.spec.n_paths))
        return next((p for p in paths if set(self.spec.module_ids(p)) == held), None)

    def _choose_path(self) -> tuple[int, ...]:
        from hivemind.utils import get_dht_time

        from pathswarm.protocol.dht import read_claims
        from pathswarm.protocol.path_choice import choose_path

        if self.cfg.path != "auto":
            return parse_path(self.cfg.path, self.spec)
        claims = read_claims(self.sdht, self.spec)
        return tuple(choose_path(self.spec, claims, 0.0, self.sdht.peer_id, get_dht_time()))

    def _settle_path(self, path: tuple[int, ...], wait_s: float = 1.5) -> tuple[int, ...]:
        """Nodes that join at the same moment see the same claims and may pick the same path: claim,
        wait a moment, re-read, and give the path up to a peer with a smaller id if a path is left
        with less service (the peer with the smaller id keeps it, so exactly one of them moves)."""
        from hivemind.utils import get_dht_time

        from pathswarm.protocol.dht import publish_claim, read_claims, withdraw_claim
        from pathswarm.protocol.path_choice import choose_path
        from pathswarm.protocol.records import PathClaim

        claim = publish_claim(self.sdht, self.spec, PathClaim(path=path, peer_id=self.sdht.peer_id, tokens_per_s=0.0,
                                                              round=0, expires_at=0.0))
        self.stop_event.wait(wait_s)
        claims = read_claims(self.sdht, self.spec)
        rivals = [c for c in claims if tuple(c.path) == path and c.peer_id < self.sdht.peer_id]
        if rivals:
            others = [c for c in claims if c.peer_id != self.sdht.peer_id]
            better = tuple(choose_path(self.spec, others, 0.0, self.sdht.peer_id, get_dht_time()))
            if better != path:
                logger.info("path %s is taken by %s; moving to %s", format_path(path), rivals[0].peer_id[-8:],
                            format_path(better))
                if claim is not None:
                    withdraw_claim(self.sdht, self.spec, claim)
                return better
        return path

    def _claim(self) -> None:
        from pathswarm.protocol.dht import publish_claim
        from pathswarm.protocol.records import PathClaim

        with self._claim_lock:  # the training thread (round 1) and the chores thread: one store at a time, in order
            claim = PathClaim(path=self.worker.path, peer_id=self.sdht.peer_id, tokens_per_s=self.status.tokens_per_s,
                              round=self.status.round, expires_at=0.0)
            self.claim = publish_claim(self.sdht, self.spec, claim) or claim
        # At start the first view is worth waiting for; a renewal must not hold the chores thread for long.
        self._refresh_holders(None if self.chores is None else 3 * CLAIMS_READ_S)

    def _refresh_holders(self, timeout_s: float | None = None) -> None:
        """Read the claims from the DHT (seconds if a peer just died; TimeoutError past timeout_s) and derive
        holders and reducers."""
        from pathswarm.protocol.dht import read_claims

        started = time.monotonic()
        claims = read_claims(self.sdht, self.spec, timeout_s=timeout_s)
        me = self.sdht.peer_id
        holders: dict[str, set[str]] = {mid: set() for mid in self.worker.module_ids}
        # Reducer candidates: holders that have completed a round. A node that just joined (its claim
        # says round 0) is not chosen until it has trained a round with the group: otherwise it could
        # reduce a round while still downloading state, and split the group in two.
        seasoned: dict[str, set[str]] = {mid: set() for mid in holders}
        live: dict[str, dict[str, int]] = {mid: {} for mid in holders}
        for c in claims:
            if c.peer_id == me:
                continue  # our own claim may be older than our round: we add ourselves as we are now
            for mid in self.spec.module_ids(tuple(c.path)):
                if mid in holders:
                    holders[mid].add(c.peer_id)
                    live[mid][c.peer_id] = c.round
                    if c.round > 0:
                        seasoned[mid].add(c.peer_id)
        with self._view_lock:
            if started < self._view_started:
                return  # a read that began earlier (and waited on a dead peer) must not replace a fresher view
            self._view, self._view_started = (holders, seasoned, live), started
            self._apply_view()

    def _choose_reducers(self) -> None:
        """Re-derive the reducers from the last claims read, with the peers that failed us since skipped."""
        with self._view_lock:
            if self._view is not None:
                self._apply_view()

    def _apply_view(self) -> None:
        """Holders, reducers and expected group sizes from self._view (held: self._view_lock; no DHT access)."""
        me = self.status.peer_id
        holders = {mid: peers | {me} for mid, peers in self._view[0].items()}
        seasoned = {mid: peers | ({me} if self.status.round > 0 else set()) for mid, peers in self._view[1].items()}
        live = {mid: {**peers, me: self.status.round} for mid, peers in self._view[2].items()}
        self.holders = {mid: sorted(peers) for mid, peers in holders.items()}
        now = time.monotonic()
        self.unreachable = {p: until for p, until in self.unreachable.items() if until > now}
        skip = set(self.unreachable)
        # Every member that lost the reducer skips it alike, so they fail over to the same next holder.
        self.reducers = {mid: min((seasoned[mid] - skip) or (holders[mid] - skip) or {me}) for mid in holders}
        for mid, peers in self.holders.items():
            if self.cfg.sync_rounds:
                # A data-parallel job's world only grows: a dead worker still counts, and the round waits
                # for it to come back (up to timeout_s), as a collective waits for a missing rank.
                self.exchange.expected_holders[mid] = max(len(peers), self.exchange.expected_holders.get(mid, 0))
                self.exchange.live_holders[mid] = live[mid]  # one assignment: the network thread reads it
            else:
                self.exchange.expected_holders[mid] = len(peers)

    def _wait_for_peers(self) -> None:
        if self.cfg.wait_peers <= 1:
            return
        deadline = time.monotonic() + self.cfg.wait_peers_timeout_s
        while not self.stop_event.is_set() and time.monotonic() < deadline:
            self._refresh_holders()
            nodes = len(set().union(*map(set, self.holders.values())) if self.holders else set())
            if nodes >= self.cfg.wait_peers:
                return
            self.stop_event.wait(0.5)
        logger.warning("only some of the %d peers waited for are here; training anyway", self.cfg.wait_peers)

    def _claim_safe(self) -> None:
        try:
            self._claim()
        except Exception as e:  # a DHT hiccup must not kill training; the heartbeat retries
            logger.warning("could not renew the claim: %s", e)

    def _heartbeat(self) -> None:
        # A timer only: the renewal runs on the chores thread, so no two DHT writes of our claim race.
        period = max(1.0, self.spec.averaging.claim_ttl_s / 3)
        while not self.stop_event.wait(period):
            self.chores.submit("claim", self._claim_safe, first=True)

    # ---- state sync --------------------------------------------------------------------------
    def _publish_local(self, mid: str) -> None:
        from pathswarm.protocol.exchange import LocalState

        st = self.worker.outer[mid]
        self.local_states[mid] = LocalState(st.round, st.digest(), st.anchor.clone(), st.momentum.clone())
        self.status.digests[mid] = st.digest()
        self.status.module_rounds[mid] = st.round

    def _initial_sync(self) -> None:
        """Newest state of every module: from a peer, else our checkpoint, else the seed init."""
        from pathswarm.protocol.dht import read_module_holders

        ckpt = self._load_checkpoint()
        if ckpt is not None and not set(self.worker.module_ids) <= set(ckpt.modules):
            logger.info("the checkpoint holds another path's modules (%s); not resuming from it",
                        ", ".join(sorted(ckpt.modules)))
            ckpt = None
        resumed = False
        if ckpt is not None:
            self.status.checkpoint_round = ckpt.round
            for mid in self.worker.module_ids:
                self.worker.restore(mid, ckpt.modules[mid])
            resumed = self._resume_partial()
        for mid in self.worker.module_ids:
            source = "seed" if ckpt is None else f"checkpoint round {ckpt.modules[mid].round}"
            for ann in ([] if self.cfg.offline else read_module_holders(self.sdht, self.spec, mid)):
                if ann.peer_id == self.sdht.peer_id or ann.round <= self.worker.outer[mid].round:
                    break
                # The round we resumed stays on top of the newer anchor, as after a re-sync.
                if self._download(mid, ann.peer_id, keep_progress=resumed):
                    source = f"peer {ann.peer_id[-8:]} round {self.worker.outer[mid].round}"
                    break
            self._publish_local(mid)
            logger.info("module %s from %s", mid, source)

    def _resume_partial(self) -> bool:
        """Take over the round in progress our previous run saved on top of the checkpoint just restored."""
        from pathswarm.node.peer.partial_round import PartialError, load_partial

        if not self._partial_enabled():
            return False
        try:
            got = load_partial(self.cfg.checkpoint_dir, self.spec, self.worker)
        except PartialError as e:
            logger.info("no round in progress to resume (%s)", e)
            return False
        self.carry = dict(got.carry)
        self.status.tokens_trained += got.uncounted_tokens  # trained before the restart, counted by no earlier run
        self.status.tokens_resumed = got.round_tokens + got.carry.get("shared", 0)
        self.status.inner_step = got.inner_step
        self._resumed_steps = got.round_steps
        logger.info("resumed the round in progress: %d tokens of inner steps, inner step %d",
                    self.status.tokens_resumed, got.inner_step)
        return True

    def _download(self, mid: str, peer: str, keep_progress: bool = False) -> bool:
        got = self.net.run(self.exchange.fetch_state(peer, mid, self.spec.averaging.timeout_s),
                           self.spec.averaging.timeout_s + 5)
        if got is None:
            return False
        round_, digest, anchor, momentum = got
        if state_digest(anchor, momentum, round_) != digest:
            logger.warning("state of %s from %s fails its digest; ignored", mid, peer[-8:])
            return False
        old_anchor = self.worker.outer[mid].anchor.clone()
        progress = self.worker.flat(mid) - old_anchor if keep_progress else None
        state = ModuleState(weights=_unflatten(self.worker, mid, anchor), momentum=momentum, round=round_)
        self.worker.restore(mid, state)
        self.worker.feedback[mid].reset()
        self.net.loop.call_soon_threadsafe(self.exchange.forget_pending, mid)
        if progress is not None:
            self.worker.set_flat(mid, anchor + progress)
        return True

    # ---- the round loop ----------------------------------------------------------------------
    def train_loop(self) -> None:
        spec, H = self.spec, self.spec.inner.steps
        rounds_sent, first_round = 0, self.status.round
        while not self.stop_event.is_set():
            t0 = time.perf_counter()
            losses: list[float] = []
            chunk_tokens = self._chunk_tokens = 0
            # A round resumed after a restart (node/partial_round.py) already has some of its steps.
            first, self._resumed_steps = min(self._resumed_steps, H - 1), 0
            for i in range(first, H):
                t_step = time.perf_counter()
                stats = self.worker.train_inner(1)
                losses.extend(stats.losses)
                chunk_tokens += stats.tokens
                self._chunk_tokens = chunk_tokens  # not in tokens_trained yet: a saved round in progress says so
                if self.cfg.max_tokens_per_s > 0:
                    # Pace every step on its own: time lost to a frozen machine is not made up by running faster.
                    ahead = t_step + stats.tokens / self.cfg.max_tokens_per_s - time.perf_counter()
                    if ahead > 0:
                        self.stop_event.wait(ahead)
                self.status.inner_step = self.worker.inner_step
                self.status.loss = losses[-1]
                self._maybe_save_partial()
                if self.worker.inner_step % 10 == 0:
                    with self._round_work("status"):
                        self._write_status()
                self._poll(block=False)
                if self.stop_event.is_set():
                    break
                if self.catch_up and i + 1 >= H // 2:
                    # Our last round came late: a shorter chunk moves our next send earlier, back into the group's
                    # window (a node whose phase drifted, or a slower one, would otherwise stay late every round).
                    self.catch_up = False
                    break
            elapsed = time.perf_counter() - t0
            self.status.loss = sum(losses[-10:]) / max(1, len(losses[-10:]))
            self.status.loss_curve.append(self.status.loss)
            # numbered by rounds trained, counted from the round the node started (or resumed) at
            self.status.loss_history.append((first_round + len(self.status.loss_curve), self.status.loss))
            self.status.tokens_trained += chunk_tokens
            self._chunk_tokens = 0
            self.status.tokens_per_s = chunk_tokens / max(elapsed, 1e-9)
            # Round r-1 must settle before round r is sent. It normally settled while we trained; if its reducer
            # is frozen or slow, a decoupled node stands still for the grace window at most, then trains on: the
            # next outer gradient carries these steps too (sync mode waits, as data-parallel training does).
            with self._round_work("settle"):
                self._poll_timed(None if self.cfg.sync_rounds else spec.averaging.grace_s)
            if self.stop_event.is_set():
                break
            if self.in_flight:
                logger.info("previous round still open after %.0f s: training on", spec.averaging.grace_s)
                continue
            with self._round_work("claims"):
                # Read where the round is sent: every member picks the reducer from a view this fresh, so views
                # agree when membership changes. Decoupled, the read is bounded: a lookup that meets a just-dead
                # peer waits seconds for it, and then the last view (with failed reducers skipped) serves.
                self._refresh_holders_safe(None if self.cfg.sync_rounds else CLAIMS_READ_S)
            with self._round_work("send"):
                self._send_round()
            rounds_sent += 1
            if self.cfg.sync_rounds:
                with self._round_work("settle"):
                    self._poll_timed()  # data-parallel: nobody trains on until the round is done
            if self.cfg.max_rounds and rounds_sent >= self.cfg.max_rounds:
                self._poll(block=True)
                break
        self._poll(block=True, timeout_s=spec.averaging.grace_s)

    @contextlib.contextmanager
    def _round_work(self, kind: str):
        """Count the wall time of a piece of round work done by the training thread (status.round_work_s)."""
        # Work nested inside other work (a round completing while we wait for it) counts once, as its own kind.
        t0, nested_before = time.perf_counter(), self._nested_work_s
        self._nested_work_s = 0.0
        try:
            yield
        finally:
            spent = time.perf_counter() - t0
            work = self.status.round_work_s
            work[kind] = round(work.get(kind, 0.0) + spent - self._nested_work_s, 3)
            self._nested_work_s = nested_before + spent

    def _refresh_holders_safe(self, timeout_s: float | None = None) -> None:
        if self.cfg.offline:
            return
        try:
            self._refresh_holders(timeout_s)
        except TimeoutError as e:
            self.status.claims_read_late += 1
            logger.debug("claims: %s; the last view serves", e)
            self._choose_reducers()
        except Exception as e:  # keep the last view; the round still runs
            logger.warning("could not read claims: %s", e)

    def _send_round(self) -> None:
        if self._partial_enabled():
            # The saved round in progress holds the steps we are about to send: if this round merges and we crash
            # before the next save, resuming it would apply them twice. The next step saves it anew, without them.
            from pathswarm.node.peer.partial_round import discard_partial

            discard_partial(self.cfg.checkpoint_dir)
            self._next_partial = 0.0
        tokens = self.worker.round_tokens
        for mid in self.worker.module_ids:
            if mid in self.resync_from:
                self.carry[mid] = self.carry.get(mid, 0) + tokens  # re-synced keeping our progress
                continue
            st = self.worker.outer[mid]
            feedback_before = self.worker.feedback[mid].state_dict()
            local = self.worker.flat(mid)
            frame = self.worker.encode_pseudo_grad(mid)
            reducer = self.reducers[mid]
            timeout = self.spec.averaging.grace_s + self.spec.averaging.timeout_s
            sent = tokens + self.carry.pop(mid, 0)
            fut = self.net.submit(self.exchange.contribute(reducer, mid, st.round, sent, st.digest(), frame, timeout))
            self.in_flight[mid] = _InFlight(fut, local, feedback_before, sent, reducer)
        self.worker.end_round()

    def _poll_timed(self, timeout_s: float | None = None) -> None:
        """Wait (at most timeout_s; None: the round's own timeout) for the rounds in flight to settle, keeping
        unsettled ones in flight, and record how long training stood still."""
        t0 = time.monotonic()
        if self.cfg.sync_rounds and timeout_s is None:
            # The reducer fails the round when a member dies: it learns that from the claims we read here.
            deadline = t0 + self.spec.averaging.grace_s + self.spec.averaging.timeout_s + 5
            while self.in_flight and not self.stop_event.is_set() and time.monotonic() < deadline:
                self._poll(block=True, timeout_s=1.0, abandon=False)
                if self.in_flight:
                    self._refresh_holders_safe()
            self._poll(block=False, abandon=False)  # settles nothing new; completes the round if it is done
        else:
            self._poll(block=True, timeout_s=timeout_s, abandon=False)
        self.status.wait_max_s = max(self.status.wait_max_s, round(time.monotonic() - t0, 3))

    def _poll(self, block: bool, timeout_s: float | None = None, abandon: bool = True) -> None:
        deadline = time.monotonic() + (timeout_s if timeout_s is not None
                                       else self.spec.averaging.grace_s + self.spec.averaging.timeout_s + 5)
        for mid in list(self.in_flight):
            item = self.in_flight[mid]
            if not item.future.done():
                if not block:
                    continue
                try:
                    item.future.result(max(0.0, deadline - time.monotonic()))
                except Exception:
                    pass
            if not item.future.done() and not abandon:
                continue
            if not item.future.done():
                logger.warning("round of %s still open at shutdown; abandoned", mid)
                self._abandoned = True
                self.in_flight.pop(mid)
                continue
            self.in_flight.pop(mid)
            self._settle(mid, item)
        if not self.in_flight and getattr(self, "_round_dirty", False):
            self._round_complete()
        for mid, peer in list(self.resync_from.items()):
            if self._download(mid, peer, keep_progress=True):
                logger.info("re-synced %s from %s at round %d", mid, peer[-8:], self.worker.outer[mid].round)
                self._publish_local(mid)
            self.resync_from.pop(mid)

    def _settle(self, mid: str, item: _InFlight) -> None:
        result = item.future.result()
        self._round_dirty = True
        st = self.worker.outer[mid]
        logger.debug("module %s round %d: %s with %d contributors (%s)", mid, result.round, result.status,
                     len(result.contributors), result.reason)
        self.status.history.setdefault(mid, {})
        avg = None
        if result.applicable and result.round == st.round:
            try:  # the mean comes from a peer: untrusted bytes
                avg = decode(result.mean_frame, max_elements=st.anchor.numel()).reshape(-1)
                if avg.numel() != st.anchor.numel() or not torch.isfinite(avg).all():
                    raise CodecError("mean of the wrong size or not finite")
            except CodecError as e:
                avg = None
                result = RoundResult(mid, result.round, "failed", reason=f"bad mean from the reducer: {e}")
        if avg is not None:
            old_anchor = st.anchor.clone()
            st.apply(avg, self.spec.outer)
            after = st.digest()
            diverged = bool(result.digest_after) and after != result.digest_after
            if diverged:
                # Our replica is not the group's: the re-sync replaces it, and the history does not record it.
                logger.error("module %s round %d: digest %s != group's %s; re-syncing", mid, result.round,
                             after, result.digest_after)
                self.status.digest_mismatches += 1
                self._resync_later(mid, item.reducer)
            base = item.local_when_sent if result.status in ("merged", "alone") else old_anchor
            self.worker.set_flat(mid, st.anchor + (self.worker.flat(mid) - base))
            if result.status == "late":
                self.worker.feedback[mid].load_state_dict(item.feedback_before)
                self.carry[mid] = self.carry.get(mid, 0) + item.tokens  # our steps are still in the local weights
                self.catch_up = True
            if mid == "shared":
                self.status.last_group = len(result.contributors)
                if result.status in ("merged", "alone"):
                    self.status.tokens_merged += item.tokens
            self._publish_local(mid)
            if not diverged:
                self.status.history[mid][str(st.round)] = after
                self.status.groups.setdefault(mid, {})[str(st.round)] = list(result.contributors)
            return
        self.worker.feedback[mid].load_state_dict(item.feedback_before)
        if self.cfg.sync_rounds and result.reason.startswith(RANK_LOST):
            # Data-parallel: a step that a dead rank broke is redone by everyone from the last good state.
            self.worker.set_flat(mid, st.anchor.clone())
            if mid == "shared":
                self.status.tokens_discarded += item.tokens
        else:
            self.carry[mid] = self.carry.get(mid, 0) + item.tokens  # nothing applied: our steps stay local
        if result.reason.startswith(UNREACHABLE) and item.reducer != self.status.peer_id:
            with self._view_lock:
                self.unreachable[item.reducer] = time.monotonic() + self.spec.averaging.claim_ttl_s
        self.status.rounds_failed += 1
        logger.warning("module %s round %d: %s (%s)", mid, st.round, result.status, result.reason)
        if result.status == "out_of_sync":
            self._resync_later(mid, item.reducer)
        elif result.status == "behind":
            pass  # the reducer re-syncs itself; our outer gradient waits for the next round

    def _resync_later(self, mid: str, peer: str) -> None:
        """Download `mid` from `peer` (the reducer that said the group is elsewhere) at the next poll. Not the
        reducer of the next round: views of who reduces may differ for a moment, and it may be ourselves."""
        if peer != self.status.peer_id:
            self.resync_from[mid] = peer
        else:
            logger.warning("module %s: our own reducer disagrees with our state; waiting for the next round", mid)

    def _round_complete(self) -> None:
        self._round_dirty = False
        self.status.round += 1
        if self.status.round == 1 and self.chores is not None:
            # Our claim now says we have trained a round, so we may reduce. Stored before our next send, on this thread
            # (once per run): peers that read it late would pick another reducer than we do, a split round. The pause
            # (once per run too) lets the renewals of peers that finished round 1 with us land before we read claims.
            self._claim_safe()
            self.stop_event.wait(ROUND1_SETTLE_S)
        self.status.bytes_sent, self.status.bytes_received = self.traffic.sent, self.traffic.received
        for mid, peer in list(self.exchange.behind.items()):
            self.resync_from[mid] = peer
            self.exchange.behind.pop(mid, None)
        with self._round_work("checkpoint"):
            self._save()
        self._next_partial = 0.0  # the saved round in progress was made against the old anchors: renew it next step
        if not self.cfg.offline:
            with self._round_work("announce"):
                self._announce()
        with self._round_work("status"):
            self._write_status()
        logger.info("round %d: loss %.4f, %.0f tok/s, group %d, sent %d B, received %d B", self.status.round,
                    self.status.loss, self.status.tokens_per_s, self.status.last_group, self.status.bytes_sent,
                    self.status.bytes_received)

    # ---- outputs -----------------------------------------------------------------------------
    def _save(self) -> None:
        if self.cfg.checkpoint_dir and hasattr(self, "worker"):
            round_ = max(st.round for st in self.worker.outer.values())
            save_checkpoint(self.cfg.checkpoint_dir, self.spec, round_,
                            {mid: self.worker.module_state(mid) for mid in self.worker.module_ids})

    def _partial_enabled(self) -> bool:
        # The synchronous baseline restarts from the last good state, as a data-parallel job does.
        return bool(self.cfg.checkpoint_dir and self.cfg.partial_every_s > 0 and not self.cfg.sync_rounds)

    def _maybe_save_partial(self) -> None:
        if not self._partial_enabled() or time.perf_counter() < self._next_partial:
            return
        t0 = time.perf_counter()
        with self._round_work("partial"):
            self._save_partial()
        spent = time.perf_counter() - t0
        # At most 1/PARTIAL_COST_SHARE of training time: a big model saves less often than a small one.
        self._next_partial = time.perf_counter() + max(self.cfg.partial_every_s, PARTIAL_COST_SHARE * spent)

    def _save_partial(self) -> None:
        from pathswarm.node.peer.partial_round import save_partial

        if not self._partial_enabled() or not hasattr(self, "worker") or self._abandoned:
            return
        # Steps already sent are not saved: if their round merged, the swarm's anchor holds them already.
        bases = {mid: self.in_flight[mid].local_when_sent if mid in self.in_flight else self.worker.outer[mid].anchor
                 for mid in self.worker.module_ids}
        try:
            save_partial(self.cfg.checkpoint_dir, self.spec, self.worker, bases, self.carry, self._chunk_tokens)
        except Exception as e:  # a full disk must not stop training; the round checkpoint still stands
            logger.warning("could not save the round in progress: %s", e)

    def _announce(self) -> None:
        """Module announcements and metrics as of now; the DHT stores run on the chores thread."""
        from pathswarm.protocol.records import MAX_HISTORY, ModuleAnnouncement, NodeMetrics

        # Built here, from a consistent state: the training thread changes the modules between rounds.
        announcements = [ModuleAnnouncement(module_id=mid, round=st.round, digest=st.digest(),
                                            peer_id=self.sdht.peer_id, numel=st.anchor.numel())
                         for mid, st in ((mid, self.worker.outer[mid]) for mid in self.worker.module_ids)]
        metrics = NodeMetrics(
            path=self.worker.path, peer_id=self.sdht.peer_id, round=self.status.round,
            loss=max(0.0, self.status.loss), tokens_per_s=self.status.tokens_per_s,
            bytes_sent=self.status.bytes_sent, bytes_received=self.status.bytes_received,
            history=tuple((r, max(0.0, min(loss, 1e6))) for r, loss in self.status.loss_history[-MAX_HISTORY:]
                          if loss == loss))
        job = lambda: self._publish_records(announcements, metrics)  # noqa: E731
        if self.chores is None:
            job()
        else:
            self.chores.submit("announce", job)

    def _publish_records(self, announcements: list, metrics) -> None:
        from pathswarm.protocol.dht import announce_module, publish_metrics

        ttl = self.spec.averaging.claim_ttl_s * 4
        try:
            for ann in announcements:
                announce_module(self.sdht, self.spec, ann, ttl)
            publish_metrics(self.sdht, self.spec, metrics, ttl)
            self._announce_spec_server()
        except Exception as e:  # announcements are advisory; training goes on
            logger.warning("could not announce: %s", e)

    def _announce_spec_server(self) -> None:
        from pathswarm.protocol.spec_share import announce_spec_server

        try:
            announce_spec_server(self.sdht.dht, self.spec.swarm_id, self.sdht.peer_id, self.sdht.owner)
        except Exception as e:  # advisory: joiners also ask the initial peers directly
            logger.warning("could not list this node as a spec server: %s", e)

    def _write_ready(self) -> None:
        if self.cfg.ready_file:
            maddrs = [] if self.cfg.offline else self.sdht.visible_maddrs()
            _write_json_atomic(self.cfg.ready_file, {"peer_id": self.status.peer_id, "maddrs": maddrs,
                                                     "path": self.status.path, "pid": os.getpid()})

    def _write_status(self) -> None:
        if hasattr(self, "worker"):
            flight = self.in_flight.get("shared")
            self.status.tokens_unmerged = (self.carry.get("shared", 0) + self.worker.round_tokens
                                           + (flight.tokens if flight else 0))
        if getattr(self, "exchange", None) is not None:
            self.status.tokens_reduced = self.exchange.tokens_reduced.get("shared", 0)
        if self.cfg.status_file:
            _write_json_atomic(self.cfg.status_file, self.status.__dict__)

    def _leave(self) -> None:
        from pathswarm.protocol.dht import withdraw_claim

        self.stop_event.set()
        if hasattr(self, "heartbeat"):
            self.heartbeat.join(timeout=10)
        if self.chores is not None:
            # The last round's announcement goes out (bounded: a store can wait seconds on a dead peer).
            if not (self.chores.wait_idle(timeout_s=5) and self.chores.close(timeout_s=1)):
                self.chores.close(timeout_s=0)
                # Typically the last announcement, meeting peers that are leaving too: advisory, not worth waiting for.
                logger.info("a DHT store is still running; leaving without it")
        try:
            if hasattr(self, "claim"):
                withdraw_claim(self.sdht, self.spec, self.claim)
        except Exception as e:
            logger.warning("could not withdraw the claim: %s", e)
        if hasattr(self, "net"):
            self.net.stop()
            if self.status.state == "stopped":
                self._write_status()  # rounds we closed for others until our network stopped count too
        if hasattr(self, "sdht"):
            self.sdht.shutdown()


ROUND1_SETTLE_S = 1.0
"""After its first round a node pauses this long, once: see Node._round_complete."""

CLAIMS_READ_S = 1.0
"""How long a decoupled node waits for the claims when it sends a round, before it uses the last view it read."""

PARTIAL_COST_SHARE = 50
"""Saving the round in progress may take at most 1/50 of training time (see Node._maybe_save_partial)."""


class NodeError(ValueError):
    """A node cannot start for a reason the user can fix; the message says what to check."""


class _PhaseClock:
    """Wall time of each start-up phase, logged once: a restart's downtime is what this adds up to."""

    def __init__(self):
        self.t0 = self.last = time.perf_counter()
        self.laps: list[tuple[str, float]] = []

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.laps.append((name, now - self.last))
        self.last = now

    def __str__(self) -> str:
        parts = ", ".join(f"{name} {s:.1f} s" for name, s in self.laps)
        return f"in {self.last - self.t0:.1f} s ({parts})"


def _start_dht_or_explain(cfg: NodeConfig, spec: SwarmSpec):
    """Start the DHT peer; turn p2pd's start-up failures into one clear line, and refuse to join a
    bootstrap peer that serves another swarm (its spec id differs from ours)."""
    from pathswarm.protocol.dht import served_swarm, start_dht

    t0 = time.monotonic()
    try:
        sdht = start_dht(list(cfg.initial_peers), list(cfg.host_maddrs), spec=spec,
                         identity_path=cfg.identity_path or None, membership=cfg.membership)
    except Exception as e:  # p2pd and hivemind raise several types for the same few causes
        text = str(e)
        waited = time.monotonic() - t0
        if "address already in use" in text.lower() or "bind" in text.lower():
            raise NodeError(f"cannot listen on {', '.join(cfg.host_maddrs)}: the port is in use; pick another "
                            "--host-maddr port or use port 0") from None
        if cfg.initial_peers and ("bootstrap" in text or "initial" in text or "connect" in text):
            raise NodeError(f"none of the initial peers answered within {waited:.0f} s (tried "
                            f"{', '.join(cfg.initial_peers)}); check that a peer runs there, that the address "
                            "(including its /p2p/ id) is current, and that no firewall blocks it") from None
        raise NodeError(f"the DHT peer did not start: {text.splitlines()[-1] if text else type(e).__name__}") from None
    for maddr in cfg.initial_peers:
        if "/p2p/" not in maddr:
            continue
        served = served_swarm(sdht, maddr.rsplit("/p2p/", 1)[1])
        if served is not None and served[0] != spec.swarm_id:
            sdht.shutdown()
            raise NodeError(f"the peer {maddr} serves swarm {served[1]!r} (id {served[0][:16]}…) but your spec's "
                            f"swarm id is {spec.swarm_id[:16]}…: use that swarm's spec file")
    return sdht


def _post_state(spec: SwarmSpec):
    """The state a module has after applying a round's mean: what the reducer announces as digest_after."""
    from pathswarm.protocol.exchange import LocalState

    def post(state, avg: torch.Tensor):
        copy = OuterState(state.anchor.clone(), state.momentum.clone(), state.round)
        copy.apply(avg.reshape(-1), spec.outer)
        return LocalState(copy.round, copy.digest(), copy.anchor, copy.momentum)

    return post


def _unflatten(worker: PathWorker, mid: str, flat: torch.Tensor) -> dict[str, torch.Tensor]:
    out, offset = {}, 0
    for name, t in worker.model.module(mid).state_dict().items():
        out[name] = flat[offset:offset + t.numel()].view_as(t).clone()
        offset += t.numel()
    return out


def _write_json_atomic(path: str, payload: dict) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=1, default=str), encoding="utf-8")
    os.replace(tmp, p)
