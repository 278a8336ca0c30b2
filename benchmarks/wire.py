"""Bytes on the wire per node per outer round vs fp32 data-parallel for the same inner steps.

Two real nodes (CLI subprocesses, p2pd on 127.0.0.1) train the same path, so every module of the
path is averaged every round. Bytes are counted where pathswarm writes to and reads from libp2p
streams (node/peer/rounds.py → protocol/wire.py `Traffic`): every message of the outer rounds, headers
included; libp2p's own framing and TLS are not counted. The fp32 data-parallel figure is what a
ring all-reduce sends per node for the same inner steps: 2·(n−1)/n · 4 bytes · parameters per step.

    python benchmarks/wire.py --json benchmarks/results/wire.json
Goals (DESIGN.md): ≥ 450× at H=100 and ≥ 2000× at H=500, with the nodes' default audit rate. Also (docs/SECURITY.md,
the audited reducer): the bytes per round with no audits and with every round audited, side by side at H=100, and
the cost at the default rate computed from them (a run of a few rounds rarely draws an audit at 1 in 8).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from _swarm_common import arguments, machine, write_json, write_spec

from pathswarm.node.app.local_swarm import LocalSwarm
from pathswarm.node.model.model import count_module_params
from pathswarm.node.peer.config import NodeConfig

DEFAULT_AUDIT_RATE = NodeConfig.__dataclass_fields__["audit_rate"].default
GOALS = {100: 450, 500: 2000}


def measure(h: int, rounds: int, workdir: Path, audit_rate: float | None = None) -> dict:
    spec, spec_path = write_spec(workdir, h, name=f"wire-h{h}")
    audit = [] if audit_rate is None else ["--audit-rate", str(audit_rate)]
    counts = count_module_params(spec)
    params = sum(counts[m] for m in spec.module_ids((0, 0)))
    n = 2
    t0 = time.monotonic()
    with LocalSwarm(spec_path, workdir / f"h{h}-audit{audit_rate}") as swarm:
        swarm.start_bootstrap()
        for i, name in enumerate(("a", "b")):
            swarm.start_node(name, path="0.0", max_rounds=rounds, seed=i, extra=["--wait-peers", str(n), *audit])
        codes = swarm.wait_nodes(["a", "b"], timeout_s=3600)
        statuses = {name: swarm.status(name) for name in ("a", "b")}
    if any(codes.values()):
        raise SystemExit(f"a node failed: {codes}")
    ddp_sent_per_round = 2 * (n - 1) / n * 4 * params * h
    nodes = {}
    for name, st in statuses.items():
        r = st["round"]
        sent, received = st["bytes_sent"] / r, st["bytes_received"] / r
        nodes[name] = {"rounds": r, "bytes_sent_per_round": sent, "bytes_received_per_round": received,
                       "ratio_sent": ddp_sent_per_round / sent,
                       "ratio_sent_plus_received": 2 * ddp_sent_per_round / (sent + received)}
    worst = min(min(v["ratio_sent"], v["ratio_sent_plus_received"]) for v in nodes.values())
    return {"inner_steps": h, "audit_rate": audit_rate if audit_rate is not None else DEFAULT_AUDIT_RATE,
            "audits": sum(st["audits"] for st in statuses.values()), "params_per_path": params,
            "ddp_fp32_bytes_sent_per_node_per_round": ddp_sent_per_round,
            "nodes": nodes, "worst_ratio": worst, "goal": GOALS.get(h), "meets_goal": worst >= GOALS.get(h, 0),
            "wall_s": time.monotonic() - t0}


def main() -> None:
    ap = arguments(__doc__, "wire")
    ap.add_argument("--inner-steps", default="100,500", help="comma-separated H values")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="pathswarm-wire-") as tmp:
        results = [measure(int(h), args.rounds, Path(tmp)) for h in args.inner_steps.split(",")]
        audit = audit_cost(args.rounds, Path(tmp))
    for r in results:
        print(f"H={r['inner_steps']}: worst ratio vs fp32 data-parallel {r['worst_ratio']:.0f}x (goal {r['goal']}x)")
    print(f"audits: +{audit['every_round_audited_vs_none'] - 1:.1%} bytes per round with every round audited, "
          f"+{audit['default_rate_vs_none_computed'] - 1:.1%} at the default rate (computed)")
    write_json(args.json, {"benchmark": "wire", "counted_at": "pathswarm libp2p stream framing (protocol/wire.py)",
                           "machine": machine(), "results": results, "audit": audit})


def audit_cost(rounds: int, workdir: Path, h: int = 100) -> dict:
    """Bytes per node per round (sent + received, both nodes' mean) with no audits and with every round audited
    (rate = the group's size, 2), measured; at the default rate, computed: none + (every − none) × rate / 2."""
    def per_round(r: dict) -> float:
        return sum(v["bytes_sent_per_round"] + v["bytes_received_per_round"] for v in r["nodes"].values()) / 2
    none, every = measure(h, rounds, workdir, 0.0), measure(h, rounds, workdir, 2.0)
    b0, b1 = per_round(none), per_round(every)
    default = b0 + (b1 - b0) * DEFAULT_AUDIT_RATE / 2
    return {"inner_steps": h, "group": 2, "bytes_per_round_no_audit": b0, "bytes_per_round_every_round_audited": b1,
            "audits_every_round_arm": every["audits"], "every_round_audited_vs_none": b1 / b0,
            "default_rate": DEFAULT_AUDIT_RATE, "default_rate_vs_none_computed": default / b0,
            "budget": "<= 2x the bytes per round without the trust design (issue 17)"}


if __name__ == "__main__":
    main()
