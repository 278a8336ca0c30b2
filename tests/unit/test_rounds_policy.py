"""The node's round bookkeeping around the round rule (node/peer/rounds.py): what it does when a check before applying
proves a round's reducer a liar. The network side is stubbed (a future per send, the exchange's candidate lists
recorded): multi-node behaviour is tests/swarm's."""

import concurrent.futures
from types import SimpleNamespace

import pytest

from pathswarm.node.model.data import TokenSampler
from pathswarm.node.peer.claims import Groups
from pathswarm.node.peer.config import NodeConfig
from pathswarm.node.peer.node_status import NodeStatus
from pathswarm.node.peer.rounds import Rounds
from pathswarm.node.train.worker import PathWorker
from pathswarm.protocol.rounds.messages import RoundReply as RoundResult


class _Exchange:
    """Records every contribute call as (candidates, module, round, tokens)."""

    def __init__(self):
        self.calls, self.after_lie, self.distrusted = [], [], {}
        self.audits = SimpleNamespace(alerts=[])

    def contribute(self, candidates, module, round_, tokens, digest, frame, timeout_s, after_lie=False):
        self.calls.append((list(candidates), module, round_, tokens))
        self.after_lie.append(after_lie)
        return None

    def skipped(self):
        return []

    def distrust(self, peer, reason):
        self.distrusted.setdefault(peer, reason)


def _rounds(spec, docs):
    sampler = TokenSampler(docs, spec.model.context_len, seed=0)
    worker = PathWorker(spec, (0, 0), lambda: sampler.sample(2))
    exchange = _Exchange()
    futures = []

    def submit(coro):
        coro.close()  # never run: the test completes the future itself
        futures.append(concurrent.futures.Future())
        return futures[-1]

    rounds = Rounds(NodeConfig(spec=spec, offline=True), NodeStatus(), worker, exchange,
                    SimpleNamespace(submit=submit), lambda mid: None)
    return rounds, worker, exchange, futures


def _groups(worker, order=("r1", "r2", "me")):
    return Groups({mid: sorted(order) for mid in worker.module_ids}, {mid: tuple(order) for mid in worker.module_ids},
                  {})


def _sliced_round_sent(docs):
    """A round of every module sent in slices: 3 members agreed ("me", "r1", "r2"), so each module in 3 slices."""
    import dataclasses

    from ..conftest import tiny_spec

    spec = tiny_spec(width=64, base_width=64)
    spec = spec.replace(averaging=dataclasses.replace(spec.averaging, slices=4))
    rounds, worker, exchange, _ = _rounds(spec, docs)
    agreed = ("me", "r1", "r2")
    for m in worker.module_ids:
        worker.outer[m] = worker.outer[m].with_reducers(agreed)
    worker.train_inner(1)
    rounds.send(_groups(worker, agreed))
    return rounds, worker, exchange


def _send(rounds, worker, groups):
    worker.train_inner(1)
    rounds.send(groups)
    return worker.round_tokens


def _settle_with(rounds, mid, result, refused: str | None):
    flight = rounds.in_flight[mid].units[0]  # the round is not sliced: one unit, the module
    flight.future.set_result(result)
    if refused is not None:
        rounds.auditor.record = lambda *args, **kw: refused  # the check before applying: its verdict
    rounds.poll(block=False)
    return flight


