"""The fuzz harness of every parser of peer data: hostile inputs, and what each parser must guarantee.

One table, `FUZZERS`, drives both the unit tests (tests/unit/test_fuzz_parsers.py and
tests/unit/test_codec_fuzz.py: hypothesis hands the generators a `random.Random` it controls, so a
failure shrinks) and the long run (benchmarks/fuzz.py: a seeded `random.Random`, 100,000 inputs per
parser). Inputs are random data and mutations of valid inputs (DHT records and owner subkeys,
membership certificates, framed messages, requests to and replies from the module exchange, codec
frames, spec text), so the deeper checks are reached.

The parsers: `parse_record`, `SwarmRecordValidator.validate`, `peer_id_of_owner`, membership
`parse` / `verify` / `Gate.check`, `read_message`, `field_of`, the exchange's `_on_contribute` and
`_on_state` handlers (driven offline: a fake stream in, a sink out), its state download `fetch_state`
and the reply side of `contribute` (fake PeerStreams answer), codec `decode` and `decode_sparse`, `loads_spec`.
Each `run_*` answers 'accepted' or 'refused' (a bool / None answer: validators, handlers), raises the parser's
typed error, or, on a bug, raises anything else (an accepted input that breaks the parser's contract
fails an assertion). The keys (RSA owner, Ed25519 swarm owner) are fresh at each import.
"""

from __future__ import annotations

import asyncio
import base64
import json
import random
import re
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import zstandard
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord
from hivemind.utils import MSGPackSerializer
from hivemind.utils.crypto import RSAPrivateKey

from pathswarm.compression import CodecError, SparseCodec, decode, encode, encode_with
from pathswarm.compression.frame import checksum
from pathswarm.compression.sparse import decode_sparse
from pathswarm.protocol.dht import SwarmRecordValidator, peer_id_of_owner
from pathswarm.protocol.membership import (
    CLOCK_SKEW_S,
    MAX_CERT_BYTES,
    MAX_REVOKED,
    Ed25519PrivateKey,
    Gate,
    MembershipError,
    issue,
    parse,
    public_key_text,
    sign_revocations,
    verify,
    verify_revocations,
)
from pathswarm.protocol.records import (
    MAX_COUNT,
    ModuleAnnouncement,
    NodeMetrics,
    PathClaim,
    RecordError,
    claims_key,
    metrics_key,
    module_key,
    parse_record,
    record_to_json,
    record_to_wire,
)
from pathswarm.protocol.rounds.exchange import ModuleExchange
from pathswarm.protocol.rounds.frame_list import MAX_LISTED, commit_frames, frame_hash, parse_listed
from pathswarm.protocol.rounds.outer import OuterState
from pathswarm.protocol.rounds.reducers import Stance
from pathswarm.protocol.spec import AveragingSpec, MembershipSpec, RouterSpec, SpecError, SwarmSpec, loads_spec
from pathswarm.protocol.wire import MAGIC, MAX_HEADER_BYTES, Traffic, WireError, field_of, read_message, write_message

# ---- valid inputs to mutate ------------------------------------------------------------------------
NOW = 1_800_000_000.0
OWNER = Ed25519PrivateKey.generate()
OWNER_KEY = public_key_text(OWNER)
SPEC = SwarmSpec(name="fuzz", levels=(2, 2))
PRIVATE = SwarmSpec(name="fuzz-private", levels=(2, 2), membership=MembershipSpec(owner_key=OWNER_KEY))
RSA_OWNER = RSASignatureValidator(RSAPrivateKey()).local_public_key
PEER = peer_id_of_owner(RSA_OWNER)
OTHER_PEER = "QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N"
CERT = issue(OWNER, PRIVATE.swarm_id, PEER, 4e9, now=NOW).token  # expires in 2096
PAYLOAD = json.loads(base64.urlsafe_b64decode(CERT.split(".")[1] + "=="))

RECORDS = [
    PathClaim(path=(0, 1), peer_id=PEER, tokens_per_s=12.5, round=3, expires_at=NOW),
    PathClaim(path=(1, 1), peer_id=PEER, tokens_per_s=0.0, round=0, expires_at=0.0, membership=CERT),
    ModuleAnnouncement(module_id="L1M0", round=7, digest="0123abcd" * 2, peer_id=PEER, numel=4096),
    ModuleAnnouncement(module_id="shared", round=0, digest="f", peer_id=PEER, numel=0, membership=CERT),
    NodeMetrics(path=(1, 0), peer_id=PEER, round=9, loss=2.5, tokens_per_s=100.0, bytes_sent=10, bytes_received=20,
                history=((1, 3.0), (2, 2.75)), inner_steps=90, tokens_trained=11520,
                groups=(("shared", 8, 3), ("L1M0", 8, 2)), rounds_missed=(("L0M1", 1, 0),), reachable=True),
    NodeMetrics(path=(0, 0), peer_id=PEER, round=0, loss=0.0, tokens_per_s=0.0, bytes_sent=0, bytes_received=0,
                membership=CERT),
]
MODELS = (PathClaim, ModuleAnnouncement, NodeMetrics)
FIELDS = {m: sorted(m.model_fields) for m in MODELS}
ALL_FIELDS = sorted({f for names in FIELDS.values() for f in names})

DEEP_LIST: list = []
for _ in range(40):
    DEEP_LIST = [DEEP_LIST]
