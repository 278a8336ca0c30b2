"""hivemind's side of a swarm's signed records: who signed a subkey, and the validator the DHT process runs.

Every record a peer writes goes under a key prefixed with the swarm id (protocol/records.py) and a
subkey that names its owner, `[owner:<ssh-rsa key>]`. hivemind's `RSASignatureValidator` signs such a
record and makes every honest DHT peer refuse a write to that subkey not signed by its key, so nobody
can overwrite or withdraw another peer's claim. On top of it `SwarmRecordValidator` makes every peer
of the swarm refuse, on store and on read, a record that is unsigned, malformed, off the spec, written in
the name of another peer id, too large, expiring too far ahead, or under a key that is not the swarm's.

Part of protocol/net/, the only package that imports hivemind (the validator must subclass hivemind's, and
runs inside hivemind's DHT process). protocol/dht.py re-exports the names.

Both validators remember the records that passed them (`Passed`, by digest): every DHT read meets the same signed
records again, in each responder's answer and in every round's read of the claims, and checking each one again
(an RSA signature, a parse against the spec) took about 40 % of a 16-node swarm's DHT processes' time.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import re
import struct
from collections import OrderedDict

import base58
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord, RecordValidatorBase
from hivemind.proto import crypto_pb2
from hivemind.utils import MSGPackSerializer, get_dht_time

from pathswarm.protocol import membership
from pathswarm.protocol.membership import Gate
from pathswarm.protocol.records import (
    MAX_RECORD_BYTES,
    RecordError,
    RevocationRecord,
    max_record_ttl_s,
    parse_record,
    served_key,
    servers_key,
    swarm_keys,
)
from pathswarm.protocol.spec import SwarmSpec

logger = logging.getLogger("pathswarm.protocol.dht")  # one logger for the records, wherever they are checked

_OWNER_RE = re.compile(RSASignatureValidator.PUBLIC_KEY_REGEX)
_MAX_OWNER_BYTES = 2048  # an RSA-2048 `[owner:ssh-rsa …]` subkey is ~390 bytes; RSA-4096 ~730


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
    """The membership gate of a swarm (admits everyone in an open swarm); one per swarm and process, so its
    cache of verified certificates and the revocations it learnt are shared by the validator, the readers and
    the module exchange."""
    return membership.gate_of(spec.membership.owner_key, spec.swarm_id)


PASSED_KEPT = 8192
"""Records remembered as passed, per validator (about 60 bytes each): a swarm of a thousand nodes has a few thousand
live records (claims, announcements, metrics), each renewed every claim TTL or round."""


def record_digest(record: DHTRecord) -> bytes:
    """A digest of everything a validator reads of a record: equal digests, equal verdicts."""
    h = hashlib.blake2b(digest_size=20)
    for part in (record.key, record.subkey or b"", record.value):
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    h.update(struct.pack(">d", record.expiration_time))
    return h.digest()


class Passed:
    """The digests of the records that passed a validator, the PASSED_KEPT most recently seen. Only passes are kept:
    whether a record passes depends only on its bytes (a signature, a parse, a certificate that covers the record's
    whole life) or, for its expiry, only gets truer with time; a refused record is checked again each time (a stranger
    sending junk cannot fill the memory with verdicts)."""

    def __init__(self, size: int = PASSED_KEPT):
        self.size = size
        self._seen: OrderedDict[bytes, None] = OrderedDict()

    def __contains__(self, digest: bytes) -> bool:
        if digest in self._seen:
            self._seen.move_to_end(digest)
            return True
        return False

    def add(self, digest: bytes) -> None:
        self._seen[digest] = None
        self._seen.move_to_end(digest)
        while len(self._seen) > self.size:
            self._seen.popitem(last=False)


class CachedSignatureValidator(RSASignatureValidator):
    """hivemind's signature check of owner-protected records, once per record (`Passed`)."""

    def __init__(self, private_key=None):
        super().__init__(private_key)
        self.passed = Passed()

    def validate(self, record: DHTRecord) -> bool:
        digest = record_digest(record)
        if digest in self.passed:
            return True
        ok = super().validate(record)
        if ok:
            self.passed.add(digest)
        return ok


