"""The round in progress survives a crash: saved on top of the round checkpoint, resumed bit for bit, refused
when it does not fit (a real node SIGKILLed mid-round: tests/swarm/test_resume.py)."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import time
from types import SimpleNamespace

import pytest
import torch

from pathswarm.node.model.data import TokenSampler
from pathswarm.node.peer.partial_round import FILE, PartialError, load_partial, save_partial, saved_counters
from pathswarm.node.train.worker import PathWorker
from pathswarm.protocol.rounds.outer import OuterState


def _worker(spec, docs, seed=0, path=(0, 0)):
    sampler = TokenSampler(docs, spec.model.context_len, seed=seed)
    return PathWorker(spec, path, lambda: sampler.sample(2))


def _anchors(w):
    return {mid: w.outer[mid].anchor for mid in w.module_ids}


def _same_anchors(src, dst):
    """dst adopts src's module states (what a node's restore from the round checkpoint does)."""
    for mid in src.module_ids:
        dst.restore(mid, src.module_state(mid))


def test_a_resumed_round_continues_bit_for_bit(tmp_path, spec, synthetic_docs):
    a = _worker(spec, synthetic_docs)
    a.train_inner(2)
    for mid in a.module_ids:  # one outer round, so the anchors are not the seed's
        a.outer[mid] = a.outer[mid].stepped(a.pseudo_grad(mid), spec.outer)
        a.set_flat(mid, a.outer[mid].anchor)
    a.end_round()
    a.train_inner(3)
    counters = {"counters_id": "ab" * 16, "trained": 900, "merged": 500, "discarded": 0, "lost": 0}
    save_partial(tmp_path, spec, a, _anchors(a), carry={"shared": 7}, counters=counters)

    b = _worker(spec, synthetic_docs, seed=1)  # another data stream: only the saved state may make them agree
    _same_anchors(a, b)
    got = load_partial(tmp_path, spec, b)
    assert (got.round_steps, got.round_tokens, got.inner_step, got.carry) == (3, a.round_tokens, 5, {"shared": 7})
    assert saved_counters(tmp_path, spec.swarm_id) == counters  # read from the header, resumed or not
    assert saved_counters(tmp_path, "another-swarm") is None
    for mid in a.module_ids:
        assert torch.equal(a.flat(mid), b.flat(mid))
    # the same next batches from here: identical weights, so the inner optimizer state came back exactly
    batches = [a.batches() for _ in range(2)]
    for w in (a, b):
        it = iter(batches)
        w.batches = lambda it=it: next(it)
        w.train_inner(2)
    for mid in a.module_ids:
        assert torch.equal(a.flat(mid), b.flat(mid))
    assert a.inner_step == b.inner_step == 7


def test_steps_already_sent_are_not_saved(tmp_path, spec, synthetic_docs):
    """With an outer gradient in flight the file keeps only the steps trained after it was made: if that round
    merged, the next anchor holds the sent steps, and keeping them too would apply them twice."""
    a = _worker(spec, synthetic_docs)
    a.train_inner(2)
    sent = {mid: a.flat(mid) for mid in a.module_ids}  # the weights the in-flight outer gradient was made from
    a.end_round()
    a.train_inner(1)
    save_partial(tmp_path, spec, a, sent, carry={})
    b = _worker(spec, synthetic_docs)
    _same_anchors(a, b)
    load_partial(tmp_path, spec, b)
    for mid in a.module_ids:
        want = a.outer[mid].anchor + (a.flat(mid) - sent[mid])
        assert torch.equal(b.flat(mid), want)
        assert not torch.allclose(b.flat(mid), a.flat(mid))


def test_sent_weights_that_are_views_of_one_buffer_are_saved(tmp_path, spec, synthetic_docs):
    """The saved tensors are not copied unless they must be (views into one buffer are): the round comes back the
    same."""
    a = _worker(spec, synthetic_docs)
    a.train_inner(2)
    flats = [a.flat(mid) for mid in a.module_ids]
    buffer = torch.cat(flats)
    sent, offset = {}, 0
    for mid, f in zip(a.module_ids, flats, strict=True):
        sent[mid] = buffer[offset:offset + f.numel()]
        offset += f.numel()
    a.end_round()
    a.train_inner(1)
    save_partial(tmp_path, spec, a, sent, carry={})
    b = _worker(spec, synthetic_docs)
    _same_anchors(a, b)
    load_partial(tmp_path, spec, b)
    for mid in a.module_ids:
        assert torch.equal(b.flat(mid), a.outer[mid].anchor + (a.flat(mid) - sent[mid]))


def test_a_partial_that_does_not_fit_is_refused_and_changes_nothing(tmp_path, spec, synthetic_docs):
    a = _worker(spec, synthetic_docs)
    a.train_inner(2)
    save_partial(tmp_path, spec, a, _anchors(a), carry={})

    def fresh():
        w = _worker(spec, synthetic_docs)
        _same_anchors(a, w)
        return w, {mid: w.flat(mid) for mid in w.module_ids}

    # a later round was checkpointed: the file was made against older anchors
    w, before = fresh()
    w.outer["shared"] = dataclasses.replace(w.outer["shared"], round=w.outer["shared"].round + 1)
    with pytest.raises(PartialError, match="another state of shared"):
        load_partial(tmp_path, spec, w)
    assert all(torch.equal(w.flat(m), before[m]) for m in w.module_ids) and w.inner_step == 0 and not w.opt.state

    other = _worker(spec, synthetic_docs, path=(1, 1))
    with pytest.raises(PartialError, match="path"):
        load_partial(tmp_path, spec, other)
    w, _ = fresh()
    with pytest.raises(PartialError, match="another swarm"):
        load_partial(tmp_path, spec.replace(name="elsewhere"), w)

    raw = (tmp_path / FILE).read_bytes()
    header_end = 8 + int.from_bytes(raw[:8], "little")
    zeroed = raw[:header_end] + bytes(len(raw) - header_end)  # what a power loss can leave: a header, no data
    for bad in (raw[: len(raw) // 2], b"", raw[:8] + b"[" + raw[9:], zeroed):
        (tmp_path / FILE).write_bytes(bad)
        w, before = fresh()
        with pytest.raises(PartialError):
            load_partial(tmp_path, spec, w)
        assert all(torch.equal(w.flat(m), before[m]) for m in w.module_ids)
    (tmp_path / FILE).unlink()
    with pytest.raises(PartialError, match="no round in progress"):
        load_partial(tmp_path, spec, fresh()[0])


@pytest.mark.parametrize(("eager", "resync"), [(False, False), (True, False), (False, True), (True, True)])
def test_sending_a_round_discards_the_saved_one_and_the_next_save_leaves_the_sent_steps_out(
        tmp_path, spec, synthetic_docs, eager, resync):
    """Between a send and the next save, the file on disk would hold the steps just sent: resumed after that round
    merged, they would be applied twice. So the send deletes it, and the next step saves it without them; so too
    when a re-sync replaced a module's state while its round was in flight (our progress re-based on the new
    anchor, node/peer/state_sync.py `_adopt`), where the steps not sent used to be counted from the old anchor."""
    from pathswarm.node.peer.claims import Groups
    from pathswarm.node.peer.node import Node, NodeConfig
    from pathswarm.node.peer.rounds import Rounds

    spec = spec.replace(outer=dataclasses.replace(spec.outer, eager=eager))  # eager: the move is counted out too
    node = Node(NodeConfig(spec=spec, offline=True, checkpoint_dir=str(tmp_path)))
    node.worker = w = _worker(spec, synthetic_docs)
    # the network side of a send, stubbed: this checks the node's own bookkeeping
    net = SimpleNamespace(submit=lambda coro: (coro.close(), concurrent.futures.Future())[1])  # never run
    exchange = SimpleNamespace(contribute=lambda *args: None, skipped=list, distrusted={},
                               audits=SimpleNamespace(alerts=[]))
    node.rounds = Rounds(node.cfg, node.status, w, exchange, net, lambda mid: None)
    for mid in w.module_ids:  # past the outer warm-up, so that the send's eager move (`[outer] eager`) moves us
        st = w.outer[mid]
        w.outer[mid] = OuterState(st.anchor, st.momentum + 1e-3, spec.outer.warmup_rounds)
    w.train_inner(3)
    node.partial.maybe_save(node._save_partial, node.work)
    assert (tmp_path / FILE).is_file()
    node.partial.on_send()
    node.rounds.send(Groups({mid: ["reducer"] for mid in w.module_ids}, {mid: ("reducer",) for mid in w.module_ids},
                            {}))
    assert not (tmp_path / FILE).exists()
    w.train_inner(1)
    unsent = {}  # module → our steps not sent yet
    for mid in w.module_ids:
        item = node.rounds.in_flight[mid]
        unsent[mid] = w.flat(mid) - item.sent.local_when_sent - (0 if item.moved is None else item.moved)
    if resync:  # as _adopt does: another state, our progress kept on top of its anchor
        mid = w.module_ids[0]
        old = w.outer[mid]
        new = OuterState(old.anchor + 0.01, old.momentum, old.round + 1)
        local = w.flat(mid)
        w.outer[mid] = new
        w.set_flat(mid, new.anchor + (local - old.anchor))
    # Due at the first step after a send that the 1/PARTIAL_COST_SHARE budget allows (at once for a small model).
    time.sleep(max(0.0, node.partial.earliest - time.perf_counter()))
    node.partial.maybe_save(node._save_partial, node.work)
    b = _worker(spec, synthetic_docs)
    _same_anchors(w, b)
    got = load_partial(tmp_path, spec, b)
    assert (got.round_steps, got.round_tokens) == (1, w.round_tokens)
    for mid in w.module_ids:
        moved = node.rounds.in_flight[mid].moved
        assert (moved is not None and float(moved.abs().max()) > 0) if eager else moved is None
        # the steps since the send only: neither those sent nor the eager move (the round in flight brings its own)
        assert torch.allclose(b.flat(mid), w.outer[mid].anchor + unsent[mid], atol=1e-6)


def _metadata(path) -> dict:
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        return json.loads(f.read(n))["__metadata__"]


def test_the_error_feedback_residual_comes_back_with_the_round(tmp_path, spec, synthetic_docs):
    """What a member's frames have not carried yet (SparseLoCo: most of its progress) is saved with the round in
    progress and restored with it; a module with none stays without one."""
    a = _worker(spec, synthetic_docs)
    a.train_inner(1)
    residual = torch.linspace(-1, 1, a.outer["shared"].anchor.numel())
    a.feedback["shared"].residual = residual.clone()
    save_partial(tmp_path, spec, a, _anchors(a), carry={})
    b = _worker(spec, synthetic_docs, seed=1)
    _same_anchors(a, b)
    b.feedback["shared"].reset()
    load_partial(tmp_path, spec, b)
    assert torch.equal(b.feedback["shared"].residual, residual)
    assert b.feedback["L0M0"].residual is None
