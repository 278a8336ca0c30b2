"""Membership certificates of a private swarm: the owner signs "peer P may join swarm S until T".

A private swarm's spec carries its owner's Ed25519 public key (`membership.owner_key`), so the swarm
id commits to it. `pathswarm swarm invite` signs a certificate binding three things: the swarm id,
one libp2p peer id, and an expiry time. A peer presents it with every record it writes to the DHT
and with every request it makes to another node (joining a module's averaging group, downloading
module state). The receiver checks the signature against the spec's owner key, that the swarm id is
its own, that the certificate has not expired, and that the peer id in it is the one that signed the
record (for DHT writes) or the one libp2p authenticated on the connection (for requests). A copied
certificate is therefore worthless to any other peer id: replaying it needs that peer's private key.

Wire form, one ASCII token: `psm1.<base64url(payload json)>.<base64url(signature)>`; the signature
covers the literal payload bytes. Parsing is bounded (MAX_CERT_BYTES) and raises MembershipError only.

Revocation (`pathswarm swarm revoke`): the owner signs the list of peer ids it has revoked, with the time it
signed it (`psr1.…`, same form). Lists are cumulative, so the newest one a peer has seen is the whole truth;
a `Gate` that learns a newer list refuses the revoked peers from then on, whatever certificate they hold.

Pure code: `cryptography` and the standard library, no networking.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

PREFIX = "psm1"
REVOCATION_PREFIX = "psr1"
MAX_REVOKED = 40
"""Most peer ids one revocation list holds (it travels in a DHT record of at most 4 KiB, with the relaying member's
certificate); past that, start a new swarm with a new owner key."""
MAX_REVOCATION_BYTES = 3400
MAX_CERT_BYTES = 1024
"""A certificate longer than this is refused unread (ours are about 260 characters)."""
CLOCK_SKEW_S = 300.0
"""A certificate is still accepted this long after its expiry, for peers whose clocks run behind."""
OWNER_KEY_PREFIX = "ed25519:"
_B64URL = re.compile(r"^[A-Za-z0-9_-]+={0,2}$")
_PEER_ID = re.compile(r"^[0-9A-Za-z]{1,128}$")
_SWARM_ID = re.compile(r"^[0-9a-f]{64}$")


class MembershipError(ValueError):
    """A membership certificate is malformed, forged, expired, or not this peer's or swarm's."""


@dataclass(frozen=True)
class Membership:
    """A verified (or freshly issued) certificate."""

    swarm_id: str
    peer_id: str
    issued_at: float
    expires_at: float
    token: str
    """The wire form, presented as is."""


def _b64e(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _b64d(text: str, what: str) -> bytes:
    if not _B64URL.match(text):
        raise MembershipError(f"certificate {what} is not base64url")
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raise MembershipError(f"certificate {what} is not base64url") from None


# ---- owner keys ------------------------------------------------------------------------------------
def public_key_text(key: Ed25519PrivateKey | Ed25519PublicKey) -> str:
    """`ed25519:<base64url of the 32 raw bytes>`: how a spec names its owner."""
    public = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    return OWNER_KEY_PREFIX + _b64e(public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw))


def parse_public_key(text: str) -> Ed25519PublicKey:
    if not isinstance(text, str) or not text.startswith(OWNER_KEY_PREFIX):
        raise MembershipError(f"owner key must look like '{OWNER_KEY_PREFIX}<base64url>', got {str(text)[:60]!r}")
    raw = _b64d(text[len(OWNER_KEY_PREFIX):], "owner key")
    if len(raw) != 32:
        raise MembershipError(f"owner key must hold 32 bytes, got {len(raw)}")
    return Ed25519PublicKey.from_public_bytes(raw)


def owner_key_fingerprint(owner_key: str) -> str:
    """A short, file-name-safe name for an owner key (its first 16 base64url characters)."""
    parse_public_key(owner_key)
    return owner_key[len(OWNER_KEY_PREFIX):][:16]


def save_owner_key(key: Ed25519PrivateKey, path: Path, passphrase: str | None = None) -> None:
    """Write an owner key as PEM with mode 0600, encrypted with `passphrase` when given (PKCS#8, the best scheme
    `cryptography` offers); never overwrite an existing file (it may admit a swarm)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    encryption = (serialization.BestAvailableEncryption(passphrase.encode()) if passphrase
                  else serialization.NoEncryption())
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise MembershipError(f"{path} already exists; an owner key is never overwritten") from None
    with os.fdopen(fd, "wb") as f:
        f.write(pem)


