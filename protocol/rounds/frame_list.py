"""What a round's result commits to: the merged contributions as (peer, tokens) and one sha256 over their frames.

A reducer knows every merged frame (`list_frames`); its members are told the list, the commitment
(`commit_frames`) and each its own frame's hash (messages.py `RoundReply`); an auditor recomputes the commitment
from the frames it downloads (rule.py `audit_mean`). Pure: no networking.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

MAX_TOKENS = 1 << 53
"""Most tokens one contribution may count (exact in a float; no round trains so many)."""
MAX_ID = 128
"""Longest module or peer id accepted."""
MAX_LISTED = 1024
"""Most contributions a result may list."""

FrameEntry = tuple[str, int, str]
"""(peer, tokens, sha256 hex of its frame): one merged contribution, as the reducer knows it."""
Listed = tuple[str, int]
"""(peer, tokens): one merged contribution as a result tells its members; the frame hashes are behind the result's
`frames_digest`."""


def frame_hash(frame: bytes) -> str:
    return hashlib.sha256(frame).hexdigest()


def is_sha256_hex(value: object) -> bool:
    return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)


def commit_frames(entries: Sequence[FrameEntry]) -> str:
    """One sha256 over a result's whole frame list, in its order: what a result carries instead of a hash per frame.
    An auditor recomputes it from the frames it downloads; a member checks its own entry against `own` (RoundReply).
    A list of N entries cost every reply about 130·N bytes (N reducers' replies to N members in a round in slices:
    0.3 of a frame a round per node at 16 holders, benchmarks/scale.py); the commitment costs 64."""
    h = hashlib.sha256()
    for peer, tokens, digest in entries:
        h.update(f"{peer} {tokens} {digest}\n".encode())
    return h.hexdigest()


def parse_listed(value: object) -> tuple[Listed, ...]:
    """A result's list of merged contributions, received from a peer (untrusted): ValueError unless it is a list of
    at most MAX_LISTED [peer id, positive int], peers distinct."""
    if not isinstance(value, list) or len(value) > MAX_LISTED:
        raise ValueError("the frame list is not a bounded list")
    out = []
    for item in value:
        if not (isinstance(item, list) and len(item) == 2):
            raise ValueError("a frame entry is not [peer, tokens]")
        peer, tokens = item
        if not (isinstance(peer, str) and 0 < len(peer) <= MAX_ID and peer.isalnum()):
            raise ValueError("a frame entry's peer is not a peer id")
        if not (isinstance(tokens, int) and not isinstance(tokens, bool) and 0 < tokens <= MAX_TOKENS):
            raise ValueError("a frame entry's token count is out of range")
        out.append((peer, tokens))
    if len({p for p, _ in out}) != len(out):
        raise ValueError("a peer is listed twice")
    return tuple(out)


def list_frames(frames: dict[str, tuple[int, bytes]], used: tuple[str, ...] | list[str]) -> tuple[FrameEntry, ...]:
    """The merged peers' (peer, tokens as sent, frame hash), in the order of `used`: what a result commits to."""
    return tuple((p, frames[p][0], frame_hash(frames[p][1])) for p in used)
