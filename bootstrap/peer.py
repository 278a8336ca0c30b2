"""A DHT-only bootstrap peer: the stable address new nodes join a swarm through. It trains nothing.

This is the minimal form the local swarm (`pathswarm demo`) and the tests need; persistent identity,
publishing the spec and the join command line belong to the bootstrap issue.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
from pathlib import Path

from pathswarm.protocol.spec import SwarmSpec

logger = logging.getLogger(__name__)


def run_bootstrap(spec: SwarmSpec, host_maddrs: list[str], ready_file: str = "",
                  stop: threading.Event | None = None) -> int:
    """Serve the swarm's DHT until SIGINT/SIGTERM (or `stop`); returns the exit code."""
    from pathswarm.protocol.dht import start_dht

    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
    from pathswarm.protocol.dht import SERVED_TTL_S, announce_served_swarm

    sdht = start_dht([], host_maddrs, spec=spec)
    try:
        announce_served_swarm(sdht, spec)
        maddrs = sdht.visible_maddrs()
        logger.info("bootstrap peer of swarm %s… at %s", spec.swarm_id[:12], " ".join(maddrs))
        if ready_file:
            tmp = Path(ready_file + ".tmp")
            tmp.write_text(json.dumps({"peer_id": sdht.peer_id, "maddrs": maddrs, "pid": os.getpid()}))
            os.replace(tmp, ready_file)
        print(f"join with: pathswarm node run --swarm SPEC --initial-peer {maddrs[0]}", flush=True)
        while not stop.wait(SERVED_TTL_S / 3):
            announce_served_swarm(sdht, spec)
        return 0
    finally:
        sdht.shutdown()
