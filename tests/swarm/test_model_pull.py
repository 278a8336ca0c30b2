"""`pathswarm model pull` from a live swarm of real node processes on 127.0.0.1.

While two nodes serve paths 0.0 and 0.1, module L0M1 has no holder: the pull fails naming it and its paths, and
keeps the four modules it could have. Once nodes on 1.0 and 1.1 train too, the same command resumes (the kept
modules stay, L0M1 comes), and a fresh pull takes every module from the running swarm without stopping anyone. Each
pulled module is bit-identical to what its holder saved at the same round, and each path's routed validation loss
on the pulled model equals the loss on that path's node's own saved modules.
"""

import signal
import time

import pytest

from pathswarm.node.app.local_swarm import LocalSwarm
from pathswarm.node.train.checkpoint import Checkpoint, complete_rounds, load_checkpoint, load_round, module_digest
from pathswarm.node.train.evaluate import routed_eval
from pathswarm.protocol.spec import AveragingSpec, InnerOptSpec, parse_path

from ..conftest import cli, tiny_spec, wait_until

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]  # ~50 s: in `make test-slow` (CI runs it after the suite)

PATHS = {"a": "0.0", "b": "0.1", "c": "1.0", "d": "1.1"}
# ~2,560 tokens a round at 300 tokens/s: a round takes ~8 s, so a node's two kept checkpoint rounds still hold each
# module's state as pulled (modules are pulled one after another, a few seconds before the nodes are stopped; at
# 4 s a round, a module pulled first had once left both kept rounds)
THROTTLE = ["--max-tokens-per-s", "300"]


def trained(swarm, names, rounds=1):
    return all((swarm.status(n) or {}).get("round", 0) >= rounds for n in names)


def test_pull_from_a_live_swarm(tmp_path):
    spec = tiny_spec().replace(inner=InnerOptSpec(steps=20, batch_size=4, warmup_steps=2),
                               averaging=AveragingSpec(grace_s=4.0, timeout_s=20.0, claim_ttl_s=8.0))
    spec_path = tmp_path / "swarm.toml"
    spec_path.write_text(spec.to_toml())
    swarm = LocalSwarm(spec_path, tmp_path / "swarm")
    model = tmp_path / "model"
    try:
        swarm.start_bootstrap()
        for i, name in enumerate("ab"):
            swarm.start_node(name, path=PATHS[name], seed=i, extra=["--wait-peers", "2", *THROTTLE])
        wait_until(lambda: trained(swarm, "ab"), 120, "a and b to train a round")
        pull = ["model", "pull", "--swarm", str(spec_path), "--initial-peer", swarm.maddr, "-o", str(model)]

        # L0M1 (paths 1.0 and 1.1) has no holder: one clear error, and what could be had is kept
        proc = cli(*pull, "--patience-s", "2")
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert "module L0M1 (paths 1.0, 1.1): no node claims" in proc.stderr, proc.stderr
        assert sorted(p.name for p in (model / ".pull").iterdir()) == [
            f"{m}.safetensors" for m in ("L0M0", "L1M0", "L1M1", "shared")], proc.stderr

        for i, name in enumerate("cd", start=2):
            swarm.start_node(name, path=PATHS[name], seed=i, extra=THROTTLE)
        wait_until(lambda: trained(swarm, "cd"), 120, "c and d to train a round")
        proc = cli(*pull)  # resumes: four kept, L0M1 downloaded
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert proc.stderr.count("kept from the interrupted pull") == 4 and "L0M1: round" in proc.stderr
        assert not (model / ".pull").exists()

        fresh = tmp_path / "fresh"
        t0 = time.monotonic()
        proc = cli(*pull[:-1], str(fresh))
        took = time.monotonic() - t0
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "kept" not in proc.stderr and proc.stderr.count("holders vouch") == 5, proc.stderr
        print(f"model pull of a live 2x2 swarm (4 nodes, CLI process start included): {took:.1f} s")
        assert sorted(swarm.running()) == ["a", "b", "c", "d"]  # nobody stopped for it
        for name in PATHS:  # stop them now: their last two checkpoint rounds hold what was pulled
            swarm.signal(name, signal.SIGTERM)
        assert swarm.wait_nodes(list(PATHS), timeout_s=60) == dict.fromkeys(PATHS, 0)
    finally:
        swarm.close()

    for pulled_dir in (model, fresh):
        pulled = load_checkpoint(pulled_dir, spec)
        assert set(pulled.modules) == set(spec.all_module_ids())
        assert pulled.provenance["kind"] == "pull" and pulled.provenance["tokens_trained"] > 0
    pulled = load_checkpoint(fresh, spec)
    ours = {p.path: p.loss for p in routed_eval(spec, pulled, max_batches=2)[0]}
    for name, path_text in PATHS.items():
        path = parse_path(path_text, spec)
        mids = spec.module_ids(path)
        want = {mid: (pulled.modules[mid].round, module_digest(pulled.modules[mid])) for mid in mids}
        kept = [load_round(d, spec) for d in complete_rounds(swarm.node_files(name)["checkpoint"])]
        # each module as the node itself saved it at the round pulled (modules are pulled a moment apart, so they may
        # come from different kept rounds)
        own = {m: next((k.modules[m] for k in kept
                        if (k.modules[m].round, module_digest(k.modules[m])) == want[m]), None) for m in mids}
        assert None not in own.values(), (name, want, [{m: k.modules[m].round for m in mids} for k in kept])
        node_own = Checkpoint(spec.swarm_id, 0, own, kept[-1].directory)
        rows, _ = routed_eval(spec, node_own, max_batches=2)
        assert {r.path: r.loss for r in rows} == {path_text: ours[path_text]}
