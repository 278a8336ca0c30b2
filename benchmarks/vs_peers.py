"""pathswarm against what volunteers would run instead, on shaped links: time to a held-out loss (issue 29).

Every arm trains the same model (a path's transformer: a 1x1 spec, so the path is the whole model), from the same
initial weights, on the same data, with the same inner AdamW (muP learning rates, warm-up, clipping), the same
batch per step and the same tokens per node, 8 nodes, each node in its own network namespace behind the link
harness (tests/links.py):
- `pathswarm int8`: real `pathswarm node run` processes as users run them (int8 + zstd, rounds in slices, the
  spec's defaults otherwise), H inner steps a round;
- `pathswarm sparse`: the same with the sparse codec at its defaults (`[codec] kind = "sparse"`);
- `pathswarm int8 no-eager` (on request, with --arms and --eager): the int8 arm without the spec's `[outer] eager`
  that --eager sets, to see what eager updates (node/train/round.py `eager_shift`) bring on these links;
- `pathswarm int8 one-reducer` (on request): the int8 arm with one reducer a round (`[averaging] slices = 1`, the
  spec's default) instead of --slices: a round of 8 slices opens 8 streams a member, what a fast link does not need;
- `hivemind`: `hivemind.Optimizer` as its documentation configures collaborative training (no local updates:
  gradients accumulated across peers to a target batch of nodes × batch × --accum, then averaged);
- `hivemind local`: `hivemind.Optimizer` with local updates, parameters averaged every H steps' worth of samples;
- `ddp`: torch DDP over gloo as usually run (an all-reduce of fp32 gradients every step);
- `ddp accum`: DDP with --accum micro-steps per all-reduce (the hivemind arm's global batch).
The baselines' processes are benchmarks/_baselines.py; each arm's settings are in the JSON.

Links. A real home link would make our small model's communication nearly free: the profiles are scaled
(`Profile.scaled_for`) so that this model, at the step time measured here with 8 nodes sharing the machine's
cores, spends the share of its time on the link that the real setting of tests/links.py does (REAL_SETTING); rates
only (`scaled`: the scaled delay is a tenth of a millisecond, and loss costs TCP time that does not scale).
Clock: t = 0 when the arm's training starts (pathswarm: the first node's training loop; baselines: after their
process group or DHT formed); start-up is not counted. The held-out loss is measured afterwards on snapshots
(pathswarm: node 0's checkpoint of every round, the swarm's anchor; baselines: rank 0's weights every few
seconds), so evaluation takes no time from training. An arm stops at its tokens or at --time-cap.
CPU: each arm's core-seconds by kind of process (`cpu`: nodes, their DHT processes, p2pd, the bootstrap peer; a
baseline's ranks, hivemind's DHT processes and daemons), read from /proc (benchmarks/_cpu.py), and per inner step of
the swarm: on a host whose cores all the nodes share, what a round costs beside the steps is paid in training time.

    nice -n 10 .venv/bin/python benchmarks/vs_peers.py            # ≈ 40 min on 2 cores (root: namespaces)

Goals (issue 29): on `home`, pathswarm reaches the final loss of hivemind ≥ 5× sooner, of hivemind with local
updates ≥ 2×, of per-step DDP ≥ 10×, of accumulated DDP ≥ 3×; on `lan`, its time to DDP's final loss ≤ 1.2 × DDP's.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch
from _cpu import CpuSampler, _cmdline, forked_kind
from _swarm_common import REPO, arguments, machine, read_json, save_plot, write_json

from pathswarm.node.app.fmt import subplots
from pathswarm.node.app.local_swarm import LocalSwarm
from pathswarm.node.app.swarm_init import init_spec
from pathswarm.node.model.data import load_documents, split
from pathswarm.node.model.model import build_path, path_param_count
from pathswarm.node.peer.node import validation_batches
from pathswarm.node.train.checkpoint import load_checkpoint
from pathswarm.node.train.evaluate import model_from_checkpoint
from pathswarm.node.train.inner import evaluate_loss
from pathswarm.protocol.spec import AveragingSpec, CodecSpec, InnerOptSpec, ModelSpec, OuterOptSpec, SwarmSpec
from tests.links import PROFILES, REAL_PATH_PARAMS, REAL_SETTING, REAL_STEP_S, Links, Profile, unavailable

BASELINES = REPO / "benchmarks" / "_baselines.py"
ARMS = {"home": ["pathswarm int8", "pathswarm sparse", "hivemind", "hivemind local", "ddp", "ddp accum"],
        "lan": ["pathswarm int8", "ddp"]}
BASELINE_KIND = {"hivemind": "hivemind", "hivemind local": "hivemind-local", "ddp": "ddp", "ddp accum": "ddp-accum"}
GOALS_HOME = {"hivemind": 5.0, "hivemind local": 2.0, "ddp": 10.0, "ddp accum": 3.0}
GOAL_LAN = 1.2
EVAL_BATCHES = 64


# ---- the model, its data and its clock ---------------------------------------------------------------------------
def make_spec(directory: Path, a, codec: CodecSpec | None = None, name: str = "vs-peers",
              eager: bool | None = None, slices: int | None = None) -> tuple[SwarmSpec, Path]:
    base = SwarmSpec(name=name, levels=(1,),
                     model=ModelSpec(width=a.width, base_width=64, n_heads=4, layers_per_module=a.layers,
                                     context_len=a.context_len),
                     inner=InnerOptSpec(steps=a.inner_steps, batch_size=a.batch_size),
                     codec=codec or CodecSpec(),
                     outer=OuterOptSpec(lr=_given(a, "outer_lr", OuterOptSpec.lr),
                                        momentum=_given(a, "outer_momentum", OuterOptSpec.momentum),
                                        eager=bool(_given(a, "eager", False)) if eager is None else eager),
                     averaging=AveragingSpec(grace_s=a.grace_s, timeout_s=120.0, claim_ttl_s=30.0,
                                             slices=slices or _given(a, "slices", 0) or a.nodes))
    spec = init_spec(base, load_documents(base.data))
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.toml"
    path.write_text(spec.to_toml())
    return spec, path


def _given(a, name: str, default):
    """`a.name` unless absent or None (lan_h_sweep.py passes an argument set without the outer options)."""
    value = getattr(a, name, None)
    return default if value is None else value


def step_time(spec_path: Path, spec: SwarmSpec, nodes: int, work: Path, steps: int = 40) -> dict:
    """Seconds per inner step with `nodes` nodes sharing this machine's cores: `nodes` offline `pathswarm node run`
    processes (the same training loop, no network) train one round of `steps` steps at once; the median of their
    speeds (status `tokens_per_s`). What `Profile.scaled_for` takes as our step time."""
    one_round = spec.replace(inner=dataclasses.replace(spec.inner, steps=steps))
    path = work / "calibrate.toml"
    path.write_text(one_round.to_toml())
    with LocalSwarm(path, work / "calibrate") as swarm:
        for i in range(nodes):
            swarm.start_node(f"c{i}", path="0", max_rounds=1, seed=i, extra=["--offline"])
        codes = swarm.wait_nodes(timeout_s=600)
        if any(codes.values()):
            raise RuntimeError(f"calibration failed: {swarm.tail(next(n for n, c in codes.items() if c), 10)}")
        speeds = [swarm.status(f"c{i}")["tokens_per_s"] for i in range(nodes)]
    tokens = spec.inner.batch_size * spec.model.context_len
    return {"nodes": nodes, "steps": steps, "tokens_per_s": speeds, "step_s": tokens / statistics.median(speeds)}


def scaled(profile: Profile, params: int, step_s: float) -> Profile:
    """The profile on our clock, rates only. Its delay scales to a tenth of a millisecond (`home`), below what the
    harness applies; its loss is left out, because what a loss costs is TCP's recovery (a 200 ms minimum
    retransmission timeout), which does not scale with the clock: at our step times it would cost ~240 times more
    than on the real link. Without delay or loss the user-space delayer (tests/linkdelay.py) is not in the path,
    so it takes no CPU from the nodes."""
    real = profile.scaled_for(params, step_s, REAL_PATH_PARAMS, REAL_STEP_S, f"{profile.name}: {REAL_SETTING}")
    return dataclasses.replace(real, rtt_s=0.0, jitter_s=0.0, loss=0.0)


# ---- arms --------------------------------------------------------------------------------------------------------
class Snapshots(threading.Thread):
    """Copies node 0's checkpoint of every round as it appears (the node keeps only its last two), with the time."""

    def __init__(self, root: Path, into: Path):
        super().__init__(daemon=True)
        self.root, self.into, self.stop = root, into, threading.Event()
        self.taken: list[dict] = []

    def run(self) -> None:
        seen = set()
        while not self.stop.is_set():
            latest = self.root / "LATEST"
            try:
                name = latest.read_text().strip()
            except OSError:
                name = ""
            if name and name not in seen:
                at = time.time()
                target = self.into / name
                try:
                    shutil.copytree(self.root / name, target)
                    seen.add(name)
                    self.taken.append({"at": at, "dir": str(target)})
                except OSError:
                    shutil.rmtree(target, ignore_errors=True)  # pruned while copying: the next one will do
            self.stop.wait(0.2)


