"""Auditing a reducer (protocol/rounds/audit.py, protocol/rounds/rule.py `audit_mean`): the list a result carries, the
recomputation that proves a lie, and the parser of lists received from strangers."""

import asyncio
import dataclasses

import pytest
import torch

from pathswarm.compression import decode, encode
from pathswarm.protocol.rounds.exchange import ModuleExchange
from pathswarm.protocol.rounds.frame_list import MAX_LISTED, commit_frames, frame_hash, parse_listed
from pathswarm.protocol.rounds.messages import RoundReply as RoundResult
from pathswarm.protocol.rounds.outer import OuterState
from pathswarm.protocol.rounds.reducer_state import answer
from pathswarm.protocol.rounds.rule import AUDIT_TOLERANCE, audit_mean
from pathswarm.protocol.spec import AveragingSpec, SwarmSpec
from pathswarm.protocol.wire import write_message

NUMEL = 1000
SPEC = SwarmSpec(averaging=AveragingSpec(min_group=3, grace_s=0.5))
PEERS = ["QmA", "QmB", "QmC"]


def closed_round():
    """Three contributions reduced by a real exchange: its result and the frames it keeps for audits."""
    mine = OuterState(torch.linspace(-1, 1, NUMEL), torch.zeros(NUMEL), 0)
    ex = ModuleExchange(SPEC, None, "QmR", {"m": NUMEL}, lambda m: mine)
    ex.set_groups({**ex.ctx.groups.expected, "m": 3})
    gen = torch.Generator().manual_seed(1)
    sent = {p: (100 * (i + 1), encode(torch.randn(NUMEL, generator=gen) * 1e-2)) for i, p in enumerate(PEERS)}

    async def go():
        return await asyncio.gather(*(ex.reduce("m", 0, p, t, mine.digest(), f) for p, (t, f) in sent.items()))

    return asyncio.run(go())[0], ex, sent


def test_a_result_lists_every_merged_frame_and_the_reducer_keeps_them():
    result, ex, sent = closed_round()
    assert result.status == "merged"
    assert result.frames == tuple((p, sent[p][0], frame_hash(sent[p][1])) for p in PEERS)
    assert result.listed == tuple((p, sent[p][0]) for p in PEERS)
    assert result.frames_digest == commit_frames(result.frames)
    assert result.own == frame_hash(sent[PEERS[0]][1])  # the reply to QmA names QmA's own entry
    assert ex.audits.store.get("m", 0) == sent


def test_the_honest_mean_passes_the_audit_and_a_scaled_or_replaced_one_is_proven_wrong():
    result, ex, sent = closed_round()
    frames = ex.audits.store.get("m", 0)
    assert audit_mean(frames, result.listed, result.frames_digest, result.mean_frame, NUMEL, SPEC, 0.0) is None
    true = decode(result.mean_frame)
    for lie in (true * 1.5, -true, true + 1e-1 * torch.randn(NUMEL), torch.zeros(NUMEL) + 1e3):
        proof = audit_mean(frames, result.listed, result.frames_digest, encode(lie), NUMEL, SPEC, 0.0)
        assert proof is not None and "recomputed" in proof, proof
    # Within the tolerance (another machine's rounding): not a lie.
    near = true + (AUDIT_TOLERANCE / 4) * float(true.norm()) / NUMEL ** 0.5 * torch.ones(NUMEL)
    assert audit_mean(frames, result.listed, result.frames_digest, encode(near), NUMEL, SPEC, 0.0) is None
    assert "decode" in audit_mean(frames, result.listed, result.frames_digest, b"junk", NUMEL, SPEC, 0.0)


def test_frames_that_are_not_the_listed_ones_prove_nothing():
    result, ex, sent = closed_round()
    frames = dict(ex.audits.store.get("m", 0))
    frames["QmA"] = (frames["QmA"][0], encode(torch.ones(NUMEL)))  # whoever served them changed one
    with pytest.raises(ValueError):
        audit_mean(frames, result.listed, result.frames_digest, result.mean_frame, NUMEL, SPEC, 0.0)
    frames = dict(ex.audits.store.get("m", 0))
    frames["QmA"] = (frames["QmA"][0] * 2, frames["QmA"][1])  # another weight than listed
    with pytest.raises(ValueError):
        audit_mean(frames, result.listed, result.frames_digest, result.mean_frame, NUMEL, SPEC, 0.0)