class SwarmRecordValidator(RecordValidatorBase):
    """What a peer of a swarm stores and believes from its DHT (docs/SECURITY.md, "DHT writer").

    Runs inside the DHT process on every store request and every value found, after hivemind's
    RSASignatureValidator has checked the signature and stripped it (lower priority runs later). Accepted:
    - the swarm's records (claims, metrics, module announcements), signed by an owner whose peer id they carry,
      well formed and fitting the spec;
    - the swarm's spec-server listings, each a signed peer id naming its signer;
    - a bootstrap peer's "served swarm" record, only under its own peer id's key and signed by it;
    and nothing else: keys outside the swarm (junk, other swarms, hivemind's own, which we do not use) are refused,
    so a stranger cannot use our peers as free storage. Every record is at most MAX_RECORD_BYTES and expires at
    most `max_record_ttl_s` ahead. Per-peer limits follow: an owner writes one subkey (itself) per key, and the
    keys are a fixed set, so one identity stores at most (keys × MAX_RECORD_BYTES).
    """

    def __init__(self, spec: SwarmSpec):
        self._spec = spec
        self._gate = gate_of(spec)
        self._max_ttl_s = max_record_ttl_s(spec)
        self._models = {DHTID.generate(source=key).to_bytes(): model for key, model in swarm_keys(spec).items()}
        self._servers = DHTID.generate(source=servers_key(spec.swarm_id)).to_bytes()
        self.passed = Passed()

    def validate(self, record: DHTRecord) -> bool:
        model = self._models.get(record.key)
        digest = record_digest(record)
        if digest in self.passed:
            return True
        if self._validate(record, model):
            if model is not RevocationRecord:  # each one read teaches the gate (`_check_swarm_record`)
                self.passed.add(digest)
            return True
        return False

    def _validate(self, record: DHTRecord, model) -> bool:
        what = "record"
        try:
            what = "record" if model is None else f"{model.__name__} record"
            if len(record.value) > MAX_RECORD_BYTES:
                raise RecordError(f"record of {len(record.value)} bytes exceeds {MAX_RECORD_BYTES}")
            ahead = record.expiration_time - get_dht_time()
            if not ahead <= self._max_ttl_s:  # `not <=`: a NaN expiration is refused too
                raise RecordError(f"expires {ahead:.0f} s ahead; the most is {self._max_ttl_s:.0f} s")
            owner_peer_id = peer_id_of_owner(record.subkey)
            if owner_peer_id is None:
                raise RecordError("subkey names no owner key")
            value = MSGPackSerializer.loads(record.value)
            if model is not None:
                self._check_swarm_record(model, value, owner_peer_id, record.expiration_time)
            elif record.key == self._servers:
                if value != owner_peer_id:
                    raise RecordError("a spec-server listing must name its signer")
            elif record.key == DHTID.generate(source=served_key(owner_peer_id)).to_bytes():
                if not isinstance(value, dict) or not isinstance(value.get("swarm_id"), str):
                    raise RecordError("a served-swarm record holds {swarm_id, name}")
            else:
                raise RecordError("key outside this swarm (or a served-swarm record under another peer's id)")
        except Exception as e:  # anything a stranger sends is a refusal, never a crash
            logger.info("refused a %s: %s", what, str(e)[:200])
            return False
        return True

    def _check_swarm_record(self, model, value, owner_peer_id: str, expires_at: float) -> None:
        parsed = parse_record(model, value, self._spec)
        if parsed.peer_id != owner_peer_id:
            raise RecordError(f"record names peer {parsed.peer_id[:64]} but is signed by {owner_peer_id}")
        if model is RevocationRecord:
            # The owner's signature is the authority; only members relay it (`swarm revoke` signs itself a
            # short certificate), so strangers get no storage under this key.
            if not self._gate.private:
                raise RecordError("an open swarm has no owner to revoke anyone")
            self._gate.learn(parsed.token)
        # An answer that cannot change with time (Gate.check `valid_until`): the certificate covers the record's whole
        # life, revocations are left to the readers (protocol/dht.py), record by record.
        self._gate.check(parsed.membership, owner_peer_id, valid_until=expires_at)

    @property
    def priority(self) -> int:
        return 5  # below RSASignatureValidator (10): validated after its signature is checked and stripped

    def merge_with(self, other: RecordValidatorBase) -> bool:
        return False
