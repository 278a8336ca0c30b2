"""Auditing reducers on the wire: the merged frames a round's result lists, served to members who recompute it.

No reducer is trusted alone (docs/SECURITY.md). A round's result lists every contribution the reducer merged as
(peer, tokens, sha256 of the frame): each member finds its own entry there or knows the reducer misreported it
(protocol/exchange.py). Members also audit rounds at random, with local randomness the reducer cannot predict
(node/peer/audit.py): they fetch the listed frames from the reducer (`fetch_frames`), check that they hash to
the list the reducer sent everybody, and recompute the round rule's mean (node/train/round.py `audit_mean`).
A mean that does not match is a proof anyone in the group can check: the auditor stops trusting the reducer and
alerts the round's other contributors (`send_alert`); each of them fetches the frames from the auditor and checks
them against the result *it* received before it stops trusting the reducer too. An alert alone moves nothing.

What travels: one request and the round's frames but the auditor's own (each bounded by the module's size) per
audit; an alert is one small message per contributor, and only on a proven lie.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pathswarm.protocol.wire import Traffic, WireError, field_of, read_message, write_message

if TYPE_CHECKING:
    from pathswarm.protocol.net import PeerStreams

logger = logging.getLogger(__name__)

FRAMES_KEPT = 2
"""Rounds per module whose merged frames a reducer (or an auditor that fetched them) keeps for audits."""
MAX_LISTED = 1024
"""Most contributions a result may list (as many as a result's contributors)."""
ALERTS_KEPT = 64
"""Alerts waiting to be checked; more are dropped (an alert costs its receiver a download)."""

FrameEntry = tuple[str, int, str]
"""(peer, tokens, sha256 hex of its frame): one contribution as a result lists it."""


def frame_hash(frame: bytes) -> str:
    return hashlib.sha256(frame).hexdigest()


def parse_frame_list(value: object) -> tuple[FrameEntry, ...]:
    """A result's list of merged frames, received from a peer (untrusted): ValueError unless it is a list of at
    most MAX_LISTED [peer id, positive int, 64 hex digits], peers distinct."""
    if not isinstance(value, list) or len(value) > MAX_LISTED:
        raise ValueError("the frame list is not a bounded list")
    out = []
    for item in value:
        if not (isinstance(item, list) and len(item) == 3):
            raise ValueError("a frame entry is not [peer, tokens, hash]")
        peer, tokens, digest = item
        if not (isinstance(peer, str) and 0 < len(peer) <= 128 and peer.isalnum()):
            raise ValueError("a frame entry's peer is not a peer id")
        if not (isinstance(tokens, int) and not isinstance(tokens, bool) and 0 < tokens <= 1 << 53):
            raise ValueError("a frame entry's token count is out of range")
        if not (isinstance(digest, str) and len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)):
            raise ValueError("a frame entry's hash is not sha256 hex")
        out.append((peer, tokens, digest))
    if len({p for p, _, _ in out}) != len(out):
        raise ValueError("a peer is listed twice")
    return tuple(out)


def list_frames(frames: dict[str, tuple[int, bytes]], used: tuple[str, ...] | list[str]) -> tuple[FrameEntry, ...]:
    """The list a result carries: the merged peers' (peer, tokens as sent, frame hash), in the order of `used`."""
    return tuple((p, frames[p][0], frame_hash(frames[p][1])) for p in used)


@dataclass(frozen=True)
class Alert:
    """A member says the reducer of (module, round) sent a mean its frames do not give: a hint to check."""

    sender: str
    module: str
    round: int
    reducer: str


class FrameStore:
    """The frames of the last FRAMES_KEPT rounds per module that we merged or fetched for an audit."""

    def __init__(self):
        self._rounds: dict[tuple[str, int], dict[str, tuple[int, bytes]]] = {}
        self._late: dict[tuple[str, int], set[str]] = {}
        """Members that got the round late (their frame is not in it, they apply it): they may read it too."""
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


