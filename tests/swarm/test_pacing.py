"""`node run --max-tokens-per-s`: the cap holds (a node never trains faster) and is close to reached when the
machine is faster than the cap; a bad value is one clear error line."""

import json

import pytest

from ..conftest import cli, tiny_spec

pytestmark = pytest.mark.timeout(120)


def test_training_speed_is_capped(tmp_path):
    spec = tmp_path / "swarm.toml"
    spec.write_text(tiny_spec().to_toml())
    status = tmp_path / "status.json"
    cap = 640.0  # one round of the tiny spec (5 steps x 4 x 32 tokens) per second; unpaced it runs many times faster
    proc = cli("node", "run", "--swarm", str(spec), "--offline", "--max-rounds", "3", "--threads", "1",
               "--max-tokens-per-s", str(cap), "--status-file", str(status))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert " WARN " not in proc.stderr, proc.stderr[-2000:]  # an offline node has no claim to renew
    st = json.loads(status.read_text())
    assert st["round"] == 3 and st["tokens_trained"] == 3 * 640
    # tokens_per_s is the last round's tokens over its wall time, paced sleeps included
    assert 0.8 * cap <= st["tokens_per_s"] <= cap


@pytest.mark.parametrize("value", ["-1", "nan", "inf"])
def test_bad_cap_is_refused(tmp_path, value):
    spec = tmp_path / "swarm.toml"
    spec.write_text(tiny_spec().to_toml())
    proc = cli("node", "run", "--swarm", str(spec), "--offline", "--max-tokens-per-s", value)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr  # click's usage error, before anything starts
    assert "Invalid value for --max-tokens-per-s: must be a finite number >= 0" in proc.stderr


def test_round_work_counts_nested_work_once(spec):
    """status.round_work_s: work done inside other work (a round completing while the loop waits for it) is counted
    under its own kind only, so the kinds add up to the time the training loop spent off its inner steps."""
    import time

    from pathswarm.node.peer.node import Node, NodeConfig

    node = Node(NodeConfig(spec=spec, offline=True))
    t0 = time.perf_counter()
    with node.work("settle"):
        time.sleep(0.05)
        with node.work("checkpoint"):
            time.sleep(0.4)
    with node.work("settle"):
        time.sleep(0.05)
    spent = time.perf_counter() - t0
    work = node.status.round_work_s
    assert set(work) == {"settle", "checkpoint"}
    assert work["checkpoint"] >= 0.4
    assert 0.1 <= work["settle"] < 0.4  # its own 2 × 50 ms (and some slack), not the checkpoint's 400 ms too
    assert abs(sum(work.values()) - spent) < 0.01
