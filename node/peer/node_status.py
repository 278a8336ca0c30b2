"""The node's progress record (`NodeStatus`): the status file, the live display, the dashboard and the
announcements read it; only its methods change it (tests/unit/test_status_owner.py)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from pathswarm.node.peer.counters import Counts

WIRE_TIMES_KEPT = 50
"""Round times on the wire kept per module in the status (NodeStatus.round_wire_s)."""
CHAIN_KEPT = 5
"""States of a module kept in `NodeStatus.chains`: the current one and the ones an announcement names before it
(protocol/records.py MAX_CHAIN)."""
SPLITS_KEPT = 8
"""Healed splits kept in `NodeStatus.heals` (the metrics publish them: protocol/records.py MAX_SPLITS)."""
ROUNDS_KEPT = 256
"""Newest rounds of each module kept in `NodeStatus.groups` and `history`. Unbounded, a volunteer's node running for
weeks wrote a status file that grew by every round (a 16-holder module: ~1 KB a round) each time it wrote it, and
every round read the union of all its rounds' peers (state_sync.py, claims.py `partners_of`). A split heal looks back
a few rounds, replica checks compare the rounds both sides kept, and "peers we merged with" means recently."""
LOSS_POINTS_KEPT = 4096
"""Newest rounds kept in `NodeStatus.loss_curve` and `loss_history` (the dashboard shows fewer)."""


@dataclass
class NodeStatus:
    """The node's progress record: the status file (`--status-file`, the JSON is this record's fields), the live
    display, the dashboard and the announcements read it. One owner: every change goes through the methods below,
    named after what happened (tests/unit/test_status_owner.py checks that no other code assigns a field), and only
    the training thread calls them; other threads only read."""

    peer_id: str = ""
    """This node's libp2p peer id ("offline" without a network; "" before the DHT is joined)."""
    path: str = ""
    """The path this node trains, as "0.1" ("" before it chose one)."""
    round: int = 0
    """Outer rounds this node completed in this run (every module of its path settled: applied, late or failed)."""
    inner_step: int = 0
    """Inner steps this node took (a resumed round in progress continues the count: its warm-up position)."""
    loss: float = float("nan")
    """Training loss of the latest inner step: next-byte cross-entropy in nats per byte."""
    tokens_per_s: float = 0.0
    """Training throughput over the last chunk of inner steps (tokens are bytes)."""
    tokens_trained: int = 0
    """Tokens of the inner steps this node trained, counted as each step ends, over all its runs: a restart from
    its checkpoint directory (same peer id or a new one) continues the count (node/peer/counters.py)."""
    tokens_merged: int = 0
    """Tokens of ours in the shared module's merged rounds (a healed split moves its rounds' to tokens_discarded)."""
    tokens_unmerged: int = 0
    """Tokens trained whose steps are not in a merged round yet (being trained, in flight, or carried over
    from a late or failed round). Every status file holds tokens_trained = tokens_merged + tokens_unmerged +
    tokens_discarded + tokens_lost, restarts included (node/peer/counters.py)."""
    tokens_reduced: int = 0
    """Tokens of the shared module's rounds this node closed as their reducer, over all its runs (summed over the
    swarm: the tokens that entered the model, counted once, including those of members that died before hearing the
    result)."""
    digest_mismatches: int = 0
    """Rounds after which our replica of a module differed from the group's (then re-synced from the reducer)."""
    splits_healed: int = 0
    """Rounds we found merged in two versions whose losing version was ours (then re-synced: node/peer/splits.py)."""
    tokens_reduced_discarded: int = 0
    """Tokens of rounds we reduced that a healed split threw away (no longer in tokens_reduced)."""
    tokens_resumed: int = 0
    """Tokens of a round in progress that a previous run of this node saved and this one took over (its steps and
    the steps it carried): trained by the previous run, which counted them; unmerged until their round merges."""
    tokens_discarded: int = 0
    """Tokens whose steps were thrown away: in the sync baseline, when a round failed because a member died
    (a data-parallel job redoes the step from the last good state), and those of our rounds a healed split lost."""
    tokens_lost: int = 0
    """Tokens an earlier run of this node trained that a restart could not take back (node/peer/counters.py): the
    steps trained after its last save (seen in its last status file; without one they are counted nowhere), the
    outer gradients it had in flight (whether their round merged, the restarted node cannot know: the reducer's
    tokens_reduced counts them if it did), and the unmerged steps of a saved round in progress it could not resume."""
    counters_id: str = ""
    """Names this node's counters across its runs (kept in its checkpoints and saved rounds in progress): a
    restarted node continues the counts of a status file only if it names the same id."""
    last_group: int = 0
    """Members merged in the shared module's last round, this node included."""
    reachable: bool | None = None
    """Whether a peer could dial this node back at start (None: not measured)."""
    client: bool = False
    """Runs as a client (behind NAT): contributes and downloads, never reduces nor serves state."""
    optimizer: str = ""
    """The inner optimizer this node trains with (adamw, adamw8bit)."""
    micro_batch: int = 0
    """Sequences per forward/backward (0: the whole batch); a memory plan or an out-of-memory error lowers it."""
    checkpointing: bool = False
    """Activation checkpointing, when the memory plan needed it."""
    bytes_sent: int = 0
    """Bytes this node wrote to its peers' streams (every message of the rounds, audits and states served)."""
    bytes_received: int = 0
    """Bytes this node read from its peers' streams."""
    val_loss_before: float = float("nan")
    """Validation loss on the documents routed to our path when training began (nats per byte)."""
    val_loss_after: float = float("nan")
    """The same when training stopped (NaN: not stopped yet)."""
    rounds_failed: int = 0
    """Rounds of a module that failed for this node (no result it could apply: its steps carry to the next round)."""
    rounds_retried: int = 0
    """Rounds sent again to the next reducer after a check before applying proved theirs a liar."""
    rounds_missed: dict[str, list[int]] = field(default_factory=dict)
    """module → [rounds whose result we got late (our contribution carried on), rounds that failed for us]."""
    training_since: float = 0.0
    """When the training loop started (Unix time; 0: not yet): benchmarks put a run's clock at zero there."""
    train_wall_s: float = 0.0
    """Wall time of the whole training loop (inner steps, waiting and applying included)."""
    digests: dict[str, str] = field(default_factory=dict)
    """module → digest of our state of it now (anchor, momentum and round)."""
    module_rounds: dict[str, int] = field(default_factory=dict)
    """module → its outer round in our state now (modules advance independently)."""
    reducers: dict[str, list[str]] = field(default_factory=dict)
    """module → who reduces its next round, in failover order (protocol/rounds/reducers.py)."""
    loss_curve: list[float] = field(default_factory=list)
    """Mean training loss of the last inner steps of every round."""
    loss_history: list[tuple[int, float]] = field(default_factory=list)
    """(outer round, that loss): published with the node's metrics for `swarm status --plot`."""
    chunks_trained: int = 0
    """Chunks of inner steps this run has trained (what numbers `loss_history`, which keeps the newest only)."""
    round_wire_s: dict[str, list[list[float]]] = field(default_factory=dict)
    """module → [round, seconds] for its last applied rounds: seconds from sending our outer gradient to the last
    reply (the round on the wire, which the training loop overlaps with the next inner steps)."""
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
    audits: int = 0
    """Rounds of other reducers this node recomputed from their frames (node/peer/audit.py)."""
    audits_gathered: int = 0
    """Of `audits`, those whose frames each came from its own contributor (the others': from the reducer)."""
    distrusted: dict[str, str] = field(default_factory=dict)
    """peer → why this node stopped trusting it (a misreported contribution, a mean its frames do not give)."""
    state: str = "starting"
    """starting (joining, syncing), training, or stopped."""
    rounds_undone: int = 0
    """Rounds of a module undone because a reducer proven a liar reduced them or an earlier kept one
    (protocol/rounds/heal.py): their merged tokens are discarded."""
    anchor_max_abs: dict[str, float] = field(default_factory=dict)
    """module → the largest |value| its anchor took after any round applied in this run: how far a lie moved it
    (benchmarks/hostile.py compares it with a clean run's)."""

    # ---- start and stop ---------------------------------------------------------------------------------------
    def joined_dht(self, reachable: bool | None, client: bool) -> None:
        self.reachable, self.client = reachable, client

    def started_as(self, peer_id: str) -> None:
        self.peer_id = peer_id

    def took_path(self, path: str) -> None:
        self.path = path

    def resumed_checkpoint(self, round_: int) -> None:
        self.checkpoint_round = round_

    def resumed_round(self, resumed_tokens: int, inner_step: int) -> None:
        """A round in progress that our previous run saved was taken over (node/peer/resume.py)."""
        self.tokens_resumed = resumed_tokens
        self.inner_step = inner_step

    def counts_continued(self, counts: Counts) -> None:
        """The counts earlier runs of this node left, its lost tokens counted (node/peer/counters.py `continued`);
        a fresh node's are zero under a new id. tokens_reduced: this run's reductions come on top (`took_stock`)."""
        self.counters_id = counts.counters_id
        self.tokens_trained, self.tokens_merged, self.tokens_discarded = counts.trained, counts.merged, counts.discarded
        self.tokens_lost, self.tokens_reduced = counts.lost, counts.reduced
        self.tokens_reduced_discarded = counts.reduced_discarded

    def counts(self) -> Counts:
        """The counters a checkpoint or a saved round in progress keeps (tokens_reduced as of the last `took_stock`)."""
        return Counts(self.counters_id, trained=self.tokens_trained, merged=self.tokens_merged,
                      discarded=self.tokens_discarded, lost=self.tokens_lost, reduced=self.tokens_reduced,
                      reduced_discarded=self.tokens_reduced_discarded)

    def training_started(self, val_loss_before: float) -> None:
        self.val_loss_before = val_loss_before
        self.training_since = round(time.time(), 3)
        self.state = "training"

    def stopped_starting(self) -> None:
        """Asked to stop before training began (while the path's modules were being synced)."""
        self.state = "stopped"

    def training_stopped(self, train_wall_s: float, val_loss_after: float) -> None:
        self.train_wall_s, self.val_loss_after = train_wall_s, val_loss_after
        self.state = "stopped"

    # ---- the training loop ------------------------------------------------------------------------------------
    def stepped(self, inner_step: int, loss: float, tokens: int) -> None:
        """An inner step of `tokens` tokens ended. They count as trained now, as the worker's round count (hence
        tokens_unmerged) counts them: a status written mid-chunk or just before a kill adds up."""
        self.inner_step, self.loss = inner_step, loss
        self.tokens_trained += tokens

    def chunk_trained(self, losses: list[float], tokens: int, elapsed_s: float, first_round: int) -> None:
        """A chunk of inner steps of `tokens` tokens in all ended (the round's outer gradient is sent next)."""
        self.loss = sum(losses[-10:]) / max(1, len(losses[-10:]))
        self.chunks_trained += 1
        self.loss_curve.append(self.loss)
        # numbered by rounds trained, counted from the round the node started (or resumed) at
        self.loss_history.append((first_round + self.chunks_trained, self.loss))
        del self.loss_curve[:-LOSS_POINTS_KEPT], self.loss_history[:-LOSS_POINTS_KEPT]
        self.tokens_per_s = tokens / max(elapsed_s, 1e-9)

    def spent_on(self, kind: str, seconds: float) -> None:
        """Round work of `kind` took `seconds` of the training loop's time (node/peer/status.py RoundWork)."""
        self.round_work_s[kind] = round(self.round_work_s.get(kind, 0.0) + seconds, 3)

    def waited(self, seconds: float) -> None:
        self.wait_max_s = max(self.wait_max_s, round(seconds, 3))

    def claims_late(self) -> None:
        self.claims_read_late += 1

    def round_complete(self, bytes_sent: int, bytes_received: int) -> None:
        """Every module's round settled: the node's round count moves on."""
        self.round += 1
        self.bytes_sent, self.bytes_received = bytes_sent, bytes_received

    def took_stock(self, tokens_unmerged: int | None, tokens_reduced: int | None,
                   settings: tuple[str, int, bool] | None) -> None:
        """The counts kept elsewhere, as of now (before the status file is written or the counters saved); None: not
        known yet. tokens_reduced: over all runs (earlier runs' count plus this run's exchange's).
        settings: how the node trains (optimizer, micro-batch, checkpointing): a memory plan may have changed it."""
        if tokens_unmerged is not None:
            self.tokens_unmerged = tokens_unmerged
        if tokens_reduced is not None:
            self.tokens_reduced = tokens_reduced
        if settings is not None:
            self.optimizer, self.micro_batch, self.checkpointing = settings

    # ---- rounds and module states (node/peer/rounds.py, state_sync.py, splits.py, audit.py) ---------------------
    def module_published(self, mid: str, round_: int, digest: str, reducers: tuple[str, ...]) -> None:
        """Our state of `mid` changed (a round applied, a re-sync): what we serve and announce."""
        self.digests[mid] = digest
        self.module_rounds[mid] = round_
        self.reducers[mid] = list(reducers)

    def round_settled(self, mid: str, merged_tokens: int, discarded_tokens: int) -> None:
        """A round of `mid` settled, whatever its fate (then `round_applied` or `round_failed`)."""
        self.history.setdefault(mid, {})
        if mid == "shared":
            self.tokens_merged += merged_tokens
            self.tokens_discarded += discarded_tokens

    def round_applied(self, mid: str, state_round: int, digest: str, contributors: list[str], late: bool,
                      diverged: bool, wire_s: float | None = None) -> None:
        """A round's result was applied to `mid`, making state round `state_round` (diverged: our digest is not the
        group's, so the re-sync replaces it and the history does not record it)."""
        if late:
            self.rounds_missed.setdefault(mid, [0, 0])[0] += 1
        if wire_s is not None:
            kept = self.round_wire_s.setdefault(mid, [])
            kept.append([state_round - 1, round(wire_s, 3)])
            del kept[:-WIRE_TIMES_KEPT]
        if diverged:
            self.digest_mismatches += 1
        if mid == "shared":
            self.last_group = len(contributors)
        if not diverged:
            self.history[mid][str(state_round)] = digest
            self.groups.setdefault(mid, {})[str(state_round)] = list(contributors)
            for kept in (self.history[mid], self.groups[mid]):
                if len(kept) > ROUNDS_KEPT:  # no sort on every round: only once the window is full
                    for old in sorted(kept, key=int)[:-ROUNDS_KEPT]:
                        del kept[old]  # one key at a time: another thread's list(...) or dict(...) copy stays whole

    def round_failed(self, mid: str) -> None:
        self.rounds_failed += 1
        self.rounds_missed.setdefault(mid, [0, 0])[1] += 1

    def round_retried(self) -> None:
        self.rounds_retried += 1

    def split_healed(self, mid: str, lost_tokens: int, reduced_tokens: int) -> None:
        """Our version of a split round of `mid` lost: its merged (and reduced) tokens are discarded."""
        if mid == "shared":
            self.tokens_merged -= lost_tokens
            self.tokens_discarded += lost_tokens
            self.tokens_reduced_discarded += reduced_tokens
        self.splits_healed += 1

    def lies_undone(self, mid: str, rounds: int, lost_tokens: int) -> None:
        """`rounds` applied rounds of `mid` were undone after their reducer was proven a liar: our tokens merged in
        them are discarded."""
        if mid == "shared":
            self.tokens_merged -= lost_tokens
            self.tokens_discarded += lost_tokens
        self.rounds_undone += rounds

    def anchor_seen(self, mid: str, max_abs: float) -> None:
        """`mid`'s anchor after a round applied: its largest |value|."""
        self.anchor_max_abs[mid] = max(self.anchor_max_abs.get(mid, 0.0), max_abs)

    def audited(self, gathered: bool = False) -> None:
        self.audits += 1
        self.audits_gathered += gathered

    def distrusting(self, peers: dict[str, str]) -> None:
        """Whom we stopped trusting, and why (a copy of the exchange's list, newest last)."""
        self.distrusted = dict(peers)

    # ---- splits (node/peer/splits.py, state_sync.py, announce.py) ---------------------------------------------
    chains: dict[str, list[list]] = field(default_factory=dict)
    """module → [round, digest, reducer-list digest] of its latest states, each reached from the one before by
    applying a round, oldest first, the current one last (a re-sync starts it afresh): announced with the module
    (`ModuleAnnouncement.chain`), so holders at different rounds can be compared."""
    split_discarded: dict[str, list[int]] = field(default_factory=dict)
    """module → [our tokens merged, tokens we reduced, rounds of ours] a healed split threw away: every module's
    (tokens_discarded and tokens_reduced_discarded count the shared module's only, as the token totals do)."""
    heals: list[list] = field(default_factory=list)
    """[module, the first state round of ours that lost, rounds of the module ours had held it until the heal] of
    the latest healed splits (at most SPLITS_KEPT), oldest first: published with the node's metrics."""

    def chain_moved(self, mid: str, round_: int, digest: str, reducers_digest: str) -> None:
        """`mid` holds a new state: it extends the chain when it is the next round after the current one (a round
        applied), else starts it afresh (a re-sync, a heal: we know no predecessor of the state)."""
        chain = self.chains.get(mid, [])
        if not chain or chain[-1][0] + 1 != round_:
            chain = []
        self.chains[mid] = [*chain, [round_, digest, reducers_digest]][-CHAIN_KEPT:]

    def chain_restarted(self, mid: str) -> None:
        """`mid`'s next state is not reached from the current one by a round (a download replaces it)."""
        self.chains.pop(mid, None)

    def split_settled(self, mid: str, first_round: int, rounds: int, lost_tokens: int, reduced_tokens: int) -> None:
        """Our version of `mid` from state round `first_round` on lost a split (`rounds` of our states): its work is
        discarded, for every module. (`split_healed` keeps the shared module's token totals.)"""
        lost = self.split_discarded.setdefault(mid, [0, 0, 0])
        lost[0] += lost_tokens
        lost[1] += reduced_tokens
        lost[2] += rounds
        self.heals = [*self.heals, [mid, first_round, rounds]][-SPLITS_KEPT:]
