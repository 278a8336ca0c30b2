"""Joining by swarm id, several bootstrap peers, the public swarm file and `swarm status`, end to end.

Real `pathswarm` CLI processes on 127.0.0.1 (bootstrap peers and nodes over p2pd); nothing mocked.
"""

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pathswarm.node.app.local_swarm import LocalSwarm
from pathswarm.node.app.replicas import replicas_identical
from pathswarm.protocol.spec import AveragingSpec, InnerOptSpec

from ..conftest import cli, error_line, tiny_spec, wait_until

pytestmark = pytest.mark.timeout(240)








@pytest.fixture(scope="module")
def spec():
    return tiny_spec().replace(name="join-test", inner=InnerOptSpec(steps=10, batch_size=4, warmup_steps=2),
                               averaging=AveragingSpec(grace_s=4.0, timeout_s=20.0, claim_ttl_s=8.0))


@pytest.fixture
def home(tmp_path, monkeypatch):
    """Each test gets its own data directory (identities, cached specs) for all its processes."""
    monkeypatch.setenv("PATHSWARM_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_join_by_id_trains_and_status_matches_the_nodes(spec, tmp_path, home):
    spec_path = tmp_path / "swarm.toml"
    spec_path.write_text(spec.to_toml())
    with LocalSwarm(spec_path, tmp_path / "run") as swarm:
        maddr = swarm.start_bootstrap()
        log = (tmp_path / "run" / "bootstrap.log").read_text()
        assert f"join with: pathswarm node run --join {spec.swarm_id} --initial-peer {maddr}" in log
        join = ["--join", spec.swarm_id]
        for i, name in enumerate(("a", "b")):
            swarm.start_node(name, swarm_args=join, seed=i, extra=["--wait-peers", "2"])
        for name in ("a", "b"):
            swarm.wait_ready(name)
        # The spec was fetched from the swarm, checked against the id, and cached for restarts.
        cached = home / "swarms" / f"{spec.swarm_id}.toml"
        assert cached.read_text() == spec.to_toml()
        wait_until(lambda: all((swarm.status(n) or {}).get("round", 0) >= 2 for n in ("a", "b")), 180,
                   "two rounds on both nodes")
        out = tmp_path / "status.json"
        plot = tmp_path / "status.png"
        proc = cli("swarm", "status", "--join", spec.swarm_id, "--initial-peer", maddr, "--json", str(out),
                   "--plot", str(plot))
        assert proc.returncode == 0, proc.stderr[-2000:]
        statuses = {n: swarm.status(n) for n in ("a", "b")}
        for n in ("a", "b"):
            swarm.signal(n, signal.SIGTERM)
        assert swarm.wait_nodes(["a", "b"], timeout_s=90) == {"a": 0, "b": 0}
        final = [swarm.status(n) for n in ("a", "b")]
    summary = json.loads(out.read_text())
    assert summary["swarm_id"] == spec.swarm_id and summary["totals"]["nodes"] == 2
    assert plot.stat().st_size > 10_000 and plot.read_bytes()[:4] == b"\x89PNG"
    served = {row["path"]: row for row in summary["paths"] if row["nodes"]}
    assert {st["path"] for st in statuses.values()} == set(served)  # each node on its own path
    for st in statuses.values():
        row = served[st["path"]]
        assert row["nodes"] == [st["peer_id"]]
        # Every (round, loss) the status shows is one the node itself recorded, and it shows them all up to
        # the round the node last published.
        recorded = {r: loss for r, loss in st["loss_history"]}
        assert row["history"] and all(abs(recorded[r] - loss) < 1e-9 for r, loss in row["history"])
        # A contiguous run of the recorded rounds: the newest MAX_HISTORY of them as of the node's last announcement
        # (a slow run records more rounds than that before `swarm status` reads them).
        shown, rounds = [r for r, _ in row["history"]], sorted(recorded)
        assert shown == rounds[rounds.index(shown[0]):rounds.index(shown[0]) + len(shown)]
        assert 1 <= row["last_round"] <= st["round"]
    # every round announced by two or more peers has one digest (not only each module's newest round)
    assert all(m["replicas_agree"] is not False and m["split_rounds"] == [] for m in summary["modules"])
    ok, compared = replicas_identical(final)
    assert ok and compared > 0


@pytest.mark.slow  # ~19 s: in `make test-slow` (CI runs it after the default suite, which was at 10:28 of 10 min)
def test_join_refuses_a_wrong_id_and_needs_a_peer(spec, tmp_path, home):
    spec_path = tmp_path / "swarm.toml"
    spec_path.write_text(spec.to_toml())
    other = tiny_spec().replace(name="other")
    with LocalSwarm(spec_path, tmp_path / "run") as swarm:
        maddr = swarm.start_bootstrap()
        line = error_line(cli("node", "run", "--join", other.swarm_id, "--initial-peer", maddr, "--max-rounds", "1"))
        assert f"could not get the spec of swarm {other.swarm_id[:16]}" in line and "does not know swarm" in line
        line = error_line(cli("node", "run", "--swarm", str(spec_path), "--join", other.swarm_id))
        assert "not the" in line and "--join" in line
    line = error_line(cli("node", "run", "--join", spec.swarm_id))
    assert "--join needs at least one --initial-peer" in line
    line = error_line(cli("node", "run", "--join", "1234"))
    assert "64 hex characters" in line


@pytest.mark.slow  # with the slow ones (`make test-slow`, in CI after the default suite)
def test_several_bootstrap_peers_any_one_suffices(spec, tmp_path, home):
    spec_path = tmp_path / "swarm.toml"
    spec_path.write_text(spec.to_toml())
    with LocalSwarm(spec_path, tmp_path / "run") as swarm:
        first = swarm.start_bootstrap(name="boot1")
        # The second bootstrap peer knows only the id: it fetches the spec from the first.
        second = swarm.start_bootstrap(name="boot2", args=["--join", spec.swarm_id, "--initial-peer", first])
        assert second != first
        swarm.extra["boot1"].send_signal(signal.SIGTERM)
        assert swarm.extra["boot1"].wait(30) == 0
        swarm.start_node("a", max_rounds=1, swarm_args=["--join", spec.swarm_id], initial_peers=[first, second])
        assert swarm.wait_nodes(["a"], timeout_s=180) == {"a": 0}, swarm.tail("a", 10)
        st = swarm.status("a")
    assert st["round"] >= 1 and st["val_loss_after"] < st["val_loss_before"]


def test_public_swarm_file_is_data(spec, tmp_path, home, monkeypatch):
    line = error_line(cli("node", "run", "--swarm", "public"))
    assert "no public swarm is listed yet" in line and "--join ID --initial-peer ADDR" in line
    assert line.count("public swarm") == 1, line  # said once (the note in the file said it again)
    spec_path = tmp_path / "swarm.toml"
    spec_path.write_text(spec.to_toml())
    with LocalSwarm(spec_path, tmp_path / "run") as swarm:
        maddr = swarm.start_bootstrap()
        public = tmp_path / "public.toml"
        public.write_text(f'note = "test"\nswarm_id = "{spec.swarm_id}"\ninitial_peers = ["{maddr}"]\n')
        monkeypatch.setenv("PATHSWARM_PUBLIC_SWARM", str(public))
        swarm.start_node("a", max_rounds=1, swarm_args=["--swarm", "public"], initial_peers=[])
        assert swarm.wait_nodes(["a"], timeout_s=180) == {"a": 0}, swarm.tail("a", 10)
    assert swarm.status("a")["round"] >= 1


def _can_unshare_network() -> bool:
    try:
        return subprocess.run(["unshare", "-n", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.skipif(not _can_unshare_network(),
                    reason="needs `unshare -n` (root): hivemind-dht probes the LAN gateway outside a private netns")
@pytest.mark.slow  # with the slow ones (`make test-slow`, in CI after the default suite)
def test_a_plain_hivemind_dht_peer_is_a_valid_initial_peer(spec, tmp_path, home):
    spec_path = tmp_path / "swarm.toml"
    spec_path.write_text(spec.to_toml())
    out = tmp_path / "result.json"
    script = (f"ip link set lo up && exec {sys.executable} -m tests.swarm.plain_dht_scenario {spec_path} "
              f"{tmp_path / 'run'} {out}")
    proc = subprocess.run(["unshare", "-n", "sh", "-c", script], capture_output=True, text=True, timeout=280,
                          cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["exit_codes"] == {"a": 0, "b": 0}, result["logs"]
    a, b = result["statuses"]["a"], result["statuses"]["b"]
    assert a["round"] >= 2 and b["round"] >= 2 and a["path"] != b["path"]
    # They averaged together through the plain DHT: the shared module's groups hold both peers.
    assert any(set(peers) == {a["peer_id"], b["peer_id"]} for peers in a["groups"]["shared"].values())
    assert (tmp_path / "home" / "swarms" / f"{spec.swarm_id}.toml").read_text() == spec.to_toml()
