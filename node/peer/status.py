"""What a node tells the person running it: the status and ready files, and timers of where its time goes.

`RoundWork` times the round work the training thread does instead of inner steps (status.round_work_s);
`PhaseClock` times the start-up phases (a restart's downtime is their sum).
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import replace

from pathswarm.jsonfile import write_json_atomic
from pathswarm.node.peer.node_status import NodeStatus


class RoundWork:
    """Wall time of each kind of round work done by the training thread, into status.round_work_s."""

    def __init__(self, status: NodeStatus):
        self.status = status
        self._nested_s = 0.0

    @contextlib.contextmanager
    def __call__(self, kind: str):
        # Work nested inside other work (a round completing while we wait for it) counts once, as its own kind.
        t0, nested_before = time.perf_counter(), self._nested_s
        self._nested_s = 0.0
        try:
            yield
        finally:
            spent = time.perf_counter() - t0
            self.status.spent_on(kind, spent - self._nested_s)
            self._nested_s = nested_before + spent


class PhaseClock:
    """Wall time of each start-up phase, logged once: a restart's downtime is what this adds up to."""

    def __init__(self):
        self.t0 = self.last = time.perf_counter()
        self.laps: list[tuple[str, float]] = []

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.laps.append((name, now - self.last))
        self.last = now

    def __str__(self) -> str:
        parts = ", ".join(f"{name} {s:.1f} s" for name, s in self.laps)
        return f"in {self.last - self.t0:.1f} s ({parts})"


def write_ready(path: str, peer_id: str, maddrs: list[str], node_path: str) -> None:
    """The ready file: tests and the local swarm learn the node's address from it once it trains."""
    if path:
        write_json_atomic(path, {"peer_id": peer_id, "maddrs": maddrs, "path": node_path, "pid": os.getpid()},
                          default=str)


def write_status(path: str, status: NodeStatus, durable: dict[str, int] | None = None) -> None:
    """The status file: the record's fields as JSON. `durable` (module → round of it in our last checkpoint; None:
    no checkpoints): a round is on record once our checkpoint holds it: a kill between a settle and the checkpoint
    would leave on record a round the restarted node trains again (benchmarks/restarts.py saw one such split)."""
    if not path:
        return
    if durable is not None:
        status = replace(status, history={m: {r: d for r, d in h.items() if int(r) <= durable.get(m, 0)}
                                          for m, h in status.history.items()},
                         groups={m: {r: g for r, g in h.items() if int(r) <= durable.get(m, 0)}
                                 for m, h in status.groups.items()})
    write_json_atomic(path, status.__dict__, default=str)
