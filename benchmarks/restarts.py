"""Split rounds in repeated kill/restart cycles of the reducer: the one-version invariant under the fault that
broke it (issue 15: 12 of 14 runs split a round when the reducer was SIGKILLed and restarted).

A bootstrap peer and 3 node processes on 127.0.0.1 train a 1x3 spec (all three hold `shared` and `L0M0`),
paced to 5 inner steps a second (H = 10: a round every 2 s). Each cycle: wait for a round to settle, then half a
round, SIGKILL the current reducer of `shared` (the head of the reducer list the last result named), keep it
dead `--dead-s` seconds (its claim lapses), restart it with the identical command line and checkpoint
directory, alternately with its identity file and with a new identity, and wait until it has merged a round
with the others. Every incarnation's status file is kept; at the end every node's digest of every (module,
round) is compared with every other's (node/app/replicas.py), whatever their groups.

`--kill replying` (issue 27, item 5) times each kill into the reducer's replies instead: every node runs with the
PATHSWARM_TEST_DROP_REPLY `:exit` hook (node/peer/faults.py `faults_from_env`) on every round of `shared` (the
member whose id sorts first gets the reply) and `L0M0` (the last one gets it), armed once per cycle by a file: the
first reducer to reply to two members after the arming replies to one and exits (os._exit), the other gets nothing.
It is restarted `--dead-s` later (default 2 s: back on its checkpoint before the group moved on, the hardest case)
from the same checkpoint directory. Such a kill splits a module, by design: measured are how the splits settle
(`heals`: rounds of the losing version, from the nodes' status files; the longest run of rounds merged in two
versions) and what is left at the end (modules whose replicas differ at the same round, holders that stopped
merging a module). `--kill alternate` does one of each per cycle.

    python benchmarks/restarts.py --cycles 20 --json benchmarks/results/restarts.json    # ≈ 10 min
    python benchmarks/restarts.py --cycles 20 --kill replying    # → benchmarks/results/restarts_replying.json

Goal (issue 15): 0 split rounds in 20 cycles. Goal with kills while replying (issue 27): 0 modules left split or
stalled at the end of 20 cycles, every split healed within 3 rounds.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

from _swarm_common import RESULTS, arguments, machine, write_json

from pathswarm.node.app.local_swarm import LocalSwarm
from pathswarm.node.app.replicas import check_replicas
from pathswarm.node.app.swarm_init import init_spec
from pathswarm.node.model.data import synthetic_corpus
from pathswarm.protocol.spec import AveragingSpec, DataSpec, InnerOptSpec, ModelSpec, SwarmSpec

H, STEPS_PER_S = 10, 5
NAMES = {"a": "0.0", "b": "0.1", "c": "0.2"}
SHARED = ("shared", "L0M0")  # the modules all three nodes hold
SETTLE_ROUNDS = 3  # the goal: a split settles within this many rounds
STALLED_ROUNDS = 4  # a holder whose frames were in none of a module's last rounds this many has stopped merging it
DIE_REPLYING_EXIT = 86  # protocol/rounds/reply_faults.py: a node the hook ended


def wait(pred, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.1)
    raise SystemExit(f"timed out after {timeout_s:.0f} s waiting for {what}")


def shared_round(swarm: LocalSwarm, name: str) -> int:
    return ((swarm.status(name) or {}).get("module_rounds") or {}).get("shared", 0)


def merged_since(st: dict | None, round_: int) -> bool:
    """The node's own frames are in a round of `shared` it applied at state round `round_` or later."""
    groups = ((st or {}).get("groups") or {}).get("shared", {})
    return any(int(r) >= round_ and st["peer_id"] in peers for r, peers in groups.items())


