"""Ctrl-C stops a real node at once in every phase, keeps what is safe, and says so in one last line; a second Ctrl-C
ends it at once with 130. The phases are built by tests/interrupt_phases.py (benchmarks/interrupt.py times them).

The time bounds here only catch a node that waits something out (before this, a node took 10 s in a round's grace
window and up to 108 s in state downloads after Ctrl-C); the seconds themselves are measured by the benchmark.
"""

import pytest

from pathswarm.node.train.checkpoint import load_checkpoint
from pathswarm.protocol.spec import load_spec

from ..interrupt_phases import interrupt, spec_file

pytestmark = pytest.mark.timeout(240)


def last_line(log: str) -> str:
    return log.strip().splitlines()[-1]


def test_ctrl_c_while_joining_the_dht_stops_the_start(tmp_path):
    got = interrupt("joining", tmp_path)
    assert got.code == 0, got.log[-2000:]
    assert "stopped while joining the swarm's DHT: nothing was saved or claimed" in last_line(got.log)
    assert not got.checkpoint.exists()
    assert got.seconds < 15, got.seconds


def test_ctrl_c_with_a_round_in_flight_leaves_without_waiting_out_the_grace_window(tmp_path):
    got = interrupt("in_flight", tmp_path)
    assert got.code == 0, got.log[-2000:]
    line = last_line(got.log)
    assert line.split(": ", 1)[1].startswith("left the swarm (asked to stop)"), line
    assert "abandoned" in line and line.endswith("exit 0"), line
    assert "still open at shutdown" not in got.log  # the last line says it once
    assert got.seconds < 7, got.seconds  # the grace window is 10 s
    spec = load_spec(spec_file(tmp_path))
    assert set(load_checkpoint(got.checkpoint, spec).modules) == set(spec.module_ids((0, 0)))


@pytest.mark.slow  # 20 s
def test_ctrl_c_during_the_first_state_download_gives_it_up(tmp_path):
    got = interrupt("downloading", tmp_path)
    assert got.code == 0, got.log[-2000:]
    after = got.log.split("signal 2:", 1)[1]
    assert "ready in" not in after  # it neither finished the download nor started training
    assert "before training began: nothing new saved" in last_line(got.log), last_line(got.log)
    assert got.seconds < 10, got.seconds  # a state download's timeout is 20 s


@pytest.mark.slow  # 10 s
def test_ctrl_c_while_training_checkpoints_and_saves_the_round_in_progress(tmp_path):
    got = interrupt("training", tmp_path)
    assert got.code == 0, got.log[-2000:]
    line = last_line(got.log)
    assert "checkpoint of round" in line and "the round in progress saved" in line, line
    spec = load_spec(spec_file(tmp_path))
    ckpt = load_checkpoint(got.checkpoint, spec)
    assert ckpt.round >= 1 and f"checkpoint of round {ckpt.round} in" in line
    assert (got.checkpoint / "PARTIAL.safetensors").is_file()  # a restart resumes the round from it


@pytest.mark.slow  # 15 s
def test_a_second_ctrl_c_exits_at_once_with_130(tmp_path):
    got = interrupt("twice", tmp_path)
    assert got.code == 130, got.log[-2000:]
    assert "again: exiting now" in got.log
    assert got.seconds < 7, got.seconds