class PassphraseNeeded(MembershipError):
    """The owner key file is encrypted and no passphrase (or a wrong one) was given."""


def owner_key_encrypted(path: Path) -> bool:
    """Whether an owner key file is passphrase-encrypted (without reading the key)."""
    try:
        return b"ENCRYPTED PRIVATE KEY" in path.read_bytes()[:64]
    except OSError:
        return False


def load_owner_key(path: Path, passphrase: str | None = None) -> Ed25519PrivateKey:
    """Read an owner key (decrypting it with `passphrase` if it is encrypted); refuse one that other users can
    read (it lets anyone admit peers)."""
    try:
        mode = path.stat().st_mode
        data = path.read_bytes()
    except OSError as e:
        raise MembershipError(f"owner key {path} is unreadable ({e.strerror})") from None
    if stat.S_IMODE(mode) & 0o077:
        raise MembershipError(f"owner key {path} is readable by other users; run: chmod 600 {path}")
    encrypted = b"ENCRYPTED PRIVATE KEY" in data[:64]
    if encrypted and not passphrase:
        raise PassphraseNeeded(f"owner key {path} is encrypted: give its passphrase")
    try:
        password = passphrase.encode() if encrypted and passphrase else None
        key = serialization.load_pem_private_key(data, password=password)
    except (ValueError, TypeError):
        if encrypted:
            raise PassphraseNeeded(f"wrong passphrase for owner key {path}") from None
        raise MembershipError(f"owner key {path} is not a PEM private key") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise MembershipError(f"owner key {path} is not an Ed25519 key")
    return key


# ---- certificates ----------------------------------------------------------------------------------
def issue(owner: Ed25519PrivateKey, swarm_id: str, peer_id: str, expires_at: float,
          now: float | None = None) -> Membership:
    """Sign a certificate admitting `peer_id` to `swarm_id` until `expires_at` (unix seconds)."""
    now = time.time() if now is None else now
    if not _SWARM_ID.match(swarm_id):
        raise MembershipError(f"swarm id must be 64 hex characters, got {swarm_id[:80]!r}")
    if not _PEER_ID.match(peer_id):
        raise MembershipError(f"peer id must be base58 (what `pathswarm node id` prints), got {peer_id[:80]!r}")
    if not expires_at > now:
        raise MembershipError("the certificate would expire before it is issued")
    payload = json.dumps({"v": 1, "swarm": swarm_id, "peer": peer_id, "iat": int(now), "exp": int(expires_at)},
                         sort_keys=True, separators=(",", ":")).encode()
    token = f"{PREFIX}.{_b64e(payload)}.{_b64e(owner.sign(payload))}"
    return Membership(swarm_id, peer_id, float(int(now)), float(int(expires_at)), token)


def parse(token: str | bytes) -> tuple[Membership, bytes, bytes]:
    """Split and decode a token without verifying it: (unverified membership, payload, signature)."""
    if isinstance(token, bytes):
        try:
            token = token.decode("ascii")
        except UnicodeDecodeError:
            raise MembershipError("certificate is not ASCII") from None
    if not isinstance(token, str):
        raise MembershipError(f"certificate must be text, got {type(token).__name__}")
    token = token.strip()
    if len(token) > MAX_CERT_BYTES:
        raise MembershipError(f"certificate of {len(token)} characters exceeds {MAX_CERT_BYTES}")
    parts = token.split(".")
    if len(parts) != 3 or parts[0] != PREFIX:
        raise MembershipError(f"not a pathswarm membership certificate (expected '{PREFIX}.<payload>.<signature>')")
    payload, signature = _b64d(parts[1], "payload"), _b64d(parts[2], "signature")
    try:
        body = json.loads(payload)
    except (ValueError, RecursionError):
        raise MembershipError("certificate payload is not JSON") from None
    if not isinstance(body, dict) or set(body) != {"v", "swarm", "peer", "iat", "exp"} or body["v"] != 1:
        raise MembershipError("certificate payload has unexpected fields or version")
    swarm, peer, iat, exp = body["swarm"], body["peer"], body["iat"], body["exp"]
    if not (isinstance(swarm, str) and _SWARM_ID.match(swarm) and isinstance(peer, str) and _PEER_ID.match(peer)):
        raise MembershipError("certificate names a malformed swarm id or peer id")
    if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 10**11 for t in (iat, exp)):
        raise MembershipError("certificate times must be integers (unix seconds)")
    return Membership(swarm, peer, float(iat), float(exp), token), payload, signature