EDGES = [None, True, False, -1, 0, 1, 2, 1 << 20, (1 << 20) - 1, MAX_COUNT, MAX_COUNT + 1, 1 << 63, 1 << 64, -(1 << 63),
         10**400, 0.5, -0.0, 1e6, 1e6 + 1, 1e11, 1e15, 1e16, 1e308, float("inf"), float("-inf"), float("nan"), "",
         "x", "0", "shared", "L0M0", "L9M9999999", "L00M0", "Qm" + "z" * 126, "Qm" + "z" * 127, "é", "\x00", "\ud800",
         "x" * 5000, "f" * 64, "f" * 65, "F", b"", b"\xff", b"x" * 5000, [], [0], [0, 1], [0, 2], [1, 1, 1],
         [0, 1 << 20], [-1, 0], [0.0, 1.0], [True, False], ["0", "1"], [[0, 1.0]], [[0, 1.0, 2]], [[-1, 1.0]],
         [[0, float("nan")]], [[0, 1.0]] * 65, [0] * 65, {}, {"a": 1}, (0, 1), DEEP_LIST, CERT, CERT + "x", CERT[:-5]]
FOREIGN_KEYS = [key.public_key().public_bytes(Encoding.OpenSSH, PublicFormat.OpenSSH)
                for key in (Ed25519PrivateKey.generate(), ec.generate_private_key(ec.SECP256R1()))] + [
                b"ssh-rsa AAAA", b"ssh-rsa", b"ssh-dss AAAAB3NzaC1kc3M=", b"ssh-rsa " + b"A" * 1500, b"", b"]"]
VALIDATORS = {False: SwarmRecordValidator(SPEC), True: SwarmRecordValidator(PRIVATE)}
KEYS = {spec.membership.private: [(claims_key(spec.swarm_id), PathClaim), (metrics_key(spec.swarm_id), NodeMetrics),
                                  (module_key(spec.swarm_id, "L1M0"), ModuleAnnouncement),
                                  (module_key(spec.swarm_id, "shared"), ModuleAnnouncement),
                                  ("someone-else/key", None)]
        for spec in (SPEC, PRIVATE)}
B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
TOKEN_ALPHABET = B64 + ".=+/ \t\n\x00é\ud800"

HOSTILE_HEADERS = [b"[" * MAX_HEADER_BYTES, b"{\"a\":" * 3000 + b"1" + b"}" * 3000, b"1" * 5000, b"9" * 400,
                   b"\xff\xfe\x00", b"[]", b"null", b"\"x\"", b"{\"a\": NaN}", b"{\"a\": 1e999}", b"{}" * 2,
                   b"{\"\\ud800\": 1}", b"{\"round\": " + b"9" * 4000 + b"}"]
LENGTHS = [0, 1, 2, 15, 16, 100, MAX_HEADER_BYTES, MAX_HEADER_BYTES + 1, (1 << 31) - 1, (1 << 32) - 1, 1 << 40,
           (1 << 63) - 1, (1 << 64) - 1]
MAX_PAYLOADS = [0, 3, 1024, 1 << 20, 1 << 40, 1 << 64]

NUMEL = 64
XSPEC = SwarmSpec(name="fuzz-x", levels=(2, 2), averaging=AveragingSpec(grace_s=0.2, timeout_s=2.0))
XPRIVATE = XSPEC.replace(membership=MembershipSpec(owner_key=OWNER_KEY))
XCERT = issue(OWNER, XPRIVATE.swarm_id, PEER, 4e9, now=NOW).token
STATE = OuterState(torch.linspace(-1, 1, NUMEL), torch.zeros(NUMEL), 3)
STATE_PAYLOAD = torch.cat([STATE.anchor, STATE.momentum]).numpy().tobytes()
FRAME = encode(torch.randn(NUMEL, generator=torch.Generator().manual_seed(0)) * 1e-3)
STATUSES = {"merged", "alone", "late", "out_of_sync", "behind", "failed", "refused", "missing", "ok", "redirect"}

FRAME_MAX_ELEMENTS = 4096
_gen = torch.Generator().manual_seed(0)
FRAMES = [encode(torch.randn(300, generator=_gen) * 1e-3),
          encode(torch.randn(7, 33, generator=_gen).half(), block_size=16),
          encode(torch.randn(2, 3, 5, generator=_gen).bfloat16(), block_size=4, target_error=0.0),
          encode(torch.tensor(2.5)), encode(torch.zeros(0, 3)),
          encode(torch.randn(2000, generator=_gen) * 1e-2, block_size=512)]

SPARSE_FRAMES = [encode_with(SparseCodec(64, 3, 2), torch.randn(300, generator=_gen) * 1e-3),
                 encode_with(SparseCodec(16, 5, 3), torch.randn(7, 33, generator=_gen).half()),
                 encode_with(SparseCodec(7, None, 8), torch.randn(2, 3, 5, generator=_gen).bfloat16()),
                 encode_with(SparseCodec(4096, 41, 4), torch.randn(2000, generator=_gen) * 1e-2),
                 encode_with(SparseCodec(5, 2, 2), torch.tensor(2.5)),
                 encode_with(SparseCodec(5, 2, 2), torch.zeros(0, 3)),
                 encode_with(SparseCodec(100, None, 5), torch.zeros(250))]

BASE_SPECS = [SwarmSpec(name="t", levels=(2, 2), router=RouterSpec(features=2, centroids=(
    (0.5, 0.25), (0.0, 1.0), (1.0, 0.0), (0.125, 0.75)))).to_toml()]
BASE_SPECS.append(loads_spec(BASE_SPECS[0]).replace(membership=MembershipSpec(owner_key=OWNER_KEY)).to_toml())
TOML_VALUES = ["inf", "-inf", "nan", "-1", "0", "1", "2", "1" + "0" * 400, "1" + "0" * 5000, "1e400", "-0.0", "0.5",
               '"x"', '"mup"', '"dir"', '"\\u007f"', '"\\ud800"', "true", "[]", "{}", "[1, 2, 3]", "[[0.1, 0.2]]",
               "[" * 3000 + "]" * 3000, "{a=" * 3000 + "1" + "}" * 3000, "1979-05-27", "0x7fffffffffffffff",
               f'"ed25519:{"A" * 43}"', f'"{OWNER_KEY[:-2]}"', '"ed25519:!!"']
TOML_ALPHABET = "=[]{}\"'.,#\n\\ \tabcxyz0189+-_eEinf\x00\x7fé"


