"""A home router in network namespaces, for tests of nodes behind NAT: nothing outside them is contacted.

    public  10.77.1.1/24 ──── 10.77.1.254  router  10.77.2.254 ──── 10.77.2.1/24  home
                                         (masquerades home → public; forwards nothing public → home)

The home namespace reaches the public one through the router, which rewrites the source to 10.77.1.254 (what a
home router does); the public namespace has no route into 10.77.2.0/24, and the router forwards no port, so no
connection can be opened to a home process. Needs root, `ip` (iproute2) and `iptables`; `require()` skips the test
and says why otherwise.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid

import pytest

PUBLIC_IP, ROUTER_PUBLIC_IP, ROUTER_HOME_IP, HOME_IP = "10.77.1.1", "10.77.1.254", "10.77.2.254", "10.77.2.1"


def _run(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, text=True, timeout=30)


def require() -> None:
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    for tool in ("ip", "iptables"):
        if shutil.which(tool) is None:
            pytest.skip(f"no `{tool}` on this machine (Debian: apt-get install iproute2 iptables)")


class HomeRouter:
    def __init__(self):
        tag = uuid.uuid4().hex[:6]
        self.public, self.router, self.home = f"psp{tag}", f"psr{tag}", f"psh{tag}"
        self._veths = (f"vp{tag}", f"vrp{tag}", f"vh{tag}", f"vrh{tag}")

    def __enter__(self) -> HomeRouter:
        require()
        try:
            self._build()
        except subprocess.CalledProcessError as e:
            self.__exit__()
            pytest.skip(f"could not build the test's network namespaces: {' '.join(e.cmd)}: {e.stderr.strip()}")
        return self

    def _build(self) -> None:
        vp, vrp, vh, vrh = self._veths
        for ns in (self.public, self.router, self.home):
            _run("ip", "netns", "add", ns)
            _run("ip", "-n", ns, "link", "set", "lo", "up")
        _run("ip", "link", "add", vp, "netns", self.public, "type", "veth", "peer", "name", vrp, "netns", self.router)
        _run("ip", "link", "add", vh, "netns", self.home, "type", "veth", "peer", "name", vrh, "netns", self.router)
        for ns, dev, ip in ((self.public, vp, PUBLIC_IP), (self.router, vrp, ROUTER_PUBLIC_IP),
                            (self.router, vrh, ROUTER_HOME_IP), (self.home, vh, HOME_IP)):
            _run("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", dev)
            _run("ip", "-n", ns, "link", "set", dev, "up")
        _run("ip", "-n", self.home, "route", "add", "default", "via", ROUTER_HOME_IP)
        _run("ip", "netns", "exec", self.router, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1")
        _run("ip", "netns", "exec", self.router, "iptables", "-t", "nat", "-A", "POSTROUTING", "-o", vrp,
             "-j", "MASQUERADE")

    def run_in(self, ns: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(["ip", "netns", "exec", ns, *args], capture_output=True, text=True, timeout=timeout)

    def __exit__(self, *exc) -> None:
        for ns in (self.public, self.router, self.home):  # deleting a namespace deletes its ends of the veths
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
