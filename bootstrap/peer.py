"""A DHT-only bootstrap peer: the stable address new nodes join a swarm through. It trains nothing.

Its identity (an RSA key, hence its peer id) is kept in the user's data directory with mode 0600 and
reused after restarts, so with a fixed `--host-maddr` port its multiaddr stays the same. It announces
which swarm it serves, so a node started with another spec is told so instead of waiting in an
empty swarm, and it serves the spec itself (protocol/spec_share.py), so a machine that knows only
the swarm id and this address joins with `pathswarm node run --join ID --initial-peer ADDR`.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
from pathlib import Path

from pathswarm.protocol.identity import data_dir, ensure_identity
from pathswarm.protocol.spec import SwarmSpec

logger = logging.getLogger(__name__)


def default_identity(spec: SwarmSpec) -> Path:
    return data_dir() / "identities" / f"bootstrap-{spec.swarm_id[:16]}.key"


def run_bootstrap(spec: SwarmSpec, host_maddrs: list[str], ready_file: str = "",
                  stop: threading.Event | None = None, identity: str | None = None,
                  initial_peers: tuple[str, ...] = (), announce_maddrs: tuple[str, ...] = ()) -> int:
    """Serve the swarm's DHT and spec until SIGINT/SIGTERM (or `stop`); returns the exit code.

    `initial_peers`: other bootstrap peers of the swarm to connect to (several can serve one swarm)."""
    from pathswarm.protocol.net import SERVED_TTL_S, start_net

    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
    from pathswarm.protocol.netloop import NetLoop
    from pathswarm.protocol.reachability import DialBackServer
    from pathswarm.protocol.spec_share import SpecServer, announce_spec_server

    identity_path = ensure_identity(Path(identity) if identity else default_identity(spec))
    sdht = start_net(list(initial_peers), host_maddrs, spec=spec, identity_path=str(identity_path),
                     announce_maddrs=announce_maddrs)
    net = NetLoop("pathswarm-bootstrap")

    def announce() -> None:
        sdht.announce_served_swarm(spec)
        announce_spec_server(sdht, spec.swarm_id)

    try:
        streams = net.run(sdht.streams(), 30)
        net.run(SpecServer([spec]).start(streams), 30)
        net.run(DialBackServer().start(streams), 30)  # joiners learn whether peers can dial them
        announce()
        maddrs = sdht.visible_maddrs()
        logger.info("bootstrap peer of swarm %s… at %s", spec.swarm_id[:12], " ".join(maddrs))
        if ready_file:
            tmp = Path(ready_file + ".tmp")
            tmp.write_text(json.dumps({"peer_id": sdht.peer_id, "maddrs": maddrs, "pid": os.getpid()}))
            os.replace(tmp, ready_file)
        print(f"swarm {spec.name} ({spec.swarm_id}); identity {identity_path}", flush=True)
        peers = " ".join(f"--initial-peer {m}" for m in maddrs)
        member = " --membership CERT" if spec.membership.private else ""
        print(f"join with: pathswarm node run --join {spec.swarm_id} {peers}{member}", flush=True)
        if spec.membership.private:
            print("this swarm is private: a node shows its peer id with `pathswarm node id`, and the owner admits it "
                  "with `pathswarm swarm invite --swarm SPEC --peer-id ID -o CERT`", flush=True)
        while not stop.wait(SERVED_TTL_S / 3):
            announce()
        return 0
    finally:
        net.stop()
        sdht.shutdown()