def test_a_round_whose_reducer_a_check_proved_a_liar_goes_to_the_next_candidate_once(spec, synthetic_docs):
    rounds, worker, exchange, futures = _rounds(spec, synthetic_docs)
    mid = worker.module_ids[0]
    _send(rounds, worker, _groups(worker))
    first = next(c for c in exchange.calls if c[1] == mid)
    assert first[0][0] == "r1"
    anchor = worker.outer[mid].anchor.clone()
    lie = RoundResult(mid, 0, "merged", mean_frame=b"x", contributors=["r1", "me"], reducer="r1",
                      frames=(("r1", 1, "h"),))
    exchange.distrusted["r1"] = "its mean is not what its frames give"
    exchange.calls.clear()
    sent = _settle_with(rounds, mid, lie, "its mean of it is not what its frames give")
    # sent again: the same contribution, the same round, to the candidates after the liar
    assert exchange.calls == [(["r2", "me"], mid, first[2], first[3])] and exchange.after_lie[-1] is True
    again = rounds.in_flight[mid].units[0]
    assert again.retried and again.sent is sent.sent and again.reducer == "r2"
    assert rounds.in_flight[mid].sent is sent.sent
    assert rounds.status.rounds_retried == 1 and rounds.status.rounds_failed == 0
    assert worker.outer[mid].round == 0 and bool((worker.outer[mid].anchor == anchor).all())  # nothing applied
    # a second proven lie in the same round is not sent again: the round fails, our steps carry
    exchange.distrusted["r2"] = "also lied"
    exchange.calls.clear()
    _settle_with(rounds, mid, RoundResult(mid, 0, "merged", mean_frame=b"x", contributors=["r2", "me"],
                                          reducer="r2", frames=(("r2", 1, "h"),)), "a lie")
    assert exchange.calls == [] and mid not in rounds.in_flight
    assert rounds.status.rounds_failed == 1 and rounds.carry[mid] == first[3]


def test_a_mean_beyond_our_bound_makes_its_reducer_a_proven_liar_and_the_round_goes_to_the_next_candidate(
        spec, synthetic_docs):
    """A reducer past its checked rounds (the audit before applying passes nothing here: `record` says "") sends a
    mean far beyond what an honest round sends us (protocol/rounds/rule.py `mean_bound`): nothing is applied, we
    stop trusting it, and the same contribution goes to the next candidate, as after a lie caught by a check."""
    import torch

    from pathswarm.compression import encode

    rounds, worker, exchange, _ = _rounds(spec, synthetic_docs)
    mid = worker.module_ids[0]
    _send(rounds, worker, _groups(worker))
    first = next(c for c in exchange.calls if c[1] == mid)
    anchor, numel = worker.outer[mid].anchor.clone(), worker.outer[mid].anchor.numel()
    exchange.calls.clear()
    huge = encode(torch.full((numel,), 1e3))
    _settle_with(rounds, mid, RoundResult(mid, 0, "merged", mean_frame=huge, contributors=["r1", "r2", "me"],
                                          reducer="r1", frames=(("r1", 1, "h"), ("r2", 1, "h"), ("me", 1, "h"))), "")
    assert "most an honest round sends" in exchange.distrusted["r1"]
    assert exchange.calls == [(["r2", "me"], mid, first[2], first[3])] and exchange.after_lie[-1] is True
    assert worker.outer[mid].round == 0 and torch.equal(worker.outer[mid].anchor, anchor)  # nothing applied
    assert rounds.status.rounds_retried == 1


