"""Checkpoints: exact round trip, validation against the spec, and atomicity under SIGKILL."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from pathswarm.node.model.model import new_module
from pathswarm.node.train.checkpoint import (
    CheckpointError,
    ModuleState,
    load_checkpoint,
    module_digest,
    owned,
    resolve_checkpoint_dir,
    save_checkpoint,
)
from pathswarm.protocol.rounds.outer import OuterState
from pathswarm.protocol.spec import ModelSpec, SwarmSpec

SPEC = SwarmSpec(model=ModelSpec(width=32, base_width=32, n_heads=2, layers_per_module=1, context_len=16))


def states(spec: SwarmSpec, round_: int, scale: float = 1.0) -> dict[str, ModuleState]:
    out = {}
    for mid in spec.module_ids((0, 1)):
        weights = {k: v * scale for k, v in new_module(spec, mid).state_dict().items()}
        numel = sum(v.numel() for v in weights.values())
        out[mid] = ModuleState(weights=weights, momentum=torch.full((numel,), 0.5 * round_), round=round_)
    return out


def test_round_trip_is_exact(tmp_path):
    saved = states(SPEC, 3)
    d = save_checkpoint(tmp_path, SPEC, 3, saved)
    assert d.name == "round-000003" and resolve_checkpoint_dir(tmp_path) == d
    ckpt = load_checkpoint(tmp_path, SPEC)
    assert ckpt.round == 3 and set(ckpt.modules) == set(saved)
    for mid, st in saved.items():
        got = ckpt.modules[mid]
        assert list(got.weights) == list(st.weights)  # parameter order preserved (flat vectors depend on it)
        assert all(torch.equal(got.weights[k], st.weights[k]) for k in st.weights)
        assert torch.equal(got.momentum, st.momentum)
        # The manifest digest equals the live OuterState digest of the same state.
        live = OuterState(anchor=st.flat_weights(), momentum=st.momentum, round=3)
        assert module_digest(got) == live.digest()
    manifest = json.loads((d / "manifest.json").read_text())
    assert manifest["swarm_id"] == SPEC.swarm_id


def test_a_worker_s_state_is_written_without_copies_beyond_what_safetensors_needs(
        tmp_path, synthetic_docs):
    """PathWorker.module_state hands the checkpoint its outer state's momentum as it is (an OuterState never
    changes: a round makes a new one) and weights copied once, and the write copies nothing again: at 1B
    parameters each needless copy is 4 GB held while a round is written."""
    from pathswarm.node.model.data import TokenSampler
    from pathswarm.node.train.worker import PathWorker

    sampler = TokenSampler(synthetic_docs, SPEC.model.context_len, seed=0)
    worker = PathWorker(SPEC, (0, 1), lambda: sampler.sample(2))
    mid = worker.module_ids[0]
    state = worker.module_state(mid)
    assert state.momentum is worker.outer[mid].momentum
    def same(a, b):
        return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()

    assert all(same(owned(v), v) for v in (*state.weights.values(), state.momentum))  # written as they are
    whole = torch.arange(6.0)
    assert same(owned(whole), whole) and not same(owned(whole[2:]), whole)
    assert owned(whole[2:]).untyped_storage().nbytes() == 4 * 4
    # what the file holds is the state as handed over, even after the worker moves on to another round
    written = {m: worker.module_state(m) for m in worker.module_ids}
    worker.train_inner(1)
    worker.outer[mid] = worker.outer[mid].stepped(worker.pseudo_grad(mid), SPEC.outer)
    save_checkpoint(tmp_path, SPEC, 0, written)
    got = load_checkpoint(tmp_path, SPEC).modules[mid]
    assert module_digest(got) == module_digest(written[mid]) != worker.outer[mid].digest()


def round_dirs(root) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name.startswith("round-"))


def test_latest_and_pruning(tmp_path):
    for r in (1, 2, 3):
        save_checkpoint(tmp_path, SPEC, r, states(SPEC, r))
    assert round_dirs(tmp_path) == ["round-000002", "round-000003"]
    assert load_checkpoint(tmp_path, SPEC).round == 3


def test_pruning_keeps_the_newest_written_rounds_not_the_highest_numbers(tmp_path):
    # A node that re-synced to an older round (a healed split) writes round 5 after round 11: pruning by name
    # used to delete the round just written and leave LATEST dangling.
    for r in (10, 11):
        save_checkpoint(tmp_path, SPEC, r, states(SPEC, r))
    time.sleep(0.01)  # distinct manifest times on coarse file systems
    save_checkpoint(tmp_path, SPEC, 5, states(SPEC, 5))
    assert round_dirs(tmp_path) == ["round-000005", "round-000011"]
    assert load_checkpoint(tmp_path, SPEC).round == 5


def test_a_dangling_latest_falls_back_to_the_newest_complete_round(tmp_path):
    for r in (1, 2):
        save_checkpoint(tmp_path, SPEC, r, states(SPEC, r))
    (tmp_path / "LATEST").write_text("round-000999\n")
    assert load_checkpoint(tmp_path, SPEC).round == 2
    for d in tmp_path.glob("round-*"):
        (d / "manifest.json").unlink()
    with pytest.raises(CheckpointError, match="no manifest"):
        load_checkpoint(tmp_path, SPEC)


def test_a_full_disk_keeps_the_last_complete_round(tmp_path, monkeypatch):
    import errno

    from pathswarm.node.train import checkpoint

    save_checkpoint(tmp_path, SPEC, 1, states(SPEC, 1))

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint, "save_file", full)
    with pytest.raises(OSError, match="No space"):
        save_checkpoint(tmp_path, SPEC, 2, states(SPEC, 2))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["LATEST", "round-000001"]  # no half-written round left
    assert load_checkpoint(tmp_path, SPEC).round == 1


def test_rejects_other_swarm_corruption_and_missing_modules(tmp_path):
    d = save_checkpoint(tmp_path, SPEC, 1, states(SPEC, 1))
    other = SPEC.replace(name="other")
    with pytest.raises(CheckpointError, match="belongs to swarm"):
        load_checkpoint(tmp_path, other)
    with pytest.raises(CheckpointError, match="missing"):
        load_checkpoint(tmp_path, SPEC, ["shared", "L0M1", "L1M0"])
    with pytest.raises(CheckpointError, match="not part of this swarm"):
        load_checkpoint(tmp_path, SPEC, ["L9M9"])
    f = d / "L1M1.safetensors"
    data = bytearray(f.read_bytes())
    data[-1] ^= 0xFF
    f.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="hash"):
        load_checkpoint(tmp_path, SPEC)
    with pytest.raises(CheckpointError, match="not found"):
        load_checkpoint(tmp_path / "nothing", SPEC)


def test_rejects_shape_mismatch(tmp_path):
    wide = SPEC.replace(model=ModelSpec(width=64, base_width=32, n_heads=2, layers_per_module=1, context_len=16))
    save_checkpoint(tmp_path, SPEC, 1, states(SPEC, 1))
    with pytest.raises(CheckpointError):
        load_checkpoint(tmp_path, wide)


WRITER = textwrap.dedent("""
    import sys, torch
    from pathswarm.node.train.checkpoint import ModuleState, save_checkpoint
    from pathswarm.node.model.model import new_module
    from pathswarm.protocol.spec import ModelSpec, SwarmSpec
    spec = SwarmSpec(model=ModelSpec(width=32, base_width=32, n_heads=2, layers_per_module=1, context_len=16))
    base = {mid: new_module(spec, mid).state_dict() for mid in spec.module_ids((0, 1))}
    r = 0
    while True:
        r += 1
        st = {mid: ModuleState({k: v + r for k, v in w.items()},
                               torch.full((sum(v.numel() for v in w.values()),), float(r)), r)
              for mid, w in base.items()}
        save_checkpoint(sys.argv[1], spec, r, st)
        if r == 2:
            print("ready", flush=True)
