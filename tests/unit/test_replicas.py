"""The replica check over status files: one digest per (module, round) across every node, whatever its group."""

from pathswarm.node.app.local_swarm import replica_mismatches as reexported
from pathswarm.node.app.replicas import Split, Version, check_replicas, replica_mismatches, replicas_identical

A, B, C, D = "QmPeerAAAAAAAAaaaaaaaa", "QmPeerBBBBBBBBbbbbbbbb", "QmPeerCCCCCCCCcccccccc", "QmPeerDDDDDDDDdddddddd"


def status(peer: str, history: dict, groups: dict | None = None) -> dict:
    return {"peer_id": peer, "history": history, "groups": groups or {}}


def split_round_statuses() -> dict[str, dict]:
    """Round 2 of "shared" was merged twice: reducer A closed it with {A, B}, reducer C with {C, D}."""
    before = {"1": "d1"}
    g1 = [A, B, C, D]
    return {
        "a": status(A, {"shared": {**before, "2": "aa"}}, {"shared": {"1": g1, "2": [B, A]}}),
        "b": status(B, {"shared": {**before, "2": "aa"}}, {"shared": {"1": g1, "2": [A, B]}}),
        "c": status(C, {"shared": {**before, "2": "cc"}}, {"shared": {"1": g1, "2": [C, D]}}),
        "d": status(D, {"shared": {**before, "2": "cc"}}, {"shared": {"1": g1, "2": [D, C]}}),
    }


def old_check(statuses: list[dict]) -> list:
    """What `replica_mismatches` did before issue 15: compare digests only between nodes of the same group."""
    seen, bad = {}, []
    for st in statuses:
        for mid, rounds in st["history"].items():
            for r, digest in rounds.items():
                key = (mid, r, tuple(sorted(st["groups"].get(mid, {}).get(r, []))))
                if seen.setdefault(key, digest) != digest:
                    bad.append(key)
    return bad


def test_a_split_with_different_groups_is_reported_the_old_check_saw_nothing():
    statuses = split_round_statuses()
    assert old_check(list(statuses.values())) == []  # each version's nodes agree among themselves
    check = check_replicas(statuses)
    assert not check.identical and check.split_rounds == 1
    assert check.splits == (Split("shared", "2", (
        Version("aa", ("a", "b"), ((A, B), (A, B))),
        Version("cc", ("c", "d"), ((C, D), (C, D))))),)
    assert check.digests_compared == 8 and check.rounds_compared == 2
    assert check.nodes == ("a", "b", "c", "d")
    line = str(check.splits[0])
    assert line.startswith("shared round 2 in 2 versions: aa on a, b (group [")
    assert "cc on c, d" in line and C[-8:] in line and D[-8:] in line


def test_the_list_form_names_nodes_by_peer_id_and_keeps_the_old_signatures():
    statuses = list(split_round_statuses().values())
    mismatches, compared = replica_mismatches(statuses)
    assert compared == 8 and len(mismatches) == 1
    assert f"aa on {A[-8:]}, {B[-8:]}" in mismatches[0] and f"cc on {C[-8:]}, {D[-8:]}" in mismatches[0]
    assert replicas_identical(statuses) == (False, 8)
    assert reexported is replica_mismatches


def test_agreeing_nodes_pass_with_exact_counts():
    statuses = [
        status(A, {"shared": {"1": "x1", "2": "x2"}, "L0M0": {"1": "y1"}}),
        status(B, {"shared": {"1": "x1", "2": "x2"}, "L0M0": {"1": "y1"}}),
        status(C, {"shared": {"1": "x1", "2": "x2"}, "L1M0": {"1": "z1"}}),  # L1M0: C alone, nothing to compare
    ]
    check = check_replicas(statuses)
    assert check.identical and check.split_rounds == 0 and check.splits == ()
    assert (check.rounds_compared, check.digests_compared) == (3, 3 + 3 + 2)
    assert replicas_identical(statuses) == (True, 8)
    assert replica_mismatches(statuses) == ([], 8)


def test_a_node_without_an_entry_for_a_round_is_not_a_mismatch():
    statuses = {
        "early": status(A, {"shared": {"1": "x1", "2": "x2", "3": "x3"}}),
        "joiner": status(B, {"shared": {"3": "x3"}}),  # joined at round 3 (or rounds 1–2 failed for it)
        "gap": status(C, {"shared": {"1": "x1", "3": "x3"}}),  # round 2 failed for it: re-synced, not recorded
    }
    check = check_replicas(statuses)
    assert check.identical
    assert (check.rounds_compared, check.digests_compared) == (2, 2 + 3)  # round 2: A only, not compared


def test_round_keys_and_split_order_and_missing_statuses():
    statuses = [
        status(A, {"L0M0": {"10": "p"}, "shared": {"2": "s"}}),
        None,
        {},
        status(B, {"L0M0": {10: "q"}, "shared": {2: "t"}}, {"L0M0": {10: [B]}}),  # int keys: the same rounds
        status(C, {"L0M0": {"9": "r", "10": "p"}}),
        status(D, {"L0M0": {"9": "u"}}),
    ]
    check = check_replicas(statuses)
    assert [(s.module, s.round) for s in check.splits] == [("L0M0", "9"), ("L0M0", "10"), ("shared", "2")]
    assert check.split_rounds == 3 and check.rounds_compared == 3 and check.digests_compared == 3 + 2 + 2
    assert check.splits[1].versions == (Version("p", (A[-8:], C[-8:]), ((), ())), Version("q", (B[-8:],), ((B,),)))
    assert len(check.nodes) == 4


def test_three_versions_of_one_round():
    statuses = [status(p, {"shared": {"5": d}}) for p, d in ((A, "a"), (B, "b"), (C, "c"), (D, "a"))]
    (split,) = check_replicas(statuses).splits
    assert [v.digest for v in split.versions] == ["a", "b", "c"] and split.versions[0].nodes == (A[-8:], D[-8:])
    assert str(split).startswith("shared round 5 in 3 versions:")


def test_the_demo_and_chaos_reports_count_split_rounds():
    from pathswarm.node.app.demo import summarize
    from pathswarm.protocol.spec import SwarmSpec

    statuses = split_round_statuses()
    for st in statuses.values():
        st.update(path="0.0", val_loss_before=2.0, val_loss_after=1.5, digests={"shared": "x"}, inner_step=8,
                  bytes_sent=100, bytes_received=100, round=2, loss_curve=[2.0, 1.5], rounds_failed=0,
                  tokens_trained=1000)
    summary = summarize(SwarmSpec(name="demo"), statuses)
    assert (summary["replicas_identical"], summary["split_rounds"], summary["replica_digests_compared"]) == (
        False, 1, 8)
    assert summary["splits"][0].startswith("shared round 2 in 2 versions: aa on a, b")
    # chaos: node names zipped with final statuses, a node that left no status skipped
    finals = dict(zip(["n0", "n1", "n2"], [statuses["a"], {}, statuses["c"]], strict=True))
    check = check_replicas(finals)
    assert (check.split_rounds, check.digests_compared, check.nodes) == (1, 4, ("n0", "n2"))
