"""The DHT's load per node and round as the swarm grows, by the way a node searches it (issue 28: a round's wall time
on shaped links at 16 nodes against 4; issue 29: a swarm of 1,000).

N real DHT peers (`start_net`: hivemind's DHT process and p2pd each, on 127.0.0.1), each holding one path of a 1x1
spec (every peer holds both modules, as in benchmarks/scale.py and links_rounds.py), all claiming it. Then rounds,
every peer at once, each doing what a node does with the DHT in one of its rounds:
- read the claims (the read before a send: node/peer/seat.py `refresh_for_send`);
- store its records (node/peer/announce.py: each module's announcement and its metrics);
- read its modules' announcements (the split watch, node/peer/splits.py `look`).
The arms differ only in how:
- `per_record`: a store per record and a read per module, and the spec-server listing every round (the node before
  `SwarmNet.store_many`);
- `batched`: the round's records in one store, the modules' announcements in one read (the node now), every search
  keeping hivemind's bucket size (20) of nearest peers: in a swarm under 20 peers, every one of them;
- `batched_beam10`: the same, searches keeping the 10 nearest (`SwarmNet.search_beam`: twice the 5 a record is stored
  on). Not the node's default (protocol/net/start.py `SEARCH_BEAM` says why).
Measured per arm: core-seconds of the peers' DHT processes and of their p2pd daemons per peer and round (read from
/proc, the rounds only), and the wall time of a round; at the end of each arm, every peer must read every claim and
every holder's announcement of each module (`all_seen`), or the arm loses records.

    unshare -n bash -c "ip link set lo up; python benchmarks/dht_load.py"     # ≈ 6 min on 2 cores
"""

from __future__ import annotations

import statistics
import threading
import time

from _cpu import PROC, CpuSampler, _cmdline, _stat
from _swarm_common import arguments, machine, save_plot, write_json
from _swarm_common import read_json as read_results

from pathswarm.protocol.dht import (
    announce_module,
    announcement_entry,
    metrics_entry,
    publish_claim,
    publish_entries,
    publish_metrics,
    read_claims,
    read_module_holders,
    read_modules_holders,
)
from pathswarm.protocol.net import start_net
from pathswarm.protocol.net.start import SEARCH_BEAM
from pathswarm.protocol.records import ModuleAnnouncement, NodeMetrics, PathClaim
from pathswarm.protocol.spec import SwarmSpec
from pathswarm.protocol.spec_share import announce_spec_server

SPEC = SwarmSpec(name="dht-load", levels=(1, 1))
PATH = (0, 0)
ARMS = {"per_record": SEARCH_BEAM, "batched": SEARCH_BEAM, "batched_beam10": 10}
"""arm → the search beam it sets (None: hivemind's default, its bucket size, 20)."""


def records(net, round_: int) -> tuple[list[ModuleAnnouncement], NodeMetrics]:
    digest = f"{round_ % 256:02x}" * 32
    anns = [ModuleAnnouncement(module_id=mid, round=round_, digest=digest, peer_id=net.peer_id, numel=1 << 20,
                               chain=tuple((r, digest, digest) for r in range(max(0, round_ - 3), round_)))
            for mid in SPEC.module_ids(PATH)]
    metrics = NodeMetrics(path=PATH, peer_id=net.peer_id, round=round_, loss=3.0, tokens_per_s=1000.0,
                          bytes_sent=round_ << 20, bytes_received=round_ << 20,
                          history=tuple((r, 3.0) for r in range(max(0, round_ - 20), round_)))
    return anns, metrics


def one_round(net, arm: str, round_: int) -> None:
    read_claims(net, SPEC)
    anns, metrics = records(net, round_)
    if arm == "per_record":
        for ann in anns:
            announce_module(net, SPEC, ann, 60)
        publish_metrics(net, SPEC, metrics, 60)
        announce_spec_server(net, SPEC.swarm_id)
        for mid in SPEC.module_ids(PATH):
            read_module_holders(net, SPEC, mid)
    else:
        publish_entries(net, [announcement_entry(net, SPEC, a, 60) for a in anns] + [metrics_entry(net, SPEC,
                                                                                                   metrics, 60)])
        read_modules_holders(net, SPEC, list(SPEC.module_ids(PATH)))


def classifier(dht_pids: set[int]):
    def kind_of(pid: str) -> str | None:
        if int(pid) in dht_pids:
            return "dht"
        stat = _stat(pid)
        if stat and int(stat[1]) in dht_pids and "p2pd" in _cmdline(pid):
            return "p2pd"
        return None
    return kind_of


