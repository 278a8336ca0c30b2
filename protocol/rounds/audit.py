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
import random
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pathswarm.protocol.rounds.frame_list import Listed, commit_frames, frame_hash
from pathswarm.protocol.rounds.frame_store import NOT_YET, FrameStore
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

GATHER_AT_ONCE = 16
"""A check's frames downloads from contributors running at once."""
GATHER_WAIT_S = 5.0
"""How long a check waits for the round's other contributors to have their replies, beyond their frames' transfer
time (then it asks the reducer): short, because they leave the reducer with ours, and a member whose reducer died
before replying to it (benchmarks/restarts.py --kill replying) fails over within seconds."""
GATHER_RETRY_S = (0.25, 2.0)
"""First and longest pause before asking a contributor that refused (its reply not come yet, busy) again."""
ALERTS_KEPT = 64
"""Alerts waiting to be checked; more are dropped (an alert costs its receiver a download)."""


async def _back_off(pause: float, left_s: float) -> float:
    """Wait a jittered `pause` (at most `left_s`) before asking a peer that refused again; the next pause."""
    await asyncio.sleep(min(random.uniform(pause / 2, pause), max(0.0, left_s)))
    return min(2 * pause, GATHER_RETRY_S[1])


class _NotGathered(Exception):
    """A contributor did not serve its frame: the check downloads the round's frames from the reducer instead."""


class Gathered(dict):
    """A round's frames, each downloaded from its own contributor (`gather_frames`), not from the reducer."""


