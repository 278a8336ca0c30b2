"""The round's messages on the wire: one typed class per stream message, validated as strictly as DHT records.

Every request and reply of the module exchange (protocol/rounds/service.py) and of audits (audit.py) is one of
these. A message travels as a JSON header (protocol/wire.py) and, for frames and states, a bounded payload;
`parse` takes a header received from a peer (untrusted) and returns the message or raises WireError, `header`
gives what is written. Strings are bounded, numbers are ints in range (a bool is no int here), lists are bounded
and hold peer ids only. A reply's optional parts that do not parse are dropped, not fatal: a result whose frame
list does not parse lists nothing, and its member then finds its own entry missing (member.py) — a proof against
the reducer, which a refused message would not be.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from typing import Any, Self

from pathswarm.protocol.rounds.frame_list import (
    MAX_ID,
    MAX_LISTED,
    MAX_TOKENS,
    FrameEntry,
    Listed,
    commit_frames,
    is_sha256_hex,
    parse_listed,
)
from pathswarm.protocol.rounds.reducers import Stance, parse_candidates
from pathswarm.protocol.rounds.state_parts import MAX_STATE_PARTS
from pathswarm.protocol.wire import WireError

MAX_ROUND = 1 << 62
"""Rounds are int64 everywhere (records.MAX_COUNT); state_digest packs them in 8 bytes."""
MAX_REASON = 200
"""Longest reason kept from a peer's message."""
MAX_CONTRIBUTORS = MAX_LISTED
"""Most contributions a result may list."""

SORTED_CONTRIBUTORS = "="
"""A result's `reducers` when they are its contributors, sorted (a round in slices names them so): said in one
character instead of a second copy of the list."""

class RoundStatus(StrEnum):
    """How a round ended for one member (the reply to its contribution)."""

    MERGED = "merged"
    """Its frame is in the mean."""
    ALONE = "alone"
    """Its frame is the mean: nobody else was in the round."""
    LATE = "late"
    """The round had closed: apply the mean, keep the outer gradient for the next round."""
    OUT_OF_SYNC = "out_of_sync"
    """Its state before the round is not the group's: re-sync the module."""
    BEHIND = "behind"
    """The reducer is behind the member (it re-syncs itself)."""
    FAILED = "failed"
    """Nothing to apply; the member's steps carry."""
    REDIRECT = "redirect"
    """An earlier candidate holds the round: send the contribution there."""

    # Hashed as its string (Enum hashes the member's name): a status and its wire string are one key in a set or dict.
    __hash__ = str.__hash__

    @property
    def applies(self) -> bool:
        """Whether a member applies this round's mean."""
        return self in APPLIED

    @property
    def ours(self) -> bool:
        """Whether the member's own outer gradient is in the mean."""
        return self in OURS


APPLIED = frozenset({RoundStatus.MERGED, RoundStatus.ALONE, RoundStatus.LATE})
"""Statuses whose mean every member applies (a plain status string is found in it too)."""
OURS = frozenset({RoundStatus.MERGED, RoundStatus.ALONE})
"""Statuses in which the member's own outer gradient is part of the mean."""


def _str(header: dict[str, Any], name: str, limit: int = MAX_ID, default: str | None = None) -> str:
    value = header.get(name, default)
    if not isinstance(value, str) or len(value) > limit:
        raise WireError(f"header field {name!r} missing, not a string or longer than {limit}")
    return value


def _int(header: dict[str, Any], name: str, low: int = 0, high: int = MAX_ROUND, default: int | None = None) -> int:
    value = header.get(name, default)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise WireError(f"header field {name!r} missing, not an int or out of [{low}, {high}]")
    return value


def _bool(header: dict[str, Any], name: str) -> bool:
    return header.get(name) is True


class Message:
    """Base of the typed messages: `header()` writes, `parse(header)` reads (WireError when malformed)."""

    def header(self) -> dict[str, Any]:
        out = asdict(self)  # type: ignore[call-overload]
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in out.items()}


