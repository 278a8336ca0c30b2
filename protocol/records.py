"""DHT records of a swarm: the keys they live under and the validated models peers read them into.

Everything read from the DHT is untrusted. `parse_record` bounds the size of what arrived before
looking inside it, admits only plain msgpack data (dict, list, tuple, str, bytes, int, float, bool,
None), validates it with a strict pydantic model (frozen, no extra fields, bounded strings and
numbers) and, given the spec, checks the fields that must fit the swarm (a path fits the levels, a
module id exists). It raises `RecordError` and nothing else, so a bad peer costs one log line.

Keys are plain strings prefixed with the swarm id, so swarms never mix: `{swarm_id}/claims`,
`{swarm_id}/metrics`, `{swarm_id}/module/{module_id}`. Each peer writes its record under a subkey it
owns (see protocol/dht.py), so these keys are dictionaries with one entry per peer.

Pure code: no networking, no hivemind, no torch.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from pathswarm.protocol.membership import MAX_CERT_BYTES, MAX_REVOCATION_BYTES
from pathswarm.protocol.spec import SwarmSpec

MAX_RECORD_BYTES = 4096
"""A record larger than this (serialized, or estimated for a python object) is rejected unread."""
MAX_DEPTH = 8
"""Deepest nesting of containers accepted in a record (ours need 2)."""
MAX_LEVELS = 64
"""Most levels a path may have (a spec with more would be absurd)."""
MAX_MODULE_INDEX = 1 << 20
"""Largest module index within a level accepted in a record."""
MAX_HISTORY = 64
"""Most (round, loss) pairs a node's metrics carry (64 pairs stay far below MAX_RECORD_BYTES)."""
MAX_GROUPS = 24
"""Most (module, round, group size) triples a node's metrics carry (its last rounds, newest kept)."""
MAX_COUNT = 1 << 62
"""Upper bound of counters (rounds, bytes, numel): keeps every integer inside int64."""
FIXED_TTL_S = 300.0
"""Lifetime of the records that do not depend on a spec: a bootstrap peer's served swarm, a spec server's listing
(renewed every third of it)."""
CLOCK_SLACK_S = 300.0
"""How far ahead of ours another peer's clock may run (hivemind's DHT time is each machine's wall clock); the same
skew membership certificates allow."""

_SWARM_ID_RE = re.compile(r"^[0-9A-Za-z_-]{1,128}$")
_MODULE_ID_PATTERN = r"^(shared|L[0-9]{1,2}M[0-9]{1,7})$"

PeerIdStr = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[0-9A-Za-z]+$")]
"""A libp2p peer id in base58 (46 characters for RSA / Ed25519 keys); bounded, alphanumeric."""
Count = Annotated[int, Field(ge=0, le=MAX_COUNT)]
ModuleIdStr = Annotated[str, Field(pattern=_MODULE_ID_PATTERN, max_length=16)]
Rate = Annotated[float, Field(ge=0.0, le=1e15)]
Timestamp = Annotated[float, Field(ge=0.0, le=1e11)]
"""Seconds since the epoch (hivemind's DHT time); 1e11 is the year 5138."""


class RecordError(ValueError):
    """A record read from the DHT is malformed, too large, or does not fit the swarm's spec."""


class _Record(BaseModel):
    # strict: no silent coercion of "3" to 3 or True to 1; a record is exactly what we write.
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)

    membership: str = Field(default="", max_length=MAX_CERT_BYTES)
    """The writer's membership certificate (protocol/membership.py); required in a private swarm."""


