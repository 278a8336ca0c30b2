"""What the dashboard shows, kept across polls: pure data, no HTTP, no DHT.

Each poll gives `swarm status`'s summary (protocol/swarm_view.py). The records behind it hold only a node's last
rounds, so `DashboardState` keeps what it has seen: each path's loss per round, each module's group size per round
and the swarm's totals over time, bounded in length. `snapshot` is the JSON the page draws (`/api/dashboard`).

Everything in a summary came from peers. Records are validated on read (bounded strings, patterns for ids), but the
spec's name is free text chosen by whoever created the swarm: every string is cut to a bound here, and the page
writes them as text, never as markup.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any

MAX_ROUNDS_KEPT = 2000
"""Rounds of loss and group size kept per path or module (older ones are dropped first)."""
MAX_POINTS = 720
"""Points of the totals' time series (one per poll: an hour at the default 5 s)."""
MAX_TEXT = 128
"""Longest string the page gets (names, ids); longer ones are cut with an ellipsis."""

# The loss's one definition: the page gets it in /api/dashboard and /metrics' help quotes it, so no two places can
# disagree on the unit again; tests/unit/test_dashboard_view.py holds the demo's plot labels (demo.py, fmt.py) to it.
LOSS_UNIT = "nats/byte"
"""Tokens are UTF-8 bytes: the loss is next-byte cross-entropy, in nats per byte."""
LOSS_DEFINITION = ("training loss: next-byte cross-entropy in nats per byte (tokens are UTF-8 bytes; bits per byte "
                   "= loss / ln 2)")
LOSS_LATEST = ("latest: each node's newest reported loss (its last round's mean, or a single inner step's once the "
               "next round is training), averaged over the path's nodes")
LOSS_PER_ROUND = ("per round: the mean loss of a round's last 10 inner steps, averaged over the nodes that trained "
                  "that round; the chart draws this, and its last point is the table's \"last round\" column")


def text(value: Any, limit: int = MAX_TEXT) -> str:
    s = str(value)
    return s if len(s) <= limit else s[:limit - 1] + "…"


