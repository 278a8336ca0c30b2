"""Chaos: goodput of a swarm whose nodes are killed, restarted and frozen, vs a synchronous baseline.

Goal (DESIGN.md, after Decoupled DiLoCo's 88 % vs 27 %): goodput under random node kills ÷ goodput
with none ≥ 0.90 for pathswarm, and far below it (≤ 0.40) for a synchronous mode in the same harness.

Four arms, each a real local swarm (a bootstrap peer and --nodes node processes on 127.0.0.1, one
path, so every node averages every module with every other) running for --seconds of wall time:
  decoupled, no faults | decoupled, faults | sync, no faults | sync, faults
`sync` is `node run --sync-rounds`, which is what data-parallel training does: a round waits for every
node that ever held the module (a collective blocks until every rank arrives), nobody trains on until
the round is done, and when a member dies during a round (its claim lapses, or it comes back as a new
process) the round fails for everyone, who throw its steps away and redo it with the restarted member
(an elastic job restarts every rank from the last good state; `tokens_discarded` counts those steps).

The fault plan is seeded and the same for both faulty arms: at random moments (one in each window of
--mean-gap-s swarm-wide, or exponential gaps with --plan poisson) a random running node is SIGKILLed
(also mid-round and mid-checkpoint, as the moments are random) and restarted --restart-after-s later
from its checkpoint directory with the same identity, or (--stall-fraction of the events) its whole
process group is frozen with SIGSTOP for --stall-s and then continued.

Goodput = tokens that ended up in the model (the tokens of the shared module's rounds that merged or
were applied alone, including steps carried over from a late or failed round, as counted by the
reducers that merged them, over every incarnation of every node) ÷ the same count in the arm of the
same mode with no faults. `goodput_members` is the same ratio from what the members heard merged: it
misses the last contribution of a member killed before the result reached it. Also checked and reported:
restarted nodes resume from their last complete checkpoint and reach the swarm's round again; every
checkpoint left by a SIGKILL loads; the longest time a node that was not itself frozen stood still
waiting for a round (`wait_max_s` in its status: decoupled nodes never wait past the grace window);
replicas identical after the swarm settles (everyone stopped with SIGTERM): every node's digest for each
(module, round), whatever group it merged in; `split_rounds` counts (module, round)s that ended in two versions.

Measuring goodput needs each node's speed to be independent of the others: on a machine with fewer
cores than nodes, a killed node frees CPU and its peers speed up, which hides the loss. So every node
is capped (`node run --max-tokens-per-s`, each step paced on its own so a frozen node cannot catch
up) well below what a core does, and `pace_held` in the JSON (tokens trained ÷ what the caps allow)
shows that the CPU kept up. Without a cap (`--max-tokens-per-s 0`) nodes are pinned one per core.

    python benchmarks/chaos.py --nodes 8     # the committed run: 4 arms of 300 s, ≈ 25 min
"""

from __future__ import annotations

import json
import os
import random
import signal
import tempfile
import time
from pathlib import Path

from _swarm_common import arguments, machine, save_plot, write_json

from pathswarm.node.app.fmt import subplots
from pathswarm.node.app.local_swarm import LocalSwarm
from pathswarm.node.app.replicas import check_replicas
from pathswarm.node.app.swarm_init import init_spec
from pathswarm.node.model.data import load_documents
from pathswarm.node.train.checkpoint import CheckpointError, load_checkpoint
from pathswarm.protocol.spec import AveragingSpec, DataSpec, InnerOptSpec, ModelSpec, SwarmSpec


def make_spec(directory: Path, args) -> tuple[SwarmSpec, Path]:
    base = SwarmSpec(name="chaos", levels=(1,),
                     model=ModelSpec(width=args.width, base_width=64, n_heads=4, layers_per_module=2, context_len=64),
                     inner=InnerOptSpec(steps=args.inner_steps, batch_size=8, warmup_steps=10),
                     averaging=AveragingSpec(grace_s=args.grace_s, timeout_s=60.0, claim_ttl_s=args.claim_ttl_s),
                     data=DataSpec(corpus="bbc"))
    spec = init_spec(base, load_documents(base.data))
    path = directory / "chaos.toml"
    path.write_text(spec.to_toml())
    return spec, path