def run_arm(nets: list, arm: str, rounds: int, first_round: int) -> dict:
    for net in nets:
        net.search_beam = ARMS[arm]
    dht_pids = {net.dht.pid for net in nets}
    walls = []
    with CpuSampler(period_s=0.25, kind_of=classifier(dht_pids), kinds=("dht", "p2pd")) as cpu:
        for r in range(first_round, first_round + rounds):
            errors: list[BaseException] = []

            def go(net, r=r, errors=errors):
                try:
                    one_round(net, arm, r)
                except BaseException as e:  # reported below
                    errors.append(e)
            threads = [threading.Thread(target=go, args=(net,)) for net in nets]
            t0 = time.monotonic()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            walls.append(time.monotonic() - t0)
            if errors:
                raise errors[0]
    used = cpu.seconds()
    n = len(nets)
    last = first_round + rounds - 1
    seen = all(len(read_claims(net, SPEC)) == n and all(
        sum(a.round == last for a in anns) == n for anns in read_modules_holders(net, SPEC, list(
            SPEC.module_ids(PATH))).values()) for net in nets)
    return {"arm": arm, "nodes": n, "rounds": rounds, "search_beam": ARMS[arm],
            "dht_core_s_per_node_round": used["dht"] / (n * rounds),
            "p2pd_core_s_per_node_round": used["p2pd"] / (n * rounds),
            "round_wall_s": statistics.median(walls), "all_seen": seen}


def run_size(n: int, rounds: int, arms: list[str]) -> list[dict]:
    nets = []
    try:
        nets.append(start_net(spec=SPEC))
        for _ in range(n - 1):
            nets.append(start_net(nets[0].visible_maddrs(), spec=SPEC))
        for net in nets:
            publish_claim(net, SPEC, PathClaim(path=PATH, peer_id=net.peer_id, tokens_per_s=1000.0, round=1,
                                               expires_at=0.0), ttl_s=600)
        out, first = [], 1
        for arm in arms:
            run_arm(nets, arm, 2, first)  # warm-up: routing tables, connections, caches
            first += 2
            result = run_arm(nets, arm, rounds, first)
            first += rounds
            print(f"N={n:3d} {arm:14s} DHT {result['dht_core_s_per_node_round']:.4f} core-s/node/round, "
                  f"p2pd {result['p2pd_core_s_per_node_round']:.4f}, round {result['round_wall_s']:.2f} s, "
                  f"all seen {result['all_seen']}", flush=True)
            out.append(result)
        return out
    finally:
        for net in reversed(nets):
            net.shutdown()


def plot(results: list[dict], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    for arm in dict.fromkeys(r["arm"] for r in results):
        rows = sorted((r for r in results if r["arm"] == arm), key=lambda r: r["nodes"])
        ax.plot([r["nodes"] for r in rows],
                [r["dht_core_s_per_node_round"] + r["p2pd_core_s_per_node_round"] for r in rows], "o-", label=arm)
    ax.set_xlabel("DHT peers (every one holds both modules)")
    ax.set_ylabel("DHT + p2pd core-s per node and round")
    ax.set_xscale("log", base=2)
    ax.legend()
    ax.set_title("The DHT's load per node and round")
    save_plot(fig, path)


def main() -> None:
    ap = arguments(__doc__, name="dht_load", plot=True, replot=True)
    ap.add_argument("--sizes", default="4,8,16,32", help="comma-separated peer counts")
    ap.add_argument("--rounds", type=int, default=8, help="measured rounds per arm (after 2 of warm-up)")
    ap.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, of {', '.join(ARMS)}")
    args = ap.parse_args()
    if args.replot:
        plot(read_results(args.json)["results"], args.plot)
        return
    arms = args.arms.split(",")
    if unknown := set(arms) - set(ARMS):
        ap.error(f"unknown arm(s): {', '.join(sorted(unknown))}")
    if not PROC.is_dir():
        ap.error("needs Linux's /proc to read the processes' CPU time")
    results = [r for n in map(int, args.sizes.split(",")) for r in run_size(n, args.rounds, arms)]
    by = {(r["arm"], r["nodes"]): r for r in results}
    ratios = {f"{arm}_vs_per_record_at_{n}": round(
        (by[arm, n]["dht_core_s_per_node_round"] + by[arm, n]["p2pd_core_s_per_node_round"])
        / (by["per_record", n]["dht_core_s_per_node_round"] + by["per_record", n]["p2pd_core_s_per_node_round"]), 3)
        for (arm, n) in by if arm != "per_record" and ("per_record", n) in by}
    write_json(args.json, {"machine": machine(), "args": vars(args), "results": results, "ratios": ratios})
    plot(results, args.plot)


if __name__ == "__main__":
    main()
