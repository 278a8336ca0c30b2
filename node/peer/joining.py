"""Which swarm a node joins, and as whom: `--swarm FILE`, `--swarm public`, `--join ID`; identity and membership.

- `--swarm FILE`: the spec is the file.
- `--join ID --initial-peer ADDR…`: the spec is fetched from the swarm (protocol/spec_share.py),
  accepted only if its id is ID, and cached in the data directory (`swarms/<id>.toml`), so a restart
  does not depend on the peer that served it.
- `--swarm public`: the public swarm's id and initial peers come from `bootstrap/public_swarm.toml`
  (data, updated without code changes; $PATHSWARM_PUBLIC_SWARM points at another copy); `--initial-peer`
  overrides its peers.
- A private swarm needs `--membership CERT`: checked here against the spec's owner key and this node's
  peer id before anything starts, so a wrong or expired certificate is one clear line, not a silent
  refusal by every peer.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path

from pathswarm.protocol.identity import data_dir, default_node_identity, ensure_identity, peer_id_of_identity
from pathswarm.protocol.spec import SpecError, SwarmSpec, load_spec

PUBLIC_SWARM_FILE = Path(__file__).resolve().parent.parent / "bootstrap" / "public_swarm.toml"


class JoinError(ValueError):
    """The swarm to join cannot be determined or reached; the message says what to do."""


@dataclass(frozen=True)
class PublicSwarm:
    swarm_id: str
    initial_peers: tuple[str, ...]
    note: str
    source: Path


def public_swarm_file() -> Path:
    env = os.environ.get("PATHSWARM_PUBLIC_SWARM")
    if env:
        return Path(env)
    try:  # installed package: the file ships inside pathswarm.bootstrap
        from importlib.resources import files

        shipped = Path(str(files("pathswarm.bootstrap") / "public_swarm.toml"))
        if shipped.is_file():
            return shipped
    except (ModuleNotFoundError, TypeError):
        pass
    return PUBLIC_SWARM_FILE


def load_public_swarm(path: Path | None = None) -> PublicSwarm:
    path = path or public_swarm_file()
    try:
        table = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise JoinError(f"cannot read the public swarm file {path}: {e}") from None
    swarm_id = table.get("swarm_id", "")
    peers = table.get("initial_peers", [])
    if not isinstance(swarm_id, str) or not isinstance(peers, list) or not all(isinstance(p, str) for p in peers):
        raise JoinError(f"{path}: swarm_id must be a string and initial_peers a list of multiaddrs")
    return PublicSwarm(swarm_id.strip().lower(), tuple(peers), str(table.get("note", "")), path)


def cached_spec_path(swarm_id: str) -> Path:
    return data_dir() / "swarms" / f"{swarm_id}.toml"


def _cached_spec(swarm_id: str) -> SwarmSpec | None:
    path = cached_spec_path(swarm_id)
    if not path.is_file():
        return None
    try:
        spec = load_spec(path)
    except SpecError:
        return None
    return spec if spec.swarm_id == swarm_id else None


def _save_cached_spec(spec: SwarmSpec) -> None:
    path = cached_spec_path(spec.swarm_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")  # nodes joining at once each write their own
    tmp.write_text(spec.to_toml(), encoding="utf-8")
    os.replace(tmp, path)


def fetch_spec_via_dht(swarm_id: str, initial_peers: tuple[str, ...], timeout_s: float = 20.0) -> SwarmSpec:
    """Start a short-lived DHT client, ask the swarm for its spec, stop it (a NetStartError if it cannot start)."""
    from pathswarm.protocol.net import start_net
    from pathswarm.protocol.netloop import NetLoop
    from pathswarm.protocol.spec_share import fetch_spec

    swarm_net = start_net(list(initial_peers), client_mode=True)
    loop = NetLoop("pathswarm-join")
    try:
        streams = loop.run(swarm_net.streams(), 30)
        return loop.run(fetch_spec(streams, swarm_net, swarm_id, initial_peers, timeout_s), 300)
    except ValueError as e:
        raise JoinError(str(e)) from None
    finally:
        loop.stop()
        swarm_net.shutdown()


def resolve_swarm(swarm: str | None, join: str | None,
                  initial_peers: tuple[str, ...]) -> tuple[SwarmSpec, tuple[str, ...]]:
    """(spec, initial peers) for `node run`'s --swarm / --join / --initial-peer options."""
    from pathswarm.protocol.spec_share import check_swarm_id

    if swarm and join and swarm != "public":
        spec = load_spec(swarm)
        if spec.swarm_id != check_swarm_id(join):
            raise JoinError(f"{swarm} defines swarm {spec.swarm_id[:16]}…, not the {join[:16]}… given to --join")
        return spec, initial_peers
    if swarm == "public":
        public = load_public_swarm()
        peers = initial_peers or public.initial_peers
        if not public.swarm_id or not peers:
            raise JoinError(f"no public swarm is listed yet in {public.source}"
                            f"{': ' + public.note if public.note else ''}. Join a swarm you know with "
                            "`--join ID --initial-peer ADDR`, start your own with `pathswarm swarm init` and "
                            "`pathswarm bootstrap`, or set swarm_id and initial_peers in that file (or point "
                            "$PATHSWARM_PUBLIC_SWARM at a copy)")
        join, initial_peers = public.swarm_id, peers
    elif swarm:
        return load_spec(swarm), initial_peers
    if not join:
        raise JoinError("say which swarm to join: --swarm SPEC.toml, --swarm public, or --join SWARM_ID")
    swarm_id = check_swarm_id(join)
    if (cached := _cached_spec(swarm_id)) is not None:
        if not initial_peers:
            raise JoinError("--join needs at least one --initial-peer (the address `pathswarm bootstrap` printed)")
        return cached, initial_peers
    if not initial_peers:
        raise JoinError("--join needs at least one --initial-peer (the address `pathswarm bootstrap` printed)")
    spec = fetch_spec_via_dht(swarm_id, initial_peers)
    _save_cached_spec(spec)
    return spec, initial_peers


def resolve_identity(identity: str | None, membership_file: str | None, spec: SwarmSpec) -> tuple[str, str]:
    """(identity path or '' for a fresh one, membership token or '') for `node run`.

    A private swarm needs a certificate, and a certificate names a peer id, so with a membership the
    node keeps a persistent identity (default: the data directory's `identities/node.key`)."""
    from pathswarm.protocol.membership import MembershipError, verify

    if spec.membership.private and not membership_file:
        raise JoinError(f"swarm {spec.name!r} is private: start with --membership CERT. Show your peer id with "
                        "`pathswarm node id` and ask the swarm's owner for a certificate "
                        "(`pathswarm swarm invite --peer-id ID`)")
    path = Path(identity) if identity else (default_node_identity() if membership_file else None)
    if path is None:
        return "", ""
    ensure_identity(path)
    if not membership_file:
        return str(path), ""
    if not spec.membership.private:
        raise JoinError(f"swarm {spec.name!r} is open (its spec names no owner key): drop --membership")
    try:
        token = Path(membership_file).read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError) as e:
        raise JoinError(f"cannot read the membership certificate {membership_file}: {e}") from None
    peer_id = peer_id_of_identity(path)
    try:
        verify(token, owner_key=spec.membership.owner_key, swarm_id=spec.swarm_id, peer_id=peer_id)
    except MembershipError as e:
        raise JoinError(f"membership {membership_file}: {e} (this node's identity {path} is peer {peer_id})") from None
    return str(path), token
