"""benchmarks/_baselines.py's `ddp` arm for real: two DDP workers over gloo on loopback (in a fresh network namespace
when we may make one) end with the same weights and a lower loss (slow)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import tiny_spec

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.append(str(BENCHMARKS))  # the benchmarks import each other by bare name (`from _swarm_common import`)

import _baselines as bl  # noqa: E402

from tests.unit.test_baselines import argv  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_ddp_workers_stay_identical_and_learn(tmp_path):
    """Two `ddp` workers on loopback (in a fresh network namespace when we may make one: nothing else is reachable)
    for 40 steps: same final weights on both ranks, loss down, snapshots and both JSONs written."""
    steps = 40
    spec = tiny_spec()
    spec_file = tmp_path / "spec.toml"
    spec_file.write_text(spec.to_toml())
    tokens = steps * spec.inner.batch_size * spec.model.context_len
    worker = str(BENCHMARKS / "_baselines.py")
    port = free_port()
    cmds = [[sys.executable, worker, *argv("ddp", spec_file, tmp_path, rank=r, world=2)[:-4],
             "--tokens-per-node", str(tokens), "--time-cap", "120", "--port", str(port), "--snap-every-s", "1"]
            for r in range(2)]
    quoted = [" ".join(f"'{c}'" for c in cmd) for cmd in cmds]
    script = (f"{quoted[0]} > '{tmp_path}/log-0.txt' 2>&1 & p0=$!; {quoted[1]} > '{tmp_path}/log-1.txt' 2>&1 & "
              "p1=$!; wait $p0; r0=$?; wait $p1; r1=$?; exit $((r0 | r1))")
    if os.geteuid() == 0 and shutil.which("unshare") and shutil.which("ip"):
        script = f"ip link set lo up && {{ {script}; }}"
        cmd = ["unshare", "-n", "sh", "-c", script]
    else:
        cmd = ["sh", "-c", script]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=280)
    logs = "\n".join((tmp_path / f"log-{r}.txt").read_text()[-3000:] for r in range(2))
    assert proc.returncode == 0, logs

    w = [json.loads((tmp_path / f"worker-{r}.json").read_text()) for r in range(2)]
    for r in range(2):
        assert w[r]["status"] == "ok" and w[r]["error"] is None, w[r]["error"]
        assert (w[r]["steps"], w[r]["local_steps"], w[r]["tokens"], w[r]["stop_reason"]) == (steps, steps, tokens,
                                                                                               bl.DONE)
        assert w[r]["settings"]["kind"] == "ddp" and w[r]["t0_epoch"] and w[r]["wall_s"] > 0
    assert w[0]["final_params_sha256"] == w[1]["final_params_sha256"]  # one all-reduce per step keeps replicas equal
    trace = w[0]["loss_trace"]
    assert trace[-1][2] < trace[0][2] - 0.3, trace
    assert [e[1] for e in trace][-1] == steps

    snaps = sorted(tmp_path.glob("snap-*.pt"))
    assert len(snaps) >= 2 and not list(tmp_path.glob(".snap-*"))  # no half-written snapshot left behind
    first, last = (torch.load(p) for p in (snaps[0], snaps[-1]))
    assert (first["step"], first["tokens"]) == (0, 0) and (last["step"], last["tokens"]) == (steps, tokens)
    assert set(last) == {"t", "step", "local_step", "tokens", "state_dict"}
    from pathswarm.node.model.model import build_path

    model = build_path(spec, spec.path_of_index(0))
    model.load_state_dict(last["state_dict"])  # the un-wrapped model's keys
