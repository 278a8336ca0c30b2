"""The live display of `pathswarm node run` on a terminal: one table row refreshed twice a second.

Shows what a volunteer wants to see at a glance: path, round, inner step, loss, tokens/s, peers in
the last group, bytes sent and received. Log lines (one per round) scroll above it.
"""

from __future__ import annotations

import logging
import threading

from rich.console import Console
from rich.live import Live
from rich.logging import RichHandler
from rich.table import Table

from pathswarm.node.app.fmt import fmt_bytes, reach_label


def status_table(status) -> Table:
    table = Table(title=f"pathswarm node {status.peer_id[-8:] or '…'}")
    for col in ("path", "state", "round", "inner step", "loss", "tok/s", "group", "sent", "received", "peers see it"):
        table.add_column(col, justify="right")
    table.add_row(status.path or "…", status.state, str(status.round), str(status.inner_step), f"{status.loss:.4f}",
                  f"{status.tokens_per_s:,.0f}", str(status.last_group), fmt_bytes(status.bytes_sent),
                  fmt_bytes(status.bytes_received), reach_label(status.reachable, status.client))
    return table


def run_with_display(node) -> int:
    console = Console(stderr=True)
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(RichHandler(console=console, show_path=False))
    done = threading.Event()
    with Live(status_table(node.status), console=console, refresh_per_second=2) as live:
        def refresh() -> None:
            while not done.wait(0.5):
                live.update(status_table(node.status))

        threading.Thread(target=refresh, daemon=True).start()
        try:
            return node.run()
        finally:
            done.set()
            live.update(status_table(node.status))
