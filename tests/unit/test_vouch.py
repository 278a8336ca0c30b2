"""Which announced state a node that is told it is behind may adopt (node/peer/vouch.py): a majority's, never one
peer's."""

import pytest

from pathswarm.node.peer.vouch import Announced as A
from pathswarm.node.peer.vouch import Vouched, counted_peers, majority_state, vouched_state

HONEST = {"a", "b", "c"}


def test_a_majority_of_counted_holders_vouches_for_a_later_state():
    announced = [A("a", 7, "d7"), A("b", 7, "d7"), A("c", 6, "d6"), A("me", 5, "d5")]
    assert vouched_state(announced, "me", 5, HONEST) == Vouched(7, "d7", ("a", "b"))


def test_one_peer_claiming_a_later_round_moves_nothing():
    # The hostile peer is not counted (never merged with us), however far ahead it claims to be.
    announced = [A("evil", 2**40, "ff"), A("a", 5, "d5"), A("b", 5, "d5")]
    assert vouched_state(announced, "me", 5, HONEST) is None
    # Counted or not, one voice of three is no majority; two of four is not either (a strict majority).
    assert vouched_state([A("a", 9, "x"), A("b", 5, "d5"), A("c", 5, "d5")], "me", 5, HONEST) is None
    four = {"a", "b", "c", "d"}
    assert vouched_state([A("a", 9, "x"), A("b", 9, "x"), A("c", 5, "y"), A("d", 6, "z")], "me", 5, four) is None


def test_nothing_newer_than_ours_and_our_own_voice_are_ignored():
    assert vouched_state([A("a", 5, "d5"), A("b", 5, "d5")], "me", 5, HONEST) is None
    assert vouched_state([A("me", 9, "x"), A("a", 5, "d5")], "me", 5, HONEST | {"me"}) is None
    assert vouched_state([], "me", 0, HONEST) is None
    # A peer's newest announcement is its vote (it may appear twice while a record is replaced).
    twice = [A("a", 6, "d6"), A("a", 8, "d8"), A("b", 8, "d8")]
    assert vouched_state(twice, "me", 5, HONEST) == Vouched(8, "d8", ("a", "b"))


def test_counted_peers_are_those_we_merged_with_else_the_claims():
    assert counted_peers({"a", "b", "me"}, {"a", "b", "c", "evil"}, "me") == {"a", "b"}
    assert counted_peers(set(), {"a", "me"}, "me") == {"a"}
    # A reducer caught lying (node/peer/audit.py) counts for nothing in a majority.
    assert counted_peers({"a", "liar", "me"}, {"a", "liar"}, "me", {"liar": "its mean is not its frames'"}) == {"a"}


def test_the_majority_state_is_what_a_node_told_it_is_out_of_sync_compares_with_its_own():
    """An `out_of_sync` answer or a digest mismatch names our own round: StateSync.resync adopts the majority's state
    when it is another digest at our round (or later), keeps ours when the majority holds ours."""
    group = [A("a", 5, "g5"), A("b", 5, "g5"), A("c", 5, "mine")]
    assert majority_state(group, "me", HONEST) == Vouched(5, "g5", ("a", "b"))
    assert vouched_state(group, "me", 5, HONEST) is None  # only later rounds move a node told it is behind
    assert majority_state([A("a", 5, "mine"), A("b", 5, "mine"), A("c", 6, "z")], "me", HONEST) == Vouched(
        5, "mine", ("a", "b"))
    assert majority_state([A("a", 5, "p"), A("b", 6, "q")], "me", HONEST) is None
    assert majority_state([A("evil", 9, "x"), A("evil2", 9, "x"), A("a", 5, "g5")], "me", HONEST) == Vouched(
        5, "g5", ("a",))  # uncounted ids are not votes


def test_a_joiner_leaves_out_a_peer_most_holders_caught_lying_and_nothing_else():
    from pathswarm.node.peer.vouch import voted_out

    # The lying-reducer case: a and b caught the liar; the liar says it caught a. Voters: every holder of our modules.
    votes = {"a": ("liar",), "b": ("liar",), "liar": ("a",)}
    assert voted_out(votes, {"a", "b", "liar", "me"}, "me") == {"liar"}
    # With it left out, one honest holder of a module the liar also holds is a majority of the rest.
    anns = [A("a", 12, "d-honest"), A("liar", 12, "d-liar")]
    counted = counted_peers((), {"a", "liar"}, "me", voted_out(votes, {"a", "b", "liar"}, "me"))
    assert vouched_state(anns, "me", 0, counted) == Vouched(12, "d-honest", ("a",))
    assert vouched_state(anns, "me", 0, counted_peers((), {"a", "liar"}, "me")) is None  # a tie without the votes
    # A tie of votes, a minority, votes about us, and votes from peers that are not voters move nothing.
    assert voted_out({"a": ("liar",), "liar": ("a",)}, {"a", "liar"}, "me") == set()
    assert voted_out({"a": ("b",)}, {"a", "b", "c", "d"}, "me") == set()
    assert voted_out({"a": ("me",), "b": ("me",)}, {"a", "b"}, "me") == set()
    assert voted_out({"x": ("a",), "y": ("a",), "z": ("a",)}, {"a", "b"}, "me") == set()


