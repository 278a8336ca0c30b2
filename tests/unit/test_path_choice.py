"""Path choice: exact choices on hand-made swarms, and properties over random claim sets."""

import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pathswarm.protocol.path_choice import (
    CLAIM_CAP_FACTOR,
    MIN_CLAIM_TOKENS_PER_S,
    choose_path,
    path_service,
    rank_paths,
    tie_break,
)
from pathswarm.protocol.records import PathClaim
from pathswarm.protocol.spec import SwarmSpec

SPEC = SwarmSpec(name="path-choice", levels=(2, 2))
NOW = 1000.0
ME = "QmMe"


def claim(path, tokens_per_s=100.0, peer="QmOther", expires_at=NOW + 30):
    return PathClaim(path=path, peer_id=peer, tokens_per_s=tokens_per_s, round=0, expires_at=expires_at)


def claims_on(*paths, tokens_per_s=100.0):
    return [claim(p, tokens_per_s, peer=f"QmPeer{i}") for i, p in enumerate(paths)]


def test_takes_the_only_unserved_path():
    claims = claims_on((0, 0), (0, 1), (1, 1))
    assert choose_path(SPEC, claims, 50.0, ME, NOW) == (1, 0)


def test_service_is_throughput_weighted_not_a_head_count():
    # (0, 0): one fast node, 1000 tok/s; (0, 1): three slow ones, 30 tok/s in all; the rest 500 each.
    claims = [claim((0, 0), 1000.0, "QmFast")] + claims_on((0, 1), (0, 1), (0, 1), tokens_per_s=10.0)
    claims += [claim((1, 0), 500.0, "QmB"), claim((1, 1), 500.0, "QmC")]
    assert choose_path(SPEC, claims, 50.0, ME, NOW) == (0, 1)


def test_a_stranger_reporting_a_huge_throughput_weighs_as_two_typical_nodes():
    """docs/SECURITY.md, "claimer": throughput is self-reported (1e15 was accepted and made a path look served by
    the whole swarm). Credited at most CLAIM_CAP_FACTOR x the median of the live claims."""
    honest = [claim((0, 1), 100.0, "QmA"), claim((1, 0), 100.0, "QmB"), claim((1, 1), 100.0, "QmC"),
              claim((0, 1), 100.0, "QmD"), claim((1, 0), 100.0, "QmE"), claim((1, 1), 100.0, "QmF")]
    squatter = claim((0, 0), 1e15, "QmSquatter")
    assert path_service(SPEC, [*honest, squatter])[(0, 0)] == (CLAIM_CAP_FACTOR * 100.0, 1)
    # Every other path has two or three honest nodes: the squatted path ties the least served (one claimant) and
    # is chosen; it used to be avoided for ever (1e15 tok/s of service).
    honest += [claim((0, 1), 100.0, "QmG")]
    assert choose_path(SPEC, [*honest, squatter], 100.0, ME, NOW) == (0, 0)


def test_a_claim_without_measured_throughput_still_counts():
    claims = claims_on((0, 0), (0, 1), (1, 0), tokens_per_s=0.0) + [claim((1, 1), 0.5, "QmSlow")]
    service = path_service(SPEC, claims)
    assert service[(0, 0)] == (MIN_CLAIM_TOKENS_PER_S, 1)
    assert service[(1, 1)] == (MIN_CLAIM_TOKENS_PER_S, 1)
    claims += [claim((0, 0), 0.0, "QmNew")]  # (0, 0) now has two unmeasured nodes: the others tie
    assert choose_path(SPEC, claims, 0.0, ME, NOW) != (0, 0)


def test_doubles_up_on_the_least_served_path_when_all_are_served():
    claims = [claim((0, 0), 300.0, "QmA"), claim((0, 1), 200.0, "QmB"), claim((1, 0), 90.0, "QmC"),
              claim((1, 1), 400.0, "QmD")]
    assert choose_path(SPEC, claims, 50.0, ME, NOW) == (1, 0)


