"""`pathswarm swarm status` and `pathswarm swarm dashboard`: read a running swarm's records, as a table or a live page.

Both join the swarm's DHT as a client (it serves nothing and cannot be dialed) through any of its peers and read
the records its nodes publish; node/app/cli.py registers them under `swarm`.
"""

from __future__ import annotations

import click
from rich.console import Console
from rich.table import Table

from pathswarm.node.app.cli_common import friendly, write_json
from pathswarm.node.app.fmt import count, plot_path_history
from pathswarm.node.peer.joining import resolve_swarm
from pathswarm.protocol.spec import SwarmSpec

# protocol/swarm_view.py (the pydantic records, ~90 ms), protocol/net/ (hivemind, ~2.8 s) and the dashboard's
# server are imported inside the commands, so that `pathswarm --help` answers at once.


@click.command("status")
@click.option("--swarm", "spec_path", type=str, default=None,
              help="The swarm's spec (TOML), or 'public'.")
@click.option("--join", "join_id", default=None, help="Or the swarm id (the spec is fetched from the swarm).")
@click.option("--initial-peer", "initial_peers", multiple=True,
              help="Multiaddr of a peer of the swarm (repeat for several).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None, help="Also write JSON here.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None,
              help="Write a PNG of each path's training loss over the last rounds here.")
@friendly
def swarm_status(spec_path: str | None, join_id: str | None, initial_peers: tuple[str, ...], json_path: str | None,
                 plot_path: str | None) -> None:
    """Paths (who serves each, tokens/s, round, loss), modules (round, holders, replica agreement, holders left
    behind or stalled, healed splits), totals.

    Read from the records the swarm's nodes publish in the DHT (also in a private swarm: records are
    signed and validated, not secret; module weights are served only to members)."""
    spec, initial_peers = resolve_swarm(spec_path, join_id, initial_peers)
    if not initial_peers:
        raise click.UsageError("--initial-peer is required: the address of any peer of the swarm")
    from pathswarm.protocol.swarm_view import collect_view, summarize

    sdht = _start_client_or_explain(spec, initial_peers)
    try:
        summary = summarize(spec, collect_view(sdht, spec))
    finally:
        sdht.shutdown()
    console = Console()
    t = Table(title=f"swarm {spec.name} ({spec.swarm_id[:12]}…): paths")
    for col in ("path", "nodes", "tokens/s", "round", "loss"):
        t.add_column(col, justify="right")
    for p in summary["paths"]:
        t.add_row(p["path"], str(len(p["nodes"])), f"{p['tokens_per_s']:,.0f}", str(p["last_round"] or "-"),
                  f"{p['loss']:.4f}" if p["loss"] is not None else "-")
    console.print(t)
    t = Table(title="modules")
    for col in ("module", "round", "holders", "at that round", "replicas agree", "left behind", "splits healed"):
        t.add_column(col, justify="right")
    for m in summary["modules"]:
        agree = {True: "yes", False: f"NO (round {', '.join(map(str, m['split_rounds'][:4]))})", None: "-"}[
            m["replicas_agree"]]
        t.add_row(m["module"], str(m["round"] if m["round"] is not None else "-"), str(m["holders"]),
                  str(m["holders_at_round"]), agree, left_behind(m),
                  f"{m['splits_healed']} (≤ {count(m['settle_rounds_max'], 'round')})" if m["splits_healed"] else "-")
    console.print(t)
    tot = summary["totals"]
    unknown = tot["nodes_reporting"] - tot["nodes_reachable"] - tot["nodes_behind_nat"]
    console.print(f"{count(tot['nodes'], 'node')} · {tot['paths_served']}/{spec.n_paths} paths served · "
                  f"{tot['tokens_per_s']:,.0f} tokens/s · sent {tot['bytes_sent']:,} B · reachable "
                  f"{tot['nodes_reachable']}, behind NAT (client) {tot['nodes_behind_nat']}, not measured {unknown} · "
                  f"splits healed {tot['splits_healed']}, holders left behind {tot['holders_left_behind']}")
    write_json(json_path, summary)
    if plot_path:
        plot_path_history(summary, plot_path)
        click.echo(f"wrote {plot_path}")


@click.command("dashboard")
@click.option("--swarm", "spec_path", type=str, default=None, help="The swarm's spec (TOML), or 'public'.")
@click.option("--join", "join_id", default=None, help="Or the swarm id (the spec is fetched from the swarm).")
@click.option("--initial-peer", "initial_peers", multiple=True,
              help="Multiaddr of a peer of the swarm (repeat for several).")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to serve on; another than loopback lets other machines read the page.")
@click.option("--port", type=click.IntRange(0, 65535), default=8470, show_default=True, help="0: any free port.")
@click.option("--poll-s", type=click.FloatRange(1.0, 3600.0), default=5.0, show_default=True,
              help="Seconds between two reads of the swarm's records.")
@friendly
def swarm_dashboard(spec_path: str | None, join_id: str | None, initial_peers: tuple[str, ...], host: str, port: int,
                    poll_s: float) -> None:
    """A live web page of the swarm, /metrics for Prometheus and /api/status (what `status --json` prints).

    \b
    The page updates every few seconds: the grid of modules (round, holders, replica agreement), each path's
    nodes, throughput and loss curve, group sizes per module, late and failed rounds, and the swarm's totals
    (tokens, bytes sent against fp32 data-parallel). Read-only; Ctrl-C stops it."""
    spec, initial_peers = resolve_swarm(spec_path, join_id, initial_peers)
    if not initial_peers:
        raise click.UsageError("--initial-peer is required: the address of any peer of the swarm")
    from pathswarm.node.app.dashboard.run import check_host, serve_until_stopped, swarm_poll
    from pathswarm.node.app.dashboard.server import Dashboard
    from pathswarm.node.app.dashboard.view import DashboardState

    check_host(host)
    sdht = _start_client_or_explain(spec, initial_peers)
    try:
        with Dashboard(DashboardState(spec), swarm_poll(spec, lambda: sdht), host, port, poll_s) as board:
            click.echo(f"dashboard of swarm {spec.name} ({spec.swarm_id[:12]}…) at {board.url} · Ctrl-C stops it")
            serve_until_stopped()
    finally:
        sdht.shutdown()


def left_behind(module: dict) -> str:
    """A module's holders that do not keep up, for the table: rounds behind the newest, or stalled (their own report:
    refused, or told "behind" / "out of sync" round after round), by the end of their peer id."""
    parts = [f"{p[-8:]} {n} behind" for p, n in module["behind"].items()]
    parts += [f"{p[-8:]} stalled {n}" for p, n in module["stalled"].items()]
    return ", ".join(parts[:4]) + (f" (+{len(parts) - 4})" if len(parts) > 4 else "") if parts else "-"


def _start_client_or_explain(spec: SwarmSpec, initial_peers: tuple[str, ...]):
    """A DHT client of the swarm; a NetStartError (a ValueError: one line) says why it did not start."""
    from pathswarm.protocol.net import start_net

    return start_net(list(initial_peers), spec=spec, client_mode=True)
