"""Where a local swarm's CPU goes, by kind of process: each node's own process (training, rounds, checks), its DHT
process (hivemind forks one per node), the p2pd daemons, the bootstrap peer. Read from /proc (Linux), sampled every
half second while a run lasts, so a process that exits is counted up to its last sample.

Used by the networked benchmarks (`--cpu`): on a machine that runs 16 nodes on 2 cores, a round is as slow as the
CPU its communication takes, which the scale model (benchmarks/_round_events.py) leaves out.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

PROC = Path("/proc")
KINDS = ("node", "node-dht", "p2pd", "bootstrap")


def _cmdline(pid: str) -> str:
    try:
        return (PROC / pid / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _stat(pid: str) -> list[str] | None:
    try:
        return (PROC / pid / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def kind_of(pid: str) -> str | None:
    """A process's kind (KINDS), None for anything else. A node's DHT process is a fork of it: same command line,
    its parent a node."""
    cmd = _cmdline(pid)
    if "p2pd" in cmd:
        return "p2pd"
    if "pathswarm bootstrap" in cmd:
        return "bootstrap"
    return forked_kind(pid, cmd, "node run", "node")


def forked_kind(pid: str, cmd: str, marker: str, name: str) -> str | None:
    """`name` for a process whose command line `cmd` holds `marker`, `name`-dht for one whose parent's does too (the
    DHT process hivemind forks from it), None when `cmd` lacks it."""
    if marker not in cmd:
        return None
    stat = _stat(pid)
    return f"{name}-dht" if stat and marker in _cmdline(stat[1]) else name


def host_times() -> tuple[float, float]:
    """The machine's (busy, idle) core-seconds since boot, from /proc/stat (idle includes waiting for I/O)."""
    fields = [int(v) for v in (PROC / "stat").read_text().split("\n", 1)[0].split()[1:]]
    ticks = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + fields[4]
    return (sum(fields) - idle) / ticks, idle / ticks


class CpuSampler:
    """`with CpuSampler() as cpu: ...` then `cpu.seconds()`: core-seconds per kind used by the processes that ran
    meanwhile (those started before count only what they used after the start). `mark()` moves the start to now
    (a run's training, after its start-up), `stop()` ends the window before the `with` block does (before shutdown);
    `host()` is the machine's busy and idle core-seconds over the same window."""

    def __init__(self, period_s: float = 0.5, kind_of=kind_of, kinds: tuple[str, ...] = KINDS):
        self.period_s, self.kind_of, self.kinds = period_s, kind_of, kinds
        self._kinds: dict[str, str | None] = {}
        self._first: dict[str, int] = {}
        self._last: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)
        self._ticks = os.sysconf("SC_CLK_TCK")
        self._start: tuple[float, float] = (0.0, 0.0)
        self._end: tuple[float, float] | None = None

    def __enter__(self) -> CpuSampler:
        self._sample(first=True)
        self._start, self._end = host_times(), None
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def mark(self) -> None:
        """Count from now on: what every process used so far is left out."""
        self._sample()
        self._first = dict(self._last)
        self._start = host_times()

    def stop(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join()
        self._sample()
        self._end = host_times()

    def host(self) -> dict[str, float]:
        b0, i0 = self._start
        b1, i1 = self._end or host_times()
        return {"busy_s": round(b1 - b0, 2), "idle_s": round(i1 - i0, 2)}

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self._sample()

    def _sample(self, first: bool = False) -> None:
        for pid in (p.name for p in PROC.iterdir() if p.name.isdigit()):
            if pid not in self._kinds:
                self._kinds[pid] = self.kind_of(pid)
            if self._kinds[pid] is None:
                continue
            stat = _stat(pid)
            if stat is None:
                continue
            used = int(stat[11]) + int(stat[12])  # utime + stime, in clock ticks
            if first:
                self._first[pid] = used
            self._last[pid] = used

    def seconds(self) -> dict[str, float]:
        out = dict.fromkeys(self.kinds, 0.0)
        for pid, used in self._last.items():
            kind = self._kinds[pid]
            assert kind is not None
            out[kind] += (used - self._first.get(pid, 0)) / self._ticks
        return {k: round(v, 2) for k, v in out.items()}
