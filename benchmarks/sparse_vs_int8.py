"""Sparse outer gradients vs int8 + zstd vs fp32, on the deployed round rule: final loss against bytes (issue 18).

Every learning arm runs in node/train/simulate.py, whose round is the node's (node/train/round.py: error feedback,
robust token-weighted mean, the mean encoded once and decoded by every member); only `[codec]` changes:
- `fp32`: no compression (a raw float32 frame each way, patched into the round rule for this arm only);
- `int8`: blockwise int8 + zstd, the default;
- `sparse k=…`: per-chunk top-k of (outer gradient + error feedback) at `value_bits`, the mean as every non-zero
  entry at `mean_bits` (compression/sparse.py).
Two experiments: DiLoCo (4 workers on one path, H=50, benchmarks/diloco_vs_sync.py's setup) and DiPaCo 2x2 (one
worker per path, benchmarks/dipaco_vs_dense.py's setup). Bytes in these arms are computed from frame sizes, both
directions: each member but the reducer sends its frame, the reducer sends its mean to each member but itself.

One live arm per codec (`--live`): two real nodes on loopback (benchmarks/wire.py's harness) train one path for a
few rounds; their bytes are counted at the transport (protocol/wire.py `Traffic`), headers included.

Codec time: `round_s / inner_s` is the round rule's time (encode, the reducer's decodes, merge and mean encode, every
member's decode and outer step) over the inner steps' time, both on one thread, one after another.

    nice -n 10 .venv/bin/python benchmarks/sparse_vs_int8.py       # ≈ 25 min on 2 cores

Goals (issue 18): one arm ≥ 100× fewer bytes per outer round (both directions) than fp32 with final loss within 1 %
of int8's; the round rule's time ≤ 5 % of the inner compute.
"""

from __future__ import annotations

import dataclasses
import random
import tempfile
import time
from multiprocessing import Pool
from pathlib import Path
from types import SimpleNamespace

import diloco_vs_sync as diloco
import dipaco_vs_dense as dipaco
import torch
from _swarm_common import arguments, machine, read_json, save_plot, write_json

from pathswarm.compression import CodecError
from pathswarm.node.app.fmt import subplots
from pathswarm.node.model.data import load_documents, split
from pathswarm.node.train.simulate import SimConfig
from pathswarm.protocol.spec import CodecSpec, DataSpec, OuterOptSpec

GOAL_BYTES, GOAL_LOSS, GOAL_TIME = 100.0, 0.01, 0.05
GAP_ROUNDS = (30, 100, 300)  # issue 30: the gap to int8 at these round counts, to see its trend


@dataclasses.dataclass(frozen=True)
class Float32Codec:
    """No compression: the values as raw float32 (the `fp32` arm's contributions and means)."""

    def check(self, tensor: torch.Tensor) -> None:
        pass

    def encode_values(self, flat: torch.Tensor, shape, dtype, want_decoded: bool = False):
        flat = flat.float().contiguous()
        return flat.numpy().tobytes(), (flat.clone() if want_decoded else None)

    def decode(self, data, max_elements: int) -> torch.Tensor:
        if len(data) != 4 * max_elements:
            raise CodecError(f"an fp32 frame of {len(data)} bytes for {max_elements} values")
        return torch.frombuffer(bytearray(data), dtype=torch.float32)

    def encode(self, tensor: torch.Tensor) -> bytes:
        return self.encode_values(tensor.reshape(-1), tuple(tensor.shape), tensor.dtype)[0]

    def max_frame_bytes(self, numel: int) -> int:
        return 4 * numel


