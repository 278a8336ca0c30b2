"""Module-group rounds without a network: the reducer's rules, and bounded message framing.

`ModuleExchange.reduce` is called directly (as the reducer does for its own contribution), so the
merging, late, out-of-sync and behind rules are checked with exact values; the framing tests feed
bytes to an asyncio StreamReader.
"""

import asyncio
import dataclasses
import struct

import pytest
import torch

from pathswarm.compression import decode, encode
from pathswarm.protocol.clock import ManualClock
from pathswarm.protocol.rounds.exchange import ModuleExchange
from pathswarm.protocol.rounds.merge import weighted_average
from pathswarm.protocol.rounds.outer import OuterState
from pathswarm.protocol.rounds.reducer_state import RANK_LOST, ReducerRound, rank_lost
from pathswarm.protocol.spec import AveragingSpec, SwarmSpec
from pathswarm.protocol.wire import MAGIC, WireError, read_message, write_message

NUMEL = 1000
SPEC = SwarmSpec(averaging=AveragingSpec(min_group=64, grace_s=0.5))


def post_state(state: OuterState, avg: torch.Tensor) -> OuterState:
    """The state after one outer step by hand: what the reducer's closed round must say."""
    return state.stepped(avg, SPEC.outer)


def make_exchange(expected: int) -> tuple[ModuleExchange, OuterState]:
    st = OuterState.fresh(torch.linspace(-1, 1, NUMEL))
    mine = OuterState(st.anchor, st.momentum, st.round)
    ex = ModuleExchange(SPEC, None, "reducer", {"L0M0": NUMEL}, lambda m: mine if m == "L0M0" else None)
    ex.set_groups({**ex.ctx.groups.expected, "L0M0": expected})
    return ex, mine


def frames(n: int) -> list[bytes]:
    gen = torch.Generator().manual_seed(0)
    return [encode(torch.randn(NUMEL, generator=gen) * 1e-3) for _ in range(n)]


def test_round_closes_when_every_holder_is_in_and_all_get_the_same_mean():
    async def go():
        ex, mine = make_exchange(expected=3)
        fs = frames(3)
        peers, tokens = ["p2", "p0", "p1"], [100, 300, 600]
        results = await asyncio.gather(*(ex.reduce("L0M0", 0, p, t, mine.digest(), f)
                                         for p, t, f in zip(peers, tokens, fs, strict=True)))
        return mine, fs, results

    mine, fs, results = asyncio.run(go())
    assert {r.status for r in results} == {"merged"}
    assert len({r.mean_frame for r in results}) == 1  # one canonical encoding for everybody
    assert list(results[0].contributors) == ["p0", "p1", "p2"] and results[0].tokens == 1000
    # The mean is the token-weighted mean in sorted peer order (then quantised once).
    order = {"p2": (100, fs[0]), "p0": (300, fs[1]), "p1": (600, fs[2])}
    exact = weighted_average([decode(order[p][1]) for p in sorted(order)], [order[p][0] for p in sorted(order)])
    got = decode(results[0].mean_frame)
    assert torch.linalg.vector_norm(got - exact) / torch.linalg.vector_norm(exact) < 0.02
    assert results[0].digest_after == post_state(mine, got).digest()


def test_grace_window_closes_a_partial_round_and_late_members_get_the_same_mean():
    async def go():
        ex, mine = make_exchange(expected=3)
        f = frames(2)
        first = await ex.reduce("L0M0", 0, "p0", 10, mine.digest(), f[0])  # alone until the grace window ends
        late = await ex.reduce("L0M0", 0, "p1", 10, mine.digest(), f[1])
        bad = await ex.reduce("L0M0", 0, "p2", 10, "0" * 16, f[1])
        return first, late, bad

    first, late, bad = asyncio.run(go())
    assert first.status == "alone" and list(first.contributors) == ["p0"]
    assert late.status == "late" and late.mean_frame == first.mean_frame
    assert bad.status == "out_of_sync"


def test_reducer_accepts_the_next_round_before_applying_its_own_result():
    async def go():
        ex, mine = make_exchange(expected=1)
        r0 = await ex.reduce("L0M0", 0, "p0", 10, mine.digest(), frames(1)[0])
        # p0 applied round 0 and sends round 1 while our training loop has not applied it yet.
        r1 = await ex.reduce("L0M0", 1, "p0", 10, r0.digest_after, frames(1)[0])
        ahead = await ex.reduce("L0M0", 5, "p9", 10, "ab" * 8, frames(1)[0])
        return r0, r1, ahead, ex

    r0, r1, ahead, ex = asyncio.run(go())
    assert r0.status == "alone" and r1.status == "alone" and r1.round == 1
    assert ahead.status == "behind" and ex.take_behind() == {"L0M0": "p9"}


def test_undecodable_frames_are_dropped_not_fatal():
    async def go():
        ex, mine = make_exchange(expected=2)
        good = frames(1)[0]
        return await asyncio.gather(ex.reduce("L0M0", 0, "p0", 10, mine.digest(), good),
                                    ex.reduce("L0M0", 0, "p1", 10, mine.digest(), b"garbage"))

    a, b = asyncio.run(go())
    assert list(a.contributors) == ["p0"] and b.status == "late"


def reader_of(data: bytes) -> asyncio.StreamReader:
    r = asyncio.StreamReader()
    r.feed_data(data)
    r.feed_eof()
    return r


def test_framing_round_trip_and_bounds():
    class Sink:
        def __init__(self):
            self.data = bytearray()

        def write(self, b):
            self.data += bytes(b)

        async def drain(self):
            pass

    async def go():
        sink = Sink()
        await write_message(sink, {"a": 1}, b"x" * 100)
        header, payload = await read_message(reader_of(bytes(sink.data)), max_payload=100)
        assert header == {"a": 1} and payload == b"x" * 100
        with pytest.raises(WireError, match="exceeds the limit"):
            await read_message(reader_of(bytes(sink.data)), max_payload=99)
        with pytest.raises(WireError, match="truncated"):
            await read_message(reader_of(bytes(sink.data[:-1])), max_payload=100)
        with pytest.raises(WireError, match="bad magic"):
            await read_message(reader_of(b"XXXX" + bytes(sink.data[4:])), max_payload=100)
        # A forged 1 TB length is refused from the 16-byte prefix alone, before any allocation.
        forged = struct.pack("<4sIQ", MAGIC, 2, 1 << 40) + b"{}"
        with pytest.raises(WireError, match="exceeds the limit"):
            await read_message(reader_of(forged), max_payload=1 << 20)

    asyncio.run(go())