def test_a_reducer_proven_a_liar_after_we_applied_its_rounds_has_them_undone_before_our_next_send(spec, synthetic_docs):
    """Healing (protocol/rounds/heal.py) as the node runs it: the anchor goes back to before the liar's round, our
    local progress stays on top of it, the tokens we merged in the undone rounds are discarded, and it happens once."""
    import torch

    from pathswarm.compression import encode
    from pathswarm.protocol.rounds.rule import decode_mean

    rounds, worker, exchange, _ = _rounds(spec, synthetic_docs)
    mid = worker.module_ids[0]
    numel = worker.outer[mid].anchor.numel()
    good = worker.outer[mid]
    st = good
    for r, reducer in enumerate(["liar", "r2"]):  # the liar's lie (round 0), then an honest round from its anchor
        frame = encode(torch.full((numel,), 0.05 * (r + 1)))
        st = st.stepped(decode_mean(frame, numel, spec.codec), spec.outer)
        rounds.applied.applied(mid, r, reducer, frame, st.digest())
        rounds.merged_log.setdefault(mid, {})[r + 1] = 100
    worker.outer[mid] = st
    worker.set_flat(mid, st.anchor + 0.25)  # our steps since the last round
    rounds.status.round_settled("shared", 200, 0)
    exchange.distrusted["liar"] = "its mean of it is not what its frames give"
    rounds.auditor.proven["liar"] = 0  # an audit proved its round 0 a lie
    assert rounds.checks.undo_lies(mid, rounds.merged_log[mid])
    healed = worker.outer[mid]
    assert healed.round == 3 and torch.allclose(healed.anchor, good.anchor, atol=1e-5)
    assert torch.allclose(worker.flat(mid), healed.anchor + 0.25, atol=1e-5)  # our progress kept
    assert rounds.status.rounds_undone == 2 and rounds.merged_log[mid] == {}
    assert mid == "shared" and (rounds.status.tokens_merged, rounds.status.tokens_discarded) == (0, 200)
    assert not rounds.checks.undo_lies(mid, rounds.merged_log[mid])  # once: the log that led to the lie is gone
    assert worker.outer[mid] is healed and rounds.status.rounds_undone == 2


def test_a_mean_pointing_away_from_our_outer_gradient_is_checked_before_it_is_applied(spec, synthetic_docs):
    """A reducer past its checked rounds: its round is audited before applying when its mean points away from our
    outer gradient in it (protocol/rounds/rule.py `suspicious`: a sign-flipped mean), not when it points our way."""
    from pathswarm.compression import encode

    asked = []
    for sign in (1.0, -1.0):
        rounds, worker, exchange, _ = _rounds(spec, synthetic_docs)
        mid = worker.module_ids[0]
        _send(rounds, worker, _groups(worker))
        sent = rounds.in_flight[mid].sent
        ours = worker.outer[mid].anchor - sent.local_when_sent
        rounds.auditor.record = lambda *args, **kw: asked.append(kw.get("suspect")) or ""
        _settle_with(rounds, mid, RoundResult(mid, 0, "merged", mean_frame=encode(sign * ours), reducer="r1",
                                              contributors=["r1", "me"], frames=(("r1", 1, "h"), ("me", 1, "h"))),
                     None)
    assert asked == [False, True]


def test_a_reducer_that_only_did_not_show_its_frames_is_not_failed_over_from(spec, synthetic_docs):
    """Not showing the frames proves nothing (the others may have applied the round): the round fails for us."""
    rounds, worker, exchange, _ = _rounds(spec, synthetic_docs)
    mid = worker.module_ids[0]
    _send(rounds, worker, _groups(worker))
    exchange.calls.clear()
    _settle_with(rounds, mid, RoundResult(mid, 0, "merged", mean_frame=b"x", contributors=["r1", "me"],
                                          reducer="r1", frames=(("r1", 1, "h"),)),
                 "r1 did not show the frames of it, and it is not audited yet")
    assert exchange.calls == [] and mid not in rounds.in_flight
    assert rounds.status.rounds_failed == 1 and rounds.status.rounds_retried == 0



def test_a_reducer_does_not_wait_for_holders_whose_contributions_it_refuses(spec):
    """A round we reduce closes once the holders we expect have contributed; a proven liar still claims the module,
    but its contributions are refused: counted, it would hold every such round open for the whole grace window
    (benchmarks/hostile.py's lying arm)."""
    from pathswarm.node.peer.node import Node
    from pathswarm.protocol.rounds.exchange import ModuleExchange

    node = Node(NodeConfig(spec=spec, offline=True))
    node.status.started_as("me")
    node.exchange = node.seat.exchange = ModuleExchange(spec, None, "me", {"shared": 10, "L0M0": 10}, lambda m: None)
    holders = {"shared": ["a", "b", "liar", "me", "voted"], "L0M0": ["liar", "me"]}
    groups = Groups(holders, {m: tuple(p) for m, p in holders.items()}, {m: {} for m in holders})
    node.seat.use_groups(groups)
    assert node.exchange.ctx.groups.expected == {"shared": 5, "L0M0": 2}
    node.exchange.distrust("liar", "its mean is not what its frames give")
    node.exchange.trust.voted_out = frozenset({"voted"})
    node.seat.use_groups(groups)
    # the liar is refused; a peer only voted out (by a joiner's count) is still merged, so it still counts
    assert node.exchange.ctx.groups.expected == {"shared": 4, "L0M0": 1}


