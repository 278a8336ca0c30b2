"""Small output helpers shared by the displays (progress bars, live tables, summaries) and the plots."""

from __future__ import annotations

from pathlib import Path


def fmt_bytes(n: float) -> str:
    """1234567 → '1.2 MB' (decimal units, as network traffic is usually read)."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000:
            return f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} PB"


def save_figure(fig, ax, path: Path | str) -> None:
    """Grid, legend, tight layout, write the PNG (creating its folder) and free the figure."""
    import matplotlib.pyplot as plt

    path = Path(path)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_path_history(summary: dict, path: Path | str) -> None:
    """`swarm status --plot`: training loss per path over outer rounds, from `swarm_view.summarize`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
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