def sync_exchange(spec: SwarmSpec, peer_id: str) -> tuple[OuterState, ModuleExchange]:
    """An offline exchange in sync-baseline mode holding one fresh module L0M0."""
    st = OuterState.fresh(torch.linspace(-1, 1, NUMEL))
    mine = OuterState(st.anchor, st.momentum, st.round)
    return mine, ModuleExchange(spec, None, peer_id, {"L0M0": NUMEL}, lambda m: mine,
                                sync_world=True)


def test_sync_world_round_waits_past_the_grace_window_for_every_expected_member():
    spec = SwarmSpec(averaging=AveragingSpec(min_group=2, grace_s=0.2, timeout_s=3.0))

    async def go():
        mine, ex = sync_exchange(spec, "reducer")
        ex.set_groups({**ex.ctx.groups.expected, "L0M0": 3})  # the job's world: min_group does not cap it in sync mode
        f = frames(3)
        t0 = asyncio.get_running_loop().time()
        first = asyncio.ensure_future(ex.reduce("L0M0", 0, "p0", 10, mine.digest(), f[0]))
        await asyncio.sleep(0.8)  # four grace windows: a decoupled round would have closed alone by now
        assert not first.done()
        rest = await asyncio.gather(*(ex.reduce("L0M0", 0, p, 10, mine.digest(), x) for p, x in (("p1", f[1]),
                                                                                              ("p2", f[2]))))
        full = [await first, *rest]
        waited = asyncio.get_running_loop().time() - t0
        # a member that never comes: the round closes at timeout_s with who is there
        t1 = asyncio.get_running_loop().time()
        st1 = post_state(mine, decode(full[0].mean_frame))
        assert st1.digest() == full[0].digest_after
        ex.ctx.state_of = lambda m: st1
        partial = await ex.reduce("L0M0", 1, "p0", 10, st1.digest(), f[0])
        return full, waited, partial, asyncio.get_running_loop().time() - t1

    full, waited, partial, partial_wait = asyncio.run(go())
    assert {r.status for r in full} == {"merged"} and list(full[0].contributors) == ["p0", "p1", "p2"]
    assert 0.8 <= waited < 3.0
    assert partial.status == "alone" and 2.9 <= partial_wait < 4.0


def test_rank_lost_names_a_member_whose_claim_lapsed_or_restarted():
    world = {"a": 3, "b": 3, "c": 0}
    assert rank_lost(world, {"a": 3, "b": 4, "c": 1, "d": 0}) == ""  # rounds went up, a newcomer is no loss
    assert rank_lost(world, {"a": 3, "c": 0}) == "b"  # b's claim lapsed
    assert rank_lost(world, {"a": 0, "b": 3, "c": 0}) == "a"  # a came back as a new process (round 0)
    assert rank_lost({}, {}) == ""


def test_sync_round_fails_for_everyone_when_a_member_dies_and_the_retry_opens_anew():
    spec = SwarmSpec(averaging=AveragingSpec(min_group=2, grace_s=0.2, timeout_s=5.0))

    async def go():
        mine, ex = sync_exchange(spec, "p0")
        ex.set_groups({**ex.ctx.groups.expected, "L0M0": 3})
        ex.set_groups(ex.ctx.groups.expected, live={"L0M0": {"p0": 2, "p1": 2, "p2": 2}})
        f = frames(3)
        waiting = [asyncio.ensure_future(ex.reduce("L0M0", 0, p, 10, mine.digest(), x))
                   for p, x in (("p0", f[0]), ("p1", f[1]))]
        await asyncio.sleep(0.6)
        assert not any(w.done() for w in waiting)  # p2 is alive: the round waits for it
        t0 = asyncio.get_running_loop().time()
        ex.set_groups(ex.ctx.groups.expected, live={"L0M0": {"p0": 2, "p1": 2}})  # p2's claim lapsed
        failed = await asyncio.gather(*waiting)
        noticed = asyncio.get_running_loop().time() - t0
        # p2 comes back as a new process: the retry at the same round number waits for it and merges all three
        ex.set_groups(ex.ctx.groups.expected, live={"L0M0": {"p0": 2, "p1": 2, "p2": 0}})
        retry = await asyncio.gather(*(ex.reduce("L0M0", 0, p, 10, mine.digest(), x)
                                       for p, x in (("p0", f[0]), ("p1", f[1]), ("p2", f[2]))))
        return failed, noticed, retry, {"L0M0": ex.tokens_reduced("L0M0")}

    failed, noticed, retry, reduced = asyncio.run(go())
    assert reduced == {"L0M0": 30}  # only the retry's three contributions of 10 tokens entered the model
    assert [r.status for r in failed] == ["failed", "failed"] and noticed < 1.0
    assert all(r.reason.startswith(RANK_LOST) and r.reason.endswith("p2") and not r.mean_frame for r in failed)
    assert {r.status for r in retry} == {"merged"} and list(retry[0].contributors) == ["p0", "p1", "p2"]


def test_an_open_round_takes_only_contributions_from_the_state_it_opened_with():
    # Regression: each contribution was checked against the reducer's state *now*; a reducer that re-synced
    # mid-round then merged outer gradients of two different states, and members diverged under one round.
    spec = SwarmSpec(averaging=AveragingSpec(min_group=8, grace_s=0.5, timeout_s=3.0))

    async def go():
        before = OuterState.fresh(torch.linspace(-1, 1, NUMEL))
        resynced = OuterState.fresh(torch.linspace(-2, 2, NUMEL))
        states = {"now": OuterState(before.anchor, before.momentum, 0)}
        ex = ModuleExchange(spec, None, "reducer", {"L0M0": NUMEL}, lambda m: states["now"])
        ex.set_groups({**ex.ctx.groups.expected, "L0M0": 3})
        f = frames(2)
        first = asyncio.ensure_future(ex.reduce("L0M0", 0, "p0", 10, before.digest(), f[0]))
        await asyncio.sleep(0.1)
        states["now"] = OuterState(resynced.anchor, resynced.momentum, 0)
        other = await ex.reduce("L0M0", 0, "p1", 10, resynced.digest(), f[1])
        return await first, other

    first, other = asyncio.run(go())
    assert other.status == "out_of_sync"
    # Nor does the round close on the state it opened with, which the reducer no longer holds: a result from it
    # would not say the state it makes, and p0 would apply that version unchecked. p0 looks at the announcements.
    assert first.status == "out_of_sync" and "moved past the round" in first.reason


