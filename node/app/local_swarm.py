"""A real swarm on this machine: one bootstrap DHT peer and N node processes on 127.0.0.1.

Used by `pathswarm demo`, the end-to-end tests and the benchmarks. Every process is a real
`pathswarm` CLI subprocess talking over hivemind's p2pd on loopback; processes synchronise through
their ready and status files, never through sleeps, and every process started here is stopped
(SIGTERM, then SIGKILL) when the swarm is closed, whatever happened.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

# The replica check lives in replicas.py (pure); re-exported for the tests and benchmarks that drive a swarm.
from pathswarm.node.app.replicas import replica_mismatches as replica_mismatches
from pathswarm.node.app.replicas import replicas_identical as replicas_identical


class SwarmError(RuntimeError):
    """A process of the local swarm failed to start or died unexpectedly."""


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


class LocalSwarm:
    def __init__(self, spec_path: str | Path, workdir: str | Path, threads: int = 1, debug: bool = False):
        self.spec_path = str(spec_path)
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.threads = threads
        self.debug = debug
        self.bootstrap: subprocess.Popen | None = None
        self.maddr = ""
        self.nodes: dict[str, subprocess.Popen] = {}
        self.extra: dict[str, subprocess.Popen] = {}
        """Bootstrap peers and other helper processes, stopped with the swarm."""
        self._logs: list = []
        self.netns: dict[str, str] = {}
        """Process name → the network namespace it runs in (none: this process's)."""

    # ---- processes ---------------------------------------------------------------------------
    def _spawn(self, name: str, args: list[str], entry: list[str] | None = None) -> subprocess.Popen:
        log = open(self.workdir / f"{name}.log", "ab")
        self._logs.append(log)
        # A process may live in a network namespace a test created (tests/netns.py): `ip netns exec` runs it there.
        netns = ["ip", "netns", "exec", self.netns[name]] if name in self.netns else []
        cmd = [*netns, sys.executable, *(entry or ["-m", "pathswarm"]), *(["--debug"] if self.debug else []), *args]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": str(self.threads)}
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def start_bootstrap(self, timeout_s: float = 60.0, name: str = "bootstrap", args: list[str] | None = None) -> str:
        """Start a bootstrap peer (`args` replace `--swarm SPEC`); the first one started is `self.maddr`."""
        ready = self.workdir / f"{name}.ready.json"
        ready.unlink(missing_ok=True)
        proc = self._spawn(name, ["bootstrap", *(args or ["--swarm", self.spec_path]), "--ready-file", str(ready),
                                  "--identity", str(self.workdir / f"{name}.key")])
        self.extra[name] = proc
        if self.bootstrap is None:
            self.bootstrap = proc
        maddr = self._wait_file(ready, proc, name, timeout_s)["maddrs"][0]
        self.maddr = self.maddr or maddr
        return maddr

    def node_files(self, name: str) -> dict[str, Path]:
        return {k: self.workdir / f"{name}.{k}" for k in ("ready.json", "status.json")} | {
            "checkpoint": self.workdir / f"{name}-checkpoint"}

    def start_node(self, name: str, path: str = "auto", max_rounds: int = 0, extra: list[str] | None = None,
                   seed: int = 0, swarm_args: list[str] | None = None,
                   initial_peers: list[str] | None = None, entry: list[str] | None = None) -> subprocess.Popen:
        """A node of the swarm: `swarm_args` replace `--swarm SPEC` (e.g. `--join ID`), `initial_peers`
        replace the first bootstrap peer; `entry` replaces `-m pathswarm` (tests run hostile nodes so)."""
        files = self.node_files(name)
        files["ready.json"].unlink(missing_ok=True)
        peers = initial_peers if initial_peers is not None else ([self.maddr] if self.maddr else [])
        args = ["node", "run", *(swarm_args or ["--swarm", self.spec_path]),
                *[a for p in peers for a in ("--initial-peer", p)], "--path", path,
                "--threads", str(self.threads), "--max-rounds", str(max_rounds), "--seed", str(seed),
                "--ready-file", str(files["ready.json"]), "--status-file", str(files["status.json"]),
                "--checkpoint-dir", str(files["checkpoint"]), *(extra or [])]
        proc = self._spawn(name, args, entry)
        self.nodes[name] = proc
        return proc

    def wait_ready(self, name: str, timeout_s: float = 120.0) -> dict:
        return self._wait_file(self.node_files(name)["ready.json"], self.nodes[name], name, timeout_s)

    def _wait_file(self, path: Path, proc: subprocess.Popen, name: str, timeout_s: float) -> dict:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            info = read_json(path)
            if info is not None:
                return info
            if proc.poll() is not None:
                raise SwarmError(f"{name} exited with code {proc.returncode} before it was ready; see "
                                 f"{self.workdir / (name + '.log')}: {self.tail(name)}")
            time.sleep(0.1)
        raise SwarmError(f"{name} was not ready after {timeout_s:.0f} s; see {self.workdir / (name + '.log')}")

    def tail(self, name: str, lines: int = 3) -> str:
        try:
            text = (self.workdir / f"{name}.log").read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return " | ".join(text[-lines:])

    def status(self, name: str) -> dict | None:
        return read_json(self.node_files(name)["status.json"])

    def running(self) -> list[str]:
        return [n for n, p in self.nodes.items() if p.poll() is None]

    def signal(self, name: str, sig: int) -> None:
        proc = self.nodes[name]
        if proc.poll() is None:
            os.kill(proc.pid, sig)

    def wait_nodes(self, names: list[str] | None = None, timeout_s: float = 600.0, on_tick=None) -> dict[str, int]:
        names = names or list(self.nodes)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if on_tick is not None:
                on_tick()
            if all(self.nodes[n].poll() is not None for n in names):
                return {n: self.nodes[n].returncode for n in names}
            time.sleep(0.5)
        raise SwarmError(f"nodes {', '.join(n for n in names if self.nodes[n].poll() is None)} still running "
                         f"after {timeout_s:.0f} s")

    def close(self, grace_s: float = 10.0) -> None:
        procs = list({id(p): p for p in [*self.nodes.values(), *self.extra.values(), self.bootstrap]
                      if p is not None}.values())
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + grace_s
        for p in procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        # Each process leads its own group, which also holds its DHT process and p2pd daemon: kill
        # the whole group even when the leader is gone (a SIGKILLed node leaves its p2pd orphaned).
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            if p.poll() is None:
                p.wait(5)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(_group_alive(p.pid) for p in procs):
            time.sleep(0.05)
        for log in self._logs:
            log.close()
        self._logs.clear()

    def __enter__(self) -> LocalSwarm:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False
