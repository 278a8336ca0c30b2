"""Where pathswarm keeps its keys on a user's machine, and the libp2p identities of peers.

A peer's identity (an RSA key in libp2p's protobuf form) fixes its peer id: the bootstrap peer keeps
one per swarm so its multiaddr survives restarts, and a node of a private swarm keeps one because its
membership certificate names that peer id. Keys are created with mode 0600 in the user's data
directory, and one that other users can read is refused.
"""

from __future__ import annotations

import os
from pathlib import Path


def data_dir() -> Path:
    """$PATHSWARM_HOME, else $XDG_DATA_HOME/pathswarm, else ~/.local/share/pathswarm."""
    if os.environ.get("PATHSWARM_HOME"):
        return Path(os.environ["PATHSWARM_HOME"])
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "pathswarm"


def default_node_identity() -> Path:
    return data_dir() / "identities" / "node.key"


def default_owner_key(owner_key: str) -> Path:
    """Where `swarm init --private` keeps the owner key whose public half is `owner_key`."""
    from pathswarm.protocol.membership import owner_key_fingerprint

    return data_dir() / "owners" / f"{owner_key_fingerprint(owner_key)}.key"


def ensure_identity(path: Path) -> Path:
    """Create the identity on first use (mode 0600); refuse one that is unreadable or readable by others."""
    from pathswarm.protocol.net import generate_identity

    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if not path.exists():
        generate_identity(str(path))
        os.chmod(path, 0o600)
    try:
        with open(path, "rb"):
            pass
    except OSError as e:
        raise ValueError(f"identity file {path} is unreadable ({e.strerror})") from None
    if path.stat().st_mode & 0o077:
        raise ValueError(f"identity file {path} is readable by other users; run: chmod 600 {path}")
    return path


def peer_id_of_identity(path: Path) -> str:
    """The peer id (base58) an identity file gives; ValueError if it is not an identity."""
    from pathswarm.protocol.net import peer_id_of_identity_bytes

    try:
        data = path.read_bytes()
    except OSError as e:
        raise ValueError(f"identity file {path} is unreadable ({e.strerror})") from None
    try:
        return peer_id_of_identity_bytes(data)
    except ValueError:
        raise ValueError(f"{path} is not a libp2p identity file") from None