def test_a_late_member_is_late_however_many_rounds_other_modules_closed():
    # Regression: closed results were pruned in (module, round) order across modules, so a busy module
    # ("shared") evicted every result of the others and their late members were told out_of_sync.
    async def go():
        states = {m: OuterState(torch.linspace(-1, 1, NUMEL), torch.zeros(NUMEL), 0) for m in ("L0M0", "shared")}
        ex = ModuleExchange(SPEC, None, "reducer", {"L0M0": NUMEL, "shared": NUMEL}, states.get)
        ex.set_groups({"L0M0": 1, "shared": 1})  # each round closes with its first contribution
        f = frames(1)[0]
        first = await ex.reduce("L0M0", 0, "p0", 10, states["L0M0"].digest(), f)
        digest = states["shared"].digest()
        for r in range(12):
            res = await ex.reduce("shared", r, "p0", 10, digest, f)
            assert res.status == "alone", res
            digest = res.digest_after
        late = await ex.reduce("L0M0", 0, "p1", 10, states["L0M0"].digest(), f)
        stale = await ex.reduce("shared", 0, "p1", 10, states["shared"].digest(), f)  # long forgotten
        return first, late, stale

    first, late, stale = asyncio.run(go())
    assert first.status == "alone"
    assert late.status == "late" and late.mean_frame == first.mean_frame and list(late.contributors) == ["p0"]
    assert stale.status == "out_of_sync"  # beyond RESULTS_KEPT rounds: the member must re-sync


# ---- grace window and sync deadline on a clock the test moves: minutes of protocol time, no sleeping ----
def clocked_exchange(spec: SwarmSpec, clock: ManualClock, sync_world: bool = False) -> tuple[OuterState,
                                                                                          ModuleExchange]:
    st = OuterState.fresh(torch.linspace(-1, 1, NUMEL))
    mine = OuterState(st.anchor, st.momentum, st.round)
    return mine, ModuleExchange(spec, None, "reducer", {"L0M0": NUMEL}, lambda m: mine,
                                sync_world=sync_world, clock=clock)


@pytest.mark.timeout(10)  # a real 30 s grace window would not fit
def test_the_grace_window_closes_a_partial_round_at_its_end_on_the_exchanges_clock():
    spec = SwarmSpec(averaging=AveragingSpec(min_group=3, grace_s=30.0))

    async def go():
        clock = ManualClock()
        mine, ex = clocked_exchange(spec, clock)
        ex.set_groups({**ex.ctx.groups.expected, "L0M0": 3})
        f = frames(3)
        first = asyncio.ensure_future(ex.reduce("L0M0", 0, "p0", 10, mine.digest(), f[0]))
        second = asyncio.ensure_future(ex.reduce("L0M0", 0, "p1", 30, mine.digest(), f[1]))
        await clock.advance(29.9)
        open_in_the_window = not first.done() and not second.done()
        await clock.advance(0.1)
        await asyncio.wait([first, second], timeout=5)  # the merge itself runs off the loop, on a real thread
        closed_at_its_end = first.done() and second.done()
        late = await ex.reduce("L0M0", 0, "p2", 10, mine.digest(), f[2])
        return open_in_the_window, closed_at_its_end, first.result(), second.result(), late

    open_in_the_window, closed_at_its_end, first, second, late = asyncio.run(go())
    assert open_in_the_window and closed_at_its_end
    assert first.status == second.status == "merged" and list(first.contributors) == ["p0", "p1"] and first.tokens == 40
    assert first.mean_frame == second.mean_frame
    assert late.status == "late" and late.mean_frame == first.mean_frame  # the third holder missed the window


@pytest.mark.timeout(10)  # a real 60 s deadline would not fit
def test_the_sync_deadline_closes_a_round_that_a_live_member_never_joins():
    spec = SwarmSpec(averaging=AveragingSpec(min_group=2, grace_s=5.0, timeout_s=60.0))

    async def go():
        clock = ManualClock()
        mine, ex = clocked_exchange(spec, clock, sync_world=True)
        ex.set_groups({**ex.ctx.groups.expected, "L0M0": 2})
        # p1 stays alive (its claim renewed) and never sends
        ex.set_groups(ex.ctx.groups.expected, live={"L0M0": {"reducer": 0, "p1": 0}})
        first = asyncio.ensure_future(ex.reduce("L0M0", 0, "reducer", 10, mine.digest(), frames(1)[0]))
        await clock.advance(59.0)  # eleven grace windows: a decoupled round would have closed long ago
        waiting = not first.done()
        await clock.advance(1.0)
        await asyncio.wait([first], timeout=5)  # the merge itself runs off the loop, on a real thread
        return waiting, first.done(), first.result()

    waiting, closed, result = asyncio.run(go())
    assert waiting and closed
    assert result.status == "alone" and list(result.contributors) == ["reducer"] and result.tokens == 10


