"""Split detection (node/peer/splits.py) and the reducer candidates (protocol/rounds/reducers.py), by value."""

import pytest

from pathswarm.node.peer.splits import AheadWait, SplitWatch, first_lost_round, split_verdict
from pathswarm.node.peer.vouch import Announced as A
from pathswarm.protocol.rounds.reducers import (
    Stance,
    candidates,
    earlier,
    genesis_candidates,
    parse_candidates,
    successors,
)


def test_no_split_when_every_holder_at_our_round_has_our_digest():
    anns = [A("b", 5, "d1"), A("c", 5, "d1"), A("d", 4, "d0")]  # d is a round behind: not compared
    assert split_verdict("shared", 5, "d1", "a", anns) is None


def test_the_version_more_holders_announce_wins_and_only_the_losers_heal():
    anns = [A("b", 5, "dB"), A("c", 5, "dB"), A("d", 5, "dA")]
    heal = split_verdict("shared", 5, "dA", "a", anns)  # a and d hold dA (2), b and c hold dB (2): a tie
    assert heal is None  # a tie: the smaller digest (dA, ours) wins
    heal = split_verdict("shared", 5, "dZ", "a", anns)  # alone with dZ against two holders of dB
    assert (heal.module, heal.round, heal.peer, heal.winner, heal.ours) == ("shared", 5, "b", "dB", "dZ")
    assert split_verdict("shared", 5, "dB", "b", anns + [A("a", 5, "dZ")]) is None  # the winner stays


def test_ids_we_do_not_count_decide_no_split():
    """Sybils (ids that never merged with us, nor claim our path) announcing a forged digest at our round used to win
    the split by numbers and make us re-sync from them."""
    sybils = [A(f"evil{i}", 5, "forged") for i in range(10)]
    honest = [A("b", 5, "dA"), A("c", 5, "dA")]
    assert split_verdict("shared", 5, "dA", "a", honest + sybils) is not None  # counting everyone: forged wins
    assert split_verdict("shared", 5, "dA", "a", honest + sybils, counted={"b", "c"}) is None
    heal = split_verdict("shared", 5, "dZ", "a", honest + sybils, counted={"b", "c"})  # a real split still heals
    assert heal is not None and heal.winner == "dA" and heal.peer == "b"


def test_a_tie_is_broken_the_same_way_on_both_sides():
    left = split_verdict("m", 3, "d1", "a", [A("b", 3, "d2")])
    right = split_verdict("m", 3, "d2", "b", [A("a", 3, "d1")])
    assert left is None and right is not None and right.winner == "d1" and right.peer == "a"


def test_live_claimants_break_a_tie_of_the_holders_we_count():
    """A lone holder (`b`, alone since its reducer died replying) counts only `a`, the peer it merged with; the other
    side is `a` and `c`, a holder restarted under a new identity that `b` never merged with. 1 against 1, the smaller
    digest (b's) won, and `b` stayed split while `a` and `c` (2 against 1) kept theirs: heals of 4 and 5 rounds in
    benchmarks/restarts.py --kill replying. The live claimants decide the tie; the heal downloads from `a`."""
    anns = [A("a", 7, "d2", chain=((6, "c6", ""),)), A("c", 7, "d2")]
    assert split_verdict("m", 7, "d1", "b", anns, counted={"a"}) is None  # the tie: the smaller digest, ours
    heal = split_verdict("m", 7, "d1", "b", anns, counted={"a"}, claimants={"a", "c"})
    assert heal is not None and (heal.round, heal.winner, heal.peer) == (7, "d2", "a")
    # the other side counts both others: 2 against 1, it keeps its version, with or without the claimants
    assert split_verdict("m", 7, "d2", "a", anns + [A("b", 7, "d1")], counted={"b", "c"}, claimants={"b", "c"}) is None
    # a claimant's own version, held by no counted holder, weighs nothing; nor does it decide what is not a tie
    sybils = [A(f"s{i}", 7, "d0") for i in range(5)]
    assert split_verdict("m", 7, "d1", "b", [anns[0], *sybils], counted={"a"},
                         claimants={"a", *(x.peer for x in sybils)}) is None
    # only the tied versions take weight: d1 (b, e) and d2 (a, c) tie at 2; five claimants behind d3 (f's) change
    # nothing, where weighing every version made d3 win with 1 + 5
    tie3 = [A("e", 7, "d1"), A("a", 7, "d2"), A("c", 7, "d2"), A("f", 7, "d3")]
    backers = [A(f"s{i}", 7, "d3") for i in range(5)]
    heal = split_verdict("m", 7, "d1", "b", tie3 + backers, counted={"a", "c", "e", "f"},
                         claimants={"a", "c", "e", "f", *(x.peer for x in backers)})
    assert heal is None  # the tie of d1 and d2 stands: the smaller digest, ours
    more = [A("a", 7, "d1"), A("e", 7, "d1"), A("f", 7, "d2")]  # counted: d1 (b, a, e) 3 against d2 (f) 1
    backers = [A(f"s{i}", 7, "d2") for i in range(5)]
    assert split_verdict("m", 7, "d1", "b", more + backers, counted={"a", "e", "f"},
                         claimants={"a", "e", "f", *(x.peer for x in backers)}) is None


