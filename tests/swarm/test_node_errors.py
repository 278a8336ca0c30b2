"""The common start-up failures of a node give one clear line and a non-zero exit, no traceback."""

import socket
import subprocess
import sys

import pytest

from pathswarm.node.app.local_swarm import LocalSwarm

from ..conftest import tiny_spec

pytestmark = pytest.mark.timeout(120)


def run_node(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pathswarm", "node", "run", *args, "--max-rounds", "1"],
                          capture_output=True, text=True, timeout=90)


def error_lines(proc: subprocess.CompletedProcess) -> list[str]:
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    return [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]


@pytest.fixture(scope="module")
def spec_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("errors") / "swarm.toml"
    path.write_text(tiny_spec().to_toml())
    return path


def test_unreachable_initial_peer(spec_file):
    dead = "/ip4/127.0.0.1/tcp/9/p2p/QmQycYEeJ8hLdKTpsCAAputNjZYvdZWANTaRF9kNuXrBpe"
    proc = run_node("--swarm", str(spec_file), "--initial-peer", dead)
    assert proc.returncode == 2
    [line] = error_lines(proc)
    assert "no initial peer could be reached: the connection failed at once" in line and dead in line


def test_a_path_outside_the_grid_names_the_valid_ones_before_joining(spec_file):
    proc = run_node("--swarm", str(spec_file), "--path", "9.9")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    [line] = [ln for ln in proc.stderr.splitlines() if ln.startswith("Error:")]  # click's usage error
    assert "--path: path 9.9 does not fit levels [2, 2]: the valid paths are 0.0, 0.1, 1.0, 1.1" in line
    assert "DHT" not in proc.stderr and "peer id" not in proc.stderr  # refused before the network starts


def test_port_in_use(spec_file):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        proc = run_node("--swarm", str(spec_file), "--host-maddr", f"/ip4/127.0.0.1/tcp/{port}")
    assert proc.returncode == 2
    [line] = error_lines(proc)
    assert "port is in use" in line


def test_spec_of_another_swarm_is_refused(spec_file, tmp_path):
    other = tmp_path / "other.toml"
    other.write_text(spec_file.read_text().replace('name = "test"', 'name = "other"'))
    with LocalSwarm(spec_file, tmp_path) as swarm:
        maddr = swarm.start_bootstrap()
        proc = run_node("--swarm", str(other), "--initial-peer", maddr)
    assert proc.returncode == 2
    [line] = error_lines(proc)
    assert "serves swarm 'test'" in line and "use that swarm's spec file" in line


def test_a_second_signal_while_leaving_exits_at_once_and_logs_where_the_threads_were():
    """The first SIGTERM (or Ctrl-C) finishes the round and leaves the swarm; a second one, while it is still leaving,
    ends the process at once with exit code 130, its threads' stacks in the log (a node once took 90 s to leave).
    In a process of its own that stands for a node stuck leaving (it sleeps)."""
    code = ("import logging, os, signal, threading, time\n"
            "from pathswarm.node.peer.node import stop_on_signals\n"
            "logging.basicConfig(level=logging.INFO)\n"
            "stop = threading.Event()\n"
            "stop_on_signals(stop)\n"
            "os.kill(os.getpid(), signal.SIGTERM)\n"
            "time.sleep(0.2)\n"
            "assert stop.is_set()\n"
            "print('leaving', flush=True)\n"
            "os.kill(os.getpid(), signal.SIGTERM)\n"
            "time.sleep(30)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 130, proc.stderr[-2000:]
    assert proc.stdout == "leaving\n"
    assert "signal 15: finishing the round and leaving the swarm (again to exit at once)" in proc.stderr
    assert "signal 15 again: exiting now" in proc.stderr and "most recent call first" in proc.stderr
