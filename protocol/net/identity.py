"""Identity files: the RSA libp2p key p2pd and the record signatures share (protocol/net/start.py loads it).

A node that keeps its identity file across restarts keeps its peer id and its subkey.
"""

from __future__ import annotations

from hivemind.p2p import P2P, PeerID
from hivemind.proto import crypto_pb2
from hivemind.utils.crypto import RSAPrivateKey


def generate_identity(path: str) -> None:
    """Write a fresh RSA libp2p identity (protobuf) to `path`, mode 0400."""
    P2P.generate_identity(path)


def peer_id_of_identity_bytes(data: bytes) -> str:
    """The peer id (base58) a libp2p identity file's bytes give; ValueError if they are not one."""
    try:
        return PeerID.from_identity(data).to_base58()
    except Exception:  # protobuf / key parsing raise assorted types
        raise ValueError("not a libp2p identity file") from None


def load_identity(path: str) -> RSAPrivateKey:
    """The RSA private key of the identity file at `path`; ValueError if it holds another kind of key."""
    with open(path, "rb") as f:
        pb = crypto_pb2.PrivateKey.FromString(f.read())
    if pb.key_type != crypto_pb2.RSA:
        raise ValueError(f"{path}: identity is not an RSA key (hivemind's record signatures need one)")
    key = RSAPrivateKey.__new__(RSAPrivateKey)
    key.__setstate__({"_private_key": pb.data})  # hivemind's own unpickling: DER PKCS#1 → key
    return key