def test_each_split_round_is_healed_once():
    watch = SplitWatch()
    heal = split_verdict("m", 3, "d2", "b", [A("a", 3, "d1")])
    watch.observe(heal)
    watch.observe(heal)
    assert watch.take() == [heal] and watch.take() == []


def test_a_replaced_state_loses_our_rounds_from_the_first_the_adopted_version_does_not_hold():
    ours = {3: "a3", 4: "a4", 5: "b5", 6: "b6"}
    assert first_lost_round(ours, {3: "a3", 4: "a4", 5: "a5", 6: "a6", 7: "a7"}, 7) == 5  # a split at 5
    assert first_lost_round(ours, {5: "b5", 6: "b6", 7: "b7", 8: "b8"}, 8) == 9  # behind on our own version
    assert first_lost_round(ours, {3: "a3", 4: "a4"}, 4) == 5  # ahead alone: back to 4
    assert first_lost_round(ours, {9: "x9"}, 9) == 10  # no state in common: what we held is taken as theirs


def test_the_next_rounds_candidates_are_its_reducer_then_its_contributors():
    assert successors("r", ["c", "a", "r", "b"]) == ("r", "a", "b", "c")
    assert genesis_candidates(["z", "a", "m"], seasoned=["m"]) == ("m", "a", "z")
    assert candidates(("r", "a"), ["a", "n", "r", "b"], skip=["r"]) == ["a", "b", "n", "r"]
    assert earlier(("r", "a", "b"), "b") == ["r", "a"] and earlier(("r", "a"), "x") == ["r", "a"]
    assert earlier(("r", "a"), "r") == []
    assert {s.value for s in Stance} == {"open", "closed", "ahead", "not_here"}


@pytest.mark.parametrize("bad", ["Qm", ["x" * 200], [1], ["a b"], ["Qm"] * 65])
def test_candidate_lists_from_peers_are_bounded_peer_ids(bad):
    with pytest.raises(ValueError):
        parse_candidates(bad)
    assert parse_candidates(["QmA", "QmB"]) == ("QmA", "QmB")


def test_announcements_with_their_reducer_list_digest_are_read_as_well():
    # What StateSync.announced hands the split watch: `Announced` (peer, round, digest, reducer list digest), read by
    # name. A split watch that unpacked three fields of a plain tuple raised on every check ("too many values to
    # unpack") and healed nothing (a suite run).
    anns = [A("b", 5, "dB", "l1"), A("c", 5, "dB", "l1"), A("d", 4, "dA", "l0")]
    heal = split_verdict("shared", 5, "dZ", "a", anns)
    assert (heal.peer, heal.winner, heal.ours) == ("b", "dB", "dZ")


def test_a_split_shows_at_any_round_two_chains_share():
    """Issue 27: a holder that got the result of a round whose reducer died replying went on; the others reduced
    that round again without it. Their current rounds differ, so the old check (our round only) saw nothing."""
    from pathswarm.node.peer.splits import split_verdict

    ahead = A("b", 7, "b7", "", ((5, "b5", ""), (6, "b6", "")))  # b's version of round 5, two rounds on
    group = [ahead, A("c", 5, "c5"), A("d", 5, "c5")]
    heal = split_verdict("m", 6, "b6", "b", [A("c", 5, "c5"), A("d", 5, "c5")], my_chain=((5, "b5"),))
    assert (heal.round, heal.winner, heal.ours, heal.peer, heal.at) == (5, "c5", "b5", "c", (6, "b6"))
    # the winners see the same split and stay; a holder behind the split round compares nothing
    assert split_verdict("m", 5, "c5", "c", group) is None
    assert split_verdict("m", 4, "c4", "e", group) is None
    # a peer's chain at our round with our digest is agreement, whatever round it is at now
    assert split_verdict("m", 5, "b5", "x", [ahead]) is None