@dataclass(frozen=True)
class Refusal(Message):
    """The answer to a request that is not served (membership, rate limit, a round number out of range)."""

    reason: str
    status: str = "refused"

    @classmethod
    def parse(cls, header: dict[str, Any]) -> Self | None:
        """The refusal in a reply, or None when the reply is not one."""
        if header.get("status") != "refused":
            return None
        return cls(str(header.get("reason"))[:MAX_REASON])


@dataclass(frozen=True)
class ContributeRequest(Message):
    """A member's outer gradient for (module, round); its frame follows in a second message."""

    module: str
    round: int
    tokens: int
    digest: str
    """The digest of the member's state before the round."""
    membership: str = ""
    client: bool = False
    """The member cannot be dialed (protocol/reachability.py): never name it a reducer candidate."""

    @classmethod
    def parse(cls, header: dict[str, Any]) -> Self:
        # Any int: a count out of range fails that contribution alone (reducer.py), with a reason, instead of the
        # whole request.
        tokens = header.get("tokens")
        if not isinstance(tokens, int) or isinstance(tokens, bool):
            raise WireError("header field 'tokens' missing or not an int")
        return cls(_str(header, "module"), _int(header, "round"), tokens, _str(header, "digest"),
                   membership_of(header), _bool(header, "client"))


@dataclass(frozen=True)
class RoundReply(Message):
    """A round's result as its reducer tells one member; the encoded mean is the payload."""

    module: str
    round: int
    status: RoundStatus
    contributors: tuple[str, ...] = ()
    tokens: int = 0
    digest_after: str = ""
    reason: str = ""
    reducers: tuple[str, ...] = ()
    """Who reduces the next round, in failover order."""
    redirect: str = ""
    frames: tuple[FrameEntry, ...] = ()
    """(peer, tokens, frame hash) of every merged contribution: the reducer's side only (protocol/rounds/audit.py
    serves the frames themselves); on the wire a result carries `listed` and `frames_digest`."""
    mean_frame: bytes = field(default=b"", repr=False)
    """The encoded mean (the message's payload, not its header); b'' when there is none."""
    reducer: str = ""
    """Who answered (the member's side fills it in; not on the wire): the peer to re-sync from when it says we are
    out of sync."""
    listed: tuple[Listed, ...] = ()
    """(peer, tokens) of every merged contribution, in merge order (derived from `frames` where those are known)."""
    frames_digest: str = ""
    """`commit_frames` of the whole frame list: what audits check the downloaded frames against."""
    own: str = ""
    """The hash of the frame listed for the member this reply is for ('' when it is not listed): its own entry."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", RoundStatus(self.status))  # a plain string names one too
        if self.frames and not self.listed:
            object.__setattr__(self, "listed", tuple((p, t) for p, t, _ in self.frames))
            object.__setattr__(self, "frames_digest", commit_frames(self.frames))

    @property
    def applicable(self) -> bool:
        return self.status.applies and bool(self.mean_frame)

    def to(self, member: str, status: RoundStatus) -> RoundReply:
        """This result as told to `member`, with `status` and its own entry's frame hash."""
        own = next((h for p, _, h in self.frames if p == member), "")
        return replace(self, status=status, own=own, reducer="")

    def header(self) -> dict[str, Any]:
        out: dict[str, Any] = {"module": self.module, "round": self.round, "status": self.status.value,
                               "tokens": self.tokens, "digest_after": self.digest_after, "reason": self.reason,
                               "redirect": self.redirect, "contributors": list(self.contributors)}
        if self.listed and self.frames_digest:
            # Said once: the listed peers are the contributors (an honest result's always are), and equal token
            # counts (the usual case: every member trains H steps of the same batch) as one number.
            peers, tokens = [p for p, _ in self.listed], [t for _, t in self.listed]
            if tuple(peers) == tuple(self.contributors):
                out["frame_tokens"] = tokens[0] if len(set(tokens)) == 1 else tokens
            else:
                out["listed"] = [list(e) for e in self.listed]
            out["frames_digest"] = self.frames_digest
            if self.own:
                out["own"] = self.own
        # A round in slices names the contributors, sorted, as the next round's candidates
        # (protocol/rounds/reducers.py `next_candidates`): said in one character.
        if self.reducers and self.reducers == tuple(sorted(self.contributors)):
            out["reducers"] = SORTED_CONTRIBUTORS
        else:
            out["reducers"] = list(self.reducers)
        return out

    @classmethod
    def parse(cls, header: dict[str, Any], mean_frame: bytes = b"") -> Self:
        try:
            status = RoundStatus(str(header.get("status")))
        except ValueError:
            raise WireError(f"unknown round status {str(header.get('status'))[:40]!r}") from None
        raw = header.get("contributors")
        contributors: list = raw if isinstance(raw, list) else []
        listed: tuple[Listed, ...] = ()
        digest = header.get("frames_digest")
        try:  # a result whose list does not parse lists nothing: our own entry is then missing
            if not is_sha256_hex(digest):
                raise ValueError("no frame list commitment")
            if "listed" in header:
                listed = parse_listed(header["listed"])
            elif "frame_tokens" in header:
                each = header["frame_tokens"]
                each = [each] * len(contributors) if isinstance(each, int) and not isinstance(each, bool) else each
                if not isinstance(each, list) or len(each) != len(contributors):
                    raise ValueError("token counts do not match the contributors")
                listed = parse_listed([[p, t] for p, t in zip(contributors, each, strict=True)])
        except ValueError:
            listed, digest = (), ""
        own = header.get("own")
        try:
            named = header.get("reducers") or []
            if named == SORTED_CONTRIBUTORS:
                named = sorted(str(c) for c in contributors)
            reducers = parse_candidates(named)
        except ValueError:
            reducers = ()
        tokens = header.get("tokens")
        return cls(_str(header, "module"), _int(header, "round"), status,
                   tuple(str(c)[:MAX_ID] for c in contributors[:MAX_CONTRIBUTORS]),
                   tokens if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens >= 0 else 0,
                   str(header.get("digest_after") or "")[:64], str(header.get("reason") or "")[:MAX_REASON],
                   reducers, str(header.get("redirect") or "")[:MAX_ID], mean_frame=mean_frame, listed=listed,
                   frames_digest=str(digest) if listed else "", own=str(own) if listed and is_sha256_hex(own) else "")


