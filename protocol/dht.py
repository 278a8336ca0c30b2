"""The node's only seam to hivemind's DHT: start a peer, publish and read a swarm's signed records.

Every record a peer writes (path claim, module announcement, metrics) goes under a key prefixed
with the swarm id (protocol/records.py) and a subkey that names its owner, `[owner:<ssh-rsa key>]`.
hivemind's `RSASignatureValidator` signs such a record and makes every honest DHT peer refuse a
write to that subkey not signed by its key, so nobody can overwrite or withdraw another peer's
claim. On top of it `SwarmRecordValidator` makes every peer of the swarm refuse, on store and on
read, a record under the swarm's keys that is unsigned, malformed, off the spec, or written in
the name of another peer id.

The owner key is also the peer's libp2p identity: `start_dht` hands the same RSA key to p2pd (as
hivemind's `identity_path`), so a record's `peer_id` can be checked against the key that signed
it (`peer_id_of_owner`). A node that keeps its identity file across restarts keeps its peer id
and its subkey, so its new claim replaces the old one instead of counting twice.

Network: p2pd listens on `host_maddrs` (default 127.0.0.1, port 0) with NAT port mapping,
AutoNAT, relays and IPFS bootstrap off, so it contacts only the addresses it is given.
A bad record costs a log line and is dropped; nothing read from a peer raises.
"""

from __future__ import annotations

import concurrent.futures
import functools
import hashlib
import logging
import os
import re
import signal
import tempfile
import threading
import time
from collections.abc import Sequence
from typing import Any, TypeVar

import base58
import hivemind
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord, RecordValidatorBase
from hivemind.p2p import P2P
from hivemind.proto import crypto_pb2
from hivemind.utils import MSGPackSerializer, get_dht_time
from hivemind.utils.crypto import RSAPrivateKey

from pathswarm.protocol.membership import Gate, MembershipError
from pathswarm.protocol.records import (
    MAX_RECORD_BYTES,
    ModuleAnnouncement,
    NodeMetrics,
    PathClaim,
    RecordError,
    claims_key,
    metrics_key,
    module_key,
    parse_record,
    record_to_wire,
    swarm_keys,
)
from pathswarm.protocol.spec import SwarmSpec

logger = logging.getLogger(__name__)

LOOPBACK_MADDRS = ("/ip4/127.0.0.1/tcp/0",)
"""Where a peer listens unless told otherwise: loopback, a free port."""
_OWNER_RE = re.compile(RSASignatureValidator.PUBLIC_KEY_REGEX)
_MAX_OWNER_BYTES = 2048  # an RSA-2048 `[owner:ssh-rsa …]` subkey is ~390 bytes; RSA-4096 ~730
_R = TypeVar("_R", PathClaim, ModuleAnnouncement, NodeMetrics)


def peer_id_of_owner(owner: bytes) -> str | None:
    """The libp2p peer id (base58) of the RSA key inside an `[owner:…]` subkey; None if there is none.

    libp2p's rule: sha256 multihash of the protobuf PublicKey holding the key's DER form; this is
    what `hivemind.PeerID.from_identity` computes from the private key.
    """
    if len(owner) > _MAX_OWNER_BYTES:  # before the cache, so strangers cannot fill it with megabytes
        return None
    return _peer_id_of_owner(owner)


@functools.lru_cache(maxsize=1024)
def _peer_id_of_owner(owner: bytes) -> str | None:
    keys = _OWNER_RE.findall(owner)
    if len(set(keys)) != 1:
        return None
    try:
        public_key = serialization.load_ssh_public_key(keys[0])
        der = public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    # UnsupportedAlgorithm lives in cryptography.exceptions: naming it as serialization.UnsupportedAlgorithm
    # raised AttributeError whenever a malformed or foreign key reached this clause.
    except (ValueError, TypeError, UnsupportedAlgorithm):
        return None
    encoded = crypto_pb2.PublicKey(key_type=crypto_pb2.RSA, data=der).SerializeToString()
    return base58.b58encode(b"\x12\x20" + hashlib.sha256(encoded).digest()).decode()  # 0x12 = sha2-256, 32 bytes


def gate_of(spec: SwarmSpec) -> Gate:
    """The membership gate of a swarm (admits everyone in an open swarm); one per swarm, so its
    cache of verified certificates is shared by the validator and the readers of a process."""
    return _gate(spec.membership.owner_key, spec.swarm_id)


@functools.lru_cache(maxsize=16)
def _gate(owner_key: str, swarm_id: str) -> Gate:
    return Gate(owner_key, swarm_id)


