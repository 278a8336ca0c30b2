"""The in-process simulator: losses fall, replicas of every module stay bit-identical, modes agree on tokens,
and the CLI chain init → simulate → eval → generate works end to end on the synthetic corpus."""

import json
import time

import pytest
from click.testing import CliRunner

from pathswarm.node.app.cli import main
from pathswarm.node.train.simulate import SimConfig, run_simulation
from pathswarm.node.train.worker import PathWorker


def test_diloco_loss_falls_and_replicas_agree(spec, synthetic_docs):
    result = run_simulation(spec, SimConfig(mode="diloco", workers=3, rounds=3, inner_steps=8, eval_batches=2),
                            docs=synthetic_docs)
    assert len(result.rounds) == 3
    assert all(r["replicas_identical"] for r in result.rounds)
    before, after = result.val_loss_before["all"], result.val_loss_after["all"]
    assert after < 0.8 * before, (before, after)
    assert result.tokens_total == 3 * 3 * 8 * spec.inner.batch_size * spec.model.context_len
    # Outer gradients cross the wire as int8 + zstd: far less than fp32 data-parallel for the same steps.
    assert result.ddp_fp32_bytes_equivalent > 20 * result.bytes_sent_total


def test_overlapped_rounds_land_a_chunk_late_and_the_last_one_at_once(spec, synthetic_docs):
    """overlap: a round's mean is applied after a share of the next chunk's steps (on top of them), so the run differs
    from the plain one from round 2 on, and with the share, yet every round is applied, replicas agree, and the run
    still learns."""
    cfg = dict(mode="diloco", workers=3, rounds=4, inner_steps=6, eval_batches=2)
    plain = run_simulation(spec, SimConfig(**cfg), docs=synthetic_docs)
    late = run_simulation(spec, SimConfig(**cfg, overlap=1.0), docs=synthetic_docs)
    half = run_simulation(spec, SimConfig(**cfg, overlap=0.5), docs=synthetic_docs)
    assert half.replicas_identical and len({plain.val_loss_after["all"], half.val_loss_after["all"],
                                            late.val_loss_after["all"]}) == 3
    assert late.replicas_identical and late.tokens_total == plain.tokens_total
    assert all(max(map(int, h)) == cfg["rounds"] for h in plain.history.values())
    assert set(late.history) == set(plain.history)
    assert all(max(map(int, h)) == cfg["rounds"] for h in late.history.values())  # the last round landed too
    # Round 1's row: plain applied round 1; overlapped, nothing yet (the anchors are round 0's).
    assert late.rounds[0]["val_loss"]["all"] == pytest.approx(late.val_loss_before["all"])
    assert plain.rounds[0]["val_loss"]["all"] < plain.val_loss_before["all"]
    assert late.val_loss_after["all"] != plain.val_loss_after["all"]
    assert late.val_loss_after["all"] < 0.8 * late.val_loss_before["all"]
    with pytest.raises(ValueError, match="overlap"):
        SimConfig(mode="sync", overlap=1.0)
    with pytest.raises(ValueError, match="overlap"):
        SimConfig(mode="diloco", overlap=1.5)


def test_eager_updates_move_local_weights_only(spec, synthetic_docs):
    """`[outer] eager` (node/train/round.py `eager_shift`, past the outer warm-up): a worker trains the next chunk
    from where its own Δ moves the anchor, and the move is taken back out when the round lands: anchors stay
    identical across replicas, every round is applied, the run differs from plain overlap and learns."""
    import dataclasses

    spec = spec.replace(outer=dataclasses.replace(spec.outer, warmup_rounds=1))
    cfg = SimConfig(mode="diloco", workers=3, rounds=4, inner_steps=6, eval_batches=2, overlap=1.0)
    late = run_simulation(spec, cfg, docs=synthetic_docs)
    eager = run_simulation(spec.replace(outer=dataclasses.replace(spec.outer, eager=True)), cfg, docs=synthetic_docs)
    assert eager.replicas_identical and eager.tokens_total == late.tokens_total
    assert all(max(map(int, h)) == cfg.rounds for h in eager.history.values())
    # round 1 is the warm-up's (no move): the same anchors; from then on the runs part
    assert eager.rounds[1]["val_loss"] == late.rounds[1]["val_loss"]
    assert eager.val_loss_after["all"] != late.val_loss_after["all"]
    assert eager.val_loss_after["all"] < 0.8 * eager.val_loss_before["all"]
    # A mean that lands before any step of the next chunk (a share that rounds to no step): the move must come back
    # out whole, so eager and plain give the same anchors (to float rounding) at every row.
    soon = dataclasses.replace(cfg, overlap=0.05)
    plain = run_simulation(spec, soon, docs=synthetic_docs)
    moved = run_simulation(spec.replace(outer=dataclasses.replace(spec.outer, eager=True)), soon, docs=synthetic_docs)
    assert [r["val_loss"]["all"] for r in moved.rounds] == pytest.approx([r["val_loss"]["all"] for r in plain.rounds],
                                                                         abs=1e-4)


