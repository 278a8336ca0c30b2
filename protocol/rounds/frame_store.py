"""The frames a node keeps for audits: every frame of the rounds it reduced (or fetched to check), and its own frame of
the rounds it contributed to.

A round's frames are read by its members when they check the round (node/peer/audit.py): a new reducer's first
rounds before they are applied, later ones at random. Downloading them all from the reducer put every check of a
round on one uplink: at 16 members, 15 checkers × 15 frames from one node (about 90 MB for round 0 of
benchmarks/links_rounds.py, three minutes at 4 Mbit/s, during which the reducer's other connections broke and the
swarm's rounds fell apart). So each contributor also keeps the frame it sent and serves it to the round's other
contributors (audit.py `gather_frames`): a check draws one frame from each member's uplink, and the result's
commitment (frame_list.py `commit_frames`) tells the checker whether the frames it gathered are the ones the reducer
merged. Pure bookkeeping, no networking; the reducer writes from the network loop, an auditor from the training
thread.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from pathswarm.protocol.rounds.frame_list import MAX_LISTED, frame_hash

FRAMES_KEPT = 2
"""Rounds per module whose frames a reducer (or an auditor that fetched them), and a member its own frame, keeps."""
NOT_YET = "not yet"
"""`own_frame`'s answer while our reply of the round has not come: the asker should ask again soon."""


@dataclass
class _Own:
    peer: str
    tokens: int
    frame: bytes
    hash: str
    readers: frozenset[str] | None = None
    """The round's other contributors, once its result came and lists this frame (None: not come yet)."""
    waiting: bool = True
    """Our reply of the last send of this frame has not come: other askers are told "not yet"."""


class FrameStore:
    """The frames of the last FRAMES_KEPT rounds per module that we merged or fetched for an audit, and our own."""

    def __init__(self) -> None:
        self._rounds: dict[tuple[str, int], dict[str, tuple[int, bytes]]] = {}
        self._late: dict[tuple[str, int], set[str]] = {}
        """Members that got the round late (their frame is not in it, they apply it): they may read it too."""
        self._own: dict[tuple[str, int], _Own] = {}
        self._lock = threading.Lock()  # the reducer keeps on the network loop, an auditor in the training thread

    def keep(self, module: str, round_: int, frames: dict[str, tuple[int, bytes]]) -> None:
        with self._lock:
            self._rounds[(module, round_)] = dict(frames)
            for old in sorted(r for m, r in self._rounds if m == module)[:-FRAMES_KEPT]:
                self._rounds.pop((module, old), None)
                self._late.pop((module, old), None)

    def allow(self, module: str, round_: int, peer: str) -> None:
        """`peer` got the round's result late (it applies it without its frame in it): it may read the frames."""
        with self._lock:
            late = self._late.setdefault((module, round_), set()) if (module, round_) in self._rounds else None
            if late is not None and len(late) < MAX_LISTED:
                late.add(peer)

    def get(self, module: str, round_: int) -> dict[str, tuple[int, bytes]] | None:
        with self._lock:
            return self._rounds.get((module, round_))

    def may_read(self, module: str, round_: int, peer: str) -> bool:
        """Only the round's members read its frames: its contributors, and those that got it late."""
        with self._lock:
            return peer in self._rounds.get((module, round_), {}) or peer in self._late.get((module, round_), ())

    # ---- our own frame of a round ------------------------------------------------------------------
    def sending(self, module: str, round_: int, peer: str, tokens: int, frame: bytes) -> None:
        """We (`peer`) send this frame for (module, round): kept, served to nobody until the round's result comes.
        The same frame sent again (to the next candidate, after its first reducer's mean proved a lie) stays served
        to the members the first result listed: they are checking that lie now, and refusing them our frame while
        the resend is open held each of them the whole gathering wait (4 s a module in benchmarks/hostile.py
        `late-liar`) before it asked the liar."""
        h = frame_hash(frame)
        with self._lock:
            prev = self._own.get((module, round_))
            readers = (prev.readers if prev is not None and (prev.peer, prev.tokens, prev.hash) == (peer, tokens, h)
                       else None)
            self._own[(module, round_)] = _Own(peer, tokens, frame, h, readers)
            for old in sorted(r for m, r in self._own if m == module)[:-FRAMES_KEPT]:
                del self._own[(module, old)]

    def replied(self, module: str, round_: int, listed: dict[str, int], own_hash: str,
                contributors: tuple[str, ...] | list[str]) -> None:
        """The round's result came: our frame is served to its other contributors if the result lists that frame
        (our entry's hash is `own_hash`); else it is dropped (the round failed, or merged an earlier frame of ours),
        unless an earlier result listed it (a resend's round that failed: the first result's members still read it)."""
        with self._lock:
            own = self._own.get((module, round_))
            if own is None:
                return
            own.waiting = False
            if listed.get(own.peer) == own.tokens and own_hash == own.hash:
                own.readers = (own.readers or frozenset()) | (frozenset(contributors) - {own.peer})
            elif own.readers is None:
                del self._own[(module, round_)]

    def own_frame(self, module: str, round_: int, peer: str, reader: str) -> tuple[int, bytes] | str | None:
        """`peer`'s frame of (module, round) for `reader`: from the round's frames when we reduced it and `reader`
        may read them, else our own frame when `peer` is us and `reader` is one of the round's contributors;
        NOT_YET while our reply has not come (the reader asks again); None when we have none for it."""
        with self._lock:
            frames = self._rounds.get((module, round_))
            if frames is not None and peer in frames and (
                    reader in frames or reader in self._late.get((module, round_), ())):
                return frames[peer]
            own = self._own.get((module, round_))
            if own is None or own.peer != peer:
                return None
            if own.readers is not None and reader in own.readers:
                return own.tokens, own.frame
            return NOT_YET if own.waiting else None
