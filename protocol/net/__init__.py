"""The one seam to hivemind: a peer's DHT and the p2p daemon under it (start, stop, values, streams).

`start_net` starts hivemind's DHT process (which runs p2pd), joins `initial_peers` and returns a
`SwarmNet`: this peer's id and addresses, DHT time, plain values stored and read under keys and
signed subkeys, and libp2p streams to other peers (`PeerStreams`). The node, the joiner and the
bootstrap peer all start through it. When the daemon or the DHT cannot start, it raises one of the
`NetStartError`s, whose message tells the user what to check.

This package is the only code that imports hivemind (an import-linter contract in .importlinter checks it):
the rest of pathswarm reaches the network through the names below. By concern:
- start.py: the start chain, its typed errors, the DHT process bound to its parent;
- swarm_net.py: a running peer (`SwarmNet`): values, signed subkeys, the swarm a bootstrap peer serves;
- streams.py: libp2p streams to and from peers (`PeerStreams`);
- identity.py: RSA identity files;
- validator.py: the record validator the DHT process runs (`SwarmRecordValidator`).
"""

from pathswarm.protocol.net.identity import generate_identity, peer_id_of_identity_bytes
from pathswarm.protocol.net.start import (
    LOOPBACK_MADDRS,
    PARENT_POLL_S,
    BadAddressError,
    DaemonStartError,
    NetStartError,
    NoPeerAnsweredError,
    ParentBoundDHT,
    PortInUseError,
    WrongSwarmError,
    _start_error,
    start_net,
)
from pathswarm.protocol.net.streams import PeerStreams, StreamHandler
from pathswarm.protocol.net.swarm_net import SERVED_TTL_S, SwarmNet, dht_time

__all__ = [
    "LOOPBACK_MADDRS",
    "PARENT_POLL_S",
    "SERVED_TTL_S",
    "BadAddressError",
    "DaemonStartError",
    "NetStartError",
    "NoPeerAnsweredError",
    "ParentBoundDHT",
    "PeerStreams",
    "PortInUseError",
    "StreamHandler",
    "SwarmNet",
    "WrongSwarmError",
    "_start_error",
    "dht_time",
    "generate_identity",
    "peer_id_of_identity_bytes",
    "start_net",
]