def test_dipaco_averages_each_module_only_among_its_holders(spec, synthetic_docs):
    events = []
    result = run_simulation(spec, SimConfig(mode="dipaco", rounds=2, inner_steps=5, eval_batches=2),
                            docs=synthetic_docs, on_event=lambda kind, info: events.append(kind))
    assert result.workers == spec.n_paths
    assert result.replicas_identical
    assert set(result.val_loss_after) == {"0.0", "0.1", "1.0", "1.1", "all"}
    assert result.val_loss_after["all"] < result.val_loss_before["all"]
    assert events.count("round") == 2 and events.count("inner_step") == 2 * 5 * spec.n_paths


def test_group_membership_follows_the_paths(spec, synthetic_docs):
    from pathswarm.node.model.data import TokenSampler

    sampler = TokenSampler(synthetic_docs, spec.model.context_len, seed=0)
    workers = [PathWorker(spec, p, lambda: sampler.sample(2), name=str(p)) for p in spec.paths()]
    holders = {mid: [w.path for w in workers if mid in w.module_ids] for mid in spec.all_module_ids()}
    assert holders["shared"] == spec.paths()
    assert holders["L0M1"] == [(1, 0), (1, 1)]
    assert holders["L1M0"] == [(0, 0), (1, 0)]


def test_sync_baseline_uses_the_same_tokens(spec, synthetic_docs):
    cfg = dict(workers=2, rounds=2, inner_steps=4, eval_batches=2)
    sync = run_simulation(spec, SimConfig(mode="sync", **cfg), docs=synthetic_docs)
    diloco = run_simulation(spec, SimConfig(mode="diloco", **cfg), docs=synthetic_docs)
    assert sync.tokens_total == diloco.tokens_total
    assert sync.val_loss_after["all"] < sync.val_loss_before["all"]


def test_bad_config_is_rejected(spec):
    with pytest.raises(ValueError, match="mode"):
        SimConfig(mode="allreduce")
    with pytest.raises(ValueError, match="one worker per path"):
        run_simulation(spec, SimConfig(mode="dipaco", workers=2, rounds=1))


def _init(runner: CliRunner, spec_path) -> object:
    """`swarm init` of a tiny synthetic spec at spec_path; the CLI's result."""
    return runner.invoke(main, ["swarm", "init", "-o", str(spec_path), "--corpus", "synthetic", "--width", "32",
                                "--base-width", "32", "--heads", "2", "--layers-per-module", "1",
                                "--context-len", "32", "--inner-steps", "4"])


