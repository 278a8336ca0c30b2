"""A node behind a home router (tests/netns.py: network namespaces this test creates, nothing outside them) finds
out that peers cannot dial it, runs as a client and trains in every round of its modules like a reachable node,
with identical replicas; and the dial-back itself on loopback."""

import json
import socket
import sys

import pytest

from pathswarm.node.app.local_swarm import LocalSwarm
from pathswarm.node.app.replicas import replicas_identical
from pathswarm.protocol.net import start_net
from pathswarm.protocol.netloop import NetLoop
from pathswarm.protocol.reachability import DialBackServer, ask, listen_ports
from pathswarm.protocol.spec import AveragingSpec, InnerOptSpec

from ..conftest import tiny_spec
from ..netns import HOME_IP, PUBLIC_IP, ROUTER_PUBLIC_IP, HomeRouter

pytestmark = pytest.mark.timeout(240)
ROUNDS = 5


def test_a_peer_dials_back_only_the_ports_that_listen_at_the_callers_address():
    a = start_net([])
    b = start_net(a.visible_maddrs())
    net = NetLoop()
    try:
        net.run(DialBackServer().start(net.run(a.streams(), 30)), 30)
        streams = net.run(b.streams(), 30)
        ports = listen_ports(b.visible_maddrs())
        with socket.socket() as s:  # a port nobody listens on any more
            s.bind(("127.0.0.1", 0))
            closed = s.getsockname()[1]
        got = net.run(ask(streams, a.peer_id, [*ports, closed]), 30)
        assert got.observed == "127.0.0.1" and got.open == tuple(ports) and closed not in got.open
        answers = [net.run(ask(streams, a.peer_id, ports), 30) for _ in range(2)]  # the burst: 3 in all
        assert all(x.open == tuple(ports) for x in answers)
        with pytest.raises(ValueError, match="rate limited"):
            net.run(ask(streams, a.peer_id, ports), 30)
    finally:
        net.stop()
        b.shutdown()
        a.shutdown()


def test_a_node_behind_nat_runs_as_a_client_and_contributes_to_every_round(tmp_path):
    spec = tiny_spec().replace(name="nat-test", inner=InnerOptSpec(steps=10, batch_size=4, warmup_steps=2),
                               averaging=AveragingSpec(grace_s=4.0, timeout_s=20.0, claim_ttl_s=8.0))
    spec_path = tmp_path / "swarm.toml"
    spec_path.write_text(spec.to_toml())
    with HomeRouter() as lab, LocalSwarm(spec_path, tmp_path / "run") as swarm:
        swarm.netns.update({"bootstrap": lab.public, "pub": lab.public, "home": lab.home})
        public_maddr, home_maddr = f"/ip4/{PUBLIC_IP}/tcp/0", f"/ip4/{HOME_IP}/tcp/0"
        maddr = swarm.start_bootstrap(args=["--swarm", str(spec_path), "--host-maddr", public_maddr])
        assert maddr.startswith(f"/ip4/{PUBLIC_IP}/tcp/")
        # Both on one path: every round of every module has both of them in it, or misses one.
        for name, host, seed in (("pub", public_maddr, 0), ("home", home_maddr, 1)):
            swarm.start_node(name, path="0.0", max_rounds=ROUNDS, seed=seed,
                             extra=["--wait-peers", "2", "--host-maddr", host])
        assert swarm.wait_nodes(["pub", "home"], timeout_s=180) == {"pub": 0, "home": 0}, swarm.tail("home", 20)
        st = {n: swarm.status(n) for n in ("pub", "home")}
        # who is what: the bootstrap peer dialed pub back, and could not dial home (behind the router)
        assert (st["pub"]["reachable"], st["pub"]["client"]) == (True, False)
        assert (st["home"]["reachable"], st["home"]["client"]) == (False, True)
        assert "runs as a client" in (tmp_path / "run" / "home.log").read_text()
        home, pub = st["home"]["peer_id"], st["pub"]["peer_id"]
        # home contributed to every round of every module, like pub; pub reduced them all
        for mid, rounds in st["pub"]["groups"].items():
            assert len(rounds) >= ROUNDS - 1, (mid, rounds)
            missing = {r: peers for r, peers in rounds.items() if sorted(peers) != sorted([home, pub])}
            assert not missing, (mid, missing)
            assert st["pub"]["reducers"][mid] == [pub] and home not in st["home"]["reducers"][mid]
        assert st["home"]["tokens_reduced"] == 0 and st["pub"]["tokens_reduced"] > 0
        assert st["home"]["rounds_failed"] == 0 and st["home"]["round"] == st["pub"]["round"] == ROUNDS
        ok, compared = replicas_identical(list(st.values()))
        assert ok and compared >= 3 * (ROUNDS - 1)
        assert st["home"]["val_loss_after"] < st["home"]["val_loss_before"]
        # what pub saw of home: the router's address, never home's own
        assert HOME_IP not in (tmp_path / "run" / "pub.log").read_text()
        # `swarm status` (run in the public namespace) says who is behind NAT
        out = tmp_path / "status.json"
        proc = lab.run_in(lab.public, sys.executable, "-m", "pathswarm", "swarm", "status", "--swarm",
                          str(spec_path), "--initial-peer", maddr, "--json", str(out))
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "reachable 1, behind NAT (client) 1" in " ".join(proc.stdout.split())  # rich wraps the line
        totals = json.loads(out.read_text())["totals"]
        assert (totals["nodes_reachable"], totals["nodes_behind_nat"]) == (1, 1)
    assert ROUTER_PUBLIC_IP.startswith("10.77.1.")  # the masquerading router's side is inside the public subnet
