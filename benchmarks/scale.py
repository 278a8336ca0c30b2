"""Bytes per node per round as the group grows: one reducer per module and round (star) against rounds in slices.

Real `pathswarm node run` processes on 127.0.0.1 (p2pd, no mocks), N of them, on a 1x1 spec (two levels of one module:
every node holds every module) and on a 2x2 grid (every node holds `shared`, half of them each level module). Bytes are
counted at the transport (protocol/wire.py `Traffic`: every message of the rounds, audits and state downloads
included, headers too), read from each node's status file the moment it reports each round, so that a run splits
into its phases:
- round 0 has no agreed list yet: the slices arm cuts it by the holders in the claims (protocol/rounds/slices.py
  `agreed_list`; before code 715d2bd one reducer in both arms);
- rounds 1-3 are the reducers' checked rounds (node/peer/audit.py `NEW_REDUCER_AUDITS`): members download the
  frames of every new reducer's round before applying it (`probation` below);
- round 4 is a transition (STEADY_FROM), the rounds after it the steady state, audited at random at the nodes'
  default rate (`steady`).
Per arm and N: each node's bytes sent and received per round in each phase, the busiest node's ÷ the median node's,
the busiest node's ÷ one full frame of its modules (a star member's bytes sent per round: its frame and a header),
and the round's wall time (median over nodes of the time between two rounds, steady state).

    python benchmarks/scale.py                      # N = 2, 4, 8, 16; both specs; star and slices
    python benchmarks/scale.py --sizes 4,8 --grids 1x1 --rounds 7
Goals (issue 28): busiest ÷ median ≤ 1.5 at N = 4, 8, 16 (star: 5.3 and 22 at 4 and 8); at N = 16 in steady state
every node sends and receives each ≤ 2.5 full frames per round. Rounds here are on loopback, where their wall time
is CPU time (N processes on this machine's cores), not link time: benchmarks/links_rounds.py times rounds on the
shaped links of tests/links.py.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from _cpu import CpuSampler
from _swarm_common import arguments, machine, save_plot, write_json
from _swarm_common import read_json as read_results

from pathswarm.node.app.local_swarm import LocalSwarm, read_json
from pathswarm.node.app.replicas import replica_mismatches
from pathswarm.node.app.swarm_init import init_spec
from pathswarm.node.model.data import load_documents
from pathswarm.node.model.model import count_module_params
from pathswarm.protocol.spec import AveragingSpec, InnerOptSpec, ModelSpec, SwarmSpec

GRIDS = {"1x1": (1, 1), "2x2": (2, 2)}
SLICES = 16
"""The sliced arm's cap: at most one slice per member, so N slices up to 16 members."""
PROBATION = range(1, 4)
"""Rounds whose results are checked before applying (the first three of each new reducer: all reducers are new)."""
STEADY_FROM = PROBATION.stop + 1
"""The steady state is counted from the report of this round on. The round after the checked ones is a transition:
a node reports round 4 as soon as it applied it, while it still serves the frames of the slices it reduced in round 3
to the members checking them (a node that reported early sent up to 10 frames in that round at 16 nodes, against 2-3
in every later one: benchmarks/results/scale.json `seen`)."""


def write_spec(workdir: Path, grid: str, slices: int, h: int, grace_s: float) -> tuple[SwarmSpec, Path]:
    base = SwarmSpec(name=f"scale-{grid}-k{slices}", levels=GRIDS[grid],
                     model=ModelSpec(width=128, base_width=128, n_heads=4, layers_per_module=1, context_len=64),
                     inner=InnerOptSpec(steps=h, batch_size=4, warmup_steps=2),
                     averaging=AveragingSpec(grace_s=grace_s, timeout_s=120.0, claim_ttl_s=30.0, slices=slices))
    spec = init_spec(base, load_documents(base.data))
    path = workdir / f"{grid}-k{slices}.toml"
    path.write_text(spec.to_toml())
    return spec, path


def path_of(i: int, grid: str) -> str:
    levels = GRIDS[grid]
    return ".".join(str((i >> lv) % k) for lv, k in enumerate(levels))