def test_cli_init_simulate_eval_generate(tmp_path):
    runner = CliRunner()
    spec_path = tmp_path / "swarm.toml"
    res = _init(runner, spec_path)
    assert res.exit_code == 0, res.output
    assert "path" in res.output and spec_path.exists()
    out_json, ckpt = tmp_path / "sim.json", tmp_path / "ckpt"
    res = runner.invoke(main, ["simulate", "--spec", str(spec_path), "--rounds", "2", "--eval-batches", "2",
                               "--json", str(out_json), "--checkpoint-dir", str(ckpt)])
    assert res.exit_code == 0, res.output
    data = json.loads(out_json.read_text())
    assert len(data["rounds"]) == 2 and data["replicas_identical"] is True
    res = runner.invoke(main, ["eval", "--spec", str(spec_path), "--checkpoint", str(ckpt), "--batches", "2",
                               "--json", str(tmp_path / "eval.json")])
    assert res.exit_code == 0, res.output
    ev = json.loads((tmp_path / "eval.json").read_text())
    # eval re-scores the checkpoint with the same routed validation windows the simulator used.
    assert ev["all"] == pytest.approx(data["val_loss_after"]["all"], rel=1e-4)
    res = runner.invoke(main, ["generate", "--spec", str(spec_path), "--checkpoint", str(ckpt), "--prompt",
                               "def f(x):", "--max-bytes", "20"])
    assert res.exit_code == 0, res.output
    assert res.output.startswith("[path ") and "def f(x):" in res.output
    # A spec of another swarm cannot read this checkpoint: one line, exit 2.
    other = tmp_path / "other.toml"
    other.write_text(spec_path.read_text().replace('name = "pathswarm"', 'name = "other"'))
    res = runner.invoke(main, ["eval", "--spec", str(other), "--checkpoint", str(ckpt)])
    assert res.exit_code == 2 and "belongs to swarm" in res.output


def test_cli_simulate_overlap(tmp_path):
    runner = CliRunner()
    spec_path = tmp_path / "swarm.toml"
    res = _init(runner, spec_path)
    assert res.exit_code == 0, res.output
    out = tmp_path / "sim.json"
    res = runner.invoke(main, ["simulate", "--spec", str(spec_path), "--mode", "diloco", "--workers", "2",
                               "--rounds", "2", "--eval-batches", "2", "--overlap", "0.5", "--json", str(out)])
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    assert len(data["rounds"]) == 2 and data["replicas_identical"] is True
    res = runner.invoke(main, ["simulate", "--spec", str(spec_path), "--mode", "sync", "--overlap", "0.5"])
    assert res.exit_code == 2 and "overlap applies to the local-SGD modes" in res.output
    res = runner.invoke(main, ["simulate", "--spec", str(spec_path), "--overlap", "1.5"])
    assert res.exit_code == 2 and "--overlap" in res.output


def test_inner_training_never_rewrites_the_anchor(spec, synthetic_docs):
    """Regression: loading the anchor into the parameters must copy, not alias (torch's
    vector_to_parameters aliases, and training then silently changed every replica's anchor)."""
    import torch

    from pathswarm.node.model.data import TokenSampler

    sampler = TokenSampler(synthetic_docs, spec.model.context_len, seed=0)
    w = PathWorker(spec, (0, 0), lambda: sampler.sample(2))
    w.train_inner(2)
    for mid in w.module_ids:
        w.outer[mid] = w.outer[mid].stepped(w.pseudo_grad(mid), spec.outer)
        w.set_flat(mid, w.outer[mid].anchor)
    anchors = {mid: w.outer[mid].anchor.clone() for mid in w.module_ids}
    w.train_inner(2)
    for mid in w.module_ids:
        assert torch.equal(w.outer[mid].anchor, anchors[mid])
        assert not torch.equal(w.flat(mid), anchors[mid])


