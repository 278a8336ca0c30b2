"""benchmarks/_cpu.py's sampler: the core-seconds a process used inside the window that `mark()` opens and `stop()`
closes. The child burns measured process-CPU time (not wall time), so the figures hold on a loaded machine."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.append(str(BENCHMARKS))  # the benchmarks import each other by bare name

from _cpu import CpuSampler, _cmdline, kind_of  # noqa: E402

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")

# Burns `first` s of its own CPU, says so, waits for a line, burns `second` s, says so, then sleeps until killed
# (a process that exits is counted only up to the sampler's last look at it).
CHILD = """
import sys, time
def burn(s):
    end = time.process_time() + s
    while time.process_time() < end:
        pass
burn(float(sys.argv[1])); print("first", flush=True)
sys.stdin.readline()
burn(float(sys.argv[2])); print("second", flush=True)
time.sleep(60)
"""
TAG = "cpu-sampler-test-child"


def _kind(pid: str) -> str | None:
    return "child" if TAG in _cmdline(pid) else None


def measure(first: float, second: float, mark: bool) -> tuple[float, dict[str, float]]:
    """The child's core-seconds as the sampler counts them, and the host's, with `mark()` between the two burns or
    not at all."""
    with CpuSampler(period_s=0.05, kind_of=_kind, kinds=("child",)) as cpu:
        child = subprocess.Popen([sys.executable, "-c", CHILD, str(first), str(second), TAG], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
        try:
            assert child.stdout.readline().strip() == "first"
            if mark:
                time.sleep(0.1)  # a sample after the first burn: mark() takes its own, this one only helps
                cpu.mark()
            child.stdin.write("go\n")
            child.stdin.flush()
            assert child.stdout.readline().strip() == "second"
            cpu.stop()
            return cpu.seconds()["child"], cpu.host()
        finally:
            child.kill()
            child.wait()


def test_the_window_counts_only_what_was_used_between_mark_and_stop():
    used, host = measure(0.6, 0.4, mark=True)
    # the second burn (0.4 s) and a little start-up of its loop; the first (0.6 s) left out. Clock ticks are 10 ms.
    assert 0.38 <= used <= 0.55, used
    assert host["busy_s"] >= 0.38 and host["idle_s"] >= 0.0


def test_without_a_mark_the_window_is_the_whole_run():
    used, _ = measure(0.3, 0.0, mark=False)
    assert 0.28 <= used <= 0.6, used  # the burn plus the interpreter's start-up


def test_a_fork_of_a_node_is_its_dht_process():
    # hivemind forks a node's DHT process: the same command line, a node for its parent
    parent = subprocess.Popen([sys.executable, "-c", "import os, sys, time\nif os.fork() == 0:\n    print('forked', "
                               "flush=True)\ntime.sleep(30)", "pathswarm", "node run", TAG], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert parent.stdout.readline().strip() == "forked"
        children = Path(f"/proc/{parent.pid}/task/{parent.pid}/children").read_text().split()
        assert kind_of(str(parent.pid)) == "node"
        assert [kind_of(c) for c in children] == ["node-dht"]
        assert kind_of(str(os.getpid())) is None
    finally:
        for c in Path(f"/proc/{parent.pid}/task/{parent.pid}/children").read_text().split():
            os.kill(int(c), signal.SIGKILL)
        parent.kill()
        parent.wait()