# ---- random data and mutations -----------------------------------------------------------------------
def mutate_bytes(base: bytes, rng: random.Random) -> bytes:
    """1-4 edits: bit flip, byte write, truncation, insertion, deletion, repetition."""
    data = bytearray(base)
    for _ in range(rng.randint(1, 4)):
        kind, at = rng.randrange(6), rng.randrange(max(1, len(data)))
        if kind == 0 and data:
            data[at] ^= 1 << rng.randrange(8)
        elif kind == 1 and data:
            data[at] = rng.randrange(256)
        elif kind == 2:
            del data[at:]
        elif kind == 3:
            data[at:at] = rng.randbytes(rng.randint(1, 16))
        elif kind == 4:
            del data[at:at + rng.randint(1, 16)]
        elif kind == 5:
            data[at:at] = data[at:at + rng.randint(1, 32)] * rng.randint(1, 64)
    return bytes(data)


def mutate_text(base: str, alphabet: str, rng: random.Random) -> str:
    chars = list(base)
    for _ in range(rng.randint(1, 4)):
        kind, at = rng.randrange(4), rng.randrange(max(1, len(chars)))
        if kind == 0 and chars:
            chars[at] = rng.choice(alphabet)
        elif kind == 1:
            del chars[at:]
        elif kind == 2:
            chars[at:at] = rng.choices(alphabet, k=rng.randint(1, 8))
        elif kind == 3:
            del chars[at:at + rng.randint(1, 8)]
    return "".join(chars)


def random_text(rng: random.Random, n: int) -> str:
    return "".join(chr(rng.choice([rng.randrange(32, 127), rng.randrange(0x110000)])) for _ in range(n))


def plain(rng: random.Random, depth: int = 0) -> object:
    """msgpack-like plain data of any shape (tuples and bytes included), or an edge value."""
    kind = rng.randrange(10 if depth < 3 else 7)
    if kind == 0:
        return rng.choice(EDGES)
    if kind == 1:
        return rng.choice([None, True, False])
    if kind == 2:
        return rng.getrandbits(rng.choice([4, 16, 32, 64, 80])) * rng.choice([1, -1])
    if kind == 3:
        return rng.choice([rng.uniform(-1e6, 1e6), rng.expovariate(1e-3), struct.unpack("<d", rng.randbytes(8))[0]])
    if kind == 4:
        return random_text(rng, rng.randrange(30))
    if kind == 5:
        return rng.randbytes(rng.randrange(30))
    if kind == 6:
        return rng.choice(ALL_FIELDS)
    items = [plain(rng, depth + 1) for _ in range(rng.randrange(6))]
    if kind == 7:
        return items
    if kind == 8:
        return tuple(items)
    return {rng.choice([random_text(rng, rng.randrange(12)), rng.getrandbits(16), rng.choice(ALL_FIELDS)]): v
            for v in items}


def mutate_frame(frame: bytes, rng: random.Random) -> bytes:
    """A codec frame edited like `mutate_bytes`, or with a header field set to an edge value; its checksum
    recomputed half the time so the deeper checks are reached (5 %: random bytes instead)."""
    if rng.random() < 0.05:
        return rng.randbytes(rng.randrange(0, 200))
    data = bytearray(frame)
    for _ in range(rng.randint(1, 4)):
        kind, at = rng.randrange(7), rng.randrange(max(1, len(data)))
        if kind <= 1 and data:  # bit flip, random byte
            data[at] = data[at] ^ (1 << rng.randrange(8)) if kind == 0 else rng.randrange(256)
        elif kind == 2:
            del data[at:]
        elif kind == 3:
            data[at:at] = rng.randbytes(rng.randint(1, 16))
        elif kind == 4:
            del data[at:at + rng.randint(1, 16)]
        elif kind == 5 and len(data) >= 36:  # version, dtype, ndim, flags, block size, payload length, dims
            offset, fmt = rng.choice([(4, "<B"), (5, "<B"), (6, "<B"), (7, "<B"), (8, "<I"), (12, "<Q"),
                                      (20, "<Q"), (28, "<Q")])
            bits = 8 * struct.calcsize(fmt)
            edge = rng.choice([0, 1, 2, 3, 0x7F, 0x80, 255, 0xFFFF, 1 << 20, (1 << bits) - 1, 1 << (bits - 1),
                               rng.getrandbits(bits)])
            struct.pack_into(fmt, data, offset, edge % (1 << bits))
        elif kind == 6 and len(data) > 44:  # rewrite a chunk of scales / payload with random bytes
            data[at:at + 8] = rng.randbytes(8)
    if rng.random() < 0.5 and len(data) >= 4:
        data[-4:] = checksum(memoryview(data)[:-4]).to_bytes(4, "little")
    return bytes(data)


def mutate_sparse_frame(frame: bytes, rng: random.Random) -> bytes:
    """A sparse codec frame mutated like `mutate_frame` (with the sparse header's offsets), or, half the time, with
    its compressed body (counts, position distances, value codes) edited and recompressed, its payload length and
    checksum made consistent, so the checks behind decompression are reached."""
    if rng.random() < 0.5 or struct.unpack_from("<Q", frame, 20)[0] == 0:
        data = bytearray(mutate_frame(frame, rng))
        if rng.random() < 0.3 and len(data) >= 36:
            offset, fmt = rng.choice([(7, "<B"), (8, "<I"), (12, "<Q"), (20, "<Q")])
            nbits = 8 * struct.calcsize(fmt)
            struct.pack_into(fmt, data, offset, rng.choice([0, 1, 2, 9, 0xFFFF, (1 << nbits) - 1]) % (1 << nbits))
            data[-4:] = checksum(memoryview(data)[:-4]).to_bytes(4, "little")
        return bytes(data)
    payload_at = len(frame) - 4 - struct.unpack_from("<Q", frame, 20)[0]
    body = bytearray(zstandard.ZstdDecompressor().decompress(frame[payload_at:-4]))
    for _ in range(rng.randint(1, 3)):
        at = rng.randrange(max(1, len(body)))
        kind = rng.randrange(4)
        if kind == 0 and body:
            body[at] ^= 1 << rng.randrange(8)
        elif kind == 1 and body:
            body[at] = rng.choice([0, 1, 0x7F, 0x80, 0xFF])
        elif kind == 2:
            del body[at:at + rng.randint(1, 4)]
        else:
            body[at:at] = rng.randbytes(rng.randint(1, 4))
    payload = zstandard.ZstdCompressor(write_content_size=True).compress(bytes(body))
    head = bytearray(frame[:payload_at])
    struct.pack_into("<Q", head, 20, len(payload))
    if rng.random() < 0.2:  # the declared entry count disagreeing with the body
        struct.pack_into("<Q", head, 12, max(0, struct.unpack_from("<Q", head, 12)[0] + rng.choice([-1, 1])))
    out = bytes(head) + payload
    return out + checksum(out).to_bytes(4, "little")