def test_a_candidates_stance_names_who_holds_a_round_and_opens_it_for_a_later_candidate():
    """protocol/rounds/reducers.py rule 3: the earliest live candidate reduces. Asked by a later candidate, a holder
    at the round opens it (OPEN); asked by the head of its list (a restarted one), it does not (NOT_HERE)."""
    from pathswarm.protocol.rounds.reducers import Stance

    async def go():
        ex, mine = make_exchange(expected=2)
        at = dataclasses.replace(mine, reducers=("head", "reducer", "later"))
        ex.ctx.state_of = lambda m: at if m == "L0M0" else None
        answers = {
            "restarted head": ex.stance("L0M0", 0, at.digest(), "head"),
            "another version": ex.stance("L0M0", 0, "f" * 16, "later"),
            "an older round": ex.stance("L0M0", 1, at.digest(), "later"),
            "unknown module": ex.stance("L9M9", 0, at.digest(), "later"),
        }
        answers["later candidate"] = ex.stance("L0M0", 0, at.digest(), "later")  # opens it
        answers["asked again"] = ex.stance("L0M0", 0, at.digest(), "head")
        result = await ex.reduce("L0M0", 0, "later", 10, at.digest(), frames(1)[0])
        answers["after closing"] = ex.stance("L0M0", 0, at.digest(), "later")
        ex.ctx.state_of = lambda m: result_state
        result_state = dataclasses.replace(at, round=1)
        answers["past it"] = ex.stance("L0M0", 0, at.digest(), "later")
        return answers, result

    answers, result = asyncio.run(go())
    assert answers == {"restarted head": Stance.NOT_HERE, "another version": Stance.NOT_HERE,
                       "an older round": Stance.NOT_HERE, "unknown module": Stance.NOT_HERE,
                       "later candidate": Stance.OPEN, "asked again": Stance.OPEN, "after closing": Stance.CLOSED,
                       "past it": Stance.CLOSED}
    # the round closed by its grace window with the one contribution; the next round's candidates: us first
    assert result.status == "alone" and result.reducers == ("reducer", "later")


def test_a_contributor_asking_again_after_a_lost_reply_is_told_merged_not_late():
    async def go():
        ex, mine = make_exchange(expected=2)
        fs = frames(2)
        first = await asyncio.gather(ex.reduce("L0M0", 0, "a", 10, mine.digest(), fs[0]),
                                     ex.reduce("L0M0", 0, "b", 10, mine.digest(), fs[1]))
        again = await ex.reduce("L0M0", 0, "a", 10, mine.digest(), fs[0])  # its reply was lost: it asks again
        stranger = await ex.reduce("L0M0", 0, "c", 10, mine.digest(), fs[0])
        return first, again, stranger

    first, again, stranger = asyncio.run(go())
    assert [r.status for r in first] == ["merged", "merged"]
    assert again.status == "merged" and again.mean_frame == first[0].mean_frame  # not 'late': its Δ is in the mean
    assert stranger.status == "late" and stranger.reducers == first[0].reducers == ("reducer", "a", "b")


def test_a_reducer_alone_in_its_round_names_its_partners_so_split_sides_meet_again():
    """Two holders each reducing only themselves (the sides of a split after a revocation) would each name only
    themselves for the next round; alone in a round, a reducer names the holders it merged the module with (and
    itself), sorted, instead: the same list for both. With others in the round it names itself first, as before."""
    async def go():
        got = {}
        for case, genesis, others in (("alone", ("other", "reducer"), 0), ("no partners", (), 0),
                                      ("with others", ("other", "reducer"), 1)):
            ex, mine = make_exchange(expected=1 + others)
            ex.set_groups(ex.ctx.groups.expected, partners={"L0M0": genesis})
            fs = frames(2)
            results = await asyncio.gather(ex.reduce("L0M0", 0, "reducer", 10, mine.digest(), fs[0]),
                                           *(ex.reduce("L0M0", 0, "other", 10, mine.digest(), fs[1])
                                             for _ in range(others)))
            got[case] = results[0].reducers
        return got

    got = asyncio.run(go())
    assert got == {"alone": ("other", "reducer"), "no partners": ("reducer",), "with others": ("reducer", "other")}


def test_a_round_later_than_the_swarms_age_allows_is_refused_before_anything_reads_it():
    import socket
    import time

    old = SPEC.replace(created=int(time.time()) - 60)
    st = OuterState.fresh(torch.linspace(-1, 1, NUMEL))
    mine = OuterState(st.anchor, st.momentum, st.round)

    async def contribute(ex: ModuleExchange, round_: int) -> dict:
        """One contribution from QmX over a real socket pair, through the exchange's handler; its answer."""
        ours, theirs = socket.socketpair()
        r1, w1 = await asyncio.open_connection(sock=ours)
        r2, w2 = await asyncio.open_connection(sock=theirs)
        await write_message(w2, {"module": "L0M0", "round": round_, "tokens": 10, "digest": mine.digest(),
                                 "client": True}, b"", ex.traffic)
        await write_message(w2, {}, encode(torch.zeros(NUMEL)), ex.traffic)
        await ex.service._on_contribute("QmX", r1, w1)
        header, _ = await read_message(r2, 0, ex.traffic)
        w2.close()
        return header

    ex = ModuleExchange(old, None, "reducer", {"L0M0": NUMEL}, lambda m: mine)
    limit = old.round_limit(time.time())
    got = asyncio.run(contribute(ex, 1 << 40))
    assert got["status"] == "refused" and "later than the swarm's age allows" in got["reason"]
    # nothing of it was read or remembered
    assert ex.take_behind() == {} and ex.clients == set() and not ex.reducer.logs["L0M0"].open
    # Within the bound, a later round is the usual hint that we may be behind (node/peer/vouch.py decides).
    assert asyncio.run(contribute(ex, min(limit, 5)))["status"] == "behind"
    assert ex.take_behind() == {"L0M0": "QmX"} and ex.clients == {"QmX"}
    undated = ModuleExchange(SPEC, None, "reducer", {"L0M0": NUMEL}, lambda m: mine)
    assert asyncio.run(contribute(undated, 1 << 40))["status"] == "behind"  # no creation time: int64 bound only


def test_a_peer_most_holders_caught_lying_is_neither_our_reducer_nor_asked_who_reduces():
    st = OuterState.fresh(torch.linspace(-1, 1, NUMEL))
    mine = OuterState(st.anchor, st.momentum, st.round, reducers=("liar", "a", "me"))
    ex = ModuleExchange(SPEC, None, "me", {"L0M0": NUMEL}, lambda m: mine)
    ex.ctx.streams = object()  # to_ask answers [] offline; nothing is sent here
    assert ex.reducer.stances.to_ask("L0M0", mine) == ["liar", "a"]
    ex.set_voted_out(frozenset({"liar"}))  # node/peer/state_sync.py sets it from the announcements' votes
    assert ex.reducer.stances.to_ask("L0M0", mine) == ["a"]
    assert ex.shunned("liar") and not ex.shunned("a")


