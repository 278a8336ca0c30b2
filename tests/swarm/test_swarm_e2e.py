"""End to end: real `pathswarm` processes (bootstrap + nodes) on 127.0.0.1 over hivemind's p2pd.

No mocks: every node is a CLI subprocess; synchronisation is on ready/status files. Asserted:
group membership follows the module holders, every (module, round) digest agrees across replicas,
validation loss falls, a late joiner syncs to the current round, a SIGKILLed peer does not stall
the others beyond the grace window, SIGTERM exits 0 with a loadable checkpoint, nothing is left running.
"""

import json
import signal
import subprocess
import sys
import time

import pytest

from pathswarm.node.app.local_swarm import LocalSwarm
from pathswarm.node.app.replicas import check_replicas, replica_mismatches
from pathswarm.node.train.checkpoint import load_checkpoint
from pathswarm.protocol.spec import AveragingSpec, InnerOptSpec

from ..conftest import tiny_spec, tokens_add_up, wait_until

pytestmark = pytest.mark.timeout(240)

GRACE_S = 4.0
TOKENS_PER_ROUND = 20 * 4 * 32  # inner steps x batch x context of the spec below


def p2pd_processes(swarm: LocalSwarm) -> list[str]:
    """p2pd daemons still alive in the process groups this swarm started."""
    pids = [p.pid for p in [*swarm.nodes.values(), swarm.bootstrap] if p is not None]
    out = subprocess.run(["ps", "-eo", "pgid,comm"], capture_output=True, text=True).stdout.splitlines()[1:]
    return [line for line in out if line.split()[0].isdigit() and int(line.split()[0]) in pids and "p2pd" in line]


@pytest.fixture(scope="module")
def spec_path(tmp_path_factory):
    spec = tiny_spec().replace(inner=InnerOptSpec(steps=20, batch_size=4, warmup_steps=2),
                               averaging=AveragingSpec(grace_s=GRACE_S, timeout_s=20.0, claim_ttl_s=8.0))
    path = tmp_path_factory.mktemp("spec") / "swarm.toml"
    path.write_text(spec.to_toml())
    return path


def test_three_nodes_train_with_identical_replicas(spec_path, tmp_path):
    from pathswarm.protocol.spec import load_spec

    spec = load_spec(spec_path)
    swarm = LocalSwarm(spec_path, tmp_path)
    try:
        swarm.start_bootstrap()
        paths = {"a": "0.0", "b": "0.1", "c": "1.1"}
        for i, (name, path) in enumerate(paths.items()):
            swarm.start_node(name, path=path, max_rounds=4, seed=i, extra=["--wait-peers", "3"])
        codes = swarm.wait_nodes(list(paths), timeout_s=180)
        assert codes == {"a": 0, "b": 0, "c": 0}, [swarm.tail(n) for n in paths]
        st = {n: tokens_add_up(swarm.status(n)) for n in paths}
        peer = {n: st[n]["peer_id"] for n in paths}
        assert {n: st[n]["path"] for n in paths} == paths
        mismatches, compared = replica_mismatches(list(st.values()))
        assert not mismatches and compared >= 8, (mismatches, compared)
        holders = {"shared": set(peer.values()), "L0M0": {peer["a"], peer["b"]}, "L1M1": {peer["b"], peer["c"]},
                   "L1M0": {peer["a"]}, "L0M1": {peer["c"]}}
        for name in paths:
            for mid, rounds in st[name]["groups"].items():
                for members in rounds.values():
                    assert set(members) <= holders[mid], (mid, members)  # only the module's holders merge it
        # Every holder was merged together in at least one round of each shared module.
        for mid in ("shared", "L0M0", "L1M1"):
            assert any(set(m) == holders[mid] for m in st["b"]["groups"][mid].values()), st["b"]["groups"][mid]
        for name in paths:
            assert st[name]["round"] == 4
            # every token trained is merged or accounted as not yet merged (carried to the next round)
            assert st[name]["tokens_trained"] >= 2 * TOKENS_PER_ROUND  # a late round shortens the next to H/2
            assert st[name]["tokens_merged"] + st[name]["tokens_unmerged"] == st[name]["tokens_trained"], st[name]
            assert st[name]["tokens_merged"] >= 0.5 * st[name]["tokens_trained"], st[name]
            # (CI once saw 5.55 -> 8.17 here, before the outer warm-up rounds: the message keeps what would explain it)
            assert st[name]["val_loss_after"] < st[name]["val_loss_before"], {
                k: st[name][k] for k in ("val_loss_before", "val_loss_after", "loss_curve", "groups", "rounds_failed",
                                         "digest_mismatches", "splits_healed", "tokens_merged", "tokens_unmerged")}
        # Every token a member heard merged was counted by the reducer that merged it (reducers also count members
        # that never heard back, none here unless a member's last round outlived its reducer).
        reduced, merged = (sum(st[n][k] for n in paths) for k in ("tokens_reduced", "tokens_merged"))
        assert merged > 0 and reduced >= merged, (reduced, merged)
        # Routed validation loss of the swarm (mean over the three paths) falls by at least 25 %.
        before = sum(st[n]["val_loss_before"] for n in paths) / 3
        after = sum(st[n]["val_loss_after"] for n in paths) / 3
        assert after < 0.75 * before, (before, after)
        for name in paths:
            ckpt = load_checkpoint(swarm.node_files(name)["checkpoint"], spec)
            assert set(ckpt.modules) == set(spec.module_ids(tuple(int(x) for x in paths[name].split("."))))
    finally:
        swarm.close()
    assert p2pd_processes(swarm) == []