def packed(wire: object) -> bytes:
    try:
        return MSGPackSerializer.dumps(wire)
    except (TypeError, ValueError, OverflowError):  # msgpack cannot write it (an int past 64 bits)
        return MSGPackSerializer.dumps(None)


def mutated_wire(rng: random.Random) -> tuple[type, dict]:
    """A valid record's wire dict with fields set to edge or random values, dropped, renamed or added."""
    record = rng.choice(RECORDS)
    model, wire = type(record), record_to_wire(record)
    for _ in range(rng.randint(1, 3)):
        kind, name = rng.randrange(5), rng.choice(FIELDS[model])
        if kind <= 1:
            wire[name] = plain(rng)
        elif kind == 2:
            wire.pop(name, None)
        elif kind == 3:
            wire[rng.choice([random_text(rng, 8), "peer_id", "path", "kind"])] = plain(rng)
        elif name in wire:
            wire[name.upper()] = wire.pop(name)
    return (rng.choice(MODELS) if rng.random() < 0.1 else model), wire


def as_sent(wire: dict, how: str) -> object:
    """The forms parse_record reads: the dict, msgpack-decoded, JSON bytes or JSON text."""
    try:
        if how == "msgpack":
            return MSGPackSerializer.loads(MSGPackSerializer.dumps(wire))
        if how in ("json", "text"):
            text = json.dumps(wire, default=lambda o: o.decode("latin-1") if isinstance(o, bytes) else list(o))
            return text.encode("utf-8", "surrogatepass") if how == "json" else text
    except (TypeError, ValueError, OverflowError, RecursionError):
        pass
    return wire


def owner_subkey(rng: random.Random) -> bytes:
    kind = rng.randrange(6)
    if kind == 0:
        owner = RSA_OWNER
    elif kind <= 2:
        owner = mutate_bytes(RSA_OWNER, rng)
    elif kind == 3:
        owner = RSA_OWNER + mutate_bytes(RSA_OWNER, rng)
    elif kind == 4:
        owner = b"[owner:" + rng.choice(FOREIGN_KEYS) + b"]"
    else:
        owner = rng.randbytes(rng.choice([rng.randrange(200), rng.randrange(2040, 2100)]))
    return MSGPackSerializer.dumps(owner) if rng.random() < 0.5 else owner


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def token(rng: random.Random) -> object:
    """Certificates: valid, edited as text, with a rewritten payload (re-signed or not), or not text at all."""
    kind = rng.randrange(8)
    tok: object = CERT
    if kind in (1, 2):
        tok = mutate_text(CERT, TOKEN_ALPHABET, rng)
    elif kind in (3, 4):
        body = dict(PAYLOAD)
        for _ in range(rng.randint(1, 3)):
            name = rng.choice(sorted(PAYLOAD) + ["extra"])
            if rng.random() < 0.5:
                body[name] = rng.choice([plain(rng), PEER, OTHER_PEER, SPEC.swarm_id, int(NOW) - 10**6])
            else:
                body.pop(name, None)
        try:
            raw = json.dumps(body, default=lambda o: o.hex() if isinstance(o, bytes) else list(o)).encode(
                "utf-8", "surrogatepass")
        except (ValueError, RecursionError):
            raw = json.dumps(PAYLOAD).encode()
        if rng.random() < 0.5:
            raw = mutate_bytes(raw, rng)
        signature = OWNER.sign(raw) if rng.random() < 0.5 else rng.randbytes(rng.randrange(80))
        tok = f"psm1.{_b64(raw)}.{_b64(signature)}"
    elif kind == 5:
        tok = CERT.rsplit(".", 1)[0] + "." + _b64(rng.randbytes(rng.randrange(80)))
    elif kind == 6:
        tok = rng.choice([random_text(rng, rng.randrange(300)), "".join(rng.choices(TOKEN_ALPHABET, k=300)),
                          "".join(rng.choices(B64 + ".", k=rng.randint(1000, 1100)))])
    elif kind == 7:
        return rng.choice([None, rng.randbytes(rng.randrange(100)), rng.getrandbits(64), ["psm1"], 0, ""])
    if rng.random() < 0.25:
        tok = rng.choice([" ", "\n", ""]) + tok + rng.choice([" ", "  ", ""])
    if rng.random() < 0.25:
        tok = tok.encode(rng.choice(["utf-8", "latin-1"]), "replace")
    return tok


def message(header: dict, payload: bytes = b"") -> bytes:
    """write_message's bytes, without a loop (its writer never waits)."""
    sink = Sink()
    coro = write_message(sink, header, payload)
    try:
        coro.send(None)
    except StopIteration:
        return bytes(sink.data)
    raise RuntimeError("write_message waited")


