"""What a node records and publishes about splits (issue 27, item 5): the chain of states its announcements name, the
work a re-sync discards when it replaces rounds of ours (every module's, whoever asked for it), the heals and the
modules stalled in its metrics."""

import asyncio
from types import SimpleNamespace

import pytest

from pathswarm.node.peer.announce import StallWatch, announced_chain
from pathswarm.node.peer.node_status import NodeStatus
from pathswarm.node.peer.resyncs import Resyncs
from pathswarm.node.peer.splits import Heal, Splits
from pathswarm.node.peer.vouch import Vouched
from pathswarm.protocol.records import (
    MAX_CHAIN,
    MAX_RECORD_BYTES,
    MAX_SPLITS,
    ModuleAnnouncement,
    NodeMetrics,
    RecordError,
    parse_record,
    record_to_json,
    record_to_wire,
)

D = "ab" * 32


def test_the_chain_follows_rounds_applied_and_starts_afresh_after_a_download():
    st = NodeStatus()
    for r in range(3, 10):
        st.chain_moved("m", r, f"d{r}", "l")
    assert [c[0] for c in st.chains["m"]] == [5, 6, 7, 8, 9]  # the current state and MAX_CHAIN before it
    assert announced_chain(st.chains["m"], 9, "d9") == tuple((r, f"d{r}", "l") for r in (5, 6, 7, 8))
    assert announced_chain(st.chains["m"], 9, "other") == ()  # a chain that does not end at the announced state
    st.chain_restarted("m")  # a re-sync to round 10: we know no state it was reached from
    st.chain_moved("m", 10, "x10", "l")
    assert st.chains["m"] == [[10, "x10", "l"]] and announced_chain(st.chains["m"], 10, "x10") == ()
    st.chain_moved("m", 8, "y8", "l")  # a heal back to an older round: no predecessor either
    assert st.chains["m"] == [[8, "y8", "l"]]


def test_a_healed_split_is_discarded_for_every_module_and_recorded():
    st = NodeStatus()
    st.round_settled("shared", 100, 0)
    st.split_healed("L0M0", 40, 20)  # the shared totals count the shared module only, as before
    st.split_settled("L0M0", 9, 2, 40, 20)
    st.split_healed("shared", 30, 0)
    st.split_settled("shared", 9, 1, 30, 0)
    assert (st.tokens_merged, st.tokens_discarded, st.splits_healed) == (70, 30, 2)
    assert st.split_discarded == {"L0M0": [40, 20, 2], "shared": [30, 0, 1]}
    assert st.heals == [["L0M0", 9, 2], ["shared", 9, 1]]
    for i in range(20):
        st.split_settled("shared", 10 + i, 1, 0, 0)
    assert len(st.heals) == MAX_SPLITS and st.heals[-1] == ["shared", 29, 1]


def test_a_module_that_merges_none_of_our_rounds_is_counted_stalled_round_after_round():
    watch = StallWatch()
    assert watch.note("m", 5, "d5", ours=True) == 0
    assert [watch.note("m", 5, "d5", ours=True) for _ in range(3)] == [1, 2, 3]  # refused, out of sync: no move
    assert watch.note("m", 6, "d6", ours=False) == 4  # a round applied late, a re-sync: moved, but not by us
    assert watch.note("m", 7, "d7", ours=True) == 0 and watch.note("n", 1, "x", ours=False) == 1


class _Exchange:
    def __init__(self, reduced: int):
        self.reduced, self.asked = reduced, []
        self.distrusted: dict[str, str] = {}

    async def take_back_reduced(self, module: str, first_round: int) -> int:
        self.asked.append((module, first_round))
        return self.reduced


class _Net:
    def run(self, coro, timeout):
        return asyncio.run(coro)


def _splits(merged: dict[int, int], diverged=()) -> tuple[Splits, NodeStatus, _Exchange]:
    status, exchange = NodeStatus(), _Exchange(reduced=30)
    status.round_settled("shared", sum(merged.values()), 0)
    sync = SimpleNamespace(spec=SimpleNamespace(averaging=SimpleNamespace(grace_s=1.0)), net=_Net(),
                           local_states={})
    rounds = SimpleNamespace(merged_log={"shared": dict(merged)}, diverged_log={"shared": set(diverged)},
                             resyncs=Resyncs())
    return Splits(SimpleNamespace(), sync, rounds, exchange, status, lambda mid: []), status, exchange


def test_any_re_sync_that_replaces_rounds_of_ours_counts_them_discarded_and_records_the_heal():
    # Our reducer said "out of sync" after a split at state round 9; the split watch had not asked for this re-sync.
    splits, st, exchange = _splits({8: 70, 9: 100, 10: 50})
    ours = (10, {8: "a8", 9: "b9", 10: "b10"})
    splits.replaced("shared", ours, Vouched(11, "a11", ("p",), history=((9, "a9"), (10, "a10"), (11, "a11"))))
    assert (st.tokens_merged, st.tokens_discarded, st.tokens_reduced_discarded) == (70, 150, 30)
    assert st.split_discarded == {"shared": [150, 30, 2]} and st.heals == [["shared", 9, 2]]
    assert splits.rounds.merged_log["shared"] == {8: 70} and exchange.asked == [("shared", 9)]
    splits.replaced("shared", ours, Vouched(11, "a11", ("p",), history=((9, "a9"),)))  # counted once, not twice
    assert st.tokens_discarded == 150 and st.split_discarded["shared"][0] == 150


