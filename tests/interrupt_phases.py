"""Ctrl-C (SIGINT) sent to a real `pathswarm node run` process in each phase of its life, for the tests and
`benchmarks/interrupt.py`.

Phases: `joining` (its only initial peer accepts TCP and never answers, so the node is still joining the DHT),
`downloading` (a holder serves state at 0.2 Mbit/s, so the joiner is mid-download of its first modules), `training`
(a node alone, between inner steps), `in_flight` (two nodes on one path, the other one throttled, so this one's
round waits in the grace window). `twice`: two SIGINTs 0.2 s apart while a round is in flight (the second ends
the process at once). Each run returns the exit code, the seconds from the (first) signal to the exit, and the
node's log; everything runs on 127.0.0.1 and is cleaned up.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from pathswarm.node.app.local_swarm import LocalSwarm
from pathswarm.protocol.spec import AveragingSpec, InnerOptSpec

from .conftest import tiny_spec, wait_until

PHASES = ("joining", "downloading", "training", "in_flight", "twice")
FAKE_PEER = "QmTzQ1JRkWErjk39mryYw2WVaphAZNAREyMchXzYQ7c15n"  # a well-formed peer id nobody holds


@dataclass
class Interrupted:
    phase: str
    code: int | None
    """None: still running 60 s after the signal (then killed)."""
    seconds: float
    log: str
    checkpoint: Path


def spec_file(workdir: Path) -> Path:
    spec = tiny_spec().replace(inner=InnerOptSpec(steps=20, batch_size=4, warmup_steps=2),
                               averaging=AveragingSpec(grace_s=10.0, timeout_s=20.0, claim_ttl_s=8.0))
    path = workdir / "swarm.toml"
    path.write_text(spec.to_toml())
    return path


def interrupt(phase: str, workdir: Path) -> Interrupted:
    """Bring a node to `phase`, send SIGINT (twice for `twice`), wait for it to exit."""
    if phase not in PHASES:
        raise ValueError(f"phase {phase!r} is not one of {PHASES}")
    workdir.mkdir(parents=True, exist_ok=True)
    if phase == "joining":
        return _joining(workdir)
    with LocalSwarm(spec_file(workdir), workdir / "run") as swarm:
        swarm.start_bootstrap()
        if phase == "training":
            swarm.start_node("a", path="0.0", seed=0)
            wait_until(lambda: (swarm.status("a") or {}).get("round", 0) >= 1, 120, "node a to train a round")
            victim = "a"
        elif phase == "downloading":
            swarm.start_node("a", path="0.0", seed=0, extra=["--serve-state-mbps", "0.2"])
            wait_until(lambda: (swarm.status("a") or {}).get("round", 0) >= 1, 120, "node a to train a round")
            swarm.start_node("b", path="0.0", seed=1)
            log = swarm.workdir / "b.log"
            wait_until(lambda: log.is_file() and "syncing" in log.read_text(), 60, "node b to start syncing")
            time.sleep(1.0)  # the first module (~140 KB at 25 KB/s) is on its way
            victim = "b"
        else:  # in_flight, twice: b trains at 150 tokens/s, so a's first round waits for it (grace window 10 s)
            swarm.start_node("a", path="0.0", seed=0, extra=["--wait-peers", "2"])
            swarm.start_node("b", path="0.0", seed=1, extra=["--wait-peers", "2", "--max-tokens-per-s", "150"])
            wait_until(lambda: (swarm.status("a") or {}).get("inner_step", 0) >= 25, 120, "node a past its first send")
            victim = "a"
        t0 = time.monotonic()
        swarm.signal(victim, signal.SIGINT)
        if phase == "twice":
            time.sleep(0.2)
            swarm.signal(victim, signal.SIGINT)
        code = swarm.wait_nodes([victim], timeout_s=60)[victim]
        took = time.monotonic() - t0
        return Interrupted(phase, code if swarm.nodes[victim].poll() is not None else None, took,
                           (swarm.workdir / f"{victim}.log").read_text(), swarm.node_files(victim)["checkpoint"])


def _joining(workdir: Path) -> Interrupted:
    """A listener that accepts and never speaks libp2p: the node's DHT start waits on it."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    held: list = []
    threading.Thread(target=lambda: [held.append(server.accept()) for _ in range(8)], daemon=True).start()
    log_path, ckpt = workdir / "node.log", workdir / "checkpoint"
    args = [sys.executable, "-m", "pathswarm", "node", "run", "--swarm", str(spec_file(workdir)), "--initial-peer",
            f"/ip4/127.0.0.1/tcp/{server.getsockname()[1]}/p2p/{FAKE_PEER}", "--checkpoint-dir", str(ckpt)]
    with open(log_path, "wb") as log:
        # SIGINT back to its default in the node: `make test` started from a background job passes an ignored SIGINT
        # on, an ignored signal survives exec, and Python then installs no KeyboardInterrupt for it: this phase (before
        # the node's own handler is in) ignored the Ctrl-C and failed, reproducibly, only when run so.
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        wait_until(lambda: "training on" in log_path.read_text(), 60, "the node to start")
        time.sleep(2.0)  # torch is loaded, the DHT is starting and waits on the silent peer
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        try:
            code: int | None = proc.wait(60)
        except subprocess.TimeoutExpired:
            code = None
        return Interrupted("joining", code, time.monotonic() - t0, log_path.read_text(), ckpt)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        server.close()
        for conn, _ in held:
            conn.close()