def kill_mid_round(swarm: LocalSwarm) -> str:
    """SIGKILL the current reducer of `shared` half a round after a round of it settled; returns its name."""
    st = {n: swarm.status(n) for n in NAMES}
    reducer = next(iter(st.values()))["reducers"]["shared"][0]
    victim = next((n for n in NAMES if st[n]["peer_id"] == reducer), None)
    if victim is None:  # the head is not a live node: wait for a round to name one
        time.sleep(2)
        victim = next(n for n in NAMES if swarm.status(n)["peer_id"] == swarm.status("a")["reducers"]["shared"][0])
    settled = shared_round(swarm, victim)
    wait(lambda v=victim, s=settled: shared_round(swarm, v) > s, 60, "a round to settle")
    time.sleep(H / 2 / STEPS_PER_S)
    swarm.signal(victim, signal.SIGKILL)
    swarm.nodes[victim].wait(10)
    return victim


def kill_while_replying(swarm: LocalSwarm, arm: Path) -> str | None:
    """Arm the hook once a round settled everywhere: the next reducer to reply to two members exits after the first
    reply. Returns the node that died (None: no round had two members to reply to within a minute)."""
    settled = {n: shared_round(swarm, n) for n in NAMES}
    wait(lambda: all(shared_round(swarm, n) > settled[n] for n in NAMES), 60, "a round to settle")
    arm.touch()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        dead = [n for n in NAMES if swarm.nodes[n].poll() is not None]
        if dead:
            code = swarm.nodes[dead[0]].returncode
            if code != DIE_REPLYING_EXIT:
                raise SystemExit(f"{dead[0]} exited with {code}, not by the hook: {swarm.tail(dead[0])}")
            return dead[0]
        time.sleep(0.1)
    arm.unlink(missing_ok=True)
    return None


def left_at_end(final: dict[str, dict]) -> dict:
    """What a run leaves behind: per module, the nodes at the same round with another digest (split), and the nodes
    whose frames were in none of the module's last STALLED_ROUNDS rounds they applied (stalled: left behind,
    refused, or told "out of sync" round after round)."""
    split, stalled = {}, {}
    for mid in SHARED:
        by_round: dict[int, set[str]] = {}
        for st in final.values():
            by_round.setdefault(st["module_rounds"][mid], set()).add(st["digests"][mid])
        if any(len(d) > 1 for d in by_round.values()):
            split[mid] = {r: sorted(d) for r, d in by_round.items() if len(d) > 1}
        newest = max(st["module_rounds"][mid] for st in final.values())
        for n, st in final.items():  # (nodes stop a round apart: one more round of slack)
            groups = st["groups"].get(mid, {})
            if not any(st["peer_id"] in peers for r, peers in groups.items() if int(r) >= newest - STALLED_ROUNDS):
                stalled.setdefault(mid, []).append(n)
    return {"modules_split": split, "modules_stalled": stalled}


def split_runs(splits) -> dict[str, int]:
    """Module → the longest run of consecutive rounds merged in two or more versions."""
    out: dict[str, int] = {}
    by_module: dict[str, list[int]] = {}
    for s in splits:
        by_module.setdefault(s.module, []).append(int(s.round))
    for mid, rounds in by_module.items():
        best = run = 0
        ordered = sorted(rounds)
        for i, r in enumerate(ordered):
            run = run + 1 if i and r == ordered[i - 1] + 1 else 1
            best = max(best, run)
        out[mid] = best
    return out


