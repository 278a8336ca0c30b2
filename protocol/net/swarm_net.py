"""A running DHT peer (`SwarmNet`): its id and addresses, DHT time, values under keys and signed subkeys, streams.

`start_net` (protocol/net/start.py) makes one; the node, the joiner and the bootstrap peer use it.
"""

from __future__ import annotations

import concurrent.futures
import re
from collections.abc import Sequence
from functools import partial
from typing import Any

import hivemind
from hivemind.utils import ValueWithExpiration, get_dht_time

from pathswarm.protocol.net.streams import PeerStreams
from pathswarm.protocol.net.validator import peer_id_of_owner
from pathswarm.protocol.records import FIXED_TTL_S, served_key
from pathswarm.protocol.spec import SwarmSpec

SERVED_TTL_S = FIXED_TTL_S
"""How long a bootstrap peer's "I serve swarm X" lasts (it renews it well before)."""


def dht_time() -> float:
    """Seconds since the epoch, as every DHT peer stamps expirations (hivemind's DHT time)."""
    return get_dht_time()



class SwarmNet:
    """A running DHT peer and its p2p daemon, with the owner subkey its records are signed under."""

    def __init__(self, dht: hivemind.DHT, owner: bytes, peer_id: str, membership: str = ""):
        self.dht = dht
        """hivemind's DHT itself: for tests that attack hivemind directly."""
        self.owner = owner
        """`[owner:<ssh-rsa key>]`: the subkey of every record this peer writes."""
        self.peer_id = peer_id
        """This peer's libp2p id (base58), equal to `peer_id_of_owner(self.owner)`."""
        self.membership = membership
        """This peer's membership certificate (private swarms), attached to every record it writes."""
        self.client_mode = False
        """A client answers no DHT requests (it cannot be dialed): protocol/reachability.py."""
        self.reachable: bool | None = None
        """Whether a peer could dial this one back (None: not measured)."""
        self.search_beam: int | None = None
        """How many of the nearest peers a search keeps asking (hivemind's `beam_size`; None: its bucket size)."""

    def visible_maddrs(self) -> list[str]:
        """Multiaddrs other peers can join through (pass them as `initial_peers`)."""
        return [str(m) for m in self.dht.get_visible_maddrs()]

    @staticmethod
    def dht_time() -> float:
        return dht_time()

    def store(self, key: str, value: Any, expires_at: float, subkey: bytes | None = None) -> bool:
        """Store a msgpack-able value under key (and subkey: signed with our key when it is `self.owner`)
        until expires_at (DHT time); True if some peer accepted it."""
        return self.store_many([(key, value, expires_at, subkey)])[0]

    def get(self, key: str, timeout_s: float | None = None) -> Any:
        """The newest value under key, None if there is none; a key written under subkeys gives
        {subkey: value}. Untrusted: whatever a peer stored. With timeout_s, raises TimeoutError when the
        DHT has not answered by then (a lookup that meets a dead peer waits for that peer's RPC timeout)."""
        if timeout_s is None:
            found = self.dht.get(key, latest=True, **_beam(self.search_beam))
        else:
            try:
                found = self.dht.get(key, latest=True, return_future=True,
                                     **_beam(self.search_beam)).result(timeout=timeout_s)
            except concurrent.futures.TimeoutError:
                raise TimeoutError(f"the DHT did not answer within {timeout_s:g} s") from None
        return _unwrap(found)

    def store_many(self, entries: Sequence[tuple[str, Any, float, bytes | None]]) -> list[bool]:
        """Store several (key, value, expires_at, subkey) at once: one search of the DHT for all their keys, where a
        store each searched again (a search asks every peer of a small swarm: `store` per record made the node's
        chores the DHT's main load, growing with the swarm). True per entry that some peer accepted."""
        if not entries:
            return []
        keys, values, expirations, subkeys = (list(col) for col in zip(*entries, strict=True))
        stored = self.dht.run_coroutine(partial(_store_many, keys, values, expirations, subkeys, self.search_beam))
        return [bool(stored.get((k, s) if s is not None else k)) for k, s in zip(keys, subkeys, strict=True)]

    def get_many(self, keys: Sequence[str], timeout_s: float | None = None) -> dict[str, Any]:
        """The newest value under each key (as `get` gives it) in one search of the DHT; TimeoutError past
        timeout_s."""
        if len(keys) <= 1:
            return {key: self.get(key, timeout_s) for key in keys}
        future = self.dht.run_coroutine(partial(_get_many, list(keys), self.search_beam), return_future=True)
        try:
            found = future.result(timeout=timeout_s)
        except concurrent.futures.TimeoutError:
            raise TimeoutError(f"the DHT did not answer within {timeout_s:g} s") from None
        return {key: _unwrap(found.get(key)) for key in keys}

    async def streams(self) -> PeerStreams:
        """Streams to and from peers over this peer's p2pd, for the calling event loop (await it there)."""
        return PeerStreams(await self.dht.replicate_p2p())

    # which swarm a bootstrap peer serves: read by a joiner before anything else
    def announce_served_swarm(self, spec: SwarmSpec) -> bool:
        """A bootstrap peer publishes the id and name of the swarm it serves (renew within SERVED_TTL_S), signed:
        nobody else can make joiners believe it serves another swarm."""
        value = {"swarm_id": spec.swarm_id, "name": spec.name[:200]}
        return self.store(served_key(self.peer_id), value, self.dht_time() + SERVED_TTL_S, subkey=self.owner)

    def served_swarm(self, peer_id: str) -> tuple[str, str] | None:
        """(swarm id, name) a bootstrap peer announced, or None (a plain DHT peer announces nothing). Only the entry
        signed by `peer_id` itself counts (a reader without the swarm's validator checks that here)."""
        found = self.get(served_key(peer_id))
        own = [v for k, v in found.items() if isinstance(k, bytes) and peer_id_of_owner(k) == peer_id] \
            if isinstance(found, dict) else []
        value = own[0] if len(own) == 1 else None
        if not isinstance(value, dict) or not isinstance(value.get("swarm_id"), str):
            return None
        swarm_id, name = value["swarm_id"], value.get("name")
        if not re.fullmatch(r"[0-9a-f]{64}", swarm_id):
            return None
        return swarm_id, name if isinstance(name, str) else ""

    def shutdown(self) -> None:
        self.dht.shutdown()

    def __enter__(self) -> SwarmNet:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()


def _unwrap(found: Any) -> Any:
    """hivemind's answer to a get → the value (a key written under subkeys: {subkey: value})."""
    value = getattr(found, "value", None)
    if isinstance(value, dict) and value and all(isinstance(v, ValueWithExpiration) for v in value.values()):
        return {subkey: item.value for subkey, item in value.items()}
    return value


def _beam(beam: int | None) -> dict[str, int]:
    """hivemind's search option for `SwarmNet.search_beam` (none: its default)."""
    return {} if beam is None else {"beam_size": beam}


# Run in the DHT's process (hivemind's `run_coroutine` pickles them there: module level, arguments bound).
async def _store_many(keys: list, values: list, expirations: list, subkeys: list, beam: int | None, _dht: Any,
                      node: Any) -> dict:
    return await node.store_many(keys, values, expirations, subkeys=subkeys, **_beam(beam))


async def _get_many(keys: list, beam: int | None, _dht: Any, node: Any) -> dict:
    return await node.get_many(keys, sufficient_expiration_time=float("inf"), **_beam(beam))