@pytest.mark.slow  # 45 s: with the slow ones (`make test-slow`, in CI after the default suite)
def test_late_join_sigkill_and_sigterm(spec_path, tmp_path):
    from pathswarm.protocol.spec import load_spec

    spec = load_spec(spec_path)
    swarm = LocalSwarm(spec_path, tmp_path)
    try:
        swarm.start_bootstrap()
        # a and b meet before training (otherwise each may close its first rounds alone, a split that
        # re-syncing heals but that leaves two digests for those rounds in the history).
        swarm.start_node("a", path="0.0", seed=0, extra=["--wait-peers", "2"])
        swarm.start_node("b", path="1.0", seed=1, extra=["--wait-peers", "2"])
        wait_until(lambda: (swarm.status("a") or {}).get("round", 0) >= 2, 120, "node a to finish 2 rounds")
        # A late joiner on a's path downloads the current state and joins the next groups.
        round_at_join = swarm.status("a")["module_rounds"]["L0M0"]
        swarm.start_node("c", path="0.0", seed=2)
        swarm.wait_ready("c")
        a_id = swarm.status("a")["peer_id"]

        def merged_with_a():
            # Its first rounds may close before a's contribution arrives (a is then late and shifts its phase).
            s = swarm.status("c")
            return s and s.get("round", 0) >= 2 and any(a_id in m and s["peer_id"] in m
                                                         for m in s["groups"].get("L0M0", {}).values()) and s

        c = wait_until(merged_with_a, 120, "node c to merge a round of L0M0 with a")
        assert min(int(r) for r in c["history"]["L0M0"]) > round_at_join  # started from the synced round
        # `swarm status` reads the same picture from the DHT records the nodes publish.
        status_json = tmp_path / "status.json"
        proc = subprocess.run([sys.executable, "-m", "pathswarm", "swarm", "status", "--swarm", str(spec_path),
                               "--initial-peer", swarm.maddr, "--json", str(status_json)],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr[-2000:]
        view = json.loads(status_json.read_text())
        assert view["totals"]["nodes"] == 3
        by_path = {p["path"]: p for p in view["paths"]}
        assert sorted(by_path["0.0"]["nodes"]) == sorted([a_id, c["peer_id"]])
        assert by_path["1.0"]["nodes"] == [swarm.status("b")["peer_id"]]
        assert by_path["0.1"]["nodes"] == [] and view["totals"]["paths_served"] == 2
        modules = {m["module"]: m for m in view["modules"]}
        assert modules["L0M0"]["round"] >= round_at_join and modules["L0M0"]["holders"] >= 2
        assert modules["L1M1"]["round"] is None and modules["L0M1"]["holders"] == 1  # 0.0 and 1.0 only
        # SIGKILL b mid-round: a and c keep finishing rounds, waiting at most the grace window for b.
        swarm.signal("b", signal.SIGKILL)
        # Rounds merged, counted by the module's round (a node's own round count also counts rounds that failed).
        killed_at, round_a = time.monotonic(), swarm.status("a")["module_rounds"]["shared"]
        wait_until(lambda: swarm.status("a")["module_rounds"]["shared"] >= round_a + 2, 60,
                   "node a to go on after b died")
        round_time = killed_at and (time.monotonic() - killed_at) / 2
        assert round_time < 20 + GRACE_S, round_time
        check = check_replicas([swarm.status(n) for n in ("a", "b", "c")])
        # A reducer killed just after closing a round with some members leaves the others to close it again without
        # it (protocol/rounds/reducers.py, "what remains possible"; seen once here: b merged L1M0's round with c, a's
        # contribution came after, a found b dead and merged it alone, and a and c then each held another state).
        # So: no split before b's last round, and the survivors come back to one version (the split watch heals it).
        b_status = tokens_add_up(swarm.status("b"))  # the status file b wrote last before the kill adds up
        last_b = {m: max(map(int, rounds)) for m, rounds in b_status["history"].items() if rounds}
        early = [str(m) for m in check.splits if int(m.round) < last_b.get(m.module, 1 << 62)]
        assert check.digests_compared > 0 and not early, (early, [swarm.tail(n) for n in ("a", "b", "c")])

        def healed() -> bool:
            sa, sc = swarm.status("a"), swarm.status("c")
            for m in ("shared", "L0M0", "L1M0"):  # a and c are both on path 0.0
                common = set(sa["history"].get(m, {})) & set(sc["history"].get(m, {}))
                last = max(common, key=int, default=None)
                if last is None or sa["history"][m][last] != sc["history"][m][last]:
                    return False
            return True

        wait_until(healed, 60, "a and c to hold one version of their latest common round of every module")
        # SIGTERM: a leaves within seconds with exit code 0 and a loadable checkpoint.
        swarm.signal("a", signal.SIGTERM)
        assert swarm.wait_nodes(["a"], timeout_s=30) == {"a": 0}
        ckpt = load_checkpoint(swarm.node_files("a")["checkpoint"], spec)
        assert ckpt.round >= round_a + 2
    finally:
        swarm.close()
    assert p2pd_processes(swarm) == []