def verify(token: str | bytes | None, *, owner_key: str, swarm_id: str, peer_id: str,
           now: float | None = None, check_expiry: bool = True) -> Membership:
    """The certificate, if it admits `peer_id` to `swarm_id` now (`check_expiry=False`: at some time); else
    MembershipError saying why."""
    if not token:
        raise MembershipError("no membership certificate presented (this swarm is private)")
    cert, payload, signature = parse(token)
    try:
        parse_public_key(owner_key).verify(signature, payload)
    except InvalidSignature:
        raise MembershipError("certificate is not signed by this swarm's owner") from None
    if cert.swarm_id != swarm_id:
        raise MembershipError(f"certificate is for swarm {cert.swarm_id[:12]}…, not {swarm_id[:12]}…")
    if cert.peer_id != peer_id:
        raise MembershipError(f"certificate is for peer {cert.peer_id}, presented by {peer_id}")
    now = time.time() if now is None else now
    if check_expiry and now > cert.expires_at + CLOCK_SKEW_S:
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(cert.expires_at))
        raise MembershipError(f"certificate expired at {when}; ask the swarm's owner for a new one")
    return cert


@dataclass(frozen=True)
class Revocations:
    """A verified revocation list."""

    swarm_id: str
    peers: frozenset[str]
    issued_at: float
    token: str


def sign_revocations(owner: Ed25519PrivateKey, swarm_id: str, peers: set[str] | frozenset[str],
                     now: float | None = None) -> Revocations:
    """The owner's signed list of every peer revoked from `swarm_id` (cumulative: pass the earlier ones too)."""
    now = time.time() if now is None else now
    if not _SWARM_ID.match(swarm_id):
        raise MembershipError(f"swarm id must be 64 hex characters, got {swarm_id[:80]!r}")
    bad = [p for p in peers if not _PEER_ID.match(p)]
    if bad:
        raise MembershipError(f"peer id must be base58 (what `pathswarm node id` prints), got {bad[0][:80]!r}")
    if len(peers) > MAX_REVOKED:
        raise MembershipError(f"a revocation list holds at most {MAX_REVOKED} peers; start a new swarm with a new "
                              f"owner key instead")
    payload = json.dumps({"v": 1, "swarm": swarm_id, "revoked": sorted(peers), "iat": int(now)},
                         sort_keys=True, separators=(",", ":")).encode()
    token = f"{REVOCATION_PREFIX}.{_b64e(payload)}.{_b64e(owner.sign(payload))}"
    if len(token) > MAX_REVOCATION_BYTES:
        raise MembershipError(f"the revocation list is {len(token)} characters, over {MAX_REVOCATION_BYTES}")
    return Revocations(swarm_id, frozenset(peers), float(int(now)), token)


def verify_revocations(token: str | bytes, *, owner_key: str, swarm_id: str) -> Revocations:
    """The revocation list, if the swarm's owner signed it for this swarm; else MembershipError saying why."""
    if isinstance(token, bytes):
        token = token.decode("ascii", errors="replace")
    if not isinstance(token, str) or len(token) > MAX_REVOCATION_BYTES:
        raise MembershipError(f"revocation list must be text of at most {MAX_REVOCATION_BYTES} characters")
    parts = token.strip().split(".")
    if len(parts) != 3 or parts[0] != REVOCATION_PREFIX:
        raise MembershipError(f"not a revocation list (expected '{REVOCATION_PREFIX}.<payload>.<signature>')")
    payload, signature = _b64d(parts[1], "payload"), _b64d(parts[2], "signature")
    try:
        parse_public_key(owner_key).verify(signature, payload)
    except InvalidSignature:
        raise MembershipError("revocation list is not signed by this swarm's owner") from None
    try:
        body = json.loads(payload)
    except (ValueError, RecursionError):
        raise MembershipError("revocation payload is not JSON") from None
    if not isinstance(body, dict) or set(body) != {"v", "swarm", "revoked", "iat"} or body["v"] != 1:
        raise MembershipError("revocation payload has unexpected fields or version")
    peers, iat = body["revoked"], body["iat"]
    if body["swarm"] != swarm_id:
        raise MembershipError("revocation list is for another swarm")
    if not (isinstance(peers, list) and len(peers) <= MAX_REVOKED
            and all(isinstance(p, str) and _PEER_ID.match(p) for p in peers)):
        raise MembershipError("revocation list names malformed peer ids")
    if not (isinstance(iat, int) and not isinstance(iat, bool) and 0 <= iat < 10**11):
        raise MembershipError("revocation time must be an integer (unix seconds)")
    return Revocations(swarm_id, frozenset(peers), float(iat), token.strip())


