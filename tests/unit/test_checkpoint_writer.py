"""Round checkpoints written off the training thread (node/peer/checkpoints.py): the latest round only, in order with
the run's final checkpoint, and `durable` naming only what is on disk."""

import threading

import pytest
import torch

from pathswarm.node.model.data import TokenSampler
from pathswarm.node.peer.checkpoints import Checkpoints, LatestWriter
from pathswarm.node.peer.config import NodeConfig
from pathswarm.node.peer.counters import Counts
from pathswarm.node.train.checkpoint import load_checkpoint
from pathswarm.node.train.worker import PathWorker
from pathswarm.protocol.rounds.outer import OuterState
from pathswarm.protocol.spec import ModelSpec, SwarmSpec


def test_a_job_submitted_while_one_is_written_replaces_the_one_waiting():
    started, release, written = threading.Event(), threading.Event(), []

    def write(job):
        if job == 1:
            started.set()
            release.wait(10)
        written.append(job)

    w = LatestWriter(write, "test-writer")
    w.submit(1)
    assert started.wait(10)
    w.submit(2)
    w.submit(3)  # 2 never began: 3 replaces it
    assert w.busy()
    release.set()
    assert w.wait(10)
    assert written == [1, 3] and not w.busy()


def test_a_failed_write_does_not_stop_the_next_one(caplog):
    written = []

    def write(job):
        if job == "bad":
            raise OSError("disk full")
        written.append(job)

    w = LatestWriter(write, "test-writer")
    w.submit("bad")
    assert w.wait(10)
    w.submit("good")
    assert w.wait(10)
    assert written == ["good"] and "test-writer failed" in caplog.text


def test_wait_can_drop_a_job_not_begun():
    started, release, written = threading.Event(), threading.Event(), []

    def write(job):
        started.set()
        release.wait(10)
        written.append(job)

    w = LatestWriter(write, "test-writer")
    w.submit("a")
    assert started.wait(10)
    w.submit("b")
    assert not w.wait(0.05)  # "a" is still being written
    threading.Timer(0.1, release.set).start()
    assert w.wait(10, drop_pending=True)
    assert written == ["a"]


@pytest.fixture
def worker(synthetic_docs):
    spec = SwarmSpec(levels=(1,), model=ModelSpec(width=32, base_width=32, n_heads=2, layers_per_module=1,
                                                  context_len=16))
    sampler = TokenSampler(synthetic_docs, spec.model.context_len, seed=0)
    return PathWorker(spec, (0,), lambda: sampler.sample(2))


def _advance(worker: PathWorker, round_: int) -> None:
    """Every module at `round_`, with an anchor that says which round it is."""
    for mid, st in worker.outer.items():
        worker.outer[mid] = OuterState(torch.full_like(st.anchor, float(round_)), st.momentum.clone(), round_,
                                       st.reducers)


def test_the_final_checkpoint_waits_for_the_one_being_written(tmp_path, worker, monkeypatch):
    """Round 2's background write is held mid-way; the final save (round 3) must wait for it, so round 3 is the one
    on disk at the end, whatever the threads' timing."""
    import pathswarm.node.peer.checkpoints as mod

    writing, release, order = threading.Event(), threading.Event(), []
    real = mod.save_checkpoint

    def save(root, spec, round_, states, counters):
        order.append(("start", round_))
        if round_ == 2:
            writing.set()
            assert release.wait(10)
        real(root, spec, round_, states, counters)
        order.append(("end", round_))

    monkeypatch.setattr(mod, "save_checkpoint", save)
    ckpts = Checkpoints(NodeConfig(spec=worker.spec, checkpoint_dir=str(tmp_path)))
    _advance(worker, 2)
    ckpts.save(worker, Counts(counters_id="c", trained=20), background=True)
    assert writing.wait(10) and ckpts.writing()
    _advance(worker, 3)
    threading.Timer(0.2, release.set).start()
    ckpts.save(worker, Counts(counters_id="c", trained=30))
    assert order == [("start", 2), ("end", 2), ("start", 3), ("end", 3)]
    assert load_checkpoint(tmp_path, worker.spec).round == 3 and ckpts.durable == {m: 3 for m in worker.module_ids}


def test_a_failed_background_write_leaves_the_last_round_named(tmp_path, worker, monkeypatch, caplog):
    import pathswarm.node.peer.checkpoints as mod

    ckpts = Checkpoints(NodeConfig(spec=worker.spec, checkpoint_dir=str(tmp_path)))
    _advance(worker, 1)
    ckpts.save(worker, Counts(counters_id="c", trained=10), background=True)
    assert ckpts.finish(30)

    def full(*args, **kwargs):
        raise OSError("No space left on device")

    monkeypatch.setattr(mod, "save_checkpoint", full)
    _advance(worker, 2)
    ckpts.save(worker, Counts(counters_id="c", trained=20), background=True)
    assert ckpts.finish(30)
    assert ckpts.durable == {m: 1 for m in worker.module_ids} and load_checkpoint(tmp_path, worker.spec).round == 1
    assert "checkpoint of round 2 not written" in caplog.text


def test_a_background_checkpoint_is_on_disk_once_written_and_the_final_one_comes_after_it(tmp_path, worker):
    ckpts = Checkpoints(NodeConfig(spec=worker.spec, checkpoint_dir=str(tmp_path)))
    _advance(worker, 1)
    ckpts.save(worker, Counts(counters_id="c", trained=10), background=True)
    _advance(worker, 2)  # the training thread moves on: the copy taken at the save is what gets written
    assert ckpts.finish(30) and not ckpts.writing()
    ck = load_checkpoint(tmp_path, worker.spec)
    assert ck.round == 1 and ckpts.durable == {mid: 1 for mid in worker.module_ids}
    assert all(float(next(iter(st.weights.values())).flatten()[0]) == 1.0 for st in ck.modules.values())
    assert ck.counters["trained"] == 10

    ckpts.save(worker, Counts(counters_id="c", trained=20), background=True)
    _advance(worker, 3)
    ckpts.save(worker, Counts(counters_id="c", trained=30))  # the final one: written here, after round 2's
    ck = load_checkpoint(tmp_path, worker.spec)
    assert ck.round == 3 and ck.counters["trained"] == 30 and not ckpts.writing()
    assert ckpts.durable == {mid: 3 for mid in worker.module_ids}