def test_the_reducer_list_a_download_must_bring_is_the_one_most_of_the_states_announcers_hold():
    from pathswarm.protocol.rounds.reducers import list_digest

    honest, forged = list_digest(("a", "b")), list_digest(("liar", "a", "b"))
    assert honest != forged and len(honest) == 64
    # The liar holds the same state (it re-synced from the others) but announces, and would serve, its own list.
    anns = [A("a", 7, "d7", honest), A("b", 7, "d7", honest), A("liar", 7, "d7", forged)]
    got = majority_state(anns, "me", {"a", "b", "liar"})
    assert got == Vouched(7, "d7", ("a", "b", "liar"), honest)
    # No majority on a list (or announcements from before the field): no list is required, the state still is.
    split = [A("a", 7, "d7", honest), A("liar", 7, "d7", forged)]
    assert majority_state(split, "me", {"a", "liar"}) == Vouched(7, "d7", ("a", "liar"), "")
    assert majority_state([A("a", 7, "d7"), A("b", 7, "d7")], "me", {"a", "b"}) == Vouched(7, "d7", ("a", "b"), "")


@pytest.fixture
def sync(synthetic_docs):
    """A node's StateSync over a real worker of a 1-level spec and an offline exchange (the tests put its downloads
    in: the exchange's own are tested end to end in tests/swarm)."""
    from pathswarm.node.model.data import TokenSampler
    from pathswarm.node.peer.node_status import NodeStatus
    from pathswarm.node.peer.state_sync import StateSync
    from pathswarm.node.train.worker import PathWorker
    from pathswarm.protocol.netloop import NetLoop
    from pathswarm.protocol.rounds.exchange import ModuleExchange
    from pathswarm.protocol.spec import ModelSpec, SwarmSpec

    spec = SwarmSpec(levels=(1,), model=ModelSpec(width=32, base_width=32, n_heads=2, layers_per_module=1,
                                                  context_len=16))
    sampler = TokenSampler(synthetic_docs, spec.model.context_len, seed=0)
    worker = PathWorker(spec, (0,), lambda: sampler.sample(2))
    numels = {m: worker.flat(m).numel() for m in worker.module_ids}
    net = NetLoop()
    try:
        yield StateSync(spec, worker, NodeStatus(peer_id="me"), ModuleExchange(spec, None, "me", numels,
                                                                               lambda m: None), net)
    finally:
        net.stop()


def test_a_download_with_another_reducer_list_than_the_vouched_one_is_refused(sync):
    import torch

    from pathswarm.protocol.rounds.outer import OuterState, state_digest
    from pathswarm.protocol.rounds.reducers import list_digest

    worker = sync.worker
    anchor = torch.full((worker.flat("shared").numel(),), 0.5)
    momentum = torch.zeros_like(anchor)
    digest = state_digest(anchor, momentum, 7)
    served = {"a": ("a", "b"), "liar": ("liar", "a", "b")}  # the same state, each with its own list

    async def fetch_state(peer, module, timeout_s, round_=-1):
        assert round_ == 7  # the vouched round: a reducer serves it rather than the state after its newer rounds
        return OuterState(anchor.clone(), momentum.clone(), 7, served[peer])

    sync.exchange.fetch_state = fetch_state
    vouched = Vouched(7, digest, ("a", "b", "liar"), list_digest(("a", "b")))
    assert not sync.download("shared", "liar", expect=vouched)  # its list is not the one most announcers hold
    assert worker.outer["shared"].round == 0
    assert sync.download("shared", "a", expect=vouched)
    assert worker.outer["shared"].round == 7 and worker.outer["shared"].reducers == ("a", "b")


def test_a_peer_caught_lying_counts_and_serves_nothing_from_the_moment_it_is_caught(sync):
    """The status file's copy of whom we caught is refreshed at the next poll; what counts and what is downloaded
    reads the exchange's own list, at once."""
    fetched = []

    async def fetch_state(peer, module, timeout_s, round_=-1):
        fetched.append(peer)
        return None

    sync.exchange.fetch_state = fetch_state
    sync.status.groups["shared"] = {"3": ["me", "liar", "b"]}
    assert sync.announced("shared", ["liar", "b"], anns=[])[2] == {"liar", "b"}
    sync.exchange.distrust("liar", "its mean of shared round 6 is not what its frames give")
    assert sync.status.distrusted == {}  # not refreshed yet
    assert sync.announced("shared", ["liar", "b"], anns=[])[2] == {"b"}
    assert not sync.download("shared", "liar") and fetched == []
    assert not sync.download_parts("shared", Vouched(7, "d", ("liar", "b"))) and fetched == []