def number(value: Any) -> float | int | None:
    """A finite number, or None (JSON has no NaN or infinity)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value if isinstance(value, int) or math.isfinite(value) else None


def _merge_rounds(kept: dict[int, Any], pairs: list, limit: int = MAX_ROUNDS_KEPT) -> None:
    for r, v in pairs:
        if number(r) is not None and number(v) is not None:
            kept[int(r)] = v
    for old in sorted(kept)[:-limit]:
        del kept[old]


class DashboardState:
    """The latest summary and the history seen so far; thread-safe (the poller writes, the server reads)."""

    def __init__(self, spec, started: float | None = None):
        self.spec = spec
        self.started = time.time() if started is None else started
        self._lock = threading.Lock()
        self.summary: dict | None = None
        self.updated = 0.0
        self.polls = 0
        self.poll_errors = 0
        self.error = ""
        self.path_loss: dict[str, dict[int, float]] = {}
        self.group_sizes: dict[str, dict[int, int]] = {}
        self.series: dict[str, list] = {"t": [], "tokens_per_s": [], "tokens_trained": [], "bytes_sent": [],
                                        "ddp_fp32_bytes": []}

    def update(self, summary: dict, now: float | None = None) -> None:
        now = time.time() if now is None else now
        with self._lock:
            self.summary, self.updated, self.error = summary, now, ""
            self.polls += 1
            for p in summary["paths"]:
                _merge_rounds(self.path_loss.setdefault(p["path"], {}), p["history"])
            for m in summary["modules"]:
                _merge_rounds(self.group_sizes.setdefault(m["module"], {}), m["group_sizes"])
            tot = summary["totals"]
            self.series["t"].append(round(now, 3))
            for k in ("tokens_per_s", "tokens_trained", "bytes_sent", "ddp_fp32_bytes"):
                self.series[k].append(number(tot[k]))
            for points in self.series.values():
                del points[:-MAX_POINTS]

    def failed(self, error: str) -> None:
        """A poll that did not get an answer: the page shows the last good summary and this line."""
        with self._lock:
            self.poll_errors += 1
            self.error = text(error, 300)

    def status(self) -> dict | None:
        """What `swarm status --json` prints, as of the last poll (None before the first)."""
        with self._lock:
            return self.summary

    def snapshot(self, node: dict | None = None) -> dict:
        with self._lock:
            s = self.summary
            spec = self.spec
            grid = []
            if s is not None:
                by_id = {m["module"]: m for m in s["modules"]}
                for level, n in enumerate(spec.levels):
                    grid.append([_module_cell(by_id.get(f"L{level}M{i}"), f"L{level}M{i}") for i in range(n)])
            return {
                "swarm": {"name": text(spec.name), "id": text(spec.swarm_id), "levels": list(spec.levels),
                          "n_paths": spec.n_paths, "private": bool(spec.membership.private)},
                "updated": self.updated, "polls": self.polls, "poll_errors": self.poll_errors, "error": self.error,
                "uptime_s": round(max(0.0, (self.updated or self.started) - self.started), 1),
                "shared": _module_cell(by_id.get("shared"), "shared") if s is not None else None,
                "grid": grid,
                "paths": [_path_row(p, self.path_loss.get(p["path"], {})) for p in s["paths"]] if s else [],
                "modules": [_module_row(m, self.group_sizes.get(m["module"], {})) for m in s["modules"]] if s else [],
                "totals": {k: number(v) for k, v in s["totals"].items()} if s else {},
                "series": {k: list(v) for k, v in self.series.items()},
                "node": node,
                "loss": {"unit": LOSS_UNIT, "definition": LOSS_DEFINITION, "latest": LOSS_LATEST,
                         "per_round": LOSS_PER_ROUND},
            }


def _module_cell(m: dict | None, mid: str) -> dict:
    if m is None:
        return {"module": mid, "round": None, "holders": [], "replicas_agree": None}
    return {"module": text(m["module"]), "round": number(m["round"]),
            "holders": [text(p) for p in m["holder_ids"][:64]], "holders_at_round": number(m["holders_at_round"]),
            "replicas_agree": m["replicas_agree"]}


def _path_row(p: dict, loss: dict[int, float]) -> dict:
    return {"path": text(p["path"]), "nodes": [text(n) for n in p["nodes"][:64]], "n_nodes": len(p["nodes"]),
            "tokens_per_s": number(p["tokens_per_s"]), "round": number(p["last_round"]), "loss": number(p["loss"]),
            "loss_by_round": [[r, loss[r]] for r in sorted(loss)]}


def _module_row(m: dict, sizes: dict[int, int]) -> dict:
    return {"module": text(m["module"]), "round": number(m["round"]), "holders": number(m["holders"]),
            "holders_at_round": number(m["holders_at_round"]), "replicas_agree": m["replicas_agree"],
            "rounds_compared": number(m["rounds_compared"]), "split_rounds": [int(r) for r in m["split_rounds"][:64]],
            "rounds_late": number(m["rounds_late"]), "rounds_failed": number(m["rounds_failed"]),
            "group_sizes": [[r, sizes[r]] for r in sorted(sizes)],
            # holders that do not keep up: [peer, "N behind" | "stalled N"], the page writes them as text
            "left_behind": ([[text(p), f"{number(n)} behind"] for p, n in list(m["behind"].items())[:16]]
                            + [[text(p), f"stalled {number(n)}"] for p, n in list(m["stalled"].items())[:16]]),
            "splits_healed": number(m["splits_healed"]), "settle_rounds_max": number(m["settle_rounds_max"])}


def node_view(status) -> dict:
    """The node's own view (`node run --dashboard`): its round, inner step, loss curve, bytes and the peers of its
    last merged round per module, from its live status (node/peer/config.py NodeStatus)."""
    last_groups = {}
    for mid, rounds in status.groups.items():
        if rounds:
            r = max(rounds, key=int)
            last_groups[text(mid)] = {"round": int(r), "peers": [text(p) for p in rounds[r][:64]]}
    return {
        "peer_id": text(status.peer_id), "path": text(status.path), "state": text(status.state),
        "round": status.round, "inner_step": status.inner_step, "loss": number(status.loss),
        "tokens_per_s": number(status.tokens_per_s), "tokens_trained": status.tokens_trained,
        "bytes_sent": status.bytes_sent, "bytes_received": status.bytes_received,
        "rounds_failed": status.rounds_failed, "optimizer": text(status.optimizer),
        "loss_by_round": [[r, v] for r, v in status.loss_history[-MAX_ROUNDS_KEPT:] if number(v) is not None],
        "last_groups": last_groups,
    }