def test_a_minority_ahead_goes_back_to_the_majoritys_older_state():
    """The reducer of round r replied to b only and died; restarted, it and c hold round r and vouch for no later
    state, and b's answers ("out of sync") kept them off round r for the rest of a run."""
    from pathswarm.node.peer.splits import ahead_alone

    others = [A("a", 5, "d5", "l5"), A("c", 5, "d5", "l5")]
    back = ahead_alone(6, "b6", "b", others, {"a", "c"})
    assert (back.round, back.digest, back.peers, back.reducers) == (5, "d5", ("a", "c"), "l5")
    # one other holder: a tie (it adopts ours instead); someone vouching for our state: we are not alone
    assert ahead_alone(6, "b6", "b", others[:1], {"a"}) is None
    assert ahead_alone(6, "b6", "b", [*others, A("e", 7, "e7", "", ((6, "b6", ""),))], {"a", "c", "e"}) is None
    # a majority ahead of us, or at our round: not for this rule (vouching, the split verdict)
    assert ahead_alone(4, "b4", "b", others, {"a", "c"}) is None
    assert ahead_alone(5, "b5", "b", others, {"a", "c"}) is None
    # uncounted ids decide nothing
    assert ahead_alone(6, "b6", "b", [A("x", 5, "f5"), A("y", 5, "f5")], {"a", "c"}) is None
    # we merged a and c's frames of round 5 in the round that made our state 6 (they held state 5, as announced):
    # still ahead alone. Had we merged their frames sent from state 6 (recorded under state round 7), their
    # announcements of state 5 are stale (a lagging DHT), and we are not alone.
    assert ahead_alone(6, "b6", "b", others, {"a", "c"}, {"6": ["a", "b", "c"]}) == back
    assert ahead_alone(7, "b7", "b", others, {"a", "c"}, {"6": ["a", "b", "c"], "7": ["a", "b", "c"]}) is None
    three = [*others, A("d", 5, "d5", "l5")]
    # one of three stale: two fresh vouchers of three announcers are still a majority; two stale: not
    assert ahead_alone(7, "b7", "b", three, {"a", "c", "d"}, {"7": ["b", "c"]}).digest == "d5"
    assert ahead_alone(7, "b7", "b", three, {"a", "c", "d"}, {"7": ["a", "b", "c"]}) is None


def test_a_node_ahead_alone_goes_back_after_the_patience_though_it_reduces_a_round_alone_every_2_s():
    """The wait is keyed on the majority's state: keyed on ours too, it restarted with each round the node reduced
    alone and never ended (benchmarks/restarts.py --kill replying)."""
    from pathswarm.node.peer.splits import ahead_alone

    wait, others = AheadWait(6.0), [A("a", 33, "d33"), A("c", 33, "d33")]
    due = [wait.due("shared", ahead_alone(34 + t // 2, f"b{t}", "b", others, {"a", "c"}), float(t))
           for t in range(0, 10, 2)]
    assert due == [False, False, False, True, True]  # 6 s after the first look, our rounds 34..38 notwithstanding
    # the majority moving on (a group a moment behind us) starts the wait anew; not being ahead alone ends it
    assert not wait.due("shared", ahead_alone(40, "b40", "b", [A("a", 34, "d34"), A("c", 34, "d34")], {"a", "c"}), 9.0)
    assert not wait.due("shared", None, 20.0) and not wait.due("shared", ahead_alone(40, "b", "b", others, {"a", "c"}),
                                                               21.0)
    assert wait.due("shared", ahead_alone(41, "b", "b", others, {"a", "c"}), 27.0)


def test_a_heal_is_keyed_by_our_state_so_a_failed_one_is_tried_again_once_it_moved():
    from pathswarm.node.peer.splits import Heal

    watch = SplitWatch()
    first = Heal("m", 5, "c", "c5", "b5", (6, "b6"))
    watch.observe(first)
    watch.observe(first)
    watch.observe(Heal("m", 5, "c", "c5", "b5", (7, "b7")))  # our state moved (the download had failed)
    assert [h.at for h in watch.take()] == [(6, "b6"), (7, "b7")]
