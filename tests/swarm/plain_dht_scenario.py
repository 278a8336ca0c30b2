"""Run inside a private network namespace (`unshare -n`): hivemind's own `hivemind-dht` command is the
only initial peer of two pathswarm nodes. One node has the spec file; the other knows only the swarm
id and finds the spec through the DHT (the first node lists itself as a spec server).

hivemind-dht turns on NAT port mapping and AutoNAT, which probe the LAN gateway; the namespace has
only a loopback interface, so nothing outside 127.0.0.1 can be reached. Writes a JSON of the outcome.

    python -m tests.swarm.plain_dht_scenario SPEC.toml WORKDIR OUT.json
"""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from pathswarm.node.app.local_swarm import LocalSwarm
from pathswarm.protocol.spec import load_spec

MADDR = re.compile(r"/ip4/127\.0\.0\.1/tcp/\d+/p2p/[0-9A-Za-z]+")


def start_hivemind_dht(workdir: Path) -> tuple[subprocess.Popen, str]:
    script = Path(sys.executable).parent / "hivemind-dht"
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "hivemind.hivemind_cli.run_dht"]
    log_path = workdir / "hivemind-dht.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([*cmd, "--host_maddrs", "/ip4/127.0.0.1/tcp/0", "--no_relay"], stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = MADDR.search(log_path.read_text(errors="replace"))
        if found:
            return proc, found.group(0)
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    raise RuntimeError(f"hivemind-dht did not print its address: {log_path.read_text(errors='replace')[-1000:]}")


def main(spec_path: str, workdir: str, out: str) -> None:
    work = Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    spec = load_spec(spec_path)
    dht, maddr = start_hivemind_dht(work)
    result: dict = {"maddr": maddr}
    try:
        with LocalSwarm(spec_path, work) as swarm:
            swarm.maddr = maddr
            swarm.start_node("a", max_rounds=2, extra=["--wait-peers", "2"])
            # b starts at once: it looks up the spec servers in the DHT until a has listed itself
            swarm.start_node("b", max_rounds=2, seed=1, swarm_args=["--join", spec.swarm_id],
                             extra=["--wait-peers", "2"])
            result["exit_codes"] = swarm.wait_nodes(["a", "b"], timeout_s=240)
            result["statuses"] = {n: swarm.status(n) for n in ("a", "b")}
            result["logs"] = {n: swarm.tail(n, 5) for n in ("a", "b")}
    finally:
        os.killpg(dht.pid, signal.SIGTERM)
        try:
            dht.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(dht.pid, signal.SIGKILL)
        Path(out).write_text(json.dumps(result))


if __name__ == "__main__":
    main(*sys.argv[1:4])