def test_a_blocking_poll_waits_for_the_round_sent_again_and_then_completes(spec, synthetic_docs):
    """The round sent again after a proven lie is settled by the same blocking poll (its second pass): the node's
    round completes once, when it settles."""
    import threading

    rounds, worker, exchange, futures = _rounds(spec, synthetic_docs)
    _send(rounds, worker, _groups(worker))
    exchange.distrusted["r1"] = "its mean is not what its frames give"
    rounds.auditor.record = lambda *args, **kw: "its mean is not what its frames give"
    lie = {mid: RoundResult(mid, 0, "merged", mean_frame=b"x", contributors=["r1", "me"], reducer="r1",
                            frames=(("r1", 1, "h"),)) for mid in worker.module_ids}
    first = list(futures)
    for mid, fut in zip(worker.module_ids, first, strict=True):
        fut.set_result(lie[mid])

    def answer_the_second_sends():
        while len(futures) < 2 * len(first):
            threading.Event().wait(0.01)
        for mid, fut in zip(worker.module_ids, futures[len(first):], strict=True):
            fut.set_result(RoundResult(mid, 0, "failed", reason="test: the next candidate failed it too"))

    threading.Thread(target=answer_the_second_sends, daemon=True).start()
    assert rounds.poll(block=True, timeout_s=5.0) is True  # both passes settled: the round is complete
    assert rounds.in_flight == {} and rounds.status.rounds_retried == len(worker.module_ids)
    assert rounds.status.rounds_failed == len(worker.module_ids)


def test_a_slice_where_our_outer_gradient_is_nothing_still_takes_an_honest_mean(synthetic_docs):
    """In a round in slices, a slice of ours may be all zeros (embedding rows of bytes our documents never held) where
    another member's is not: the member's bound is the whole module's, so an honest mean of that slice is applied,
    not taken for a lie (measured at 8 nodes before: every such slice's reducer distrusted)."""
    import dataclasses

    import torch

    from pathswarm.compression import encode
    from pathswarm.protocol.rounds.slices import view

    rounds, worker, exchange = _sliced_round_sent(synthetic_docs)
    mid = "L0M0"
    units = [f.unit for f in rounds.in_flight[mid].units]
    assert len(units) == 3 and units[0].id == "L0M0[0/3]"  # K: one slice per member of the agreed list
    # Our slice 1 is made all zeros (as if our steps never touched it), before the send's frames are read back.
    u = units[1]
    flight = rounds.in_flight[mid].units[1]
    zero_sent = dataclasses.replace(flight.sent, delta_norm=0.0,
                                    local_when_sent=worker.outer[mid].anchor[u.lo:u.hi].clone())
    flight.sent = zero_sent
    st = view(worker.outer[mid], u)
    mean = torch.full((u.numel,), 1e-4)  # an honest-sized mean from the others
    reducer = flight.order[0]
    flight.future.set_result(RoundResult(u.id, 0, "merged", mean_frame=encode(mean), reducer=reducer,
                                         contributors=["me", "r1", "r2"], frames=(("r1", 1, "h"),)))
    rounds.auditor.record = lambda *args, **kw: ""  # its checks pass
    rounds.poll(block=False)
    assert reducer not in exchange.distrusted, exchange.distrusted
    assert flight.result is not None and flight.result.status == "merged", flight.result
    assert flight.bound is not None and flight.bound > float(torch.linalg.vector_norm(mean)) and st.round == 0


