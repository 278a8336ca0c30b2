"""`pathswarm swarm init`: fit the router of a new swarm on its corpus and describe the result.

`init_spec` takes a spec built from the command line (levels, width, data, ...) and the corpus's
documents, fits one k-means centroid per path on the training split and returns the spec with the
centroids, which fixes its swarm_id. `format_init_report` is what the command prints: the swarm's
shape, parameters per module and per path, documents per path and the label x path table that shows
whether the router sends each topic to its own path.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from pathswarm.node.app.fmt import count
from pathswarm.node.model.data import Document, split
from pathswarm.node.model.model import count_module_params
from pathswarm.node.model.router import assignment_table, fit_router
from pathswarm.protocol.spec import CodecSpec, OuterOptSpec, SwarmSpec, format_path

log = logging.getLogger(__name__)

MAX_LABEL_ROWS = 20
"""The label x path table shows at most this many labels (the most common)."""


def round_defaults(levels: Sequence[int]) -> tuple[int, float]:
    """(H, outer learning rate) that `swarm init` gives a spec of these levels, as measured on the round rule
    (issue 16; benchmarks/diloco_vs_sync.py, benchmarks/dipaco_vs_dense.py, same tokens):
    - one path (DiLoCo: every module averaged by all workers): H = 50, lr 0.7. 4 workers at lr 0.7 end 0.1 % below
      synchronous data-parallel; at lr 0.5, 1.2 % above (and H = 250 only 6.3 % below one worker alone, not 7.1 %).
    - a grid (DiPaCo: a level module is averaged by only the paths through it): H = 25, lr 0.5. The 2x2 grid ends
      2.0 % above the dense model of the whole swarm's size, against 3.3 % at H = 25, lr 0.7 and 3.4-3.8 % at H = 50
      (lr 0.5-0.7). Fewer workers per average take a smaller outer step, as DiLoCo's own sweeps found."""
    return (50, 0.7) if all(k == 1 for k in levels) else (25, 0.5)


EAGER_LR_SCALE = 0.5
"""`swarm init --eager` halves the default outer learning rate: eager updates helped only with a smaller outer step
(benchmarks/lan_h_sweep.py --eager, one path, 8 workers, H = 10, each mean a chunk late: lr 0.35 1.884, 0.25 1.891,
0.5 1.984, against 2.438 at the default 0.7 and 2.088 without eager updates; H = 50: 0.35 2.083, 0.5 2.085, 2.353 at
0.7). A grid's halved default (0.25) follows by analogy, not measured."""


def init_spec(base: SwarmSpec, docs: Sequence[Document]) -> SwarmSpec:
    """`base` with its router fitted on the training split of `docs` (router.seed seeds k-means)."""
    train, _ = split(docs, base.data.val_fraction)
    if len(train) < base.n_paths:
        raise ValueError(f"the training split holds {len(train)} documents, fewer than the {base.n_paths} "
                         f"paths of levels {list(base.levels)}: use more documents or fewer paths")
    log.info("fitting the router: %d centroids on %d training documents", base.n_paths, len(train))
    return base.replace(router=fit_router(train, base.router, base.n_paths))


def _table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    """Plain-text table: first column left-aligned, the others right-aligned."""
    cells = [[str(c) for c in header]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[j]) for r in cells) for j in range(len(header))]

    def line(r: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if j == 0 else c.rjust(w) for j, (c, w) in enumerate(zip(r, widths, strict=True)))

    return [line(cells[0]), "  ".join("-" * w for w in widths)] + [line(r) for r in cells[1:]]


def format_init_report(spec: SwarmSpec, docs: Sequence[Document]) -> str:
    """Readable summary of a fitted spec over its corpus (what `pathswarm swarm init` prints)."""
    spec.require_router()
    train, val = split(docs, spec.data.val_fraction)
    r, m = spec.router, spec.model
    out = [
        f"swarm {spec.name!r}  id {spec.swarm_id}",
        f"levels {'x'.join(map(str, spec.levels))} -> {count(spec.n_paths, 'path')}; width {m.width}, "
        f"{m.layers_per_module} layers per module, context {m.context_len} bytes",
        f"corpus {spec.data.corpus!r}: {len(docs)} documents ({len(train)} train, {len(val)} validation)",
        f"router: byte {r.ngram}-grams of the first {r.prefix_bytes} bytes -> {r.features} features, "
        f"k-means seed {r.seed}",
    ]

    params = count_module_params(spec)
    out += ["", "parameters per module"]
    out += _table(["module", "params"], [(mid, f"{params[mid]:,}") for mid in spec.all_module_ids()])

    table = assignment_table(train, spec.router, spec)
    val_table = assignment_table(val, spec.router, spec) if val else None
    rows = []
    for p in table["paths"]:
        path = p["path"]
        n_params = f"{sum(params[mid] for mid in spec.module_ids(path)):,}"
        n_val = val_table["paths"][p["index"]]["docs"] if val_table else 0
        share = p["docs"] / max(table["n_docs"], 1)
        rows.append((format_path(path), " ".join(spec.module_ids(path)), n_params, p["docs"], n_val, f"{share:.0%}"))
    out += ["", "paths"]
    out += _table(["path", "modules", "params", "train docs", "val docs", "share"], rows)

    labels = table["labels"]
    if labels != [""]:
        # Many labels (e.g. one per .txt file) would drown the table: show the most common ones.
        totals = {label: sum(p["labels"][label] for p in table["paths"]) for label in labels}
        shown = sorted(sorted(labels, key=lambda lb: -totals[lb])[:MAX_LABEL_ROWS])
        out += ["", f"train documents per label x path (purity {table['purity']:.1%})"]
        header = ["label"] + [format_path(p["path"]) for p in table["paths"]]
        out += _table(header, [[label or "(none)"] + [p["labels"][label] for p in table["paths"]]
                               for label in shown])
        if len(shown) < len(labels):
            out.append(f"({len(labels) - len(shown)} less common labels not shown)")
    return "\n".join(out) + "\n"


SPARSELOCO_LR, SPARSELOCO_BETA, SPARSELOCO_MEAN_BITS = 1.0, 0.99, 3
"""SparseLoCo's defaults: the best of benchmarks/sparse_vs_int8.py --sparseloco at 1 % (docs/BENCHMARKS.md,
"SparseLoCo"): after 300 rounds, 0.994 × int8's loss at 104× fewer bytes than fp32 (DiLoCo) and 0.996 × at 116×
(DiPaCo 2x2); behind int8 by 7-9 % over the first 100 rounds."""


def sparseloco_sections(percent: float, beta: float, lr: float) -> dict:
    """The spec sections of a SparseLoCo swarm: the sparse codec at `percent` of each chunk and 2 bits up, the mean as
    every non-zero entry at SPARSELOCO_MEAN_BITS down (its top-k at 2 bits cost 2-5 % of loss), the residual in a
    buffer that decays by `beta` a round, a plain outer step of `lr`."""
    chunk = CodecSpec().chunk_size
    k = max(1, round(percent / 100 * chunk))
    return {"codec": CodecSpec(kind="sparse", k_per_chunk=k, value_bits=2, mean_k_per_chunk=0,
                               mean_bits=SPARSELOCO_MEAN_BITS, feedback="buffer"),
            "outer": OuterOptSpec(kind="sparseloco", beta=beta, lr=lr)}