@dataclass(frozen=True)
class StanceRequest(Message):
    """A later candidate asks an earlier one whether it holds (module, round) (protocol/rounds/reducers.py)."""

    module: str
    round: int
    digest: str
    membership: str = ""

    @classmethod
    def parse(cls, header: dict[str, Any]) -> Self:
        return cls(_str(header, "module"), _int(header, "round"), _str(header, "digest"), membership_of(header))


@dataclass(frozen=True)
class StanceReply(Message):
    stance: Stance

    def header(self) -> dict[str, Any]:
        return {"stance": self.stance.value}

    @classmethod
    def parse(cls, header: dict[str, Any]) -> Self:
        try:
            return cls(Stance(str(header.get("stance"))))
        except ValueError:
            raise WireError("not a stance") from None


@dataclass(frozen=True)
class StateRequest(Message):
    """A joiner (or a node re-syncing) asks for a module's state."""

    module: str
    membership: str = ""
    round: int = -1
    """The round of the state a majority vouched for, when the downloader wants that one (-1: the newest): a reducer
    serves it while its node still holds it, not the state after the rounds it closed since (protocol/rounds/service.py;
    a peer from before the field ignores it)."""

    part: int = 0
    parts: int = 1
    """Part `part` of `parts` of the state (protocol/rounds/state_parts.py): a joiner downloads the parts from several
    holders at once. A peer from before the fields sends the whole state, which the downloader accepts too."""

    @classmethod
    def parse(cls, header: dict[str, Any]) -> Self:
        parts = _int(header, "parts", low=1, high=MAX_STATE_PARTS, default=1)
        return cls(_str(header, "module"), membership_of(header), _int(header, "round", low=-1, default=-1),
                   _int(header, "part", high=parts - 1, default=0), parts)