class _PathRecord(_Record):
    path: tuple[int, ...] = Field(min_length=1, max_length=MAX_LEVELS)
    """One module index per level; sent as a list (JSON / msgpack have no tuple)."""

    @field_validator("path", mode="before")
    @classmethod
    def _list_to_tuple(cls, v: Any) -> Any:
        if isinstance(v, list):
            return tuple(v)
        return v

    @field_validator("path")
    @classmethod
    def _indices_in_range(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        if any(not 0 <= m < MAX_MODULE_INDEX for m in v):
            raise ValueError(f"module indices must be in [0, {MAX_MODULE_INDEX})")
        return v


class PathClaim(_PathRecord):
    """A peer's claim to train one path, renewed by heartbeat until `expires_at`."""

    peer_id: PeerIdStr
    """The claiming peer's libp2p id (base58)."""
    tokens_per_s: Rate
    """The claimant's measured training throughput; 0 while unknown (path choice counts a minimum)."""
    round: Count
    """The outer round the claimant is at."""
    expires_at: Timestamp
    """DHT time after which the claim is dead; a withdrawn claim is rewritten with expires_at = now."""
    client: bool = False
    """The claimant cannot be dialed (behind NAT: protocol/reachability.py): never a reducer candidate."""


MAX_DISTRUSTS = 8
"""Most peers one announcement names as caught lying."""
MAX_CHAIN = 4
"""Most earlier states (round, digest, reducer list) one module announcement names."""
MAX_SPLITS = 8
"""Most healed splits a node's metrics name (its latest)."""
STALLED_ROUNDS = 3
"""A module none of whose rounds merged its node's outer gradient in this many of the node's rounds is reported
stalled in the node's metrics."""

DigestStr = Annotated[str, Field(pattern=r"^[0-9a-f]{1,64}$")]
ListDigestStr = Annotated[str, Field(pattern=r"^([0-9a-f]{64})?$")]


class ModuleAnnouncement(_Record):
    """A peer announces it holds a module's state at a round, so joiners know whom to fetch it from."""

    module_id: str = Field(pattern=_MODULE_ID_PATTERN, max_length=16)
    """'shared' or 'L{level}M{module}'."""
    round: Count
    """The outer round of the held state."""
    digest: str = Field(pattern=r"^[0-9a-f]{1,64}$")
    """Lowercase hex digest of the module's state (e.g. sha256 of its tensors); replicas compare it."""
    peer_id: PeerIdStr
    """The announcing peer's libp2p id."""
    numel: Count
    """Number of parameters in the module (a downloader bounds its allocation by it)."""
    client: bool = False
    """The announcer cannot be dialed: it vouches for the digest but serves no downloads."""
    reducers_digest: str = Field(default="", pattern=r"^([0-9a-f]{64})?$")
    """sha256 of the agreed reducer list held with the state (protocol/rounds/reducers.py `list_digest`); "": not
    stated."""
    distrusts: tuple[PeerIdStr, ...] = Field(default=(), max_length=MAX_DISTRUSTS)
    """Reducers the announcer caught lying (node/peer/audit.py), its latest ones: a joiner with no history of its
    own leaves out of its count a peer that most announcers distrust (node/peer/vouch.py `voted_out`)."""
    chain: tuple[tuple[Count, DigestStr, ListDigestStr], ...] = Field(default=(), max_length=MAX_CHAIN)
    """(round, digest, reducer-list digest) of the states the announcer held just before this one, each the one the
    next was reached from by applying a round, oldest first (empty after a re-sync: it knows no predecessor). A
    holder a round ahead thus still vouches for the state before (node/peer/vouch.py), and two versions of a round
    show whatever rounds their holders are at now (node/peer/splits.py, `swarm status`). Rounds ascend below
    `round`."""

    @field_validator("distrusts", mode="before")
    @classmethod
    def _list_to_tuple(cls, v: Any) -> Any:
        return tuple(v) if isinstance(v, list) else v  # the wire (msgpack) has lists only

    @field_validator("chain", mode="before")
    @classmethod
    def _chain_to_tuples(cls, v: Any) -> Any:
        return tuple(tuple(x) if isinstance(x, list) else x for x in v) if isinstance(v, list) else v

    @model_validator(mode="after")
    def _chain_before_round(self) -> ModuleAnnouncement:
        rounds = [r for r, _, _ in self.chain] + [self.round]
        if any(a >= b for a, b in zip(rounds, rounds[1:], strict=False)):
            raise ValueError("chain rounds must ascend below the announced round")
        return self


class NodeMetrics(_PathRecord):
    """One node's latest progress, for dashboards and the swarm's health summary."""

    peer_id: PeerIdStr
    """The reporting peer's libp2p id."""
    round: Count
    """The outer round the node has completed."""
    loss: float = Field(ge=0.0, le=1e6)
    """Latest training loss (next-byte cross-entropy, nats per byte: tokens are UTF-8 bytes)."""
    tokens_per_s: Rate
    """Training throughput."""
    bytes_sent: Count
    """Bytes sent on the wire since the node started."""
    bytes_received: Count
    """Bytes received on the wire since the node started."""
    history: tuple[tuple[Count, Annotated[float, Field(ge=0.0, le=1e6)]], ...] = Field(
        default=(), max_length=MAX_HISTORY)
    """(outer round, training loss) of the node's last rounds, oldest first: `swarm status --plot` draws them."""

    inner_steps: Count = 0
    """Inner steps the node has taken since it started (what fp32 data-parallel would have all-reduced after)."""
    tokens_trained: Count = 0
    """Tokens the node has trained on, over all its runs (a node restarted from its checkpoints continues its count)."""
    counters_id: str = Field(default="", pattern=r"^([0-9a-f]{32})?$")
    """Names the node's counts across its runs (node/peer/counters.py): a node restarted under a new peer id announces
    the same one while its old record lives on, so totals count its tokens once. "": not stated."""
    groups: tuple[tuple[ModuleIdStr, Count, Count], ...] = Field(default=(), max_length=MAX_GROUPS)
    """(module, outer round, members merged in it) of the node's last merged rounds: group sizes over rounds."""
    rounds_missed: tuple[tuple[ModuleIdStr, Count, Count], ...] = Field(default=(), max_length=MAX_LEVELS + 1)
    """(module, rounds the node got late, rounds that failed for it) since it started, for modules with any."""
    reachable: bool | None = None
    """Whether peers can dial the node (None: not measured)."""
    splits_healed: Count = 0
    """Rounds of this node found merged in two versions whose version of ours lost (node/peer/splits.py)."""
    splits: tuple[tuple[ModuleIdStr, Count, Count], ...] = Field(default=(), max_length=MAX_SPLITS)
    """(module, the first state round of ours that lost, the rounds of the node from then until it held the winning
    version) of its latest healed splits, oldest first: `swarm status` shows how long splits took to settle."""
    stalled: tuple[tuple[ModuleIdStr, Count], ...] = Field(default=(), max_length=MAX_LEVELS + 1)
    """(module, the node's rounds since a round with its outer gradient in it last made the module's state) for modules
    at STALLED_ROUNDS or more: a holder left behind, refused by its group, or late round after round shows here
    (node/peer/announce.py `StallWatch`)."""

    @field_validator("history", "groups", "rounds_missed", "splits", "stalled", mode="before")
    @classmethod
    def _lists_to_tuples(cls, v: Any) -> Any:
        if isinstance(v, list):
            return tuple(tuple(x) if isinstance(x, list) else x for x in v)
        return v


class RevocationRecord(_Record):
    """A private swarm owner's signed revocation list (protocol/membership.py), relayed by any peer that holds it:
    the owner's signature, not the writer, is the authority (the validator checks it against the spec)."""

    peer_id: PeerIdStr
    """The relaying peer's libp2p id."""
    token: str = Field(min_length=1, max_length=MAX_REVOCATION_BYTES)
    """The owner-signed list, `psr1.…`."""


R = TypeVar("R", bound=_Record)


# ---- keys --------------------------------------------------------------------------------------
def _check_swarm_id(swarm_id: str) -> str:
    if not isinstance(swarm_id, str) or not _SWARM_ID_RE.match(swarm_id):
        raise ValueError(f"swarm id must be 1-128 characters of [0-9A-Za-z_-], got {swarm_id!r}")
    return swarm_id


def claims_key(swarm_id: str) -> str:
    """Dictionary of path claims: one subkey per claiming peer."""
    return f"{_check_swarm_id(swarm_id)}/claims"


def metrics_key(swarm_id: str) -> str:
    """Dictionary of node metrics: one subkey per reporting peer."""
    return f"{_check_swarm_id(swarm_id)}/metrics"


def revocations_key(swarm_id: str) -> str:
    """Dictionary of the owner's revocation list as relayed by peers: one subkey per relaying peer."""
    return f"{_check_swarm_id(swarm_id)}/revocations"


def served_key(peer_id: str) -> str:
    """Where a bootstrap peer says which swarm it serves (outside every swarm's keys: read before joining). Only
    the peer it names may write it (the validator checks the signing key's peer id against the key)."""
    return f"pathswarm/served-by/{peer_id}"


def servers_key(swarm_id: str) -> str:
    """Dictionary of the peers that serve a swarm's spec to `--join ID` joiners: one subkey per server."""
    return f"pathswarm/spec-servers/{swarm_id}"


def announce_ttl_s(spec: SwarmSpec) -> float:
    """Lifetime of a module announcement and of a node's metrics: four claim lifetimes, renewed every round."""
    return 4 * spec.averaging.claim_ttl_s


def max_record_ttl_s(spec: SwarmSpec) -> float:
    """Farthest ahead of now a record of the swarm may expire: the longest lifetime honest peers write, plus clock
    slack. Peers refuse a record that expires later (a stranger's claim once could stand until the year 5138)."""
    return max(announce_ttl_s(spec), spec.averaging.claim_ttl_s, FIXED_TTL_S) + CLOCK_SLACK_S


def module_key(swarm_id: str, module_id: str) -> str:
    """Dictionary of announcements of one module's state: one subkey per holder."""
    if not isinstance(module_id, str) or not re.match(_MODULE_ID_PATTERN, module_id):
        raise ValueError(f"module id must be 'shared' or 'L<level>M<module>', got {module_id!r}")
    return f"{_check_swarm_id(swarm_id)}/module/{module_id}"


def swarm_keys(spec: SwarmSpec) -> dict[str, type[_Record]]:
    """Every key a swarm uses, with the record model stored under it."""
    sid = spec.swarm_id
    keys: dict[str, type[_Record]] = {claims_key(sid): PathClaim, metrics_key(sid): NodeMetrics}
    if spec.membership.private:
        keys[revocations_key(sid)] = RevocationRecord
    keys.update({module_key(sid, m): ModuleAnnouncement for m in spec.all_module_ids()})
    return keys


# ---- parsing -----------------------------------------------------------------------------------
_SCALAR_SIZE = 9  # msgpack's widest int / float encoding


def _bounded_size(obj: Any, budget: int, depth: int = 0) -> int:
    """Estimated serialized size of plain data; raises RecordError once it passes the budget.

    Walks without copying and stops at the first item over budget, so a huge object costs
    at most `budget` steps before it is rejected.
    """
    if depth > MAX_DEPTH:
        raise RecordError(f"record nests deeper than {MAX_DEPTH}")
    if obj is None or isinstance(obj, bool | int | float):
        size = _SCALAR_SIZE
    elif isinstance(obj, str | bytes):
        size = len(obj) + 5
    elif isinstance(obj, list | tuple):
        size = 5
        for item in obj:
            size += _bounded_size(item, budget - size, depth + 1)
    elif isinstance(obj, dict):
        size = 5
        for k, v in obj.items():
            size += _bounded_size(k, budget - size, depth + 1)
            size += _bounded_size(v, budget - size, depth + 1)
    else:
        raise RecordError(f"record holds a {type(obj).__name__}, not plain data")
    if size > budget:
        raise RecordError(f"record exceeds {MAX_RECORD_BYTES} bytes")
    return size


def parse_record(model_cls: type[R], raw: Any, spec: SwarmSpec | None = None) -> R:
    """Validate whatever the DHT returned as a `model_cls` record; raises RecordError only.

    `raw` is a dict of plain data (what hivemind's msgpack gives back) or bytes / str of JSON.
    With a spec, a path must fit its levels and a module id must be one of its modules.
    """
    try:
        if isinstance(raw, bytes | bytearray | memoryview | str):
            if len(raw) > MAX_RECORD_BYTES:
                raise RecordError(f"record of {len(raw)} bytes exceeds {MAX_RECORD_BYTES}")
            record = model_cls.model_validate_json(bytes(raw) if isinstance(raw, memoryview) else raw)
        else:
            _bounded_size(raw, MAX_RECORD_BYTES)
            if not isinstance(raw, dict):
                raise RecordError(f"record must be a mapping, got {type(raw).__name__}")
            record = model_cls.model_validate(raw)
    except ValidationError as e:
        raise RecordError(f"invalid {model_cls.__name__}: {_first_error(e)}") from None
    except RecordError:
        raise
    except (ValueError, TypeError, RecursionError) as e:  # e.g. invalid UTF-8 inside a bytes record
        raise RecordError(f"invalid {model_cls.__name__}: {type(e).__name__}") from None
    if spec is not None:
        check_against_spec(record, spec)
    return record


def check_against_spec(record: _Record, spec: SwarmSpec) -> None:
    """Raise RecordError unless the record's path / module id exists in the swarm."""
    path = getattr(record, "path", None)
    if path is not None:
        try:
            spec.check_path(path)
        except ValueError as e:
            raise RecordError(str(e)) from None
    modules = [getattr(record, "module_id", None)]
    modules += [entry[0] for name in ("groups", "rounds_missed") for entry in getattr(record, name, ())]
    for module in modules:
        if module is not None and module not in spec.all_module_ids():
            raise RecordError(f"module {module!r} is not in the swarm (levels {list(spec.levels)})")


def _first_error(e: ValidationError) -> str:
    # One short line for the log: the first failing field and pydantic's reason, never the input
    # itself (it came from a stranger and may be large or hostile to terminals).
    err = e.errors(include_input=False, include_url=False)[0]
    where = ".".join(str(p) for p in err["loc"]) or "record"
    return f"{where}: {err['msg']}"[:200]


def record_to_wire(record: _Record) -> dict[str, Any]:
    """Plain data to store in the DHT (lists, not tuples), the inverse of parse_record."""
    return record.model_dump(mode="json", exclude_defaults=True)  # open swarms send no empty membership


def record_to_json(record: _Record) -> bytes:
    return json.dumps(record_to_wire(record), separators=(",", ":")).encode()


def metrics_within_bound(metrics: NodeMetrics) -> NodeMetrics:
    """The metrics with their oldest loss points (then oldest group sizes) dropped until the record fits
    MAX_RECORD_BYTES as readers measure it (`parse_record`). Each list has its own cap, but all of them full, with a
    private swarm's certificate, came to 4,277 bytes: the store was refused and the node vanished from `swarm status`
    and the dashboard (a node with many healed splits in a private swarm)."""
    for field_name in ("history", "groups"):
        while True:
            try:
                _bounded_size(record_to_wire(metrics), MAX_RECORD_BYTES)
                return metrics
            except RecordError:
                items = getattr(metrics, field_name)
                if not items:
                    break
                metrics = metrics.model_copy(update={field_name: items[max(1, len(items) // 8):]})
    return metrics
