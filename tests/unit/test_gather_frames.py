"""A check gathers a round's frames from their own contributors (protocol/rounds/frame_store.py, audit.py
`gather_frames`), and falls back to the reducer when that does not give the result's commitment.

The services talk over real socket pairs, routed by peer id (no hivemind: the request and reply formats and the
store's rules are what is tested here; tests/swarm runs the checks between real nodes)."""

import asyncio
import socket
import time
from collections import Counter

import pytest

from pathswarm.protocol.rounds.audit import AuditService
from pathswarm.protocol.rounds.frame_list import frame_hash
from pathswarm.protocol.rounds.frame_store import NOT_YET, FrameStore
from pathswarm.protocol.rounds.messages import FramesReply
from pathswarm.protocol.wire import Traffic, UnreachableError, read_message, write_message
from tests.unit.test_audit import PEERS, closed_round


class Net:
    """Peer id → its AuditService; `opened` counts the streams each (asker, peer) pair opened."""

    def __init__(self):
        self.services: dict[str, AuditService] = {}
        self.opened: Counter = Counter()
        self.refusals: Counter = Counter()
        """Peer → requests it refuses (busy) before it serves."""

    def add(self, peer: str) -> AuditService:
        async def serve(kind, sender, reader, writer, handle):
            header, _ = await read_message(reader, 0)
            if self.refusals[peer] > 0:
                self.refusals[peer] -= 1
                await write_message(writer, FramesReply("refused").header(), b"")
                writer.close()
                return
            await handle(header)

        svc = AuditService(Streams(self, peer), "t", {"m": 1000}, lambda m: 1 << 20, serve, Traffic(), idle_s=2.0)
        self.services[peer] = svc
        return svc


class Streams:
    def __init__(self, net: Net, me: str):
        self.net, self.me = net, me

    async def open(self, peer, name):
        if peer not in self.net.services:
            raise UnreachableError(f"{peer} cannot be reached")
        self.net.opened[(self.me, peer)] += 1
        ours, theirs = socket.socketpair()
        r1, w1 = await asyncio.open_connection(sock=ours)
        r2, w2 = await asyncio.open_connection(sock=theirs)
        asyncio.get_running_loop().create_task(self.net.services[peer]._on_frames(self.me, r2, w2))
        return r1, w1


def swarm(reply_late: str = "", served: dict | None = None, dead: str = ""):
    """The reducer QmR's round of QmA, QmB, QmC (tests/unit/test_audit.py `closed_round`) on a Net: every member
    keeps the frame it sent and has its reply, but `reply_late` (its reply comes 0.3 s later); `served` swaps a
    member's kept frame; `dead` is not on the net."""
    result, ex, sent = closed_round()
    net = Net()
    net.add("QmR").store.keep("m", 0, ex.audits.store.get("m", 0))
    replies = {}
    for peer in PEERS:
        if peer == dead:
            continue
        tokens, frame = (served or {}).get(peer, sent[peer])
        store = net.add(peer).store
        store.sending("m", 0, peer, tokens, frame)
        replies[peer] = lambda s=store, p=peer: s.replied("m", 0, dict(result.listed), frame_hash(sent[p][1]),
                                                          result.contributors)
        if peer != reply_late:
            replies[peer]()
    return net, result, sent, replies


def gather(net, result, sent, me="QmA", timeout_s=6.0, late=None):
    async def go():
        if late is not None:
            asyncio.get_running_loop().call_later(0.3, late)
        return await net.services[me].gather_frames("QmR", "m", 0, result.listed, result.frames_digest, me, sent[me],
                                                    timeout_s)
    return asyncio.run(go())


def test_a_check_gathers_each_frame_from_its_own_contributor_and_none_from_the_reducer():
    net, result, sent, _ = swarm()
    got = gather(net, result, sent)
    assert got == {p: sent[p] for p in ("QmB", "QmC")}
    assert net.opened[("QmA", "QmR")] == 0 and net.opened[("QmA", "QmB")] == net.opened[("QmA", "QmC")] == 1


def test_a_contributor_whose_reply_has_not_come_is_asked_again():
    net, result, sent, replies = swarm(reply_late="QmB")
    assert net.services["QmB"].store.own_frame("m", 0, "QmB", "QmA") == NOT_YET
    got = gather(net, result, sent, late=replies["QmB"])
    assert got == {p: sent[p] for p in ("QmB", "QmC")}
    assert net.opened[("QmA", "QmR")] == 0 and net.opened[("QmA", "QmB")] >= 2  # refused, then served


@pytest.mark.parametrize("case", ["another frame", "gone", "reply never comes"])
def test_frames_that_do_not_give_the_commitment_are_downloaded_from_the_reducer(case):
    """A member that serves another frame than the one it sent (the commitment tells, not who lied: the reducer's
    frames decide), one that is gone, or one whose reply never comes: the check still gets the round's frames."""
    result, _, sent = closed_round()
    kw = {"another frame": {"served": {"QmC": (sent["QmC"][0], sent["QmB"][1])}},
          "gone": {"dead": "QmC"}, "reply never comes": {"reply_late": "QmC"}}[case]
    net, result, sent, _ = swarm(**kw)
    t0 = time.monotonic()
    # waiting for a reply that never comes ends with half the deadline; a peer gone or a wrong frame at once
    got = gather(net, result, sent, timeout_s=2.0 if case == "reply never comes" else 30.0)
    assert got == {p: sent[p] for p in ("QmB", "QmC")}
    assert net.opened[("QmA", "QmR")] == 1 and time.monotonic() - t0 < 3.0


