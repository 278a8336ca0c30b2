"""The simulator is the node: a live 2-node swarm and `run_simulation`, given the same spec, seeds and data, end
round 2 with bit-identical module digests.

Both run the round rule of node/train/round.py; this test proves nothing else differs (data streams, init,
inner steps, codec, error feedback, the reducer's merge, the outer step). Timing is pinned so that it cannot
decide anything: the spec has one path (both nodes hold every module, so every holder is in every group), and
the nodes run with `--sync-rounds`, so each round waits for both members and each mean is applied before the
next inner step, which is what the simulator models (a decoupled node applies it a few steps later instead).
"""

import pytest
import torch

from pathswarm.node.app.local_swarm import LocalSwarm
from pathswarm.node.app.swarm_init import init_spec
from pathswarm.node.model.data import synthetic_corpus
from pathswarm.node.train.simulate import SimConfig, run_simulation
from pathswarm.protocol.spec import AveragingSpec, DataSpec, InnerOptSpec, ModelSpec, SwarmSpec

pytestmark = pytest.mark.timeout(240)

ROUNDS = 2


def one_path_spec() -> SwarmSpec:
    base = SwarmSpec(name="sim-is-node", levels=(1,),
                     model=ModelSpec(width=32, base_width=32, n_heads=2, layers_per_module=1, context_len=32),
                     inner=InnerOptSpec(steps=6, batch_size=4, warmup_steps=2), data=DataSpec(corpus="synthetic"),
                     averaging=AveragingSpec(grace_s=20.0, timeout_s=60.0, claim_ttl_s=10.0))
    return init_spec(base, synthetic_corpus(200, seed=0))


def test_a_live_swarm_and_the_simulator_end_round_2_bit_identical(tmp_path):
    spec = one_path_spec()
    spec_path = tmp_path / "swarm.toml"
    spec_path.write_text(spec.to_toml())
    swarm = LocalSwarm(spec_path, tmp_path / "swarm", threads=1)
    try:
        swarm.start_bootstrap()
        for i, name in enumerate(("a", "b")):  # node i's data stream is seeded i, as the simulator's worker i
            swarm.start_node(name, path="0", max_rounds=ROUNDS, seed=i, extra=["--wait-peers", "2", "--sync-rounds"])
        codes = swarm.wait_nodes(["a", "b"], timeout_s=180)
        assert codes == {"a": 0, "b": 0}, [swarm.tail(n) for n in ("a", "b")]
        status = {n: swarm.status(n) for n in ("a", "b")}
    finally:
        swarm.close()

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the nodes (--threads 1): the same kernels, the same bits
    try:
        sim = run_simulation(spec, SimConfig(mode="diloco", workers=2, rounds=ROUNDS, seed=0, eval_batches=1))
    finally:
        torch.set_num_threads(threads)

    assert sim.replicas_identical
    for n, st in status.items():
        assert st["round"] == ROUNDS, st
        for mid in spec.all_module_ids():
            assert len(st["groups"][mid][str(ROUNDS)]) == 2, st["groups"]  # both in the round: pinned
            assert st["history"][mid][str(ROUNDS)] == sim.history[mid][str(ROUNDS)], (n, mid)
            assert st["history"][mid]["1"] == sim.history[mid]["1"], (n, mid)