def test_a_module_whose_round_is_still_open_carries_and_goes_out_once_it_settles(spec, synthetic_docs):
    """The rounds' side of decoupled sends (node/peer/round_loop.py `RoundLoop.run`, `_send_settled`): a send skips a
    module whose round is still open (its steps carry), and a later send of that module alone belongs to the same chunk.
    The node's round is complete once every module sent in a chunk has settled, whatever the next chunk has in
    flight; a checkpoint then keeps, for a module in flight, its error feedback from before that send."""
    import torch

    rounds, worker, exchange, _ = _rounds(spec, synthetic_docs)
    a, b = worker.module_ids[:2]
    groups = _groups(worker)
    _send(rounds, worker, groups)
    first = next(c[3] for c in exchange.calls if c[1] == b)
    assert set(rounds.in_flight) == set(worker.module_ids) and rounds.generation == 1

    def fail(mid):
        rounds.in_flight[mid].units[0].future.set_result(RoundResult(mid, 0, "failed", reason="test"))
        return rounds.poll(block=False)

    others = [m for m in worker.module_ids if m != b]
    assert [fail(m) for m in others] == [False] * len(others)  # b's round still open: not complete
    worker.train_inner(1)
    second = worker.round_tokens
    exchange.calls.clear()
    assert rounds.send(groups) == others  # b is not sent: its round is still open
    assert {c[1] for c in exchange.calls} == set(others) and rounds.carry[b] == second
    for mid in others:
        rounds.in_flight[mid].units[0].sent.feedback_before["residual"] = torch.full((3,), float(len(mid)))
    assert fail(b) is True and rounds.completed_generation == 1  # chunk 1 complete, chunk 2's sends in flight
    before = rounds.residuals_before_send()
    assert set(before) == set(others) and all(float(before[m][0]) == len(m) for m in others)
    exchange.calls.clear()
    assert rounds.send(groups, only=[b]) == [b] and rounds.generation == 2  # once settled, on its own
    [(_, mid, round_, tokens)] = exchange.calls
    assert (mid, round_, tokens) == (b, 0, first + second)  # both chunks' steps: the failed round's and the carried
    assert [fail(m) for m in others] == [False] * len(others) and fail(b) is False  # chunk 2 still sending
    rounds.generation_sent()
    assert rounds.poll(block=False) is True and rounds.completed_generation == 2


def test_round_0_is_cut_into_slices_by_the_holders_in_the_claims_each_with_its_own_first_reducer(synthetic_docs):
    """Before any result names a list (round 0), the slices follow the genesis list (the holders in the claims), rotated
    per slice as a named list is: K slices with K different first candidates. With round 0 reduced by one node, that
    node sent every member the mean and served every member's check alone: the slowest round on home links."""
    import dataclasses

    from ..conftest import tiny_spec

    spec = tiny_spec(width=64, base_width=64)
    spec = spec.replace(averaging=dataclasses.replace(spec.averaging, slices=4))
    rounds, worker, exchange, _ = _rounds(spec, synthetic_docs)
    mid = "L0M0"
    assert worker.outer[mid].round == 0 and not worker.outer[mid].reducers
    genesis = ("me", "r1", "r2")
    _send(rounds, worker, _groups(worker, genesis))
    sent = [(order, unit) for order, unit, _, _ in exchange.calls if unit.startswith(mid + "[")]
    assert [unit for _, unit in sent] == ["L0M0[0/3]", "L0M0[1/3]", "L0M0[2/3]"]
    assert [order for order, _ in sent] == [["me", "r1", "r2"], ["r1", "r2", "me"], ["r2", "me", "r1"]]
    # a spec of one slice keeps round 0 whole, its order the genesis list itself
    rounds, worker, exchange, _ = _rounds(tiny_spec(width=64, base_width=64), synthetic_docs)
    _send(rounds, worker, _groups(worker, genesis))
    assert [(order, unit) for order, unit, _, _ in exchange.calls if unit.startswith(mid)] == [(list(genesis), mid)]


