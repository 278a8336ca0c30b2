"""Handing a swarm's spec to a machine that knows only the swarm id: `pathswarm node run --join ID`.

Every bootstrap peer and every node serves the specs it holds over a libp2p stream (`SPEC_HANDLER`;
the request names the swarm id) and lists itself in the DHT under `pathswarm/spec-servers/<id>`, so a
joiner whose initial peer is a plain hivemind DHT peer (which serves nothing) still finds a source.
The joiner trusts nobody: it recomputes the id of what it received (sha256 of the canonical spec) and
keeps it only if it equals the id it was given, so a wrong or malicious server costs one retry.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Iterable

from pathswarm.protocol import records
from pathswarm.protocol.net import PeerStreams, SwarmNet, dht_time
from pathswarm.protocol.ratelimit import RateLimiter
from pathswarm.protocol.records import FIXED_TTL_S
from pathswarm.protocol.spec import SpecError, SwarmSpec, loads_spec
from pathswarm.protocol.wire import WireError, read_message, write_message

logger = logging.getLogger(__name__)

SPEC_HANDLER = "pathswarm.spec"
MAX_SPEC_BYTES = 32 << 20
"""Largest spec accepted (a 256-path swarm's router centroids take ~2.6 MB of TOML)."""
SERVER_TTL_S = FIXED_TTL_S
SWARM_ID_RE = re.compile(r"^[0-9a-f]{64}$")


class SpecUnknown(ValueError):
    """A pathswarm peer answered that it does not serve this swarm (a definite answer: no retry)."""


def check_swarm_id(text: str) -> str:
    text = text.strip().lower()
    if not SWARM_ID_RE.match(text):
        raise ValueError(f"a swarm id is 64 hex characters (what `pathswarm swarm id` prints), got {text[:80]!r}")
    return text


def servers_key(swarm_id: str) -> str:
    return records.servers_key(check_swarm_id(swarm_id))


def peer_id_of_maddr(maddr: str) -> str | None:
    """The peer id at the end of a multiaddr (`…/p2p/<id>`), or None."""
    tail = maddr.rsplit("/p2p/", 1)
    return tail[1].strip("/") if len(tail) == 2 and tail[1] else None


class SpecServer:
    """Serves the specs of the swarms this peer belongs to."""

    def __init__(self, specs: Iterable[SwarmSpec]):
        self.texts = {spec.swarm_id: spec.to_toml().encode() for spec in specs}
        self.limiter = RateLimiter(rate=0.5, burst=8)  # a joiner needs one; a spec can be megabytes

    async def start(self, streams: PeerStreams) -> None:
        await streams.serve(SPEC_HANDLER, self._on_request)

    async def _on_request(self, caller: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            if not self.limiter.allow(caller):
                await write_message(writer, {"status": "refused", "reason": "rate limited"})
                return
            header, _ = await read_message(reader, 0)
            swarm_id = header.get("swarm_id")
            text = self.texts.get(swarm_id) if isinstance(swarm_id, str) else None
            if text is None:
                await write_message(writer, {"status": "unknown"})
            else:
                await write_message(writer, {"status": "ok"}, text)
        except (WireError, ConnectionError, asyncio.IncompleteReadError) as e:
            logger.info("spec request from %s failed: %s", caller[-8:], e)
        finally:
            writer.close()


def spec_server_entry(net: SwarmNet, swarm_id: str) -> tuple[str, str, float, bytes]:
    """The store that lists this peer as a server of the swarm's spec (renew within SERVER_TTL_S), for
    `SwarmNet.store_many`."""
    return servers_key(swarm_id), net.peer_id, dht_time() + SERVER_TTL_S, net.owner


def announce_spec_server(net: SwarmNet, swarm_id: str) -> bool:
    """List this peer as a server of the swarm's spec (renew within SERVER_TTL_S)."""
    return bool(net.store_many([spec_server_entry(net, swarm_id)])[0])


def spec_servers(net: SwarmNet, swarm_id: str) -> list[str]:
    """Peer ids that listed themselves as servers of the swarm's spec (unverified: the spec is checked)."""
    value = net.get(servers_key(swarm_id))
    if not isinstance(value, dict):
        return []
    peers = list(value.values())
    return sorted({p for p in peers if isinstance(p, str) and re.fullmatch(r"[0-9A-Za-z]{1,128}", p)})


async def fetch_spec_from(streams: PeerStreams, peer_id: str, swarm_id: str, timeout_s: float) -> SwarmSpec:
    """The spec of `swarm_id` as served by `peer_id`; raises ValueError saying what went wrong."""

    async def go():
        reader, writer = await streams.open(peer_id, SPEC_HANDLER)
        try:
            await write_message(writer, {"swarm_id": swarm_id})
            return await read_message(reader, MAX_SPEC_BYTES)
        finally:
            writer.close()

    try:
        header, payload = await asyncio.wait_for(go(), timeout_s)
    except Exception as e:  # unreachable, no handler (a plain DHT peer), timeout, malformed reply
        raise ValueError(f"{peer_id[-8:]} did not serve it ({type(e).__name__}: {str(e)[:120]})") from None
    if header.get("status") == "refused":
        raise ValueError(f"{peer_id[-8:]} refused: {str(header.get('reason'))[:80]}")
    if header.get("status") != "ok":
        raise SpecUnknown(f"{peer_id[-8:]} does not know swarm {swarm_id[:12]}…")
    try:
        spec = loads_spec(bytes(payload).decode("utf-8"), source=f"spec from {peer_id[-8:]}")
    except (SpecError, UnicodeDecodeError) as e:
        raise ValueError(f"{peer_id[-8:]} served an invalid spec ({str(e)[:160]})") from None
    if spec.swarm_id != swarm_id:
        raise ValueError(f"{peer_id[-8:]} served a spec whose id is {spec.swarm_id[:12]}…, not {swarm_id[:12]}…")
    return spec


async def fetch_spec(streams: PeerStreams, net: SwarmNet, swarm_id: str, initial_peers: Iterable[str],
                     timeout_s: float = 20.0, patience_s: float = 60.0) -> SwarmSpec:
    """Ask the initial peers, then the DHT's listed servers, for the spec; first verified answer wins.

    While no peer serves it (the initial peer is a plain DHT peer and no node has listed itself yet),
    look again every few seconds for `patience_s`. Raises ValueError listing every source tried and why."""
    initial = [p for p in (peer_id_of_maddr(m) for m in initial_peers) if p]
    deadline = asyncio.get_running_loop().time() + patience_s
    while True:
        tried: list[str] = []
        definite = False
        listed = await asyncio.get_running_loop().run_in_executor(None, spec_servers, net, swarm_id)
        for peer in initial + [p for p in listed if p not in initial]:
            try:
                return await fetch_spec_from(streams, peer, swarm_id, timeout_s)
            except SpecUnknown as e:
                tried.append(str(e))
                definite = True
            except ValueError as e:
                tried.append(str(e))
        if listed or definite or asyncio.get_running_loop().time() > deadline:
            break  # listed servers failed, a pathswarm peer said it does not know the swarm, or time is up
        logger.info("no peer serves the spec of swarm %s… yet; looking again", swarm_id[:12])
        await asyncio.sleep(3.0)
    why = "; ".join(tried) if tried else "no peer serves it (none of the initial peers, none listed in the DHT)"
    raise ValueError(f"could not get the spec of swarm {swarm_id[:16]}…: {why}")