def wire_message(rng: random.Random) -> bytes:
    kind = rng.randrange(5)
    if kind == 0:
        return rng.randbytes(rng.randrange(200))
    if kind == 1:
        return MAGIC + rng.randbytes(rng.randrange(200))
    data = bytearray(rng.choice(MESSAGES))
    if kind == 2:
        head = rng.choice(HOSTILE_HEADERS) if rng.random() < 0.7 else rng.randbytes(rng.randrange(64))
        return struct.pack("<4sIQ", MAGIC, len(head), 3) + head + b"abc"
    if kind == 3:
        offset, fmt, bits = rng.choice([(4, "<I", 32), (8, "<Q", 64)])
        struct.pack_into(fmt, data, offset, rng.choice(LENGTHS + [rng.randrange(300)]) % (1 << bits))
        return bytes(data)
    return mutate_bytes(bytes(data), rng)


def mutated_header(header: dict, rng: random.Random) -> dict:
    header = dict(header)
    for _ in range(rng.randint(0, 3)):
        name = rng.choice(sorted(header) + ["extra"])
        if rng.random() < 0.75:
            header[name] = rng.choice([plain(rng), plain(rng), 10**400, 2**53, -(10**30), "L9M9", XCERT])
        else:
            header.pop(name, None)
    return header


def framed(header: dict, rng: random.Random, payload: bytes = b"", then: bytes = b"") -> bytes:
    try:
        data = message(header, payload)
    except (TypeError, ValueError, WireError, RecursionError):  # unwritable fields: keep the writable ones
        data = message({k: v for k, v in header.items() if isinstance(v, str | int) and len(str(v)) < 4000}, payload)
    return data + then if rng.random() < 0.5 else mutate_bytes(data + then, rng)


def spec_text(rng: random.Random) -> str:
    kind = rng.randrange(8)
    if kind == 0:
        return random_text(rng, rng.randrange(200))
    if kind == 1:
        return "".join(rng.choices(TOML_ALPHABET, k=rng.randrange(200)))
    lines = rng.choice(BASE_SPECS).split("\n")
    for _ in range(rng.randint(1, 3)):
        op = rng.randrange(7)
        if op <= 2:
            at = rng.choice([i for i, line in enumerate(lines) if " = " in line] or [0])
            value = rng.choice(TOML_VALUES) if rng.random() < 0.7 else random_text(rng, rng.randrange(10))
            lines[at] = lines[at].split(" = ")[0] + " = " + value
            continue
        at = rng.randrange(len(lines))
        if op == 3:
            del lines[at]
        elif op == 4:
            lines.insert(at, lines[at])
        elif op == 5:
            lines.insert(at, rng.choice(["x = 1", "[x]", "[[model]]", "model = 1", "levels = [2]"]))
        else:
            lines[at] = mutate_text(lines[at], TOML_ALPHABET, rng)
    return "\n".join(lines)


# ---- the offline exchange ------------------------------------------------------------------------------
class Sink:
    """Stands in for an asyncio.StreamWriter: keeps what is written."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.closed = False

    def write(self, data: bytes) -> None:
        self.data += data

    async def drain(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


class FakeStreams:
    """Stands in for protocol/net/streams.py's PeerStreams: every stream opened is answered with the given bytes (what a
    hostile peer would send back); handlers served are kept, never called."""

    def __init__(self, reply: bytes):
        self.reply = reply
        self.handlers: dict[str, Callable] = {}

    async def serve(self, name: str, handler: Callable) -> None:
        self.handlers[name] = handler

    async def open(self, peer_id: str, name: str) -> tuple[asyncio.StreamReader, Sink]:
        return reader_of(self.reply), Sink()


def reader_of(data: bytes) -> asyncio.StreamReader:
    reader = asyncio.StreamReader()  # inside a running loop
    reader.feed_data(data)
    reader.feed_eof()
    return reader


class SkippingClock:
    """A clock whose sleeps return at once and move its time on: the client's retry pauses (0.3 s after each broken
    reply) cost nothing, so the fuzzer spends its time on inputs (they took 23 s of the unit suite)."""

    def __init__(self) -> None:
        self.skipped = 0.0

    def now(self) -> float:
        return time.monotonic() + self.skipped

    async def sleep(self, seconds: float) -> None:
        self.skipped += max(0.0, seconds)
        await asyncio.sleep(0)


def exchange(private: bool, streams: FakeStreams | None = None) -> ModuleExchange:
    spec = XPRIVATE if private else XSPEC

    return ModuleExchange(spec, streams, OTHER_PEER, {m: NUMEL for m in spec.all_module_ids()}, lambda m: STATE,
                          membership=XCERT if private else "", clock=SkippingClock())


MESSAGES = [message({}), message({"status": "ok", "round": 3, "digest": "ab"}, bytes(range(256)) * 4),
            message({"module": "L0M1", "round": 1, "tokens": 10, "digest": "0" * 16, "membership": CERT}),
            message({"swarm_id": SPEC.swarm_id}, b"x")]


class Loop:
    """One event loop for all the async inputs of a parser (a fresh one after a hang cut it short)."""

    def __init__(self) -> None:
        self.runner = asyncio.Runner()

    def run(self, coro):
        return self.runner.run(coro)

    def reset(self) -> None:
        try:
            self.runner.close()
        except BaseException:  # noqa: BLE001 - a loop a hang interrupted may fail to close; drop it
            pass
        self.runner = asyncio.Runner()


LOOP = Loop()


def check_reply(reply: bytes) -> str:
    """A handler's reply must be a well-formed message with a known status (or nothing at all); a merged
    contribution carries the module's mean frame, a state reply its anchor and momentum."""
    if not reply:
        return "refused"
    header, payload = LOOP.run(read(reply, 1 << 20))
    status = header.get("status")
    assert status in STATUSES, f"unknown status {str(status)[:40]}"
    if status in ("merged", "alone"):
        assert decode(payload, max_elements=NUMEL).numel() == NUMEL, "the mean frame is not the module's"
    if status == "ok":
        assert len(payload) == 8 * NUMEL, "the state is not the module's"
    return "accepted" if status in ("merged", "alone", "ok") else "refused"


