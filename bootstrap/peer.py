"""A DHT-only bootstrap peer: the stable address new nodes join a swarm through. It trains nothing.

Its identity (an RSA key, hence its peer id) is kept in the user's data directory with mode 0600 and
reused after restarts, so with a fixed `--host-maddr` port its multiaddr stays the same. It announces
which swarm it serves, so a node started with another spec is told so instead of waiting in an
empty swarm. Publishing the spec itself and `--join` belong to a later issue.
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


def data_dir() -> Path:
    """Where pathswarm keeps identities: $PATHSWARM_HOME, else $XDG_DATA_HOME/pathswarm, else ~/.local/share."""
    if os.environ.get("PATHSWARM_HOME"):
        return Path(os.environ["PATHSWARM_HOME"])
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "pathswarm"


def default_identity(spec: SwarmSpec) -> Path:
    return data_dir() / "identities" / f"bootstrap-{spec.swarm_id[:16]}.key"


def ensure_identity(path: Path) -> Path:
    """Create the identity on first use (mode 0600); refuse one that is unreadable or readable by others."""
    from hivemind.p2p import P2P

    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if not path.exists():
        P2P.generate_identity(str(path))
        os.chmod(path, 0o600)
    try:
        with open(path, "rb"):
            pass
    except OSError as e:
        raise ValueError(f"identity file {path} is unreadable ({e.strerror})") from None
    if path.stat().st_mode & 0o077:
        raise ValueError(f"identity file {path} is readable by other users; run: chmod 600 {path}")
    return path


def run_bootstrap(spec: SwarmSpec, host_maddrs: list[str], ready_file: str = "",
                  stop: threading.Event | None = None, identity: str | None = None) -> int:
    """Serve the swarm's DHT until SIGINT/SIGTERM (or `stop`); returns the exit code."""
    from pathswarm.protocol.dht import start_dht

    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
    from pathswarm.protocol.dht import SERVED_TTL_S, announce_served_swarm

    identity_path = ensure_identity(Path(identity) if identity else default_identity(spec))
    sdht = start_dht([], host_maddrs, spec=spec, identity_path=str(identity_path))
    try:
        announce_served_swarm(sdht, spec)
        maddrs = sdht.visible_maddrs()
        logger.info("bootstrap peer of swarm %s… at %s", spec.swarm_id[:12], " ".join(maddrs))
        if ready_file:
            tmp = Path(ready_file + ".tmp")
            tmp.write_text(json.dumps({"peer_id": sdht.peer_id, "maddrs": maddrs, "pid": os.getpid()}))
            os.replace(tmp, ready_file)
        print(f"swarm {spec.name} ({spec.swarm_id[:16]}…); identity {identity_path}", flush=True)
        for maddr in maddrs:
            print(f"join with: pathswarm node run --swarm SWARM.toml --initial-peer {maddr}", flush=True)
        while not stop.wait(SERVED_TTL_S / 3):
            announce_served_swarm(sdht, spec)
        return 0
    finally:
        sdht.shutdown()
