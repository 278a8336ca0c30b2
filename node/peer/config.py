"""The node's configuration (what `pathswarm node run` parses into), its progress record, and its tunables."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from pathswarm.protocol.spec import SwarmSpec


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
    announce_maddrs: tuple[str, ...] = ()
    """Where other machines reach this node (a forwarded port on a home router); empty: where it listens."""
    checkpoint_dir: str = ""
    """Checkpoint root ('' for none)."""
    init_dir: str = ""
    """Round-0 weights of a warm-started swarm (`swarm init --warm-start-steps` writes them): checked against the
    spec's digests and served to peers. '' : download round 0 from a peer (and check it) when the spec needs it."""
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
    audit_rate: float = 0.2
    """Each round another peer reduced for us is audited with probability min(1, audit_rate / group size), drawn
    from local randomness the reducer cannot predict (node/peer/audit.py): if every member runs the default, a
    group audits one round in five (an audit downloads the round's frames but the auditor's own). The default keeps
    benchmarks/wire.py's goal (≥ 450× fewer bytes sent than fp32 data-parallel at H=100). 0: never audit (alerts
    are still checked)."""
    optimizer: str = ""
    """This node's inner optimizer, "adamw" or "adamw8bit" ("": the spec's [inner] optimizer)."""
    reachability: str = "auto"
    """"auto": ask a peer to dial back and run as a client if it cannot (protocol/reachability.py); "public": serve
    without asking; "client": never be dialed (contribute and download only)."""
    partial_every_s: float = 2.0
    """Save the round in progress (node/partial_round.py) this often at most, and never spend more than
    1/PARTIAL_COST_SHARE of training time on it (0: never; needs checkpoint_dir): a crash then loses seconds of
    training, not the round."""


T = TypeVar("T")


def read_live(read: Callable[[], T], tries: int = 5) -> T:
    """`read()`, which copies parts of a NodeStatus the training thread is changing meanwhile: a copy that meets a
    dict being resized ("dictionary changed size during iteration") is taken again; the last try's error is raised."""
    for _ in range(tries - 1):
        try:
            return read()
        except RuntimeError:
            continue
    return read()


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
    splits_healed: int = 0
    """Rounds we found merged in two versions whose losing version was ours (then re-synced: node/peer/splits.py)."""
    tokens_reduced_discarded: int = 0
    """Tokens of rounds we reduced that a healed split threw away (no longer in tokens_reduced)."""
    tokens_resumed: int = 0
    """Tokens of a round in progress that a previous run of this node saved and this one took over (their steps
    were trained before the restart: tokens_trained counts this round's share of them)."""
    tokens_discarded: int = 0
    """Tokens whose steps were thrown away: only in the sync baseline, when a round failed because a member died
    (a data-parallel job redoes the step from the last good state)."""
    last_group: int = 0
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
    bytes_received: int = 0
    val_loss_before: float = float("nan")
    val_loss_after: float = float("nan")
    rounds_failed: int = 0
    rounds_retried: int = 0
    """Rounds sent again to the next reducer after a check before applying proved theirs a liar."""
    rounds_missed: dict[str, list[int]] = field(default_factory=dict)
    """module → [rounds whose result we got late (our contribution carried on), rounds that failed for us]."""
    train_wall_s: float = 0.0
    """Wall time of the whole training loop (inner steps, waiting and applying included)."""
    digests: dict[str, str] = field(default_factory=dict)
    module_rounds: dict[str, int] = field(default_factory=dict)
    reducers: dict[str, list[str]] = field(default_factory=dict)
    """module → who reduces its next round, in failover order (protocol/reducers.py)."""
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
    audits: int = 0
    """Rounds of other reducers this node recomputed from their frames (node/peer/audit.py)."""
    distrusted: dict[str, str] = field(default_factory=dict)
    """peer → why this node stopped trusting it (a misreported contribution, a mean its frames do not give)."""
    state: str = "starting"


ROUND1_SETTLE_S = 1.0
"""After its first round a node pauses this long, once: see Node._round_complete."""

CLAIMS_READ_S = 1.0
"""How long a decoupled node waits for the claims when it sends a round, before it uses the last view it read."""

PARTIAL_COST_SHARE = 50
"""Saving the round in progress may take at most 1/50 of training time (see PartialRounds.maybe_save)."""
