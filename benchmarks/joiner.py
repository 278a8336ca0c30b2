"""A node that joins with an untrained module: what its first rounds cost the trained holders, with and without
holding its weight back (`node run --fresh-path-rounds`, node/peer/rounds.py `Rounds.note_start`).

The swarm is benchmarks/hostile.py's clean arm: a bootstrap peer and nodes a (path 0.0) and b (path 0.1) on
127.0.0.1 train `--rounds` rounds; at a's round `rounds // 3`, node c joins on path 1.0, whose L0M1 nobody has
trained, and trains a third as many rounds. c shares `shared` with both and L1M0 with a. Arms, interleaved over
`--repeats`:
- `full-weight` (`--fresh-path-rounds 0`): c's outer gradients of `shared` and L1M0 weigh its tokens from its
  first round, though they are made through its random L0M1;
- `fresh-path` (the default, 5 rounds): they weigh 1 token for c's first 5 rounds.

Per arm: each node's final checkpoint on hostile.py's held-out set (1,000 generated documents routed to its path;
c's on its own path), mean over repeats and each repeat, and the ratio of `fresh-path` to `full-weight`. JSON.

    python benchmarks/joiner.py                 # ≈ 10 min on 2 cores
    python benchmarks/joiner.py --repeats 1     # a quick look
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path

from _swarm_common import REPO, arguments, machine, write_json
from hostile import HONEST, run_arm

ARMS = {"full-weight": ("--fresh-path-rounds", "0"), "fresh-path": ()}


def main() -> None:
    ap = arguments(__doc__, "joiner")
    ap.add_argument("--rounds", type=int, default=30, help="rounds a and b train per run")
    ap.add_argument("--repeats", type=int, default=3, help="runs per arm")
    args = ap.parse_args()
    t0 = time.monotonic()
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    runs: dict[str, list[dict]] = {a: [] for a in ARMS}
    with tempfile.TemporaryDirectory(prefix="pathswarm-joiner-") as tmp:
        for rep in range(args.repeats):
            for arm, joiner_args in ARMS.items():
                got = run_arm("clean", args.rounds, Path(tmp) / f"{arm}-{rep}", joiner_args=joiner_args)
                runs[arm].append(got)
                print(f"repeat {rep + 1}/{args.repeats} {arm}: held-out loss {got['heldout_loss']}, "
                      f"mismatches {got['replica_mismatches']}", flush=True)
    names = [*HONEST, "c"]
    mean = {arm: {n: statistics.fmean(r["heldout_loss"][n] for r in rs) for n in names} for arm, rs in runs.items()}
    result = {
        "benchmark": "joiner", "rounds": args.rounds, "repeats": args.repeats, "machine": machine(),
        "arms": {arm: {"heldout_loss_mean": mean[arm], "heldout_loss_runs": [r["heldout_loss"] for r in rs],
                       "replica_mismatches": sum(r["replica_mismatches"] for r in rs),
                       "crashed": sum(c != 0 for r in rs for c in r["exit_codes"].values())}
                 for arm, rs in runs.items()},
        "ratio_fresh_path_to_full_weight": {n: mean["fresh-path"][n] / mean["full-weight"][n] for n in names},
        "wall_s": round(time.monotonic() - t0, 1),
    }
    print("held-out loss, fresh-path / full-weight: "
          + ", ".join(f"{n} {r:.3f}" for n, r in result["ratio_fresh_path_to_full_weight"].items()))
    write_json(args.json, result)


if __name__ == "__main__":
    main()
