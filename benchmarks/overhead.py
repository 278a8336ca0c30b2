"""Training throughput of a node in a live 2-node swarm ÷ the very same loop with networking off.

Side by side in one run, on the same machine and threads: (a) a bootstrap peer and two nodes on one
path averaging every module each round over p2pd on 127.0.0.1; (b) two `--offline` nodes running the
identical loop (same code path, their rounds reduced locally, no DHT, no p2pd) at the same time, so
both configurations share the CPU the same way. Throughput = tokens trained ÷ wall time of the whole
training loop (waiting for and applying outer rounds included).

    python benchmarks/overhead.py --json benchmarks/results/overhead.json
Goal (DESIGN.md): ≥ 0.97.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from _swarm_common import machine, write_json, write_spec

from pathswarm.node.app.local_swarm import LocalSwarm


def run(spec_path: Path, workdir: Path, rounds: int, offline: bool) -> dict:
    names = ("a", "b")
    with LocalSwarm(spec_path, workdir) as swarm:
        if not offline:
            swarm.start_bootstrap()
        for i, name in enumerate(names):
            extra = ["--offline"] if offline else ["--wait-peers", "2"]
            swarm.start_node(name, path="0.0", max_rounds=rounds, seed=i, extra=extra)
        codes = swarm.wait_nodes(list(names), timeout_s=3600)
        statuses = {n: swarm.status(n) for n in names}
    if any(codes.values()):
        raise SystemExit(f"a node failed: {codes}")
    per_node = {n: st["tokens_trained"] / st["train_wall_s"] for n, st in statuses.items()}
    return {"tokens_per_s": per_node, "mean_tokens_per_s": sum(per_node.values()) / len(per_node),
            "rounds": {n: st["round"] for n, st in statuses.items()},
            "bytes_sent": {n: st["bytes_sent"] for n, st in statuses.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", default="benchmarks/results/overhead.json")
    ap.add_argument("--inner-steps", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="pathswarm-overhead-") as tmp:
        _, spec_path = write_spec(Path(tmp), args.inner_steps, name="overhead")
        offline = run(spec_path, Path(tmp) / "offline", args.rounds, offline=True)
        swarm = run(spec_path, Path(tmp) / "swarm", args.rounds, offline=False)
    ratio = swarm["mean_tokens_per_s"] / offline["mean_tokens_per_s"]
    print(f"swarm {swarm['mean_tokens_per_s']:.0f} tok/s vs offline {offline['mean_tokens_per_s']:.0f} tok/s: "
          f"ratio {ratio:.3f} (goal ≥ 0.97)")
    write_json(args.json, {"benchmark": "overhead", "inner_steps": args.inner_steps, "rounds": args.rounds,
                           "machine": machine(), "offline": offline, "swarm": swarm, "ratio": ratio,
                           "goal": 0.97, "meets_goal": ratio >= 0.97})


if __name__ == "__main__":
    main()
