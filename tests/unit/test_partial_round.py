"""The round in progress survives a crash: saved on top of the round checkpoint, resumed bit for bit, refused
when it does not fit; and a real node SIGKILLed mid-round resumes it instead of training the round again."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
import torch

from pathswarm.node.model.data import TokenSampler
from pathswarm.node.peer.partial_round import FILE, PartialError, load_partial, save_partial
from pathswarm.node.train.worker import PathWorker

from ..conftest import tiny_spec


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
        a.apply_outer(mid, a.pseudo_grad(mid))
    a.end_round()
    a.train_inner(3)
    save_partial(tmp_path, spec, a, _anchors(a), carry={"shared": 7}, uncounted_tokens=64)

    b = _worker(spec, synthetic_docs, seed=1)  # another data stream: only the saved state may make them agree
    _same_anchors(a, b)
    got = load_partial(tmp_path, spec, b)
    assert (got.round_steps, got.round_tokens, got.inner_step, got.carry, got.uncounted_tokens) == \
        (3, a.round_tokens, 5, {"shared": 7}, 64)
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
    w.outer["shared"].round += 1
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


def test_sending_a_round_discards_the_saved_one_and_the_next_save_leaves_the_sent_steps_out(
        tmp_path, spec, synthetic_docs):
    """Between a send and the next save, the file on disk would hold the steps just sent: resumed after that round
    merged, they would be applied twice. So the send deletes it, and the next step saves it without them."""
    from pathswarm.node.peer.runtime import Node, NodeConfig

    node = Node(NodeConfig(spec=spec, offline=True, checkpoint_dir=str(tmp_path)))
    node.worker = w = _worker(spec, synthetic_docs)
    w.train_inner(3)
    node._maybe_save_partial()
    assert (tmp_path / FILE).is_file()
    # the network side of a send, stubbed: this checks the node's own bookkeeping
    node.reducers = {mid: "reducer" for mid in w.module_ids}
    node.exchange = SimpleNamespace(contribute=lambda *args: None)
    node.net = SimpleNamespace(submit=lambda coro: concurrent.futures.Future())
    node._send_round()
    assert not (tmp_path / FILE).exists()
    w.train_inner(1)
    node._maybe_save_partial()  # due at the first step after a send
    b = _worker(spec, synthetic_docs)
    _same_anchors(w, b)
    got = load_partial(tmp_path, spec, b)
    assert (got.round_steps, got.round_tokens) == (1, w.round_tokens)
    for mid in w.module_ids:
        assert torch.equal(b.flat(mid), w.outer[mid].anchor + (w.flat(mid) - node.in_flight[mid].local_when_sent))


@pytest.mark.timeout(150)
def test_a_node_killed_mid_round_resumes_that_round(tmp_path):
    """A real offline node, SIGKILLed after saving a round in progress, starts its next run inside that round:
    the steps and their tokens are not trained again, and the round's tokens are all counted."""
    spec = tiny_spec()
    spec = spec.replace(inner=dataclasses.replace(spec.inner, steps=20))
    spec_path = tmp_path / "swarm.toml"
    spec_path.write_text(spec.to_toml())
    ckpt, status = tmp_path / "ckpt", tmp_path / "status.json"
    per_step = spec.inner.batch_size * spec.model.context_len
    base = [sys.executable, "-m", "pathswarm", "node", "run", "--swarm", str(spec_path), "--offline", "--threads",
            "1", "--checkpoint-dir", str(ckpt), "--status-file", str(status), "--save-partial-s", "0.2",
            "--max-tokens-per-s", str(per_step * 5)]  # 5 steps a second: a 20-step round takes 4 s
    proc = subprocess.Popen(base, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:  # wait for round 1's checkpoint and ~half of round 2
            st = json.loads(status.read_text()) if status.is_file() else {}
            if st.get("round", 0) >= 1 and st.get("inner_step", 0) >= 30:
                break
            time.sleep(0.05)
        else:
            pytest.fail("the node never reached the middle of its second round")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    meta = _metadata(ckpt / FILE)
    saved_steps = int(meta["round_steps"])
    assert 1 <= saved_steps < 20 and json.loads(meta["anchors"])["shared"][0] == 1  # saves are rate-limited

    again = subprocess.run(base + ["--max-rounds", "1"], capture_output=True, text=True, timeout=90)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "resumed the round in progress" in again.stderr
    st = json.loads(status.read_text())
    assert st["tokens_resumed"] == saved_steps * per_step
    # the round it finished is the one it resumed: 20 steps in all, only the missing ones trained now
    assert st["round"] == 1 and st["module_rounds"]["shared"] == 2
    assert st["inner_step"] == 20 + 20 and st["tokens_trained"] == 20 * per_step
    assert st["tokens_merged"] == 20 * per_step  # offline: a round is applied alone, all its tokens count


def _metadata(path) -> dict:
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        return json.loads(f.read(n))["__metadata__"]