# status counters over every incarnation of a node: a restarted node continues all but PER_RUN from its earlier runs
# (node/peer/counters.py), so its latest status holds them; PER_RUN ones are summed over its incarnations
COUNTERS = ("tokens_merged", "tokens_trained", "tokens_discarded", "tokens_reduced", "tokens_lost", "tokens_resumed")
PER_RUN = ("tokens_resumed",)


def fault_plan(seed: int, seconds: float, nodes: int, mean_gap_s: float, stall_fraction: float,
               kind: str = "stratified") -> list[dict]:
    """Faults at random moments, one per --mean-gap-s on average, from 10 s (the swarm forms) to 10 s before the end.

    `stratified`: one fault at a uniform moment in each consecutive window of mean_gap_s. `poisson`: exponential
    gaps. Both have the same rate; a Poisson plan of a few events can bunch them (seed 0 put 6 of 7 kills in the
    last 130 s of 300), and bunched outages overlap, which costs a synchronous swarm once for several kills."""
    rng = random.Random(seed)
    plan, t, k = [], 10.0, 0
    while True:
        if kind == "poisson":
            t += rng.expovariate(1.0 / mean_gap_s)
        else:
            t, k = 10.0 + (k + rng.random()) * mean_gap_s, k + 1
        if t > seconds - 10:
            return plan
        plan.append({"t": round(t, 2), "node": f"n{rng.randrange(nodes)}",
                     "kind": "stall" if rng.random() < stall_fraction else "kill"})


def _mtime_ns(path: Path) -> int | None:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return None