class SwarmRecordValidator(RecordValidatorBase):
    """Refuses records under a swarm's keys unless signed by an owner whose peer id they carry.

    Runs inside the DHT process on every store request and every value found, after hivemind's
    RSASignatureValidator has checked the signature and stripped it (lower priority runs later).
    Keys that are not this swarm's pass untouched (hivemind's own, other swarms').
    """

    def __init__(self, spec: SwarmSpec):
        self._spec = spec
        self._gate = gate_of(spec)
        self._models = {DHTID.generate(source=key).to_bytes(): model for key, model in swarm_keys(spec).items()}

    def validate(self, record: DHTRecord) -> bool:
        model = self._models.get(record.key)
        if model is None:
            return True
        try:
            owner_peer_id = peer_id_of_owner(record.subkey)
            if owner_peer_id is None:
                raise RecordError("subkey names no owner key")
            if len(record.value) > MAX_RECORD_BYTES:
                raise RecordError(f"record of {len(record.value)} bytes exceeds {MAX_RECORD_BYTES}")
            parsed = parse_record(model, MSGPackSerializer.loads(record.value), self._spec)
            if parsed.peer_id != owner_peer_id:
                raise RecordError(f"record names peer {parsed.peer_id[:64]} but is signed by {owner_peer_id}")
            self._gate.check(parsed.membership, owner_peer_id)
        except Exception as e:  # anything a stranger sends is a refusal, never a crash
            logger.info("refused a %s record: %s", model.__name__, str(e)[:200])
            return False
        return True

    @property
    def priority(self) -> int:
        return 5  # below RSASignatureValidator (10): validated after its signature is checked and stripped

    def merge_with(self, other: RecordValidatorBase) -> bool:
        return False


class SwarmDHT:
    """A running DHT peer: the hivemind DHT plus the owner subkey its records are signed under."""

    def __init__(self, dht: hivemind.DHT, private_key: RSAPrivateKey, membership: str = ""):
        self.membership = membership
        """This peer's membership certificate (private swarms), attached to every record it writes."""
        self.dht = dht
        """The hivemind DHT (averagers take it); the rest of the node uses the functions below."""
        self.owner = RSASignatureValidator(private_key).local_public_key
        """`[owner:<ssh-rsa key>]`: the subkey of every record this peer writes."""
        self.peer_id = dht.peer_id.to_base58()
        """This peer's libp2p id (base58), equal to `peer_id_of_owner(self.owner)`."""

    def visible_maddrs(self) -> list[str]:
        """Multiaddrs other peers can join through (pass them as `initial_peers`)."""
        return [str(m) for m in self.dht.get_visible_maddrs()]

    def shutdown(self) -> None:
        self.dht.shutdown()

    def __enter__(self) -> SwarmDHT:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()


PARENT_POLL_S = 0.5  # how often the DHT process checks that the process that started it is alive


class ParentBoundDHT(hivemind.DHT):
    """hivemind's DHT process, which also ends, with its p2pd, when the process that started it dies.

    hivemind forks the DHT into a child that runs p2pd. A node killed with SIGKILL (or by the OOM
    killer) never shuts that child down: it stayed up for good, answering DHT requests as the dead
    node, and p2pd kept its peer id online: peers could still choose the dead node as reducer, and a
    restart with the same identity ran next to its own ghost."""

    def run(self) -> None:  # runs in the forked child
        # A parent that installed a Python SIGTERM handler before forking us (the bootstrap peer did) would
        # leave us a copy that only sets the parent's stop flag: SIGTERM then could not stop this process, and
        # the parent's exit blocked on joining it. Our stop is the default one.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        parent = os.getppid()
        threading.Thread(target=self._exit_with_parent, args=(parent,), name="pathswarm-parent-watch",
                         daemon=True).start()
        super().run()

    def _exit_with_parent(self, parent: int) -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        node = getattr(self, "_node", None)
        daemon = getattr(getattr(node, "p2p", None), "_child", None)  # hivemind's p2pd process (asyncio)
        if daemon is not None and daemon.returncode is None:
            try:
                os.kill(daemon.pid, signal.SIGTERM)
                for _ in range(20):
                    if os.waitpid(daemon.pid, os.WNOHANG)[0]:
                        break
                    time.sleep(0.1)
                else:
                    os.kill(daemon.pid, signal.SIGKILL)
            except (ProcessLookupError, ChildProcessError):
                pass
        os._exit(0)


