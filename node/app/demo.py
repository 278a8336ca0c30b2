"""`pathswarm demo`: the README's main job.

By default a real local swarm: create a 2x2 spec on the BBC News corpus and fit its router, start a
bootstrap DHT peer and N node processes on 127.0.0.1 (node/app/local_swarm.py), show a live table per
node, and at the end print routed validation loss per path before and after, the bytes every node
sent against what fp32 data-parallel would have sent for the same inner steps, and whether every
module's replicas are bit-identical, and assemble the whole model out of the nodes' checkpoints into OUT/model
(`generate` and `model export` read it). While it runs, the swarm's dashboard is served on 127.0.0.1 (its URL is
printed). `--simulated` runs the same algorithm in one process instead.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

from rich.console import Console
from rich.live import Live
from rich.table import Table

from pathswarm.jsonfile import write_json_atomic
from pathswarm.node.app.fmt import count, fmt_bytes, save_figure, subplots
from pathswarm.node.app.local_swarm import LocalSwarm
from pathswarm.node.app.progress import run_with_progress
from pathswarm.node.app.replicas import check_replicas
from pathswarm.node.app.swarm_init import format_init_report, init_spec
from pathswarm.node.model.data import load_documents
from pathswarm.node.model.model import count_module_params
from pathswarm.node.train.assemble import assemble, provenance
from pathswarm.node.train.model_dir import SPEC_FILE, write_model
from pathswarm.node.train.simulate import SimConfig, SimResult
from pathswarm.protocol.spec import AveragingSpec, InnerOptSpec, SwarmSpec
from pathswarm.protocol.swarm_view import ddp_fp32_bytes


def plot_losses(result: SimResult, path: Path) -> None:
    fig, ax = subplots(figsize=(7, 4))
    rounds = [0] + [r["round"] for r in result.rounds]
    for p in [*result.paths, "all"]:
        ys = [result.val_loss_before[p]] + [r["val_loss"][p] for r in result.rounds]
        ax.plot(rounds, ys, marker="o", label=f"path {p}" if p != "all" else "all (routed)",
                linewidth=2.5 if p == "all" else 1.2)
    ax.set_xlabel("outer round")
    ax.set_ylabel("routed validation loss (nats/byte)")
    ax.set_title(f"pathswarm demo: {result.mode}, {result.workers} workers, H={result.inner_steps}")
    save_figure(fig, ax, path)


def run_simulated_demo(rounds: int, inner_steps: int, out_dir: Path, json_path: Path | None = None,
                       plot_path: Path | None = None) -> SimResult:
    console = Console(stderr=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    base = SwarmSpec(name="pathswarm-demo", inner=InnerOptSpec(steps=inner_steps))
    docs = load_documents(base.data)
    spec = init_spec(base, docs)
    spec_path = out_dir / "swarm.toml"
    spec_path.write_text(spec.to_toml(), encoding="utf-8")
    console.print(format_init_report(spec, docs))
    # The simulator checkpoints every module: with the spec beside it, that is a whole model (node/train/model_dir.py).
    model_dir = out_dir / "model"
    cfg = SimConfig(mode="dipaco", rounds=rounds, inner_steps=inner_steps, checkpoint_dir=str(model_dir))
    result = run_with_progress(spec, cfg, console)
    (model_dir / SPEC_FILE).write_text(spec.to_toml(), encoding="utf-8")
    json_path = json_path or out_dir / "demo.json"
    plot_path = plot_path or out_dir / "demo.png"
    write_json_atomic(json_path, {**result.to_json(), "rounds_completed": len(result.rounds)})
    plot_losses(result, plot_path)
    console.print(f"spec {spec_path} · JSON {json_path} · plot {plot_path}")
    print_model_commands(console, model_dir)
    return result


def _node_table(swarm, names: list[str]):
    table = Table(title="pathswarm local swarm")
    for col in ("node", "path", "state", "round", "inner step", "loss", "tok/s", "group", "sent", "received"):
        table.add_column(col, justify="right")
    for name in names:
        st = swarm.status(name) or {}
        alive = swarm.nodes[name].poll() is None
        table.add_row(name, st.get("path", "…"), st.get("state", "starting") if alive else
                      f"exited {swarm.nodes[name].returncode}", str(st.get("round", 0)), str(st.get("inner_step", 0)),
                      f"{st.get('loss', float('nan')):.3f}", f"{st.get('tokens_per_s', 0):.0f}",
                      str(st.get("last_group", 0)), fmt_bytes(st.get("bytes_sent", 0)),
                      fmt_bytes(st.get("bytes_received", 0)))
    return table


def summarize(spec: SwarmSpec, statuses: dict[str, dict]) -> dict:
    """The demo's JSON: losses per path, bytes vs fp32 data-parallel, replica agreement."""
    counts = count_module_params(spec)
    before: dict[str, list[float]] = {}
    after: dict[str, list[float]] = {}
    ddp = 0
    n = max(1, len(statuses))
    for st in statuses.values():
        before.setdefault(st["path"], []).append(st["val_loss_before"])
        after.setdefault(st["path"], []).append(st["val_loss_after"])
        params = sum(counts[m] for m in st["digests"])
        ddp += ddp_fp32_bytes(params, st["inner_step"], n)
    replicas = check_replicas(statuses)  # every node's digest for each (module, round), whatever its group
    sent = sum(st["bytes_sent"] for st in statuses.values())
    return {
        "nodes": len(statuses),
        "rounds_completed": min((st["round"] for st in statuses.values()), default=0),
        "val_loss_before": {p: sum(v) / len(v) for p, v in sorted(before.items())},
        "val_loss_after": {p: sum(v) / len(v) for p, v in sorted(after.items())},
        "bytes_sent_total": sent,
        "bytes_received_total": sum(st["bytes_received"] for st in statuses.values()),
        "ddp_fp32_bytes_equivalent": ddp,
        "compression_vs_ddp": ddp / sent if sent else None,
        "replicas_identical": replicas.identical,
        "replica_digests_compared": replicas.digests_compared,
        "split_rounds": replicas.split_rounds,
        "splits": [str(s) for s in replicas.splits],
        "loss_curves": {name: {"path": st["path"], "train_loss": st["loss_curve"]} for name, st in statuses.items()},
        "per_node": {name: {k: st[k] for k in ("path", "round", "rounds_failed", "tokens_trained", "bytes_sent",
                                               "bytes_received")} for name, st in statuses.items()},
    }


