"""What every part of the round shares on one node: who we are, the spec's bounds, the groups the node last saw.

The reducer's side (reducer.py), the member's side (member.py), the stance handshake (stance.py) and the request
handlers (service.py) each hold the one `Context` of the node's exchange. The node changes what it says only
through the facade's methods (exchange.py), each of which replaces one immutable value here: the network thread
never sees a half-written view.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pathswarm.protocol.clock import MONOTONIC, Clock
from pathswarm.protocol.rounds.outer import OuterState
from pathswarm.protocol.rounds.trust import Trust
from pathswarm.protocol.spec import SwarmSpec
from pathswarm.protocol.wire import Pacer, Traffic

if TYPE_CHECKING:
    from pathswarm.protocol.net import PeerStreams

PROTOCOL_VERSION = "v6"
# v3: results list their merged frames' hashes, which members check (audit.py); v4: a result's contributors are its
# frame list's peers unless it names them, and its reducers may be "=", its contributors sorted (messages.py); rounds
# in slices (slices.py); v5: a result commits to its frame list with one hash and tells each member its own entry
# (frame_list.py `commit_frames`); v6: a check gathers each frame from its own contributor (FramesRequest `only`,
# frame_store.py)
MAX_CLIENTS = 4096  # most client peers remembered (one set entry each)


@dataclass(frozen=True)
class GroupView:
    """What the node last derived from the claims, for the rounds this node reduces."""

    expected: Mapping[str, int] = field(default_factory=dict)
    """Module → contributions that close a round early when `holders` does not name the module (the sync baseline:
    the job's whole world, which only grows)."""
    holders: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Module → its claimants: the reducer's quorum counts those whose contributions it accepts and that are not
    silent (reducer.py `ModuleLog.silent`)."""
    live: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    """Sync baseline: module → {live holder: the round its claim says}. A holder whose claim lapses or restarts
    at a lower round has lost its rank: the open round fails for all."""
    genesis: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Module → who may reduce its round 0, from the claims (no result has named anyone yet)."""
    partners: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Module → the holders we merged it with, and us, sorted: named next by a reducer alone in its round."""


@dataclass
class Context:
    spec: SwarmSpec
    peer_id: str
    numels: Mapping[str, int]
    """Module id → parameter count, from the spec: bounds every message. The exchange passes a `UnitNumels`
    (slices.py), which answers for a module's slices too; iterating it yields the modules."""
    state_of: Callable[[str], OuterState | None]
    """Our state of a module as the node last settled it (read on the network thread; states are immutable)."""
    streams: PeerStreams | None
    """None: offline (the node reduces its own rounds, nothing is served)."""
    trust: Trust
    traffic: Traffic
    clock: Clock = MONOTONIC
    membership: str = ""
    """Our certificate (private swarms): every request we send carries it."""
    sync_world: bool = False
    """Synchronous baseline (benchmarks/chaos.py): a round waits for the job's whole world."""
    client: bool = False
    """We run as a client (protocol/reachability.py): our contributions say so, and we name ourselves last."""
    groups: GroupView = field(default_factory=GroupView)
    clients: set[str] = field(default_factory=set)
    """Peers whose contributions said they are clients: left out of the reducer candidates we name."""
    state_pacer: Pacer | None = None
    """The cap on the upload of the states we serve (`node run --serve-state-mbps`), shared by every download."""
    fresh: set[str] = field(default_factory=set)
    """Modules whose reducer list this process has not seen work yet (it started from a checkpoint or the seed): at
    the head of the list it asks the others before reducing (protocol/rounds/reducers.py, rule 4)."""

    def __post_init__(self) -> None:
        self.fresh = set(self.numels)
        # The protocol's version is in the names: a node of another version is "not serving" to us, cleanly,
        # instead of out of sync every round.
        self.prefix = f"{self.spec.swarm_id[:16]}.{PROTOCOL_VERSION}"

    def name(self, kind: str) -> str:
        """The stream protocol name of a request kind (contribute, state, stance, frames, alert)."""
        return f"pathswarm.{self.prefix}.{kind}"

    def contribution_limit(self, module: str) -> int:
        """The most bytes a member's frame of `module` may have."""
        return self.spec.codec.max_contribution_bytes(self.numels[module])

    def mean_limit(self, module: str) -> int:
        """The most bytes a round's mean of `module` may have."""
        return self.spec.codec.max_mean_bytes(self.numels[module])