async def read(data: bytes, max_payload: int, traffic: Traffic | None = None) -> tuple[dict, bytes]:
    """read_message over `data` (run it on LOOP)."""
    return await read_message(reader_of(data), max_payload, traffic)


# ---- the parsers and what each must guarantee ------------------------------------------------------------
def run_parse_record(inp) -> str:
    model, raw, spec = inp
    record = parse_record(model, raw, spec)
    assert isinstance(record, model)
    for name in ("round", "numel", "bytes_sent", "bytes_received"):
        assert 0 <= getattr(record, name, 0) <= MAX_COUNT, f"{name} out of bounds"
    assert re.fullmatch(r"[0-9A-Za-z]{1,128}", record.peer_id) and len(record.membership) <= MAX_CERT_BYTES
    if spec is not None and hasattr(record, "path"):
        spec.check_path(record.path)
    if spec is not None and hasattr(record, "module_id"):
        assert record.module_id in spec.all_module_ids(), "a module the spec does not have"
    assert parse_record(model, record_to_wire(record), spec) == record, "no round trip through the wire dict"
    assert parse_record(model, record_to_json(record), spec) == record, "no round trip through JSON"
    assert parse_record(model, as_sent(record_to_wire(record), "msgpack"), spec) == record, "no msgpack round trip"
    return "accepted"


def gen_parse_record(rng: random.Random):
    kind = rng.randrange(4)
    spec = SPEC if rng.random() < 0.8 else None
    if kind == 0:
        fields = {rng.choice(ALL_FIELDS): plain(rng) for _ in range(rng.randrange(9))}
        raw = plain(rng) if rng.random() < 0.3 else fields
        return rng.choice(MODELS), raw, spec
    if kind == 1:
        model, wire = mutated_wire(rng)
        return model, as_sent(wire, rng.choice(["dict", "msgpack", "json", "text"])), spec
    if kind == 2:
        record = rng.choice(RECORDS)
        data = mutate_bytes(record_to_json(record), rng)
        return type(record), (data.decode("utf-8", "replace") if rng.random() < 0.5 else data), spec
    return rng.choice(MODELS), rng.randbytes(rng.choice([rng.randrange(300), rng.randrange(4000, 4200)])), spec


def gen_validator(rng: random.Random):
    private = rng.random() < 0.5
    key, model = rng.choice(KEYS[private])
    kind = rng.randrange(4)
    if kind == 0:
        value = packed(mutated_wire(rng)[1])
    elif kind == 1:
        value = mutate_bytes(packed(record_to_wire(rng.choice(RECORDS))), rng)
    elif kind == 2:
        value = packed(record_to_wire(rng.choice(RECORDS)))
    else:
        value = rng.randbytes(rng.choice([rng.randrange(300), rng.randrange(4090, 4200)]))
    expires = time.time() + rng.choice([10.0, 1e6])  # the second beyond every record's lifetime cap
    return private, model, DHTRecord(DHTID.generate(source=key).to_bytes(), owner_subkey(rng), value, expires)


def run_validator(inp) -> str:
    private, model, record = inp
    accepted = VALIDATORS[private].validate(record)
    assert accepted is True or accepted is False, "validate must answer a bool"
    if accepted and model is not None:  # what enters the DHT is what every reader accepts, in the signer's name
        parsed = parse_record(model, MSGPackSerializer.loads(record.value), PRIVATE if private else SPEC)
        assert parsed.peer_id == peer_id_of_owner(record.subkey), "accepted a record in another peer's name"
    return "accepted" if accepted else "refused"


def run_peer_id(subkey: bytes) -> str:
    peer_id = peer_id_of_owner(subkey)
    assert peer_id is None or re.fullmatch(r"[1-9A-HJ-NP-Za-km-z]{1,128}", peer_id), "not a base58 peer id"
    if subkey in (RSA_OWNER, MSGPackSerializer.dumps(RSA_OWNER)):
        assert peer_id == PEER, "the owner's own key names another peer"
    return "refused" if peer_id is None else "accepted"


def run_parse_cert(tok) -> str:
    cert, payload, signature = parse(tok)
    text = tok.decode("ascii") if isinstance(tok, bytes) else tok
    assert cert.token == text.strip() and len(cert.token) <= MAX_CERT_BYTES
    assert re.fullmatch(r"[0-9a-f]{64}", cert.swarm_id) and re.fullmatch(r"[0-9A-Za-z]{1,128}", cert.peer_id)
    assert 0 <= cert.issued_at < 1e11 and 0 <= cert.expires_at < 1e11
    assert isinstance(payload, bytes) and isinstance(signature, bytes)
    return "accepted"


VERIFY_NOWS = [NOW, 4e9 + CLOCK_SKEW_S + 1, 0.0, 1e12]


def gen_verify(rng: random.Random):
    return token(rng), rng.choice([PEER, OTHER_PEER]), rng.choice(VERIFY_NOWS)


REVOCATIONS = sign_revocations(OWNER, PRIVATE.swarm_id, {PEER, OTHER_PEER}, now=NOW)
REV_PAYLOAD = json.loads(base64.urlsafe_b64decode(REVOCATIONS.token.split(".")[1] + "=="))


def revocation_token(rng: random.Random) -> object:
    """Revocation lists: valid, edited as text, with a rewritten payload (re-signed by the owner or not), another
    owner's, or not text at all."""
    kind = rng.randrange(6)
    if kind == 0:
        return REVOCATIONS.token
    if kind == 1:
        return mutate_text(REVOCATIONS.token, TOKEN_ALPHABET, rng)
    if kind in (2, 3):
        body = dict(REV_PAYLOAD)
        for _ in range(rng.randint(1, 3)):
            name = rng.choice(sorted(REV_PAYLOAD) + ["extra"])
            body[name] = rng.choice([plain(rng), [PEER] * rng.randrange(100), ["x" * 200], PRIVATE.swarm_id, -1, 1e30])
        raw = json.dumps(body, default=repr).encode("utf-8", "surrogatepass")
        signature = OWNER.sign(raw) if kind == 2 else rng.randbytes(64)
        b64 = base64.urlsafe_b64encode
        return f"psr1.{b64(raw).decode().rstrip('=')}.{b64(signature).decode()}"
    if kind == 4:
        return sign_revocations(Ed25519PrivateKey.generate(), PRIVATE.swarm_id, {PEER}, now=NOW).token
    return rng.choice([None, 3, b"\xff" * 10, plain(rng), "psr1." + "A" * 5000])