def plot_node_curves(summary: dict, path: Path) -> None:
    fig, ax = subplots(figsize=(7, 4))
    for name, curve in sorted(summary["loss_curves"].items()):
        ys = curve["train_loss"]
        ax.plot(range(1, len(ys) + 1), ys, marker="o", label=f"{name} (path {curve['path']})")
    ax.set_xlabel("outer round")
    ax.set_ylabel("training loss (nats/byte)")
    ax.set_title("pathswarm local swarm: loss per node and path")
    save_figure(fig, ax, path)


@contextlib.contextmanager
def demo_dashboard(spec: SwarmSpec, maddr: str, port: int | None, console: Console):
    """The swarm's dashboard while the demo runs (port None: none; a taken port falls back to a free one)."""
    if port is None:
        yield None
        return
    from pathswarm.node.app.dashboard.run import swarm_poll
    from pathswarm.node.app.dashboard.server import start_dashboard
    from pathswarm.node.app.dashboard.view import DashboardState
    from pathswarm.protocol.net import start_net

    sdht = start_net([maddr], spec=spec, client_mode=True)
    try:
        board = start_dashboard(DashboardState(spec), swarm_poll(spec, lambda: sdht), "127.0.0.1", port,
                                fallback=True, poll_s=3.0)
        console.print(f"dashboard: {board.url} (open it in a browser while the demo runs)")
        try:
            yield board
        finally:
            board.stop()
    finally:
        sdht.shutdown()