def test_a_result_listing_a_frame_no_reducer_merges_is_proven_wrong():
    gen = torch.Generator().manual_seed(2)
    good = [(p, 100, encode(torch.randn(NUMEL, generator=gen) * 1e-2)) for p in PEERS]
    short = ("QmD", 100, encode(torch.randn(NUMEL // 2, generator=gen) * 1e-2))  # another module's size
    frames = {p: (t, f) for p, t, f in [*good, short]}
    entries = [(p, t, frame_hash(f)) for p, (t, f) in frames.items()]
    proof = audit_mean(frames, [(p, t) for p, t, _ in entries], commit_frames(entries), good[0][2], NUMEL, SPEC, 0.0)
    assert proof is not None and "no reducer merges" in proof


def test_an_honest_round_that_rejected_a_frame_passes_the_audit():
    """The reducer screened norms against the median of all the round's frames, the rejected one included: the
    audit, which sees only the frames used, must not screen them again (the median of the used ones alone is
    lower, and a frame the reducer rightly kept could fail it: a false proof against an honest reducer)."""
    gen = torch.Generator().manual_seed(3)
    mine = OuterState(torch.linspace(-1, 1, NUMEL), torch.zeros(NUMEL), 0)
    spec = SwarmSpec(averaging=AveragingSpec(min_group=5, grace_s=0.5))
    ex = ModuleExchange(spec, None, "QmR", {"m": NUMEL}, lambda m: mine)
    ex.set_groups({**ex.ctx.groups.expected, "m": 5})
    # The median norm of all five is C's (15): E is rejected (over 10x it), C and D kept; of the four used, the
    # median is 1 (torch takes the lower middle), and a second screen would reject C and D.
    scales = {"QmA": 1.0, "QmB": 1.0, "QmC": 15.0, "QmD": 20.0, "QmE": 1e4}
    sent = {p: (100, encode(torch.randn(NUMEL, generator=gen) * 1e-3 * k)) for p, k in scales.items()}

    async def go():
        return await asyncio.gather(*(ex.reduce("m", 0, p, t, mine.digest(), f) for p, (t, f) in sent.items()))

    result = asyncio.run(go())[0]
    assert [p for p, _, _ in result.frames] == ["QmA", "QmB", "QmC", "QmD"]  # E rejected
    assert audit_mean(ex.audits.store.get("m", 0), result.listed, result.frames_digest, result.mean_frame, NUMEL, spec,
                      0.0) is None


def test_frame_lists_from_strangers_are_parsed_strictly():
    assert parse_listed([["QmA", 5], ["QmB", 1]]) == (("QmA", 5), ("QmB", 1))
    assert parse_listed([]) == ()
    for bad in ("x", None, {"a": 1}, [["QmA"]], [["QmA", 5, "h"]], [["QmA", True]], [["QmA", 0]], [["QmA", 1 << 60]],
                [["Qm/A", 5]], [["QmA", 5], ["QmA", 6]], [["QmA", 5.0]], [["QmA", 1]] * 2,
                [[f"Qm{i}", 1] for i in range(MAX_LISTED + 1)]):
        with pytest.raises(ValueError):
            parse_listed(bad)


def test_a_result_of_the_largest_group_fits_in_one_header():
    """A result lists up to MAX_LISTED contributors: its header must still be one message (a group too large for it
    used to fail every member's round at the reducer's reply)."""
    from pathswarm.protocol.rounds.messages import RoundReply as RoundResult
    from pathswarm.protocol.rounds.messages import RoundStatus
    from pathswarm.protocol.rounds.reducers import MAX_CANDIDATES

    from ..fuzzing import Sink, read

    peers = [f"Qm{i:044d}" for i in range(MAX_LISTED)]
    result = RoundResult("m", 7, "merged", tuple(peers), 1 << 40, "ab" * 32, reducers=tuple(peers[:MAX_CANDIDATES]),
                         frames=tuple((p, (1 << 40) - i, "cd" * 32) for i, p in enumerate(peers)), mean_frame=b"x")
    sink = Sink()
    told = result.to(peers[0], RoundStatus.MERGED)
    asyncio.run(write_message(sink, told.header(), told.mean_frame))
    header, payload = asyncio.run(read(bytes(sink.data), 16))
    back = RoundResult.parse(header, payload)
    assert payload == b"x" and back.listed == tuple((p, t) for p, t, _ in result.frames)
    assert len(back.contributors) == MAX_LISTED and back.frames_digest == commit_frames(result.frames)


def test_a_member_stops_trusting_a_reducer_that_misreports_its_frame_unless_it_restarted_since():
    """The member's own check (protocol/rounds/member.py): a result that lists our frame with another hash or weight
    is a lie told to us; right after a restart (the module is still `fresh`) it is the frame we sent before dying."""
    from ..fuzzing import FRAME, OTHER_PEER, PEER, STATE, FakeStreams, exchange, message

    def reply(listed_tokens: int, listed_frame: bytes) -> bytes:
        entries = [(OTHER_PEER, listed_tokens, frame_hash(listed_frame)), (PEER, 7, "0" * 64)]
        return message({"module": "L0M0", "round": 3, "status": "merged", "contributors": [OTHER_PEER, PEER],
                        "tokens": 12, "digest_after": "d1" * 8, "reducers": [PEER],
                        "frame_tokens": [listed_tokens, 7], "frames_digest": commit_frames(entries),
                        "own": frame_hash(listed_frame)}, FRAME)

    def contribute(data: bytes, fresh: bool):
        ex = exchange(False, FakeStreams(data))
        if not fresh:
            ex.ctx.fresh.discard("L0M0")
        return ex, asyncio.run(ex.contribute([PEER], "L0M0", 3, 5, STATE.digest(), FRAME, 5.0))

    ex, honest = contribute(reply(5, FRAME), fresh=False)
    assert honest.status == "merged" and not ex.distrusted
    for lie in (reply(5, b"another frame"), reply(6, FRAME)):
        ex, result = contribute(lie, fresh=False)
        assert result.status == "failed" and "misreported" in result.reason and PEER in ex.distrusted
    ex, restarted = contribute(reply(5, b"the frame sent before the restart"), fresh=True)
    assert restarted.status == "merged" and not ex.distrusted
    # Still fresh after it: that round may fail its check here and the reducer answer our resend with the same
    # earlier frame, which must not then read as a lie (benchmarks/restarts.py --kill replying).
    assert "L0M0" in ex.ctx.fresh
    again = asyncio.run(ex.contribute([PEER], "L0M0", 3, 5, STATE.digest(), FRAME, 5.0))
    assert again.status == "merged" and not ex.distrusted
    # A result listing a frame of this run ends it: an earlier run's frame listed later is a lie again.
    ex.ctx.streams.reply = reply(5, FRAME)
    assert asyncio.run(ex.contribute([PEER], "L0M0", 3, 5, STATE.digest(), FRAME, 5.0)).status == "merged"
    assert "L0M0" not in ex.ctx.fresh


def test_the_audit_odds_count_contributors_we_know_as_holders_not_the_reducers_list():
    from pathswarm.node.peer.audit import audit_group_size

    honest = ["QmA", "QmB", "QmMe"]
    sybils = [f"QmSybil{i}" for i in range(50)]
    assert audit_group_size(honest, honest) == 3
    # fifty frames of ids nobody claims do not cut our odds from 1/3 to 1/53
    assert audit_group_size(honest + sybils, honest) == 3
    assert audit_group_size([], []) == 1


def test_a_new_reducers_first_rounds_are_audited_for_certain_then_at_random():
    from pathswarm.node.peer.audit import NEW_REDUCER_AUDITS, Auditor
    from pathswarm.node.peer.config import NodeConfig
    from pathswarm.node.peer.node_status import NodeStatus
    from pathswarm.protocol.rounds.messages import RoundReply as RoundResult

    def auditor(rate: float) -> tuple[Auditor, list]:
        a = Auditor(NodeConfig(spec=SwarmSpec(name="audit"), audit_rate=rate), NodeStatus(peer_id="QmMe"), None, None)
        fetched: list = []
        # the downloads themselves are tested end to end (tests/swarm/test_hostile.py)
        a._fetch = lambda module, r, source, alert: fetched.append(("later", r))
        a._verify_now = lambda module, r, reducer: fetched.append(("now", r)) or ("a lie" if r == 99 else "")
        a.draws.draw = lambda p: False  # not drawn for a random audit
        return a, fetched

    def result(r: int, reducer: str = "QmR") -> RoundResult:
        return RoundResult("shared", r, "merged", ("QmMe", reducer, "QmB"), 10, "ab", mean_frame=b"x",
                           reducer=reducer, frames=(("QmMe", 5, "00"), (reducer, 5, "11")))

    a, fetched = auditor(0.2)
    assert [a.record("shared", result(r), 1.0, (5, b"x"), ["QmMe", "QmR", "QmB"]) for r in range(1, 4)] == [""] * 3
    assert fetched == [("now", 1), ("now", 2), ("now", 3)]  # none passed yet: checked before being applied
    assert a.record("shared", result(99), 1.0, (5, b"x"), []) == "a lie"  # the caller does not apply it
    a.passed[("QmR", "shared")] = NEW_REDUCER_AUDITS
    fetched.clear()
    a.record("shared", result(6), 1.0, (5, b"x"), ["QmMe", "QmR", "QmB"])
    a.record("shared", result(7, "QmNew"), 1.0, (5, b"x"), ["QmMe", "QmNew", "QmB"])
    assert fetched == [("now", 7)]  # the seasoned reducer at random (not drawn this time), the new one for certain
    a.draws.draw = lambda p: True
    a.record("shared", result(8), 1.0, (5, b"x"), ["QmMe", "QmR", "QmB"])
    assert fetched[-1] == ("later", 8)  # drawn: audited in the background, applied meanwhile
    a, fetched = auditor(0.0)
    a.record("shared", result(1), 1.0, (5, b"x"), [])
    assert fetched == []  # --audit-rate 0: never


def test_random_audits_keep_their_rate_and_fall_evenly_over_the_rounds():
    import random
    import statistics

    from pathswarm.node.peer.audit import AUDIT_SPACING, AuditDraw

    # 16 nodes in 16 slices of 2 modules: 30 slice rounds applied a round, each audited at 0.2 / 16
    p, per_round, rounds = 0.2 / 16, 30, 4000
    draws = AuditDraw(random.Random(7))
    audited = [i for i in range(per_round * rounds) if draws.draw(p)]
    expected = p * per_round * rounds
    assert abs(len(audited) - expected) / expected < 0.03  # the rate of independent draws
    gaps = [b - a for a, b in zip(audited, audited[1:], strict=False)]
    assert min(gaps) >= int(AUDIT_SPACING[0] / p) and max(gaps) <= int(AUDIT_SPACING[1] / p) + 1
    # Audits per window of 6 rounds (2.25 expected): independent draws vary about 5 times as much as the spaced
    # ones, and the tail is what the busiest of 16 nodes takes (here 8 audits in a window against at most 4).
    window = 6 * per_round
    spaced = [sum(1 for i in audited if w <= i < w + window) for w in range(0, per_round * rounds, window)]
    rng = random.Random(8)
    independent = [sum(rng.random() < p for _ in range(window)) for _ in spaced]
    assert statistics.pvariance(spaced) < statistics.pvariance(independent) / 4
    assert max(spaced) <= 4 < max(independent)
    # a certain audit and none at all pass through, without moving the credit
    before = (draws.credit, draws.threshold)
    assert draws.draw(1.0) and not draws.draw(0.0) and (draws.credit, draws.threshold) == before
    # two nodes' first audits do not fall on the same round (each starts anywhere in its first spacing)
    firsts = {next(i for i in range(1000) if d.draw(p)) for d in (AuditDraw(random.Random(s)) for s in range(20))}
    assert len(firsts) > 10


def test_a_reducer_that_does_not_answer_a_random_audit_is_checked_before_applying_again():
    from concurrent.futures import Future

    from pathswarm.node.peer.audit import NEW_REDUCER_AUDITS, Auditor, _Check
    from pathswarm.node.peer.config import NodeConfig
    from pathswarm.node.peer.node_status import NodeStatus
    from pathswarm.protocol.rounds.messages import RoundReply as RoundResult

    class Exchange:  # what _check reads of the exchange; the downloads are tested end to end
        distrusted: dict = {}

    a = Auditor(NodeConfig(spec=SwarmSpec(name="audit"), audit_rate=0.2), NodeStatus(peer_id="QmMe"), Exchange(), None)
    now: list = []
    a._fetch = lambda module, r, source, alert: None
    a._verify_now = lambda module, r, reducer: now.append(r) or ""
    a.rng.random = lambda: 0.0  # drawn for a random audit
    a.passed[("QmR", "shared")] = NEW_REDUCER_AUDITS
    result = RoundResult("shared", 5, "merged", tuple(["QmMe", "QmR"]), 10, "ab", mean_frame=b"x", reducer="QmR",
                         frames=(("QmMe", 5, "00"), ("QmR", 5, "11")))
    assert a.record("shared", result, 1.0, (5, b"x"), ["QmMe", "QmR"]) == ""
    assert now == []  # seasoned: audited in the background, applied meanwhile
    refused: Future = Future()
    refused.set_exception(ConnectionError("refused"))
    assert a._check(_Check("shared", 5, "QmR", None, refused)) == ""  # proves nothing: nobody is told
    assert "QmR" not in Exchange.distrusted
    assert a.passed[("QmR", "shared")] == 0  # on probation
    a.record("shared", dataclasses.replace(result, round=6), 1.0, (5, b"x"), ["QmMe", "QmR"])
    assert now == [6]  # its next round is checked before it is applied


def test_a_rounds_frames_are_served_to_its_members_only():
    import socket

    from pathswarm.protocol.rounds.audit import AuditService
    from pathswarm.protocol.wire import Traffic, read_message, write_message

    async def serve(kind, sender, reader, writer, handle) -> None:  # everyone admitted
        header, _ = await read_message(reader, 0, Traffic())
        await handle(header)

    svc = AuditService(None, "t", {"shared": 10}, lambda m: 1000, serve, Traffic())
    svc.store.keep("shared", 3, {"QmA": (5, b"a" * 10), "QmB": (7, b"b" * 10)})

    async def ask(sender: str) -> dict:
        """One frames request from `sender` over a real socket pair; the answer's header and frames."""
        ours, theirs = socket.socketpair()
        r1, w1 = await asyncio.open_connection(sock=ours)
        r2, w2 = await asyncio.open_connection(sock=theirs)
        await write_message(w2, {"module": "shared", "round": 3, "skip": sender}, b"", Traffic())
        await svc._on_frames(sender, r1, w1)
        header, _ = await read_message(r2, 0, Traffic())
        got = {}
        for _ in range(header.get("count", 0)):
            h, _ = await read_message(r2, 0, Traffic())
            _, frame = await read_message(r2, 1000, Traffic())
            got[h["peer"]] = (h["tokens"], frame)
        w1.close()
        w2.close()
        return {"status": header["status"], "frames": got}

    assert asyncio.run(ask("QmA")) == {"status": "ok", "frames": {"QmB": (7, b"b" * 10)}}  # a member: the others'
    assert asyncio.run(ask("QmStranger"))["status"] == "missing"  # admitted to the swarm, not in the round
    assert asyncio.run(ask("QmLate"))["status"] == "missing"
    svc.store.allow("shared", 3, "QmLate")  # the reducer answered it "late": it applies the round, it may audit it
    assert asyncio.run(ask("QmLate"))["frames"] == {"QmA": (5, b"a" * 10), "QmB": (7, b"b" * 10)}
    svc.store.allow("shared", 9, "QmStranger")  # a round the store does not keep grants nothing
    assert asyncio.run(ask("QmStranger"))["status"] == "missing"


def test_a_member_answered_late_may_read_the_rounds_frames():
    # Through the reducer's own answer: a contribution that comes after the round closed is "late" (applicable),
    # and from then on its sender may download the round's frames for an audit.
    st = torch.zeros(NUMEL)
    mine = OuterState(st, st.clone(), 0)
    ex = ModuleExchange(SPEC, None, "QmR", {"m": NUMEL}, lambda m: mine)
    result = RoundResult("m", 0, "merged", ("QmA", "QmR"), 10, "d1", reducer="QmR",
                         frames=(("QmA", 5, "00"), ("QmR", 5, "11")), mean_frame=b"x")
    ex.audits.store.keep("m", 0, {"QmA": (5, b"a"), "QmR": (5, b"r")})
    assert answer(result, "QmA", ex.audits.store).status == "merged"
    assert answer(result, "QmLate", ex.audits.store).status == "late"
    assert ex.audits.store.may_read("m", 0, "QmLate") and ex.audits.store.may_read("m", 0, "QmA")
    assert not ex.audits.store.may_read("m", 0, "QmStranger")


def test_probation_counts_per_reducer_and_module():
    """docs/SECURITY.md: a reducer's first NEW_REDUCER_AUDITS rounds *of each module* are checked before they are
    applied. Counted per reducer, a reducer of 3 modules left its probation after one round of each (issue 27)."""
    from concurrent.futures import Future

    from pathswarm.node.peer.audit import NEW_REDUCER_AUDITS, Auditor, _Check
    from pathswarm.node.peer.config import NodeConfig
    from pathswarm.node.peer.node_status import NodeStatus

    result, _, sent = closed_round()  # an honest round of 3 contributors; the auditor is none of them

    class Exchange:  # what _check reads of the exchange
        distrusted: dict = {}
        numels = {m: NUMEL for m in ("m1", "m2", "m3")}

    a = Auditor(NodeConfig(spec=SPEC, audit_rate=0.2), NodeStatus(peer_id="QmMe"), Exchange(), None)
    a.draws.draw = lambda p: False  # never drawn for a random audit (AuditDraw: its own randomness)
    checked: list = []

    def verify_now(module, r, reducer):  # the download itself is tested end to end; the check is the real one
        checked.append((module, r))
        frames: Future = Future()
        frames.set_result(dict(sent))
        return a._check(_Check(module, r, reducer, None, frames))

    a._verify_now = verify_now
    honest = dataclasses.replace(result, reducer="QmR")
    for r in range(1, NEW_REDUCER_AUDITS + 2):
        for m in ("m1", "m2", "m3"):
            assert a.record(m, dataclasses.replace(honest, round=r), 0.0, (1, b""), PEERS) == ""
    # each module's first rounds were checked, one by one, however many modules the reducer holds
    assert checked == [(m, r) for r in range(1, NEW_REDUCER_AUDITS + 1) for m in ("m1", "m2", "m3")]
    assert all(a.passed[("QmR", m)] == NEW_REDUCER_AUDITS for m in ("m1", "m2", "m3"))


def auditor_fetching(spec, me: str, outcome):
    """An Auditor whose frame downloads end as `outcome(skip)` says (the frames, None, or an exception raised), and
    the `skip` of every download it asked for: the download itself is tested end to end."""
    from concurrent.futures import Future

    from pathswarm.node.peer.audit import Auditor
    from pathswarm.node.peer.config import NodeConfig
    from pathswarm.node.peer.node_status import NodeStatus

    asked: list = []

    class Audits:
        def frame_limit(self, module):  # frames of no size: a download's deadline is the averaging timeout
            return 0

        def gather_frames(self, reducer, module, round_, listed, frames_digest, me, own, timeout_s):
            # as if no contributor served its frame: the reducer's download, as `fetch_frames` below
            return self.fetch_frames(reducer, module, round_, timeout_s, frozenset(p for p, _ in listed),
                                     skip=me if own is not None else "")

        def fetch_frames(self, peer, module, round_, timeout_s, expected, skip=""):
            asked.append(skip)

            async def nothing():
                return None
            return nothing()

    class Exchange:
        distrusted: dict = {}
        numels = {"m": NUMEL}
        audits = Audits()

    class Net:
        def submit(self, coro):
            coro.close()
            done: Future = Future()
            got = outcome(asked[-1])
            if isinstance(got, Exception):
                done.set_exception(got)
            else:
                done.set_result(got)
            return done

    return Auditor(NodeConfig(spec=spec, audit_rate=0.2), NodeStatus(peer_id=me), Exchange(), Net()), asked


@pytest.mark.parametrize("outcome, attempts, why", [
    ("missing", 1, "keeps no frames of the round"),
    ("unreachable", 2, "cannot be reached"),
    ("busy", None, "did not show the frames"),
])
def test_a_check_before_applying_ends_at_once_on_an_answer_that_will_not_change(outcome, attempts, why):
    """A reducer restarted since (or a member that relayed a result it did not reduce) keeps no frames, and a dead
    one cannot be dialed: waiting the averaging timeout for them held a restarted node's modules some 10 rounds
    behind (benchmarks/restarts.py --kill replying). A download refused as busy is retried until the timeout."""
    import time

    from pathswarm.protocol.wire import FramesMissingError, UnreachableError

    spec = SwarmSpec(name="audit", averaging=AveragingSpec(grace_s=0.5, timeout_s=2.0))
    result, _, _ = closed_round()
    ends = {"missing": FramesMissingError("QmR keeps no frames of m round 0"),
            "unreachable": UnreachableError("QmR cannot be reached: failed to dial"),
            "busy": None}  # refused as busy
    a, asked = auditor_fetching(spec, "QmMe", lambda skip: ends[outcome])
    t0 = time.monotonic()
    reason = a.record("m", dataclasses.replace(result, reducer="QmR"), 0.0, (1, b""), PEERS)
    assert why in reason and "not audited yet" in reason
    if attempts is not None:
        assert len(asked) == attempts and time.monotonic() - t0 < 1.5
    else:
        assert len(asked) >= 2 and time.monotonic() - t0 >= 1.0  # retried, until the averaging timeout


def test_a_result_listing_an_earlier_frame_of_ours_is_checked_with_that_frame_from_the_reducer():
    """The reducer merged a frame we sent before (a resend, or our run before a restart): the check must download
    that frame too, not put our current one in its place (which failed every such check as "frames the result does
    not list": benchmarks/restarts.py --kill replying)."""
    result, _, sent = closed_round()  # QmA, QmB, QmC contributed; we are QmA and now hold another frame

    for own, skip in (((5, b"a frame of ours sent since"), ""), (sent["QmA"], "QmA")):
        # the reducer serves what is asked
        a, asked = auditor_fetching(SPEC, "QmA", lambda skipped: {p: f for p, f in sent.items() if p != skipped})
        assert a.record("m", dataclasses.replace(result, reducer="QmR"), 0.0, own, PEERS) == ""  # checked, passed
        assert asked == [skip] and a.passed[("QmR", "m")] == 1


def test_a_frames_download_waits_for_a_slow_peer_as_long_as_its_size_asks_and_cuts_one_that_stalls():
    """Frames (checks before applying, audits) on a slow uplink: a download that keeps moving is read to its end
    past the averaging timeout (`idle_s` here), one that stops is cut after it; the deadline as a whole grows with
    the bytes and with the members downloading from the same peer at once (audit.py `frames_deadline_s`)."""
    import socket

    from pathswarm.protocol.rounds.audit import AuditService, frames_deadline_s
    from pathswarm.protocol.rounds.messages import FrameHeader, FramesReply
    from pathswarm.protocol.rounds.state_parts import FLOOR_BYTES_PER_S
    from pathswarm.protocol.wire import _PREFIX, MAGIC, Traffic, read_message, write_message

    assert frames_deadline_s(20.0, 15, 1_200_000, 15) == 20.0 + 15 * 1_200_000 * 15 / FLOOR_BYTES_PER_S
    assert frames_deadline_s(20.0, 15, 1_200_000) == 20.0 + 15 * 1_200_000 / FLOOR_BYTES_PER_S
    assert frames_deadline_s(20.0, 0, 1_200_000, 15) == 20.0
    frame = bytes(range(256)) * 1024  # 256 KB: four 64 KB chunks, each written after a pause

    class Streams:
        def __init__(self, stall_after: int | None):
            self.stall_after = stall_after

        async def open(self, peer, name):
            ours, theirs = socket.socketpair()
            ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
            theirs.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            r1, w1 = await asyncio.open_connection(sock=ours)
            r2, w2 = await asyncio.open_connection(sock=theirs)
            asyncio.get_running_loop().create_task(self.serve(r2, w2))
            return r1, w1

        async def serve(self, reader, writer):  # a reducer on a slow uplink: 0.15 s per 64 KB
            await read_message(reader, 0)
            await write_message(writer, FramesReply("ok", 1).header())
            await write_message(writer, FrameHeader("QmB", 7).header())
            writer.write(_PREFIX.pack(MAGIC, 2, len(frame)) + b"{}")  # the frame's message, written by hand, slowly
            for i, off in enumerate(range(0, len(frame), 1 << 16)):
                if self.stall_after is not None and i >= self.stall_after:
                    await asyncio.sleep(10)  # stops sending, the connection still open
                await asyncio.sleep(0.15)
                writer.write(frame[off:off + (1 << 16)])
                await writer.drain()

    def fetch(stall_after: int | None):
        svc = AuditService(Streams(stall_after), "t", {"shared": 10}, lambda m: 1 << 20, None, Traffic(), idle_s=0.4)

        async def go():
            t0 = asyncio.get_running_loop().time()
            got = await svc.fetch_frames("QmR", "shared", 3, 5.0, frozenset({"QmB"}))
            return got, asyncio.get_running_loop().time() - t0

        return asyncio.run(go())

    got, took = fetch(None)
    assert got == {"QmB": (7, frame)} and took > 0.4  # longer than the idle limit, moving all along: read to the end
    got, took = fetch(2)
    assert got is None and took < 2.0  # two chunks, then nothing: cut after 0.4 s idle, not at the 5 s deadline


def test_a_check_waits_longer_for_the_frames_of_a_larger_group():
    from types import SimpleNamespace

    from pathswarm.node.peer.audit import Auditor, Received
    from pathswarm.node.peer.config import NodeConfig
    from pathswarm.node.peer.node_status import NodeStatus
    from pathswarm.protocol.rounds.audit import frames_deadline_s

    spec = SwarmSpec(name="audit")
    exchange = SimpleNamespace(audits=SimpleNamespace(frame_limit=lambda m: 1_000_000))
    a = Auditor(NodeConfig(spec=spec, audit_rate=0.2), NodeStatus(peer_id="QmMe"), exchange, None)

    def received(n: int, own: bool) -> Received:
        peers = ("QmMe", *(f"Qm{i}" for i in range(n - 1)))
        return Received("Qm0", tuple((p, 5) for p in peers), "ab" * 32, b"x", 1.0, peers, (5, b"f") if own else None)

    timeout = spec.averaging.timeout_s
    assert a._deadline_s("shared", received(16, own=True)) == frames_deadline_s(timeout, 15, 1_000_000, 15)
    assert a._deadline_s("shared", received(16, own=False)) == frames_deadline_s(timeout, 16, 1_000_000, 15)
    assert a._deadline_s("shared", received(2, own=True)) < a._deadline_s("shared", received(16, own=True))
