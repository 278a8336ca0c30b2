"""Shaped links for tests and benchmarks: N network namespaces behind one router, each node's link shaped.

    node 0  10.78.1.2 ─veth─ 10.78.1.1 ┐
    node 1  10.78.2.2 ─veth─ 10.78.2.1 ┼─ hub (a router namespace the harness makes; no other interface)
    …                                  │
    node i  10.78.k.2 ─veth─ 10.78.k.1 ┘   (k = i + 1)

A node's *upload* is shaped on its own veth end (in its namespace), its *download* on the hub's end toward it:
each a `tbf` qdisc at the profile's rate, with a queue of about half a second at that rate (a home router's
buffer). Delay, jitter and loss: this machine's kernel has no `netem`, so the hub hands every packet it forwards
to tests/linkdelay.py (NFQUEUE), which releases it after a quarter of each end's round trip (so two nodes of one
profile see that round trip), with jitter that never reorders a stream, or drops it with each end's loss. A
profile with a round trip under a millisecond and no jitter or loss (`lan`) skips the queue: its delay is not
applied.

Every address lives in namespaces the harness created; a node routes only 10.78.0.0/16, to the hub, and the hub
has no interface but the nodes', so nothing outside can be contacted. Needs root, `ip`, `tc` and `iptables`
(Debian: iproute2, iptables); `unavailable()` says why not, and tests skip with that reason.

Profiles. `home`, `fiber` and `lan` are real links. Our CPU models are about 10⁴ times smaller than a real path
and compute each step tens of times faster than a real model on a GPU, so on a real link their communication
would be nearly free; `Profile.scaled_for` derives the link that gives a small model the ratio of communication
to computation that a real setting sees (the derivation is in its docstring).
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, replace
from pathlib import Path

NET = "10.78"
NO_DELAY_BELOW_S = 0.001
"""A round trip shorter than this, without jitter or loss, is not applied (see `_delayed`)."""


@dataclass(frozen=True)
class Profile:
    """One direction each way: `up_bps` leaves the node, `down_bps` reaches it; `rtt_s` between two nodes of this
    profile (each end adds a quarter of it in each direction), with a standard deviation of about 0.7 × `jitter_s`
    (each end's quarter varies by a quarter of it); `loss` the fraction of packets dropped at each end, so a packet
    between two nodes of the profile is lost with about twice that."""
    name: str
    up_bps: float
    down_bps: float
    rtt_s: float
    jitter_s: float = 0.0
    loss: float = 0.0
    stands_for: str = ""
    """For a scaled profile: the real setting it reproduces."""

    def scaled(self, bandwidth: float, time: float, stands_for: str = "") -> Profile:
        """Rates × `bandwidth`, delays × `time`."""
        return replace(self, name=f"{self.name} (scaled)", up_bps=self.up_bps * bandwidth,
                       down_bps=self.down_bps * bandwidth, rtt_s=self.rtt_s * time, jitter_s=self.jitter_s * time,
                       stands_for=stands_for)

    def scaled_for(self, our_params: int, our_step_s: float, real_params: float, real_step_s: float,
                   setting: str) -> Profile:
        """This link as a model of `our_params` parameters taking `our_step_s` per inner step sees it, if it is
        to spend the same share of its time communicating as a model of `real_params` taking `real_step_s` per
        step on the real link.

        Every message we send (a frame, a mean, a gradient) is a fixed number of bytes per parameter, so its time
        on a link of rate R is c·P/R; its share of a step is c·P/(R·t). Equal shares need
        R_ours = R_real · (P_ours / P_real) · (t_real / t_ours). Latency is a time per message, not per byte:
        its share of a step stays equal with d_ours = d_real · t_ours / t_real. Loss is a fraction: unchanged."""
        return self.scaled(bandwidth=(our_params / real_params) * (real_step_s / our_step_s),
                           time=our_step_s / real_step_s, stands_for=setting)

    def as_dict(self) -> dict:
        return asdict(self)


PROFILES = {
    # The median US fixed-broadband connection (Ookla Speedtest Global Index and the FCC's Measuring Broadband
    # America put the median upload near 20 Mbit/s and download near 100+ Mbit/s); tens of ms between homes.
    "home": Profile("home", up_bps=20e6, down_bps=100e6, rtt_s=0.040, jitter_s=0.010, loss=0.001),
    "fiber": Profile("fiber", up_bps=300e6, down_bps=300e6, rtt_s=0.010),
    "lan": Profile("lan", up_bps=10e9, down_bps=10e9, rtt_s=0.0002),
}

# A real setting the scaled profiles stand for: a 1 B-parameter path trained in bf16 on one RTX 4090 (165 TFLOP/s
# dense; at 40 % utilisation, 66) with DiLoCo's inner batch (512 sequences of 1,024 tokens, arXiv 2311.08105), each
# step 6 · 10⁹ · 524,288 FLOP ≈ 48 s. Its int8 frame (1 GB) takes 400 s at 20 Mbit/s: 8 steps; an fp32 ring
# all-reduce of its gradients (2 · 7/8 · 4 GB) 2,800 s: 58 steps.
REAL_PATH_PARAMS = 1e9
REAL_STEP_S = 48.0
REAL_SETTING = "a 1 B-parameter path on one RTX 4090, 48 s per step of 512 × 1,024 tokens"


class LinksUnavailable(RuntimeError):
    """This machine cannot build shaped links (not root, no `ip` or `tc`, no netem)."""


def unavailable() -> str:
    """Why this machine cannot build the harness, or "" when it can."""
    if os.geteuid() != 0:
        return "shaped links need root (network namespaces and tc)"
    for tool, package in (("ip", "iproute2"), ("tc", "iproute2"), ("iptables", "iptables")):
        if shutil.which(tool) is None:
            return f"no `{tool}` on this machine (Debian: apt-get install {package})"
    return ""


def _run(*args: str, timeout: float = 30) -> str:
    return subprocess.run(args, check=True, capture_output=True, text=True, timeout=timeout).stdout


def _tbf(rate_bps: float) -> list[str]:
    # burst: 10 ms at the rate, at least a few full frames (a smaller one stalls the link); the queue holds
    # about half a second at the rate, as a home router's buffer does.
    burst = max(16 * 1514, int(rate_bps / 8 / 100))
    limit = max(4 * burst, int(rate_bps / 8 * 0.5))
    return ["tbf", "rate", f"{rate_bps:.0f}bit", "burst", str(burst), "limit", str(limit)]


def _delayed(profile: Profile) -> bool:
    """Whether the profile's packets go through the user-space delayer. A round trip under a millisecond without
    jitter or loss (`lan`) does not: the delayer's own cost per packet would be more than the delay, and it would
    set the link's rate instead of tbf."""
    return profile.rtt_s >= NO_DELAY_BELOW_S or profile.jitter_s > 0 or profile.loss > 0


class Links:
    """`with Links(profiles) as net:` one namespace per entry of `profiles` (a Profile each, or one for all with
    `n`), node i at `net.ip(i)` in namespace `net.ns(i)`; run a process there with `net.exec_prefix(i) + argv`.
    The namespaces (and every process left in them: see `kill_all`) are removed on exit."""

    def __init__(self, profiles: Profile | list[Profile], n: int | None = None):
        if isinstance(profiles, Profile):
            if n is None:
                raise ValueError("one profile for all needs n, the number of nodes")
            profiles = [profiles] * n
        if not 1 <= len(profiles) <= 250:
            raise ValueError(f"1 to 250 nodes, not {len(profiles)}")
        self.profiles = list(profiles)
        tag = uuid.uuid4().hex[:6]
        self.tag = tag
        self.hub = f"pslh{tag}"
        self._names = [f"psl{tag}n{i}" for i in range(len(self.profiles))]
        self._built = False
        self._delayer: subprocess.Popen | None = None

    # ---- building ------------------------------------------------------------------------------------------
    def __enter__(self) -> Links:
        why = unavailable()
        if why:
            raise LinksUnavailable(why)
        try:
            self._build()
        except subprocess.CalledProcessError as e:
            self.__exit__()
            raise LinksUnavailable(f"could not build the namespaces: {' '.join(e.cmd)}: {e.stderr.strip()}") from e
        except BaseException:  # a timeout, the delayer failing, Ctrl-C: leave nothing behind
            self.__exit__()
            raise
        return self

    def _build(self) -> None:
        self._built = True
        hub = self.hub
        _run("ip", "netns", "add", hub)
        _run("ip", "-n", hub, "link", "set", "lo", "up")
        _run("ip", "netns", "exec", hub, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1")
        for i, profile in enumerate(self.profiles):
            ns, inner, outer = self._names[i], f"v{self.tag}n{i}", f"v{self.tag}h{i}"
            _run("ip", "netns", "add", ns)
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            _run("ip", "link", "add", inner, "netns", ns, "type", "veth", "peer", "name", outer, "netns", hub)
            _run("ip", "-n", ns, "link", "set", inner, "name", "eth0")
            _run("ip", "-n", ns, "addr", "add", f"{self.ip(i)}/24", "dev", "eth0")
            _run("ip", "-n", ns, "link", "set", "eth0", "up")
            _run("ip", "-n", hub, "addr", "add", f"{self._gateway(i)}/24", "dev", outer)
            _run("ip", "-n", hub, "link", "set", outer, "up")
            _run("ip", "-n", ns, "route", "add", f"{NET}.0.0/16", "via", self._gateway(i))
            _run("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "eth0", "root", *_tbf(profile.up_bps))
            _run("ip", "netns", "exec", hub, "tc", "qdisc", "add", "dev", outer, "root", *_tbf(profile.down_bps))
        delayed = {self.ip(i): (p.rtt_s, p.jitter_s, p.loss) for i, p in enumerate(self.profiles) if _delayed(p)}
        if delayed:
            self._delayer_log = tempfile.TemporaryFile()
            self._delayer = subprocess.Popen(
                ["ip", "netns", "exec", hub, sys.executable, str(Path(__file__).with_name("linkdelay.py")), "0",
                 json.dumps(delayed), "0"], stdout=subprocess.PIPE, stderr=self._delayer_log, text=True)
            assert self._delayer.stdout is not None
            if not select.select([self._delayer.stdout], [], [], 30)[0] or \
                    self._delayer.stdout.readline().strip() != "ready":
                self._delayer_log.seek(0)
                raise LinksUnavailable(f"the delay process did not start: {self._delayer_log.read()[-500:]!r}")
            _run("ip", "netns", "exec", hub, "iptables", "-A", "FORWARD", "-j", "NFQUEUE", "--queue-num", "0",
                 "--queue-bypass")

    def __exit__(self, *exc_info) -> None:
        if not self._built:
            return
        self.kill_all()
        died = None
        if self._delayer is not None:
            died = self._delayer.poll()
            self._delayer.kill()
            self._delayer.wait(10)
            self._delayer = None
        for ns in [*self._names, self.hub]:  # deleting a namespace deletes its ends of the veths
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        self._built = False
        if died is not None and not exc_info[0]:
            # with --queue-bypass the links ran on without delay or loss: what was measured is not the profile
            raise LinksUnavailable(f"the delay process died during the run (exit {died})")

    # ---- using ---------------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.profiles)

    def ns(self, i: int) -> str:
        return self._names[i]

    def ip(self, i: int) -> str:
        return f"{NET}.{i + 1}.2"

    def _gateway(self, i: int) -> str:
        return f"{NET}.{i + 1}.1"

    def maddr(self, i: int, port: int = 0) -> str:
        return f"/ip4/{self.ip(i)}/tcp/{port}"

    def exec_prefix(self, i: int) -> list[str]:
        return ["ip", "netns", "exec", self._names[i]]

    def run_in(self, i: int, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run([*self.exec_prefix(i), *args], capture_output=True, text=True, timeout=timeout)

    def counters(self) -> list[dict[str, int]]:
        """Bytes and packets each node has sent and received on its link so far (its eth0's counters)."""
        out = []
        for ns in self._names:
            (link,) = json.loads(_run("ip", "-n", ns, "-s", "-j", "link", "show", "eth0"))
            stats = link["stats64"]
            out.append({"tx_bytes": stats["tx"]["bytes"], "rx_bytes": stats["rx"]["bytes"],
                        "tx_packets": stats["tx"]["packets"], "rx_packets": stats["rx"]["packets"],
                        "dropped": stats["tx"]["dropped"]})
        return out

    def kill_all(self, timeout_s: float = 5.0) -> None:
        """SIGTERM, then SIGKILL, every process still running in one of our namespaces."""
        for sig in ("-TERM", "-KILL"):
            pids = []
            for ns in self._names:
                got = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=30)
                pids += got.stdout.split()
            if not pids:
                return
            subprocess.run(["kill", sig, *pids], capture_output=True, timeout=30)
            deadline = time.monotonic() + timeout_s
            while sig == "-TERM" and time.monotonic() < deadline and any(os.path.exists(f"/proc/{p}") for p in pids):
                time.sleep(0.1)
