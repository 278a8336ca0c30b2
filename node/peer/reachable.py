"""A node's start on the DHT, reachable or as a client (protocol/reachability.py says what a client does).

With `reachability = "auto"` the node joins as a full DHT peer, asks the peers it joined through to dial it back,
and when one answered and none could connect (behind NAT, no forwarded port) it leaves and joins again in client
mode, before it has claimed or announced anything. That costs a second start (2-3 s) on such machines only.
"""

from __future__ import annotations

import logging

from pathswarm.node.peer.config import NodeConfig
from pathswarm.protocol.net import SwarmNet, start_net
from pathswarm.protocol.netloop import NetLoop
from pathswarm.protocol.reachability import listen_ports, probe, verdict
from pathswarm.protocol.spec import SwarmSpec

logger = logging.getLogger(__name__)


def peer_ids_of(maddrs: tuple[str, ...]) -> list[str]:
    """The /p2p/<id> of each initial peer, in order, once each."""
    out: list[str] = []
    for m in maddrs:
        pid = m.rsplit("/p2p/", 1)[1] if "/p2p/" in m else ""
        if pid and pid not in out:
            out.append(pid)
    return out


def _start(cfg: NodeConfig, spec: SwarmSpec, client_mode: bool) -> SwarmNet:
    return start_net(list(cfg.initial_peers), list(cfg.host_maddrs), spec=spec,
                     identity_path=cfg.identity_path or None, membership=cfg.membership, client_mode=client_mode)


def dial_back(sdht: SwarmNet, peers: list[str]) -> bool | None:
    """Ask `peers` (in turn, until one answers) to dial this node back: True, False, or None (nobody answered)."""
    ports = listen_ports(sdht.visible_maddrs())
    if not ports or not peers:
        return None
    net = NetLoop("pathswarm-dialback")
    try:
        async def go():
            return await probe(await sdht.streams(), peers, ports)
        return verdict(net.run(go(), 60))
    finally:
        net.stop()


def start_node_dht(cfg: NodeConfig, spec: SwarmSpec) -> SwarmNet:
    """Join the DHT (a NetStartError, whose message says what to check, when it cannot start; one for an initial
    peer that serves another swarm too), as a client when peers cannot dial us (see the module's docstring)."""
    if cfg.reachability == "client":
        sdht = _start(cfg, spec, client_mode=True)
        sdht.reachable = None
        return sdht
    sdht = _start(cfg, spec, client_mode=False)
    if cfg.reachability == "public":
        return sdht
    try:
        sdht.reachable = dial_back(sdht, peer_ids_of(cfg.initial_peers))
    except BaseException:
        sdht.shutdown()
        raise
    if sdht.reachable is not False:
        return sdht
    logger.warning("peers cannot dial this node (behind NAT or a firewall, no forwarded port): it runs as a "
                   "client, which trains and contributes to every round but never reduces one nor serves state. "
                   "To serve, forward a port to it and pass --host-maddr and --announce-maddr")
    sdht.shutdown()
    sdht = _start(cfg, spec, client_mode=True)
    sdht.reachable = False
    return sdht