def run_pathswarm(spec: SwarmSpec, spec_path: Path, profile: Profile, a, work: Path) -> dict:
    rounds = (a.pathswarm_steps or a.steps) // a.inner_steps
    names = [f"n{i}" for i in range(a.nodes)]
    bootstrap = scaled(PROFILES["fiber"], path_param_count(spec), a.step["step_s"])
    with Links([bootstrap, *[profile] * a.nodes]) as net, LocalSwarm(spec_path, work / "run") as swarm, \
            CpuSampler() as cpu:
        swarm.netns.update({"bootstrap": net.ns(0), **{n: net.ns(i + 1) for i, n in enumerate(names)}})
        swarm.start_bootstrap(args=["--swarm", str(spec_path), "--host-maddr", net.maddr(0)], timeout_s=120)
        for i, name in enumerate(names):
            swarm.start_node(name, path="0", max_rounds=rounds, seed=i,
                             extra=["--wait-peers", str(a.nodes), "--host-maddr", net.maddr(i + 1)])
        snaps = Snapshots(work / "run" / "n0-checkpoint", work / "snaps")
        (work / "snaps").mkdir(parents=True)
        snaps.start()
        before = net.counters()
        t0 = None
        deadline = time.monotonic() + a.time_cap + 300  # start-up included: the cap proper is checked below
        stop_reason = "done"
        while swarm.running() and time.monotonic() < deadline:
            if t0 is None:
                since = [s.get("training_since", 0) for s in map(swarm.status, names) if s]
                t0 = min((x for x in since if x), default=None)
                if t0 is not None:
                    cpu.mark()  # from the first node's training on, as the clock
            elif time.time() - t0 > a.time_cap:
                stop_reason = "time cap"
                break
            time.sleep(0.5)
        else:
            if swarm.running():
                stop_reason = "time cap"
        cpu.stop()
        failed = {n: swarm.tail(n, 5) for n, p in swarm.nodes.items() if p.poll() not in (None, 0)}
        end = time.time()
        after = net.counters()
        statuses = {n: swarm.status(n) or {} for n in names}
        snaps.stop.set()
        snaps.join(10)
    # every node's own start, as its final status says (a status read mid-run may have missed an earlier one)
    t0 = min((s["training_since"] for s in statuses.values() if s.get("training_since")), default=t0 or end)
    points = [{"t": s["at"] - t0, "dir": s["dir"]} for s in snaps.taken]
    wire = [t for s in statuses.values() for ts in s.get("round_wire_s", {}).values() for _, t in ts]
    tokens = statistics.median(s.get("tokens_trained", 0) for s in statuses.values())
    return {"stop": stop_reason, "wall_s": end - t0, "snapshots": points, "traffic": _traffic(before, after, 1),
            "cpu": cpu_use(cpu, tokens / (a.batch_size * a.context_len)) | {"window": "training: the first node's "
                                                                             "start to the cap or the last node's end"},
            "rounds": min((s.get("round", 0) for s in statuses.values()), default=0),
            "tokens_per_node": tokens,
            "round_wire_s": {"median": statistics.median(wire) if wire else None, "n": len(wire)},
            "replicas": _replicas(statuses), "failed_nodes": failed,
            "settings": {"inner_steps": a.inner_steps, "rounds": rounds, "slices": spec.averaging.slices,
                         "codec": spec.codec.kind, "grace_s": spec.averaging.grace_s, "eager": spec.outer.eager,
                         "outer": [spec.outer.lr, spec.outer.momentum]}}