def run_revocations(tok) -> str:
    revs = verify_revocations(tok, owner_key=OWNER_KEY, swarm_id=PRIVATE.swarm_id)
    # Admitted: the owner's, for this swarm, bounded peer ids.
    assert revs.swarm_id == PRIVATE.swarm_id and len(revs.peers) <= MAX_REVOKED
    assert all(re.fullmatch(r"[0-9A-Za-z]{1,128}", p) for p in revs.peers)
    return "accepted"


def run_verify(inp) -> str:
    tok, peer, now = inp
    cert = verify(tok, owner_key=OWNER_KEY, swarm_id=PRIVATE.swarm_id, peer_id=peer, now=now)
    # Admitted: signed by the owner, for this swarm and peer, not expired.
    assert (cert.swarm_id, cert.peer_id) == (PRIVATE.swarm_id, peer) and now <= cert.expires_at + CLOCK_SKEW_S
    _, payload, signature = parse(tok)
    OWNER.public_key().verify(signature, payload)
    return "accepted"


def _membership_error(call: Callable[[], object]) -> MembershipError | None:
    try:
        call()
    except MembershipError as e:
        return e
    return None


def run_gate(inp) -> str:
    tok, peer, now = inp
    open_gate = Gate("", SPEC.swarm_id)
    assert _membership_error(lambda: open_gate.check(tok, peer, now=now)) is None, "an open swarm refused a peer"
    gate = Gate(OWNER_KEY, PRIVATE.swarm_id)
    # The second check may be answered from the gate's cache: it must agree, and so must verify.
    errors = [_membership_error(lambda: gate.check(tok, peer, now=now)) for _ in range(2)]
    errors.append(_membership_error(
        lambda: verify(tok, owner_key=OWNER_KEY, swarm_id=PRIVATE.swarm_id, peer_id=peer, now=now)))
    assert len({e is None for e in errors}) == 1, "the gate and verify disagree"
    if errors[0] is not None:
        raise errors[0]
    return "accepted"


def gen_read_message(rng: random.Random):
    return wire_message(rng), rng.choice(MAX_PAYLOADS)


def run_read_message(inp) -> str:
    data, max_payload = inp
    traffic = Traffic()
    header, payload = LOOP.run(read(data, max_payload, traffic))
    assert isinstance(header, dict) and len(payload) <= max_payload
    assert traffic.received <= len(data) and traffic.received - len(payload) <= 16 + MAX_HEADER_BYTES
    return "accepted"


FIELD_NAMES = ["module", "round", "tokens", "digest", "status", ""]
FIELD_KINDS = [str, int, float, bool, list, dict, (int, float), (str, bytes)]


def gen_field_of(rng: random.Random):
    header = {rng.choice(FIELD_NAMES + [random_text(rng, 5)]): plain(rng) for _ in range(rng.randrange(7))}
    return header, rng.choice(FIELD_NAMES), rng.choice(FIELD_KINDS)


def run_field_of(inp) -> str:
    header, name, kind = inp
    value = field_of(header, name, kind)
    assert isinstance(value, kind) and value is header[name] and (not isinstance(value, bool) or kind is bool)
    return "accepted"


def gen_contribute_request(rng: random.Random):
    private = rng.random() < 0.5
    header = {"module": "shared", "round": STATE.round, "tokens": 1000, "digest": STATE.digest(),
              "membership": XCERT if private else ""}
    frame = FRAME if rng.random() < 0.5 else mutate_bytes(FRAME, rng)
    return private, framed(mutated_header(header, rng), rng, then=message({}, frame))


def gen_state_request(rng: random.Random):
    private = rng.random() < 0.5
    return private, framed(mutated_header({"module": "L1M1", "membership": XCERT if private else ""}, rng), rng)


def gen_stance_request(rng: random.Random):
    private = rng.random() < 0.5
    header = {"module": "shared", "round": STATE.round, "digest": STATE.digest(),
              "membership": XCERT if private else ""}
    return private, framed(mutated_header(header, rng), rng)


def run_stance(inp) -> str:
    """A stance reply names one of the stances (or the request is refused with a reason, or dropped)."""
    reply = LOOP.run(handle("_on_stance", *inp))
    if not reply:
        return "refused"
    header, payload = LOOP.run(read(reply, 1 << 20))
    if header.get("status") == "refused":
        return "refused"
    assert header.get("stance") in {s.value for s in Stance} and not payload, f"bad stance {str(header)[:60]}"
    return "accepted"


async def handle(handler_name: str, private: bool, data: bytes) -> bytes:
    """What the exchange's handler `handler_name` writes back to a peer that sent `data`."""
    sink = Sink()
    await asyncio.wait_for(getattr(exchange(private).service, handler_name)(PEER, reader_of(data), sink), 10)
    assert sink.closed, "the handler must close its stream"
    return bytes(sink.data)


def serve(handler_name: str) -> Callable:
    return lambda inp: check_reply(LOOP.run(handle(handler_name, *inp)))


def gen_state_reply(rng: random.Random) -> bytes:
    header = mutated_header({"status": "ok", "round": STATE.round, "digest": STATE.digest(), "reducers": [PEER]}, rng)
    payload = rng.choice([STATE_PAYLOAD, mutate_bytes(STATE_PAYLOAD, rng), rng.randbytes(rng.randrange(600))])
    return framed(header, rng, payload)