def test_swarm_init_picks_the_measured_round_defaults_by_shape(tmp_path):
    from pathswarm.protocol.spec import load_spec

    runner = CliRunner()
    small = ["--corpus", "synthetic", "--width", "32", "--base-width", "32", "--heads", "2",
             "--layers-per-module", "1", "--context-len", "32"]
    got = {}
    for levels, extra in (("1", []), ("2x2", []), ("2x2", ["--inner-steps", "40", "--outer-lr", "0.6"])):
        path = tmp_path / f"{levels}-{len(extra)}.toml"
        res = runner.invoke(main, ["swarm", "init", "-o", str(path), "--levels", levels, *small, *extra])
        assert res.exit_code == 0, res.output
        spec = load_spec(path)
        got[(levels, len(extra))] = (spec.inner.steps, spec.outer.lr)
        assert abs(spec.created - time.time()) < 600  # dated: peers bound round numbers by the swarm's age
    # one path (DiLoCo): H 50, lr 0.7; a grid (DiPaCo): H 25, lr 0.5; what the user passes wins
    assert got == {("1", 0): (50, 0.7), ("2x2", 0): (25, 0.5), ("2x2", 4): (40, 0.6)}
    res = runner.invoke(main, ["swarm", "init", "-o", str(tmp_path / "bad.toml"), *small, "--outer-lr", "0"])
    assert res.exit_code == 2 and "outer-lr" in res.output
    # rounds in slices: asked for, written in the spec; out of range, refused with the range
    res = runner.invoke(main, ["swarm", "init", "-o", str(tmp_path / "sliced.toml"), *small, "--slices", "16"])
    assert res.exit_code == 0 and load_spec(tmp_path / "sliced.toml").averaging.slices == 16, res.output
    assert load_spec(tmp_path / "1-0.toml").averaging.slices == 1
    res = runner.invoke(main, ["swarm", "init", "-o", str(tmp_path / "bad.toml"), *small, "--slices", "65"])
    assert res.exit_code == 2 and "1<=x<=64" in res.output, res.output


def test_swarm_init_writes_a_sparseloco_swarm(tmp_path):
    from pathswarm.protocol.spec import load_spec

    runner = CliRunner()
    small = ["--corpus", "synthetic", "--width", "32", "--base-width", "32", "--heads", "2",
             "--layers-per-module", "1", "--context-len", "32"]
    path = tmp_path / "loco.toml"
    res = runner.invoke(main, ["swarm", "init", "-o", str(path), *small, "--outer", "sparseloco",
                               "--sparse-percent", "3", "--beta", "0.9"])
    assert res.exit_code == 0, res.output
    spec = load_spec(path)
    assert (spec.outer.kind, spec.outer.beta, spec.codec.kind, spec.codec.feedback) == (
        "sparseloco", 0.9, "sparse", "buffer")
    assert spec.codec.k_per_chunk == round(0.03 * spec.codec.chunk_size)
    assert (spec.codec.value_bits, spec.codec.mean_k_per_chunk, spec.codec.mean_bits) == (2, 0, 3)  # as measured
    res = runner.invoke(main, ["swarm", "init", "-o", str(tmp_path / "x.toml"), *small, "--beta", "0.9"])
    assert res.exit_code == 2 and "go with --outer sparseloco" in res.output


def test_swarm_init_writes_eager_updates_with_half_the_outer_step(tmp_path):
    from pathswarm.protocol.spec import load_spec

    runner = CliRunner()
    small = ["--corpus", "synthetic", "--width", "32", "--base-width", "32", "--heads", "2",
             "--layers-per-module", "1", "--context-len", "32"]
    for levels, lr in (("1", 0.35), ("2x2", 0.25)):  # half of 0.7 (one path) and of 0.5 (a grid)
        path = tmp_path / f"eager-{levels}.toml"
        res = runner.invoke(main, ["swarm", "init", "-o", str(path), *small, "--levels", levels, "--eager"])
        assert res.exit_code == 0, res.output
        spec = load_spec(path)
        assert spec.outer.eager and spec.outer.lr == pytest.approx(lr)
    res = runner.invoke(main, ["swarm", "init", "-o", str(tmp_path / "lr.toml"), *small, "--eager",
                               "--outer-lr", "0.4"])
    assert res.exit_code == 0 and load_spec(tmp_path / "lr.toml").outer.lr == pytest.approx(0.4), res.output
    res = runner.invoke(main, ["swarm", "init", "-o", str(tmp_path / "plain.toml"), *small, "--levels", "1"])
    plain = load_spec(tmp_path / "plain.toml").outer
    assert res.exit_code == 0 and not plain.eager and plain.lr == pytest.approx(0.7), res.output
    res = runner.invoke(main, ["swarm", "init", "-o", str(tmp_path / "x.toml"), *small, "--eager",
                               "--outer", "sparseloco"])
    assert res.exit_code == 2 and "--eager goes with --outer nesterov" in res.output, res.output
