"""Rounds measured on shaped links, against the scale model (issue 29: the model within 20 % at 8 and 16 nodes).

Real `pathswarm node run` processes, each in its own namespace of the link harness (tests/links.py), every node on
one path of a 1x1 spec (every node holds both modules), rounds in slices (`[averaging] slices` = the nodes). Every
node's link is the same: --up-mbps / --down-mbps, --rtt-ms, --loss (default: the `home` profile's rates × 0.2, no
delay or loss, as benchmarks/vs_peers.py scales it; a delay or a loss puts tests/linkdelay.py in the path, whose
CPU the nodes then miss). The measured round is each node's `round_wire_s` (status: from sending a module's outer
gradient to its last reply), the later of its two modules'; only the steady rounds count (from round
1 + NEW_REDUCER_AUDITS on, every slice's reducer past its checked rounds), and of each round the shortest wait, the
last sender's: nodes finish their inner steps seconds apart here (8-16 processes on 2 cores), and the first to send
waits for the last one's compute, while the model starts every send at once. The model
(benchmarks/_round_events.py `validate_entries`) gets the same nodes, link, slices and the path's parameters as one
module (both modules' rounds share the links at once), every holder merged (the quorum is every claimant).

The model has links and no CPU; here 8-16 processes share 2 cores, and a round's decode, merge, encode and stream
handling wait for a core (at 16 nodes the p2pd daemons and DHT processes alone took 1.2 core-s a node and round,
`results/links_rounds_cpu.json`). So each N also runs once on the `lan` profile (10 Gbit/s, where the links cost
nothing), the same statistic of its steady rounds being the host's floor (`host_floor_s`, `_round_events.py`
`validate_entries`): the model's round is its network time plus that floor, and both errors are written (the
network's alone too). `--no-floor` skips those runs; `--floors-for FILE` runs only the floors of an earlier run's.

    nice -n 10 .venv/bin/python benchmarks/links_rounds.py          # ≈ 25 min on 2 cores (root: namespaces)
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _cpu import CpuSampler
from _round_events import NEW_REDUCER_AUDITS, validate_entries
from _swarm_common import arguments, machine, write_json

from pathswarm.node.app.local_swarm import LocalSwarm
from pathswarm.node.app.replicas import replica_mismatches
from pathswarm.node.app.swarm_init import init_spec
from pathswarm.node.model.data import load_documents
from pathswarm.node.model.model import count_module_params
from pathswarm.protocol.spec import AveragingSpec, InnerOptSpec, ModelSpec, SwarmSpec
from tests.links import PROFILES, Links, Profile, unavailable

GOAL = 0.20


def run(nodes: int, a, work: Path, link: Profile) -> dict:
    base = SwarmSpec(name=f"links-rounds-{nodes}", levels=(1,),
                     model=ModelSpec(width=a.width, base_width=64, n_heads=4, layers_per_module=a.layers,
                                     context_len=64),
                     inner=InnerOptSpec(steps=a.inner_steps, batch_size=8),
                     averaging=AveragingSpec(grace_s=a.grace_s, timeout_s=120.0, claim_ttl_s=30.0, slices=nodes))
    spec = init_spec(base, load_documents(base.data))
    spec_path = work / f"swarm-{nodes}-{link.name}.toml"
    spec_path.write_text(spec.to_toml())
    names = [f"n{i}" for i in range(nodes)]
    t_start = time.monotonic()
    with CpuSampler() as cpu, Links([PROFILES["lan"], *[link] * nodes]) as net, \
            LocalSwarm(spec_path, work / f"run-{nodes}-{link.name}", debug=a.debug) as swarm:
        swarm.netns.update({"bootstrap": net.ns(0), **{n: net.ns(i + 1) for i, n in enumerate(names)}})
        swarm.start_bootstrap(args=["--swarm", str(spec_path), "--host-maddr", net.maddr(0)], timeout_s=120)
        for i, name in enumerate(names):
            swarm.start_node(name, path="0", max_rounds=a.rounds, seed=i,
                             extra=["--wait-peers", str(nodes), "--host-maddr", net.maddr(i + 1)])
        # The CPU control (--cpu-of): offline nodes (the same training loop, no network) bring the processes on this
        # machine's cores to that count, so that a small swarm's rounds see the CPU contention of a large one's.
        for i in range(max(0, a.cpu_of - nodes)):
            swarm.start_node(f"busy{i}", path="0", seed=100 + i, extra=["--offline"])
        codes = swarm.wait_nodes(names, timeout_s=1200)
        if any(codes.values()):
            raise RuntimeError({n: swarm.tail(n, 10) for n, c in codes.items() if c})
        st = {n: swarm.status(n) for n in names}
    steady = 1 + NEW_REDUCER_AUDITS
    waits: dict[int, list[float]] = {}  # round → each node's wait
    for s in st.values():
        by_round: dict[int, list[float]] = {}
        for pairs in s["round_wire_s"].values():
            for r, t in pairs:
                by_round.setdefault(int(r), []).append(t)
        # a node's wait is the later of its modules' (both on the wire at once); only rounds both modules applied
        for r, ts in by_round.items():
            if r >= steady and len(ts) == len(s["module_rounds"]):
                waits.setdefault(r, []).append(max(ts))
    # The model starts every node's send at once; here nodes finish their inner steps seconds apart (8-16 processes
    # on 2 cores), and the first to send waits for the last. The last sender's wait is the round on the wire.
    per_round = [min(w) for _, w in sorted(waits.items())]
    mismatches, compared = replica_mismatches(list(st.values()))
    numel = sum(count_module_params(spec).values())
    return {"nodes": nodes, "slices": nodes, "numel": numel, "offline_nodes_beside": max(0, a.cpu_of - nodes),
            "frame_bytes_per_value": a.frame_bytes_per_value, "frame_bytes": numel * a.frame_bytes_per_value,
            "up_bps": link.up_bps, "down_bps": link.down_bps, "one_way_latency_s": link.rtt_s / 2,
            "min_group": nodes, "grace_s": None,
            "measured_round_s": statistics.median(per_round), "measured_rounds": per_round,
            "replicas_identical": not mismatches, "compared": compared, "wall_s": time.monotonic() - t_start,
            # core-seconds by kind of process over the whole run (rounds 0 to the last, setup included)
            "cpu_core_s": cpu.seconds()}


def main() -> None:
    ap = arguments(__doc__, "links_rounds")
    ap.add_argument("--nodes", default="8,16")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--inner-steps", type=int, default=20)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--grace-s", type=float, default=30.0)
    ap.add_argument("--up-mbps", type=float, default=PROFILES["home"].up_bps * 0.2 / 1e6)
    ap.add_argument("--down-mbps", type=float, default=PROFILES["home"].down_bps * 0.2 / 1e6)
    ap.add_argument("--rtt-ms", type=float, default=0.0)
    ap.add_argument("--loss", type=float, default=0.0)
    ap.add_argument("--frame-bytes-per-value", type=float, default=0.796,
                    help="int8 + zstd bytes per value of a frame (the scale model's, from results/wire.json)")
    ap.add_argument("--no-floor", action="store_true",
                    help="skip the runs on `lan` that measure the host's floor (the model's round is then links only)")
    ap.add_argument("--floors-for", default="",
                    help="an earlier run's JSON (same options, no floors): run only the floors of its shaped runs and "
                         "write them together (its config is kept, with this run's floor options beside it)")
    ap.add_argument("--workdir", default="", help="keep the processes' logs and statuses here")
    ap.add_argument("--debug", action="store_true", help="the nodes log at debug level (with --workdir)")
    ap.add_argument("--cpu-of", type=int, default=0,
                    help="run offline nodes beside each run's swarm up to this many training processes (the CPU "
                         "control: a 4-node run with --cpu-of 16 competes for the cores as a 16-node run does)")
    a = ap.parse_args()
    why = unavailable()
    if why:
        sys.exit(f"links_rounds needs the link harness: {why}")
    shaped = Profile("shaped", up_bps=a.up_mbps * 1e6, down_bps=a.down_mbps * 1e6, rtt_s=a.rtt_ms / 1e3,
                     loss=a.loss)
    earlier = json.loads(Path(a.floors_for).read_text()) if a.floors_for else None
    entries = []
    with tempfile.TemporaryDirectory(prefix="links-rounds-") as tmp:
        work = Path(a.workdir or tmp)
        work.mkdir(parents=True, exist_ok=True)
        for n in (int(x) for x in a.nodes.split(",")) if earlier is None else (e["nodes"] for e in earlier["runs"]):
            if earlier is None:
                entry = run(n, a, work, shaped)
            else:
                entry = next(e for e in earlier["runs"] if e["nodes"] == n)
                for key, value in earlier["config"].items():  # the floor runs with the shaped runs' model and H
                    if key in ("rounds", "inner_steps", "width", "layers", "grace_s"):
                        setattr(a, key, value)
            print(f"{n} nodes: steady round {entry['measured_round_s']:.2f} s "
                  f"(replicas identical: {entry['replicas_identical']})", flush=True)
            if not a.no_floor:
                floor = run(n, a, work, PROFILES["lan"])
                entry |= {"host_floor_s": floor["measured_round_s"], "floor_run": floor}
                print(f"{n} nodes on lan (the host's floor): steady round {floor['measured_round_s']:.2f} s "
                      f"(replicas identical: {floor['replicas_identical']})", flush=True)
            entries.append(entry)
    checked = validate_entries([{k: v for k, v in e.items() if k not in ("measured_rounds", "cpu_core_s", "floor_run")}
                                for e in entries])
    for e, c in zip(entries, checked, strict=True):
        e |= {k: c[k] for k in ("model_round_s", "model_network_s", "relative_error", "network_only_error")}
        e["within_goal"] = abs(c["relative_error"]) <= GOAL
        print(f"{e['nodes']} nodes: measured {e['measured_round_s']:.2f} s, model {e['model_round_s']:.2f} s "
              f"({100 * e['relative_error']:+.0f} %; links alone {e['model_network_s']:.2f} s, "
              f"{100 * e['network_only_error']:+.0f} %)")
    write_json(a.json, {"claim": "the scale model's round time (its links, plus the host's floor measured on lan "
                                 "unless --no-floor) within 20 % of rounds measured on shaped links",
                        "machine": machine(), "config": {k: v for k, v in vars(a).items() if k != "json"}
                        if earlier is None else {**earlier["config"], "floors": {k: v for k, v in vars(a).items()
                                                                                 if k != "json"}},
                        "goal_relative_error": GOAL, "runs": entries,
                        "met": all(e["within_goal"] for e in entries)})


if __name__ == "__main__":
    main()
