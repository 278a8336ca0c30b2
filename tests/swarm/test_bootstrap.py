"""The bootstrap peer keeps its identity (mode 0600) and so its multiaddr across restarts."""

import os
import signal
import socket
import subprocess
import sys

import pytest

from pathswarm.node.app.local_swarm import LocalSwarm

from ..conftest import tiny_spec

pytestmark = pytest.mark.timeout(120)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_restart_keeps_the_multiaddr(tmp_path):
    spec_path = tmp_path / "swarm.toml"
    spec_path.write_text(tiny_spec().to_toml())
    identity = tmp_path / "id" / "boot.key"
    port = free_port()
    maddrs = []
    for _ in range(2):
        ready = tmp_path / "ready.json"
        ready.unlink(missing_ok=True)
        swarm = LocalSwarm(spec_path, tmp_path)
        try:
            swarm.bootstrap = swarm._spawn("bootstrap", ["bootstrap", "--swarm", str(spec_path), "--identity",
                                                         str(identity), "--host-maddr", f"/ip4/127.0.0.1/tcp/{port}",
                                                         "--ready-file", str(ready)])
            maddrs.append(swarm._wait_file(ready, swarm.bootstrap, "bootstrap", 60)["maddrs"])
            # Stopped as systemd or a terminal's Ctrl-C stops it: the signal reaches the whole process group,
            # DHT process and p2pd included. It used to hang (the DHT process ignored SIGTERM) until SIGKILLed.
            os.killpg(swarm.bootstrap.pid, signal.SIGTERM)
            assert swarm.bootstrap.wait(8) == 0
        finally:
            swarm.close()
    assert maddrs[0] == maddrs[1] and f"/tcp/{port}/p2p/" in maddrs[0][0]
    assert oct(os.stat(identity).st_mode & 0o777) == "0o600"


def test_identity_readable_by_others_is_refused(tmp_path):
    spec_path = tmp_path / "swarm.toml"
    spec_path.write_text(tiny_spec().to_toml())
    identity = tmp_path / "boot.key"
    identity.write_bytes(b"not a key")
    os.chmod(identity, 0o644)
    proc = subprocess.run([sys.executable, "-m", "pathswarm", "bootstrap", "--swarm", str(spec_path), "--identity",
                           str(identity)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "readable by other users" in proc.stderr
