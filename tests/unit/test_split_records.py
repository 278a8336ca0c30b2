"""What a node records and publishes about splits (issue 27, item 5): the chain of states its announcements name, the
work a healed split discards (every module's), the heals and the modules stalled in its metrics, and the re-sync
that counts a heal only once its download is in."""

import pytest

from pathswarm.node.peer.announce import StallWatch, announced_chain
from pathswarm.node.peer.node_status import NodeStatus
from pathswarm.node.peer.resyncs import Resyncs
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


def test_a_heals_download_calls_its_callback_once_and_another_request_drops_it():
    calls = []
    rs = Resyncs()
    rs.request_from("m", "p", then=lambda: calls.append("heal"))
    [r] = rs.take()
    for then in r.then:
        then()
    assert calls == ["heal"] and rs.take() == []
    rs.request_from("m", "p", then=lambda: calls.append("stale"))
    rs.request_from("m", "q")  # another download of the module now: not the heal's
    assert [r.then for r in rs.take()] == [()]


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
