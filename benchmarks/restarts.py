"""Split rounds in repeated kill/restart cycles of the reducer: the one-version invariant under the fault that
broke it (issue 15: 12 of 14 runs split a round when the reducer was SIGKILLed and restarted).

A bootstrap peer and 3 node processes on 127.0.0.1 train a 1x3 spec (all three hold `shared` and `L0M0`),
paced to 5 inner steps a second (H = 10: a round every 2 s). Each cycle: wait for a round to settle, then half a
round, SIGKILL the current reducer of `shared` (the head of the reducer list the last result named), keep it
dead `--dead-s` seconds (its claim lapses), restart it with the identical command line and checkpoint
directory, alternately with its identity file and with a new identity, and wait until it has merged a round
with the others. Every incarnation's status file is kept; at the end every node's digest of every (module,
round) is compared with every other's (node/app/replicas.py), whatever their groups.

    python benchmarks/restarts.py --cycles 20 --json benchmarks/results/restarts.json    # ≈ 10 min

Goal (issue 15): 0 split rounds in 20 cycles.
"""

from __future__ import annotations

import shutil
import signal
import tempfile
import time
from pathlib import Path

from _swarm_common import arguments, machine, write_json

from pathswarm.node.app.local_swarm import LocalSwarm
from pathswarm.node.app.replicas import check_replicas
from pathswarm.node.app.swarm_init import init_spec
from pathswarm.node.model.data import synthetic_corpus
from pathswarm.protocol.spec import AveragingSpec, DataSpec, InnerOptSpec, ModelSpec, SwarmSpec

H, STEPS_PER_S = 10, 5
NAMES = {"a": "0.0", "b": "0.1", "c": "0.2"}


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


def main() -> None:
    ap = arguments(__doc__, "restarts")
    ap.add_argument("--cycles", type=int, default=20)
    ap.add_argument("--dead-s", type=float, default=8.0, help="how long the killed reducer stays dead")
    args = ap.parse_args()
    spec = init_spec(SwarmSpec(name="restarts", levels=(1, 3),
                               model=ModelSpec(width=32, base_width=32, n_heads=2, layers_per_module=1, context_len=32),
                               inner=InnerOptSpec(steps=H, batch_size=4, warmup_steps=2),
                               data=DataSpec(corpus="synthetic"),
                               averaging=AveragingSpec(grace_s=3.0, timeout_s=20.0, claim_ttl_s=6.0)),
                     synthetic_corpus(200, seed=0))
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="pathswarm-restarts-") as tmp:
        tmp = Path(tmp)
        spec_path = tmp / "swarm.toml"
        spec_path.write_text(spec.to_toml())
        kept: dict[str, dict] = {}  # incarnation label → its last status

        def start(name: str, identity: bool) -> None:
            extra = ["--identity", str(tmp / f"{name}.id")] if identity else []
            swarm.start_node(name, path=NAMES[name], extra=["--wait-peers", "3", "--save-partial-s", "0.2",
                                                            "--max-tokens-per-s", str(STEPS_PER_S * 4 * 32), *extra])

        cycles = []
        with LocalSwarm(spec_path, tmp / "run") as swarm:
            swarm.start_bootstrap()
            for name in NAMES:
                start(name, identity=True)
            wait(lambda: all(shared_round(swarm, n) >= 2 for n in NAMES), 180, "two rounds")
            for i in range(args.cycles):
                st = {n: swarm.status(n) for n in NAMES}
                reducer = next(iter(st.values()))["reducers"]["shared"][0]
                victim = next((n for n in NAMES if st[n]["peer_id"] == reducer), None)
                if victim is None:  # the head is not a live node: wait for a round to name one
                    time.sleep(2)
                    victim = next(n for n in NAMES if swarm.status(n)["peer_id"]
                                  == swarm.status("a")["reducers"]["shared"][0])
                settled = shared_round(swarm, victim)
                wait(lambda v=victim, s=settled: shared_round(swarm, v) > s, 60, "a round to settle")
                time.sleep(H / 2 / STEPS_PER_S)
                swarm.signal(victim, signal.SIGKILL)
                swarm.nodes[victim].wait(10)
                label = f"{victim}#{i}"
                kept[label] = swarm.status(victim)
                shutil.copy(swarm.node_files(victim)["status.json"], tmp / f"{label}.status.json")
                time.sleep(args.dead_s)
                same = i % 2 == 0
                start(victim, identity=same)
                back = time.monotonic()
                others = [n for n in NAMES if n != victim]
                target = max(shared_round(swarm, n) for n in others) + 2
                wait(lambda v=victim, t=target: shared_round(swarm, v) >= t, 120, f"{victim} back in the group")
                cycles.append({"cycle": i, "victim": victim, "same_identity": same,
                               "killed_at_round": kept[label]["module_rounds"]["shared"],
                               "back_in_s": round(time.monotonic() - back, 1),
                               "resumed_tokens": swarm.status(victim)["tokens_resumed"]})
                print(f"cycle {i + 1}/{args.cycles}: killed {victim} at round {cycles[-1]['killed_at_round']}, "
                      f"{'same' if same else 'new'} identity, back in {cycles[-1]['back_in_s']} s", flush=True)
            for n in NAMES:
                swarm.signal(n, signal.SIGTERM)
            codes = swarm.wait_nodes(list(NAMES), timeout_s=120)
            final = {n: swarm.status(n) for n in NAMES}
    check = check_replicas({**kept, **final})
    result = {
        "benchmark": "restarts", "cycles": args.cycles, "dead_s": args.dead_s, "machine": machine(),
        "exit_codes": codes, "split_rounds": check.split_rounds, "splits": [str(s) for s in check.splits],
        "rounds_compared": check.rounds_compared, "digests_compared": check.digests_compared,
        "splits_healed": sum(st.get("splits_healed", 0) for st in [*kept.values(), *final.values()]),
        "tokens_discarded": sum(st.get("tokens_discarded", 0) for st in [*kept.values(), *final.values()]),
        "final_rounds": {n: st["module_rounds"] for n, st in final.items()}, "per_cycle": cycles,
        "wall_s": round(time.monotonic() - t0, 1), "goal": "0 split rounds", "meets_goal": check.split_rounds == 0,
    }
    print(f"{check.split_rounds} split rounds in {args.cycles} cycles ({check.rounds_compared} rounds compared)")
    write_json(args.json, result)


if __name__ == "__main__":
    main()
