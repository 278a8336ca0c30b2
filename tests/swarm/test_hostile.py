"""Hostile peers against real nodes on 127.0.0.1 (docs/SECURITY.md): each attack fails, honest replicas agree.

The hostile behaviour lives in tests/hostile_peer.py, a separate process that speaks the protocol.
"""

import json
import subprocess
import sys

import pytest

from pathswarm.node.app.local_swarm import LocalSwarm
from pathswarm.node.app.replicas import replica_mismatches
from pathswarm.protocol.spec import AveragingSpec, InnerOptSpec

from ..conftest import tiny_spec

pytestmark = pytest.mark.timeout(240)

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]


def test_a_peer_claiming_a_later_round_cannot_replace_a_modules_state(tmp_path):
    spec = tiny_spec().replace(inner=InnerOptSpec(steps=10, batch_size=4, warmup_steps=2),
                               averaging=AveragingSpec(grace_s=3.0, timeout_s=10.0, claim_ttl_s=8.0))
    spec_path = tmp_path / "swarm.toml"
    spec_path.write_text(spec.to_toml())
    swarm = LocalSwarm(spec_path, tmp_path / "swarm")
    try:
        swarm.start_bootstrap()
        paths = {"a": "0.0", "b": "0.1"}  # both hold `shared` and L0M0
        for i, (name, path) in enumerate(paths.items()):
            swarm.start_node(name, path=path, max_rounds=10, seed=i,
                             extra=["--wait-peers", "2", "--max-tokens-per-s", "1280"])
        report = tmp_path / "hostile.json"
        hostile = subprocess.run(
            [sys.executable, "-m", "tests.hostile_peer", str(spec_path), swarm.maddr,
             str(swarm.node_files("a")["status.json"]), str(report), "12"],
            cwd=ROOT, capture_output=True, text=True, timeout=180)
        assert hostile.returncode == 0, hostile.stderr[-3000:]
        codes = swarm.wait_nodes(list(paths), timeout_s=150)
        assert codes == {"a": 0, "b": 0}, [swarm.tail(n, 10) for n in paths]
        attack = json.loads(report.read_text())
        st = {n: swarm.status(n) for n in paths}
        mismatches, compared = replica_mismatches(list(st.values()))
        assert not mismatches and compared >= 10, (mismatches, compared)
        for s in st.values():
            assert attack["forged_digest"] not in s["history"].get("shared", {}).values()
            assert s["module_rounds"]["shared"] < attack["forged_round"]
            assert s["val_loss_after"] < s["val_loss_before"] - 0.5, s
        # The attack was delivered: the victim read the claimed later round and answered "behind", the answer on which
        # it used to re-sync from the sender; it never took the forged round as its own (with the old rule it did,
        # then merged the hostile peer's next contributions "alone" at round 51: checked by reverting the rule).
        assert attack["answers"].get("behind", 0) >= 3 and set(attack["answers"]) <= {"behind", "failed"}, attack
        assert "not re-syncing" in (tmp_path / "swarm" / "a.log").read_text()
    finally:
        swarm.close()
