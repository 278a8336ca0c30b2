"""`swarm status` from hand-made DHT records: replica agreement compares every round's announcers."""

import pytest

from pathswarm.protocol.records import ModuleAnnouncement, NodeMetrics
from pathswarm.protocol.spec import SwarmSpec
from pathswarm.protocol.swarm_view import SwarmView, replica_agreement, summarize

SPEC = SwarmSpec(name="view", levels=(2, 2))
A, B, C, D = "QmPeerA", "QmPeerB", "QmPeerC", "QmPeerD"


def ann(module_id: str, round: int, digest: str, peer_id: str) -> ModuleAnnouncement:
    return ModuleAnnouncement(module_id=module_id, round=round, digest=digest, peer_id=peer_id, numel=10)


def modules_of(view: SwarmView) -> dict[str, dict]:
    return {m["module"]: m for m in summarize(SPEC, view)["modules"]}


def test_a_split_below_the_newest_round_is_seen():
    # A is at round 5; B and C are at round 4 with two versions of it. The old check looked at round 5 only
    # (one announcer, one digest) and said the replicas agree.
    view = SwarmView(modules={"shared": [ann("shared", 5, "e5", A), ann("shared", 4, "b4", B),
                                         ann("shared", 4, "c4", C)]})
    m = modules_of(view)["shared"]
    assert (m["round"], m["holders"], m["holders_at_round"]) == (5, 3, 1)
    assert m["replicas_agree"] is False and m["split_rounds"] == [4] and m["rounds_compared"] == 1
    assert m["split_digests"] == {"4": {"b4": [B], "c4": [C]}}


def test_a_split_at_the_newest_round_and_agreeing_rounds():
    anns = [ann("L0M0", 7, "aa", D), ann("L0M0", 7, "aa", A), ann("L0M0", 7, "bb", B), ann("L0M0", 6, "66", C),
            ann("L0M0", 6, "66", A)]
    assert replica_agreement(anns) == {"replicas_agree": False, "rounds_compared": 2, "split_rounds": [7],
                                       "split_digests": {"7": {"aa": [A, D], "bb": [B]}}}


def test_agreeing_lone_and_absent_modules():
    view = SwarmView(modules={
        "shared": [ann("shared", 3, "53", A), ann("shared", 3, "53", B), ann("shared", 2, "52", C),
                   ann("shared", 2, "52", D)],
        "L0M1": [ann("L0M1", 3, "0a", A), ann("L0M1", 2, "0b", B)],  # one announcer per round: nothing compared
    })
    ms = modules_of(view)
    assert (ms["shared"]["replicas_agree"], ms["shared"]["split_rounds"], ms["shared"]["rounds_compared"]) == (
        True, [], 2)
    assert ms["shared"]["split_digests"] == {}
    assert (ms["L0M1"]["replicas_agree"], ms["L0M1"]["split_rounds"], ms["L0M1"]["rounds_compared"]) == (None, [], 0)
    assert ms["L1M0"] == {"module": "L1M0", "round": None, "holders": 0, "holders_at_round": 0, "holder_ids": [],
                          "numel": 0, "group_sizes": [], "rounds_late": 0, "rounds_failed": 0,
                          "replicas_agree": None, "rounds_compared": 0, "split_rounds": [], "split_digests": {},
                          "behind": {}, "stalled": {}, "splits_healed": 0, "settle_rounds_max": 0}


def metrics(peer: str, path: tuple[int, ...], **kw) -> NodeMetrics:
    return NodeMetrics(path=path, peer_id=peer, round=3, loss=2.0, tokens_per_s=100.0, bytes_sent=1000,
                       bytes_received=900, **kw)