class Arm:
    """One arm: start the swarm, follow the plan, keep every incarnation's last status."""

    def __init__(self, name: str, spec_path: Path, workdir: Path, args, sync: bool, plan: list[dict]):
        self.name, self.args, self.sync, self.plan = name, args, sync, plan
        self.swarm = LocalSwarm(spec_path, workdir)
        self.nodes = [f"n{i}" for i in range(args.nodes)]
        # per counter of the status: what each node's earlier incarnations counted (PER_RUN ones only)
        self.banked = {c: {n: 0 for n in self.nodes} for c in COUNTERS}
        self.stale: dict[str, int | None] = {}  # node → the mtime of the status file its killed incarnation left
        self.incarnations: list[dict] = []  # every finished incarnation's longest stand-still, and whether it stalled
        self.stalled_now: set[str] = set()  # nodes SIGSTOPped during their current incarnation
        self.last = {n: {} for n in self.nodes}  # last status seen of the current incarnation
        self.events: list[dict] = []
        self.timeline: list[tuple[float, int]] = []
        self.checkpoints_ok, self.checkpoints_bad = 0, []
        self.resumes: list[dict] = []

    def start_node(self, n: str, restart: bool = False) -> None:
        i = self.nodes.index(n)
        extra = ["--identity", str(self.swarm.workdir / f"{n}.key"),
                 "--threads", "1", "--max-tokens-per-s", str(self.args.max_tokens_per_s)]
        if not restart:  # the swarm forms together; a restarted node must not wait for peers that are down now
            extra += ["--wait-peers", str(self.args.nodes)]
        proc = self.swarm.start_node(n, seed=i, extra=extra + (["--sync-rounds"] if self.sync else []))
        if self.args.pin:
            # One core per node, inherited by its DHT process and p2pd: a node's speed then does not depend on
            # how many others are alive, so killing one does not speed the survivors up.
            os.sched_setaffinity(proc.pid, {i % os.cpu_count()})

    def total(self, counter: str) -> int:
        return sum(self.banked[counter][n] + int(self.last[n].get(counter, 0)) for n in self.nodes)

    def merged(self) -> int:
        # Counted by the reducers: a member killed after its outer gradient was merged, but before it heard the
        # result, cannot count those tokens itself (its members' own count is `tokens_merged_members`).
        return self.total("tokens_reduced")

    def end_incarnation(self, n: str) -> None:
        self.incarnations.append({"node": n, "wait_max_s": float(self.last[n].get("wait_max_s", 0.0)),
                                  "stalled": n in self.stalled_now,
                                  "round_work_s": self.last[n].get("round_work_s", {})})
        self.stalled_now.discard(n)
        # The incarnation ending here began at the node's latest restart: record where that one resumed (read
        # at the end, a node restarted twice showed its last incarnation's checkpoint for both restarts).
        began = [r for r in self.resumes if r["node"] == n and "checkpoint_round" not in r]
        if began:
            st = self.last[n]
            began[-1].update(checkpoint_round=st.get("checkpoint_round"), round_now=st.get("module_rounds", {}),
                             state=st.get("state"))

    def poll(self, t: float) -> None:
        for n in self.nodes:
            if self.stale.get(n) == _mtime_ns(self.swarm.node_files(n)["status.json"]):
                continue  # the killed incarnation's, already counted
            st = self.swarm.status(n) or {}
            if st.get("peer_id") and st.get("tokens_merged", 0) >= self.last[n].get("tokens_merged", 0):
                self.last[n] = st
        self.timeline.append((round(t, 2), self.merged()))

    def kill(self, n: str, t: float) -> None:
        self.swarm.signal(n, signal.SIGKILL)
        self.swarm.nodes[n].wait(10)
        for c in PER_RUN:
            self.banked[c][n] += int(self.last[n].get(c, 0))
        self.end_incarnation(n)
        # The killed run's status file stays: the restarted node reads it to count the tokens the kill lost, and its
        # counts stand here until the new run writes its own, which continues them.
        self.last[n] = {k: v for k, v in self.last[n].items() if k not in PER_RUN}
        self.stale[n] = _mtime_ns(self.swarm.node_files(n)["status.json"])
        try:  # whatever moment the kill hit, the last complete checkpoint must load
            load_checkpoint(self.swarm.node_files(n)["checkpoint"], load_spec_cached(self.swarm.spec_path))
            self.checkpoints_ok += 1
        except CheckpointError as e:
            if "no checkpoint" not in str(e).lower():
                self.checkpoints_bad.append(f"{n} at {t:.0f} s: {e}")

    def run(self) -> dict:
        a = self.args
        try:
            self.swarm.start_bootstrap()
            for n in self.nodes:
                self.start_node(n)
            for n in self.nodes:
                self.swarm.wait_ready(n, timeout_s=180)
            t0 = time.monotonic()
            self.poll(0.0)
            # counted from here: nodes that became ready first may already have merged a round or two
            offsets = {c: self.total(c) for c in COUNTERS}
            pending = list(self.plan)
            restarts: list[tuple[float, str]] = []
            stalls: list[tuple[float, str]] = []
            while (t := time.monotonic() - t0) < a.seconds:
                self.poll(t)
                while pending and pending[0]["t"] <= t:
                    ev = pending.pop(0)
                    n = ev["node"]
                    busy = any(x == n for _, x in restarts + stalls) or self.swarm.nodes[n].poll() is not None
                    if busy:
                        self.events.append({**ev, "skipped": "node already down"})
                        continue
                    if ev["kind"] == "kill":
                        self.kill(n, t)
                        restarts.append((t + a.restart_after_s, n))
                    else:
                        _signal_group(self.swarm.nodes[n].pid, signal.SIGSTOP)
                        self.stalled_now.add(n)
                        stalls.append((t + a.stall_s, n))
                    self.events.append({**ev, "at": round(t, 2)})
                for due, n in [x for x in restarts if x[0] <= t]:
                    restarts.remove((due, n))
                    self.start_node(n, restart=True)
                    self.resumes.append({"node": n, "at": round(t, 2)})
                for due, n in [x for x in stalls if x[0] <= t]:
                    stalls.remove((due, n))
                    _signal_group(self.swarm.nodes[n].pid, signal.SIGCONT)
                time.sleep(0.5)
            for _, n in stalls:
                _signal_group(self.swarm.nodes[n].pid, signal.SIGCONT)
            self.poll(time.monotonic() - t0)
            counted = {c: self.total(c) - offsets[c] for c in COUNTERS}
            merged, trained = counted["tokens_reduced"], counted["tokens_trained"]
            merged_members, discarded = counted["tokens_merged"], counted["tokens_discarded"]
            lost = counted["tokens_lost"]
            # trained but not merged yet when time ran out (carried to a round that did not happen in time)
            unmerged = sum(int(self.last[n].get("tokens_unmerged", 0)) for n in self.nodes)
            for n in self.nodes:
                self.end_incarnation(n)
            for n in self.nodes:  # everyone leaves cleanly
                self.swarm.signal(n, signal.SIGTERM)
            codes = self.swarm.wait_nodes(self.nodes, timeout_s=120)
            finals = [self.swarm.status(n) or {} for n in self.nodes]
        finally:
            self.swarm.close()
        replicas = check_replicas(dict(zip(self.nodes, finals, strict=True)))  # whatever the groups
        waits = [i["wait_max_s"] for i in self.incarnations if not i["stalled"]]
        return {"arm": self.name, "sync": self.sync, "tokens_merged": merged, "tokens_merged_members": merged_members,
                "tokens_trained": trained,
                "tokens_unmerged_at_end": unmerged,
                # sync only: steps thrown away because a member died during their round (data-parallel redoes them)
                "tokens_discarded": discarded,
                # decoupled: trained by a killed node after its last save, or in flight at the kill, and not resumed
                "tokens_lost": lost,
                # decoupled only: tokens of rounds in progress that restarted nodes took over from their saved state
                "tokens_resumed": counted["tokens_resumed"],
                # tokens trained ÷ what the cap allows: ≈ 1 means the CPU kept up, so speeds are cap-bound
                "pace_held": round(trained / (a.nodes * a.max_tokens_per_s * a.seconds), 3) if a.max_tokens_per_s
                else None,
                "exit_codes": codes,
                "events": self.events, "restarts": self.resumes, "timeline": self.timeline,
                "checkpoints_loaded_after_kill": self.checkpoints_ok, "checkpoints_unreadable": self.checkpoints_bad,
                "replicas_identical": replicas.identical, "digests_compared": replicas.digests_compared,
                "split_rounds": replicas.split_rounds, "splits": [str(s) for s in replicas.splits],
                "final_module_rounds": {n: f.get("module_rounds") for n, f in zip(self.nodes, finals, strict=True)},
                # the longest a node that was never frozen itself stood still waiting for a round to settle
                "max_survivor_wait_s": max(waits, default=0.0),
                # training time every node's training loop spent on round work instead of steps, summed by kind
                "round_work_s": _sum_by_kind(i["round_work_s"] for i in self.incarnations),
                "incarnations": self.incarnations}