def run_fetch_state(reply: bytes) -> str:
    result = LOOP.run(exchange(False, FakeStreams(reply)).fetch_state(PEER, "L0M1", 5.0))
    if result is None:
        return "refused"
    round_, digest, anchor, momentum = result.round, result.digest(), result.anchor, result.momentum
    assert isinstance(round_, int) and 0 <= round_ < 1 << 63 and isinstance(digest, str), "round out of bounds"
    assert anchor.shape == momentum.shape == (NUMEL,)
    assert bool(torch.isfinite(anchor).all() and torch.isfinite(momentum).all()), "non-finite state"
    assert len(result.reducers) <= 64 and all(p.isalnum() for p in result.reducers), "reducers unchecked"
    return "accepted"


def gen_contribute_reply(rng: random.Random) -> bytes:
    header = {"module": "L0M0", "round": 3, "status": "merged", "contributors": [PEER, OTHER_PEER], "tokens": 5,
              "digest_after": "d1" * 8, "reason": "", "reducers": [PEER], "redirect": "",
              "frame_tokens": [7, 5], "own": frame_hash(FRAME),
              "frames_digest": commit_frames([(PEER, 7, frame_hash(FRAME)), (OTHER_PEER, 5, frame_hash(FRAME))])}
    return framed(mutated_header(header, rng), rng, FRAME)


def run_contribute_reply(reply: bytes) -> str:
    result = LOOP.run(exchange(False, FakeStreams(reply)).contribute([PEER], "L0M0", 3, 5, STATE.digest(), FRAME, 5.0))
    assert isinstance(result.status, str) and isinstance(result.mean_frame, bytes)
    return "accepted" if result.status in ("merged", "alone", "late") else "refused"


def gen_frame_list(rng: random.Random) -> object:
    valid = [[PEER, 5], [OTHER_PEER, 1]]
    if rng.random() < 0.3:
        return plain(rng)
    text = mutate_text(json.dumps(valid), '[]",0123456789abcdefQm- ', rng)
    try:
        return json.loads(text)
    except ValueError:  # not JSON: the text itself, as a malformed header field would arrive
        return text


def run_frame_list(value: object) -> str:
    listed = parse_listed(value)
    assert len(listed) <= MAX_LISTED and all(0 < t <= 1 << 53 for _, t in listed)
    assert len({p for p, _ in listed}) == len(listed)
    return "accepted"


def run_decode(data: bytes) -> str:
    y = decode(data, max_elements=FRAME_MAX_ELEMENTS)
    assert y.numel() <= FRAME_MAX_ELEMENTS and bool(torch.isfinite(y).all()), "decoded values out of bounds"
    return "accepted"


def run_decode_sparse(data: bytes) -> str:
    y = decode_sparse(data, max_elements=FRAME_MAX_ELEMENTS)
    assert y.numel() <= FRAME_MAX_ELEMENTS and bool(torch.isfinite(y).all()), "decoded values out of bounds"
    return "accepted"


def run_loads_spec(text: str) -> str:
    spec = loads_spec(text)
    assert re.fullmatch(r"[0-9a-f]{64}", spec.swarm_id)
    assert loads_spec(spec.to_toml()).swarm_id == spec.swarm_id, "the spec does not round-trip"
    return "accepted"


@dataclass(frozen=True)
class Fuzzer:
    name: str
    generate: Callable[[random.Random], object]
    run: Callable[[object], str]
    """Returns 'accepted' or 'refused'; raises the typed error or, on a bug, anything else."""
    typed: tuple[type[BaseException], ...] = ()


FUZZERS = [
    Fuzzer("records.parse_record", gen_parse_record, run_parse_record, (RecordError,)),
    Fuzzer("dht.SwarmRecordValidator.validate", gen_validator, run_validator),
    Fuzzer("dht.peer_id_of_owner", owner_subkey, run_peer_id),
    Fuzzer("membership.parse", token, run_parse_cert, (MembershipError,)),
    Fuzzer("membership.verify", gen_verify, run_verify, (MembershipError,)),
    Fuzzer("membership.Gate.check", gen_verify, run_gate, (MembershipError,)),
    Fuzzer("membership.verify_revocations", revocation_token, run_revocations, (MembershipError,)),
    Fuzzer("wire.read_message", gen_read_message, run_read_message, (WireError, asyncio.IncompleteReadError)),
    Fuzzer("wire.field_of", gen_field_of, run_field_of, (WireError,)),
    Fuzzer("exchange.service._on_contribute", gen_contribute_request, serve("_on_contribute")),
    Fuzzer("exchange.service._on_state", gen_state_request, serve("_on_state")),
    Fuzzer("exchange.service._on_stance", gen_stance_request, run_stance),
    Fuzzer("exchange.fetch_state", gen_state_reply, run_fetch_state),
    Fuzzer("exchange.contribute (reply)", gen_contribute_reply, run_contribute_reply),
    Fuzzer("audit.parse_listed", gen_frame_list, run_frame_list, (ValueError,)),
    Fuzzer("compression.decode", lambda rng: mutate_frame(rng.choice(FRAMES), rng), run_decode, (CodecError,)),
    Fuzzer("compression.decode_sparse", lambda rng: mutate_sparse_frame(rng.choice(SPARSE_FRAMES), rng),
           run_decode_sparse, (CodecError,)),
    Fuzzer("spec.loads_spec", spec_text, run_loads_spec, (SpecError,)),
]

BY_NAME = {f.name: f for f in FUZZERS}


def outcome(fuzzer: Fuzzer, inp: object) -> tuple[str, BaseException | None]:
    """('accepted' | 'refused', None) or ('typed_error', the error); anything else (a bug) propagates."""
    try:
        return fuzzer.run(inp), None
    except fuzzer.typed as e:
        assert str(e), "a typed error must say what was wrong"
        return "typed_error", e
