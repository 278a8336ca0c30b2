"""hivemind's side of a swarm's signed records: who signed a subkey, and the validator the DHT process runs.

Every record a peer writes goes under a key prefixed with the swarm id (protocol/records.py) and a
subkey that names its owner, `[owner:<ssh-rsa key>]`. hivemind's `RSASignatureValidator` signs such a
record and makes every honest DHT peer refuse a write to that subkey not signed by its key, so nobody
can overwrite or withdraw another peer's claim. On top of it `SwarmRecordValidator` makes every peer
of the swarm refuse, on store and on read, a record under the swarm's keys that is unsigned, malformed,
off the spec, or written in the name of another peer id.

Private to protocol/: with protocol/net.py, the only code that imports hivemind (the validator must
subclass hivemind's, and runs inside hivemind's DHT process). protocol/dht.py re-exports the names.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import re

import base58
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord, RecordValidatorBase
from hivemind.proto import crypto_pb2
from hivemind.utils import MSGPackSerializer

from pathswarm.protocol.membership import Gate
from pathswarm.protocol.records import MAX_RECORD_BYTES, RecordError, parse_record, swarm_keys
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