def run(workdir: Path, grid: str, n: int, slices: int, rounds: int, h: int, grace_s: float,
        debug: bool = False) -> dict:
    """N nodes for `rounds` rounds; each node's cumulative bytes (and audits) as of each round it reported."""
    spec, spec_path = write_spec(workdir, grid, slices, h, grace_s)
    names = [f"n{i:02d}" for i in range(n)]
    seen: dict[str, dict[int, tuple[float, int, int, int]]] = {x: {} for x in names}
    t0 = time.monotonic()
    with CpuSampler() as cpu, LocalSwarm(spec_path, workdir / f"{grid}-n{n}-k{slices}", debug=debug) as swarm:
        swarm.start_bootstrap()
        for i, name in enumerate(names):
            swarm.start_node(name, path=path_of(i, grid), max_rounds=rounds, seed=i,
                             extra=["--wait-peers", str(n)])
        files = {x: swarm.node_files(x)["status.json"] for x in names}
        deadline = time.monotonic() + 3600
        while time.monotonic() < deadline:
            for x in names:
                st = read_json(files[x])
                if st and st.get("round", 0) not in seen[x]:
                    seen[x][st["round"]] = (time.monotonic(), st["bytes_sent"], st["bytes_received"],
                                            st.get("audits", 0))
            if all(p.poll() is not None for p in swarm.nodes.values()):
                break
            time.sleep(0.05)
        codes = {x: swarm.nodes[x].poll() for x in names}
        statuses = {x: read_json(files[x]) for x in names}
    if any(codes.values()):
        raise SystemExit(f"{grid} N={n} slices={slices}: a node failed: {codes}")
    mismatches, compared = replica_mismatches(list(statuses.values()))
    counts = count_module_params(spec)
    first_path = tuple(int(p) for p in path_of(0, grid).split("."))
    return {"grid": grid, "nodes": n, "slices_cap": slices, "rounds": rounds, "inner_steps": h,
            "params_per_path": sum(counts[m] for m in spec.module_ids(first_path)),
            "replica_mismatches": mismatches, "replicas_compared": compared,
            "tokens_reduced": {x: statuses[x]["tokens_reduced"] for x in names},
            "seen": {x: {str(r): v for r, v in seen[x].items()} for x in names}, "wall_s": time.monotonic() - t0,
            "cpu_core_s": cpu.seconds()}  # by kind of process, the whole run


def per_round(seen: dict[str, list], first: int, last: int) -> tuple[float, float] | None:
    """(sent, received) per round between the reports of rounds `first` and `last` (None: a report missed)."""
    a, b = seen.get(str(first)), seen.get(str(last))
    if a is None or b is None or last <= first:
        return None
    return (b[1] - a[1]) / (last - first), (b[2] - a[2]) / (last - first)


def phases(result: dict) -> dict:
    """Per node and phase: bytes sent and received per round; the round's wall time in steady state."""
    rounds = result["rounds"]
    out = {"round0": {}, "probation": {}, "steady": {}, "steady_round_s": None}
    spans = {"round0": (0, 1), "probation": (PROBATION.start, PROBATION.stop), "steady": (STEADY_FROM, rounds)}
    times = []
    for node, seen in result["seen"].items():
        for phase, (a, b) in spans.items():
            got = per_round(seen, a, b)
            if got is not None:
                out[phase][node] = {"sent": got[0], "received": got[1]}
        a, b = seen.get(str(STEADY_FROM)), seen.get(str(rounds))
        if a and b:
            times.append((b[0] - a[0]) / (rounds - STEADY_FROM))
    out["steady_round_s"] = statistics.median(times) if times else None
    return out


def summary(nodes: dict[str, dict], frame: float) -> dict:
    if not nodes:
        return {}
    sent = [v["sent"] for v in nodes.values()]
    received = [v["received"] for v in nodes.values()]
    busiest = [max(v["sent"], v["received"]) for v in nodes.values()]
    return {"busiest_over_median_sent": max(sent) / statistics.median(sent),
            "busiest_over_median_received": max(received) / statistics.median(received),
            "busiest_over_median": max(busiest) / statistics.median(busiest),
            "max_sent_frames": max(sent) / frame, "max_received_frames": max(received) / frame,
            "median_sent": statistics.median(sent), "max_sent": max(sent), "max_received": max(received)}