class Gate:
    """What a peer of one swarm checks certificates with; an open swarm's gate admits everyone.

    Verified (token, peer id) pairs are cached until the certificate expires, so a member's request
    costs one dictionary lookup, and the cache is bounded so strangers cannot grow it."""

    MAX_CACHED = 4096

    def __init__(self, owner_key: str, swarm_id: str):
        self.owner_key, self.swarm_id = owner_key, swarm_id
        self._ok: dict[tuple[str, str], float] = {}
        self.revocations: Revocations | None = None
        """The newest revocation list seen (its peers are refused, whatever certificate they present)."""

    def learn(self, token: str | bytes) -> bool:
        """Take a revocation list read from a peer if it is the owner's and newer than ours; True if it was."""
        if not self.private:
            return False
        revs = verify_revocations(token, owner_key=self.owner_key, swarm_id=self.swarm_id)
        # Newest first; two lists signed in the same second: the longer, then the larger token (every node alike).
        if self.revocations is not None and (revs.issued_at, len(revs.peers), revs.token) <= (
                self.revocations.issued_at, len(self.revocations.peers), self.revocations.token):
            return False
        self.revocations = revs
        return True

    @property
    def private(self) -> bool:
        return bool(self.owner_key)

    def revoked(self, peer_id: str) -> bool:
        """The owner revoked `peer_id` (as far as this gate has learnt)."""
        return self.revocations is not None and peer_id in self.revocations.peers

    def check(self, token: str | bytes | None, peer_id: str, now: float | None = None,
              valid_until: float | None = None) -> None:
        """Raise MembershipError unless `peer_id` may take part (always passes in an open swarm).

        `valid_until` (the DHT validator: a record's expiration time): instead of "now", the certificate must cover
        the record's whole life, and revocations are not applied. Both make the answer the same whenever it is
        asked: hivemind drops a storer's whole dictionary when one entry fails, so a record whose certificate
        expired, or whose writer was revoked, after it was stored would hide everyone's. Readers apply revocations
        record by record."""
        if not self.private:
            return
        if valid_until is not None:
            cert = verify(token, owner_key=self.owner_key, swarm_id=self.swarm_id, peer_id=peer_id, check_expiry=False)
            if cert.expires_at + CLOCK_SKEW_S < valid_until:
                raise MembershipError("certificate expires before the record does; ask the swarm's owner for a new one")
            return
        if self.revoked(peer_id):
            raise MembershipError(f"peer {peer_id} was revoked by the swarm's owner")
        now = time.time() if now is None else now
        key = (token if isinstance(token, str) else repr(token), peer_id)
        expires = self._ok.get(key)
        if expires is not None and now <= expires + CLOCK_SKEW_S:
            return
        cert = verify(token, owner_key=self.owner_key, swarm_id=self.swarm_id, peer_id=peer_id, now=now)
        if len(self._ok) >= self.MAX_CACHED:
            self._ok.clear()
        self._ok[key] = cert.expires_at


def gate_of(owner_key: str, swarm_id: str) -> Gate:
    """The one gate of a swarm in this process: the record validator, the readers of records and the module
    exchange share it, so a revocation learnt by any of them is enforced by all."""
    key = (owner_key, swarm_id)
    if key not in _GATES:
        _GATES[key] = Gate(owner_key, swarm_id)
    return _GATES[key]


_GATES: dict[tuple[str, str], Gate] = {}


def parse_expiry(text: str, now: float | None = None) -> float:
    """`30d`, `12h`, `90m` (from now) or an ISO date/time `2027-01-31[T12:00]` (UTC) → unix seconds."""
    now = time.time() if now is None else now
    text = text.strip()
    m = re.fullmatch(r"(\d+)\s*([dhm])", text)
    if m:
        return now + int(m.group(1)) * {"d": 86400, "h": 3600, "m": 60}[m.group(2)]
    from datetime import UTC, datetime

    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise MembershipError(f"--expires takes 30d, 12h, 90m or a date like 2027-01-31, got {text!r}") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()
