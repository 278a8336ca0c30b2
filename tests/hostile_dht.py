"""A hostile DHT writer for tests/swarm/test_hostile.py: test code, never part of the product.

It joins a swarm's DHT as a plain hivemind peer that checks signatures only (so its own storage keeps anything),
writes the records docs/SECURITY.md says honest peers refuse, and leaves: whatever is still readable afterwards
was stored by an honest peer. Writes a JSON report: its peer id, and per attack the key it wrote and whether its
store call said some peer accepted it.

    python -m tests.hostile_dht SPEC INITIAL_PEER REPORT_JSON
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import hivemind
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.utils import get_dht_time
from hivemind.utils.crypto import RSAPrivateKey

from pathswarm.protocol.dht import peer_id_of_owner
from pathswarm.protocol.records import (
    ModuleAnnouncement,
    PathClaim,
    claims_key,
    module_key,
    record_to_wire,
    served_key,
)
from pathswarm.protocol.spec import load_spec

LOOPBACK_ONLY = dict(host_maddrs=["/ip4/127.0.0.1/tcp/0"], use_relay=False, use_auto_relay=False,
                     auto_nat=False, nat_port_map=False, use_ipfs=False)
FAR = 1e7  # seconds ahead: about four months (a claim used to be accepted until the year 5138)


def attacks(spec, me: str, bootstrap: str, now: float) -> dict[str, tuple[str, object, float, bool]]:
    """name → (key, value, expiration, signed)."""
    sid = spec.swarm_id
    claim = PathClaim(path=spec.path_of_index(0), peer_id=me, tokens_per_s=1e6, round=0, expires_at=now + FAR)
    ann = ModuleAnnouncement(module_id="shared", round=3, digest="ab" * 8, peer_id=me, numel=10)
    decoy = {"swarm_id": "f" * 64, "name": "decoy"}
    return {
        # free storage: a key outside the swarm, filled close to the record cap
        "junk_key": (f"junk/{me}", "x" * 3000, now + 200, True),
        # a squatting claim that outlives every claim TTL
        "eternal_claim": (claims_key(sid), record_to_wire(claim), now + FAR, True),
        # a valid record, but far larger than any record of ours: 8 KiB of padding in an extra field
        "oversized_announcement": (module_key(sid, "shared"), {**record_to_wire(ann), "pad": "x" * 8192},
                                   now + 60, True),
        # make joiners believe the bootstrap peer serves another swarm (they would refuse it)
        "served_forgery_signed": (served_key(bootstrap), decoy, now + 250, True),
        "served_forgery_unsigned": (served_key(bootstrap), decoy, now + 280, False),
    }


def main(spec_path: str, initial_peer: str, report: str) -> None:
    spec = load_spec(spec_path)
    validator = RSASignatureValidator(RSAPrivateKey())
    owner = validator.local_public_key
    me = peer_id_of_owner(owner)
    bootstrap = initial_peer.rsplit("/p2p/", 1)[1]
    dht = hivemind.DHT(initial_peers=[initial_peer], start=True, record_validators=[validator], **LOOPBACK_ONLY)
    try:
        stored = {}
        for name, (key, value, expiration, signed) in attacks(spec, me, bootstrap, get_dht_time()).items():
            stored[name] = {"key": key, "accepted": bool(dht.store(key, value, expiration,
                                                                   subkey=owner if signed else None))}
        Path(report).write_text(json.dumps({"peer_id": me, "attacks": stored}))
    finally:
        dht.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
