"""Reachability (protocol/reachability.py) and what a client changes in the reducer choice (protocol/rounds/reducers.py,
node/peer/claims.py): pure parts, no network."""

import pytest

from pathswarm.node.peer.claims import groups_of, view_of
from pathswarm.protocol.reachability import DialBack, listen_ports, observed_host, parse_ports, verdict
from pathswarm.protocol.records import PathClaim
from pathswarm.protocol.rounds.reducers import successors
from pathswarm.protocol.spec import SwarmSpec
from pathswarm.protocol.wire import WireError


def test_the_dial_back_dials_only_the_address_the_request_came_from():
    assert observed_host("/ip4/203.0.113.7/tcp/40123") == "203.0.113.7"
    assert observed_host("/ip6/2001:db8::1/tcp/4001") == "2001:db8::1"
    # nothing to dial back at: relayed, DNS or non-TCP addresses
    for maddr in ("/p2p-circuit/p2p/QmX", "/dns4/example.org/tcp/1", "/ip4/1.2.3.4/udp/1/quic", ""):
        assert observed_host(maddr) is None
    assert parse_ports({"ports": [31337, 4001, 31337]}) == [4001, 31337]
    for bad in ({}, {"ports": []}, {"ports": list(range(1, 10))}, {"ports": [0]}, {"ports": [65536]},
                {"ports": [True]}, {"ports": ["80"]}, {"ports": 80}, {"ports": [1.5]}):
        with pytest.raises(WireError):
            parse_ports(bad)
    assert listen_ports(["/ip4/10.0.0.2/tcp/4001/p2p/QmA", "/ip4/127.0.0.1/tcp/4001", "/ip4/1.2.3.4/tcp/80"]) == [
        80, 4001]


def test_verdict_reachable_behind_nat_or_unknown():
    assert verdict([]) is None
    assert verdict([DialBack("a", "1.2.3.4", ())]) is False
    assert verdict([DialBack("a", "1.2.3.4", ()), DialBack("b", "1.2.3.4", (4001,))]) is True


def test_clients_are_never_reducer_candidates_unless_a_module_has_no_one_else():
    assert successors("r", ["b", "c", "a"], clients=["c"]) == ("r", "a", "b")
    assert successors("c", ["b", "c", "a"], clients=["c"]) == ("a", "b", "c")  # a client reducer goes last
    assert successors("c", ["c"], clients=["c"]) == ("c",)
    spec = SwarmSpec(name="nat", levels=(2, 2))
    claims = [PathClaim(path=(0, 0), peer_id=p, tokens_per_s=1.0, round=3, expires_at=1e9, client=p == "QmHome")
              for p in ("QmHome", "QmPub")]
    mids = spec.module_ids((0, 0))
    # the reachable node never names the client; the client names the reachable one only
    g = groups_of(view_of(claims, spec, mids, "QmPub"), "QmPub", 3)
    assert g.holders["shared"] == ["QmHome", "QmPub"] and g.reducible["shared"] == ["QmPub"]
    assert g.genesis["shared"] == ("QmPub",)
    g = groups_of(view_of(claims, spec, mids, "QmHome"), "QmHome", 3, client=True)
    assert g.reducible["L0M0"] == ["QmPub"] and g.genesis["L0M0"] == ("QmPub",)
    # a client alone on its modules closes its own rounds
    alone = groups_of(view_of(claims[:1], spec, mids, "QmHome"), "QmHome", 3, client=True)
    assert alone.reducible["shared"] == ["QmHome"] and alone.genesis["shared"] == ("QmHome",)



def test_partners_are_holders_we_merged_with_not_every_claimant():
    from pathswarm.node.peer.claims import Groups, partners_of

    groups = Groups(holders={"shared": ["QmA", "QmB", "QmJoiner"]}, genesis={"shared": ("QmA", "QmB", "QmJoiner")},
                    live={}, reducible={"shared": ["QmA", "QmB", "QmJoiner"]})
    merged = {"shared": {"3": ["QmA", "QmB", "QmRevoked"], "4": ["QmA", "QmRevoked"]}}
    # both sides of a split name the same list; the joiner we never merged with and the revoked peer (no claim) do not
    assert partners_of(groups, merged, "QmA") == {"shared": ("QmA", "QmB")}
    assert partners_of(groups, {"shared": {"3": ["QmA", "QmB"]}}, "QmB") == {"shared": ("QmA", "QmB")}
    assert partners_of(groups, {}, "QmJoiner") == {"shared": ("QmJoiner",)}