def codecs(chunk: int, bits: int, mean_bits: int) -> dict[str, CodecSpec | None]:
    """Every arm's codec: fp32, int8, sparse at k = 1 / 3 / 10 % of each chunk (`[codec] feedback` auto: what a
    frame does not carry stays in the local weights), 10 % at 4 bits, and 1 % with a residual buffer instead."""

    def sparse(percent: float, value_bits: int, feedback: str = "auto") -> CodecSpec:
        return CodecSpec(kind="sparse", chunk_size=chunk, value_bits=value_bits, mean_bits=mean_bits,
                         k_per_chunk=max(1, round(percent / 100 * chunk)), feedback=feedback)

    return {"fp32": None, "int8": CodecSpec(),
            **{f"sparse k={p}% {bits}-bit": sparse(p, bits) for p in (1, 3, 10)},
            "sparse k=10% 4-bit": sparse(10, 4), f"sparse k=1% {bits}-bit buffer": sparse(1, bits, "buffer")}


def sparseloco_arms(chunk: int, bits: int, percents: list[float], betas: list[float], lrs: list[float],
                    means: list[str]) -> dict[str, tuple[CodecSpec, OuterOptSpec]]:
    """SparseLoCo's arms (issue 30: `[outer] kind = "sparseloco"`): per-chunk top-k of the decaying error-feedback
    buffer at `bits`, a plain outer step of lr. `means`: how the reducer sends the mean, each "MxB": its top M·k
    entries per chunk at B bits ("1x2": as sparse as a contribution, the downlink costing the uplink), or with M = 0
    every non-zero entry (the union of the contributions) at B bits. Every (percent, beta, lr, mean) is an arm, and
    with "1x{bits}" among them one more arm per density with the union at 8 bits at the middle beta and lr."""
    out = {}
    for p in percents:
        k = max(1, round(p / 100 * chunk))
        for mean in means:
            mult, mean_bits = (int(v) for v in mean.split("x"))
            codec = CodecSpec(kind="sparse", chunk_size=chunk, value_bits=bits, mean_bits=mean_bits, k_per_chunk=k,
                              mean_k_per_chunk=min(chunk, mult * k), feedback="buffer")
            tag = "" if mean == f"1x{bits}" else f" mean={mean}"
            for beta in betas:
                for lr in lrs:
                    out[f"sparseloco k={p:g}% b={beta:g} lr={lr:g}{tag}"] = (
                        codec, OuterOptSpec(kind="sparseloco", beta=beta, lr=lr))
        if f"1x{bits}" in means:
            mid_beta, mid_lr = betas[len(betas) // 2], lrs[len(lrs) // 2]
            union = CodecSpec(kind="sparse", chunk_size=chunk, value_bits=bits, mean_bits=8, k_per_chunk=k,
                              mean_k_per_chunk=0, feedback="buffer")
            out[f"sparseloco k={p:g}% b={mid_beta:g} lr={mid_lr:g} union-mean"] = (
                union, OuterOptSpec(kind="sparseloco", beta=mid_beta, lr=mid_lr))
    return out


DIPACO_ARMS = ("fp32", "int8", "sparse k=1% 2-bit", "sparse k=3% 2-bit", "sparse k=10% 2-bit")
"""The DiPaCo experiment's arms by default (each costs ~6 min on one core)."""


_SPEC_CODECS = (CodecSpec.contribution_codec, CodecSpec.mean_codec)


def _use_codec(codec: CodecSpec | None):
    """The spec's codec, or (None) the fp32 arm: which codec a `CodecSpec` hands the round rule is replaced in this
    process (and put back for the next arm a pool process runs)."""
    CodecSpec.contribution_codec, CodecSpec.mean_codec = _SPEC_CODECS  # type: ignore[method-assign]
    if codec is None:
        raw = Float32Codec()
        CodecSpec.contribution_codec = CodecSpec.mean_codec = lambda _spec: raw  # type: ignore[method-assign]
        return CodecSpec()
    return codec


def _job(job: dict) -> dict:
    torch.set_num_threads(1)
    codec = _use_codec(job["codec"])
    outer = job.get("outer")  # SparseLoCo's arms: its outer step (else the setup's Nesterov)
    a = job["args"]
    t0 = time.perf_counter()
    if job["experiment"] == "diloco":
        docs, spec, final_batches = diloco.setup(a)
        spec = spec.replace(codec=codec, **({"outer": outer} if outer else {}))
        arm = diloco.run_arm(spec, docs, "diloco", diloco.WORKERS, a["h"], a["total_steps"], a["h"], 8,
                             final_batches, a["seed"])
        rounds = arm["communication_rounds"]
    else:
        docs = load_documents(DataSpec(corpus="bbc"))
        random.Random(0).shuffle(docs)  # as dipaco_vs_dense.py: the same documents, the same router
        settings = SimpleNamespace(width=a["width"], context_len=a["context_len"], batch_size=a["batch_size"],
                                   inner_steps=a["h"], outer_lr=OuterOptSpec().lr)
        spec = dipaco.make_spec(docs, (2, 2), 1, settings).replace(codec=codec, **({"outer": outer} if outer else {}))
        _, val = split(docs, spec.data.val_fraction)
        cfg = SimConfig(mode="dipaco", rounds=a["dipaco_rounds"], inner_steps=a["h"], seed=a["seed"], eval_batches=4)
        arm = dipaco.run_arm(job["name"], spec, cfg, docs, dipaco.eval_groups(spec, val), True)
        rounds = arm["rounds"]
    loss = arm["final_val_loss"]
    out = {"experiment": job["experiment"], "arm": job["name"], "final_val_loss": loss,
           "codec": dataclasses.asdict(job["codec"]) if job["codec"] else "fp32",
           "outer": dataclasses.asdict(spec.outer),
           "rounds": rounds, "bytes_total": arm["bytes_sent"], "bytes_up": arm["bytes_up"],
           "bytes_down": arm["bytes_down"], "inner_s": arm["inner_s"], "round_s": arm["round_s"],
           "round_time_vs_inner": arm["round_s"] / arm["inner_s"], "curve": arm["curve"],
           "wall_s": time.perf_counter() - t0}
    print(f"{job['experiment']:7s} {job['name']:20s} loss {loss:.4f}  bytes {out['bytes_total']:,} "
          f"(up {out['bytes_up']:,})  round/inner {out['round_time_vs_inner']:.4f}  ({out['wall_s']:.0f} s)",
          flush=True)
    return out


def live(codec_specs: dict[str, CodecSpec | None], h: int, rounds: int) -> list[dict]:
    """Two real nodes per codec; bytes per node per round counted at the transport (benchmarks/wire.py)."""
    import wire

    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, codec in codec_specs.items():
            if codec is None:
                continue  # no fp32 codec in a running node
            r = wire.measure(h, rounds, Path(tmp) / name.replace(" ", "_").replace("%", "pc"), 0.0, codec)
            both = {n: v["bytes_sent_per_round"] + v["bytes_received_per_round"] for n, v in r["nodes"].items()}
            out.append({"arm": name, "params_per_path": r["params_per_path"], "inner_steps": h,
                        "bytes_both_directions_per_node_per_round": both,
                        "fp32_both_directions_per_node_per_round": 2 * 4 * r["params_per_path"],
                        "ratio_vs_fp32_round": 2 * 4 * r["params_per_path"] / max(both.values()),
                        "ratio_vs_fp32_ddp": r["worst_ratio"], "wall_s": r["wall_s"]})
            print(f"live    {name:20s} {max(both.values()):,.0f} bytes/node/round both ways "
                  f"({out[-1]['ratio_vs_fp32_round']:.0f}x below fp32)", flush=True)
    return out


def summarise(arms: list[dict]) -> dict:
    out = {}
    for exp in sorted({a["experiment"] for a in arms}):
        rows = {a["arm"]: a for a in arms if a["experiment"] == exp}
        fp32, int8 = rows.get("fp32"), rows.get("int8")
        table = []
        for name, a in rows.items():
            table.append({"arm": name, "final_val_loss": a["final_val_loss"],
                          "loss_vs_int8": a["final_val_loss"] / int8["final_val_loss"] if int8 else None,
                          "bytes_per_round": a["bytes_total"] / a["rounds"],
                          "bytes_vs_fp32": fp32["bytes_total"] / a["bytes_total"] if fp32 else None,
                          "up_vs_fp32": fp32["bytes_up"] / a["bytes_up"] if fp32 else None,
                          "down_vs_fp32": fp32["bytes_down"] / a["bytes_down"] if fp32 else None,
                          "round_time_vs_inner": a["round_time_vs_inner"]})
        # the gap to int8 + zstd at the same tokens, at a few round counts: how it moves as rounds go on
        for t in table:
            t["loss_vs_int8_at_round"] = {
                str(r): rows[t["arm"]]["curve"][r]["val_loss"] / int8["curve"][r]["val_loss"]
                for r in GAP_ROUNDS if int8 and len(rows[t["arm"]]["curve"]) > r and len(int8["curve"]) > r}
        meeting = [t for t in table if t["bytes_vs_fp32"] and t["loss_vs_int8"]
                   and t["bytes_vs_fp32"] >= GOAL_BYTES and t["loss_vs_int8"] <= 1 + GOAL_LOSS]
        sparse = [t for t in table if t["arm"].startswith("sparse")]
        out[exp] = {"table": table,
                    "goal_bytes_and_loss": {"met": bool(meeting), "arms": [t["arm"] for t in meeting],
                                            "closest": [{"arm": t["arm"], "bytes_vs_fp32": t["bytes_vs_fp32"],
                                                         "loss_vs_int8": t["loss_vs_int8"]} for t in sparse]},
                    "goal_round_time": {"worst_sparse": max((t["round_time_vs_inner"] for t in sparse), default=None),
                                        "met": all(t["round_time_vs_inner"] <= GOAL_TIME for t in sparse)}}
    return out


CURVE_EVERY = 10  # rounds between two curve points kept in the JSON (every point is used by `summarise` first)


def thinned(arm: dict) -> dict:
    """The arm with its loss curve cut to every CURVE_EVERY-th point and the last: 300 rounds × ~40 arms of full
    curves made megabytes of JSON."""
    curve = arm["curve"]
    if len(curve) <= 2 * CURVE_EVERY:
        return arm
    keep = [p for i, p in enumerate(curve) if i % CURVE_EVERY == 0 or i == len(curve) - 1]
    return {**arm, "curve": keep, "curve_every_rounds": CURVE_EVERY}


def plot(result: dict, path: Path) -> None:
    """Loss against bytes per round, one panel per experiment: every arm a dot coloured by family, the baselines and
    the arms on the Pareto front (no other arm both cheaper and better) labelled."""
    experiments = sorted(result["summary"])
    fig, axes = subplots(1, len(experiments), figsize=(6.5 * len(experiments), 4.8))
    axes = axes if len(experiments) > 1 else [axes]
    families = (("union", "tab:red", "SparseLoCo, union mean"), ("mean=", "tab:purple", "SparseLoCo, other means"),
                ("sparseloco", "tab:blue", "SparseLoCo, top-k mean"), ("sparse", "tab:green", "sparse + Nesterov"),
                ("", "black", "int8 / fp32"))
    for ax, exp in zip(axes, experiments, strict=True):
        table = result["summary"][exp]["table"]
        front = {t["arm"] for t in table if not any(
            o["bytes_per_round"] <= t["bytes_per_round"] and o["final_val_loss"] < t["final_val_loss"]
            for o in table if o is not t)}
        seen = set()
        for t in table:
            key, colour, label = next(f for f in families if f[0] in t["arm"])
            ax.scatter(t["bytes_per_round"], t["final_val_loss"], s=28, color=colour,
                       label=None if label in seen else label)
            seen.add(label)
            if t["arm"] in front or t["arm"] in ("int8", "fp32"):
                ax.annotate(t["arm"].replace("sparseloco ", ""), (t["bytes_per_round"], t["final_val_loss"]),
                            fontsize=7, xytext=(4, 3), textcoords="offset points")
        ax.set_xscale("log")
        ax.set_xlabel("bytes per outer round, both directions (from frame sizes)")
        ax.set_ylabel("final validation loss (nats/byte)")
        ax.set_title(f"{exp}: loss vs bytes (labelled: baselines and the Pareto front)", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper right")
    save_plot(fig, path)


def main() -> None:
    ap = arguments(__doc__, "sparse_vs_int8", plot=True, replot=True)
    ap.add_argument("--experiments", default="diloco,dipaco", help="comma-separated: diloco, dipaco")
    ap.add_argument("--arms", default="", help="comma-separated arm names (default: all; DiPaCo: DIPACO_ARMS)")
    ap.add_argument("--h", type=int, default=50, help="inner steps per round")
    ap.add_argument("--total-steps", type=int, default=1500, help="DiLoCo: inner steps per worker")
    ap.add_argument("--dipaco-rounds", type=int, default=40, help="DiPaCo 2x2: rounds")
    ap.add_argument("--chunk", type=int, default=4096)
    ap.add_argument("--bits", type=int, default=2, help="value bits of the sparse arms' contributions")
    ap.add_argument("--mean-bits", type=int, default=8)
    ap.add_argument("--live", type=int, default=3, help="rounds of the live two-node arms (0: none)")
    ap.add_argument("--live-h", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2, help="DiLoCo: layers of its one path")
    ap.add_argument("--context-len", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--sparseloco", action="store_true",
                    help="add SparseLoCo's arms (issue 30): --loco-percents × --loco-betas × --loco-lrs")
    ap.add_argument("--loco-percents", default="1,3")
    ap.add_argument("--loco-betas", default="0.9,0.95,0.99")
    ap.add_argument("--loco-lrs", default="0.5,1,2")
    ap.add_argument("--loco-means", default="1x2",
                    help="how the mean travels, each MxB: top M·k per chunk at B bits, M = 0: the union (see "
                         "`sparseloco_arms`)")
    args = ap.parse_args()
    if args.replot:
        return plot(read_json(args.json), Path(args.plot))
    a = dict(width=args.width, layers=args.layers, context_len=args.context_len, batch_size=args.batch_size,
             lr=3e-3, total_steps=args.total_steps, eval_every=args.h, eval_batches=8, final_batches=256, h=args.h,
             seed=args.seed, dipaco_rounds=args.dipaco_rounds)
    specs = codecs(args.chunk, args.bits, args.mean_bits)
    chosen = [n for n in specs if not args.arms or n in args.arms.split(",")]
    jobs = [{"experiment": e, "name": n, "codec": specs[n], "args": a} for e in args.experiments.split(",")
            for n in chosen if e == "diloco" or args.arms or n in DIPACO_ARMS]
    if args.sparseloco:
        floats = lambda text: [float(v) for v in text.split(",")]  # noqa: E731
        loco = sparseloco_arms(args.chunk, args.bits, floats(args.loco_percents), floats(args.loco_betas),
                               floats(args.loco_lrs), args.loco_means.split(","))
        jobs += [{"experiment": e, "name": n, "codec": c, "outer": o, "args": a}
                 for e in args.experiments.split(",") for n, (c, o) in loco.items()]
    t0 = time.perf_counter()
    with Pool(args.jobs, maxtasksperchild=1) as pool:
        arms = pool.map(_job, jobs, chunksize=1)
    result = {"claim": "sparse outer gradients: >= 100x fewer bytes per round than fp32 (both directions) within "
                       "1 % of int8 + zstd's final loss; round rule <= 5 % of inner compute",
              "config": {**a, "chunk": args.chunk, "bits": args.bits, "mean_bits": args.mean_bits,
                         "bytes": "learning arms: computed from frame sizes, both directions; live arms: counted at "
                                  "the transport", "round_rule": "node/train/round.py"},
              "summary": summarise(arms), "arms": [thinned(a) for a in arms]}
    if args.live:
        result["live"] = live({n: specs[n] for n in chosen}, args.live_h, args.live)
    result["machine"], result["wall_s"] = machine(), time.perf_counter() - t0
    write_json(args.json, result)
    plot(result, Path(args.plot))


if __name__ == "__main__":
    main()
