"""Small output helpers shared by the displays (progress bars, live tables, summaries) and the plots."""

from __future__ import annotations

from pathlib import Path

from pathswarm.logs import human_bytes

fmt_bytes = human_bytes
"""1234567 → '1.2 MB' (decimal units, as network traffic is usually read): the logs' own (pathswarm/logs.py)."""


def count(n: int, noun: str) -> str:
    """(1, 'round') → '1 round', (3, 'round') → '3 rounds': every count a person reads ("1 rounds" was printed)."""
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {noun}s"


def subplots(*args, **kwargs):
    """`matplotlib.pyplot.subplots` on the file-only Agg backend (no display needed). matplotlib is
    imported here, at the first figure: it is slow to import and most commands draw none."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(*args, **kwargs)


def write_figure(fig, path: Path | str, dpi: int = 110) -> None:
    """Tight layout, write the PNG (creating its folder) and free the figure."""
    import matplotlib.pyplot as plt

    path = Path(path)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)


def save_figure(fig, ax, path: Path | str) -> None:
    """Grid and legend on `ax`, then `write_figure`."""
    ax.grid(alpha=0.3)
    ax.legend()
    write_figure(fig, path)


def plot_path_history(summary: dict, path: Path | str) -> None:
    """`swarm status --plot`: training loss per path over outer rounds, from `swarm_view.summarize`."""
    fig, ax = subplots(figsize=(7, 4))
    drawn = 0
    for row in summary["paths"]:
        if row["history"]:
            rounds, losses = zip(*row["history"], strict=True)
            ax.plot(rounds, losses, marker="o", label=f"path {row['path']} ({len(row['nodes'])} nodes)")
            drawn += 1
    if not drawn:
        ax.plot([], [], label="no node has reported a round yet")
    ax.set_xlabel("outer round")
    ax.set_ylabel("training loss (nats/byte)")
    ax.set_title(f"swarm {summary['name']} ({summary['swarm_id'][:12]}…): loss per path")
    save_figure(fig, ax, path)


def reach_label(reachable: bool | None, client: bool) -> str:
    """How peers see a node: what `swarm status` and the node's display say."""
    if reachable is False:
        return "behind NAT (client)"
    if client:
        return "client"
    return "reachable" if reachable else "not measured"
