"""Auditing reducers on the wire: the merged frames a round's result lists, served to members who recompute it.

No reducer is trusted alone (docs/SECURITY.md). A round's result lists every contribution the reducer merged as
(peer, tokens) and commits to the frames with one hash over (peer, tokens, sha256 of the frame) of them all
(frame_list.py `commit_frames`); each member's reply names the hash of its own listed frame, so each member finds its
own entry or knows the reducer misreported it (protocol/rounds/member.py). Members also audit rounds at random,
with local randomness the reducer cannot predict (node/peer/audit.py): they fetch the listed frames from the reducer
(`fetch_frames`), check that they hash to the commitment the reducer sent everybody, and recompute the round rule's
mean (protocol/rounds/rule.py `audit_mean`).
A mean that does not match is a proof anyone in the group can check: the auditor stops trusting the reducer and
alerts the round's other contributors (`send_alert`); each of them fetches the frames from the auditor and checks
them against the result *it* received before it stops trusting the reducer too. An alert alone moves nothing.

What travels: one request and the round's frames but the auditor's own (each bounded by the module's size) per
audit; an alert is one small message per contributor, and only on a proven lie.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pathswarm.protocol.rounds.frame_list import MAX_LISTED
from pathswarm.protocol.rounds.messages import (
    Ack,
    AlertRequest,
    FrameHeader,
    FramesReply,
    FramesRequest,
)
from pathswarm.protocol.rounds.state_parts import transfer_deadline_s
from pathswarm.protocol.wire import (
    FramesMissingError,
    Traffic,
    UnreachableError,
    WireError,
    read_message,
    write_message,
)

if TYPE_CHECKING:
    from pathswarm.protocol.net import PeerStreams

logger = logging.getLogger(__name__)

FRAMES_KEPT = 2
"""Rounds per module whose merged frames a reducer (or an auditor that fetched them) keeps for audits."""
ALERTS_KEPT = 64
"""Alerts waiting to be checked; more are dropped (an alert costs its receiver a download)."""

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


Serve = Callable[[str, str, asyncio.StreamReader, asyncio.StreamWriter, Callable[[dict], Awaitable[None]]],
                 Awaitable[None]]


def frames_deadline_s(timeout_s: float, frames: int, frame_bytes: int, downloaders: int = 1) -> float:
    """How long a download of `frames` frames of at most `frame_bytes` each may take, end to end, while `downloaders`
    members download from the same peer at once (a new reducer's checked rounds: all its other members): the
    averaging timeout plus those bytes at state_parts.py's FLOOR_BYTES_PER_S, the slowest uplink waited for. A fixed
    deadline (the averaging timeout) failed every check of a large module on a home uplink: at 16 holders the frames
    of one slice of a 25 M-parameter module are 19 MB, and 15 members fetch them at once from one 20 Mbit/s uplink
    (2 minutes). A transfer that stalls is still cut after `idle_s`."""
    return transfer_deadline_s(timeout_s, max(0, frames) * max(0, frame_bytes) * max(1, downloaders))


class AuditService:
    """The two requests audits need, served and sent for one node: `frames` and `alert`."""

    def __init__(self, streams: PeerStreams | None, prefix: str, numels: Mapping[str, int],
                 frame_limit: Callable[[str], int], serve: Serve, traffic: Traffic,
                 membership: str = "", idle_s: float = 20.0):
        self.streams, self.numels, self.frame_limit = streams, numels, frame_limit
        self.serve, self.traffic, self.membership = serve, traffic, membership
        self.idle_s = idle_s
        """A frames transfer that moves nothing for this long is cut (the averaging timeout): its deadline as a whole
        grows with its size (`frames_deadline_s`), a dead peer is still found this soon."""
        self.store = FrameStore()
        self.alerts: deque[Alert] = deque(maxlen=ALERTS_KEPT)
        """Alerts received and not checked yet (the node drains them)."""
        self.frames_name = f"pathswarm.{prefix}.frames"
        self.alert_name = f"pathswarm.{prefix}.alert"

    async def start(self) -> None:
        assert self.streams is not None
        await self.streams.serve(self.frames_name, self._on_frames)
        await self.streams.serve(self.alert_name, self._on_alert)

    async def _on_frames(self, sender: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async def handle(header: dict) -> None:
            ask = FramesRequest.parse(header)
            module, round_ = ask.module, ask.round
            frames = self.store.get(module, round_) if module in self.numels else None
            # Only the round's own members may read its frames (its contributors, who audit it and whom an auditor
            # alerts, and those that got it late and apply it too): members' outer gradients are not the whole
            # swarm's to read.
            if frames is None or not self.store.may_read(module, round_, sender):
                await write_message(writer, FramesReply("missing").header(), b"", self.traffic)
                return
            frames = {p: f for p, f in frames.items() if p != ask.skip}  # the asker's own frame: it has it
            await write_message(writer, FramesReply("ok", len(frames)).header(), b"", self.traffic)
            for peer in sorted(frames):
                tokens, frame = frames[peer]
                await write_message(writer, FrameHeader(peer, tokens).header(), b"", self.traffic, idle_s=self.idle_s)
                await write_message(writer, {}, frame, self.traffic, idle_s=self.idle_s)

        await self.serve("frames", sender, reader, writer, handle)

    async def fetch_frames(self, peer: str, module: str, round_: int, timeout_s: float, expected: frozenset[str],
                           skip: str = "") -> dict[str, tuple[int, bytes]] | None:
        """The frames `peer` keeps for (module, round) as {contributor: (tokens, frame)}, but `skip`'s (our own: we
        have it); None if the download fails (refused as busy, timed out, malformed). Raises FramesMissingError when
        the peer answers it keeps none, UnreachableError when it cannot be dialed: both worth no retry soon. Only the
        `expected` contributors' (the result's list, as we received it) are read, each bounded by the module's size:
        a peer cannot make us hold more. The caller checks their hashes."""
        limit = self.frame_limit(module)

        async def go() -> dict[str, tuple[int, bytes]] | None:
            assert self.streams is not None
            reader, writer = await self.streams.open(peer, self.frames_name)
            try:
                await write_message(writer, FramesRequest(module, round_, skip, self.membership).header(), b"",
                                    self.traffic)
                header, _ = await read_message(reader, 0, self.traffic)
                reply = FramesReply.parse(header)
                if reply.status == "missing":
                    raise FramesMissingError(f"{peer[-8:]} keeps no frames of {module} round {round_}")
                if reply.status != "ok":
                    return None
                count = reply.count
                if count != len(expected - {skip}):
                    raise WireError(f"{count} frames, the result lists {len(expected - {skip})}")
                out: dict[str, tuple[int, bytes]] = {}
                for _ in range(count):
                    h, _ = await read_message(reader, 0, self.traffic)  # which frame comes next, then the frame
                    entry = FrameHeader.parse(h)
                    contributor = entry.peer
                    if contributor not in expected or contributor in out or contributor == skip:
                        raise WireError("a frame the result does not list")
                    _, frame = await read_message(reader, limit, self.traffic, idle_s=self.idle_s)
                    out[contributor] = (entry.tokens, frame)
                return out
            finally:
                writer.close()

        try:
            return await asyncio.wait_for(go(), timeout_s)
        except Exception as e:  # refused, timed out, malformed: the audit cannot run this time
            logger.info("frames of %s round %d from %s: %s", module, round_, peer[-8:], e)
            if isinstance(e, FramesMissingError | UnreachableError):
                raise  # answers that will not change soon: the caller stops asking
            return None

    async def _on_alert(self, sender: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async def handle(header: dict) -> None:
            alert = AlertRequest.parse(header)
            if alert.module in self.numels:
                self.alerts.append(Alert(sender, alert.module, alert.round, alert.reducer))
            await write_message(writer, Ack().header(), b"", self.traffic)

        await self.serve("alert", sender, reader, writer, handle)

    async def send_alert(self, peers: list[str], module: str, round_: int, reducer: str, timeout_s: float) -> int:
        """Tell `peers` that the reducer of (module, round) lied (they check it themselves); how many heard it."""

        async def one(peer: str) -> bool:
            async def go() -> None:
                assert self.streams is not None
                reader, writer = await self.streams.open(peer, self.alert_name)
                try:
                    await write_message(writer, AlertRequest(module, round_, reducer, self.membership).header(), b"",
                                        self.traffic)
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