def _replicas(statuses: dict[str, dict]) -> dict:
    from pathswarm.node.app.replicas import replica_mismatches
    mismatches, compared = replica_mismatches([s for s in statuses.values() if s])
    return {"identical": not mismatches, "compared": compared}


def _traffic(before: list[dict], after: list[dict], first: int) -> dict:
    sent = [b["tx_bytes"] - a["tx_bytes"] for a, b in zip(before[first:], after[first:], strict=True)]
    got = [b["rx_bytes"] - a["rx_bytes"] for a, b in zip(before[first:], after[first:], strict=True)]
    return {"sent_per_node": sent, "received_per_node": got, "sent_median": statistics.median(sent),
            "sent_max": max(sent), "received_median": statistics.median(got)}


BASELINE_KINDS = ("baseline", "baseline-dht", "p2pd")


def baseline_kind_of(pid: str) -> str | None:
    """A baseline's process (benchmarks/_baselines.py: DDP's ranks, hivemind's peers), the DHT process hivemind forks
    from it, or its p2pd daemon; None for anything else."""
    cmd = _cmdline(pid)
    return "p2pd" if "p2pd" in cmd else forked_kind(pid, cmd, "_baselines.py", "baseline")


def cpu_use(cpu: CpuSampler, steps: float) -> dict:
    """Core-seconds by kind of process over the arm's window, the machine's busy and idle core-seconds, and the
    core-seconds all processes spent per inner step of a node (what 2 cores share among 8 nodes)."""
    by_kind, host = cpu.seconds(), cpu.host()
    return {"by_kind_s": by_kind, "host": host, "window_s": round(host["busy_s"] + host["idle_s"], 1),
            "per_step_s": round(sum(by_kind.values()) / steps, 4) if steps else None}