def test_group_sizes_missed_rounds_and_bytes_against_data_parallel():
    anns = {"shared": [ann("shared", 3, "5", A), ann("shared", 3, "5", B), ann("shared", 3, "5", C)],
            "L0M0": [ann("L0M0", 3, "a", A), ann("L0M0", 3, "a", B)], "L1M0": [ann("L1M0", 3, "c", A)],
            "L1M1": [ann("L1M1", 3, "d", B)]}
    # A peer announcing a 10^12-parameter module moves no figure: the median of the holders' sizes counts
    anns["shared"].append(ModuleAnnouncement(module_id="shared", round=3, digest="5", peer_id=D, numel=10**12))
    view = SwarmView(modules=anns, metrics=[
        metrics(A, (0, 0), inner_steps=40, tokens_trained=5000, groups=(("shared", 2, 2), ("L0M0", 2, 2),
                                                                         ("shared", 3, 3)),
                rounds_missed=(("shared", 1, 0),), reachable=True),
        metrics(B, (0, 1), inner_steps=20, tokens_trained=2500, groups=(("shared", 2, 1), ("shared", 3, 3)),
                rounds_missed=(("shared", 0, 2), ("L1M1", 1, 1)))])
    got = summarize(SPEC, view)
    ms = {m["module"]: m for m in got["modules"]}
    assert ms["shared"]["group_sizes"] == [[2, 2], [3, 3]] and ms["L0M0"]["group_sizes"] == [[2, 2]]
    assert (ms["shared"]["rounds_late"], ms["shared"]["rounds_failed"]) == (1, 2)
    assert (ms["L1M1"]["rounds_late"], ms["L1M1"]["rounds_failed"]) == (1, 1)
    assert ms["shared"]["numel"] == 10 and ms["shared"]["holder_ids"] == [A, B, C, D]
    t = got["totals"]
    # each path is 3 modules of 10 parameters; 2 nodes: a ring all-reduce sends 2(n-1)/n = 1 gradient per step
    assert t["ddp_fp32_bytes"] == 4 * 30 * 40 + 4 * 30 * 20 == 7200
    assert t["bytes_sent"] == 2000 and t["bytes_vs_ddp"] == 3.6 and t["tokens_trained"] == 7500
    assert (t["nodes_reporting"], t["nodes_reachable"], t["nodes_behind_nat"]) == (2, 1, 0)


def test_a_node_restarted_under_a_new_peer_id_is_counted_once():
    """Its counts continue (node/peer/counters.py) while its old record lives out its TTL: the total takes its latest
    count, not both; records that name no counters_id (an older version) count as before."""
    node = "0123456789abcdef" * 2
    view = SwarmView(metrics=[metrics(A, (0, 0), tokens_trained=5000, counters_id=node),  # before the kill
                              metrics(C, (0, 0), tokens_trained=6500, counters_id=node),  # its restart, continued
                              metrics(B, (0, 1), tokens_trained=2500), metrics(D, (1, 0), tokens_trained=100)])
    assert summarize(SPEC, view)["totals"]["tokens_trained"] == 6500 + 2500 + 100


def test_several_split_rounds_are_listed_in_order():
    anns = [ann("L1M1", r, f"{r}{p[-1].lower()}", p) for r, p in ((9, A), (9, B), (3, C), (3, D), (5, A))]
    got = replica_agreement(anns)
    assert got["split_rounds"] == [3, 9] and got["replicas_agree"] is False and got["rounds_compared"] == 2