def start_dht(
    initial_peers: Sequence[str] = (),
    host_maddrs: Sequence[str] | None = None,
    *,
    spec: SwarmSpec | None = None,
    identity_path: str | None = None,
    announce_maddrs: Sequence[str] | None = None,
    client_mode: bool = False,
    startup_timeout_s: float = 30.0,
    membership: str = "",
) -> SwarmDHT:
    """Start a DHT peer and join `initial_peers` (none: start a new DHT).

    `host_maddrs` defaults to loopback on a free port. `spec` installs the swarm's record validator
    (a bootstrap peer serving many swarms passes None and checks signatures only). `identity_path`
    is an RSA identity file, created if missing (keep it in the user's data directory); without
    one a fresh identity is made for this run. `membership` is this peer's certificate in a private
    swarm (checked by the caller). Raises if the initial peers cannot be reached.
    """
    if isinstance(initial_peers, str):
        raise TypeError("initial_peers is a list of multiaddrs, not one string")
    with tempfile.TemporaryDirectory(prefix="pathswarm-id-") as tmp:
        path = identity_path or os.path.join(tmp, "identity.key")
        if not os.path.isfile(path):
            P2P.generate_identity(path)  # an RSA key in libp2p's protobuf form, mode 0400
        private_key = _load_identity(path)
        validators: list[RecordValidatorBase] = [RSASignatureValidator(private_key)]
        if spec is not None:
            validators.append(SwarmRecordValidator(spec))
        dht = ParentBoundDHT(
            initial_peers=list(initial_peers),
            start=True,
            record_validators=validators,
            client_mode=client_mode,
            # p2pd: listen where told; never map ports, probe reachability, relay or reach IPFS.
            host_maddrs=list(host_maddrs or LOOPBACK_MADDRS),
            announce_maddrs=list(announce_maddrs) if announce_maddrs else None,
            identity_path=path,
            # hivemind's identity check starts a second p2pd with AutoNAT and NAT port mapping on
            # (it forwards none of the options here): never. A persistent identity must be guarded
            # by the caller (one node per data directory).
            check_if_identity_free=False,
            use_relay=False,
            use_auto_relay=False,
            auto_nat=False,
            nat_port_map=False,
            use_ipfs=False,
            await_ready=False,
        )
        try:
            dht.wait_until_ready(timeout=startup_timeout_s)  # p2pd has read the identity file by now
        except BaseException:
            dht.shutdown()
            raise
    return SwarmDHT(dht, private_key, membership)


def _load_identity(path: str) -> RSAPrivateKey:
    with open(path, "rb") as f:
        pb = crypto_pb2.PrivateKey.FromString(f.read())
    if pb.key_type != crypto_pb2.RSA:
        raise ValueError(f"{path}: identity is not an RSA key (hivemind's record signatures need one)")
    key = RSAPrivateKey.__new__(RSAPrivateKey)
    key.__setstate__({"_private_key": pb.data})  # hivemind's own unpickling: DER PKCS#1 → key
    return key


# ---- records -----------------------------------------------------------------------------------
def _publish(sdht: SwarmDHT, key: str, record: _R, expiration: float) -> bool:
    if record.peer_id != sdht.peer_id:
        raise ValueError(f"record names peer {record.peer_id}, but this DHT peer is {sdht.peer_id}")
    if sdht.membership and record.membership != sdht.membership:
        record = record.model_copy(update={"membership": sdht.membership})
    ok = bool(sdht.dht.store(key, record_to_wire(record), expiration_time=expiration, subkey=sdht.owner))
    if not ok:
        logger.warning("DHT store of %s under %s failed (no peer accepted it)", type(record).__name__, key)
    return ok


def _read(sdht: SwarmDHT, spec: SwarmSpec, key: str, model: type[_R], timeout_s: float | None = None) -> list[_R]:
    """Every valid record under `key`, one per owner; bad ones are logged and dropped. With timeout_s, raises
    TimeoutError when the DHT has not answered by then (a lookup that meets a dead peer waits for its RPC timeout)."""
    if timeout_s is None:
        found = sdht.dht.get(key, latest=True)
    else:
        try:
            found = sdht.dht.get(key, latest=True, return_future=True).result(timeout=timeout_s)
        except concurrent.futures.TimeoutError:
            raise TimeoutError(f"the DHT did not answer within {timeout_s:g} s") from None
    if found is None or not isinstance(found.value, dict):
        return []
    records, gate = [], gate_of(spec)
    for subkey, item in found.value.items():
        try:
            owner_peer_id = peer_id_of_owner(subkey) if isinstance(subkey, bytes) else None
            if owner_peer_id is None:
                raise RecordError("subkey names no owner key")
            record = parse_record(model, item.value, spec)
            if record.peer_id != owner_peer_id:
                raise RecordError(f"names peer {record.peer_id} but is signed by {owner_peer_id}")
            gate.check(record.membership, owner_peer_id)
        except (RecordError, MembershipError) as e:
            logger.info("dropped a %s under %s: %s", model.__name__, key, e)
            continue
        records.append(record)
    return sorted(records, key=lambda r: r.peer_id)


