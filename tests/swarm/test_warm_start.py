"""A warm-started swarm with real node processes: round 0 is the creator's trained weights, named by the spec.

The creator's node loads round 0 from `--init`; a second node without it downloads round 0 from the first and
checks it against the spec's digests; both then train and stay bit-identical. A node given weights that are not
the spec's round 0 refuses to start, and so does one that has no --init and no peer to download from.
"""

import shutil

import pytest

from pathswarm.node.app.local_swarm import LocalSwarm
from pathswarm.node.app.replicas import replica_mismatches
from pathswarm.node.model.data import synthetic_corpus
from pathswarm.node.train.checkpoint import save_checkpoint
from pathswarm.node.train.warm_start import module_states, warm_start, warm_started
from pathswarm.protocol.spec import AveragingSpec, InnerOptSpec

from ..conftest import tiny_spec

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def warm(tmp_path_factory):
    root = tmp_path_factory.mktemp("warm")
    base = tiny_spec().replace(inner=InnerOptSpec(steps=10, batch_size=4, warmup_steps=2),
                               averaging=AveragingSpec(grace_s=3.0, timeout_s=20.0, claim_ttl_s=8.0))
    docs = synthetic_corpus(200, seed=0)  # the corpus tiny_spec's router was fitted on
    spec, weights = warm_started(base, docs, steps=40)
    save_checkpoint(root / "init", spec, 0, module_states(spec, weights))
    # Another round 0 in the same layout: a checkpoint of this swarm whose weights are not the spec's.
    save_checkpoint(root / "forged", spec, 0, module_states(spec, warm_start(base, docs, steps=3)))
    (root / "swarm.toml").write_text(spec.to_toml())
    return root


def test_round_zero_comes_from_init_or_a_peer_and_is_checked(warm, tmp_path):
    swarm = LocalSwarm(warm / "swarm.toml", tmp_path)
    try:
        swarm.start_bootstrap()
        swarm.start_node("creator", path="0.0", max_rounds=2, extra=["--init", str(warm / "init"), "--wait-peers", "2"])
        swarm.start_node("joiner", path="0.0", max_rounds=2, seed=1, extra=["--wait-peers", "2"])
        codes = swarm.wait_nodes(["creator", "joiner"], timeout_s=150)
        assert codes == {"creator": 0, "joiner": 0}, [swarm.tail(n, 10) for n in ("creator", "joiner")]
        st = {n: swarm.status(n) for n in ("creator", "joiner")}
        # Same round 0 (downloaded and checked), same path, same validation windows: the same loss before training,
        # far below the seed init's ln(256) = 5.545.
        assert st["joiner"]["val_loss_before"] == st["creator"]["val_loss_before"] < 5.0, st
        assert "from peer" in (tmp_path / "joiner.log").read_text()
        mismatches, compared = replica_mismatches(list(st.values()))
        assert not mismatches and compared >= 3, (mismatches, compared)
        assert all(s["round"] == 2 for s in st.values())
    finally:
        swarm.close()


def test_weights_that_are_not_the_specs_round_zero_are_refused(warm, tmp_path):
    swarm = LocalSwarm(warm / "swarm.toml", tmp_path)
    try:
        swarm.start_node("forger", path="0.0", max_rounds=1, extra=["--init", str(warm / "forged"), "--offline"])
        swarm.start_node("lonely", path="0.1", max_rounds=1, extra=["--offline"])
        codes = swarm.wait_nodes(["forger", "lonely"], timeout_s=120)
        assert codes == {"forger": 2, "lonely": 2}, [swarm.tail(n, 5) for n in ("forger", "lonely")]
        assert "round-0 weights have digest" in swarm.tail("forger", 5)
        assert "pass --init DIR" in swarm.tail("lonely", 5)
        assert not (tmp_path / "forger-checkpoint").exists() or not any((tmp_path / "forger-checkpoint").iterdir())
    finally:
        swarm.close()
        shutil.rmtree(tmp_path, ignore_errors=True)