def _sum_by_kind(dicts) -> dict[str, float]:
    total: dict[str, float] = {}
    for d in dicts:
        for kind, s in d.items():
            total[kind] = round(total.get(kind, 0.0) + float(s), 2)
    return total


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)  # the node, its DHT process and its p2pd: a frozen machine freezes all of them
    except ProcessLookupError:
        pass


_SPECS: dict = {}


def load_spec_cached(path):
    from pathswarm.protocol.spec import load_spec

    if path not in _SPECS:
        _SPECS[path] = load_spec(path)
    return _SPECS[path]


def plot(report: dict, path: Path) -> None:
    fig, ax = subplots(figsize=(8, 4.4))
    styles = {"decoupled": "tab:green", "sync": "tab:red"}
    for arm in report["arms"]:
        ts, toks = zip(*arm["timeline"], strict=True) if arm["timeline"] else ((), ())
        mode = "sync" if arm["sync"] else "decoupled"
        ax.plot(ts, [x / 1e6 for x in toks], color=styles[mode], ls="-" if arm["arm"].endswith(", faults") else "--",
                label=arm["arm"])
    for ev in report["fault_plan"]:
        ax.axvline(ev["t"], color="gray", lw=0.5, alpha=0.5)
    ax.set_xlabel("seconds (gray: faults)")
    ax.set_ylabel("tokens merged into the model (M)")
    ax.set_title("goodput: " + ", ".join(f"{mode} {g:.2f}" for mode, g in report["goodput"].items()))
    ax.grid(alpha=0.3)
    ax.legend()
    save_plot(fig, path)


