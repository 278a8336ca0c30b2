"""The claims read of a send, started during the last inner step (Claims.prefetch): it serves the send when it is
fresh, a new read does when it is not, and a read that outlasts the send's bound leaves the last view serving."""

import threading
import types

import pytest

import pathswarm.node.peer.claims as claims_mod
from pathswarm.node.peer.claims import PREFETCH_MAX_AGE_S, Claims
from pathswarm.protocol.records import PathClaim
from pathswarm.protocol.spec import ModelSpec, SwarmSpec

SPEC = SwarmSpec(levels=(1,), model=ModelSpec(width=32, base_width=32, n_heads=2, layers_per_module=1,
                                              context_len=16))
MID = SPEC.module_ids((0,))[0]


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _claim(peer: str) -> PathClaim:
    return PathClaim(path=(0,), peer_id=peer, tokens_per_s=1.0, round=1, expires_at=1e10)


@pytest.fixture
def reads(monkeypatch):
    """Each read_claims call: answers the peers `answer` held when it began (`began` is set then), once `gate` is
    open, and counts itself."""
    state = types.SimpleNamespace(answer=["p1"], gate=threading.Event(), calls=0, began=threading.Event())
    state.gate.set()

    def read_claims(sdht, spec, now=None, timeout_s=None):
        state.calls += 1
        peers = list(state.answer)
        state.began.set()
        if not state.gate.wait(10):
            raise AssertionError("gate never opened")
        return [_claim(p) for p in peers]

    monkeypatch.setattr(claims_mod, "read_claims", read_claims)
    return state


def _prefetch(c: Claims, reads, timeout_s: float = 1.0) -> None:
    """Start the early read and wait until it has begun (what it answers is fixed then)."""
    reads.began.clear()
    c.prefetch(timeout_s)
    assert reads.began.wait(10)


def _claims(clock: Clock, my_round=lambda: 1) -> Claims:
    sdht = types.SimpleNamespace(peer_id="me", client_mode=False, dht_time=lambda: 0.0)
    c = Claims(sdht, SPEC, threading.Event(), my_round=my_round, on_groups=lambda g: None, clock=clock)
    c.module_ids = [MID]
    return c


def _holders(c: Claims) -> list[str]:
    return c.groups.holders[MID]


def test_a_fresh_prefetch_serves_the_send_without_a_second_read(reads):
    clock = Clock()
    c = _claims(clock)
    _prefetch(c, reads)
    c.prefetch(1.0)  # one at a time
    reads.answer = ["p2"]  # what a read started now would see
    clock.now += 0.5
    assert c.refresh_for_send(1.0)
    assert reads.calls == 1 and _holders(c) == ["me", "p1"]


def test_a_prefetch_older_than_the_bound_is_read_again(reads):
    clock = Clock()
    c = _claims(clock)
    _prefetch(c, reads)
    reads.answer = ["p2"]
    clock.now += PREFETCH_MAX_AGE_S + 0.1
    assert c.refresh_for_send(1.0)
    assert reads.calls == 2 and _holders(c) == ["me", "p2"]


def test_a_prefetch_that_outlasts_the_bound_leaves_the_last_view(reads):
    clock = Clock()
    c = _claims(clock)
    c.refresh()  # the last view: p1
    reads.gate.clear()  # the next read hangs (a lookup that met a dead peer)
    reads.answer = ["p2"]
    _prefetch(c, reads)
    clock.now += 1.0  # the send comes as the bound runs out
    assert not c.refresh_for_send(1.0)
    assert _holders(c) == ["me", "p1"]
    reads.gate.set()
    # the next send reads anew (the late prefetch was the last send's)
    assert c.refresh_for_send(1.0) and _holders(c) == ["me", "p2"] and reads.calls == 3


def test_a_dropped_prefetch_does_not_serve_the_send(reads):
    """After round 1 the node renews its claim and waits for its peers' renewals: a read started before is dropped."""
    clock = Clock()
    c = _claims(clock)
    _prefetch(c, reads)
    reads.answer = ["p2"]
    c.drop_prefetch()
    assert c.refresh_for_send(1.0)
    assert reads.calls == 2 and _holders(c) == ["me", "p2"]


def test_an_early_read_older_than_the_view_keeps_the_view_but_our_round_is_taken_again(reads):
    clock, round_ = Clock(), [0]
    c = _claims(clock, my_round=lambda: round_[0])
    reads.gate.clear()
    _prefetch(c, reads)  # started at 100, hangs
    clock.now += 0.5
    reads.gate.set()
    reads.answer = ["p2"]
    c.refresh()  # a newer view, read meanwhile (the heartbeat's): p2, our round 0
    assert c.groups.live[MID]["me"] == 0
    round_[0] = 1  # we finished a round
    assert c.refresh_for_send(1.0)  # the early read (p1) is older: not installed, groups derived again
    assert _holders(c) == ["me", "p2"]
    assert c.groups.live[MID]["me"] == 1