def test_a_reducer_that_applied_another_version_of_an_open_round_does_not_close_it():
    """A reducer whose state moved past a round while it was open (it applied another reducer's version of it, as
    a member that a liar's failover or a split reached): its own version would be a second one, unchecked."""
    async def go():
        ex, mine = make_exchange(expected=3)
        states = {"now": mine}
        ex.ctx.state_of = lambda m: states["now"]
        first = asyncio.ensure_future(ex.reduce("L0M0", 0, "p0", 10, mine.digest(), frames(1)[0]))
        await asyncio.sleep(0.1)
        other = OuterState.fresh(torch.linspace(-3, 3, NUMEL))
        states["now"] = OuterState(other.anchor, other.momentum, 1)  # round 0 applied elsewhere
        return await first

    got = asyncio.run(go())
    assert got.status == "out_of_sync" and list(got.contributors) == [] and not got.mean_frame


def test_a_round_sent_again_after_a_proven_lie_asks_a_candidate_that_still_defers_to_the_liar_again():
    from pathswarm.protocol.rounds.messages import RoundReply as RoundResult

    async def go(after_lie: bool, defer: int):
        ex, mine = make_exchange(expected=1)
        ex.distrust("liar", "its mean is not what its frames give")
        asks = 0

        async def contribute_to(reducer, module, round_, tokens, digest, frame, timeout_s):
            # candidate b defers to the liar for its first `defer` asks, then answers
            nonlocal asks
            asks += 1
            if asks <= defer:
                return RoundResult(module, round_, "redirect", reason="liar holds this round", redirect="liar")
            return RoundResult(module, round_, "failed", reason="test: reached")

        ex.member._contribute_to = contribute_to
        got = await ex.contribute(["b"], "L0M0", 0, 10, mine.digest(), frames(1)[0], 30.0, after_lie=after_lie)
        return got, asks

    got, asks = asyncio.run(go(after_lie=True, defer=2))
    assert asks == 3 and got.reason == "test: reached"  # asked again twice (0.25 s, then 0.5 s), then reached
    got, asks = asyncio.run(go(after_lie=False, defer=2))
    assert asks == 1 and got.status == "redirect"  # an ordinary round: a redirect to a liar ends it at once
    # bounded: a candidate that never stops deferring is asked for a grace window at most (SPEC: 0.5 s + 2 s)
    got, asks = asyncio.run(go(after_lie=True, defer=1000))
    assert 2 <= asks <= 6 and got.status == "redirect"


def test_a_round_answered_behind_stays_refused_once_the_reducer_catches_up():
    """A slice's reducer still settling the round before answers "behind" after its wait; members then fail over to
    the next candidate. Reducing that round once its own state reached it would make a second version of it (the
    members that came later would apply ours, those that failed over the next candidate's): it refuses the round
    from then on, as a member and when a later candidate asks its stance, and takes the next round as usual."""
    from pathswarm.protocol.rounds.reducers import Stance

    async def go():
        ex, mine = make_exchange(expected=1)
        states = {"now": mine}
        ex.ctx.state_of = lambda m: states["now"]
        early = await ex.reduce("L0M0", 1, "p0", 10, "ab" * 8, frames(1)[0])  # we are still at round 0
        at_1 = OuterState(mine.anchor + 0.5, mine.momentum, 1)
        states["now"] = at_1  # we caught up
        again = await ex.reduce("L0M0", 1, "p1", 10, at_1.digest(), frames(1)[0])
        stance = ex.reducer.stance("L0M0", 1, at_1.digest(), "p7")
        states["now"] = at_2 = OuterState(at_1.anchor + 0.5, at_1.momentum, 2)
        next_round = await ex.reduce("L0M0", 2, "p1", 10, at_2.digest(), frames(1)[0])
        far = await ex.reduce("L0M0", 1 << 40, "p9", 10, at_2.digest(), frames(1)[0])
        return early, again, stance, next_round, far, ex

    early, again, stance, next_round, far, ex = asyncio.run(go())
    assert early.status == "behind" and again.status == "behind" and not again.mean_frame
    assert again.reason == "reducer was behind this round and refuses it"
    assert stance == Stance.NOT_HERE
    assert next_round.status == "alone" and next_round.round == 2
    assert far.status == "behind" and set(ex.reducer.logs["L0M0"].refused) == {1}  # a far round is not kept


@pytest.mark.timeout(10)
def test_a_refused_round_is_reduced_after_a_rounds_timeout_when_no_other_candidate_took_it():
    """Every candidate may have been behind a round once (a split's holders going back and forth: they refused it in
    turn); refused for good, the round would have no reducer and the module stall (tests/swarm/test_split_heals.py
    did). The refusal holds for the spec's round timeout, then the round is reduced as usual."""
    spec = SwarmSpec(averaging=AveragingSpec(min_group=64, grace_s=0.5, timeout_s=20.0))

    async def go():
        clock = ManualClock()
        mine, ex = clocked_exchange(spec, clock)
        ex.set_groups({**ex.ctx.groups.expected, "L0M0": 1})
        states = {"now": mine}
        ex.ctx.state_of = lambda m: states["now"]
        early = await ex.reduce("L0M0", 1, "p0", 10, "ab" * 8, frames(1)[0])  # we are still at round 0
        states["now"] = at_1 = OuterState(mine.anchor + 0.5, mine.momentum, 1)
        await clock.advance(19.9)
        within = await ex.reduce("L0M0", 1, "p1", 10, at_1.digest(), frames(1)[0])
        await clock.advance(0.1)
        after = await asyncio.wait_for(ex.reduce("L0M0", 1, "p1", 10, at_1.digest(), frames(1)[0]), 5)
        return early, within, after, ex

    early, within, after, ex = asyncio.run(go())
    assert early.status == "behind" and within.status == "behind" and not within.mean_frame
    assert after.status == "alone" and after.round == 1 and after.mean_frame and after.contributors == ("p1",)
    assert not ex.reducer.logs["L0M0"].refused