def main() -> None:
    ap = arguments(__doc__, "restarts")
    ap.add_argument("--cycles", type=int, default=20)
    ap.add_argument("--kill", choices=("mid-round", "replying", "alternate"), default="mid-round",
                    help="SIGKILL the reducer in its inner steps, or make it exit between two members' replies (the "
                         "PATHSWARM_TEST_DROP_REPLY `:exit` hook), or alternate")
    ap.add_argument("--dead-s", type=float, default=None,
                    help="how long the killed reducer stays dead (default: 8 s mid-round, 2 s replying)")
    ap.add_argument("--workdir", default=None, help="keep the run's files (logs, status files) here")
    ap.add_argument("--debug", action="store_true", help="the nodes log at debug level (with --workdir)")
    ap.add_argument("--slices", type=int, default=1,
                    help="[averaging] slices: rounds in slices (protocol/rounds/slices.py), each slice's reducer a "
                         "kill target as the module's is with one (default 1: one reducer per module and round)")
    args = ap.parse_args()
    if args.json == str(RESULTS / "restarts.json") and (args.kill != "mid-round" or args.slices > 1):
        # the issue-15 figure stays where it was
        args.json = str(RESULTS / "_".join(["restarts", *([args.kill] if args.kill != "mid-round" else []),
                                            *(["slices"] if args.slices > 1 else [])])) + ".json"
    spec = init_spec(SwarmSpec(name="restarts", levels=(1, 3),
                               model=ModelSpec(width=32, base_width=32, n_heads=2, layers_per_module=1, context_len=32),
                               inner=InnerOptSpec(steps=H, batch_size=4, warmup_steps=2),
                               data=DataSpec(corpus="synthetic"),
                               averaging=AveragingSpec(grace_s=3.0, timeout_s=20.0, claim_ttl_s=6.0,
                                                       slices=args.slices)),
                     synthetic_corpus(200, seed=0))
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="pathswarm-restarts-") as tmp:
        tmp = Path(args.workdir or tmp)
        tmp.mkdir(parents=True, exist_ok=True)
        spec_path = tmp / "swarm.toml"
        spec_path.write_text(spec.to_toml())
        kept: dict[str, dict] = {}  # incarnation label → its last status
        arm = tmp / "arm"
        if args.kill != "mid-round":  # every process, restarts included, carries the hook; a file arms it once
            os.environ["PATHSWARM_TEST_DROP_REPLY"] = "shared:*:exit,L0M0:*:exit-last"
            os.environ["PATHSWARM_TEST_EXIT_ARM"] = str(arm)

        def start(name: str, identity: bool) -> None:
            extra = ["--identity", str(tmp / f"{name}.id")] if identity else []
            swarm.start_node(name, path=NAMES[name], extra=["--wait-peers", "3", "--save-partial-s", "0.2",
                                                            "--max-tokens-per-s", str(STEPS_PER_S * 4 * 32), *extra])

        cycles = []
        with LocalSwarm(spec_path, tmp / "run", debug=args.debug) as swarm:
            swarm.start_bootstrap()
            for name in NAMES:
                start(name, identity=True)
            # kills while replying start after the outer warmup (spec [outer] warmup_rounds): members bound the means
            # they apply by the momentum too from then on (protocol/rounds/rule.py `mean_bound`)
            first = 2 if args.kill == "mid-round" else spec.outer.warmup_rounds + 2
            wait(lambda: all(shared_round(swarm, n) >= first for n in NAMES), 180, f"{first} rounds")
            for i in range(args.cycles):
                replying = args.kill == "replying" or (args.kill == "alternate" and i % 2 == 1)
                dead_s = args.dead_s if args.dead_s is not None else (2.0 if replying else 8.0)
                if replying:
                    victim = kill_while_replying(swarm, arm)
                    if victim is None:
                        print(f"cycle {i + 1}/{args.cycles}: no reducer replied to two members in 60 s", flush=True)
                        cycles.append({"cycle": i, "victim": None, "kill": "replying"})
                        continue
                else:
                    victim = kill_mid_round(swarm)
                label = f"{victim}#{i}"
                kept[label] = swarm.status(victim)
                shutil.copy(swarm.node_files(victim)["status.json"], tmp / f"{label}.status.json")
                time.sleep(dead_s)
                same = i % 2 == 0
                start(victim, identity=same)
                back = time.monotonic()
                others = [n for n in NAMES if n != victim]
                target = max(shared_round(swarm, n) for n in others) + 2
                # back: its frames merged in a round of `shared` from then on (holding the round is not merging it:
                # a node that re-synced applies the group's rounds late until its own frames line up)
                wait(lambda v=victim, t=target: merged_since(swarm.status(v), t), 120, f"{victim} back in the group")
                cycles.append({"cycle": i, "victim": victim, "kill": "replying" if replying else "mid-round",
                               "same_identity": same, "killed_at_round": kept[label]["module_rounds"]["shared"],
                               "back_in_s": round(time.monotonic() - back, 1),
                               "resumed_tokens": swarm.status(victim)["tokens_resumed"]})
                print(f"cycle {i + 1}/{args.cycles}: killed {victim} {cycles[-1]['kill']} at round "
                      f"{cycles[-1]['killed_at_round']}, {'same' if same else 'new'} identity, back in "
                      f"{cycles[-1]['back_in_s']} s", flush=True)
            # a few rounds after the last restart, for its split to settle before the end is judged (a node stuck
            # behind does not get there: that is what the end reports, not a reason to stop without a report)
            target = max(shared_round(swarm, n) for n in NAMES) + SETTLE_ROUNDS + STALLED_ROUNDS
            end = time.monotonic() + 60
            while time.monotonic() < end and not all(shared_round(swarm, n) >= target
                                                     and merged_since(swarm.status(n), target - STALLED_ROUNDS)
                                                     for n in NAMES):
                time.sleep(0.5)
            for n in NAMES:
                swarm.signal(n, signal.SIGTERM)
            codes = swarm.wait_nodes(list(NAMES), timeout_s=120)
            final = {n: swarm.status(n) for n in NAMES}
    check = check_replicas({**kept, **final})
    left = left_at_end(final)
    # every incarnation's heals: a status file holds its own run's (the killed ones' are in `kept`)
    heals = [h for st in [*kept.values(), *final.values()] for h in st.get("heals", [])]
    runs = split_runs(check.splits)
    settled = all(rounds <= SETTLE_ROUNDS for _, _, rounds in heals) and all(
        r <= SETTLE_ROUNDS for r in runs.values())
    nothing_left = not left["modules_split"] and not left["modules_stalled"]
    result = {
        "benchmark": "restarts", "cycles": args.cycles, "kill": args.kill, "dead_s": args.dead_s,
        "machine": machine(),
        "exit_codes": codes, "split_rounds": check.split_rounds, "splits": [str(s) for s in check.splits],
        "rounds_compared": check.rounds_compared, "digests_compared": check.digests_compared,
        "splits_healed": sum(st.get("splits_healed", 0) for st in [*kept.values(), *final.values()]),
        # counts a restarted node continues (node/peer/counters.py): the final statuses hold every run's
        "tokens_discarded": sum(st.get("tokens_discarded", 0) for st in final.values()),
        "tokens_lost": sum(st.get("tokens_lost", 0) for st in final.values()),
        "final_rounds": {n: st["module_rounds"] for n, st in final.items()}, "per_cycle": cycles,
        "heals": heals, "settle_rounds_max": max((r for _, _, r in heals), default=0),
        "split_run_max": runs, "split_discarded": {n: st.get("split_discarded", {}) for n, st in final.items()},
        **left, "wall_s": round(time.monotonic() - t0, 1),
        "goal": "0 split rounds" if args.kill == "mid-round" else
                f"0 modules left split or stalled, every split healed within {SETTLE_ROUNDS} rounds",
        "meets_goal": (check.split_rounds == 0 if args.kill == "mid-round" else True) and nothing_left and settled,
    }
    print(f"{check.split_rounds} split rounds in {args.cycles} cycles ({check.rounds_compared} rounds compared); "
          f"{len(heals)} healed, at most {result['settle_rounds_max']} rounds each; left split "
          f"{sorted(left['modules_split'])}, stalled {left['modules_stalled']}")
    write_json(args.json, result)


if __name__ == "__main__":
    main()