def plot(results: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grids = sorted({r["grid"] for r in results})
    fig, axes = plt.subplots(1, len(grids), figsize=(6 * len(grids), 4.2), squeeze=False)
    for ax, grid in zip(axes[0], grids, strict=True):
        for arm, style in (("star", "o-"), ("slices", "s-")):
            rows = sorted((r for r in results if r["grid"] == grid and r["arm"] == arm), key=lambda r: r["nodes"])
            rows = [r for r in rows if r["summary"]["steady"]]
            if not rows:
                continue
            ns = [r["nodes"] for r in rows]
            ax.plot(ns, [r["summary"]["steady"]["max_sent"] / 1e6 for r in rows], style, label=f"{arm}: busiest node")
            ax.plot(ns, [r["summary"]["steady"]["median_sent"] / 1e6 for r in rows], style, alpha=0.45,
                    label=f"{arm}: median node")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("nodes holding the module group (N)")
        ax.set_ylabel("MB sent per node per round (steady state)")
        ax.set_title(f"{grid} spec: bytes per node against N")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    save_plot(fig, path)


def measure(args: argparse.Namespace) -> list[dict]:
    runs = []
    with tempfile.TemporaryDirectory(prefix="pathswarm-scale-") as tmp:
        work = Path(args.workdir or tmp)
        work.mkdir(parents=True, exist_ok=True)
        for grid in args.grids.split(","):
            for n in (int(x) for x in args.sizes.split(",")):
                for arm in args.arms.split(","):
                    slices = 1 if arm == "star" else SLICES
                    print(f"{grid} N={n} {arm} ...", flush=True)
                    got = run(work, grid, n, slices, args.rounds, args.inner_steps, args.grace_s, args.debug)
                    got["arm"] = arm
                    got["phases"] = phases(got)
                    runs.append(got)
                    print(f"  {got['wall_s']:.0f} s; replicas compared {got['replicas_compared']}, "
                          f"mismatches {len(got['replica_mismatches'])}", flush=True)
    return runs


def main() -> None:
    ap = arguments(__doc__, "scale", plot=True, replot=True)
    ap.add_argument("--sizes", default="2,4,8,16", help="comma-separated node counts")
    ap.add_argument("--grids", default="1x1,2x2", help="comma-separated specs: 1x1, 2x2")
    ap.add_argument("--arms", default="star,slices")
    ap.add_argument("--rounds", type=int, default=11,
                    help="rounds per run (0, 1-3 checked, 4 the transition, the rest steady)")
    ap.add_argument("--resummarize", action="store_true",
                    help="only recompute the phases, summaries and goals of the runs in --json (their raw reports)")
    ap.add_argument("--inner-steps", type=int, default=10)
    ap.add_argument("--grace-s", type=float, default=30.0,
                    help="grace window: N processes share this machine's cores, so a round's slowest member lags")
    ap.add_argument("--workdir", default="", help="keep the nodes' logs and statuses here")
    ap.add_argument("--debug", action="store_true", help="the nodes log at debug level (with --workdir)")
    ap.add_argument("--frame-bytes-from", default="",
                    help="a scale.py JSON whose star runs give the full frame's bytes where this run has no star arm "
                         "(--arms slices: the same spec and N, so the same frame)")
    args = ap.parse_args()
    if args.replot:
        plot(read_results(args.json)["runs"], args.plot)
        return
    if args.rounds <= STEADY_FROM:
        raise SystemExit(f"--rounds must be above {STEADY_FROM}: the steady state comes after the checked rounds")
    if args.resummarize:  # the phases and goals again from the runs' raw reports (`seen`), measured before
        saved = read_results(args.json)
        runs = saved["runs"]
        frame_from = args.frame_bytes_from or saved["args"].get("frame_bytes_from", "")
        args = argparse.Namespace(**{**saved["args"], "json": args.json, "plot": args.plot,
                                     "frame_bytes_from": frame_from})
        for got in runs:
            got["phases"] = phases(got)
    else:
        runs = measure(args)
    # One full frame of a node's modules: what a star member sends per round in steady state (its frames, headers).
    frame_from = getattr(args, "frame_bytes_from", "")
    stars = runs + (read_results(frame_from)["runs"] if frame_from else [])
    for r in runs:
        star = next((s for s in stars if s["grid"] == r["grid"] and s["nodes"] == r["nodes"] and s["arm"] == "star"),
                    None)
        frame = None
        if star is not None and star["phases"]["steady"]:
            frame = statistics.median(v["sent"] for v in star["phases"]["steady"].values())
        r["frame_bytes"] = frame
        r["summary"] = {phase: summary(r["phases"][phase], frame or 1.0) for phase in ("round0", "probation", "steady")}
        r["summary"]["steady_round_s"] = r["phases"]["steady_round_s"]
    goals = {"busiest_over_median_at_4_8_16": 1.5, "at_16_frames_each_way": 2.5}
    verdict = {}
    for r in runs:
        if r["arm"] != "slices" or not r["summary"]["steady"]:
            continue
        s = r["summary"]["steady"]
        key = f"{r['grid']} N={r['nodes']}"
        verdict[key] = {"busiest_over_median": s["busiest_over_median"],
                        "meets_1.5": s["busiest_over_median"] <= 1.5 if r["nodes"] >= 4 else None,
                        "max_frames_sent": s["max_sent_frames"], "max_frames_received": s["max_received_frames"],
                        "meets_2.5_frames": (max(s["max_sent_frames"], s["max_received_frames"]) <= 2.5
                                             if r["nodes"] == 16 else None)}
    write_json(args.json, {"machine": machine(), "goals": goals, "verdict": verdict, "runs": runs,
                           "args": vars(args)})
    plot(runs, args.plot)


if __name__ == "__main__":
    main()