def run_demo(nodes: int, rounds: int, inner_steps: int, out_dir: Path, json_path: Path | None = None,
             plot_path: Path | None = None, grace_s: float = 20.0, dashboard_port: int | None = 8470) -> dict:
    console = Console(stderr=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    base = SwarmSpec(name="pathswarm-demo", inner=InnerOptSpec(steps=inner_steps),
                     averaging=AveragingSpec(grace_s=grace_s, claim_ttl_s=30.0))
    docs = load_documents(base.data)
    spec = init_spec(base, docs)
    spec_path = out_dir / "swarm.toml"
    spec_path.write_text(spec.to_toml(), encoding="utf-8")
    console.print(format_init_report(spec, docs))
    names = [f"node{i}" for i in range(nodes)]
    t0 = time.monotonic()
    with LocalSwarm(spec_path, out_dir / "swarm") as swarm:
        console.print(f"bootstrap peer at {swarm.start_bootstrap()}")
        for i, name in enumerate(names):
            swarm.start_node(name, path="auto", max_rounds=rounds, seed=i, extra=["--wait-peers", str(nodes)])
        with demo_dashboard(spec, swarm.maddr, dashboard_port, console), \
                Live(_node_table(swarm, names), console=console, refresh_per_second=2) as live:
            codes = swarm.wait_nodes(names, timeout_s=3600, on_tick=lambda: live.update(_node_table(swarm, names)))
            live.update(_node_table(swarm, names))
    failed = {n: c for n, c in codes.items() if c != 0}
    if failed:
        raise RuntimeError(f"nodes exited with errors {failed}; logs in {out_dir / 'swarm'}")
    statuses = {n: st for n in names if (st := swarm.status(n)) is not None}
    if len(statuses) < len(names):
        raise RuntimeError(f"nodes {sorted(set(names) - set(statuses))} wrote no status; logs in {out_dir / 'swarm'}")
    summary = summarize(spec, statuses)
    summary["wall_s"] = time.monotonic() - t0
    table = Table(title=f"{count(nodes, 'node')}, {count(summary['rounds_completed'], 'round')}, "
                        f"{summary['wall_s']:.0f} s")
    for col in ("path", "val loss before", "val loss after", "change"):
        table.add_column(col, justify="right")
    for p, b in summary["val_loss_before"].items():
        a = summary["val_loss_after"][p]
        table.add_row(p, f"{b:.4f}", f"{a:.4f}", f"{(a - b) / b:+.1%}")
    ratio = summary["compression_vs_ddp"] or float("inf")
    table.caption = (f"sent {fmt_bytes(summary['bytes_sent_total'])} vs fp32 data-parallel "
                     f"{fmt_bytes(summary['ddp_fp32_bytes_equivalent'])} ({ratio:,.0f}x less) · replicas "
                     f"{'identical' if summary['replicas_identical'] else 'DIFFER'} "
                     f"({summary['replica_digests_compared']} module-round digests compared, "
                     f"{summary['split_rounds']} split rounds)")
    console.print(table)
    json_path = json_path or out_dir / "demo.json"
    plot_path = plot_path or out_dir / "demo.png"
    model_dir = out_dir / "model"
    summary["model"] = assemble_demo_model(spec, [swarm.node_files(n)["checkpoint"] for n in names], model_dir)
    write_json_atomic(json_path, summary)
    plot_node_curves(summary, plot_path)
    console.print(f"spec {spec_path} · JSON {json_path} · plot {plot_path} · logs {out_dir / 'swarm'}")
    print_model_commands(console, model_dir)
    return summary


def assemble_demo_model(spec: SwarmSpec, checkpoints: list[Path], model_dir: Path) -> dict:
    """The whole model out of the nodes' checkpoints (node/train/assemble.py): every module at the newest round the
    nodes agree on, with the spec beside it."""
    modules, chosen, trained = assemble(spec, checkpoints)
    write_model(model_dir, spec, modules, provenance(chosen, trained))
    return {"dir": str(model_dir), "modules": {c.module: c.round for c in chosen}}


DEMO_PROMPTS = ("The striker scored twice in the second half as United beat Chelsea",
                "The prime minister told MPs the election would be held in May")


def print_model_commands(console: Console, model_dir: Path) -> None:
    console.print(f"whole model (every path): {model_dir}", soft_wrap=True)
    for prompt in DEMO_PROMPTS:  # a sports and a politics sentence: the router sends them to different paths
        console.print(f"  pathswarm generate --checkpoint {model_dir} --prompt \"{prompt}\"", soft_wrap=True)
    console.print(f"  pathswarm model export {model_dir} --hf {model_dir.parent / 'hf'}", soft_wrap=True)