def test_a_re_sync_on_our_own_version_or_after_our_replica_alone_diverged_discards_nothing():
    splits, st, exchange = _splits({9: 100, 10: 50})
    splits.replaced("shared", (10, {9: "a9", 10: "a10"}), Vouched(12, "a12", ("p",), ((10, "a10"), (11, "a11"))))
    # our digest of round 10 was not the group's, but the reducer merged our tokens into the group's round 10
    diverged, st2, _ = _splits({9: 100, 10: 50}, diverged={10})
    diverged.replaced("shared", (10, {9: "a9", 10: "x10"}), Vouched(10, "a10", ("p",), ((9, "a9"), (10, "a10"))))
    for s, status in ((splits, st), (diverged, st2)):
        assert (status.tokens_merged, status.tokens_discarded, status.heals) == (150, 0, [])
        assert s.rounds.merged_log["shared"] == {9: 100, 10: 50}
    assert exchange.asked == []


def test_a_heals_verdict_names_the_first_lost_round_when_the_download_brings_no_history():
    splits, st, _ = _splits({9: 100, 10: 50})
    splits._found["shared"] = Heal("shared", 9, "p", "a9", "b9", at=(10, "b10"))
    splits.replaced("shared", (10, {9: "b9", 10: "b10"}), Vouched(10, "a10", ("p",)))
    assert st.heals == [["shared", 9, 2]] and st.tokens_discarded == 150 and splits._found == {}
    # a verdict about a state we no longer hold says nothing about this download
    splits, st, _ = _splits({9: 100, 10: 50})
    splits._found["shared"] = Heal("shared", 9, "p", "a9", "b9", at=(10, "old"))
    splits.replaced("shared", (10, {9: "b9", 10: "b10"}), Vouched(10, "a10", ("p",)))
    assert st.heals == [["shared", 10, 1]] and st.tokens_discarded == 50


def test_announcements_name_their_chain_and_metrics_their_heals_within_the_record_bounds():
    chain = tuple((r, D, D) for r in range(10, 10 + MAX_CHAIN))
    ann = ModuleAnnouncement(module_id="shared", round=20, digest=D, peer_id="Qm" + "a" * 44, numel=10,
                             reducers_digest=D, distrusts=("Qm" + "b" * 44,) * 8, chain=chain)
    assert parse_record(ModuleAnnouncement, record_to_wire(ann)) == ann
    assert len(record_to_json(ann)) < MAX_RECORD_BYTES // 2
    for bad in ([[20, D, ""]], [[12, D, ""], [11, D, ""]], [[r, D, ""] for r in range(MAX_CHAIN + 1)]):
        with pytest.raises(RecordError):
            parse_record(ModuleAnnouncement, {**record_to_wire(ann), "chain": bad})
    metrics = NodeMetrics(path=(0, 1), peer_id="Qm" + "a" * 44, round=3, loss=1.0, tokens_per_s=1.0, bytes_sent=1,
                          bytes_received=1, splits_healed=3,
                          splits=tuple(("L12M1234567", 2**40, 3) for _ in range(MAX_SPLITS)),
                          stalled=(("shared", 7), ("L0M0", 4)))
    assert parse_record(NodeMetrics, record_to_wire(metrics)) == metrics
    with pytest.raises(RecordError):
        parse_record(NodeMetrics, {**record_to_wire(metrics), "splits": [["shared", 1, 1]] * (MAX_SPLITS + 1)})


def test_a_verdict_for_a_version_held_by_a_peer_caught_lying_meanwhile_is_not_healed_to():
    """The split watch looks on the chores thread; a liar caught after its look counted it (its lied state against
    ours, one holder each, its digest the smaller) must not be adopted when the training thread heals
    (benchmarks/hostile.py `late-liar-huge`: an honest node trained a round on the lied state)."""
    from pathswarm.node.peer.splits import Heal

    splits, _, exchange = _splits({7: 10})
    mine = SimpleNamespace(round=7, digest=lambda: "a122")
    splits.sync.local_states["shared"] = mine
    exchange.distrusted["liar"] = "its mean of shared round 6 is not what its frames give"
    # the look's verdicts go through the watch, as on the chores thread
    splits.watch.observe(Heal("shared", 7, "liar", "8c5c", "a122", (7, "a122"), counted=frozenset({"liar"})))
    splits.heal_found()
    assert splits.rounds.resyncs.take() == [] and splits._found == {}
    # an honest holder's word, decided with the liar counted: dropped too (the liar may have tipped it)
    splits.watch.observe(Heal("shared", 7, "b", "8c5c", "a122", (7, "a122"), counted=frozenset({"b", "liar"})))
    splits.heal_found()
    assert splits.rounds.resyncs.take() == []
    # the next look, without the liar, finds the same split for the same state of ours: taken this time
    splits.watch.observe(Heal("shared", 7, "b", "8c5c", "a122", (7, "a122"), counted=frozenset({"b", "c"})))
    splits.heal_found()
    assert [r.peer for r in splits.rounds.resyncs.take()] == ["b"]