def test_a_member_answered_behind_fails_over_to_the_next_candidate():
    from pathswarm.protocol.rounds.messages import RoundReply as RoundResult

    async def go():
        ex, mine = make_exchange(expected=1)
        asked = []

        async def contribute_to(reducer, module, round_, tokens, digest, frame, timeout_s):
            asked.append(reducer)
            if reducer == "a":
                return RoundResult(module, round_, "behind", reason="reducer is at round 0")
            return RoundResult(module, round_, "failed", reason="test: reached")

        ex.member._contribute_to = contribute_to
        got = await ex.contribute(["a", "b", "c"], "L0M0", 1, 10, mine.digest(), frames(1)[0], 30.0)
        return got, asked

    got, asked = asyncio.run(go())
    assert asked == ["a", "b"] and got.reason == "test: reached"


def slow_exchange(seconds: float, quorum: int = 1):
    """An offline exchange whose round rule takes `seconds` on its thread (a real sleep), and an event set when a close
    begins: what a 25 M-value merge looks like to the loop."""
    import threading
    import time

    from pathswarm.protocol.rounds.exchange import rule_closer

    started = threading.Event()

    def slow_closer(contributions, numel, before):
        started.set()
        time.sleep(seconds)
        return rule_closer(SPEC, contributions, numel, before)

    st = OuterState.fresh(torch.linspace(-1, 1, NUMEL))
    ex = ModuleExchange(SPEC, None, "reducer", {"L0M0": NUMEL}, lambda m: st, closer=slow_closer)
    ex.set_groups({"L0M0": quorum})
    return ex, st, started


async def until(event) -> None:
    while not event.is_set():
        await asyncio.sleep(0.01)


def test_the_merge_runs_off_the_event_loop_and_a_frame_arriving_during_it_is_late():
    """A 25 M-value merge takes a second or more: run on the loop, it held every other request. Here the rule takes
    0.5 s (a real thread sleeping): the loop keeps ticking meanwhile, and a frame sent once the close has begun is
    answered late with the very mean the round's members got."""
    import time

    async def go():
        ex, st, started = slow_exchange(0.5)
        fs = frames(2)
        first = asyncio.ensure_future(ex.reduce("L0M0", 0, "p0", 10, st.digest(), fs[0]))
        await until(started)
        ticks, t0 = 0, time.monotonic()
        while not first.done() and time.monotonic() - t0 < 5:
            await asyncio.sleep(0.02)
            ticks += 1
        late = await ex.reduce("L0M0", 0, "p1", 10, st.digest(), fs[1])
        return await first, ticks, late

    first, ticks, late = asyncio.run(go())
    assert ticks >= 10  # the loop ran ~25 times in the half second the merge took
    assert first.status == "alone" and late.status == "late" and late.mean_frame == first.mean_frame


def test_a_frame_sent_while_the_round_closes_is_late_not_merged():
    async def go():
        ex, st, started = slow_exchange(0.3)
        fs = frames(2)
        first = asyncio.ensure_future(ex.reduce("L0M0", 0, "p0", 10, st.digest(), fs[0]))
        await until(started)
        during = await ex.reduce("L0M0", 0, "p1", 10, st.digest(), fs[1])  # the round is open, its close begun
        return await first, during

    first, during = asyncio.run(go())
    assert list(first.contributors) == ["p0"] and during.status == "late" and during.mean_frame == first.mean_frame


def test_a_rule_that_raises_fails_the_round_for_its_members_instead_of_leaving_them_waiting():
    def broken(contributions, numel, before):
        raise RuntimeError("a bug in the rule")

    async def go():
        st = OuterState.fresh(torch.linspace(-1, 1, NUMEL))
        ex = ModuleExchange(SPEC, None, "reducer", {"L0M0": NUMEL}, lambda m: st, closer=broken)
        ex.set_groups({"L0M0": 1})
        return await asyncio.wait_for(ex.reduce("L0M0", 0, "p0", 10, st.digest(), frames(1)[0]), 5)

    got = asyncio.run(go())
    assert got.status == "failed" and "could not close" in got.reason and not got.mean_frame


@pytest.mark.timeout(20)
def test_a_silent_claimant_stops_holding_rounds_open_until_a_frame_of_it_arrives():
    """Issue 27: a peer that claims the module and never contributes held every round open for the whole grace
    window. It counts toward the quorum for its first SILENT_ROUNDS rounds, then not, until one of its frames (even
    a late one) reaches the reducer; a peer whose contributions are refused (a proven liar) never counts."""
    from pathswarm.protocol.rounds.reducer_state import SILENT_ROUNDS

    spec = SwarmSpec(averaging=AveragingSpec(min_group=8, grace_s=30.0))

    async def go():
        clock = ManualClock()
        mine, ex = clocked_exchange(spec, clock)
        ex.set_groups({}, holders={"L0M0": ("a", "reducer", "silent", "liar")})
        ex.distrust("liar", "test: a proven liar")
        f = frames(3)
        digest, waited = mine.digest(), []
        for r in range(SILENT_ROUNDS + 3):
            both = [asyncio.ensure_future(ex.reduce("L0M0", r, p, 10, digest, x))
                    for p, x in (("reducer", f[0]), ("a", f[1]))]
            await asyncio.wait(both, timeout=0.5)
            waited.append(not all(b.done() for b in both))
            if waited[-1]:
                await clock.advance(30.0)  # the grace window ends
                await asyncio.wait(both, timeout=5)
            results = [b.result() for b in both]
            assert {x.status for x in results} == {"merged"}, (r, waited, results)
            if r == SILENT_ROUNDS + 1:  # the silent one sends again, late: the round closed without it
                assert (await ex.reduce("L0M0", r, "silent", 10, digest, f[2])).status == "late"
            digest = results[0].digest_after
        return waited

    waited = asyncio.run(go())
    # rounds 0..2: the silent claimant is new and counted; round 3, 4: not (the liar never); round 5: its late frame
    # of round 4 counts it again
    assert waited == [True] * SILENT_ROUNDS + [False, False, True]


