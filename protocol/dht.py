"""A swarm's signed records in the DHT: path claims, module announcements, metrics, a private swarm's revocation
list (over protocol/net/).

Every record a peer writes goes under a key prefixed with the swarm id (protocol/records.py) and a
subkey that names its owner, `[owner:<ssh-rsa key>]`, which the DHT signs with the peer's key; every
honest peer refuses a write to another owner's subkey, and `SwarmRecordValidator`
(protocol/net/validator.py) refuses records that are unsigned, malformed, off the spec, or written
in the name of another peer id. Reads check all of it again here. A bad record costs a log line and is
dropped; nothing read from a peer raises.

The functions take the running peer (`SwarmNet`, from `start_net`) and a spec; no hivemind here.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, TypeVar

from pathswarm.protocol.membership import MembershipError, Revocations
from pathswarm.protocol.net.validator import SwarmRecordValidator, gate_of, peer_id_of_owner
from pathswarm.protocol.records import (
    ModuleAnnouncement,
    NodeMetrics,
    PathClaim,
    RecordError,
    RevocationRecord,
    claims_key,
    metrics_key,
    metrics_within_bound,
    module_key,
    parse_record,
    record_to_wire,
    revocations_key,
)
from pathswarm.protocol.spec import SwarmSpec

if TYPE_CHECKING:
    from pathswarm.protocol.net import SwarmNet

__all__ = ["Entry", "SwarmRecordValidator", "announce_module", "announcement_entry", "gate_of", "metrics_entry",
           "peer_id_of_owner", "publish_claim", "publish_entries", "publish_metrics", "publish_revocations",
           "read_claims", "read_metrics", "read_module_holders", "read_modules_holders", "read_revocations",
           "revocations_entry", "withdraw_claim"]

logger = logging.getLogger(__name__)

_R = TypeVar("_R", PathClaim, ModuleAnnouncement, NodeMetrics, RevocationRecord)


# ---- records -----------------------------------------------------------------------------------
Entry = tuple[str, object, float, "bytes | None"]
"""One store: (key, value on the wire, expiration, subkey), for `SwarmNet.store_many`."""


def _entry(sdht: SwarmNet, key: str, record: _R, expiration: float) -> Entry:
    if record.peer_id != sdht.peer_id:
        raise ValueError(f"record names peer {record.peer_id}, but this DHT peer is {sdht.peer_id}")
    return key, record_to_wire(_with_membership(sdht, record)), expiration, sdht.owner


def _with_membership(sdht: SwarmNet, record: _R) -> _R:
    """The record carrying this peer's membership certificate (a private swarm's), as it is stored."""
    if sdht.membership and record.membership != sdht.membership:
        return record.model_copy(update={"membership": sdht.membership})
    return record


def _publish(sdht: SwarmNet, key: str, record: _R, expiration: float) -> bool:
    return publish_entries(sdht, [_entry(sdht, key, record, expiration)])[0]


def publish_entries(sdht: SwarmNet, entries: list[Entry]) -> list[bool]:
    """Store records (from `announcement_entry`, `metrics_entry`, ...) in one search of the DHT; a warning names
    each one no peer accepted."""
    stored = sdht.store_many(entries)
    for (key, _, _, _), ok in zip(entries, stored, strict=True):
        if not ok:
            logger.warning("DHT store under %s failed (no peer accepted it)", key)
    return stored


def _rounds_of(record: _R) -> list[int]:
    """Every outer round a record names: its own, and a node's metrics' loss history, group sizes and healed splits
    (a dashboard keeps the newest rounds: one of 2^62 would push the real ones out). An announcement's chain is below
    its own round (records.py)."""
    return ([getattr(record, "round", 0)] + [r for r, _ in getattr(record, "history", ())]
            + [g[1] for g in getattr(record, "groups", ())] + [s[1] for s in getattr(record, "splits", ())])


def _read(sdht: SwarmNet, spec: SwarmSpec, key: str, model: type[_R], timeout_s: float | None = None) -> list[_R]:
    """Every valid record under `key`, one per owner; bad ones are logged and dropped. With timeout_s, raises
    TimeoutError when the DHT has not answered by then (a lookup that meets a dead peer waits for its RPC timeout)."""
    return _parse(sdht, spec, key, model, sdht.get(key, timeout_s))


def _parse(sdht: SwarmNet, spec: SwarmSpec, key: str, model: type[_R], found: object) -> list[_R]:
    if not isinstance(found, dict):
        return []
    records, gate = [], gate_of(spec)
    limit = spec.round_limit(sdht.dht_time())
    for subkey, value in found.items():
        try:
            owner_peer_id = peer_id_of_owner(subkey) if isinstance(subkey, bytes) else None
            if owner_peer_id is None:
                raise RecordError("subkey names no owner key")
            record = parse_record(model, value, spec)
            if record.peer_id != owner_peer_id:
                raise RecordError(f"names peer {record.peer_id} but is signed by {owner_peer_id}")
            if limit is not None and (latest := max(_rounds_of(record))) > limit:
                raise RecordError(f"round {latest} is later than the swarm's age allows ({limit})")
            if isinstance(record, RevocationRecord):
                gate.learn(record.token)  # the owner's signature is the authority; the relayer is a member
            gate.check(record.membership, owner_peer_id, valid_until=0.0 if model is RevocationRecord else None)
        except (RecordError, MembershipError) as e:
            logger.info("dropped a %s under %s: %s", model.__name__, key, e)
            continue
        records.append(record)
    return sorted(records, key=lambda r: r.peer_id)


def publish_claim(sdht: SwarmNet, spec: SwarmSpec, claim: PathClaim, ttl_s: float | None = None) -> PathClaim | None:
    """Claim (or renew the claim on) a path until now + ttl_s (default: the spec's claim TTL).

    Returns the claim as stored (its `expires_at` stamped) or None if no DHT peer accepted it.
    Call it again before it expires: that is the heartbeat.
    """
    spec.check_path(claim.path)
    ttl = spec.averaging.claim_ttl_s if ttl_s is None else ttl_s
    if not ttl > 0:
        raise ValueError(f"ttl_s must be positive, got {ttl}")
    expiration = sdht.dht_time() + ttl
    stamped = claim.model_copy(update={"expires_at": expiration})
    return stamped if _publish(sdht, claims_key(spec.swarm_id), stamped, expiration) else None


def withdraw_claim(sdht: SwarmNet, spec: SwarmSpec, claim: PathClaim) -> bool:
    """Withdraw the claim `publish_claim` last returned, by overwriting it with an expired one.

    hivemind cannot delete a subkey, and it keeps the entry with the later DHT expiration, so the
    tombstone (expires_at = now, which every reader ignores) lives just past the old claim.
    """
    now = sdht.dht_time()
    tombstone = claim.model_copy(update={"expires_at": now})
    return _publish(sdht, claims_key(spec.swarm_id), tombstone, max(claim.expires_at, now) + 1e-3)


def read_claims(sdht: SwarmNet, spec: SwarmSpec, now: float | None = None,
                timeout_s: float | None = None) -> list[PathClaim]:
    """Live, valid claims of the swarm (expired ones and tombstones dropped), sorted by peer id (TimeoutError if
    the DHT does not answer within timeout_s)."""
    claims = _read(sdht, spec, claims_key(spec.swarm_id), PathClaim, timeout_s)
    now = sdht.dht_time() if now is None else now
    return [c for c in claims if c.expires_at > now]


def announcement_entry(sdht: SwarmNet, spec: SwarmSpec, announcement: ModuleAnnouncement, ttl_s: float) -> Entry:
    """The store that tells the swarm this peer holds a module's state at a round, for ttl_s seconds."""
    if announcement.module_id not in spec.all_module_ids():
        raise ValueError(f"module {announcement.module_id!r} is not in the swarm")
    key = module_key(spec.swarm_id, announcement.module_id)
    return _entry(sdht, key, announcement, sdht.dht_time() + ttl_s)


def announce_module(sdht: SwarmNet, spec: SwarmSpec, announcement: ModuleAnnouncement, ttl_s: float) -> bool:
    """Tell the swarm this peer holds a module's state at a round, for ttl_s seconds."""
    return publish_entries(sdht, [announcement_entry(sdht, spec, announcement, ttl_s)])[0]


def read_module_holders(sdht: SwarmNet, spec: SwarmSpec, module_id: str) -> list[ModuleAnnouncement]:
    """Valid announcements of a module's state, newest round first (ties by peer id)."""
    return read_modules_holders(sdht, spec, [module_id])[module_id]


def read_modules_holders(sdht: SwarmNet, spec: SwarmSpec,
                         module_ids: list[str]) -> dict[str, list[ModuleAnnouncement]]:
    """`read_module_holders` of several modules in one search of the DHT."""
    keys = {mid: module_key(spec.swarm_id, mid) for mid in module_ids}
    found = sdht.get_many(list(keys.values()))
    out = {}
    for mid, key in keys.items():
        holders = _parse(sdht, spec, key, ModuleAnnouncement, found.get(key))
        out[mid] = sorted((a for a in holders if a.module_id == mid), key=lambda a: (-a.round, a.peer_id))
    return out


def metrics_entry(sdht: SwarmNet, spec: SwarmSpec, metrics: NodeMetrics, ttl_s: float) -> Entry:
    """The store of this node's latest metrics, for ttl_s seconds."""
    spec.check_path(metrics.path)
    fitted = metrics_within_bound(_with_membership(sdht, metrics))  # the record as stored, certificate in, must fit
    return _entry(sdht, metrics_key(spec.swarm_id), fitted, sdht.dht_time() + ttl_s)


def publish_metrics(sdht: SwarmNet, spec: SwarmSpec, metrics: NodeMetrics, ttl_s: float) -> bool:
    """Publish this node's latest metrics for ttl_s seconds."""
    return publish_entries(sdht, [metrics_entry(sdht, spec, metrics, ttl_s)])[0]


def read_metrics(sdht: SwarmNet, spec: SwarmSpec) -> list[NodeMetrics]:
    """Valid metrics of every node that published within its TTL, sorted by peer id."""
    return _read(sdht, spec, metrics_key(spec.swarm_id), NodeMetrics)



def revocations_entry(sdht: SwarmNet, spec: SwarmSpec, token: str, ttl_s: float) -> Entry:
    """The store that relays the owner's signed revocation list (protocol/membership.py) for ttl_s seconds."""
    record = RevocationRecord(peer_id=sdht.peer_id, token=token)
    return _entry(sdht, revocations_key(spec.swarm_id), record, sdht.dht_time() + ttl_s)


def publish_revocations(sdht: SwarmNet, spec: SwarmSpec, token: str, ttl_s: float) -> bool:
    """Relay the owner's signed revocation list (protocol/membership.py) for ttl_s seconds."""
    return publish_entries(sdht, [revocations_entry(sdht, spec, token, ttl_s)])[0]


def read_revocations(sdht: SwarmNet, spec: SwarmSpec) -> Revocations | None:
    """The newest revocation list of a private swarm that its owner signed, as far as the DHT knows (also taught to
    this process's gate, which refuses the revoked peers from then on); None in an open swarm or if there is none."""
    if not spec.membership.private:
        return None
    _read(sdht, spec, revocations_key(spec.swarm_id), RevocationRecord)
    return gate_of(spec).revocations
