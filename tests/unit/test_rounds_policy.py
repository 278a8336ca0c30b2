"""The node's round bookkeeping around the round rule (node/peer/rounds.py): what a node that joins with an untrained
module sends, and what it does when a check before applying proves a round's reducer a liar. The network side is
stubbed (a future per send, the exchange's candidate lists recorded): multi-node behaviour is tests/swarm's."""

import concurrent.futures
from types import SimpleNamespace

import pytest

from pathswarm.node.model.data import TokenSampler
from pathswarm.node.peer.claims import Groups
from pathswarm.node.peer.config import NodeConfig, NodeStatus
from pathswarm.node.peer.rounds import Rounds
from pathswarm.node.train.worker import PathWorker
from pathswarm.protocol.exchange import RoundResult


class _Exchange:
    """Records every contribute call as (candidates, module, round, tokens)."""

    def __init__(self):
        self.calls, self.distrusted = [], {}
        self.audits = SimpleNamespace(alerts=[])

    def contribute(self, candidates, module, round_, tokens, digest, frame, timeout_s):
        self.calls.append((list(candidates), module, round_, tokens))
        return None

    def skipped(self):
        return []


def _rounds(spec, docs, **cfg):
    sampler = TokenSampler(docs, spec.model.context_len, seed=0)
    worker = PathWorker(spec, (0, 0), lambda: sampler.sample(2))
    exchange = _Exchange()
    futures = []

    def submit(coro):
        futures.append(concurrent.futures.Future())
        return futures[-1]

    rounds = Rounds(NodeConfig(spec=spec, offline=True, **cfg), NodeStatus(), worker, exchange,
                    SimpleNamespace(submit=submit), lambda mid: None)
    return rounds, worker, exchange, futures


def _groups(worker, order=("r1", "r2", "me")):
    return Groups({mid: sorted(order) for mid in worker.module_ids}, {mid: tuple(order) for mid in worker.module_ids},
                  {})


def _send(rounds, worker, groups):
    worker.train_inner(1)
    rounds.send(groups)
    return worker.round_tokens


def test_a_node_joining_with_an_untrained_module_sends_the_trained_ones_at_weight_1_for_its_first_rounds(
        spec, synthetic_docs):
    rounds, worker, exchange, _ = _rounds(spec, synthetic_docs)
    trained = worker.module_ids[0]
    worker.outer[trained].round = 7  # adopted from the swarm; the others are at round 0: nobody trained them
    rounds.note_start()
    assert rounds.fresh_path == {trained: rounds.cfg.fresh_path_rounds}
    groups = _groups(worker)
    for i in range(rounds.cfg.fresh_path_rounds + 1):
        exchange.calls.clear()
        rounds.status.tokens_discarded = 0
        worker.train_inner(1)
        full = worker.round_tokens
        rounds.send(groups)
        sent = {module: tokens for _, module, _, tokens in exchange.calls}
        held_back = i < rounds.cfg.fresh_path_rounds
        assert sent[trained] == (1 if held_back else full), (i, sent)
        assert all(sent[m] == full for m in worker.module_ids if m != trained), sent
        # the tokens held back are accounted as thrown away (trained = merged + unmerged + discarded)
        assert rounds.status.tokens_discarded == ((full - 1) if held_back and trained == "shared" else 0)
        rounds.in_flight.clear()


@pytest.mark.parametrize("rounds_of,cfg", [(lambda i: 0, {}), (lambda i: 3 + i, {}),
                                           (lambda i: 7 * (i == 0), {"fresh_path_rounds": 0})])
def test_no_weight_is_held_back_when_every_module_is_untrained_or_every_one_is_trained_or_when_told_so(
        spec, synthetic_docs, rounds_of, cfg):
    rounds, worker, exchange, _ = _rounds(spec, synthetic_docs, **cfg)
    for i, mid in enumerate(worker.module_ids):
        worker.outer[mid].round = rounds_of(i)
    rounds.note_start()
    assert rounds.fresh_path == {}
    worker.train_inner(1)
    full = worker.round_tokens
    rounds.send(_groups(worker))
    assert {tokens for *_, tokens in exchange.calls} == {full}


def _settle_with(rounds, mid, result, refused: str):
    item = rounds.in_flight.pop(mid)
    item.future.set_result(result)
    rounds.auditor.record = lambda *args, **kw: refused  # the check before applying: its verdict
    rounds._settle(mid, item)
    return item


def test_a_round_whose_reducer_a_check_proved_a_liar_goes_to_the_next_candidate_once(spec, synthetic_docs):
    rounds, worker, exchange, futures = _rounds(spec, synthetic_docs)
    mid = worker.module_ids[0]
    _send(rounds, worker, _groups(worker))
    first = next(c for c in exchange.calls if c[1] == mid)
    assert first[0][0] == "r1"
    anchor = worker.outer[mid].anchor.clone()
    lie = RoundResult(mid, 0, "merged", mean_frame=b"x", contributors=["r1", "me"], reducer="r1",
                      frames=(("r1", 1, "h"),))
    exchange.distrusted["r1"] = "its mean is not what its frames give"
    exchange.calls.clear()
    sent = _settle_with(rounds, mid, lie, "its mean of it is not what its frames give")
    # sent again: the same contribution, the same round, to the candidates after the liar
    assert exchange.calls == [(["r2", "me"], mid, first[2], first[3])]
    again = rounds.in_flight[mid]
    assert again.retried and again.sent is sent.sent and again.reducer == "r2"
    assert rounds.status.rounds_retried == 1 and rounds.status.rounds_failed == 0
    assert worker.outer[mid].round == 0 and bool((worker.outer[mid].anchor == anchor).all())  # nothing applied
    # a second proven lie in the same round is not sent again: the round fails, our steps carry
    exchange.distrusted["r2"] = "also lied"
    exchange.calls.clear()
    _settle_with(rounds, mid, RoundResult(mid, 0, "merged", mean_frame=b"x", contributors=["r2", "me"],
                                          reducer="r2", frames=(("r2", 1, "h"),)), "a lie")
    assert exchange.calls == [] and mid not in rounds.in_flight
    assert rounds.status.rounds_failed == 1 and rounds.carry[mid] == first[3]


def test_a_reducer_that_only_did_not_show_its_frames_is_not_failed_over_from(spec, synthetic_docs):
    """Not showing the frames proves nothing (the others may have applied the round): the round fails for us."""
    rounds, worker, exchange, _ = _rounds(spec, synthetic_docs)
    mid = worker.module_ids[0]
    _send(rounds, worker, _groups(worker))
    exchange.calls.clear()
    _settle_with(rounds, mid, RoundResult(mid, 0, "merged", mean_frame=b"x", contributors=["r1", "me"],
                                          reducer="r1", frames=(("r1", 1, "h"),)),
                 "r1 did not show the frames of it, and it is not audited yet")
    assert exchange.calls == [] and mid not in rounds.in_flight
    assert rounds.status.rounds_failed == 1 and rounds.status.rounds_retried == 0