Admit = Callable[[dict, str, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[bool]]
Serve = Callable[[str, str, asyncio.StreamReader, asyncio.StreamWriter, Callable[[], Awaitable[None]]],
                 Awaitable[None]]


class AuditService:
    """The two requests audits need, served and sent for one node: `frames` and `alert`."""

    def __init__(self, streams: PeerStreams | None, prefix: str, numels: dict[str, int],
                 frame_limit: Callable[[str], int], admit: Admit, serve: Serve, traffic: Traffic,
                 membership: str = ""):
        self.streams, self.numels, self.frame_limit = streams, numels, frame_limit
        self.admit, self.serve, self.traffic, self.membership = admit, serve, traffic, membership
        self.store = FrameStore()
        self.alerts: deque[Alert] = deque(maxlen=ALERTS_KEPT)
        """Alerts received and not checked yet (the node drains them)."""
        self.frames_name = f"pathswarm.{prefix}.frames"
        self.alert_name = f"pathswarm.{prefix}.alert"

    async def start(self) -> None:
        await self.streams.serve(self.frames_name, self._on_frames)
        await self.streams.serve(self.alert_name, self._on_alert)

    async def _on_frames(self, sender: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async def body() -> None:
            header, _ = await read_message(reader, 0, self.traffic)
            if not await self.admit(header, sender, reader, writer):
                return
            module, round_ = field_of(header, "module", str), field_of(header, "round", int)
            frames = self.store.get(module, round_) if module in self.numels else None
            # Only the round's own members may read its frames (its contributors, who audit it and whom an auditor
            # alerts, and those that got it late and apply it too): members' outer gradients are not the whole
            # swarm's to read.
            if frames is None or not self.store.may_read(module, round_, sender):
                await write_message(writer, {"status": "missing"}, b"", self.traffic)
                return
            skip = header.get("skip")  # the asker's own frame: it has it
            frames = {p: f for p, f in frames.items() if p != skip}
            await write_message(writer, {"status": "ok", "count": len(frames)}, b"", self.traffic)
            for peer in sorted(frames):
                tokens, frame = frames[peer]
                await write_message(writer, {"peer": peer, "tokens": tokens}, b"", self.traffic)
                await write_message(writer, {}, frame, self.traffic)

        await self.serve("frames", sender, reader, writer, body)

    async def fetch_frames(self, peer: str, module: str, round_: int, timeout_s: float, expected: frozenset[str],
                           skip: str = "") -> dict[str, tuple[int, bytes]] | None:
        """The frames `peer` keeps for (module, round) as {contributor: (tokens, frame)}, but `skip`'s (our own: we
        have it); None if it has none or the download fails. Only the `expected` contributors' (the result's list,
        as we received it) are read, each bounded by the module's size: a peer cannot make us hold more. The
        caller checks their hashes."""
        limit = self.frame_limit(module)

        async def go() -> dict[str, tuple[int, bytes]] | None:
            reader, writer = await self.streams.open(peer, self.frames_name)
            try:
                await write_message(writer, {"module": module, "round": round_, "skip": skip,
                                             "membership": self.membership}, b"", self.traffic)
                header, _ = await read_message(reader, 0, self.traffic)
                if header.get("status") != "ok":
                    return None
                count = field_of(header, "count", int)
                if count != len(expected - {skip}):
                    raise WireError(f"{count} frames, the result lists {len(expected - {skip})}")
                out: dict[str, tuple[int, bytes]] = {}
                for _ in range(count):
                    h, _ = await read_message(reader, 0, self.traffic)  # which frame comes next, then the frame
                    contributor = field_of(h, "peer", str)
                    if contributor not in expected or contributor in out or contributor == skip:
                        raise WireError("a frame the result does not list")
                    _, frame = await read_message(reader, limit, self.traffic)
                    out[contributor] = (field_of(h, "tokens", int), frame)
                return out
            finally:
                writer.close()

        try:
            return await asyncio.wait_for(go(), timeout_s)
        except Exception as e:  # unreachable, refused, malformed: the audit cannot run this time
            logger.info("frames of %s round %d from %s: %s", module, round_, peer[-8:], e)
            return None

    async def _on_alert(self, sender: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async def body() -> None:
            header, _ = await read_message(reader, 0, self.traffic)
            if not await self.admit(header, sender, reader, writer):
                return
            module, round_ = field_of(header, "module", str), field_of(header, "round", int)
            reducer = field_of(header, "reducer", str)[:128]
            if module in self.numels:
                self.alerts.append(Alert(sender, module, round_, reducer))
            await write_message(writer, {"status": "ok"}, b"", self.traffic)

        await self.serve("alert", sender, reader, writer, body)

    async def send_alert(self, peers: list[str], module: str, round_: int, reducer: str, timeout_s: float) -> int:
        """Tell `peers` that the reducer of (module, round) lied (they check it themselves); how many heard it."""

        async def one(peer: str) -> bool:
            async def go() -> None:
                reader, writer = await self.streams.open(peer, self.alert_name)
                try:
                    await write_message(writer, {"module": module, "round": round_, "reducer": reducer,
                                                 "membership": self.membership}, b"", self.traffic)
                    await read_message(reader, 0, self.traffic)
                finally:
                    writer.close()

            try:
                await asyncio.wait_for(go(), timeout_s)
                return True
            except Exception as e:
                logger.info("alert to %s about %s round %d: %s", peer[-8:], module, round_, e)
                return False

        return sum(await asyncio.gather(*(one(p) for p in peers)))