def test_a_reducer_that_refuses_is_asked_again_until_it_serves():
    """A contributor gone sends the check to the reducer, busy twice (its round's other checkers): asked once, the
    random audit counted the frames as hidden and put the reducer's next rounds of every module under check."""
    net, result, sent, _ = swarm(dead="QmC")
    net.refusals["QmR"] = 2
    got = gather(net, result, sent, timeout_s=10.0)
    assert got == {p: sent[p] for p in ("QmB", "QmC")}
    assert net.opened[("QmA", "QmR")] == 3
    net, result, sent, _ = swarm(dead="QmC")
    net.refusals["QmR"] = 1000  # refuses until the deadline: no frames, after asking again with backoff
    t0 = time.monotonic()
    assert gather(net, result, sent, timeout_s=3.0) is None
    assert 2.0 < time.monotonic() - t0 < 4.5 and 3 <= net.opened[("QmA", "QmR")] <= 12


def test_a_kept_frame_is_served_only_to_the_rounds_contributors_and_only_when_the_result_lists_it():
    store = FrameStore()
    store.sending("m", 0, "QmA", 5, b"ours")
    assert store.own_frame("m", 0, "QmA", "QmB") == NOT_YET  # no reply yet: we do not know the round's members
    store.replied("m", 0, {"QmA": 5, "QmB": 7}, frame_hash(b"ours"), ["QmA", "QmB"])
    assert store.own_frame("m", 0, "QmA", "QmB") == (5, b"ours")
    assert store.own_frame("m", 0, "QmA", "QmX") is None  # not a member of the round
    assert store.own_frame("m", 0, "QmB", "QmB") is None  # not our frame: we did not reduce the round
    store.sending("m", 1, "QmA", 5, b"ours, round 1")
    store.replied("m", 1, {"QmA": 5, "QmB": 7}, frame_hash(b"an earlier frame"), ["QmA", "QmB"])
    assert store.own_frame("m", 1, "QmA", "QmB") is None  # the result merged another frame of ours: not this one
    store.sending("m", 2, "QmA", 5, b"ours, round 2")
    store.replied("m", 2, {}, "", [])  # the round failed
    assert store.own_frame("m", 2, "QmA", "QmB") is None
    for r in (3, 4):
        store.sending("m", r, "QmA", 5, b"x")
    assert store.own_frame("m", 0, "QmA", "QmB") is None  # kept for FRAMES_KEPT rounds
    store.keep("m", 9, {"QmA": (5, b"a"), "QmB": (7, b"b")})  # a round we reduced: any listed frame, to its members
    assert store.own_frame("m", 9, "QmB", "QmA") == (7, b"b") and store.own_frame("m", 9, "QmB", "QmX") is None


def test_a_frame_sent_again_after_a_lie_stays_served_to_the_first_results_members():
    """A member whose reducer's mean proved a lie sends the same frame to the next candidate; the other members of
    the lying round, checking it, must still get our frame at once (not "not yet" until the resend's reply)."""
    store = FrameStore()
    store.sending("m", 0, "QmA", 5, b"ours")
    store.replied("m", 0, {"QmA": 5, "QmB": 7, "QmL": 3}, frame_hash(b"ours"), ["QmA", "QmB", "QmL"])
    store.sending("m", 0, "QmA", 5, b"ours")  # the resend
    assert store.own_frame("m", 0, "QmA", "QmB") == (5, b"ours")
    assert store.own_frame("m", 0, "QmA", "QmC") == NOT_YET  # not a member of the first result: not before the reply
    store.replied("m", 0, {"QmA": 5, "QmC": 2}, frame_hash(b"ours"), ["QmA", "QmC"])  # the resend's round
    assert store.own_frame("m", 0, "QmA", "QmC") == (5, b"ours")
    assert store.own_frame("m", 0, "QmA", "QmB") == (5, b"ours")
    store.sending("m", 1, "QmA", 5, b"ours 1")
    store.replied("m", 1, {"QmA": 5, "QmB": 7}, frame_hash(b"ours 1"), ["QmA", "QmB"])
    store.sending("m", 1, "QmA", 5, b"ours 1")
    store.replied("m", 1, {}, "", [])  # the resend's round failed: the first result's members still read our frame
    assert store.own_frame("m", 1, "QmA", "QmB") == (5, b"ours 1")
    store.sending("m", 1, "QmA", 6, b"another frame")  # not the same frame: nobody reads it before its reply
    assert store.own_frame("m", 1, "QmA", "QmB") == NOT_YET


def test_the_frames_budget_lets_every_checker_ask_once_per_slice_a_round():
    """A member of a round in slices is asked for its frame once per checked slice by each member checking it: with
    16 slices of 2 modules, 32 requests a round from one checker must not be refused as a flood."""
    from pathswarm.protocol.rounds.trust import Trust
    from pathswarm.protocol.spec import AveragingSpec, SwarmSpec

    def frames_budget(slices: int):
        spec = SwarmSpec(averaging=AveragingSpec(slices=slices))
        return Trust(spec, "QmMe", 2, Traffic(), lambda: 1 << 20, 1 << 20).guard.budgets["frames"]

    one, sliced = frames_budget(1), frames_budget(16)
    assert (one.burst, one.rate) == (8, 4.0)  # one reducer per module: as before
    assert sliced.burst >= 32 and sliced.rate >= 32 / 4