def test_the_fullest_metrics_record_fits_the_dht_bound():
    # The biggest a node ever writes: full history, full group list, the longest module ids, a certificate
    from hivemind.utils.serializer import MSGPackSerializer

    from pathswarm.protocol.membership import MAX_CERT_BYTES
    from pathswarm.protocol.records import (
        MAX_COUNT,
        MAX_GROUPS,
        MAX_HISTORY,
        MAX_RECORD_BYTES,
        MAX_SPLITS,
        RecordError,
        _bounded_size,
        metrics_within_bound,
        parse_record,
        record_to_wire,
    )

    spec = SwarmSpec(name="big", levels=(64,) * 3)
    m = NodeMetrics(path=(63, 63, 63), peer_id="Q" * 52, round=MAX_COUNT, loss=1234.5678901, tokens_per_s=1e15 / 3,
                    bytes_sent=MAX_COUNT, bytes_received=MAX_COUNT, membership="c" * MAX_CERT_BYTES,
                    history=tuple((MAX_COUNT - i, 1000.0 / 3) for i in range(MAX_HISTORY)),
                    inner_steps=MAX_COUNT, tokens_trained=MAX_COUNT, counters_id="f" * 32,
                    groups=tuple(("L2M63", MAX_COUNT - i, 10**6) for i in range(MAX_GROUPS)),
                    rounds_missed=tuple((mid, MAX_COUNT, MAX_COUNT) for mid in ("shared", "L0M63", "L1M63", "L2M63")),
                    reachable=False)
    wire = record_to_wire(m)  # what a node stores: hivemind packs it with msgpack
    assert len(MSGPackSerializer.dumps(wire)) <= MAX_RECORD_BYTES and _bounded_size(wire, 1 << 20) <= MAX_RECORD_BYTES
    assert parse_record(NodeMetrics, wire, spec) == m
    # Every list full (healed splits and stalled modules too) does not fit: the node trims its oldest loss points
    # rather than have the store refused (protocol/dht.py `metrics_entry`).
    split = ("L2M63", MAX_COUNT, MAX_COUNT)
    fullest = m.model_copy(update={"splits_healed": MAX_COUNT, "splits": (split,) * MAX_SPLITS,
                                   "stalled": tuple((mid, MAX_COUNT) for mid in ("shared", "L0M63", "L1M63", "L2M63"))})
    with pytest.raises(RecordError):
        parse_record(NodeMetrics, record_to_wire(fullest), spec)
    fitted = metrics_within_bound(fullest)
    assert parse_record(NodeMetrics, record_to_wire(fitted), spec) == fitted
    assert fitted.history == fullest.history[-len(fitted.history):] and len(fitted.history) >= MAX_HISTORY // 2
    assert (fitted.splits, fitted.stalled, fitted.groups) == (fullest.splits, fullest.stalled, fullest.groups)
    assert metrics_within_bound(m) is m  # one that fits is left alone


def test_a_split_between_holders_at_different_rounds_is_seen_through_their_chains():
    """Issue 27: a holder that got the result of a round its reducer died replying to went on alone; the others
    were rounds behind, so no round had two announcers and `swarm status` said the replicas agree."""
    ahead = ModuleAnnouncement(module_id="shared", round=7, digest="a7", peer_id=A, numel=10,
                               chain=((5, "a5", ""), (6, "a6", "")))
    anns = [ahead, ann("shared", 5, "b5", B), ann("shared", 5, "b5", C)]
    m = modules_of(SwarmView(modules={"shared": anns}))["shared"]
    assert m["replicas_agree"] is False and m["split_rounds"] == [5]
    assert m["split_digests"] == {"5": {"a5": [A], "b5": [B, C]}}
    # the same chain on one version: they agree, and the holders two rounds behind are compared with it
    same = ModuleAnnouncement(module_id="shared", round=7, digest="a7", peer_id=A, numel=10,
                              chain=((5, "b5", ""), (6, "a6", "")))
    m = modules_of(SwarmView(modules={"shared": [same, *anns[1:]]}))["shared"]
    assert (m["replicas_agree"], m["split_rounds"], m["rounds_compared"]) == (True, [], 1)


def test_holders_left_behind_or_stalled_and_healed_splits_are_shown():
    anns = [ann("shared", 12, "aa", A), ann("shared", 11, "bb", B), ann("shared", 8, "cc", C)]
    view = SwarmView(modules={"shared": anns}, metrics=[
        metrics(A, (0, 0), splits_healed=2, splits=(("shared", 6, 2), ("L0M0", 4, 1))),
        metrics(C, (0, 1), stalled=(("shared", 5),), splits_healed=1, splits=(("shared", 6, 3),))])
    got = summarize(SPEC, view)
    m = {m["module"]: m for m in got["modules"]}["shared"]
    assert m["behind"] == {C: 4} and m["stalled"] == {C: 5}
    assert (m["splits_healed"], m["settle_rounds_max"]) == (2, 3)
    assert got["totals"]["splits_healed"] == 3 and got["totals"]["holders_left_behind"] == 1


def test_swarm_status_names_the_holders_left_behind():
    from pathswarm.node.app.cli_swarm_view import left_behind

    assert left_behind({"behind": {}, "stalled": {}}) == "-"
    row = left_behind({"behind": {"QmPeerC": 4}, "stalled": {"QmPeerC": 5, "QmPeerD": 3}})
    assert row == "QmPeerC 4 behind, QmPeerC stalled 5, QmPeerD stalled 3"  # the last 8 characters of each id
