"""A real node process SIGKILLed mid-round resumes the round in progress instead of training it again."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from pathswarm.node.peer.partial_round import FILE

from ..conftest import tiny_spec
from ..unit.test_partial_round import _metadata


@pytest.mark.timeout(150)
def test_a_node_killed_mid_round_resumes_that_round(tmp_path):
    """A real offline node, SIGKILLed after saving a round in progress, starts its next run inside that round:
    the steps and their tokens are not trained again, and the round's tokens are all counted."""
    spec = tiny_spec()
    spec = spec.replace(inner=dataclasses.replace(spec.inner, steps=20))
    spec_path = tmp_path / "swarm.toml"
    spec_path.write_text(spec.to_toml())
    ckpt, status = tmp_path / "ckpt", tmp_path / "status.json"
    per_step = spec.inner.batch_size * spec.model.context_len
    base = [sys.executable, "-m", "pathswarm", "node", "run", "--swarm", str(spec_path), "--offline", "--threads",
            "1", "--checkpoint-dir", str(ckpt), "--status-file", str(status), "--save-partial-s", "0.2",
            "--max-tokens-per-s", str(per_step * 5)]  # 5 steps a second: a 20-step round takes 4 s
    proc = subprocess.Popen(base, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:  # wait for round 1's checkpoint and ~half of round 2
            st = json.loads(status.read_text()) if status.is_file() else {}
            if st.get("round", 0) >= 1 and st.get("inner_step", 0) >= 30:
                break
            time.sleep(0.05)
        else:
            pytest.fail("the node never reached the middle of its second round")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    meta = _metadata(ckpt / FILE)
    saved_steps = int(meta["round_steps"])
    assert 1 <= saved_steps < 20 and json.loads(meta["anchors"])["shared"][0] == 1  # saves are rate-limited

    again = subprocess.run(base + ["--max-rounds", "1"], capture_output=True, text=True, timeout=90)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "resumed the round in progress" in again.stderr
    st = json.loads(status.read_text())
    assert st["tokens_resumed"] == saved_steps * per_step
    # the round it finished is the one it resumed: 20 steps in all, only the missing ones trained now
    assert st["round"] == 1 and st["module_rounds"]["shared"] == 2
    assert st["inner_step"] == 20 + 20 and st["tokens_trained"] == 20 * per_step
    assert st["tokens_merged"] == 20 * per_step  # offline: a round is applied alone, all its tokens count
