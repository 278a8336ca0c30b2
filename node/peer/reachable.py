"""A node's start on the DHT, reachable or as a client (protocol/reachability.py says what a client does).

With `reachability = "auto"` the node joins as a full DHT peer, asks the peers it joined through to dial it back
(until two answered, or one when it joined through one), and when those that answered could not connect (behind
NAT, no forwarded port) it leaves and joins again in client mode, before it has claimed or announced anything.
That costs a second start (2-3 s) on such machines only.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
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


PROBE_S = 30.0
"""The longest the dial-back may take at start, whatever the number of initial peers (then: not measured)."""


def _start(cfg: NodeConfig, spec: SwarmSpec, client_mode: bool) -> SwarmNet:
    return start_net(list(cfg.initial_peers), list(cfg.host_maddrs), spec=spec,
                     identity_path=cfg.identity_path or None, membership=cfg.membership, client_mode=client_mode,
                     announce_maddrs=list(cfg.announce_maddrs) or None)


def dial_back(sdht: SwarmNet, peers: list[str], net: NetLoop) -> bool | None:
    """Ask `peers` (in turn, until two answered) to dial this node back: True when one connected, False when those
    that answered could not, None when nobody answered within PROBE_S. Runs on the node's own network loop (the
    streams object hivemind keeps per DHT lives on the loop that made it)."""
    ports = listen_ports(sdht.visible_maddrs())
    if not ports or not peers:
        return None

    async def go():
        return await probe(await sdht.streams(), peers, ports, want=min(2, len(peers)))

    try:
        return verdict(net.run(asyncio.wait_for(go(), PROBE_S), PROBE_S + 5))
    except (TimeoutError, concurrent.futures.TimeoutError):
        logger.info("no peer answered the dial-back within %.0f s: reachability not measured", PROBE_S)
        return None


def start_node_dht(cfg: NodeConfig, spec: SwarmSpec, net: NetLoop) -> SwarmNet:
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
        sdht.reachable = dial_back(sdht, peer_ids_of(cfg.initial_peers), net)
    except BaseException:
        sdht.shutdown()
        raise
    if sdht.reachable is not False:
        return sdht
    logger.warning("peers cannot dial this node (behind NAT or a firewall, no forwarded port): it runs as a "
                   "client, which trains and contributes to every round but never reduces one nor serves state. "
                   "To serve, forward a port to it and pass --host-maddr /ip4/0.0.0.0/tcp/PORT --announce-maddr "
                   "/ip4/PUBLIC_IP/tcp/PORT")
    sdht.shutdown()
    sdht = _start(cfg, spec, client_mode=True)
    sdht.reachable = False
    return sdht