def run_baseline(arm: str, spec_path: Path, profile: Profile, a, work: Path) -> dict:
    kind = BASELINE_KIND[arm]
    out, rendezvous = work / "out", work / "rendezvous"
    out.mkdir(parents=True)
    rendezvous.mkdir()
    tokens = a.steps * a.batch_size * a.context_len
    with Links([profile] * a.nodes) as net, CpuSampler(kind_of=baseline_kind_of, kinds=BASELINE_KINDS) as cpu:
        before = net.counters()
        procs = []
        for rank in range(a.nodes):
            cmd = [*net.exec_prefix(rank), sys.executable, str(BASELINES), kind, "--rank", str(rank),
                   "--world", str(a.nodes), "--ip", net.ip(rank), "--master-ip", net.ip(0), "--port", "29500",
                   "--ifname", "eth0", "--spec", str(spec_path), "--out", str(out), "--tokens-per-node", str(tokens),
                   "--time-cap", str(a.time_cap), "--accum", str(a.accum), "--H", str(a.inner_steps),
                   "--snap-every-s", str(a.snap_every_s), "--rendezvous", str(rendezvous),
                   *(["--matchmaking-time", str(a.matchmaking_s)] if kind.startswith("hivemind") else [])]
            log = open(work / f"rank{rank}.log", "wb")
            env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
            procs.append((subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env), log))
        deadline = time.monotonic() + a.time_cap + 300
        for proc, log in procs:
            try:
                proc.wait(max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.close()
        after = net.counters()
    workers = [json.loads(p.read_text()) for p in sorted(out.glob("worker-*.json"))]
    errors = [w.get("error") for w in workers if w.get("error")]
    failed = [r for r, (p, _) in enumerate(procs) if p.returncode != 0]
    points = []
    for f in sorted(out.glob("snap-*.pt")):
        snap = torch.load(f, map_location="cpu", weights_only=True)
        points.append({"t": snap["t"], "file": str(f), "tokens": snap["tokens"]})
    tails = {r: (work / f"rank{r}.log").read_text(errors="replace")[-1500:] for r in failed[:2]}
    first = workers[0] if workers else {}
    steps = (first.get("tokens") or 0) / (a.batch_size * a.context_len)
    return {"stop": first.get("stop", "failed"), "wall_s": first.get("wall_s"), "snapshots": points,
            "cpu": cpu_use(cpu, steps) | {"window": "the whole arm: start-up and shutdown included"},
            "traffic": _traffic(before, after, 0), "tokens_per_node": first.get("tokens"),
            "settings": first.get("settings", {}), "errors": errors, "failed_ranks": failed, "log_tails": tails}


# ---- evaluation and verdict --------------------------------------------------------------------------------------
def evaluate(spec: SwarmSpec, points: list[dict], batches: list) -> list[dict]:
    path = spec.path_of_index(0)
    curve = [{"t": 0.0, "val_loss": evaluate_loss(build_path(spec, path), batches)[0]}]
    for p in points:
        if "dir" in p:
            model = model_from_checkpoint(spec, load_checkpoint(p["dir"], spec), path)
        else:
            model = build_path(spec, path)
            model.load_state_dict(torch.load(p["file"], map_location="cpu", weights_only=True)["state_dict"])
        curve.append({"t": p["t"], "val_loss": evaluate_loss(model, batches)[0]})
    return sorted(curve, key=lambda c: c["t"])


def time_to(curve: list[dict], loss: float, stepwise: bool = False) -> float | None:
    """When the curve first reaches `loss`, or None if it never does. Baselines' weights move at every step: linear
    between snapshots. pathswarm's curve is its anchor, which moves only when a round is applied (`stepwise`): the
    time of the first round at or below `loss`, not a line from the round before."""
    for prev, cur in zip(curve, curve[1:], strict=False):
        if cur["val_loss"] <= loss:
            if prev["val_loss"] <= loss:
                return prev["t"]
            if stepwise:
                return cur["t"]
            f = (prev["val_loss"] - loss) / (prev["val_loss"] - cur["val_loss"])
            return prev["t"] + f * (cur["t"] - prev["t"])
    return None


def verdict(arms: dict[str, dict], link: str) -> dict:
    """Each baseline's final loss and when pathswarm reached it: the `pathswarm int8` arm, or without it the first
    int8 variant run (e.g. `pathswarm int8 one-reducer` alone), named in each entry."""
    mine_name = "pathswarm int8" if "pathswarm int8" in arms else next(
        (n for n in arms if n.startswith("pathswarm int8")), None)
    ours = arms.get(mine_name) if mine_name else None
    out = {}
    for name, arm in arms.items():
        if name.startswith("pathswarm") or not arm.get("curve"):
            continue
        target = arm["curve"][-1]["val_loss"]
        theirs = time_to(arm["curve"], target)
        mine = time_to(ours["curve"], target, stepwise=True) if ours else None
        entry = {"their_final_loss": target, "their_time_s": theirs, "pathswarm_arm": mine_name,
                 "pathswarm_time_s": mine,
                 "sooner": (theirs / mine) if theirs and mine else None}
        if link == "home" and name in GOALS_HOME:
            entry["goal_sooner"] = GOALS_HOME[name]
            entry["met"] = entry["sooner"] is not None and entry["sooner"] >= GOALS_HOME[name]
        if link == "lan" and name == "ddp":
            ratio = (mine / theirs) if theirs and mine else None
            entry |= {"pathswarm_over_ddp": ratio, "goal_at_most": GOAL_LAN,
                      "met": ratio is not None and ratio <= GOAL_LAN}
        out[name] = entry
    return out


def plot(result: dict, path: str) -> None:
    links = list(result["links"])
    fig, axes = subplots(1, len(links), figsize=(7 * len(links), 4.6))
    axes = axes if len(links) > 1 else [axes]
    for ax, link in zip(axes, links, strict=True):
        for name, arm in result["links"][link]["arms"].items():
            if not arm.get("curve"):
                continue
            ours = name.startswith("pathswarm")  # its anchor moves at rounds: drawn as steps
            ax.plot([c["t"] for c in arm["curve"]], [c["val_loss"] for c in arm["curve"]], "-" if ours else "--",
                    lw=1.5, marker=".", ms=3, label=f"{name} ({arm['stop']})",
                    drawstyle="steps-post" if ours else "default")
        prof = result["links"][link]["profile"]
        ax.set_title(f"{link}, scaled: {prof['up_bps'] / 1e6:.2f} Mbit/s up, {prof['down_bps'] / 1e6:.2f} down, "
                     f"{prof['rtt_s'] * 1e3:.2f} ms", fontsize=9)
        ax.set_xlabel("wall-clock since training started (s)")
        ax.set_ylabel("held-out loss (nats per byte)")
        ax.set_xscale("symlog", linthresh=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    save_plot(fig, path)


def main() -> None:
    ap = arguments(__doc__, "vs_peers", plot=True, replot=True)
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--links", default="home,lan", help="comma-separated profiles of tests/links.py")
    ap.add_argument("--arms", default="", help="comma-separated arms to run (default: each link's list)")
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--context-len", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--inner-steps", type=int, default=100, help="H of pathswarm and of hivemind's local updates")
    ap.add_argument("--steps", type=int, default=1200, help="inner steps per node (the same tokens for every arm)")
    ap.add_argument("--pathswarm-steps", type=int, default=0,
                    help="inner steps per node of the pathswarm arms (default: --steps). The lan goal is a time (to "
                         "DDP's final loss): a run with more steps, under --time-cap, shows whether pathswarm gets "
                         "there in time when the same tokens do not take it there")
    ap.add_argument("--outer-lr", type=float, default=None, help=f"the pathswarm arms' outer learning rate "
                    f"(default: the spec's, {OuterOptSpec.lr})")
    ap.add_argument("--outer-momentum", type=float, default=None, help=f"their outer momentum (default: the spec's, "
                    f"{OuterOptSpec.momentum}); benchmarks/lan_h_sweep.py --overlap measures settings for small H")
    ap.add_argument("--eager", action="store_true", help="the pathswarm arms' spec sets [outer] eager (eager updates; "
                    "pair with a smaller --outer-lr: benchmarks/lan_h_sweep.py --eager)")
    ap.add_argument("--accum", type=int, default=4, help="micro-steps per global step: ddp accum, hivemind")
    ap.add_argument("--grace-s", type=float, default=30.0)
    ap.add_argument("--slices", type=int, default=0, help="the pathswarm arms' [averaging] slices (default: --nodes, "
                    "a slice per member: what spreads a round's bytes over home uplinks)")
    ap.add_argument("--time-cap", type=float, default=240.0, help="seconds of training per arm at most")
    ap.add_argument("--snap-every-s", type=float, default=8.0)
    ap.add_argument("--matchmaking-s", type=float, default=1.0,
                    help="hivemind's matchmaking_time (its docs: 5 s in the ALBERT example, 3-5 s for small runs, 15 s "
                         "over the internet): on our scaled clock, where a step takes ~0.2 s instead of the real "
                         "setting's 48 s, 5 s would be a fixed cost the real setting does not see")
    ap.add_argument("--workdir", default="", help="keep every process's log and snapshot here (default: a "
                    "temporary folder, removed at the end)")
    a = ap.parse_args()
    if a.replot:  # the verdicts too: they follow from the curves
        result = read_json(a.json)
        for link, got in result["links"].items():
            got["verdict"] = verdict(got["arms"], link)
        write_json(a.json, result)
        plot(result, a.plot)
        return
    why = unavailable()
    if why:
        sys.exit(f"vs_peers needs the link harness: {why}")
    result = {"claim": "time to a held-out loss on shaped links: pathswarm vs hivemind.Optimizer and DDP",
              "machine": machine(), "links": {}}
    with tempfile.TemporaryDirectory(prefix="vs-peers-") as tmp:
        work = Path(a.workdir or tmp)
        spec, spec_path = make_spec(work, a)
        sparse_spec, sparse_path = make_spec(work, a, CodecSpec(kind="sparse"), name="vs-peers-sparse")
        params = path_param_count(spec)
        a.step = step_time(spec_path, spec, a.nodes, work)
        print(f"{params:,} parameters, {a.step['step_s'] * 1e3:.0f} ms a step with {a.nodes} nodes", flush=True)
        _, val = split(load_documents(spec.data), spec.data.val_fraction)
        batches = validation_batches(spec, val, spec.path_of_index(0), EVAL_BATCHES)
        result["config"] = {k: v for k, v in vars(a).items() if k not in ("json", "plot", "replot")} | {
            "params": params, "tokens_per_node": a.steps * a.batch_size * a.context_len,
            "pathswarm_tokens_per_node": (a.pathswarm_steps or a.steps) * a.batch_size * a.context_len,
            "real_setting": {"params": REAL_PATH_PARAMS, "step_s": REAL_STEP_S, "what": REAL_SETTING}}
        for link in a.links.split(","):
            profile = scaled(PROFILES[link], params, a.step["step_s"])
            arms = {}
            for arm in (a.arms.split(",") if a.arms else ARMS[link]):
                t = time.monotonic()
                print(f"{link}: {arm} …", flush=True)
                arm_dir = work / link / arm.replace(" ", "-")
                s, p = (sparse_spec, sparse_path) if arm == "pathswarm sparse" else (spec, spec_path)
                if arm.startswith("pathswarm"):
                    if arm == "pathswarm int8 no-eager":
                        s, p = make_spec(work, a, name="vs-peers-no-eager", eager=False)
                    elif arm == "pathswarm int8 one-reducer":
                        s, p = make_spec(work, a, name="vs-peers-one-reducer", slices=1)
                    res = run_pathswarm(s, p, profile, a, arm_dir)
                else:
                    res = run_baseline(arm, spec_path, profile, a, arm_dir)
                res["curve"] = evaluate(s, res.pop("snapshots"), batches)  # the same weights: only the id differs
                arms[arm] = res
                result["links"][link] = {"profile": profile.as_dict(), "arms": arms, "verdict": verdict(arms, link)}
                write_json(a.json, result)  # after every arm: a failure later keeps what ran
                final = res["curve"][-1]
                print(f"  {res['stop']}: loss {final['val_loss']:.4f} at {final['t']:.0f} s, sent "
                      f"{res['traffic']['sent_median'] / 1e6:.1f} MB a node ({time.monotonic() - t:.0f} s)",
                      flush=True)
            result["links"][link] = {"profile": profile.as_dict(), "arms": arms, "verdict": verdict(arms, link)}
            write_json(a.json, result)
    write_json(a.json, result)
    plot(result, a.plot)


if __name__ == "__main__":
    main()
