"""SparseLoCo on real nodes (`[outer] kind = "sparseloco"`, sparse frames both ways): three node processes on
127.0.0.1 train with identical replicas (the mean's top-k bytes decoded alike by every member, checked before applying
and audited), no honest mean taken for a lie, most tokens merged, and the loss falls. (The bound a member puts on a
reducer's mean, from what its own frame carries: tests/unit/test_sparseloco.py.)"""

import pytest

from pathswarm.node.app.local_swarm import LocalSwarm
from pathswarm.node.app.replicas import replica_mismatches
from pathswarm.protocol.spec import AveragingSpec, CodecSpec, InnerOptSpec, OuterOptSpec

from ..conftest import tiny_spec, tokens_add_up

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]  # ~30 s


def test_three_nodes_train_with_sparseloco(tmp_path):
    spec = tiny_spec().replace(
        inner=InnerOptSpec(steps=20, batch_size=4, warmup_steps=2),
        averaging=AveragingSpec(grace_s=4.0, timeout_s=20.0, claim_ttl_s=8.0),
        codec=CodecSpec(kind="sparse", feedback="buffer", k_per_chunk=410, value_bits=2, mean_k_per_chunk=410,
                        mean_bits=2),
        outer=OuterOptSpec(kind="sparseloco", beta=0.9, lr=1.0))
    spec_path = tmp_path / "swarm.toml"
    spec_path.write_text(spec.to_toml())
    paths = {"a": "0.0", "b": "0.0", "c": "0.1"}
    with LocalSwarm(spec_path, tmp_path / "run") as swarm:
        swarm.start_bootstrap()
        for i, (name, path) in enumerate(paths.items()):
            swarm.start_node(name, path=path, max_rounds=5, seed=i, extra=["--wait-peers", "3"])
        codes = swarm.wait_nodes(list(paths), timeout_s=200)
        assert codes == dict.fromkeys(paths, 0), [swarm.tail(n, 10) for n in paths]
        st = {n: tokens_add_up(swarm.status(n)) for n in paths}
        logs = {n: (swarm.workdir / f"{n}.log").read_text() for n in paths}
    mismatches, compared = replica_mismatches(list(st.values()))
    assert not mismatches and compared >= 10, (mismatches, compared)
    for name in paths:
        assert st[name]["distrusted"] == {} and "lie" not in logs[name], logs[name][-3000:]
        assert st[name]["tokens_merged"] >= 0.5 * st[name]["tokens_trained"], st[name]
    before = sum(st[n]["val_loss_before"] for n in paths) / 3
    after = sum(st[n]["val_loss_after"] for n in paths) / 3
    assert after < 0.9 * before, (before, after)
