"""The node's configuration (what `pathswarm node run` parses into) and its tunables; its progress record is
node/peer/node_status.py."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
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
    serve_state_mbps: float = 0.0
    """Cap, in megabits per second, on the upload of the module states this node serves to joiners and re-syncing
    peers (0: none): a home uplink keeps room for the node's own rounds. Joiners download a state's parts from all
    its holders at once (protocol/rounds/state_parts.py), so a capped holder slows a joiner less."""
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


ROUND1_SETTLE_S = 1.0
"""After its first round a node reads the claims for a send no sooner than this: see Seat.trained_first_round."""

CLAIMS_READ_S = 1.0
"""How long a decoupled node waits for the claims when it sends a round, before it uses the last view it read."""

PARTIAL_COST_SHARE = 50
"""Saving the round in progress may take at most 1/50 of training time (see PartialRounds.maybe_save)."""