@dataclass(frozen=True)
class Alert:
    """A member says the reducer of (module, round) sent a mean its frames do not give: a hint to check."""

    sender: str
    module: str
    round: int
    reducer: str


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
            if ask.only:
                await self._serve_one(writer, module, round_, ask.only, sender)
                return
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

    async def _serve_one(self, writer: asyncio.StreamWriter, module: str, round_: int, peer: str, sender: str) -> None:
        """One contributor's frame (ours, or one of a round we reduced) to a member gathering a round's frames."""
        got = self.store.own_frame(module, round_, peer, sender) if module in self.numels else None
        if got is None or got == NOT_YET:
            # not yet: our reply of the round has not come, so we do not know the asker is one of its members
            await write_message(writer, FramesReply("refused" if got else "missing").header(), b"", self.traffic)
            return
        assert not isinstance(got, str)
        tokens, frame = got
        await write_message(writer, FramesReply("ok", 1).header(), b"", self.traffic)
        await write_message(writer, FrameHeader(peer, tokens).header(), b"", self.traffic, idle_s=self.idle_s)
        await write_message(writer, {}, frame, self.traffic, idle_s=self.idle_s)

    async def gather_frames(self, reducer: str, module: str, round_: int, listed: tuple[Listed, ...],
                            frames_digest: str, me: str, own: tuple[int, bytes] | None,
                            timeout_s: float) -> dict[str, tuple[int, bytes]] | None:
        """The frames a round's result lists, but ours (`own`, when the result lists the frame we hold), as
        {contributor: (tokens, frame)}: each asked from its own contributor first, all at once (frame_store.py says
        why), for half of `timeout_s` at most; they count only if they give the result's commitment. Failing that
        (a contributor gone, one whose reply never came, or one that served another frame), all of them from the
        reducer, as `fetch_frames`, asked again while it refuses, which also raises what it raises: a mismatch there
        proves the reducer a liar, one among frames from many peers proves nobody. None: the reducer refused or
        failed until `timeout_s` was up."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        if own is not None:  # else we are late (not a contributor), or the result lists a frame we no longer hold
            # the other members' replies leave the reducer with ours, and each serves its frame to every checker
            spread_s = min(timeout_s / 2, frames_deadline_s(GATHER_WAIT_S, 1, self.frame_limit(module),
                                                            downloaders=len(listed)))
            got = await self._from_contributors(module, round_, listed, frames_digest, me, own, spread_s)
            if got is not None:
                return got
        # A reducer that refuses (busy serving the round's other checkers, rate limited) is asked again, with backoff,
        # until the deadline, as a contributor is: asked once, a random audit refused at 16 holders counted as
        # frames hidden, and its reducer's next rounds of every module were checked before applying (9 downloads).
        pause = GATHER_RETRY_S[0]
        while True:
            left = max(1.0, timeout_s - (loop.time() - start))
            got = await self.fetch_frames(reducer, module, round_, left, frozenset(p for p, _ in listed),
                                          skip=me if own is not None else "")
            left = timeout_s - (loop.time() - start)
            if got is not None or left < pause / 2:
                return got
            pause = await _back_off(pause, left)

    async def _from_contributors(self, module: str, round_: int, listed: tuple[Listed, ...], frames_digest: str,
                                 me: str, own: tuple[int, bytes] | None,
                                 window_s: float) -> dict[str, tuple[int, bytes]] | None:
        loop = asyncio.get_running_loop()
        end = loop.time() + window_s
        gate = asyncio.Semaphore(GATHER_AT_ONCE)

        async def one(peer: str, tokens: int) -> tuple[int, bytes]:
            pause = GATHER_RETRY_S[0]
            while (left := end - loop.time()) > 0:
                try:
                    async with gate:
                        got = await asyncio.wait_for(self._fetch_one(peer, module, round_), left)
                except (FramesMissingError, UnreachableError, WireError, TimeoutError) as e:
                    raise _NotGathered(str(e)) from None  # gone, nothing of the round, malformed, out of time
                except Exception:  # broken stream: ask again
                    got = None
                if got is not None:
                    if got[0] != tokens:
                        raise _NotGathered(f"{peer[-8:]} counts {got[0]} tokens, the result {tokens}")
                    return got
                # refused: its reply has not come yet, or busy serving the round's other checkers
                pause = await _back_off(pause, end - loop.time())
            raise _NotGathered("out of time")

        others = [(p, t) for p, t in listed if p != me]
        why = ""
        try:
            async with asyncio.TaskGroup() as group:  # the first that fails cancels the rest: the reducer has them all
                tasks = {p: group.create_task(one(p, t)) for p, t in others}
        except* _NotGathered as failed:
            why = str(failed.exceptions[0])
        if why:
            logger.info("frames of %s round %d not gathered from its contributors (%s); asking its reducer", module,
                        round_, why)
            return None
        out = {p: task.result() for p, task in tasks.items()}
        every = {**out, me: own} if own is not None else out

        def commitment() -> str:  # hashing a 25 M-parameter module's frames takes a while: off the loop
            return commit_frames([(p, t, frame_hash(every[p][1])) for p, t in listed])

        if await asyncio.to_thread(commitment) != frames_digest:
            logger.info("frames of %s round %d gathered from its contributors do not give its commitment; asking its "
                        "reducer", module, round_)
            return None
        return Gathered(out)

    async def _fetch_one(self, peer: str, module: str, round_: int) -> tuple[int, bytes] | None:
        """`peer`'s own frame of (module, round); None when it refuses (not yet, busy: ask again)."""
        got = await self._download(peer, module, round_, FramesRequest(module, round_, "", self.membership, only=peer),
                                   frozenset({peer}))
        return None if got is None else got[peer]

    async def fetch_frames(self, peer: str, module: str, round_: int, timeout_s: float, expected: frozenset[str],
                           skip: str = "") -> dict[str, tuple[int, bytes]] | None:
        """The frames `peer` keeps for (module, round) as {contributor: (tokens, frame)}, but `skip`'s (our own: we
        have it); None if the download fails (refused as busy, timed out, malformed). Raises FramesMissingError when
        the peer answers it keeps none, UnreachableError when it cannot be dialed: both worth no retry soon. Only the
        `expected` contributors' (the result's list, as we received it) are read, each bounded by the module's size:
        a peer cannot make us hold more. The caller checks their hashes."""
        try:
            return await asyncio.wait_for(self._download(peer, module, round_, FramesRequest(
                module, round_, skip, self.membership), expected - {skip}), timeout_s)
        except Exception as e:  # refused, timed out, malformed: the audit cannot run this time
            logger.info("frames of %s round %d from %s: %s", module, round_, peer[-8:], e)
            if isinstance(e, FramesMissingError | UnreachableError):
                raise  # answers that will not change soon: the caller stops asking
            return None

    async def _download(self, peer: str, module: str, round_: int, ask: FramesRequest,
                        expected: frozenset[str]) -> dict[str, tuple[int, bytes]] | None:
        """One frames request to `peer` and exactly the `expected` contributors' frames in answer, each bounded by the
        module's size; None when it refuses. Raises FramesMissingError when it keeps none, WireError when it answers
        other frames."""
        assert self.streams is not None
        limit = self.frame_limit(module)
        reader, writer = await self.streams.open(peer, self.frames_name)
        try:
            await write_message(writer, ask.header(), b"", self.traffic)
            header, _ = await read_message(reader, 0, self.traffic)
            reply = FramesReply.parse(header)
            if reply.status == "missing":
                raise FramesMissingError(f"{peer[-8:]} keeps no frames of {module} round {round_}")
            if reply.status != "ok":
                return None
            if reply.count != len(expected):
                raise WireError(f"{reply.count} frames, the result lists {len(expected)}")
            out: dict[str, tuple[int, bytes]] = {}
            for _ in range(reply.count):
                h, _ = await read_message(reader, 0, self.traffic)  # which frame comes next, then the frame
                entry = FrameHeader.parse(h)
                if entry.peer not in expected or entry.peer in out:
                    raise WireError("a frame the result does not list")
                _, frame = await read_message(reader, limit, self.traffic, idle_s=self.idle_s)
                out[entry.peer] = (entry.tokens, frame)
            return out
        finally:
            writer.close()

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