def test_a_vouched_state_is_downloaded_in_parts_from_its_holders_and_checked_like_a_whole_one(sync):
    import torch

    from pathswarm.protocol.rounds.outer import OuterState, state_digest
    from pathswarm.protocol.rounds.reducers import list_digest

    worker = sync.worker
    anchor = torch.full((worker.flat("shared").numel(),), 0.25)
    momentum = torch.zeros_like(anchor)
    digest = state_digest(anchor, momentum, 9)
    asked: list = []
    lists = {"ab": ("a", "b")}

    async def fetch_state_parts(peers, module, timeout_s, round_, want):  # the download: tests/swarm/test_state_parts
        asked.append((tuple(peers), round_, want))
        return OuterState(anchor.clone(), momentum.clone(), 9, lists["ab"])

    sync.exchange.fetch_state_parts = fetch_state_parts
    sync.clients = {"nat"}
    one = Vouched(9, digest, ("a", "nat"), list_digest(("a", "b")))
    assert not sync.download_parts("shared", one) and asked == []  # one dialable holder: whole, as before
    both = Vouched(9, digest, ("a", "b", "nat"), list_digest(("a", "b")))
    lists["ab"] = ("liar", "a")  # parts that bring another list than the vouched one are refused
    assert not sync.download_parts("shared", both) and worker.outer["shared"].round == 0
    lists["ab"] = ("a", "b")
    assert sync.download_parts("shared", both)
    assert asked[-1] == (("a", "b"), 9, digest)  # from every dialable holder, for the vouched state
    assert worker.outer["shared"].round == 9 and torch.equal(worker.outer["shared"].anchor, anchor)


def test_a_holder_a_round_ahead_still_vouches_for_the_state_before():
    """Issue 27: announcements name the states their holder held just before (`chain`). Tallying the current states
    only, holders a round apart were no majority, and a node told it was behind waited 20 s and more."""
    a = A("a", 8, "d8", "l8", ((6, "d6", "l6"), (7, "d7", "l7")))
    b = A("b", 7, "d7", "l7", ((6, "d6", "l6"),))
    got = vouched_state([a, b], "me", 5, HONEST)
    assert (got.round, got.digest, got.peers, got.reducers, got.vouchers) == (7, "d7", ("b",), "l7", ("a", "b"))
    assert got.history == ((6, "d6"), (7, "d7"))  # the states it went through (a holder's chain), for a re-sync
    # the newest state a majority vouches for wins; a state nobody holds any more is no download
    c = A("c", 8, "d8", "l8", ((7, "d7", "l7"),))
    assert vouched_state([a, b, c], "me", 5, HONEST) == Vouched(8, "d8", ("a", "c"), "l8")
    moved = [A("a", 9, "x9", "", ((8, "d8", ""),)), A("b", 9, "y9", "", ((8, "d8", ""),))]
    assert majority_state(moved, "me", {"a", "b"}).peers == () and vouched_state(moved, "me", 5, {"a", "b"}) is None
    assert majority_state(moved, "me", {"a", "b"}).history == ((8, "d8"),)  # a voucher's chain, cut at the state
    # a chain is one voice per peer: one peer naming a state twice (chain and current) still counts once
    assert majority_state([A("a", 7, "d7", "", ((6, "d6", ""),)), A("b", 5, "d5"), A("c", 5, "d5")], "me",
                          HONEST) == Vouched(5, "d5", ("b", "c"))


def test_peers_we_merged_with_count_while_they_still_claim_the_module():
    """A dead peer's last announcement outlives its claim: counted, it voted for the state it died with."""
    assert counted_peers({"a", "dead", "me"}, {"a", "b", "me"}, "me") == {"a"}
    # none of them alive: the claims' holders count, as for a joiner; the dead one's stale announcement (our own state)
    # kept us on it for good while the live holders moved on
    assert counted_peers({"dead", "me"}, {"b", "c", "me"}, "me") == {"b", "c"}
    stale, live = A("dead", 40, "d40"), [A("b", 52, "d52", "", ((51, "d51", ""),)), A("c", 52, "d52")]
    assert vouched_state([stale, *live], "me", 40, counted_peers({"dead"}, {"b", "c"}, "me")).round == 52
    assert counted_peers({"dead", "me"}, {"me"}, "me") == {"dead"}  # nobody claims it: what we knew is all there is


def test_a_long_download_logs_how_far_it_got(sync, monkeypatch, caplog):
    import logging

    from pathswarm.node.peer import state_sync

    monkeypatch.setattr(state_sync, "PROGRESS_LOG_S", 0.0)
    tick = sync._progress("shared", "peer abcdefgh")
    sync.exchange.traffic.add(received=1_500_000)
    with caplog.at_level(logging.INFO, logger="pathswarm.node.peer.state_sync"):
        tick()
    total = 8 * sync.worker.outer["shared"].anchor.numel()
    line = caplog.records[-1].getMessage()
    assert line.startswith("state of shared from peer abcdefgh: ") and "so far" in line
    assert f"of {state_sync.human_bytes(total)}" in line and state_sync.human_bytes(min(1_500_000, total)) in line