def test_equal_service_prefers_fewer_claimants():
    claims = [claim((0, 0), 200.0, "QmA"), claim((0, 1), 100.0, "QmB"), claim((0, 1), 100.0, "QmC"),
              claim((1, 0), 900.0, "QmD"), claim((1, 1), 900.0, "QmE")]
    assert choose_path(SPEC, claims, 50.0, ME, NOW) == (0, 0)


def test_expired_own_and_foreign_claims_are_ignored():
    claims = claims_on((0, 0), (0, 1), (1, 0))
    ignored = [
        claim((1, 1), 500.0, "QmDead", expires_at=NOW),  # expired exactly now
        claim((1, 1), 500.0, ME),  # my own claim: I am choosing afresh
    ]
    assert choose_path(SPEC, claims + ignored, 50.0, ME, NOW) == (1, 1)
    off_spec = claim((0, 5), 500.0, "QmBad")  # valid record, but no such path in this swarm
    assert choose_path(SPEC, claims + [off_spec], 50.0, ME, NOW) == (1, 1)


def test_exact_ties_are_broken_by_a_per_peer_hash_then_pinned():
    # An empty swarm is one big tie; each peer ranks it by sha256(peer/path). Golden values.
    assert rank_paths(SPEC, [], "peer0", NOW) == [(0, 1), (1, 0), (1, 1), (0, 0)]
    assert choose_path(SPEC, [], 0.0, "peer0", NOW) == (0, 1)
    assert choose_path(SPEC, [], 0.0, "peer1", NOW) == (1, 1)
    assert min(SPEC.paths(), key=lambda p: tie_break("peerA", p)) == choose_path(SPEC, [], 0.0, "peerA", NOW)


def test_simultaneous_joiners_tend_to_spread():
    # Two peers joining an empty swarm of 4 paths at once pick different paths ~3/4 of the time.
    pairs = [(f"QmJoinerA{i}", f"QmJoinerB{i}") for i in range(400)]
    apart = sum(choose_path(SPEC, [], 0.0, a, NOW) != choose_path(SPEC, [], 0.0, b, NOW) for a, b in pairs)
    assert 0.65 < apart / len(pairs) < 0.85


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf"), "fast"])
def test_bad_own_throughput_is_a_value_error(bad):
    with pytest.raises(ValueError, match="my_tokens_per_s"):
        choose_path(SPEC, [], bad, ME, NOW)


# ---- properties ----------------------------------------------------------------------------------
random_claims = st.lists(
    st.builds(
        claim,
        path=st.sampled_from(SPEC.paths() + [(0, 7)]),
        tokens_per_s=st.sampled_from([0.0, 0.5, 1.0, 10.0]) | st.floats(0, 1e6),
        peer=st.sampled_from([ME, "QmA", "QmB", "QmC", "QmD"]),
        expires_at=st.floats(NOW - 50, NOW + 50),
    ),
    max_size=12,
)


@settings(max_examples=300, deadline=None)
@given(claims=random_claims, my_tps=st.floats(0, 1e6), peer=st.sampled_from([ME, "QmA", "QmZ"]))
def test_choice_is_a_valid_least_served_path_and_ignores_claim_order(claims, my_tps, peer):
    chosen = choose_path(SPEC, claims, my_tps, peer, NOW)
    SPEC.check_path(chosen)
    live = [c for c in claims if c.expires_at > NOW and c.peer_id != peer and c.path in SPEC.paths()]
    cap = CLAIM_CAP_FACTOR * max(statistics.median([c.tokens_per_s for c in live] or [0.0]), MIN_CLAIM_TOKENS_PER_S)
    service = {p: sum(min(max(c.tokens_per_s, MIN_CLAIM_TOKENS_PER_S), cap) for c in live if c.path == p)
               for p in SPEC.paths()}
    assert service[chosen] <= min(service.values()) * (1 + 1e-12)  # equal up to summation order
    assert choose_path(SPEC, list(reversed(claims)), my_tps, peer, NOW) == chosen