""")


@pytest.mark.parametrize("delay_s", [0.05, 0.2, 0.45])
def test_sigkill_while_writing_leaves_a_complete_round(tmp_path, delay_s):
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(delay_s)  # kill at an arbitrary moment of the write loop
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    ckpt = load_checkpoint(tmp_path, SPEC)
    assert ckpt.round >= 2
    r = ckpt.round
    assert all(torch.equal(st.momentum, torch.full_like(st.momentum, float(r))) for st in ckpt.modules.values())


def test_a_resuming_node_takes_back_the_path_its_checkpoint_holds(tmp_path):
    """A restarted node with path 'auto' claims its checkpoint's path at once (no settling wait), and a
    checkpoint of another swarm or of no single path gives no path."""
    from pathswarm.node.peer.node import Node, NodeConfig

    save_checkpoint(tmp_path / "mine", SPEC, 4, states(SPEC, 4))
    assert Node(NodeConfig(spec=SPEC, checkpoint_dir=str(tmp_path / "mine"))).checkpoints.path_held() == (0, 1)
    other = SPEC.replace(name="another swarm")
    assert Node(NodeConfig(spec=other, checkpoint_dir=str(tmp_path / "mine"))).checkpoints.path_held() is None
    assert Node(NodeConfig(spec=SPEC, checkpoint_dir=str(tmp_path / "none"))).checkpoints.path_held() is None
    partial = {mid: st for mid, st in states(SPEC, 2).items() if mid != "shared"}
    save_checkpoint(tmp_path / "partial", SPEC, 2, partial)
    assert Node(NodeConfig(spec=SPEC, checkpoint_dir=str(tmp_path / "partial"))).checkpoints.path_held() is None


def damage(kind: str, d) -> str:
    """Damage round directory `d` as a crash or a failing disk would; returns the name the WARN must give."""
    f = d / "L1M1.safetensors"
    if kind == "truncated":
        f.write_bytes(f.read_bytes()[:100])
        return f.name
    if kind == "missing":
        f.unlink()
        return f.name
    if kind == "bad manifest":
        (d / "manifest.json").write_text('{"format": 1, "swarm_id": ')
        return "manifest.json"
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["truncated", "missing", "bad manifest"])
def test_a_damaged_latest_round_falls_back_to_the_newest_intact_one_and_keeps_it(tmp_path, kind, caplog):
    """Issue 32: one truncated file in round-000004 made the node start from the seed, and the rounds it then wrote
    pruned the intact round-000003."""
    for r in (3, 4):
        save_checkpoint(tmp_path, SPEC, r, states(SPEC, r))
    bad = damage(kind, tmp_path / "round-000004")
    with caplog.at_level("WARNING", logger="pathswarm.node.train.checkpoint"):
        ckpt = load_checkpoint(tmp_path, SPEC)
    assert ckpt.round == 3 and ckpt.directory.name == "round-000003"
    assert torch.equal(ckpt.modules["L1M1"].momentum, states(SPEC, 3)["L1M1"].momentum)
    assert any(bad in r.message and "round-000003" in r.message for r in caplog.records), caplog.text
    # the node goes on from round 3 and writes round 4 again: both intact rounds are there, none was lost
    save_checkpoint(tmp_path, SPEC, 4, states(SPEC, 4, scale=2.0))
    assert round_dirs(tmp_path) == ["round-000003", "round-000004"]
    assert load_checkpoint(tmp_path / "round-000003", SPEC).round == 3
    assert load_checkpoint(tmp_path, SPEC).round == 4
    # a round directory named by the caller is loaded as it is: its damage is an error, not a fallback
    damage(kind, tmp_path / "round-000004")
    with pytest.raises(CheckpointError, match="L1M1|manifest"):
        load_checkpoint(tmp_path / "round-000004", SPEC)


def test_latest_naming_a_missing_round_or_missing_itself_falls_back(tmp_path, caplog):
    for r in (3, 4):
        save_checkpoint(tmp_path, SPEC, r, states(SPEC, r))
    (tmp_path / "LATEST").write_text("round-000007\n")
    with caplog.at_level("WARNING", logger="pathswarm.node.train.checkpoint"):
        assert load_checkpoint(tmp_path, SPEC).round == 4
    assert "round-000007" in caplog.text
    (tmp_path / "LATEST").unlink()
    assert load_checkpoint(tmp_path, SPEC).round == 4


def test_when_every_round_is_damaged_the_newest_rounds_error_is_raised(tmp_path):
    for r in (3, 4):
        save_checkpoint(tmp_path, SPEC, r, states(SPEC, r))
    damage("truncated", tmp_path / "round-000003")
    damage("missing", tmp_path / "round-000004")
    with pytest.raises(CheckpointError, match="round-000004.*missing"):
        load_checkpoint(tmp_path, SPEC)


def test_a_round_that_does_not_read_back_is_not_named_and_prunes_nothing(tmp_path, monkeypatch):
    from pathswarm.node.train import checkpoint

    for r in (1, 2):
        save_checkpoint(tmp_path, SPEC, r, states(SPEC, r))
    real_fsync_dir = checkpoint.fsync_dir

    def lossy_disk(root):  # the round is in place; one of its files did not reach the disk whole
        real_fsync_dir(root)
        f = root / "round-000003" / "shared.safetensors"
        f.write_bytes(f.read_bytes()[:-8])

    monkeypatch.setattr(checkpoint, "fsync_dir", lossy_disk)
    with pytest.raises(OSError, match="does not read back"):
        save_checkpoint(tmp_path, SPEC, 3, states(SPEC, 3))
    assert round_dirs(tmp_path) == ["round-000001", "round-000002"]
    assert (tmp_path / "LATEST").read_text().strip() == "round-000002"