@dataclass(frozen=True)
class StateReply(Message):
    """A module's state: round, digest, reducer list; anchor then momentum (fp32) are the payload."""

    status: str
    """'ok' or 'missing'."""
    round: int = 0
    digest: str = ""
    """The whole state's digest, whichever part the payload holds."""
    reducers: tuple[str, ...] = field(default=())
    part: int = 0
    parts: int = 1
    """Which part of the state the payload is (0 of 1: all of it, anchor then momentum)."""

    @classmethod
    def parse(cls, header: dict[str, Any]) -> Self:
        status = header.get("status")
        if status != "ok":
            return cls("missing")
        parts = _int(header, "parts", low=1, high=MAX_STATE_PARTS, default=1)
        part = _int(header, "part", high=parts - 1, default=0)
        try:
            reducers = parse_candidates(header.get("reducers") or [])
        except ValueError as e:
            raise WireError(str(e)) from None
        # The round is a stranger's JSON value: int() of it raised on "x", [1] or 1e400, and a negative or huge one
        # made state_digest (8 unsigned bytes) raise.
        return cls("ok", _int(header, "round", default=0) if header.get("round") is not None else 0,
                   _str(header, "digest", 64, default=""), reducers, part, parts)


@dataclass(frozen=True)
class FramesRequest(Message):
    """An auditor asks a round's reducer (or another auditor) for the frames the result lists, or a contributor for
    its own."""

    module: str
    round: int
    skip: str = ""
    """The asker's own frame: it has it."""
    membership: str = ""
    only: str = ""
    """Only this contributor's frame (a check gathering each frame from its own contributor: frame_store.py)."""

    @classmethod
    def parse(cls, header: dict[str, Any]) -> Self:
        return cls(_str(header, "module"), _int(header, "round"), _str(header, "skip", default=""),
                   membership_of(header), _str(header, "only", default=""))


@dataclass(frozen=True)
class FramesReply(Message):
    """How many frames follow (each as a `FrameHeader` then the frame), or status 'missing' (the peer keeps none of
    the round), or 'refused' (busy, rate limited, not a member: worth asking again later)."""

    status: str
    count: int = 0

    @classmethod
    def parse(cls, header: dict[str, Any]) -> Self:
        if header.get("status") == "refused":
            return cls("refused")
        if header.get("status") != "ok":
            return cls("missing")
        return cls("ok", _int(header, "count", high=MAX_CONTRIBUTORS))


@dataclass(frozen=True)
class FrameHeader(Message):
    peer: str
    tokens: int

    @classmethod
    def parse(cls, header: dict[str, Any]) -> Self:
        return cls(_str(header, "peer"), _int(header, "tokens", high=MAX_TOKENS))


@dataclass(frozen=True)
class AlertRequest(Message):
    """An auditor tells a contributor that the reducer of (module, round) lied (it checks that itself)."""

    module: str
    round: int
    reducer: str
    membership: str = ""

    @classmethod
    def parse(cls, header: dict[str, Any]) -> Self:
        return cls(_str(header, "module"), _int(header, "round"), str(header.get("reducer") or "")[:MAX_ID],
                   membership_of(header))


@dataclass(frozen=True)
class Ack(Message):
    status: str = "ok"


def membership_of(header: dict[str, Any]) -> str:
    """The certificate a request carries (private swarms); '' when none (the gate decides whether that is enough)."""
    value = header.get("membership")
    return value if isinstance(value, str) else ""


def module_of(header: dict[str, Any]) -> str:
    """The module a request names, before the rest of it is parsed (the handlers check it is ours first)."""
    return _str(header, "module")
