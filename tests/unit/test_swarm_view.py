"""`swarm status` from hand-made DHT records: replica agreement compares every round's announcers."""

from pathswarm.protocol.records import ModuleAnnouncement
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
    assert ms["L1M0"] == {"module": "L1M0", "round": None, "holders": 0, "holders_at_round": 0,
                          "replicas_agree": None, "rounds_compared": 0, "split_rounds": [], "split_digests": {}}


def test_several_split_rounds_are_listed_in_order():
    anns = [ann("L1M1", r, f"{r}{p[-1].lower()}", p) for r, p in ((9, A), (9, B), (3, C), (3, D), (5, A))]
    got = replica_agreement(anns)
    assert got["split_rounds"] == [3, 9] and got["replicas_agree"] is False and got["rounds_compared"] == 2