def test_a_slice_that_says_out_of_sync_is_where_our_state_is_checked(synthetic_docs):
    """A round in slices where the slices we reduced ourselves applied and another reducer's answered "out of sync":
    the check of our state goes to that reducer. It went to an applied slice's reducer, ourselves, and then nobody was
    asked: a holder alone on its side of a split logged "our own reducer disagrees with our state" for 7 rounds in a
    row (benchmarks/restarts.py --kill replying --debug)."""
    import torch

    from pathswarm.compression import encode

    rounds, worker, exchange = _sliced_round_sent(synthetic_docs)
    rounds.status.started_as("me")
    exchange.take_ahead = lambda mid: None
    mid = "L0M0"
    flights = rounds.in_flight[mid].units
    assert len(flights) == 3
    rounds.auditor.record = lambda *args, **kw: ""  # the checks pass
    for i, flight in enumerate(flights):
        if i == 1:
            flight.future.set_result(RoundResult(flight.unit.id, 0, "out_of_sync", reducer="r1",
                                                 reason="state before the round differs"))
        else:
            mean = torch.full((flight.unit.numel,), 1e-4)
            flight.future.set_result(RoundResult(flight.unit.id, 0, "merged", mean_frame=encode(mean), reducer="me",
                                                 contributors=["me"], frames=(("me", 1, "h"),)))
    rounds.poll(block=False)
    assert mid not in rounds.in_flight
    assert rounds.resyncs.checks() == [(mid, "r1")]


@pytest.mark.parametrize("status", ["merged", "late", "failed"])
def test_eager_moves_the_local_weights_at_the_send_and_the_settle_takes_the_move_back_out(spec, synthetic_docs,
                                                                                           status):
    """`[outer] eager` (node/train/round.py `eager_shift`): the send moves our local weights to the outer step of our
    own Δ; whatever the round's fate, its settle leaves only the steps trained since the send on top of the anchor
    it leaves (merged: the new one, from our weights as sent; late: the new one, from the old anchor, our Δ kept;
    failed: the old one, our weights as sent)."""
    import dataclasses

    import torch

    from pathswarm.compression import encode

    spec = spec.replace(outer=dataclasses.replace(spec.outer, eager=True, warmup_rounds=0))
    rounds, worker, _, _ = _rounds(spec, synthetic_docs)
    mid = worker.module_ids[0]
    before = worker.outer[mid]
    worker.train_inner(1)
    at_send = worker.flat(mid)
    rounds.send(_groups(worker))
    item = rounds.in_flight[mid]
    assert item.moved is not None and float(item.moved.abs().max()) > 0
    assert torch.allclose(worker.flat(mid), before.stepped(before.anchor - at_send, spec.outer).anchor, atol=1e-6)
    worker.train_inner(1)
    since = worker.flat(mid) - (at_send + item.moved)  # the steps trained since the send
    mean = 1e-3 * torch.randn(before.anchor.numel(), generator=torch.Generator().manual_seed(0))
    frame = b"" if status == "failed" else encode(mean)
    item.units[0].future.set_result(RoundResult(mid, 0, status, mean_frame=frame, contributors=["me", "r1"],
                                                reason="test"))
    rounds.poll(block=False)
    assert mid not in rounds.in_flight
    after = worker.outer[mid]
    if status == "failed":
        assert after is before and torch.allclose(worker.flat(mid), at_send + since, atol=1e-5)
        return
    assert after.round == 1 and not torch.equal(after.anchor, before.anchor)
    base = item.sent.merged_base if status == "merged" else before.anchor
    kept = at_send - base  # merged: what our frame did not carry (if anything); late: our whole Δ, kept
    assert torch.allclose(worker.flat(mid), after.anchor + kept + since, atol=1e-5)


