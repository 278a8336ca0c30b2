"""`pathswarm model export --hf`: paths of a checkpoint as Hugging Face models, each with a model card, the spec
and the router beside it.

The conversion is node/model/hf_export.py; this module picks the paths, scores each on its routed validation
documents (node/train/evaluate.py) and writes the card: what swarm, which modules at which rounds, tokens trained,
the loss, and how documents reach the path.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from pathswarm.jsonfile import write_json_atomic, write_text_atomic
from pathswarm.node.model.hf_export import ExportError, write_hf_path
from pathswarm.node.train.checkpoint import Checkpoint
from pathswarm.node.train.evaluate import PathEval, model_from_checkpoint, routed_eval, servable_paths
from pathswarm.node.train.model_dir import SPEC_FILE
from pathswarm.protocol.spec import SwarmSpec, format_path, parse_path


def tokens_trained(ckpt: Checkpoint) -> int | None:
    """What the checkpoint says was trained: the swarm's total for a pulled model, the nodes' for an assembled one,
    the node's own for a node's checkpoint; None when it does not say."""
    for source in (ckpt.provenance, ckpt.counters):
        if source is not None:
            value = source.get("tokens_trained", source.get("trained"))
            if isinstance(value, int):
                return value
    return None


def export_hf(spec: SwarmSpec, ckpt: Checkpoint, out_dir: str | Path, path: str | None = None,
              eval_batches: int = 8) -> list[tuple[str, Path, PathEval]]:
    """Export one path (`path`, into `out_dir` itself) or every path the checkpoint holds (into out_dir/path-X.Y);
    returns (path, directory, its routed validation loss) per path written."""
    servable = servable_paths(spec, ckpt)
    if path is not None:
        wanted = parse_path(path, spec)
        if wanted not in servable:
            raise ExportError(f"{ckpt.directory} does not hold every module of path {format_path(wanted)} "
                              f"(it holds {', '.join(map(format_path, servable)) or 'no complete path'})")
        targets = [(wanted, Path(out_dir))]
    else:
        targets = [(p, Path(out_dir) / f"path-{format_path(p)}") for p in servable]
    rows, _ = routed_eval(spec, ckpt, max_batches=eval_batches)
    loss = {r.path: r for r in rows}
    written = []
    for p, d in targets:
        write_hf_path(model_from_checkpoint(spec, ckpt, p), d)
        write_text_atomic(d / SPEC_FILE, spec.to_toml())
        write_json_atomic(d / "router.json", router_json(spec), sort_keys=True)
        write_text_atomic(d / "README.md", model_card(spec, ckpt, p, loss[format_path(p)], rows))
        written.append((format_path(p), d, loss[format_path(p)]))
    return written


def router_json(spec: SwarmSpec) -> dict[str, Any]:
    """The router as plain JSON: its features and one centroid per path, in the order of `paths`."""
    return {"paths": [format_path(p) for p in spec.paths()], **asdict(spec.router)}


def model_card(spec: SwarmSpec, ckpt: Checkpoint, path: tuple[int, ...], mine: PathEval,
               rows: list[PathEval]) -> str:
    p = format_path(path)
    trained = tokens_trained(ckpt)
    modules = "\n".join(f"| `{mid}` | {ckpt.modules[mid].round} |" for mid in spec.module_ids(path))
    losses = "\n".join(f"| {r.path}{' (this one)' if r.path == p else ''} | {r.documents} | {r.tokens:,} | "
                       f"{r.loss:.4f} | {r.bits_per_byte:.4f} |" for r in rows)
    cfg = spec.model
    return f"""---
library_name: transformers
pipeline_tag: text-generation
tags: [pathswarm, dipaco, diloco, byte-level]
---

# {spec.name}: path {p}

One path of a DiPaCo model (arXiv 2403.10616) trained by a pathswarm swarm: {spec.n_paths} paths share
{len(spec.all_module_ids())} modules; this path is modules {', '.join(f'`{m}`' for m in spec.module_ids(path))},
a complete {cfg.width}-wide, {len(spec.levels) * cfg.layers_per_module}-block byte-level transformer, exported as a
stock `GPT2LMHeadModel` (the muP multipliers are folded into the weights; logits equal pathswarm's).

- swarm id: `{spec.swarm_id}`
- tokens trained by the swarm's nodes: {f'{trained:,}' if trained is not None else 'not recorded'}
- context: {cfg.context_len} bytes; tokens are UTF-8 bytes (id = byte value), no special tokens

| module | outer round |
|---|---|
{modules}

## Which documents this path is for

The swarm routes every document to one path by its first {spec.router.prefix_bytes} bytes (`router.json`:
hashed byte {spec.router.ngram}-gram features, nearest of {spec.n_paths} centroids; `spec.toml` is the whole spec).
Use this path for the documents routed to it; `pathswarm generate --checkpoint MODEL --prompt …` routes for you.

## Validation loss (next-byte cross-entropy, routed held-out documents)

| path | documents | bytes scored | loss (nats/byte) | bits/byte |
|---|---|---|---|---|
{losses}

## Use

```python
from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline
model = AutoModelForCausalLM.from_pretrained("THIS_DIRECTORY")
tokenizer = AutoTokenizer.from_pretrained("THIS_DIRECTORY")
print(pipeline("text-generation", model=model, tokenizer=tokenizer)("The match", max_new_tokens=80))
```
"""