def main() -> None:
    ap = arguments(__doc__, "chaos", plot=True)
    ap.add_argument("--nodes", type=int, default=4, help="the committed run uses 8")
    ap.add_argument("--seconds", type=float, default=300.0, help="wall time of each arm after the swarm formed")
    ap.add_argument("--mean-gap-s", type=float, default=30.0, help="mean time between faults, swarm-wide")
    ap.add_argument("--plan", choices=("stratified", "poisson"), default="stratified",
                    help="how fault moments are drawn (same rate): one per window of --mean-gap-s, or exponential gaps")
    ap.add_argument("--max-tokens-per-s", type=float, default=600.0,
                    help="every node's speed cap (node run --max-tokens-per-s): with the cap well below what a core "
                         "does, a node's speed does not depend on how many others are alive (0: no cap, then pin)")
    ap.add_argument("--restart-after-s", type=float, default=5.0)
    ap.add_argument("--stall-fraction", type=float, default=0.3)
    ap.add_argument("--stall-s", type=float, default=8.0)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--inner-steps", type=int, default=12, help="H: with the cap, a round is ≈ 10 s")
    ap.add_argument("--grace-s", type=float, default=4.0)
    ap.add_argument("--claim-ttl-s", type=float, default=10.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--arms", default="decoupled,sync", help="which modes to run")
    ap.add_argument("--keep", default="", help="keep every arm's swarm directory (logs, statuses) under this one")
    ap.add_argument("--pin", type=int, choices=(0, 1), default=None,
                    help="pin node i to core i (default: when there are at least as many cores as nodes)")
    args = ap.parse_args()
    if args.pin is None:
        args.pin = int(not args.max_tokens_per_s and os.cpu_count() >= args.nodes)
    if not args.max_tokens_per_s and os.cpu_count() < args.nodes:
        print(f"warning: {args.nodes} nodes on {os.cpu_count()} cores share cores: a dead node frees CPU for the "
              "others, which inflates goodput under faults", flush=True)
    t0 = time.monotonic()
    plan = fault_plan(args.seed, args.seconds, args.nodes, args.mean_gap_s, args.stall_fraction, args.plan)
    arms = []
    with tempfile.TemporaryDirectory(prefix="pathswarm-chaos-") as scratch:
        tmp = args.keep or scratch  # --keep: node logs, statuses and checkpoints stay for a post-mortem
        Path(tmp).mkdir(parents=True, exist_ok=True)
        spec, spec_path = make_spec(Path(tmp), args)
        for mode in args.arms.split(","):
            for faults in (False, True):
                name = f"{mode}, {'faults' if faults else 'no faults'}"
                print(f"--- {name}", flush=True)
                arm = Arm(name, spec_path, Path(tmp) / name.replace(", ", "-").replace(" ", "_"), args,
                          sync=mode == "sync", plan=plan if faults else [])
                arms.append(arm.run())
                print(json.dumps({k: arms[-1][k] for k in ("arm", "tokens_merged", "pace_held", "replicas_identical",
                                                           "split_rounds", "max_survivor_wait_s",
                                                           "checkpoints_unreadable", "round_work_s")}),
                      flush=True)
    by = {a["arm"]: a for a in arms}
    goodput = {m: by[f"{m}, faults"]["tokens_merged"] / max(1, by[f"{m}, no faults"]["tokens_merged"])
               for m in args.arms.split(",")}
    # the same ratio from what members heard merged (misses contributions of members killed before the result)
    goodput_members = {m: by[f"{m}, faults"]["tokens_merged_members"]
                       / max(1, by[f"{m}, no faults"]["tokens_merged_members"]) for m in args.arms.split(",")}
    report = {
        "goal": "goodput (faults ÷ no faults) ≥ 0.90 decoupled, ≤ 0.40 synchronous",
        "goodput": goodput, "goodput_members": goodput_members,
        "met": goodput.get("decoupled", 0) >= 0.90 and goodput.get("sync", 1) <= 0.40,
        "config": vars(args), "fault_plan": plan,
        "faults": {"kills": sum(e["kind"] == "kill" for e in plan), "stalls": sum(e["kind"] == "stall" for e in plan)},
        "arms": arms, "wall_s": round(time.monotonic() - t0, 1), "machine": machine(),
    }
    write_json(args.json, report)
    plot(report, Path(args.plot))
    print(f"goodput: {goodput}; goal met: {report['met']}")


if __name__ == "__main__":
    main()