@pytest.mark.parametrize("eager", [False, True])
def test_a_round_whose_state_a_resync_replaced_in_flight_is_not_applied_and_our_steps_carry(spec, synthetic_docs,
                                                                                          eager):
    """The split watch adopts the majority's version of a round while ours is in flight (node/peer/state_sync.py
    `_adopt`, our progress re-based on its anchor); the reply, a mean made against the state we sent from, is then
    not applied to the adopted one (it would leave our local weights off by the two versions' difference, which our
    next outer gradient would push into the swarm): the round fails for us and our steps carry."""
    import dataclasses

    import torch

    from pathswarm.compression import encode
    from pathswarm.protocol.rounds.outer import OuterState

    spec = spec.replace(outer=dataclasses.replace(spec.outer, eager=eager, warmup_rounds=0))
    rounds, worker, _, _ = _rounds(spec, synthetic_docs)
    mid = worker.module_ids[0]
    worker.train_inner(1)
    rounds.send(_groups(worker))
    item = rounds.in_flight[mid]
    tokens = item.sent.tokens
    worker.train_inner(1)
    old = worker.outer[mid]
    adopted = OuterState(old.anchor + 0.01, old.momentum, old.round)  # the other version of the same round
    local = worker.flat(mid)
    worker.outer[mid] = adopted
    worker.set_flat(mid, adopted.anchor + (local - old.anchor))
    moved = torch.zeros_like(local) if item.moved is None else item.moved
    assert (item.moved is not None) == eager
    mean = 1e-3 * torch.ones(old.anchor.numel())
    item.units[0].future.set_result(RoundResult(mid, 0, "merged", mean_frame=encode(mean), contributors=["me", "r1"]))
    rounds.poll(block=False)
    assert mid not in rounds.in_flight and worker.outer[mid] is adopted  # nothing applied
    assert torch.allclose(worker.flat(mid), adopted.anchor + (local - moved - old.anchor), atol=1e-6)
    assert rounds.carry[mid] == tokens and rounds.status.rounds_failed == 1


def test_in_a_sliced_round_only_the_slices_a_resync_changed_are_refused(synthetic_docs):
    """Two versions of a sliced round may differ in one slice only: after adopting the other version, the slices
    whose state is the one we sent from are applied as usual (their reducers' lineage is ours there), the changed
    one is not."""
    import torch

    from pathswarm.compression import encode
    from pathswarm.protocol.rounds.outer import OuterState

    rounds, worker, _ = _sliced_round_sent(synthetic_docs)
    mid = "L0M0"
    item = rounds.in_flight[mid]
    units = [f.unit for f in item.units]
    old = worker.outer[mid]
    changed = units[1]
    anchor = old.anchor.clone()
    anchor[changed.lo:changed.hi] += 0.01
    adopted = OuterState(anchor, old.momentum, old.round, old.reducers)  # the other version, one slice apart
    local = worker.flat(mid)
    worker.outer[mid] = adopted
    worker.set_flat(mid, adopted.anchor + (local - old.anchor))
    assert item.stale_units(adopted) == {changed.id} and item.stale_units(old) == set()
    for flight in item.units:
        mean = torch.full((flight.unit.numel,), 1e-4)
        flight.future.set_result(RoundResult(flight.unit.id, 0, "merged", mean_frame=encode(mean),
                                             contributors=["me", "r1", "r2"]))
    rounds.poll(block=False)
    after = worker.outer[mid]
    assert mid not in rounds.in_flight and after.round == 1
    for unit in units:
        part = slice(unit.lo, unit.hi)
        if unit is changed:  # not applied: the adopted version's slice, our steps on top
            assert torch.equal(after.anchor[part], adopted.anchor[part])
        else:
            assert not torch.equal(after.anchor[part], adopted.anchor[part])