def publish_claim(sdht: SwarmDHT, spec: SwarmSpec, claim: PathClaim, ttl_s: float | None = None) -> PathClaim | None:
    """Claim (or renew the claim on) a path until now + ttl_s (default: the spec's claim TTL).

    Returns the claim as stored (its `expires_at` stamped) or None if no DHT peer accepted it.
    Call it again before it expires: that is the heartbeat.
    """
    spec.check_path(claim.path)
    ttl = spec.averaging.claim_ttl_s if ttl_s is None else ttl_s
    if not ttl > 0:
        raise ValueError(f"ttl_s must be positive, got {ttl}")
    expiration = get_dht_time() + ttl
    stamped = claim.model_copy(update={"expires_at": expiration})
    return stamped if _publish(sdht, claims_key(spec.swarm_id), stamped, expiration) else None


def withdraw_claim(sdht: SwarmDHT, spec: SwarmSpec, claim: PathClaim) -> bool:
    """Withdraw the claim `publish_claim` last returned, by overwriting it with an expired one.

    hivemind cannot delete a subkey, and it keeps the entry with the later DHT expiration, so the
    tombstone (expires_at = now, which every reader ignores) lives just past the old claim.
    """
    now = get_dht_time()
    tombstone = claim.model_copy(update={"expires_at": now})
    return _publish(sdht, claims_key(spec.swarm_id), tombstone, max(claim.expires_at, now) + 1e-3)


def read_claims(sdht: SwarmDHT, spec: SwarmSpec, now: float | None = None,
                timeout_s: float | None = None) -> list[PathClaim]:
    """Live, valid claims of the swarm (expired ones and tombstones dropped), sorted by peer id (TimeoutError if
    the DHT does not answer within timeout_s)."""
    claims = _read(sdht, spec, claims_key(spec.swarm_id), PathClaim, timeout_s)
    now = get_dht_time() if now is None else now
    return [c for c in claims if c.expires_at > now]


def announce_module(sdht: SwarmDHT, spec: SwarmSpec, announcement: ModuleAnnouncement, ttl_s: float) -> bool:
    """Tell the swarm this peer holds a module's state at a round, for ttl_s seconds."""
    if announcement.module_id not in spec.all_module_ids():
        raise ValueError(f"module {announcement.module_id!r} is not in the swarm")
    key = module_key(spec.swarm_id, announcement.module_id)
    return _publish(sdht, key, announcement, get_dht_time() + ttl_s)


def read_module_holders(sdht: SwarmDHT, spec: SwarmSpec, module_id: str) -> list[ModuleAnnouncement]:
    """Valid announcements of a module's state, newest round first (ties by peer id)."""
    holders = _read(sdht, spec, module_key(spec.swarm_id, module_id), ModuleAnnouncement)
    return sorted((a for a in holders if a.module_id == module_id), key=lambda a: (-a.round, a.peer_id))


def publish_metrics(sdht: SwarmDHT, spec: SwarmSpec, metrics: NodeMetrics, ttl_s: float) -> bool:
    """Publish this node's latest metrics for ttl_s seconds."""
    spec.check_path(metrics.path)
    return _publish(sdht, metrics_key(spec.swarm_id), metrics, get_dht_time() + ttl_s)


def read_metrics(sdht: SwarmDHT, spec: SwarmSpec) -> list[NodeMetrics]:
    """Valid metrics of every node that published within its TTL, sorted by peer id."""
    return _read(sdht, spec, metrics_key(spec.swarm_id), NodeMetrics)


# ---- which swarm a bootstrap peer serves ----------------------------------------------------------
SERVED_TTL_S = 300.0


def served_key(peer_id: str) -> str:
    """Where a bootstrap peer says which swarm it serves (outside every swarm's keys: read before joining)."""
    return f"pathswarm/served-by/{peer_id}"


def announce_served_swarm(sdht: SwarmDHT, spec: SwarmSpec) -> bool:
    """A bootstrap peer publishes the id and name of the swarm it serves (renew within SERVED_TTL_S)."""
    value = {"swarm_id": spec.swarm_id, "name": spec.name[:200]}
    return bool(sdht.dht.store(served_key(sdht.peer_id), value, get_dht_time() + SERVED_TTL_S))


def served_swarm(sdht: SwarmDHT, peer_id: str) -> tuple[str, str] | None:
    """(swarm id, name) a bootstrap peer announced, or None (a plain DHT peer announces nothing)."""
    found = sdht.dht.get(served_key(peer_id), latest=True)
    value = getattr(found, "value", None)
    if not isinstance(value, dict) or not isinstance(value.get("swarm_id"), str):
        return None
    swarm_id, name = value["swarm_id"], value.get("name")
    if not re.fullmatch(r"[0-9a-f]{64}", swarm_id):
        return None
    return swarm_id, name if isinstance(name, str) else ""
