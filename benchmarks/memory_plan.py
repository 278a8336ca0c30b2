"""What fits on a home GPU, by the memory plan (node/train/memory.py): the largest path per card size (issue 19).

For widths 768–2048 (steps of 128) and 1–24 blocks per module (a path holds the shared module and one module per
level of the default 2x2 grid), context 1024, the spec's batch of 8 with micro-batches down to one sequence, and
activation checkpointing where nothing else fits: the configuration with the most parameters whose training step
fits in 90 % of 8, 12 and 24 GiB, with AdamW and with AdamW8bit. Nothing is allocated: the plan counts on PyTorch's
meta device. Activations are counted in fp32; bf16 autocast on a GPU keeps most of them in half the bytes, so the
plan errs on the safe side. The gain depends on the grid: on widths of 768, 1024, 1536 and 2048 only, 8 GiB gave
1.4995×.

    .venv/bin/python benchmarks/memory_plan.py        # ≈ 1 min

Goal (issue 19): a path that fits in 8 GiB at 32-bit state grows ≥ 1.5× in parameters at 8-bit state.
"""

from __future__ import annotations

from _swarm_common import arguments, machine, write_json

from pathswarm.node.train.memory import fits, plan_path
from pathswarm.protocol.spec import ModelSpec, SwarmSpec

BUDGETS_GIB = (8, 12, 24)


def main() -> None:
    ap = arguments(__doc__, "memory_plan")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--widths", default="768,896,1024,1152,1280,1408,1536,1664,1792,1920,2048")
    ap.add_argument("--max-layers", type=int, default=24)
    args = ap.parse_args()
    plans = []
    for width in (int(w) for w in args.widths.split(",")):
        for layers in range(1, args.max_layers + 1):
            spec = SwarmSpec(model=ModelSpec(width=width, n_heads=width // 64, layers_per_module=layers,
                                             context_len=args.context))
            m = plan_path(spec, spec.path_of_index(0))
            plans.append((width, layers, spec.inner.batch_size, m))
    table = []
    for gib in BUDGETS_GIB:
        row = {"budget_gib": gib}
        for optimizer in ("adamw", "adamw8bit"):
            best = None
            for width, layers, batch, m in plans:
                fit = next((f for f in fits(m, batch, gib << 30) if f.optimizer == optimizer), None)
                if fit is not None and (best is None or m.params > best["params"]):
                    best = {"params": m.params, "width": width, "layers_per_module": layers,
                            "micro_batch": fit.micro_batch, "checkpointing": fit.checkpointing,
                            "peak_gib": fit.device_bytes / 2**30}
            row[optimizer] = best
        row["params_ratio_8bit"] = (row["adamw8bit"]["params"] / row["adamw"]["params"]
                                    if row["adamw"] and row["adamw8bit"] else None)
        table.append(row)
        print(gib, "GiB:", {k: (v["params"] / 1e6, v["width"], v["layers_per_module"], v["micro_batch"],
                                v["checkpointing"])
                            for k, v in row.items() if isinstance(v, dict)}, f"ratio {row['params_ratio_8bit']:.2f}")
    eight = table[0]["params_ratio_8bit"]
    write_json(args.json, {"claim": "the plan's largest path that fits a card, AdamW vs AdamW8bit",
                           "config": {"context_len": args.context, "batch": 8, "levels": [2, 2],
                                      "activations": "fp32, counted on the meta device"},
                           "table": table, "goal": {"params_ratio_8bit_at_8gib": eight, "met": eight >= 1.5},
                           "machine": machine()})


if __name__ == "__main__":
    main()
