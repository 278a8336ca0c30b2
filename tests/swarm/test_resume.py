"""A real node process SIGKILLed mid-round resumes the round in progress instead of training it again, and its token
counters go on from the killed run's (node/peer/counters.py)."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from pathswarm.node.app.local_swarm import read_json
from pathswarm.node.peer.partial_round import FILE

from ..conftest import tiny_spec, tokens_add_up
from ..unit.test_partial_round import _metadata


@pytest.mark.timeout(150)
def test_a_node_killed_mid_round_resumes_that_round(tmp_path):
    """A real offline node, SIGKILLed after saving a round in progress, starts its next run inside that round:
    the steps and their tokens are not trained again, and its counters go on from where the killed run left them.
    The kill lands when the status file is ahead of the last save, so the steps trained in between are lost: every
    status file read, before the kill, just before it and after the restart, adds up."""
    spec = tiny_spec()
    spec = spec.replace(inner=dataclasses.replace(spec.inner, steps=20))
    spec_path = tmp_path / "swarm.toml"
    spec_path.write_text(spec.to_toml())
    ckpt, status = tmp_path / "ckpt", tmp_path / "status.json"
    per_step = spec.inner.batch_size * spec.model.context_len
    base = [sys.executable, "-m", "pathswarm", "node", "run", "--swarm", str(spec_path), "--offline", "--threads",
            "1", "--checkpoint-dir", str(ckpt), "--status-file", str(status), "--save-partial-s", "1.0",
            "--max-tokens-per-s", str(per_step * 5)]  # 5 steps a second: a 20-step round takes 4 s, a save every 5
    proc = subprocess.Popen(base, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:  # wait for round 1's checkpoint, then a status mid-round ahead of the save
            st = tokens_add_up(read_json(status))
            if st and st["round"] >= 1 and st["inner_step"] % 20 and _ahead_of_save(st, ckpt):
                os.kill(proc.pid, signal.SIGSTOP)  # frozen: the files read now are the ones the kill leaves
                if _ahead_of_save(tokens_add_up(read_json(status)), ckpt):
                    break
                os.kill(proc.pid, signal.SIGCONT)
            time.sleep(0.05)
        else:
            pytest.fail("the node never wrote a status file mid-round ahead of its last save")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    last = tokens_add_up(read_json(status))
    meta = _metadata(ckpt / FILE)
    saved, saved_steps, killed_round = json.loads(meta["counters"]), int(meta["round_steps"]), last["round"] + 1
    assert 1 <= saved_steps < 20 and json.loads(meta["anchors"])["shared"][0] == killed_round - 1
    assert saved["trained"] == ((killed_round - 1) * 20 + saved_steps) * per_step == saved["merged"] + \
        saved_steps * per_step  # offline, every round merges alone
    after_save = last["tokens_trained"] - saved["trained"]
    assert after_save > 0 and last["tokens_lost"] == 0

    again = subprocess.run(base + ["--max-rounds", "1"], capture_output=True, text=True, timeout=90)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "resumed the round in progress" in again.stderr
    st = tokens_add_up(read_json(status))
    assert st["tokens_resumed"] == saved_steps * per_step and st["counters_id"] == last["counters_id"]
    # the round it finished is the one it resumed: 20 steps in all, only the missing ones trained now
    assert st["round"] == 1 and st["module_rounds"]["shared"] == killed_round
    assert st["inner_step"] == 20 * killed_round
    # the counters continue: all that the killed run trained, plus the missing steps; the steps it trained after its
    # last save are lost (its status file shows them, no save holds them)
    assert st["tokens_trained"] == last["tokens_trained"] + (20 - saved_steps) * per_step
    assert st["tokens_lost"] == after_save
    assert st["tokens_merged"] == 20 * killed_round * per_step  # offline: a round is applied alone, all its tokens
    assert st["tokens_unmerged"] == st["tokens_discarded"] == 0


def _ahead_of_save(st: dict | None, ckpt) -> bool:
    """The status file counts steps the saved round in progress (made on the current anchors) does not hold."""
    try:
        meta = _metadata(ckpt / FILE)
        saved, anchors = json.loads(meta["counters"]), json.loads(meta["anchors"])
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return bool(st) and anchors["shared"][0] == st["module_rounds"].get("shared") and \
        saved["trained"] < st["tokens_trained"]