def test_a_member_that_stops_waiting_does_not_cancel_the_close_the_others_wait_for():
    """The contribution that completes the quorum runs the close; its member may stop waiting (its own timeout, a
    handler's deadline) while the merge runs. The close goes on: the round is closed, once, for the others."""
    async def go():
        ex, st, _ = slow_exchange(0.4, quorum=2)
        fs = frames(2)
        other = asyncio.ensure_future(ex.reduce("L0M0", 0, "p0", 10, st.digest(), fs[0]))
        await asyncio.sleep(0.05)
        with pytest.raises(TimeoutError):  # the frame that completes the quorum, then its member gives up
            await asyncio.wait_for(ex.reduce("L0M0", 0, "p1", 10, st.digest(), fs[1]), 0.1)
        return await asyncio.wait_for(other, 5), ex

    got, ex = asyncio.run(go())
    assert got.status == "merged" and list(got.contributors) == ["p0", "p1"]
    assert 0 in ex.reducer.logs["L0M0"].closed and not ex.reducer.logs["L0M0"].open


def test_only_a_frame_of_our_state_counts_a_claimant_as_active_and_a_returning_one_raises_the_quorum():
    from pathswarm.protocol.rounds.reducer_state import SILENT_ROUNDS

    st = OuterState.fresh(torch.linspace(-1, 1, NUMEL))
    ex = ModuleExchange(SPEC, None, "reducer", {"L0M0": NUMEL}, lambda m: st)
    log = ex.reducer.logs["L0M0"]
    log.note_claims(("a", "reducer", "silent"), 0)
    later = SILENT_ROUNDS  # noted every round in a live swarm; here the first and the one that counts
    log.note_claims(("a", "reducer", "silent"), later)
    assert log.silent("silent", later)

    async def junk():  # a far-future round, then a digest that is not ours: neither is a frame of our state
        await ex.reduce("L0M0", 10**6, "silent", 10, "ab" * 32, frames(1)[0])
        await ex.reduce("L0M0", 0, "silent", 10, "ab" * 32, frames(1)[0])

    asyncio.run(junk())
    assert log.silent("silent", later)
    # The round opened without it; its frame arrives: the quorum waits for the counted holders too.
    opened = ReducerRound("L0M0", later, "d", target=2, uncounted={"silent"})
    assert not opened.add("silent", 10, b"x") and opened.target == 3
    assert not opened.add("a", 10, b"x") and opened.add("reducer", 10, b"x")
    # A node that saw none of the rounds between (it re-synced far ahead) does not find everyone silent at once.
    log.note_claims(("a", "reducer", "silent"), later + 10)
    assert not any(log.silent(p, later + 10) for p in ("a", "reducer", "silent"))


def test_a_member_late_to_a_round_gets_one_longer_grace_window_then_none_for_a_while():
    """Issue 27: a restarted node's frames reached the reducer a second after each round's grace window ended, round
    after round (its next send waits for the round before, which ends when the reducer's does): late 10 times in a
    row, its outer gradient carried and growing. The round open when such a frame comes waits a grace window more
    for it (closing as soon as it is in), at most every other round."""
    from pathswarm.protocol.rounds.reducer_state import EXTEND_EVERY

    spec = SwarmSpec(averaging=AveragingSpec(min_group=8, grace_s=10.0))

    async def go():
        clock = ManualClock()
        mine, ex = clocked_exchange(spec, clock)
        ex.set_groups({}, holders={"L0M0": ("a", "reducer", "slow")})
        f, digest, before, closed_after = frames(3), mine.digest(), None, []
        for r in range(6):
            both = [asyncio.ensure_future(ex.reduce("L0M0", r, p, 10, digest, x))
                    for p, x in (("reducer", f[0]), ("a", f[1]))]
            waited = 0.0
            if before is not None:  # the slow member's frame of the round before, a second after it closed
                await clock.advance(1.0)
                waited += 1.0
                assert (await ex.reduce("L0M0", r - 1, "slow", 10, before, f[2])).status == "late"
            for step in (10.0 - waited, 10.0):  # the grace window, then the one an extension adds
                await clock.advance(step)
                waited += step
                await asyncio.wait(both, timeout=2)  # the merge runs on its thread, in real time
                if all(b.done() for b in both):
                    break
            closed_after.append(waited)
            results = [b.result() for b in both]
            before, digest = digest, results[0].digest_after
        return closed_after

    closed_after = asyncio.run(go())
    assert EXTEND_EVERY == 2 and closed_after == [10.0, 20.0] * 3, closed_after


def test_a_reducer_never_ignores_its_own_outer_gradient():
    """Issue 27: a reducer whose own outer gradient (steps carried over a stall) the screen rejected three times
    ignored itself, and failed every round of every module it held for the rest of the run."""
    ex, _ = make_exchange(expected=3)
    limit = ex.spec.averaging.max_rejections
    for r in range(limit + 1):
        ex.trust.note_rejected((("reducer", "norm too large"), ("other", "norm too large")), "L0M0", r)
    assert ex.trust.ignored("reducer") == "" and "reducer" not in ex.trust.offenses
    assert ex.trust.ignored("other").startswith("ignored")


def test_a_restarted_head_told_out_of_sync_by_its_own_stance_question_learns_who_is_ahead():
    from pathswarm.protocol.rounds.reducers import Stance

    ex, mine = make_exchange(expected=2)

    async def rival(module, round_, state):
        return "ahead-peer", Stance.AHEAD

    ex.reducer.stances.rival = rival
    got = asyncio.run(ex.reduce("L0M0", mine.round, "reducer", 10, mine.digest(), frames(1)[0]))
    assert got.status == "out_of_sync" and ex.take_ahead("L0M0") == "ahead-peer" and ex.take_ahead("L0M0") is None


