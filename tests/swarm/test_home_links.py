"""Sixteen real nodes on `home` links (tests/links.py: 20 Mbit/s up, 100 down, 40 ms between homes, 0.1 % loss at
each end, so 0.2 % from one home to another; a bootstrap peer on `fiber`), every node holding every module, rounds
in slices: replicas bit-identical at every (module, round), no split round, every node in every round of its modules
or counted late by itself."""

import pytest

from pathswarm.node.app.local_swarm import LocalSwarm
from pathswarm.node.app.replicas import replica_mismatches
from pathswarm.protocol.spec import AveragingSpec, InnerOptSpec

from ..conftest import tiny_spec, tokens_add_up
from ..links import PROFILES, Links, unavailable

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]  # 17 processes: `make test-slow`, in CI after the rest
NODES, ROUNDS = 16, 4


def absent_rounds(st: dict[str, dict]) -> dict[tuple[str, str], int]:
    """(node, module) → rounds of the module whose merged group (as any node recorded it) lacks the node."""
    groups: dict[str, dict[str, set[str]]] = {}
    for s in st.values():
        for mid, rounds in s["groups"].items():
            for r, peers in rounds.items():
                groups.setdefault(mid, {}).setdefault(r, set()).update(peers)
    return {(name, mid): sum(s["peer_id"] not in peers for peers in rounds.values())
            for name, s in st.items() for mid, rounds in groups.items()}


def test_sixteen_nodes_on_home_links_keep_identical_replicas_and_every_round(tmp_path):
    why = unavailable()
    if why:
        pytest.skip(why)
    spec = tiny_spec(width=64, base_width=64).replace(
        inner=InnerOptSpec(steps=10, batch_size=4, warmup_steps=2),
        averaging=AveragingSpec(grace_s=6.0, timeout_s=40.0, claim_ttl_s=20.0, slices=NODES))
    spec_path = tmp_path / "swarm.toml"
    spec_path.write_text(spec.to_toml())
    names = [f"n{i}" for i in range(NODES)]
    with Links([PROFILES["fiber"], *[PROFILES["home"]] * NODES]) as net, \
            LocalSwarm(spec_path, tmp_path / "run") as swarm:
        swarm.netns.update({"bootstrap": net.ns(0), **{name: net.ns(i + 1) for i, name in enumerate(names)}})
        swarm.start_bootstrap(args=["--swarm", str(spec_path), "--host-maddr", net.maddr(0)], timeout_s=120)
        for i, name in enumerate(names):
            swarm.start_node(name, path="0.0", max_rounds=ROUNDS, seed=i,
                             extra=["--wait-peers", str(NODES), "--host-maddr", net.maddr(i + 1)])
        codes = swarm.wait_nodes(names, timeout_s=540)
        assert codes == dict.fromkeys(names, 0), {n: swarm.tail(n, 10) for n, c in codes.items() if c}
        st = {n: tokens_add_up(swarm.status(n)) for n in names}
        counters = net.counters()
    mismatches, compared = replica_mismatches(list(st.values()))
    assert not mismatches and compared >= 3 * (ROUNDS - 1), (mismatches, compared)  # no split round
    for name, s in st.items():
        assert s["round"] == ROUNDS, (name, s["round"])
        assert s["val_loss_after"] < s["val_loss_before"], (name, s["val_loss_before"], s["val_loss_after"])
        wire = s["round_wire_s"]
        assert wire and all(t > 0 and 0 <= r < ROUNDS for ts in wire.values() for r, t in ts), wire
    # every node was merged into every round of its modules, or counted that round as late (or failed) itself
    for (name, mid), absent in absent_rounds(st).items():
        late, failed = st[name]["rounds_missed"].get(mid, [0, 0])
        assert absent <= late + failed, (name, mid, absent, late, failed)
    # the traffic went through the shaped links: every home node sent and received, and the reducers' work spread
    sent = [c["tx_bytes"] for c in counters[1:]]
    assert min(sent) > 0 and sum(s["tokens_reduced"] > 0 for s in st.values()) >= NODES // 2