def test_a_frame_of_one_slice_counts_its_sender_active_in_every_slice_of_the_module():
    """A restarted holder's late frame of slice j reached this node as slice j's reducer; the next round this node
    reduced another slice (the list rotates), whose log had not seen it: kept per slice, the holder stayed silent to
    every reducer and late to every round of the module (benchmarks/restarts.py --kill replying --slices 3)."""
    from pathswarm.protocol.rounds.reducer_state import SILENT_ROUNDS
    from pathswarm.protocol.rounds.slices import unit_id

    st = OuterState.fresh(torch.linspace(-1, 1, NUMEL))
    ex = ModuleExchange(SPEC, None, "reducer", {"L0M0": NUMEL, "L1M0": NUMEL}, lambda m: st)
    s0, s1, other = (ex.reducer.log(u) for u in (unit_id("L0M0", 0, 2), unit_id("L0M0", 1, 2), "L1M0"))
    holders = ("a", "reducer", "back")
    for log in (s0, s1, other):  # every round's claims, as a live node notes them
        log.note_claims(holders, 0)
        log.note_claims(holders, SILENT_ROUNDS)
    assert s1.silent("back", SILENT_ROUNDS) and other.silent("back", SILENT_ROUNDS)
    s0.note_seen("back", SILENT_ROUNDS)  # its late frame of slice 0
    s1.note_claims(holders, SILENT_ROUNDS + 1)
    assert not s1.silent("back", SILENT_ROUNDS + 1)  # the next round, as slice 1's reducer: waited for
    assert other.silent("back", SILENT_ROUNDS + 1)  # another module's rounds: not


@pytest.mark.timeout(20)
def test_a_member_late_to_one_slice_extends_the_grace_window_of_the_slice_this_node_reduces_next():
    """In a round in slices the list rotates: the node that reduced slice 0 of round 4 reduces slice 1 of round 5.
    Kept per slice, the extension a late frame earns (`_late_frame`) never applied, and a restarted holder whose
    phase was off by more than a grace window stayed late to every round of the module (benchmarks/restarts.py
    --kill replying --slices 3)."""
    from pathswarm.protocol.rounds.slices import unit_id

    spec = SwarmSpec(averaging=AveragingSpec(min_group=8, grace_s=10.0, slices=2))

    async def go():
        clock = ManualClock()
        st = OuterState.fresh(torch.linspace(-1, 1, 2 * 4096))
        ex = ModuleExchange(spec, None, "reducer", {"L0M0": 2 * 4096}, lambda m: st, clock=clock)
        red, u0, u1 = ex.reducer, unit_id("L0M0", 0, 2), unit_id("L0M0", 1, 2)
        red.extensions.closing(u0, 4, clock.now())  # slice 0 of round 4 closed here when its grace window ended
        await clock.advance(1.0)
        red._late_frame(u0, 4)  # a member's frame of it, a second later
        opened = red.open_round(u1, 5, ex.ctx.state_of(u1))  # the slice we reduce in round 5, opened since
        states = []
        for _ in range(2):
            await clock.advance(10.0)
            await asyncio.sleep(0.1)
            states.append(opened.closing or opened.result is not None)
        red._late_frame(u1, 5)  # late again right away: an extension at most every EXTEND_EVERY rounds
        return states, dict(red.extensions.extend)

    states, extend = asyncio.run(go())
    assert states == [False, True], states  # one grace window more, then closed
    assert extend == {}, extend


@pytest.mark.timeout(20)
def test_a_member_a_whole_round_late_earns_a_wait_as_long_as_its_lateness():
    """A holder restarted one whole round off in phase: its frames came a grace window late (12 s of 10), the rounds
    closing on their grace window while they waited for it. One window more was missed by that margin every round
    (benchmarks/restarts.py --kill replying --slices 3: 37 rounds of `shared` late). The next round waits as long as
    the frame was late plus half a window (17 s), up to LATE_GRACES windows; a frame later than that earns nothing."""
    from pathswarm.protocol.rounds.reducer_state import LATE_GRACES

    spec = SwarmSpec(averaging=AveragingSpec(min_group=8, grace_s=10.0))

    async def go(late_s: float):
        clock = ManualClock()
        st = OuterState.fresh(torch.linspace(-1, 1, 4096))
        ex = ModuleExchange(spec, None, "reducer", {"L0M0": 4096}, lambda m: st, clock=clock)
        red = ex.reducer
        red.extensions.closing("L0M0", 4, clock.now())
        await clock.advance(late_s)
        red._late_frame("L0M0", 4)
        opened = red.open_round("L0M0", 5, ex.ctx.state_of("L0M0"))
        closed_at = None
        for t in range(1, 31):
            await clock.advance(1.0)
            await asyncio.sleep(0.01)
            if closed_at is None and (opened.closing or opened.result is not None):
                closed_at = t
        return closed_at

    assert asyncio.run(go(12.0)) == 10 + 17  # its grace window, then 12 + 5 s more
    assert asyncio.run(go(1.0)) == 10 + 6  # a second late: 6 s more (it was a grace window before: 10)
    assert asyncio.run(go(LATE_GRACES * 10.0 + 1)) == 10  # later than LATE_GRACES windows: nothing


def test_at_round_0_a_holder_asked_by_a_slices_first_reducer_does_not_take_that_slice():
    """Round 0 in slices follows the genesis list rotated per slice (slices.py `agreed_list`). A holder earlier in the
    unrotated list, asked by slice 1's first candidate, must answer that it does not hold the round; taking it, it
    would reduce every slice itself (round 0 with one reducer again)."""
    import dataclasses

    from pathswarm.protocol.rounds.reducers import Stance
    from pathswarm.protocol.rounds.slices import SLICE_ALIGN

    numel = 3 * SLICE_ALIGN
    spec = SPEC.replace(averaging=dataclasses.replace(SPEC.averaging, slices=3))
    mine = OuterState.fresh(torch.linspace(-1, 1, numel))
    ex = ModuleExchange(spec, None, "reducer", {"L0M0": numel}, lambda m: mine)
    ex.set_groups({"L0M0": 3}, genesis={"L0M0": ("reducer", "r1", "r2")})
    async def go():
        slice_1, slice_0 = ex.ctx.state_of("L0M0[1/3]"), ex.ctx.state_of("L0M0[0/3]")
        asked_1 = ex.reducer.stance("L0M0[1/3]", 0, slice_1.digest(), "r1")  # r1 heads slice 1
        asked_0 = ex.reducer.stance("L0M0[0/3]", 0, slice_0.digest(), "r1")  # we head slice 0: open here
        return slice_1, asked_1, asked_0

    slice_1, asked_1, asked_0 = asyncio.run(go())
    assert slice_1.round == 0 and asked_1 == Stance.NOT_HERE and asked_0 == Stance.OPEN
    assert 0 not in ex.reducer.log("L0M0[1/3]").open and 0 in ex.reducer.log("L0M0[0/3]").open
